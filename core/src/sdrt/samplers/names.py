"""Sampler names users know: A1111/Forge labels and ComfyUI names -> (sampler, schedule).

``resolve("DPM++ 2M Karras")`` gives ``SamplerChoice("dpmpp_2m", "karras")``;
``resolve("dpmpp_2m", "karras")`` (ComfyUI's sampler and scheduler fields) gives
the same. A1111 labels carry their own options: the default schedule of its
"Automatic" setting, ``discard_next_to_last_sigma`` (DPM2, DPM2 a, DPM++ 3M
SDE) and ``solver_type`` for the Heun variant of DPM++ 2M SDE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import SamplerError
from .registry import available_samplers, available_schedules
from .schedules import DISCARD_PENULTIMATE_SIGMA

__all__ = ["A1111_SAMPLERS", "A1111_SCHEDULES", "SamplerChoice", "resolve"]


@dataclass(frozen=True)
class SamplerChoice:
    """A sampler, a schedule, and the options the label implies."""

    sampler: str
    schedule: str
    discard_penultimate: bool = False
    options: dict[str, Any] = field(default_factory=dict, compare=True, hash=False)


# label -> (sampler, default schedule for "Automatic", discard penultimate, options)
A1111_SAMPLERS: dict[str, tuple[str, str, bool, dict[str, Any]]] = {
    "Euler": ("euler", "normal", False, {}),
    "Euler a": ("euler_ancestral", "normal", False, {}),
    "LMS": ("lms", "normal", False, {}),
    "Heun": ("heun", "normal", False, {}),
    "DPM2": ("dpm_2", "karras", True, {}),
    "DPM2 a": ("dpm_2_ancestral", "karras", True, {}),
    "DPM++ 2S a": ("dpmpp_2s_ancestral", "karras", False, {}),
    "DPM++ 2M": ("dpmpp_2m", "karras", False, {}),
    "DPM++ SDE": ("dpmpp_sde", "karras", False, {}),
    "DPM++ 2M SDE": ("dpmpp_2m_sde", "exponential", False, {}),
    "DPM++ 2M SDE Heun": ("dpmpp_2m_sde", "exponential", False, {"solver_type": "heun"}),
    "DPM++ 3M SDE": ("dpmpp_3m_sde", "exponential", True, {}),
    "DDIM": ("ddim", "ddim_uniform", False, {}),
    "DDPM": ("ddpm", "normal", False, {}),
    "LCM": ("lcm", "normal", False, {}),
    "UniPC": ("uni_pc", "normal", True, {}),
    "iPNDM": ("ipndm", "normal", False, {}),
    "DEIS": ("deis", "normal", False, {}),
}

#: A1111 schedule labels (the "Schedule type" menu and the old label suffixes).
A1111_SCHEDULES: dict[str, str] = {
    "Uniform": "normal",
    "Normal": "normal",
    "Karras": "karras",
    "Exponential": "exponential",
    "Polyexponential": "polyexponential",
    "SGM Uniform": "sgm_uniform",
    "KL Optimal": "kl_optimal",
    "Align Your Steps": "align_your_steps",
    "Simple": "simple",
    "DDIM": "ddim_uniform",
    "Beta": "beta",
    "Linear Quadratic": "linear_quadratic",
}

_COMFY_ALIASES = {"dpmpp_2m_sde_gpu": "dpmpp_2m_sde", "dpmpp_3m_sde_gpu": "dpmpp_3m_sde",
                  "dpmpp_sde_gpu": "dpmpp_sde", "dpmpp_2m_sde_heun_gpu": "dpmpp_2m_sde_heun"}


def _fold(text: str) -> str:
    return " ".join(text.replace("_", " ").split()).casefold()


_A1111_FOLDED = {_fold(k): k for k in A1111_SAMPLERS}
_SCHED_FOLDED = {_fold(k): v for k, v in A1111_SCHEDULES.items()}


def _valid_listing() -> str:
    return (f"A1111 labels: {', '.join(A1111_SAMPLERS)} (optionally followed by a schedule: "
            f"{', '.join(A1111_SCHEDULES)}); ComfyUI samplers: {', '.join(available_samplers())}; "
            f"ComfyUI schedulers: {', '.join(available_schedules())}")


def _split_label(label: str) -> tuple[str, str] | None:
    """(folded sampler label, folded rest) for the longest A1111 sampler label that prefixes ``label`` with a
    schedule label, "automatic" or nothing after it; None when none does."""
    folded = _fold(label)
    for key in sorted(_A1111_FOLDED, key=len, reverse=True):
        if folded == key or folded.startswith(key + " "):
            rest = folded[len(key):].strip()
            if not rest or rest in _SCHED_FOLDED or rest == "automatic":
                return key, rest
    return None


def _from_a1111(label: str, schedule: str | None) -> SamplerChoice | None:
    split = _split_label(label)
    if split is None:
        return None
    key, rest = split
    sampler, default_schedule, discard, options = A1111_SAMPLERS[_A1111_FOLDED[key]]
    if rest and rest != "automatic":
        sched = _SCHED_FOLDED[rest]
        if schedule is not None and _fold(schedule) != "automatic" and _schedule_name(schedule) != sched:
            # A1111 lets the label's suffix win in silence; the caller asked for two schedules
            base = _A1111_FOLDED[key]
            raise SamplerError(f"the sampler {label!r} names its schedule, and {{@schedule}} {schedule!r} "
                               "is another", where="schedule",
                               fix=f"pass {{@sampler}} {base!r} with {{@schedule}} {schedule!r}, or leave "
                                   "{@schedule} unset")
    elif schedule is not None:
        sched = _schedule_name(schedule)
    else:
        sched = default_schedule
    return SamplerChoice(sampler, sched, discard, dict(options))


def label_schedule(label: str, schedule: str | None) -> str | None:
    """The schedule an A1111 label names by its suffix ("DPM++ 2M Karras": karras) when ``schedule`` names
    another one, else None: what A1111 runs in that case (the suffix wins), for a caller that follows it."""
    if schedule is None or _fold(schedule) == "automatic" or not isinstance(label, str):
        return None
    split = _split_label(label)
    if split is None or split[1] not in _SCHED_FOLDED:
        return None
    own = _SCHED_FOLDED[split[1]]
    try:
        return own if _schedule_name(schedule) != own else None
    except SamplerError:
        return None  # an unknown schedule: resolve says so


def _schedule_name(schedule: str) -> str:
    if schedule in available_schedules():
        return schedule
    if _fold(schedule) == "automatic":
        return "normal"
    folded = _SCHED_FOLDED.get(_fold(schedule))
    if folded is None:
        raise SamplerError(f"unknown schedule {schedule!r}", where="schedule",
                           fix=f"use one of: {', '.join(available_schedules())} or an A1111 label: "
                               f"{', '.join(A1111_SCHEDULES)}")
    return folded


def resolve(name: str, schedule: str | None = None) -> SamplerChoice:
    """Turn an A1111/Forge label or a ComfyUI sampler (+ scheduler) name into a ``SamplerChoice``."""
    if not isinstance(name, str) or not name.strip():
        raise SamplerError(f"sampler name must be a non-empty string, got {name!r}",
                           where="sampler", fix=_valid_listing())
    comfy = _COMFY_ALIASES.get(name, name)
    if comfy in available_samplers():
        sched = _schedule_name(schedule) if schedule is not None else "normal"
        return SamplerChoice(comfy, sched, comfy in DISCARD_PENULTIMATE_SIGMA)
    choice = _from_a1111(name, schedule)
    if choice is None:
        raise SamplerError(f"unknown sampler {name!r}", where="sampler",
                           fix=f"use one of the known names. {_valid_listing()}")
    return choice
