"""Build targets (``sm86``) and which of this machine's NVIDIA GPUs can run TensorRT-RTX.

Pure functions: ``target_names`` reads the library's own list of compute
capabilities; ``plan_devices`` decides from ``sdrt.hardware``'s GPUs and what
the CUDA runtime reports, so tests feed it captured data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sdrt import Device
from sdrt.errors import SdrtError

#: targets TensorRT-RTX 1.7 builds for (its ComputeCapability enum, measured here); the live list comes from
#: the installed library through ``target_names``
KNOWN_TARGETS = ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121")


def target_names() -> list[str]:
    """Compute capabilities the installed TensorRT-RTX can build for, as ``sm86`` names."""
    import tensorrt_rtx as trt

    names = [m.lower() for m in trt.ComputeCapability.__members__ if re.fullmatch(r"SM\d+", m)]
    return sorted(names, key=lambda n: int(n[2:]))


def cc_of(target: str) -> tuple[int, int]:
    """``"sm86"`` -> (8, 6); ``"sm120"`` -> (12, 0)."""
    digits = target[2:]
    return int(digits[:-1]), int(digits[-1])


def target_of(cc: tuple[int, int]) -> str:
    return f"sm{cc[0]}{cc[1]}"


def check_target(target: str, available: Sequence[str]) -> str:
    name = str(target).lower().replace("_", "").replace(".", "")
    if re.fullmatch(r"\d+", name):  # "86" or "8.6"
        name = "sm" + name
    if name not in available:
        raise SdrtError(f"unknown TensorRT-RTX target {target!r}", where="trt build",
                        fix=f"pass one of {', '.join(available)} (the GPU's compute capability, e.g. sm86 for an "
                            "RTX 3060)")
    return name


def compute_capability(target: str) -> Any:
    """The ``tensorrt_rtx.ComputeCapability`` member of a target name."""
    import tensorrt_rtx as trt

    return getattr(trt.ComputeCapability, target.upper())


@dataclass
class CudaDevice:
    """One device as the CUDA runtime reports it."""

    ordinal: int
    name: str
    cc: tuple[int, int]
    memory_bytes: int | None = None
    pci_bus_id: str | None = None  # "0000:01:00.0"


@dataclass
class DevicePlan:
    devices: list[Device] = field(default_factory=list)
    #: one line per NVIDIA GPU that cannot run TensorRT-RTX here, with the reason and what to use instead
    unusable: list[str] = field(default_factory=list)


def _alternative(gpu: Any, hw: Any) -> str:
    from sdrt.hardware.recommend import distribution, plugin_for

    alt = plugin_for(gpu, hw) if gpu is not None and hw is not None else None
    if alt is None or alt[0] == "trt":
        return "use sdrt-ggml (its CUDA build)"
    return f"use {distribution(alt[0])}" + (f" (its {alt[1].upper()} build)" if alt[1] else "")


def _bus(bus: str | None) -> str | None:
    return bus.lower().split(":", 1)[-1] if bus else None  # "0000:01:00.0" and "00000000:01:00.0" alike


def plan_devices(hw: Any, cuda: Iterable[CudaDevice], cuda_error: str | None, targets: Sequence[str],
                 backend: str = "trt") -> DevicePlan:
    """The devices TensorRT-RTX can run on, and a reason for every NVIDIA GPU it cannot.

    ``hw`` is ``sdrt.hardware.detect()``'s result (or None), ``cuda`` the CUDA runtime's devices and
    ``cuda_error`` why the CUDA runtime could not list them (None when it could).
    """
    supported = {cc_of(t) for t in targets}
    listed = ", ".join(f"{a}.{b}" for a, b in sorted(supported))
    plan = DevicePlan()
    gpus = [g for g in (hw.gpus if hw is not None else []) if g.vendor == "nvidia"]
    by_bus = {_bus(g.bus_id): g for g in gpus if g.bus_id}
    seen: set[int] = set()
    for dev in cuda:
        gpu = by_bus.get(_bus(dev.pci_bus_id))
        if gpu is None and len(gpus) == 1:
            gpu = gpus[0]
        if gpu is not None:
            seen.add(id(gpu))
        cc = f"{dev.cc[0]}.{dev.cc[1]}"
        if dev.cc not in supported:
            plan.unusable.append(f"{dev.name} is compute capability {cc}; TensorRT-RTX builds for {listed}; "
                                 f"{_alternative(gpu, hw)}")
            continue
        plan.devices.append(Device(
            backend=backend, id=f"cuda:{dev.ordinal}", name=dev.name, kind="gpu", memory_bytes=dev.memory_bytes,
            properties={"compute_capability": cc, "target": target_of(dev.cc), "pci_bus_id": dev.pci_bus_id,
                        "bf16": dev.cc >= (8, 0)}))
    for gpu in gpus:
        if id(gpu) in seen:
            continue
        from sdrt.hardware.families import cc_tuple

        cc_t = cc_tuple(gpu.compute_capability)
        if cc_t is not None and cc_t not in supported:
            plan.unusable.append(f"{gpu.name} is compute capability {gpu.compute_capability}; TensorRT-RTX builds "
                                 f"for {listed}; {_alternative(gpu, hw)}")
        elif cuda_error:
            plan.unusable.append(f"{gpu.name}: the CUDA runtime cannot use it ({cuda_error}); install or update the "
                                 "NVIDIA driver (CUDA 13 needs driver 580 or newer)")
        else:
            plan.unusable.append(f"{gpu.name}: the CUDA runtime does not list it; check the NVIDIA driver and "
                                 "CUDA_VISIBLE_DEVICES")
    return plan
