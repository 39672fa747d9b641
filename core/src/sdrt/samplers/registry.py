"""Sampler and schedule lookup by name, in the one table of the plugin registry.

Built-ins (``samplers.builtin``) and plugins add entries through the same
``register_samplers(register)`` hook: ``register(name, fn, kind="sampler")``
for a sampler with k-diffusion's signature, ``register(name, fn,
kind="schedule")`` for a schedule called as ``fn(steps, model_sampling,
**kwargs) -> sigmas``. Built-ins register first, so a plugin name that equals
a built-in name replaces the built-in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import SamplerError
from ..plugins import get_registry
from . import schedules
from .builtin import BUILTIN_SAMPLERS, BUILTIN_SCHEDULES

__all__ = [
    "BUILTIN_SAMPLERS",
    "BUILTIN_SCHEDULES",
    "available_samplers",
    "available_schedules",
    "get_sampler",
    "get_schedule",
    "get_sigmas",
]

Sampler = Callable[..., np.ndarray]
Schedule = Callable[[int, Any], np.ndarray]


Sampler = Callable[..., np.ndarray]
Schedule = Callable[..., np.ndarray]


def _entries(kind: str) -> dict[str, Any]:
    return {name: fn for name, (k, fn) in get_registry().samplers.items() if k == kind}


def available_samplers() -> list[str]:
    """Every sampler name: built-ins and plugin-registered ones, sorted."""
    return sorted(_entries("sampler"))


def available_schedules() -> list[str]:
    """Every schedule name: built-ins and plugin-registered ones, sorted."""
    return sorted(_entries("schedule"))


def get_sampler(name: str) -> Sampler:
    """The sampler function called ``name`` (a plugin's replaces a built-in of that name)."""
    fn = _entries("sampler").get(name)
    if fn is None:
        raise SamplerError(f"unknown sampler {name!r}", where="sdrt.samplers.get_sampler",
                           fix=f"use one of: {', '.join(available_samplers())}")
    return fn


def get_schedule(name: str) -> Schedule:
    """The schedule function called ``name``, as ``fn(steps, model_sampling) -> sigmas``."""
    fn = _entries("schedule").get(name)
    if fn is None:
        raise SamplerError(f"unknown schedule {name!r}", where="sdrt.samplers.get_schedule",
                           fix=f"use one of: {', '.join(available_schedules())}")
    return fn


def get_sigmas(schedule: str, steps: int, model_sampling: Any, *, sampler: str | None = None,
               discard_penultimate: bool | None = None, **kwargs: Any) -> np.ndarray:
    """Sigmas for ``steps`` steps of ``schedule``.

    For samplers in ``schedules.DISCARD_PENULTIMATE_SIGMA`` (or when
    ``discard_penultimate=True``) one extra step is computed and the
    next-to-last sigma dropped, as ComfyUI's KSampler and A1111 do.
    """
    fn = get_schedule(schedule)
    discard = discard_penultimate if discard_penultimate is not None else sampler in schedules.DISCARD_PENULTIMATE_SIGMA
    sigmas = np.asarray(fn(steps + 1 if discard else steps, model_sampling, **kwargs), dtype=np.float64)
    if discard:
        sigmas = np.concatenate([sigmas[:-2], sigmas[-1:]])
    return sigmas
