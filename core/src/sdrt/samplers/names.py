"""Sampler names users know: A1111/Forge labels and ComfyUI names -> (sampler, schedule).

``resolve("DPM++ 2M Karras")`` gives ``SamplerChoice("dpmpp_2m", "karras")``;
``resolve("dpmpp_2m", "karras")`` (ComfyUI's sampler and scheduler fields) gives
the same. A1111 labels carry their own options: the default schedule of its
"Automatic" setting, ``discard_next_to_last_sigma`` (DPM2, DPM2 a, DPM++ 3M
SDE), ``solver_type`` for the Heun variant of DPM++ 2M SDE and ``eta`` 1 for
DPM fast and DPM adaptive (A1111's "Eta for k-diffusion samplers", 1 by default).
A name that A1111, Forge or ComfyUI offer but sdrt does not run
(``UNAVAILABLE``: Restart, the CFG++ variants, ...) is refused with the nearest
names sdrt has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any

from ..errors import SamplerError
from .registry import available_samplers, available_schedules
from .schedules import DISCARD_PENULTIMATE_SIGMA

__all__ = ["A1111_SAMPLERS", "A1111_SCHEDULES", "UNAVAILABLE", "SamplerChoice", "resolve"]


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
    "DPM fast": ("dpm_fast", "normal", False, {"eta": 1.0}),
    "DPM adaptive": ("dpm_adaptive", "normal", False, {"eta": 1.0}),
    "PLMS": ("plms", "ddim_uniform", False, {}),
}

_NO_REFERENCE = "no independent implementation that a port could be checked against is installable"
_CFG_PP = "a CFG++ variant (Chung et al. 2024), which changes how guidance enters the step; " + _NO_REFERENCE

#: names A1111, Forge or ComfyUI offer that sdrt does not run: name -> (why, the nearest names sdrt has)
UNAVAILABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    "Restart": ("A1111's own sampler (Xu et al. 2023, Heun steps with noise re-injected); " + _NO_REFERENCE,
                ("Heun Karras", "DPM++ SDE Karras", "DPM++ 2M Karras")),
    "DDIM CFG++": (_CFG_PP, ("DDIM",)),
    "Euler CFG++": (_CFG_PP, ("Euler",)),
    "Euler a CFG++": (_CFG_PP, ("Euler a",)),
    "DPM++ 2M CFG++": (_CFG_PP, ("DPM++ 2M",)),
    "DPM++ 2S a CFG++": (_CFG_PP, ("DPM++ 2S a",)),
    "euler_cfg_pp": (_CFG_PP, ("euler",)),
    "euler_ancestral_cfg_pp": (_CFG_PP, ("euler_ancestral",)),
    "dpmpp_2m_cfg_pp": (_CFG_PP, ("dpmpp_2m",)),
    "dpmpp_2s_ancestral_cfg_pp": (_CFG_PP, ("dpmpp_2s_ancestral",)),
    "res_multistep": ("ComfyUI's RES multistep sampler; " + _NO_REFERENCE, ("dpmpp_2m", "deis")),
    "res_multistep_cfg_pp": (_CFG_PP, ("dpmpp_2m",)),
    "res_multistep_ancestral": ("ComfyUI's ancestral RES multistep sampler; " + _NO_REFERENCE,
                                ("dpmpp_2s_ancestral", "euler_ancestral")),
    "res_multistep_ancestral_cfg_pp": (_CFG_PP, ("dpmpp_2s_ancestral", "euler_ancestral")),
    "heunpp2": ("ComfyUI's Heun++ sampler; " + _NO_REFERENCE, ("heun", "dpm_2")),
    "ipndm_v": ("ComfyUI's variable-step iPNDM; " + _NO_REFERENCE, ("ipndm", "deis")),
    "gradient_estimation": ("ComfyUI's gradient-estimation sampler (Permenter & Yuan 2024); " + _NO_REFERENCE,
                            ("euler", "dpmpp_2m")),
    "gradient_estimation_cfg_pp": (_CFG_PP, ("euler", "dpmpp_2m")),
    "er_sde": ("ComfyUI's ER-SDE solver (Cui et al. 2023); " + _NO_REFERENCE, ("dpmpp_2m_sde", "dpmpp_3m_sde")),
    "seeds_2": ("ComfyUI's SEEDS-2 solver (Gonzalez et al. 2023); " + _NO_REFERENCE, ("dpmpp_sde", "dpmpp_2m_sde")),
    "seeds_3": ("ComfyUI's SEEDS-3 solver (Gonzalez et al. 2023); " + _NO_REFERENCE, ("dpmpp_3m_sde", "dpmpp_sde")),
    "sa_solver": ("ComfyUI's SA-Solver (Xue et al. 2023); " + _NO_REFERENCE, ("dpmpp_2m_sde", "uni_pc")),
    "sa_solver_pece": ("ComfyUI's SA-Solver PECE (Xue et al. 2023); " + _NO_REFERENCE, ("dpmpp_2m_sde", "uni_pc")),
    "exp_heun_2_x0": ("ComfyUI's exponential Heun sampler; " + _NO_REFERENCE, ("dpmpp_2m", "heun")),
    "exp_heun_2_x0_sde": ("ComfyUI's stochastic exponential Heun sampler; " + _NO_REFERENCE,
                          ("dpmpp_2m_sde", "dpmpp_sde")),
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


def _unavailable(name: str) -> tuple[str, tuple[str, ...]] | None:
    """(why, nearest) for a name sdrt does not run, with or without an A1111 schedule suffix; else None."""
    if name in UNAVAILABLE:
        return UNAVAILABLE[name]
    folded = _fold(name)
    for key in sorted(UNAVAILABLE, key=len, reverse=True):
        fkey = _fold(key)
        rest = folded[len(fkey):].strip() if folded == fkey or folded.startswith(fkey + " ") else None
        if rest is not None and (not rest or rest in _SCHED_FOLDED or rest == "automatic"):
            return UNAVAILABLE[key]
    return None


def _closest(name: str) -> list[str]:
    """Known names close to a mistyped one (A1111 labels and ComfyUI names)."""
    labels = [*A1111_SAMPLERS, *(f"{a} {s}" for a in A1111_SAMPLERS for s in A1111_SCHEDULES)]
    comfy = [*available_samplers(), *_COMFY_ALIASES]
    # "DPM fast" and "dpm_fast" fold alike: offer the kind of name that was given (a ComfyUI one has "_")
    known = {_fold(n): n for n in ([*labels, *comfy] if "_" in name else [*comfy, *labels])}
    return [known[k] for k in get_close_matches(_fold(name), list(known), n=3, cutoff=0.75)]


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
        # "karas": the closest, as an unknown sampler gets (a ComfyUI name for a name with "_", else a label)
        names = [*available_schedules(), *A1111_SCHEDULES]
        known = {_fold(n): n for n in (reversed(names) if "_" in schedule else names)}
        close = [known[k] for k in get_close_matches(_fold(schedule), list(known), n=3, cutoff=0.75)]
        hint = f" (the closest known: {', '.join(repr(c) for c in close)})" if close else ""
        raise SamplerError(f"unknown schedule {schedule!r}{hint}", where="schedule",
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
        missing = _unavailable(name)
        if missing is not None:
            why, nearest = missing
            raise SamplerError(f"the sampler {name!r} is not available in sdrt: {why}", where="sampler",
                               fix=f"use the nearest sdrt has: {', '.join(nearest)}. {_valid_listing()}")
        close = _closest(name)
        hint = f" (the closest known: {', '.join(repr(c) for c in close)})" if close else ""
        raise SamplerError(f"unknown sampler {name!r}{hint}", where="sampler",
                           fix=f"use one of the known names. {_valid_listing()}")
    return choice
