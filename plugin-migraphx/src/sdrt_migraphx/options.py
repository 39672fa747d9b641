"""Compile options of the MIGraphX backend, checked.

``precision`` defaults to ``"fp16"`` on GPUs (``migraphx.quantize_fp16``:
MIGraphX's fast path on Radeon and Instinct) and to ``"fp32"`` on the ``ref``
and ``cpu`` targets, which are for checking results. ``exhaustive_tune`` makes
MIGraphX time every kernel candidate on the GPU: minutes more per compile,
paid once, since the program is cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import OptionError

PRECISIONS = {"fp32": "fp32", "f32": "fp32", "float32": "fp32",
              "fp16": "fp16", "f16": "fp16", "float16": "fp16",
              "bf16": "bf16", "bfloat16": "bf16"}
KNOWN = ("precision", "exhaustive_tune", "fast_math", "cache", "cache_dir")
WHERE = "sdrt.load(..., backend='migraphx')"


@dataclass(frozen=True)
class Options:
    precision: str = "fp32"
    exhaustive_tune: bool = False
    fast_math: bool = True
    cache: bool = True
    cache_dir: Path | None = None

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
    unknown = sorted(set(options) - set(KNOWN))
    if unknown:
        raise OptionError(f"unknown options for the migraphx backend: {', '.join(unknown)}", where=WHERE,
                          fix=f"use only {', '.join(KNOWN)}")
    default = "fp16" if gpu else "fp32"
    precision = str(options.get("precision", default)).lower()
    if precision not in PRECISIONS:
        raise OptionError(f"precision {options['precision']!r} is not one of fp32, fp16, bf16", where=WHERE,
                          fix="pass precision='fp16' (the GPU default), 'fp32' (the ref/cpu default) or 'bf16'")
    tune = _flag(options, "exhaustive_tune", False, "pass exhaustive_tune=True to time every kernel (slow compile)")
    fast = _flag(options, "fast_math", True, "pass fast_math=False for MIGraphX's exact math functions")
    cache = _flag(options, "cache", True, "pass cache=False to skip the compiled-program cache")
    cache_dir = options.get("cache_dir")
    if cache_dir is not None and not isinstance(cache_dir, (str, Path)):
        raise OptionError(f"cache_dir must be a path, got {cache_dir!r}", where=WHERE,
                          fix="pass a folder, or leave cache_dir unset for the user cache folder")
    return Options(PRECISIONS[precision], tune, fast, cache, Path(cache_dir) if cache_dir is not None else None)
