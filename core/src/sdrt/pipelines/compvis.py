"""A1111's img2img cut for its "timesteps" samplers, DDIM, PLMS and UniPC (``strength_rule="a1111"`` /
``"a1111-fix-steps"`` and the hires fix's second pass).

A1111 runs DDIM, PLMS and UniPC through ``CompVisSampler`` (modules/sd_samplers_timesteps.py), which cuts img2img
otherwise than its k-diffusion samplers (:mod:`.strength`: ``t_enc + 1`` steps of the sigma schedule):

- its timesteps are ``range(0, 1000, 1000 // length) + 1`` (clipped to 999; ``length`` the schedule's length,
  ``steps``, or the stretched one under ``img2img_fix_steps`` and in the hires pass), which may hold more entries
  than ``length`` (31 for 30 steps) and cannot be made past 1000 steps;
- ``timesteps[:t_enc]`` are kept and the image latent is noised to ``timesteps[t_enc]`` (``sqrt(a) x + sqrt(1 - a)
  noise``);
- DDIM and PLMS step from the last kept one down to ``timesteps[1]``, each landing on the one below, so ``t_enc - 1``
  steps run (PLMS calls the model once more in its first, pseudo improved Euler, step), the first one treating the
  latent as if it were at ``timesteps[t_enc - 1]``, and the result is the latent at ``timesteps[0]`` (1), decoded as
  it is. At 20 steps and strength 0.5: noised to 501, 9 steps at 451, 401, ..., 51; at 0.05 (``t_enc`` 1) no step
  at all: the noised latent is the result, as in A1111.

- UniPC hands its own solver (A1111's port of UniPC: order 3, ``time_uniform``, B(h) = h, lower order at the end)
  ``t_enc`` steps in continuous time from ``timesteps[t_enc - 1] / 1000 + 1 / 1000`` down to ``1 / 1000``, again from
  the latent noised to ``timesteps[t_enc]``; it refuses fewer steps than its order (img2img at 0.1 of 20 steps, a
  hires pass of 3 steps or fewer), and so does sdrt, in one line.

DDIM runs here as that cut of diffusers' ``DDIMScheduler`` arithmetic (the step from ``alphas_cumprod[t]`` to
``alphas_cumprod[t_prev]``, in the latent A1111's sampler keeps); PLMS and UniPC as sdrt's own (:func:`sdrt.samplers.plms`,
:func:`sdrt.samplers.uni_pc`, the same updates in sigma) on the sigmas of those points (UniPC's from A1111's
``NoiseScheduleVP("discrete")``: ``log alpha`` linear in ``t`` between the table's entries), the latent turned into
that form at the start and back at the end. In txt2img sdrt's PLMS and UniPC keep their own schedules (ComfyUI's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from .loops import F32, DDIMLoop, KLoop
from .scheduling import Plan

#: sdrt's (sampler, schedule) of A1111's DDIM, PLMS and UniPC labels (A1111's timestep samplers take no schedule)
SAMPLERS = frozenset({("ddim", "ddim_uniform"), ("plms", "ddim_uniform"), ("uni_pc", "normal")})


def timesteps(length: int, where: str = "strength") -> np.ndarray:
    """A1111's ``CompVisSampler.get_timesteps``: ``clip(range(0, 1000, 1000 // length) + 1, 0, 999)``."""
    if length > 1000:  # 1000 // length is 0: A1111's range() fails
        raise InputError(f"A1111's DDIM and PLMS make a schedule of 1000 steps at most, and this one is {length}",
                         where=where, fix="lower {@steps}, raise {@" + where + "}, or use another sampler (Euler)")
    return np.clip(np.arange(0, 1000, 1000 // length) + 1, 0, 999).astype(np.int64)


def cut(length: int, start: int, where: str = "strength") -> tuple[np.ndarray, int]:
    """(A1111's timesteps, ``t_enc``) for a schedule of ``length`` of which the A1111 rule runs from ``start``
    (:func:`sdrt.pipelines.strength.schedule`: ``t_enc = length - start - 1``)."""
    return timesteps(length, where), length - start - 1


class DDIMCut(DDIMLoop):
    """DDIM on A1111's cut: the latent noised to ``noise_t``, then the plan's steps."""

    def __init__(self, ms: Any, ts: np.ndarray, t_enc: int) -> None:
        calls = [int(ts[i]) for i in range(t_enc - 1, 0, -1)]
        prev = [int(ts[i - 1]) for i in range(t_enc - 1, 0, -1)]
        sig = [ms.ddim_sigma(t) for t in [*calls, int(ts[0])]]
        super().__init__(ms, Plan(sig, [float(t) for t in calls], 1.0, prev, len(ts)))
        self.noise_t = int(ts[t_enc])

    def add_noise(self, image: np.ndarray, noise: np.ndarray, index: int) -> np.ndarray:
        if index:
            return super().add_noise(image, noise, index)
        a = self.ms.ddim_alpha(self.noise_t)
        return a ** F32(0.5) * image + (F32(1) - a) ** F32(0.5) * noise


class _SigmaCut(KLoop):
    """An sdrt sampler on sigmas A1111's cut gives: the latent A1111 noises to ``noise_t`` (``sqrt(a) x +
    sqrt(1 - a) noise``) read as the first sigma's at the start (divided by that point's ``sqrt(alpha_cumprod)``,
    ``first``), and the last sigma's latent given back as A1111's sampler keeps it (times ``sqrt(last)``)."""

    def __init__(self, ms: Any, sigmas: list[float], sampler: Any, options: dict[str, Any], noise_t: int,
                 first: float, last: float, *, seed: int, generator: Any) -> None:
        super().__init__(ms, sigmas, sampler, options, seed=seed, generator=generator)
        self.noise_t, self.first, self.last = noise_t, np.float32(first), np.float32(last)

    def add_noise(self, image: np.ndarray | None, noise: np.ndarray, index: int) -> np.ndarray:
        if index or image is None:
            return super().add_noise(image, noise, index)
        a = np.float32(self.ms.alphas_cumprod_f32[self.noise_t])
        xi = a ** F32(0.5) * image + (F32(1) - a) ** F32(0.5) * noise  # A1111's latent, at noise_t
        return (xi / self.first ** F32(0.5)).astype(np.float32)  # read as the first step's

    def run(self, model: Any, x: np.ndarray, **kwargs: Any) -> np.ndarray:
        out = super().run(model, x, **kwargs)
        return (out * self.last ** F32(0.5)).astype(np.float32)


class PLMSCut(_SigmaCut):
    """PLMS on A1111's cut: sdrt's sampler on the sigmas of ``timesteps[t_enc - 1]`` ... ``timesteps[0]``, its first
    step a pseudo improved Euler one however few follow."""

    def __init__(self, ms: Any, ts: np.ndarray, t_enc: int, sampler: Any, options: dict[str, Any], *, seed: int,
                 generator: Any) -> None:
        run = [int(ts[i]) for i in range(max(t_enc - 1, 0), -1, -1)]
        ac = ms.alphas_cumprod_f32
        super().__init__(ms, [float(ms.sigmas_f32[t]) for t in run], sampler, {**options, "pseudo_first": True},
                         int(ts[t_enc]), float(ac[run[0]]), float(ac[run[-1]]), seed=seed, generator=generator)
        self.first_t, self.last_t = run[0], run[-1]


#: A1111's UniPC options' defaults (uni_pc_order, uni_pc_skip_type, uni_pc_variant, uni_pc_lower_order_final)
UNIPC_ORDER = 3


def unipc_sigmas(ms: Any, t_start: float, steps: int) -> tuple[list[float], float, float]:
    """The sigmas of A1111's UniPC points (its ``NoiseScheduleVP("discrete")``: ``log alpha`` interpolated linearly
    between ``t = (n + 1) / 1000`` and ``0.5 log alphas_cumprod[n]``; ``time_uniform``: ``steps + 1`` points from
    ``t_start`` to ``1 / 1000``), with ``alpha_cumprod`` at the first and the last."""
    n = len(ms.alphas_cumprod_f32)
    grid = np.arange(1, n + 1, dtype=np.float64) / n
    log_alpha = 0.5 * np.log(ms.alphas_cumprod_f32.astype(np.float64))
    points = np.linspace(t_start, 1.0 / n, steps + 1)
    la = np.interp(points, grid, log_alpha)
    sigmas = np.sqrt(np.expm1(-2.0 * la))
    return [float(s) for s in sigmas], float(np.exp(2 * la[0])), float(np.exp(2 * la[-1]))


class UniPCCut(_SigmaCut):
    """UniPC on A1111's cut: A1111 hands its own UniPC solver ``t_enc`` steps in continuous time from
    ``timesteps[t_enc - 1] / 1000 + 1 / 1000`` down to ``1 / 1000`` (order 3, ``time_uniform``, B(h) = h, lower order at
    the end); sdrt's UniPC (the same predictor-corrector updates, in sigma) runs on the sigmas of those points."""

    def __init__(self, ms: Any, ts: np.ndarray, t_enc: int, sampler: Any, options: dict[str, Any], *, seed: int,
                 generator: Any) -> None:
        t_start = float(np.float32(ts[t_enc - 1]) / np.float32(1000) + np.float32(1 / 1000))  # A1111's, in float32
        sigmas, first, last = unipc_sigmas(ms, t_start, t_enc)
        super().__init__(ms, sigmas, sampler, options, int(ts[t_enc]), first, last, seed=seed, generator=generator)


def run_steps(ms: Any, choice: Any, length: int, start: int) -> int | None:
    """The steps :func:`loop` runs for these arguments (DDIM and PLMS ``t_enc - 1``, UniPC ``t_enc``), or None when it
    runs none of its own (the step callback's total)."""
    if (choice.sampler, choice.schedule) not in SAMPLERS or not hasattr(ms, "ddim_alpha"):
        return None
    t_enc = length - start - 1
    return t_enc if choice.sampler == "uni_pc" else max(t_enc - 1, 0)


def loop(ms: Any, choice: Any, length: int, start: int, *, seed: int, generator: Any,
         where: str = "strength", fixed: bool = False) -> Any:
    """A1111's loop for ``choice`` (a SamplerChoice) over a schedule of ``length`` run from ``start`` under an A1111
    rule, or None when the sampler is not one of A1111's DDIM / PLMS or the schedule is no DDPM folder's.
    ``fixed``: img2img under ``"a1111-fix-steps"`` (its ``t_enc`` is ``steps - 1``, whatever the strength)."""
    if (choice.sampler, choice.schedule) not in SAMPLERS or not hasattr(ms, "ddim_alpha"):
        return None
    ts, t_enc = cut(length, start, where)
    if choice.sampler == "ddim":
        return DDIMCut(ms, ts, t_enc)
    from ..samplers import get_sampler

    if choice.sampler == "uni_pc":
        if t_enc < UNIPC_ORDER:  # A1111's solver asserts steps >= order
            if where == "hires_denoise":  # the hires pass runs its steps less one; said as the sampler's own check
                from ..errors import SamplerError

                raise SamplerError(f"uni_pc needs at least {UNIPC_ORDER + 1} steps in the hires pass as A1111 runs it "
                                   f"(its solver takes them less one, and refuses fewer than its order, "
                                   f"{UNIPC_ORDER}), got {t_enc + 1}", where="sampler uni_pc",
                                   fix=f"pass {{@hires_steps=}}{UNIPC_ORDER + 1} or more, or another sampler")
            if fixed:  # A1111's img2img_fix_steps: steps - 1 solver steps at any strength
                raise InputError(f"A1111's UniPC runs this img2img as {t_enc} step{'' if t_enc == 1 else 's'} of its "
                                 f"solver (steps less one, its img2img steps being fixed), fewer than its order "
                                 f"({UNIPC_ORDER}), which it refuses", where="steps",
                                 fix=f"pass {{@steps=}}{UNIPC_ORDER + 1} or more, or use another sampler (DPM++ 2M)")
            raise InputError(f"A1111's UniPC runs this img2img as {t_enc} step{'' if t_enc == 1 else 's'} of its solver "
                             f"(int(strength x steps)), fewer than its order ({UNIPC_ORDER}), which it refuses",
                             where=where, fix=f"raise {{@{where}}} or {{@steps}} (0.5 of 20 steps runs 10), or use "
                                              "another sampler (DPM++ 2M)")
        return UniPCCut(ms, ts, t_enc, get_sampler("uni_pc"), dict(choice.options), seed=seed, generator=generator)
    return PLMSCut(ms, ts, t_enc, get_sampler("plms"), dict(choice.options), seed=seed, generator=generator)
