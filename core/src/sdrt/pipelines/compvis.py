"""A1111's img2img cut for its "timesteps" samplers, DDIM and PLMS (``strength_rule="a1111"`` / ``"a1111-fix-steps"``
and the hires fix's second pass).

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

DDIM runs here as that cut of diffusers' ``DDIMScheduler`` arithmetic (the step from ``alphas_cumprod[t]`` to
``alphas_cumprod[t_prev]``, in the latent A1111's sampler keeps); PLMS as sdrt's PLMS (an Euler step in sigma per
prediction, :func:`sdrt.samplers.plms`) on the sigmas of those timesteps, the latent turned into that form at the
start and back at the end. UniPC is not cut this way (see docs/serve.md): A1111 runs its own port of UniPC in
continuous time, which sdrt's (ComfyUI's, on sigmas) is not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from .loops import F32, DDIMLoop, KLoop
from .scheduling import Plan

#: sdrt's (sampler, schedule) of A1111's DDIM and PLMS labels (A1111's timestep samplers take no schedule)
SAMPLERS = frozenset({("ddim", "ddim_uniform"), ("plms", "ddim_uniform")})


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


class PLMSCut(KLoop):
    """PLMS on A1111's cut: sdrt's sampler on the sigmas of ``timesteps[t_enc - 1]`` ... ``timesteps[0]``, its first
    step a pseudo improved Euler one however few follow; the latent A1111 noises to ``timesteps[t_enc]`` taken as
    the first sigma's at the start, and the last sigma's latent given back as A1111's sampler keeps it."""

    def __init__(self, ms: Any, ts: np.ndarray, t_enc: int, sampler: Any, options: dict[str, Any], *, seed: int,
                 generator: Any) -> None:
        run = [int(ts[i]) for i in range(max(t_enc - 1, 0), -1, -1)]
        super().__init__(ms, [float(ms.sigmas_f32[t]) for t in run], sampler, {**options, "pseudo_first": True},
                         seed=seed, generator=generator)
        self.noise_t, self.first_t, self.last_t = int(ts[t_enc]), run[0], run[-1]

    def _alpha(self, t: int) -> np.float32:
        return np.float32(self.ms.alphas_cumprod_f32[t])

    def add_noise(self, image: np.ndarray | None, noise: np.ndarray, index: int) -> np.ndarray:
        if index or image is None:
            return super().add_noise(image, noise, index)
        a = self._alpha(self.noise_t)
        xi = a ** F32(0.5) * image + (F32(1) - a) ** F32(0.5) * noise  # A1111's latent, at noise_t
        return (xi / self._alpha(self.first_t) ** F32(0.5)).astype(np.float32)  # read as the first step's

    def run(self, model: Any, x: np.ndarray, **kwargs: Any) -> np.ndarray:
        out = super().run(model, x, **kwargs)
        return (out * self._alpha(self.last_t) ** F32(0.5)).astype(np.float32)


def loop(ms: Any, choice: Any, length: int, start: int, *, seed: int, generator: Any,
         where: str = "strength") -> Any:
    """A1111's loop for ``choice`` (a SamplerChoice) over a schedule of ``length`` run from ``start`` under an A1111
    rule, or None when the sampler is not one of A1111's DDIM / PLMS or the schedule is no DDPM folder's."""
    if (choice.sampler, choice.schedule) not in SAMPLERS or not hasattr(ms, "ddim_alpha"):
        return None
    ts, t_enc = cut(length, start, where)
    if choice.sampler == "ddim":
        return DDIMCut(ms, ts, t_enc)
    from ..samplers import get_sampler

    return PLMSCut(ms, ts, t_enc, get_sampler("plms"), dict(choice.options), seed=seed, generator=generator)
