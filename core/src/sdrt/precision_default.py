"""The default precision of a device: the fastest one whose images stay within the bar against float32.

A backend offers some precisions (``Backend.precisions``); which one it compiles at when the caller passes
no ``precision=`` is decided here, once for every backend, from the device's kind and what its hardware
runs fast:

- a GPU (or NPU): ``fp16``, which every GPU runs at least twice as fast as float32;
- a CPU with AVX-512-BF16 or AMX-BF16 (``bf16_fast``): ``bf16``, 3-5x float32 on OpenVINO's CPU plugin;
- otherwise ``fp32``: a CPU without bf16 units emulates bf16 and gains nothing from it.

Each of these stays within ``PSNR_BAR_DB`` of the float32 image on every pipeline measured
(docs/precision.md has the table and the reason for the bar; ``bench/precision_quality.py`` measures it
and ``tests/precision/test_default_quality.py`` holds it). ``SDRT_PRECISION`` (``fp32``, ``bf16``, ...)
replaces the default everywhere, for callers that want float32 reproducibility without passing
``precision=`` to every load; an explicit ``precision=`` still wins.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .precision import ALIASES as _NAMES  # the one precision vocabulary

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

#: the image-level bar: a default precision keeps the PSNR of its uint8 image against float32's at or above
#: this (8-bit images; docs/precision.md says why 30 dB)
PSNR_BAR_DB = 30.0
#: the environment variable that replaces every backend's default precision
ENV = "SDRT_PRECISION"
#: CPU feature flags (``/proc/cpuinfo``) that give bfloat16 dot products in hardware
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def choose(kind: str, offered: Iterable[str], *, bf16_fast: bool = False, fp16_fast: bool | None = None) -> str:
    """The default precision (``fp32``, ``fp16`` or ``bf16``) on a device of ``kind`` (``cpu``, ``gpu``, ``npu``)
    among the ``offered`` ones. ``bf16_fast``: the device has bfloat16 dot products (a CPU with AVX-512-BF16 or
    AMX). ``fp16_fast`` defaults to True on GPUs and NPUs, False on CPUs."""
    have = {_NAMES.get(str(p).lower(), str(p).lower()) for p in offered}
    if fp16_fast is None:
        fp16_fast = kind in ("gpu", "npu")
    if fp16_fast and "fp16" in have:
        return "fp16"
    if bf16_fast and "bf16" in have:
        return "bf16"
    return "fp32"


def requested() -> str | None:
    """The precision ``SDRT_PRECISION`` names (``"bf16"`` for ``bfloat16``), None when unset; a value that names no
    precision is a ``PrecisionError`` about the variable (not silently ignored)."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    name = _NAMES.get(value.lower())
    if name is None:
        from .precision import PRECISIONS, PrecisionError

        raise PrecisionError(f"{ENV}={value!r} names no precision", where=f"the environment variable {ENV}",
                             fix=f"set it to one of {', '.join(PRECISIONS)} (or an alias such as float32, half, "
                             "bfloat16), or unset it")
    return name


def override(offered: Iterable[str]) -> str | None:
    """The precision ``SDRT_PRECISION`` names when it is one of ``offered`` (None when unset or not offered); a
    value that names no precision raises (:func:`requested`)."""
    name = requested()
    if name is None:
        return None
    have = {_NAMES.get(str(p).lower(), str(p).lower()) for p in offered}
    return name if name in have else None


@functools.cache
def _cpuinfo_field(*names: str) -> str | None:
    """The first processor's value of the first of ``names`` in ``/proc/cpuinfo`` (None where it is absent)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(names):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags as Linux names them (empty where ``/proc/cpuinfo`` is absent)."""
    return frozenset((_cpuinfo_field("flags", "Features") or "").split())


def cpu_vendor() -> str | None:
    """This machine's x86 CPU vendor as ``sdrt.hardware`` names it (``intel``, ``amd``, ...), or None where
    ``/proc/cpuinfo`` gives none (ARM, macOS, Windows)."""
    from .hardware.parse import _X86_VENDORS

    vid = _cpuinfo_field("vendor_id")
    return None if vid is None else _X86_VENDORS.get(vid, vid.lower())


def cpu_bf16_fast(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU has bfloat16 dot products in hardware (AVX-512-BF16 or AMX-BF16)."""
    return bool(BF16_FLAGS & set(cpu_flags() if flags is None else flags))


def psnr(image: np.ndarray, reference: np.ndarray) -> float:
    """PSNR in dB of an 8-bit image against a reference of the same shape (inf when they are equal)."""
    import numpy as np

    a, b = np.asarray(image, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images of different shapes: {a.shape} and {b.shape}")
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10.0 * float(np.log10(255.0 ** 2 / mse))


__all__ = ["BF16_FLAGS", "ENV", "PSNR_BAR_DB", "choose", "cpu_bf16_fast", "cpu_flags", "cpu_vendor", "override", "psnr"]
