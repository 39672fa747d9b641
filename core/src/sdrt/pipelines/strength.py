"""Which part of the schedule img2img's strength runs: diffusers' rule or A1111's (``strength_rule=``).

- ``"diffusers"`` (the API's and the CLI's default): ``get_timesteps`` of diffusers' img2img pipelines: a schedule of
  ``steps``, of which the last ``int(steps * strength)`` run, from the image latent noised to the first of them.
- ``"a1111"``: A1111's ``setup_img2img_steps`` with its ``img2img_fix_steps`` option off (its default), and the cut
  its samplers make (``sigmas[steps - t_enc - 1:]``): ``t_enc = int(min(strength, 0.999) * steps)``, a schedule
  of ``steps``, of which ``t_enc + 1`` run (always at least one; every step at strength 1 below 1000 steps), from the
  image latent noised to the first of them.
- ``"a1111-fix-steps"``: the same with ``img2img_fix_steps`` on, the rule A1111's hires fix always runs: the
  schedule is stretched to ``int(steps / min(strength, 0.999))`` steps, of which exactly ``steps`` run.

The schedule itself (its sigmas, timesteps) is the sampler's; only its length and first index come from here.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InputError
from .bounds import MAX_STEPS
from .names import spelled

__all__ = ["DEFAULT", "RULES", "check_rule", "schedule"]

RULES = ("diffusers", "a1111", "a1111-fix-steps")
DEFAULT = "diffusers"
_TOP = 0.999  # A1111's min(denoising_strength, 0.999)


def check_rule(value: Any) -> str:
    """``strength_rule``: one of :data:`RULES` (any case; ``_`` or a space for ``-``)."""
    if isinstance(value, str):
        key = spelled(value, "-")
        if key in RULES:
            return key
    raise InputError(f"unknown {{@strength_rule}} {str(value)[:40]!r}", where="strength_rule",
                     fix="use 'diffusers' (diffusers' img2img), 'a1111' (A1111's) or 'a1111-fix-steps' (A1111 with "
                         "its img2img_fix_steps option: exactly {@steps} steps run)")


def schedule(steps: int, strength: float, rule: str, where: str = "strength",
             steps_fix: str = "lower {@steps}") -> tuple[int, int]:
    """``(length, start)``: the sampler's schedule is made for ``length`` steps and runs from step index ``start``
    to its end (``length - start`` steps). ``where``: the argument a too long stretched schedule is said of;
    ``steps_fix``: the other way out, naming the argument that sets ``steps`` (the hires fix's ``hires_steps``)."""
    if rule == "diffusers":
        return steps, max(steps - min(int(steps * strength), steps), 0)
    if rule == "a1111":
        t_enc = int(min(strength, _TOP) * steps)
        return steps, steps - t_enc - 1
    if rule == "a1111-fix-steps":
        stretched = steps / min(strength, _TOP)  # inf for a subnormal strength: int() of it raised OverflowError
        length = int(stretched) if math.isfinite(stretched) else MAX_STEPS + 1
        if length > MAX_STEPS:
            said = length if math.isfinite(stretched) else "countless"
            raise InputError(f"{{@{where}}} {strength:g} stretches {steps} step{'' if steps == 1 else 's'} to a schedule "
                             f"of {said} steps, above the limit of {MAX_STEPS}", where=where,
                             fix=f"raise {{@{where}}} to at least {steps / MAX_STEPS:.3g}, or {steps_fix}")
        return length, length - steps
    raise AssertionError(rule)  # pragma: no cover - check_rule ran first
