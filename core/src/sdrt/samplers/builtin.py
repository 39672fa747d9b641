"""The built-in samplers and schedules, registered through the same hook as any plugin's.

``sdrt.plugins`` registers this module as the built-in plugin ``samplers`` before any
entry point (as llm registers its default plugins), so one table, ``Registry.samplers``,
serves built-ins and plugins; a plugin that registers a built-in name replaces it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..hookspecs import hookimpl
from . import dd_samplers, dpm_solver, k_samplers, multistep, schedules, unipc

Sampler = Callable[..., np.ndarray]
Schedule = Callable[..., np.ndarray]


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
    "plms": multistep.plms,
    "dpm_fast": dpm_solver.dpm_fast,
    "dpm_adaptive": dpm_solver.dpm_adaptive,
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


@hookimpl
def register_samplers(register: Callable[..., None]) -> None:
    for name, sampler in BUILTIN_SAMPLERS.items():
        register(name, sampler, kind="sampler")
    for name, schedule in BUILTIN_SCHEDULES.items():
        register(name, schedule, kind="schedule")


__all__ = ["BUILTIN_SAMPLERS", "BUILTIN_SCHEDULES", "register_samplers"]
