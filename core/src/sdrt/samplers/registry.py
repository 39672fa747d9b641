"""Sampler and schedule lookup by name: the built-ins plus what plugins register.

Plugins add entries through the ``register_samplers(register)`` hook:
``register(name, fn, kind="sampler")`` for a sampler with k-diffusion's
signature, ``register(name, fn, kind="schedule")`` for a schedule called as
``fn(steps, model_sampling) -> sigmas``. A plugin name that equals a built-in
name replaces the built-in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import SamplerError
from . import dd_samplers, k_samplers, multistep, schedules, unipc

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


def _range_schedule(fn: Callable[..., np.ndarray]) -> Schedule:
    @functools.wraps(fn)
    def call(steps: int, model_sampling: Any, **kwargs: Any) -> np.ndarray:
        return fn(steps, float(model_sampling.sigma_min), float(model_sampling.sigma_max), **kwargs)

    return call


def _ays(steps: int, model_sampling: Any, model_type: str = "SD1") -> np.ndarray:
    return schedules.align_your_steps(steps, model_type)


BUILTIN_SAMPLERS: dict[str, Sampler] = {
    "euler": k_samplers.euler,
    "euler_ancestral": k_samplers.euler_ancestral,
    "heun": k_samplers.heun,
    "dpm_2": k_samplers.dpm_2,
    "dpm_2_ancestral": k_samplers.dpm_2_ancestral,
    "lms": k_samplers.lms,
    "dpmpp_2s_ancestral": k_samplers.dpmpp_2s_ancestral,
    "dpmpp_sde": k_samplers.dpmpp_sde,
    "dpmpp_2m": k_samplers.dpmpp_2m,
    "dpmpp_2m_sde": k_samplers.dpmpp_2m_sde,
    "dpmpp_2m_sde_heun": functools.partial(k_samplers.dpmpp_2m_sde, solver_type="heun"),
    "dpmpp_3m_sde": k_samplers.dpmpp_3m_sde,
    "ddim": dd_samplers.ddim,
    "ddpm": dd_samplers.ddpm,
    "lcm": dd_samplers.lcm,
    "uni_pc": unipc.uni_pc,
    "uni_pc_bh2": unipc.uni_pc_bh2,
    "ipndm": multistep.ipndm,
    "deis": multistep.deis,
}

BUILTIN_SCHEDULES: dict[str, Schedule] = {
    "normal": schedules.normal,
    "karras": _range_schedule(schedules.karras),
    "exponential": _range_schedule(schedules.exponential),
    "polyexponential": _range_schedule(schedules.polyexponential),
    "sgm_uniform": schedules.sgm_uniform,
    "simple": schedules.simple,
    "ddim_uniform": schedules.ddim_uniform,
    "beta": schedules.beta,
    "linear_quadratic": schedules.linear_quadratic,
    "kl_optimal": _range_schedule(schedules.kl_optimal),
    "align_your_steps": _ays,
}


def _plugin_entries(kind: str) -> dict[str, Any]:
    from ..plugins import get_registry

    return {name: fn for name, (k, fn) in get_registry().samplers.items() if k == kind}


def available_samplers() -> list[str]:
    """Every sampler name: built-ins and plugin-registered ones, sorted."""
    return sorted(set(BUILTIN_SAMPLERS) | set(_plugin_entries("sampler")))


def available_schedules() -> list[str]:
    """Every schedule name: built-ins and plugin-registered ones, sorted."""
    return sorted(set(BUILTIN_SCHEDULES) | set(_plugin_entries("schedule")))


def get_sampler(name: str) -> Sampler:
    """The sampler function called ``name`` (plugins first, then built-ins)."""
    fn = _plugin_entries("sampler").get(name) or BUILTIN_SAMPLERS.get(name)
    if fn is None:
        raise SamplerError(f"unknown sampler {name!r}", where="sdrt.samplers.get_sampler",
                           fix=f"use one of: {', '.join(available_samplers())}")
    return fn


def get_schedule(name: str) -> Schedule:
    """The schedule function called ``name``, as ``fn(steps, model_sampling) -> sigmas``."""
    fn = _plugin_entries("schedule").get(name) or BUILTIN_SCHEDULES.get(name)
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
