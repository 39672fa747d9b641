"""Compile options of the OpenVINO backend, checked and turned into OpenVINO properties.

``precision`` (a name of sdrt's one precision vocabulary, ``sdrt.precision.PRECISIONS``: ``fp32``, ``fp16``,
``bf16`` and their aliases) defaults to the device's default precision (``Backend.precision_for``; the backend
puts it in ``Device.properties["precision"]`` from ``sdrt.precision_default``): ``bf16`` on a CPU whose OpenVINO
plugin lists BF16 (AVX-512-BF16 or AMX), ``fp16`` on a GPU or NPU, ``fp32`` otherwise. Each stays within the
image bar against float32 (docs/precision.md). ``precision="fp32"`` gives outputs within 1e-4 of onnxruntime.
The compile cache's ``cache`` and ``cache_dir`` are the core's options.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdrt.errors import OptionError, check_known_options
from sdrt.precision import precision_name

#: sdrt's precision name -> OpenVINO's INFERENCE_PRECISION_HINT
PRECISIONS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}
HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT", "cumulative_throughput": "CUMULATIVE_THROUGHPUT"}
KNOWN = ("precision", "performance_hint", "threads", "swappable")


@dataclass(frozen=True)
class Options:
    precision: str = "f32"
    performance_hint: str = "latency"
    threads: int | None = None
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


def parse_options(options: Mapping[str, Any], default: str = "fp32") -> Options:
    """Check ``sdrt.load(..., **options)`` for this backend and return ``Options``; ``default`` is the
    precision (a name of sdrt's vocabulary) when ``precision`` is not passed."""
    where = "sdrt.load(..., backend='openvino')"
    check_known_options("openvino", options, KNOWN, where=where)
    precision = PRECISIONS[precision_name(options.get("precision", default), PRECISIONS,
                                          where=f"{where} precision=")]
    hint = str(options.get("performance_hint", "latency")).lower()
    if hint not in HINTS:
        raise OptionError(f"performance_hint {options['performance_hint']!r} is not one of {', '.join(HINTS)}",
                          where=where, fix="pass performance_hint='latency' (the default) or 'throughput'")
    threads = options.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OptionError(f"threads must be a positive int, got {threads!r}", where=where,
                          fix=f"pass threads=1..{os.cpu_count() or 1}, or leave it unset to let OpenVINO choose")
    swappable = options.get("swappable")
    if swappable is not None and not isinstance(swappable, bool):
        raise OptionError(f"swappable must be None, True or False, got {swappable!r}", where=where,
                          fix="pass swappable=True to compile at once in the form weight swaps import, False to "
                              "compile on every swap, or leave it unset")
    return Options(precision, hint, threads, swappable)
