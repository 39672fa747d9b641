"""Options of the TensorRT-RTX backend (``sdrt.load(..., backend="trt", **options)`` and ``sdrt compile --option``).

- ``precision``: ``"fp16"`` (default), ``"bf16"`` (compute capability 8.0 and newer) or ``"fp32"``.
  TensorRT-RTX networks are strongly typed: precision comes from the graph, so fp16/bf16 run
  ``sdrt.precision.to_half`` first (normalizations, softmax and the last layers stay fp32).
- ``shapes``: pins dynamic dims, as ``Graph.with_shapes`` takes them (``{"sample": (2, 4, 64, 64)}``
  or ``{"batch": 2}``).
- ``profiles``: an optimization profile for dynamic inputs: ``{"sample": [min, opt, max]}`` with three
  full shapes each. A graph with dynamic inputs needs ``shapes`` or ``profiles``.
- ``refit``: ``"auto"`` (default), ``"full"``, ``"identical"`` or ``"none"``. ``"full"`` builds a
  weight-stripped engine that any weights of the same shapes refit (checkpoints, LoRA);
  ``"identical"`` a stripped engine refit only with the weights it was built from (small engine files);
  ``"none"`` an engine holding its weights. ``"auto"`` is ``"full"`` where a CUDA GPU is present and
  ``"none"`` where none is (TensorRT-RTX builds refittable engines only on a machine with a GPU).
- ``cache`` (default True) and ``cache_dir``: the core's compile cache (``$SDRT_CACHE_DIR/compiled/trt``).
- ``engine``: a file written by ``sdrt compile``, used instead of building.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdrt.errors import OptionError, check_known_options
from sdrt.precision import precision_name

#: the precisions of sdrt's vocabulary (``sdrt.precision.PRECISIONS``) TensorRT-RTX builds at
PRECISIONS = ("fp16", "bf16", "fp32")
REFIT = ("auto", "full", "identical", "none")
KNOWN = ("precision", "shapes", "profiles", "refit", "engine")


@dataclass(frozen=True)
class Options:
    precision: str = "fp16"
    shapes: Mapping[str, Any] = field(default_factory=dict)
    profiles: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    refit: str = "auto"
    engine: Path | None = None

    def key(self, refit: str) -> str:
        """What of these options changes the engine (for the cache key), with ``refit`` resolved."""
        profiles = sorted((k, v) for k, v in self.profiles.items())
        return f"precision={self.precision};refit={refit};profiles={profiles}"


def _shape(value: Any, where: str, what: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value):
        raise OptionError(f"{what} must be a list of positive ints, got {value!r}", where=where,
                          fix="write a full shape such as [1, 4, 64, 64]")
    return tuple(int(d) for d in value)


def parse_options(options: Mapping[str, Any], where: str = "sdrt.load(..., backend='trt')") -> Options:
    check_known_options("trt", options, KNOWN, where=where)
    precision = precision_name(options.get("precision", "fp16"), PRECISIONS, where=f"{where} precision=")
    shapes = options.get("shapes") or {}
    if not isinstance(shapes, Mapping):
        raise OptionError(f"shapes must be a dict, got {type(shapes).__name__}", where=where,
                          fix="pass shapes={'sample': (2, 4, 64, 64)} or shapes={'batch': 2}")
    profiles: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    raw = options.get("profiles") or {}
    if not isinstance(raw, Mapping):
        raise OptionError(f"profiles must be a dict, got {type(raw).__name__}", where=where,
                          fix="pass profiles={'sample': [min_shape, opt_shape, max_shape]}")
    for name, triple in raw.items():
        if isinstance(triple, Mapping):
            triple = [triple.get("min"), triple.get("opt"), triple.get("max")]
        if not isinstance(triple, Sequence) or isinstance(triple, str) or len(triple) != 3:
            raise OptionError(f"profile of {name!r} must be [min, opt, max] shapes, got {triple!r}", where=where,
                              fix="pass profiles={'sample': [[1, 4, 32, 32], [2, 4, 64, 64], [4, 4, 128, 128]]}")
        mn, opt, mx = (_shape(s, where, f"profile {name!r} {w}") for s, w in zip(triple, ("min", "opt", "max")))
        if not (len(mn) == len(opt) == len(mx)) or any(not (a <= b <= c) for a, b, c in zip(mn, opt, mx)):
            raise OptionError(f"profile of {name!r} needs min <= opt <= max in every dim, got {mn}, {opt}, {mx}",
                              where=where, fix="order the three shapes min, opt, max")
        profiles[str(name)] = (mn, opt, mx)
    refit = str(options.get("refit", "auto")).lower()
    if refit not in REFIT:
        raise OptionError(f"refit {options['refit']!r} is not one of {', '.join(REFIT)}", where=where,
                          fix="pass refit='full' (refit with any weights), 'identical', 'none', or leave it 'auto'")
    engine = options.get("engine")
    return Options(precision, dict(shapes), profiles, refit, Path(engine) if engine is not None else None)
