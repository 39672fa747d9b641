"""``GgmlBackend``: devices from ggml's backend registry; compile = check, lower, then a session allocates."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from sdrt import Backend, Device, Session, TensorInfo
from sdrt.cache import Entry
from sdrt.errors import ModelError, SdrtError, check_known_options
from sdrt.precision import precision_name
from sdrt.weights.pages import release as release_pages

from .devices import list_devices, memory_in_use, open_device, supports_flash_attn
from .lower import LoweringSpec, free_lowered, lower_graph
from .ops import TABLE

log = logging.getLogger("sdrt.ggml")

#: this plugin's version, part of its compile cache keys
PLUGIN_VERSION = "0.1.0"

#: options ``compile`` accepts
OPTIONS = ("precision", "shapes", "threads", "rewrites", "conv_impl", "dw_layout", "transpose", "layouts", "pad_k", "flash_attn", "scheduler",
           "accel", "gemm", "attention", "gelu", "groupnorm", "pool")


def _static_inputs(graph: Any) -> list[TensorInfo]:
    infos = []
    for info in graph.inputs:
        if not info.is_static:
            raise ModelError(
                f"input {info} has dynamic dimensions; ggml needs static shapes",
                where=graph.name,
                fix=f"pass shapes={{'{info.name}': (...)}} (or a dim name: shapes={{'batch': 1}}) to sdrt.load, "
                "or pin them with graph.with_shapes(...)",
            )
        infos.append(TensorInfo(info.name, info.dtype, tuple(int(d) for d in info.shape)))  # type: ignore[arg-type]
    return infos


def _check_gemm_option(gemm: Any, device: Device) -> None:
    """``gemm``: "auto" (the native GEMM on the CPU when it loaded), "native" (required), "ggml"."""
    from . import native

    if gemm not in ("auto", "native", "ggml"):
        raise SdrtError(f"gemm={gemm!r} is not a GEMM choice of the ggml backend", where="sdrt.load(..., gemm=...)",
                        fix="pass gemm='auto', 'native' or 'ggml'")
    if gemm == "native" and device.kind == "cpu" and native.native() is None:
        raise SdrtError(f"gemm='native' asked for, but sdrt-ggml's native kernels are not loaded: "
                        f"{native.unavailable_reason()}", where="sdrt_ggml.native",
                        fix="reinstall sdrt-ggml with a C compiler present, or pass gemm='auto'")


def _check_kernel_options(options: dict[str, Any]) -> None:
    """``attention``, ``gelu``, ``groupnorm``: "native" (sdrt-ggml's kernel where it loaded and the
    graph runs on the CPU, else ggml's op) or "ggml" (ggml's op always)."""
    for key in ("attention", "gelu", "groupnorm"):
        value = options.get(key, "native")
        if value not in ("native", "ggml"):
            raise SdrtError(f"{key}={value!r} is not a choice of the ggml backend", where=f"sdrt.load(..., {key}=...)",
                            fix=f"pass {key}='native' (sdrt-ggml's kernel where it loaded) or {key}='ggml'")
    pool = options.get("pool", "auto")
    if pool not in ("auto", True, False):
        raise SdrtError(f"pool={pool!r} is not a choice of the ggml backend", where="sdrt.load(..., pool=...)",
                        fix="pass pool='auto' (sdrt-ggml's thread pool where the graph allows), True or False "
                            "(ggml's threads)")


class GgmlBackend(Backend):
    name = "ggml"
    api_version = (1, 1)
    priority = 10
    #: stored weight types run natively: matmul weights as ggml's Q8_0 / Q4_0 blocks (quant.py); conv
    #: weights of those types are dequantized while lowering. fp8 (no ggml type) is dequantized at load.
    quantized_weights = frozenset({"int8", "int4"})
    #: ``update_weights`` writes the new values into the tensors a compile would have made (and lowers again where
    #: a changed weight was folded): the same program, so a LoRA is compiled in directly (no base compile first)
    rebinds_as_compiled = True
    #: each session opens its own device handles; a lowering's weight layouts run in native code with the GIL
    #: released (native/pack.c): a pipeline's UNet lowered beside the text encoder's compile and run took the full-size
    #: SD 1.5's load + first image from 16.5 to 13.8 s (2-core Sapphire Rapids, bf16)
    compiles_beside = True
    conformance: dict[str, Any] = {}
    #: fp32; bf16 and fp16 store the weights of MatMul, Gemm and dense convs in ggml's half types and compute
    #: them with ggml's mixed kernels, the rest in float32 (half.py). The default per device is
    #: ``devices.default_precision``'s (``sdrt info`` shows it)
    precisions: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "fp32": {"precision": "fp32"}, "bf16": {"precision": "bf16"}, "fp16": {"precision": "fp16"}}

    def devices(self) -> list[Device]:
        return list_devices()

    def memory_in_use(self, device: Device) -> int | None:
        return None if device.kind == "cpu" else memory_in_use(device.id)

    def plain_conv_pixels(self, device: Device, precision: str) -> int:
        """On the CPU at float32 with the native kernels, a 3x3 conv on a small map keeps its kernel as stored (the
        cols route's panels up to ``COLS_KXK_MAX_PIXELS`` output pixels with the AVX-512 kernels, the implicit GEMM's
        below ``WINOGRAD_MIN_PIXELS``) and a larger one holds Winograd's 16/9-sized kernels; elsewhere no route
        transforms a kernel by the map's size."""
        from . import native
        from .ops.conv_kernels import COLS_KXK_MAX_PIXELS, WINOGRAD_MIN_PIXELS

        nat = native.native() if device.kind == "cpu" and precision == "fp32" else None
        if nat is None:
            return 0
        return max(COLS_KXK_MAX_PIXELS if nat.isa == "avx512" else 0, WINOGRAD_MIN_PIXELS - 1)

    def weight_blocks(self) -> frozenset[str]:
        """A GGUF file's block types that stay as stored when they are matmul weights: every type ggml's CPU
        mul_mat takes (quant.gguf_types: Q4_0..Q8_0, the K-quants, the IQ and TQ types, MXFP4, NVFP4); the
        lowering dequantizes any such weight that another op reads."""
        from .quant import gguf_types

        return gguf_types()

    # ``compile`` is the core's template: parse_options, _prepare, the compile cache's lookup, resolve the weights,
    # _compile, the cache's store
    #: the compile cache holds a CPU lowering's weight layouts (layout_cache.py): a second process lowers the graph
    #: again but maps them instead of making them
    caches = True
    #: an entry of a large model is synced and checksummed in a thread (``_open`` needs nothing of it)
    stores_in_background = True
    #: and written in one, outside a pipeline's job too: the session's layouts are read, not changed, and a store
    #: during which ``update_weights`` wrote into them is dropped (``_save``)
    stores_beside = True

    def parse_options(self, options: Any, device: Device) -> dict[str, Any]:
        slow = not device.properties.get("native_gemm") and not device.properties.get("tinyblas", True)
        if device.kind == "cpu" and slow and options.get("gemm") != "native":
            log.warning("neither sdrt-ggml's own GEMM (not built or not loaded: see the log line of sdrt.ggml.native) "
                        "nor ggml's tinyBLAS (GGML_LLAMAFILE) is here: float32 matmuls run about 4x slower; "
                        "reinstall sdrt-ggml with a C compiler present, see plugin-ggml/README.md")
        check_known_options("ggml", options, OPTIONS)
        options = dict(options)
        precision = options.pop("precision", None)
        # fp32, or bf16/fp16 weights for the matmuls and convs (half.py); the default is the device's
        options["precision"] = (self.precision_for(device) if precision is None else
                                precision_name(precision, self.precisions,
                                               where="sdrt.load(..., backend='ggml', precision=...)"))
        _check_gemm_option(options.get("gemm", "auto"), device)
        _check_kernel_options(dict(options))
        return dict(options)

    def _prepare(self, graph: Any, device: Device, opts: dict[str, Any]) -> Any:
        TABLE.check_graph(graph.model.graph.node, graph.name, "the ggml backend cannot run this graph",
                          "openvino, reference")  # before any long work
        if opts.get("shapes"):
            graph = graph.with_shapes(dict(opts["shapes"]))  # the core pins dims and checks them
        _static_inputs(graph)
        return graph

    def _compile(self, graph: Any, arrays: dict[str, Any], device: Device, opts: dict[str, Any]) -> Session:
        return self._lowered(graph, arrays, device, opts)

    def _lowered(self, graph: Any, arrays: dict[str, Any], device: Device, opts: dict[str, Any],
                 replay: Any = None) -> Session:
        """Lower ``graph`` into a session; ``replay``: a compile cache entry's layouts to take (``_load``)."""
        from .session import GgmlSession

        model = graph.model
        inputs = _static_inputs(graph)
        threads = int(opts.get("threads") or os.cpu_count() or 1)
        handles = open_device(device.id, threads, accel=bool(opts.get("accel", False)))
        try:
            flash = opts.get("flash_attn")
            spec = LoweringSpec(
                nodes=list(model.graph.node), initializers=dict(arrays),
                input_infos=[(i.name, tuple(int(d) for d in i.shape), i.dtype) for i in inputs],  # type: ignore[arg-type]
                output_names=[o.name for o in graph.outputs],
                opsets={o.domain or "": int(o.version) for o in model.opset_import},
                options=dict(opts),
                supports_flash_attn=supports_flash_attn(handles) if flash is None else bool(flash),
                on_cpu=handles.is_cpu,
                # the plain CPU path (the session's own allocator) reads the weights where lowering made them
                host_weights=handles.is_cpu and not opts.get("scheduler") and not handles.accel,
                device_backend=None if handles.is_cpu else handles.backend,
            )
            if replay is not None and not spec.host_weights:
                from sdrt.errors import UnusableEntry

                raise UnusableEntry("its layouts are a CPU session's, and this one uploads its weights")
            lowered = lower_graph(spec, replay)
        except BaseException:
            handles.free()
            raise
        try:
            session = GgmlSession(inputs, graph.outputs, graph=graph, spec=spec, lowered=lowered, device=handles,
                                  scheduler=bool(opts.get("scheduler")), where=graph.name, threads=threads,
                                  pool=opts.get("pool", "auto"))
            session.weight_blocks = self.weight_blocks()  # update_weights keeps them as blocks too
            # the weights now sit in ggml's buffers (or, on the CPU, in arrays lowering made): the pages of the
            # file-mapped arrays that lowering read leave this process's resident set (update_weights reads
            # them again from the page cache)
            release_pages(arrays.values())
            return session
        except BaseException:
            free_lowered(lowered)  # the session freed what it had started to allocate
            handles.free()
            raise

    # -- the compile cache: the weights' layouts (layout_cache.py) --------------
    def _cache_parts(self, graph: Any, device: Device, opts: dict[str, Any]) -> list[str] | None:
        """The CPU's plain path only (its weights stay in the arrays lowering made); a GPU, the scheduler or an
        accelerator uploads them into ggml's buffers, and lowering there spends no time worth a cache."""
        if device.kind != "cpu" or opts.get("scheduler") or opts.get("accel"):
            return None
        from . import layout_cache, native

        nat = native.native()
        kernels = "none"
        if nat is not None:
            st = os.stat(nat.path)
            kernels = f"{nat.path}|{st.st_size}|{st.st_mtime_ns}|{nat.isa}"
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith(("SDRT_GGML_", "GGML_")))
        # threads and pool change how fast the layouts are made and the session runs, not what lowering makes: a
        # compile with threads=4 maps the entry one with the default made
        made = sorted((str(k), repr(v)) for k, v in opts.items() if k not in ("threads", "pool"))
        return [device.id, device.name, PLUGIN_VERSION, native._ggml_version(), kernels,
                f"layouts={layout_cache.FORMAT}", repr(made), repr(env)]

    def _cache_meta(self, graph: Any, device: Device, opts: dict[str, Any]) -> dict[str, Any]:
        return {"precision": opts.get("precision")}

    def _defers_store(self, opts: Any) -> bool:
        """Inside a pipeline's job the entry is written after it, outside one in the background at once
        (``stores_beside``): the first image does not wait for 3 GB of writes (the full-size SD 1.5 UNet's float32
        layouts)."""
        return True

    def _save_later(self, compiled: Any) -> Any:
        """The session's layouts as lowering made them, with its weights' generation: a LoRA bound before the
        store writes into those arrays, and an entry under the base weights' key must not hold them. The session
        itself is held weakly (a session dropped before the store frees its compute buffers; its weights can no
        longer change)."""
        import weakref
        from types import SimpleNamespace

        from . import layout_cache

        layouts = compiled.layouts
        if layout_cache.stored_bytes(layouts) < layout_cache.MIN_BYTES:
            return None
        return SimpleNamespace(session=weakref.ref(compiled), layouts=layouts, where=compiled.where,
                               generation=compiled.weights_generation)

    def _save(self, compiled: Any, folder: Any) -> bool:
        from . import layout_cache

        snap = compiled if not isinstance(compiled, Session) else self._save_later(compiled)
        if snap is None:
            return False
        session = snap.session()
        if session is not None and session.weights_generation != snap.generation:
            log.info("not caching %s's layouts: its weights changed since it was compiled", snap.where)
            return False
        layout_cache.write(folder, snap.layouts)
        return True

    def _load(self, entry: Entry, graph: Any, weights: Any, device: Device, opts: dict[str, Any]) -> Session:
        """Lower the graph again, its weights' layouts mapped from the entry (``layout_cache.Replay``)."""
        from sdrt import resolve_weights

        from .layout_cache import Replay

        replay = Replay(entry.path)
        arrays = resolve_weights(graph, weights, blocks=self.weight_blocks())
        return self._lowered(graph, arrays, device, opts, replay)
