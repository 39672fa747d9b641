"""Compile options of the OpenVINO backend, checked and turned into OpenVINO properties.

``precision`` defaults to the device's default precision (``Backend.precision_for``; the backend puts it in
``Device.properties["precision"]`` from ``sdrt.precision_default``): ``bf16`` on a CPU whose OpenVINO plugin
lists BF16 (AVX-512-BF16 or AMX), ``f16`` on a GPU or NPU, ``f32`` otherwise. Each stays within the image
bar against float32 (docs/precision.md). ``precision="f32"`` gives outputs within 1e-4 of onnxruntime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdrt.errors import SdrtError

PRECISIONS = {"f32": "f32", "fp32": "f32", "float32": "f32",
              "f16": "f16", "fp16": "f16", "float16": "f16",
              "bf16": "bf16", "bfloat16": "bf16"}
HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT", "cumulative_throughput": "CUMULATIVE_THROUGHPUT"}
KNOWN = ("precision", "performance_hint", "threads", "cache", "cache_dir", "swappable")


class OptionError(SdrtError):
    """A compile option of the OpenVINO backend is unknown or has a bad value."""


@dataclass(frozen=True)
class Options:
    precision: str = "f32"
    performance_hint: str = "latency"
    threads: int | None = None
    cache: bool = True
    cache_dir: Path | None = None
    #: the form whose weights a swap rebinds by import (swap.py): None compiles it at the first swap,
    #: True at once, False never (every swap compiles; the weights are not held a second time)
    swappable: bool | None = None

    def properties(self) -> dict[str, Any]:
        """The OpenVINO compile properties these options stand for."""
        props: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": self.precision,
            "PERFORMANCE_HINT": HINTS[self.performance_hint],
        }
        if self.threads is not None:
            props["INFERENCE_NUM_THREADS"] = self.threads
        return props

    def key(self) -> str:
        """What of these options changes the compiled model (for the cache key)."""
        return f"precision={self.precision};hint={self.performance_hint};threads={self.threads}"


def parse_options(options: Mapping[str, Any], default: str = "f32") -> Options:
    """Check ``sdrt.load(..., **options)`` for this backend and return ``Options``; ``default`` is the
    precision (OpenVINO's name) when ``precision`` is not passed."""
    unknown = sorted(set(options) - set(KNOWN))
    where = "sdrt.load(..., backend='openvino')"
    if unknown:
        raise OptionError(f"unknown options for the openvino backend: {', '.join(unknown)}", where=where,
                          fix=f"use only {', '.join(KNOWN)}")
    precision = str(options.get("precision", default)).lower()
    if precision not in PRECISIONS:
        raise OptionError(f"precision {options['precision']!r} is not one of f32, f16, bf16", where=where,
                          fix="pass precision='f32' (exact), 'f16' or 'bf16'")
    hint = str(options.get("performance_hint", "latency")).lower()
    if hint not in HINTS:
        raise OptionError(f"performance_hint {options['performance_hint']!r} is not one of {', '.join(HINTS)}",
                          where=where, fix="pass performance_hint='latency' (the default) or 'throughput'")
    threads = options.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OptionError(f"threads must be a positive int, got {threads!r}", where=where,
                          fix=f"pass threads=1..{os.cpu_count() or 1}, or leave it unset to let OpenVINO choose")
    cache = options.get("cache", True)
    if not isinstance(cache, bool):
        raise OptionError(f"cache must be True or False, got {cache!r}", where=where,
                          fix="pass cache=False to skip the compiled-model cache")
    cache_dir = options.get("cache_dir")
    swappable = options.get("swappable")
    if swappable is not None and not isinstance(swappable, bool):
        raise OptionError(f"swappable must be None, True or False, got {swappable!r}", where=where,
                          fix="pass swappable=True to compile at once in the form weight swaps import, False to "
                              "compile on every swap, or leave it unset")
    return Options(PRECISIONS[precision], hint, threads, cache, Path(cache_dir) if cache_dir is not None else None,
                   swappable)
