"""Which one plugin fits this machine: a pure function of ``Hardware``.

The rules follow the vendors' support matrices; docs/hardware.md keeps the
table and the sources. Change both together.
"""

from __future__ import annotations

from .families import cc_tuple
from .model import AMD, APPLE, INTEL, NVIDIA, Accelerator, Hardware, Recommendation

#: compute capabilities TensorRT-RTX 1.x builds for, on Linux x86-64 and Windows x64
#: (TensorRT-RTX support matrix: 7.5 Turing, 8.6 Ampere, 8.9 Ada, 12.0 Blackwell; not 8.0/9.0/10.0 data-center parts)
TRT_RTX_CC = {(7, 5), (8, 6), (8, 9), (12, 0)}
#: gfx targets MIGraphX runs on under Linux: Instinct MI200/MI300/MI350, Radeon RX/PRO 7900-7700 and 9000, Ryzen AI
#: 300 / Max. Narrower than "gfx110x": AMD does not support the RX 7600 (gfx1102) on Linux, and gfx1103 (Radeon
#: 780M/760M iGPUs) is on no ROCm list. RDNA 2 (gfx1030) is listed for PRO W6800/V620 only, so Radeon RX go to Vulkan.
MIGRAPHX_GFX = {"gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1150", "gfx1151", "gfx1200", "gfx1201"}

PLUGINS = ("trt", "migraphx", "openvino", "coreml", "ggml")


def distribution(plugin: str) -> str:
    return f"sdrt-{plugin}"


def plugin_for(dev: Accelerator, hw: Hardware) -> tuple[str, str | None, str] | None:
    """(plugin, ggml build, why) for one device, or None when no plugin drives it."""
    if dev.vendor == NVIDIA and dev.kind == "gpu":
        if hw.os == "Darwin":
            return "ggml", "metal", f"{dev.name} on macOS: ggml's Metal build"
        cc = cc_tuple(dev.compute_capability)
        if cc in TRT_RTX_CC and hw.os in ("Linux", "Windows") and hw.arch == "x86_64":
            return "trt", None, f"{dev.name} is NVIDIA {dev.architecture or ''} (compute {dev.compute_capability}), " \
                                "which TensorRT-RTX supports"
        if cc is None:
            why = "its compute capability is unknown"
        elif cc < (7, 5):
            why = f"compute {dev.compute_capability} is older than Turing (7.5), the oldest TensorRT-RTX supports"
        elif hw.arch != "x86_64":
            why = "TensorRT-RTX ships for x86-64 only"
        else:
            why = f"TensorRT-RTX does not build for compute {dev.compute_capability} (it targets RTX GPUs)"
        return "ggml", "cuda", f"{dev.name}: {why}; ggml's CUDA build runs it"
    if dev.vendor == AMD and dev.kind == "gpu":
        if hw.os == "Darwin":
            return "ggml", "metal", f"{dev.name} in an Intel Mac: ggml's Metal build"
        if hw.os == "Linux" and dev.gfx_target in MIGRAPHX_GFX:
            return "migraphx", None, f"{dev.name} ({dev.gfx_target}) is on the ROCm/MIGraphX Linux support list"
        where = "on Windows MIGraphX is not available" if hw.os == "Windows" else (
            f"{dev.gfx_target or 'its gfx target'} is not on the ROCm/MIGraphX support list")
        return "ggml", "vulkan", f"{dev.name}: {where}; ggml's Vulkan build runs it"
    if dev.vendor == INTEL:
        if hw.os == "Darwin":
            return "ggml", "metal", f"{dev.name} in an Intel Mac: ggml's Metal build"
        return "openvino", None, f"{dev.name} is an Intel {dev.kind.upper()}, which OpenVINO drives"
    if dev.vendor == APPLE:
        return "coreml", None, f"{dev.name}: Core ML runs on Apple Silicon's GPU and Neural Engine"
    return None


