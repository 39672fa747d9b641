"""Flow-matching schedules as diffusers' ``FlowMatchEulerDiscreteScheduler`` computes them (SD3/3.5, Flux.1, Chroma).

The k-diffusion view of these models is in ``model_sampling.FlowSchedule`` (ComfyUI's ``ModelSamplingSD3`` and
``ModelSamplingFlux``). This module is the diffusers view, value for value, so that a pipeline can give
diffusers' image for the same seed and steps:

- ``FlowMatchSchedule.from_config(scheduler_config)`` reads a folder's ``scheduler/scheduler_config.json``
  (``shift``, ``use_dynamic_shifting``, ``base_shift``, ``max_shift``, ``base_image_seq_len``,
  ``max_image_seq_len``, ``time_shift_type``, ``shift_terminal``, ``invert_sigmas``, ``num_train_timesteps``).
- ``.timesteps(steps, sigmas=None, mu=None)`` returns ``(timesteps, sigmas)`` as ``set_timesteps`` leaves them:
  float32, ``sigmas`` one longer with the final 0. SD3's pipeline passes no sigmas (the scheduler spaces its
  timesteps between its own shifted ``sigma_max`` and ``sigma_min``, then shifts again); Flux's and Chroma's pass
  ``flux_sigmas(steps)`` and ``mu = calculate_shift(image tokens)``.
- ``img2img_timesteps`` cuts a schedule at ``strength`` as the SD3 and Flux img2img pipelines do, and
  ``scale_noise`` mixes an image latent with noise at a sigma (``sigma * noise + (1 - sigma) * latent``).
- ``euler_step``: ``x + (sigma_next - sigma) * velocity``, in float32 as the scheduler's ``step``.

What the transformer takes as its ``timestep`` differs by family: SD3's takes ``timesteps`` (0..1000) as they
are; Flux's and Chroma's take ``timesteps / 1000`` (their graphs multiply by 1000 inside), and Flux dev's
``guidance`` input is the guidance scale itself (also multiplied by 1000 inside the graph). See
``sdrt.pipelines.flowparts.transformer_timestep``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SamplerError

__all__ = [
    "FlowMatchSchedule",
    "calculate_shift",
    "euler_step",
    "flux_sigmas",
    "img2img_timesteps",
    "scale_noise",
]

_WHERE = "sdrt.samplers.flowmatch"


def calculate_shift(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
                    base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """Flux's ``mu`` for ``image_seq_len`` image tokens: linear from (base_seq_len, base_shift) to
    (max_seq_len, max_shift), extrapolated outside (diffusers' ``calculate_shift``)."""
    if image_seq_len <= 0:
        raise SamplerError(f"image_seq_len {image_seq_len} is not positive", where=f"{_WHERE}.calculate_shift",
                           fix="pass the number of image tokens, (height / 16) * (width / 16) for Flux")
    if max_seq_len == base_seq_len:
        raise SamplerError("base_image_seq_len equals max_image_seq_len", where=f"{_WHERE}.calculate_shift",
                           fix="fix the scheduler config: the two must differ")
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def flux_sigmas(steps: int) -> np.ndarray:
    """The sigmas Flux's and Chroma's pipelines hand the scheduler: ``linspace(1, 1 / steps, steps)``."""
    _check_steps(steps)
    return np.linspace(1.0, 1.0 / steps, steps)


def _check_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise SamplerError(f"steps must be a whole number of at least 1, got {steps!r}", where=_WHERE,
                           fix="pass steps=1 or more")
    return int(steps)


@dataclass(frozen=True)
class FlowMatchSchedule:
    """diffusers' ``FlowMatchEulerDiscreteScheduler`` configuration and its ``set_timesteps``."""

    num_train_timesteps: int = 1000
    shift: float = 1.0
    use_dynamic_shifting: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    time_shift_type: str = "exponential"
    shift_terminal: float | None = None
    invert_sigmas: bool = False

    def __post_init__(self) -> None:
        if self.time_shift_type not in ("exponential", "linear"):
            raise SamplerError(f"time_shift_type {self.time_shift_type!r} is not 'exponential' or 'linear'",
                               where=f"{_WHERE}.FlowMatchSchedule", fix="fix the scheduler config")
        if self.num_train_timesteps < 1 or self.shift <= 0:
            raise SamplerError(f"num_train_timesteps {self.num_train_timesteps} and shift {self.shift} must be "
                               "positive", where=f"{_WHERE}.FlowMatchSchedule", fix="fix the scheduler config")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, where: str = "scheduler_config.json") -> FlowMatchSchedule:
        """From a ``scheduler_config.json`` dict. Karras/exponential/beta sigmas and stochastic sampling, which no
        released flow model's config sets, are refused rather than ignored."""
        for key in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"):
            if config.get(key):
                raise SamplerError(f"{key} is set in the flow-matching scheduler config", where=where,
                                   fix=f"remove {key} (sdrt follows FlowMatchEulerDiscreteScheduler without it)")
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in config.items() if k in names and v is not None}
        try:
            return cls(**kw)
        except TypeError as e:
            raise SamplerError(f"bad flow-matching scheduler config: {e}", where=where,
                               fix="fix the values in the config") from None

    # -- the constructor's table --------------------------------------------------------------------------
    def _train_sigmas(self) -> np.ndarray:
        n = self.num_train_timesteps
        t = np.linspace(1, n, n, dtype=np.float32)[::-1].copy()
        sigmas = t / np.float32(n)
        if not self.use_dynamic_shifting:
            s = np.float32(self.shift)
            sigmas = (s * sigmas / (np.float32(1) + (s - np.float32(1)) * sigmas)).astype(np.float32)
        return sigmas

    @property
    def sigma_max(self) -> float:
        return float(self._train_sigmas()[0])

    @property
    def sigma_min(self) -> float:
        return float(self._train_sigmas()[-1])

    def time_shift(self, mu: float, t: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            if self.time_shift_type == "exponential":
                return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** 1.0)
            return mu / (mu + (1 / t - 1) ** 1.0)

    def timesteps(self, steps: int | None = None, *, sigmas: Sequence[float] | np.ndarray | None = None,
                  mu: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(timesteps [n], sigmas [n + 1])`` in float32, as ``set_timesteps(steps, sigmas=, mu=)`` leaves them."""
        if self.use_dynamic_shifting and mu is None:
            raise SamplerError("this schedule shifts by image size (use_dynamic_shifting) but no mu was given",
                               where=f"{_WHERE}.FlowMatchSchedule.timesteps",
                               fix="pass mu=calculate_shift(image tokens, ...) from the scheduler config")
        if sigmas is None:
            n = _check_steps(steps if steps is not None else 0)
            n_train = self.num_train_timesteps
            ts = np.linspace(self.sigma_max * n_train, self.sigma_min * n_train, n)
            sig = ts / n_train
        else:
            sig = np.asarray(sigmas, dtype=np.float64).astype(np.float32)
            if sig.ndim != 1 or sig.size == 0 or (steps is not None and sig.size != steps):
                raise SamplerError(f"sigmas must be a 1-d list of {steps or 'some'} values, got shape {sig.shape}",
                                   where=f"{_WHERE}.FlowMatchSchedule.timesteps",
                                   fix="pass one sigma per step")
        if self.use_dynamic_shifting:
            sig = self.time_shift(float(mu), sig)  # type: ignore[arg-type]
        else:
            sig = self.shift * sig / (1 + (self.shift - 1) * sig)
        if self.shift_terminal:
            one_minus = 1 - sig
            sig = 1 - one_minus / (one_minus[-1] / (1 - self.shift_terminal))
        sig32 = np.asarray(sig).astype(np.float32)
        n_train32 = np.float32(self.num_train_timesteps)
        if self.invert_sigmas:
            sig32 = (np.float32(1) - sig32).astype(np.float32)
            return (sig32 * n_train32).astype(np.float32), np.append(sig32, np.float32(1)).astype(np.float32)
        return (sig32 * n_train32).astype(np.float32), np.append(sig32, np.float32(0)).astype(np.float32)

    def mu_for(self, image_seq_len: int) -> float:
        """``calculate_shift`` with this config's base/max values (what Flux's and Chroma's pipelines pass)."""
        return calculate_shift(image_seq_len, self.base_image_seq_len, self.max_image_seq_len, self.base_shift,
                               self.max_shift)


def img2img_timesteps(timesteps: np.ndarray, sigmas: np.ndarray, steps: int,
                      strength: float) -> tuple[np.ndarray, np.ndarray, int]:
    """The part of a schedule an img2img run walks, as SD3's and Flux's img2img pipelines cut it.

    Returns ``(timesteps, sigmas, t_start)``: ``t_start = int(steps - min(steps * strength, steps))`` steps are
    skipped; the image latent is noised to ``sigmas[0]`` of the result (``scale_noise``)."""
    if not 0.0 <= float(strength) <= 1.0:
        raise SamplerError(f"strength must be between 0 and 1, got {strength}", where=f"{_WHERE}.img2img_timesteps",
                           fix="pass a strength in [0, 1]")
    init = min(steps * strength, steps)
    t_start = int(max(steps - init, 0))
    return timesteps[t_start:], sigmas[t_start:], t_start


def scale_noise(latent: np.ndarray, noise: np.ndarray, sigma: float) -> np.ndarray:
    """``sigma * noise + (1 - sigma) * latent`` in float32 (``FlowMatchEulerDiscreteScheduler.scale_noise``)."""
    s = np.float32(sigma)
    return (s * noise.astype(np.float32) + (np.float32(1) - s) * latent.astype(np.float32)).astype(np.float32)


def euler_step(sample: np.ndarray, velocity: np.ndarray, sigma: float, sigma_next: float) -> np.ndarray:
    """One ``FlowMatchEulerDiscreteScheduler.step``: ``sample + (sigma_next - sigma) * velocity`` in float32."""
    dt = np.float32(sigma_next) - np.float32(sigma)
    return (sample.astype(np.float32) + dt * velocity.astype(np.float32)).astype(np.float32)
