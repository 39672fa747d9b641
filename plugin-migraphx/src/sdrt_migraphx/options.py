"""Compile options of the MIGraphX backend, checked.

``precision`` (sdrt's precision vocabulary, ``sdrt.precision``) defaults to ``"fp16"`` on GPUs (``migraphx.quantize_fp16``:
MIGraphX's fast path on Radeon and Instinct) and to ``"fp32"`` on the ``ref``
and ``cpu`` targets, which are for checking results. ``exhaustive_tune`` makes
MIGraphX time every kernel candidate on the GPU: minutes more per compile,
paid once, since the program is cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdrt.errors import OptionError, check_known_options
from sdrt.precision import precision_name

#: the precisions of sdrt's vocabulary (``sdrt.precision.PRECISIONS``) MIGraphX compiles at
PRECISIONS = ("fp32", "fp16", "bf16")
KNOWN = ("precision", "exhaustive_tune", "fast_math")
WHERE = "sdrt.load(..., backend='migraphx')"


@dataclass(frozen=True)
class Options:
    precision: str = "fp32"
    exhaustive_tune: bool = False
    fast_math: bool = True

    def key(self) -> str:
        """What of these options changes the compiled program (for the cache key)."""
        return f"precision={self.precision};exhaustive_tune={self.exhaustive_tune};fast_math={self.fast_math}"


def _flag(options: Mapping[str, Any], name: str, default: bool, fix: str) -> bool:
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be True or False, got {value!r}", where=WHERE, fix=fix)
    return value


def parse_options(options: Mapping[str, Any], *, gpu: bool) -> Options:
    """Check ``sdrt.load(..., **options)`` for this backend; ``gpu`` picks the default precision."""
    check_known_options("migraphx", options, KNOWN, where=WHERE)
    precision = precision_name(options.get("precision", "fp16" if gpu else "fp32"), PRECISIONS,
                               where=f"{WHERE} precision= (default fp16 on GPUs, fp32 on ref/cpu)")
    tune = _flag(options, "exhaustive_tune", False, "pass exhaustive_tune=True to time every kernel (slow compile)")
    fast = _flag(options, "fast_math", True, "pass fast_math=False for MIGraphX's exact math functions")
    return Options(precision, tune, fast)