def cannot_run_here(plugin: str, build: str | None, hw: Hardware) -> str | None:
    """Why ``plugin`` (ggml: its ``build``), asked for by name, will run nothing on this machine, or None.

    It still installs (a plugin can build ahead of time for another machine: TensorRT-RTX engines, Core ML
    packages), but a user who meant to run models here should hear it before the download."""
    if plugin == "coreml":
        return None if hw.os == "Darwin" else \
            f"Core ML runs models only on macOS (this is {hw.os}); here the plugin can only convert models ahead of time"
    if plugin in ("trt", "migraphx"):
        targets = [(d, t) for d, t in ((d, plugin_for(d, hw)) for d in hw.devices) if t is not None]
        if any(t[0] == plugin for _, t in targets):
            return None
        if plugin == "trt":
            need = "an NVIDIA RTX GPU (compute 7.5, 8.6, 8.9 or 12.0) on Linux or Windows x86-64"
        else:
            need = f"an AMD GPU on ROCm's Linux support list ({', '.join(sorted(MIGRAPHX_GFX))})"
        vendor = NVIDIA if plugin == "trt" else AMD
        seen = [t[2] for d, t in targets if d.vendor == vendor]  # why each of that maker's devices goes elsewhere
        found = f" ({'; '.join(seen)})" if seen else ""
        return f"no GPU here that {plugin} runs on{found}: it needs {need}; it installs, but runs nothing here"
    if plugin == "ggml" and build in ("cuda", "hip", "metal", "vulkan"):
        if build == "metal":
            return None if hw.os == "Darwin" else f"ggml's Metal build runs only on macOS (this is {hw.os})"
        vendor = {"cuda": NVIDIA, "hip": AMD}.get(build)
        gpus = [g for g in hw.gpus if vendor is None or g.vendor == vendor]
        if not gpus:
            which = {"cuda": "NVIDIA GPU", "hip": "AMD GPU"}.get(build, "GPU")
            return f"no {which} found here: ggml's {build} build would run on the CPU only (the cpu build does that)"
    return None


def strength(dev: Accelerator) -> tuple[int, int, float]:
    """Sort key: discrete first, then more memory, then newer NVIDIA compute capability."""
    cc = cc_tuple(dev.compute_capability) or (0, 0)
    return (0 if dev.integrated else 1, dev.vram_bytes or 0, cc[0] + cc[1] / 10)


def recommend(hw: Hardware) -> Recommendation:
    """The plugin to install, why, the devices it will use, and what was passed over."""
    if hw.os == "Darwin":
        return _macos(hw)
    gpus = [g for g in hw.gpus if plugin_for(g, hw) is not None]
    if gpus:
        best = max(gpus, key=strength)          # max keeps the first of equals: PCI order
        plugin, build, why = plugin_for(best, hw)  # type: ignore[misc]
        if plugin == "openvino":
            return _openvino(hw, why)
        # twins of the chosen GPU (same maker, same plugin and build, also discrete or also integrated)
        used = [g for g in gpus if g is best or (g.vendor == best.vendor and g.integrated == best.integrated
                                                 and plugin_for(g, hw)[:2] == (plugin, build))]  # type: ignore[index]
        reason = why
        if len(gpus) > 1 or len(hw.gpus) > len(gpus):
            reason += "; it is the strongest GPU here"
        return _finish(hw, plugin, build, reason, used, cpu=plugin == "ggml" and build == "cpu")
    if any(n.vendor == INTEL for n in hw.npus):
        return _openvino(hw, "no supported GPU; OpenVINO drives the Intel NPU and the CPU")
    if hw.cpu.is_x86:
        feats = ", ".join(hw.cpu.isa) or "no AVX2"
        return _openvino(hw, f"no supported GPU; OpenVINO runs on the x86 CPU ({hw.cpu.model}; {feats})")
    return _finish(hw, "ggml", "cpu", f"no GPU that a vendor plugin supports on {hw.os} {hw.arch}; "
                   "ggml's CPU build runs everywhere", [], cpu=True)


def _openvino(hw: Hardware, reason: str) -> Recommendation:
    used = [d for d in hw.devices if d.vendor == INTEL]
    return _finish(hw, "openvino", None, reason, used, cpu=True)


def _macos(hw: Hardware) -> Recommendation:
    if hw.arch == "arm64":
        used = [d for d in hw.devices if d.vendor == APPLE]
        chip = hw.cpu.model if hw.cpu.vendor == "apple" else "Apple Silicon"
        return _finish(hw, "coreml", None, f"{chip}: Core ML runs on its GPU and Neural Engine", used)
    gpus = sorted(hw.gpus, key=strength, reverse=True)
    if not gpus:
        return _finish(hw, "ggml", "cpu", "Intel Mac with no Metal GPU found; ggml's CPU build", [], cpu=True)
    return _finish(hw, "ggml", "metal", f"Intel Mac: ggml's Metal build runs on {gpus[0].name}, "
                   "the strongest GPU here", gpus[:1])


def _finish(hw: Hardware, plugin: str, build: str | None, reason: str, used: list[Accelerator],
            cpu: bool = False) -> Recommendation:
    rec = Recommendation(plugin=plugin, distribution=distribution(plugin), reason=reason, build=build,
                         devices=used, uses_cpu=cpu)
    for dev in hw.devices:
        if any(dev is u for u in used):
            continue
        target = plugin_for(dev, hw)
        if target is None:
            why = f"no sdrt plugin drives {dev.vendor} {dev.kind.upper()}s"
        elif target[:2] == (plugin, build):
            why = "integrated GPU; the discrete one is stronger" if dev.integrated else "a weaker GPU"
        else:
            label = target[0] + (f" ({target[1]} build)" if target[1] else "")
            why = f"would need {label}; sdrt installs one plugin and {plugin} covers the strongest device"
        rec.passed_over.append((dev, why))
    return rec
