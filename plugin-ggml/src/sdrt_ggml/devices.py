"""Device discovery and opening: ggml's backend registry -> sdrt ``Device`` records and live handles."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from typing import Any

from sdrt import Device
from sdrt.errors import BackendUnavailable, SdrtError

from .ops._common import ggml_lib

log = logging.getLogger("sdrt.ggml.devices")

_KIND = {0: "cpu", 1: "gpu", 2: "gpu"}


def import_ggml() -> Any:
    """The ggml bindings, or ``BackendUnavailable`` saying how to install them."""
    # onnx's C extension first: ggml-python loads its libraries RTLD_GLOBAL, and importing onnx after a CUDA build's
    # had been loaded so crashed the process (a segfault in onnx's import, on the lent H200)
    import onnx  # noqa: F401
    try:
        return ggml_lib()
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        raise BackendUnavailable(
            f"ggml-python cannot be imported: {exc}",
            where="import ggml",
            fix="pip install ggml-python (it builds ggml from source: a C/C++ compiler and cmake are needed)",
        ) from exc


def _memory(lib: Any, dev: Any) -> tuple[int, int]:
    """(free, total) bytes of ggml device ``dev`` (``ggml_backend_dev_memory``; CUDA's ``cudaMemGetInfo``)."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return int(free.value), int(total.value)


def memory_in_use(device_id: str) -> int | None:
    """Bytes of the ggml device ``device_id``'s memory in use now (total less free), or None for a device this build
    does not register or that reports no total."""
    lib = import_ggml()
    dev = lib.ggml_backend_dev_by_name(device_id.encode())
    if not dev:
        return None
    free, total = _memory(lib, dev)
    return total - free if total else None


def list_devices() -> list[Device]:
    """Every CPU/GPU device the ggml build registered (accelerators such as BLAS are used with the CPU)."""
    lib = import_ggml()
    out: list[Device] = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = _KIND.get(int(lib.ggml_backend_dev_type(dev)))
        if kind is None:
            continue
        free, total = _memory(lib, dev)
        name = lib.ggml_backend_dev_name(dev).decode()
        reg = lib.ggml_backend_dev_backend_reg(dev)
        props: dict[str, Any] = {"ggml_backend": lib.ggml_backend_reg_name(reg).decode() if reg else "",
                                 "free_bytes": free}
        description = lib.ggml_backend_dev_description(dev).decode()
        if kind == "cpu":
            description += _cpu_gemm(lib, props)
        elif is_software_driver(description):
            # a Vulkan driver that runs on the CPU: slower than ggml's own CPU backend, so it
            # runs only when named (device="Vulkan0"), and comes after the CPU
            props["auto"] = False
            props["software"] = True
            description += ", software driver: runs on the CPU"
        props["precision"] = default_precision(lib, kind)
        out.append(Device(
            backend="ggml", id=name, name=description, kind=kind,
            memory_bytes=total or None, properties=props,
        ))
    # the first device is the default for backend="ggml": real GPUs, then the CPU, then software drivers
    return sorted(out, key=lambda d: 2 if d.properties.get("software") else 1 if d.kind == "cpu" else 0)


#: whether bf16 beats float32 on a CPU whose sdrt-ggml kernels run vdpbf16ps (``native.Native.bf16_kernel``): it
#: does since the native GEMM and implicit-GEMM conv have bf16 products (half.py): on an AMD EPYC Zen 5 (2 cores,
#: AVX-512-BF16) the bench UNet took 186 ms at bf16 against 251 ms at fp32 and the CLIP text encoder 91 ms against
#: 178 ms, in one run, the tiny SD 1.5 / SD 2 images within 46.6 / 48.0 dB of float32 (docs/ggml.md, "Precision
#: and memory"). ggml's own bf16 mul_mat (no tinyBLAS in this build) was 1.4-4.2x slower than fp32: without the
#: native kernels, or with another GEMM ISA pinned, the default stays fp32. On an Intel Xeon (Sapphire Rapids, AMX)
#: the bf16 products run on AMX tiles (native/amx.c): bf16 took 0.28-0.9x fp32's time there (docs/ggml.md, "AMX
#: tiles"); with the tiles turned off (SDRT_GGML_AMX=0) its vdpbf16ps kernels were slower than fp32
CPU_BF16_FASTER = True
#: the same for GPUs (fp16). Measured on a lent H200 (ggml's CUDA build, docs/plan.md "On a GPU"): fp16 took 0.70-1.38 x
#: fp32's time per call on SD 1.5's parts (the UNet at 128 px faster, at 256 px 1.26 x slower; the text encoder and the
#: VAE decoder 1.12-1.38 x slower: ggml's CUDA build runs float32 matmuls as TF32 on the tensor cores already), so a
#: GPU keeps float32 by default; fp16 held 1.5 GiB less of the UNet's memory
GPU_FP16_FASTER = False


def bf16_kernel_faster(kernel: str, vendor: str | None = None) -> bool:
    """Whether sdrt-ggml's bf16 kernel ``kernel`` (``Native.bf16_kernel_name``) was measured faster than float32 on
    this CPU's vendor: the AMX tiles everywhere they run (Sapphire Rapids: 0.28-0.9x fp32's time); vdpbf16ps on
    AMD (Zen 5: 0.5-0.75x) but not on Intel, where it issues once a cycle, no more multiply-adds than two float32
    FMAs, and the activations' conversion comes on top (Sapphire Rapids with the tiles off, SDRT_GGML_AMX=0:
    1.04-2.0x fp32's time; docs/ggml.md, "AMX tiles")."""
    from sdrt.precision_default import cpu_vendor

    if kernel == "amx-bf16":
        return True
    return kernel == "avx512bf16" and (vendor if vendor is not None else cpu_vendor()) != "intel"


def default_precision(lib: Any, kind: str) -> str:
    """The device's default precision (``sdrt.precision_default.choose``): bf16 on a CPU with AVX-512-BF16 or
    AMX-BF16 where sdrt-ggml's bf16 kernels run and were measured faster than float32 (the AMX tiles; vdpbf16ps
    on AMD, not on Intel: ``bf16_kernel_faster``), fp16 on a GPU, float32 otherwise, each only where it was
    measured at least as fast as float32 (``CPU_BF16_FASTER``, ``GPU_FP16_FASTER``)."""
    from sdrt.precision_default import choose, cpu_bf16_fast

    offered = ("fp32", "bf16", "fp16")
    if kind == "cpu":
        from . import native

        nat = native.native()
        # sdrt-ggml's AMX or vdpbf16ps GEMM and conv run the bf16 products (native.Native.bf16_kernel): AVX-512-BF16,
        # the avx512 kernels active (not pinned to another ISA by SDRT_GGML_GEMM_ISA), and measured faster here
        fast = CPU_BF16_FASTER and cpu_bf16_fast() and nat is not None and bf16_kernel_faster(nat.bf16_kernel_name)
        return choose(kind, offered, bf16_fast=fast, fp16_fast=False)
    return choose(kind, offered, fp16_fast=GPU_FP16_FASTER)


#: names of Vulkan drivers that run on the CPU (Mesa's lavapipe reports itself as llvmpipe)
SOFTWARE_DRIVERS = ("llvmpipe", "lavapipe", "swiftshader")


def is_software_driver(description: str) -> bool:
    """Whether a ggml device description names a CPU-based (software) GPU driver."""
    low = description.lower()
    return any(name in low for name in SOFTWARE_DRIVERS)


def gemm_label(nat: Any) -> str:
    """The native GEMM's float32 ISA, and ``amx-bf16`` where the bf16 products run on AMX tiles."""
    return f"{nat.isa}, amx-bf16" if nat.bf16_kernel_name == "amx-bf16" else nat.isa


def _cpu_gemm(lib: Any, props: dict[str, Any]) -> str:
    """What `sdrt info` prints after the CPU's name: which float32 GEMM the CPU device runs.

    sdrt-ggml's own packed GEMM (built by pip with sdrt-ggml) when it loaded; else ggml's
    mul_mat, fast only when ggml-python was built with llamafile's tinyBLAS (GGML_LLAMAFILE)."""
    from . import native

    props["tinyblas"] = bool(lib.ggml_cpu_has_llamafile())
    nat = native.native()
    props["native_gemm"] = nat.isa if nat is not None else None
    props["bf16_kernel"] = nat.bf16_kernel_name if nat is not None else None
    if nat is not None:
        return f", sdrt GEMM ({gemm_label(nat)})"
    if props["tinyblas"]:
        return ", tinyBLAS GEMM (sdrt GEMM not loaded: see the log)"
    return ", no fast GEMM: slow build (see sdrt-ggml's README)"


@dataclass
class DeviceHandles:
    """The ggml backends a session computes on: the device's, a CPU fallback for GPUs, accelerators."""

    name: str
    backend: Any
    is_cpu: bool
    cpu: Any = None
    accel: list[Any] = field(default_factory=list)

    def free(self) -> None:
        lib = ggml_lib()
        for be in [*self.accel, self.cpu, self.backend]:
            if be:
                lib.ggml_backend_free(be)
        self.accel, self.cpu, self.backend = [], None, None


def open_device(name: str, threads: int, *, accel: bool = False) -> DeviceHandles:
    """Initialize ggml device ``name`` (and a CPU backend next to a GPU)."""
    lib = import_ggml()
    dev = lib.ggml_backend_dev_by_name(name.encode())
    if not dev:
        raise SdrtError(f"ggml device {name!r} is not available", where="ggml backend registry",
                        fix="list devices with sdrt info, or rebuild ggml-python with that backend")
    backend = lib.ggml_backend_dev_init(dev, None)
    if not backend:
        raise SdrtError(f"ggml could not initialize device {name!r}", where="ggml_backend_dev_init",
                        fix="check the device's driver, or use device='CPU'")
    handles = DeviceHandles(name, backend, bool(lib.ggml_backend_is_cpu(backend)))
    if handles.is_cpu:
        lib.ggml_backend_cpu_set_n_threads(backend, threads)
        # off by default: slower than ggml's own kernels here (docs/ggml.md, "GPUs")
        if accel:
            handles.accel = _open_accelerators(threads)
    else:
        handles.cpu = lib.ggml_backend_cpu_init()
        lib.ggml_backend_cpu_set_n_threads(handles.cpu, threads)
    return handles


def _open_accelerators(threads: int) -> list[Any]:
    """Accelerator backends built into ggml (BLAS, AMX...): they take the ops they support, the
    CPU the rest, through ggml's scheduler."""
    lib = ggml_lib()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if int(lib.ggml_backend_dev_type(dev)) != lib.GGML_BACKEND_DEVICE_TYPE_ACCEL:
            continue
        be = lib.ggml_backend_dev_init(dev, None)
        if not be:
            continue
        if lib.ggml_backend_dev_name(dev).decode().upper().startswith("BLAS"):
            try:
                lib.ggml_backend_blas_set_n_threads(be, threads)
            except (AttributeError, RuntimeError):  # bindings built without BLAS
                pass
        out.append(be)
    return out


def supports_flash_attn(handles: DeviceHandles) -> bool:
    """Whether this device runs ggml_flash_attn_ext on float32 tensors (probed on a tiny graph)."""
    if handles.is_cpu:
        return True
    lib = ggml_lib()
    ctx = lib.ggml_init(lib.ggml_init_params(mem_size=16 * lib.ggml_tensor_overhead() + 4096, mem_buffer=None,
                                             no_alloc=True))
    try:
        q = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F32, 64, 8, 1, 1)
        k = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F32, 64, 8, 1, 1)
        y = lib.ggml_flash_attn_ext(ctx, q, k, k, None, 1.0, 0.0, 0.0)
        return bool(lib.ggml_backend_supports_op(handles.backend, y))
    finally:
        lib.ggml_free(ctx)
