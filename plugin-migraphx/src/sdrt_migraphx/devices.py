"""Which devices MIGraphX can run on here: a pure function of ``sdrt.hardware``'s findings.

AMD GPUs come from ``sdrt.hardware`` (sysfs, the KFD topology, rocminfo), each
with its gfx target. A GPU is offered when the OS is Linux, the kernel drives
it with ``amdgpu``, its gfx target is on ROCm's MIGraphX support list (the
core's ``sdrt.hardware.recommend.MIGRAPHX_GFX``, so ``sdrt info`` and the
backend agree), and the installed MIGraphX has its ``gpu`` target. Every other
AMD GPU is passed over with the reason and the plugin to use instead. The
``cpu`` and ``ref`` targets follow when the installed MIGraphX has them.

GPU ids are ``gpu:N``, N being the GPU's HIP index: its place among the AMD
GPUs that ``HIP_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` leave visible, in
PCI order (the order of the KFD topology, which HIP follows).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sdrt import Device
from sdrt.hardware import Accelerator, Hardware
from sdrt.hardware.families import amd_family
from sdrt.hardware.model import AMD
from sdrt.hardware.recommend import MIGRAPHX_GFX, plugin_for

BACKEND = "migraphx"


@dataclass(frozen=True)
class PassedOver:
    """An AMD GPU that MIGraphX will not run on here, why, and what to use instead."""

    gpu: str
    gfx_target: str | None
    reason: str
    instead: str

    def __str__(self) -> str:
        gfx = f" ({self.gfx_target})" if self.gfx_target else ""
        return f"{self.gpu}{gfx}: {self.reason}; {self.instead}"


@dataclass(frozen=True)
class Plan:
    devices: list[Device]
    passed_over: list[PassedOver]


def visible(gpus: list[Accelerator], env: Mapping[str, str]) -> list[Accelerator]:
    """The AMD GPUs that HIP sees, in HIP index order, after ``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES``.

    Each variable is a comma-separated list of indices into what the previous
    step left; UUID entries (``GPU-...``) cannot be matched to sysfs and leave
    the list as it was.
    """
    out = list(gpus)
    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = env.get(var)
        if value is None or not value.strip():
            continue
        items = [v.strip() for v in value.split(",") if v.strip()]
        if not all(v.isdigit() for v in items):
            continue
        out = [out[int(v)] for v in items if int(v) < len(out)]
    return out


def _instead(gpu: Accelerator, hw: Hardware) -> str:
    choice = plugin_for(gpu, hw)
    if choice is not None and choice[0] != BACKEND:
        plugin, build, _ = choice
        if plugin == "ggml" and build == "vulkan":
            return "use sdrt-ggml instead (its Vulkan build, or its HIP build where ROCm runs this GPU)"
        if plugin == "ggml":
            return f"use sdrt-ggml instead (its {build} build)"
        return f"use sdrt-{plugin} instead"
    return "use sdrt-ggml instead (its Vulkan build, or its HIP build where ROCm runs this GPU)"


def plan(hw: Hardware, targets: Collection[str], env: Mapping[str, str] | None = None) -> Plan:
    """The devices MIGraphX offers on ``hw`` with the ``targets`` its build has, and the GPUs passed over."""
    amd = [g for g in hw.gpus if g.vendor == AMD]
    devices: list[Device] = []
    passed: list[PassedOver] = []
    for index, gpu in enumerate(visible(amd, env or {})):
        reason = None
        if hw.os != "Linux":
            reason = f"MIGraphX runs on Linux only, not {hw.os}"
        elif gpu.driver not in (None, "amdgpu"):
            reason = f"the kernel drives it with {gpu.driver}, and ROCm needs amdgpu"
        elif not gpu.gfx_target:
            reason = "its gfx target is unknown (rocminfo and the KFD topology did not report it)"
        elif gpu.gfx_target not in MIGRAPHX_GFX:
            reason = (f"{gpu.gfx_target} is not on ROCm's MIGraphX support list "
                      f"({', '.join(sorted(MIGRAPHX_GFX))})")
        elif "gpu" not in targets:
            passed.append(PassedOver(gpu.name, gpu.gfx_target, "the installed MIGraphX was built without its gpu "
                                     "target", "install ROCm's MIGraphX package, which has it"))
            continue
        if reason is not None:
            passed.append(PassedOver(gpu.name, gpu.gfx_target, reason, _instead(gpu, hw)))
            continue
        devices.append(Device(
            backend=BACKEND, id=f"gpu:{index}", name=gpu.name, kind="gpu", memory_bytes=gpu.vram_bytes,
            properties={"gfx_target": gpu.gfx_target, "architecture": amd_family(gpu.gfx_target) or "",
                        "hip_index": index, "bus_id": gpu.bus_id or "", "integrated": bool(gpu.integrated),
                        "target": "gpu"}))
    if "cpu" in targets:
        devices.append(Device(backend=BACKEND, id="cpu", name=f"MIGraphX cpu target (oneDNN) on {hw.cpu.model}",
                              kind="cpu", properties={"target": "cpu", "auto": False}))
    if "ref" in targets:
        devices.append(Device(backend=BACKEND, id="ref", name="MIGraphX ref target (reference kernels, slow)",
                              kind="cpu", properties={"target": "ref", "auto": False}))
    return Plan(devices, passed)


def describe_gpus(hw: Hardware) -> str:
    """One line on the AMD GPUs of ``hw`` for a message: which MIGraphX would run, which not and why."""
    amd = [g for g in hw.gpus if g.vendor == AMD]
    if not amd:
        return "no AMD GPU found on this machine"
    pl = plan(hw, ("gpu",))
    parts = [f"{d.name} ({d.properties['gfx_target']}) is supported" for d in pl.devices]
    parts += [str(p) for p in pl.passed_over]
    return "; ".join(parts)
