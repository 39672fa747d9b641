"""How a model maps noise level sigma to its timestep input, for discrete and flow models.

- ``DiscreteSchedule``: SD1.x/SD2.x/SDXL, eps-, v- or x0-prediction, with the
  scaled-linear betas of Stable Diffusion (0.00085 -> 0.012 over 1000 steps).
  sigma <-> t is linear interpolation in log sigma (k-diffusion's
  ``DiscreteSchedule.sigma_to_t``/``t_to_sigma``), or nearest index with
  ``quantize=True`` (ComfyUI's ``ModelSamplingDiscrete.timestep``).
- ``EDMSchedule``: a model trained in Karras et al.'s EDM form (Playground v2.5, CosXL): continuous sigmas
  from ``sigma_min`` to ``sigma_max``, ``c_in = 1 / sqrt(sigma^2 + sigma_data^2)``, the timestep
  ``c_noise = 0.25 ln sigma``, and ``denoised = c_skip x + c_out F`` (diffusers' ``EDMEulerScheduler`` /
  ``EDMDPMSolverMultistepScheduler``, ComfyUI's ``ModelSamplingContinuousEDM``).
- ``FlowSchedule``: rectified flow, ``x_t = (1 - sigma) x0 + sigma noise``.
  SD3 uses a constant shift (3.0) and feeds ``timestep = 1000 sigma``; Flux uses
  a resolution-dependent shift ``mu`` (``flux_mu``) and feeds ``timestep = sigma``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import SamplerError

__all__ = [
    "DiscreteSchedule",
    "EDMSchedule",
    "FlowSchedule",
    "flux_mu",
    "flux_schedule",
    "scaled_linear_betas",
    "sd3_schedule",
]


def scaled_linear_betas(beta_start: float = 0.00085, beta_end: float = 0.012, n: int = 1000) -> np.ndarray:
    """Stable Diffusion's betas: linear in sqrt(beta), squared (float64)."""
    return np.linspace(beta_start**0.5, beta_end**0.5, n, dtype=np.float64) ** 2


@dataclass
class DiscreteSchedule:
    """A DDPM-trained model: 1000 discrete timesteps, each with its sigma.

    ``prediction`` is ``"eps"`` (SD1.x, SDXL), ``"v"`` (SD2.x 768, some SDXL finetunes) or ``"x0"`` (the model
    outputs the denoised sample itself: diffusers' ``prediction_type="sample"``, SDXL-Lightning's 1-step x0 UNet).
    """

    prediction: str = "eps"
    beta_start: float = 0.00085
    beta_end: float = 0.012
    num_timesteps: int = 1000
    sigmas: np.ndarray = field(init=False, repr=False)
    log_sigmas: np.ndarray = field(init=False, repr=False)
    alphas_cumprod: np.ndarray = field(init=False, repr=False)

    kind = "discrete"

    def __post_init__(self) -> None:
        if self.prediction not in ("eps", "v", "x0"):
            raise SamplerError(f"unknown prediction type {self.prediction!r} for a discrete model",
                               where="sdrt.samplers.DiscreteSchedule", fix="use prediction='eps', 'v' or 'x0'")
        betas = scaled_linear_betas(self.beta_start, self.beta_end, self.num_timesteps)
        self.alphas_cumprod = np.cumprod(1.0 - betas)
        self.sigmas = np.sqrt((1.0 - self.alphas_cumprod) / self.alphas_cumprod)
        self.log_sigmas = np.log(self.sigmas)

    @property
    def sigma_min(self) -> float:
        return float(self.sigmas[0])

    @property
    def sigma_max(self) -> float:
        return float(self.sigmas[-1])

    def timestep(self, sigma: float | np.ndarray, *, quantize: bool = False) -> np.ndarray:
        """The model's timestep for ``sigma``: log-sigma interpolation, or nearest index."""
        log_sigma = np.log(np.asarray(sigma, dtype=np.float64))
        if quantize:
            return np.abs(log_sigma[..., None] - self.log_sigmas).argmin(axis=-1).astype(np.float64)
        return np.interp(log_sigma, self.log_sigmas, np.arange(self.num_timesteps, dtype=np.float64))

    def sigma(self, timestep: float | np.ndarray) -> np.ndarray:
        """sigma at a (fractional) timestep: linear interpolation of log sigma."""
        t = np.clip(np.asarray(timestep, dtype=np.float64), 0, self.num_timesteps - 1)
        low = np.floor(t).astype(np.int64)
        high = np.ceil(t).astype(np.int64)
        w = t - low
        return np.exp((1 - w) * self.log_sigmas[low] + w * self.log_sigmas[high])

    # The model's input/output convention (k-diffusion's c_in, c_skip, c_out).
    def scale_input(self, x: np.ndarray, sigma: float) -> np.ndarray:
        return x / math.sqrt(sigma * sigma + 1.0)

    def denoised(self, x: np.ndarray, sigma: float, output: np.ndarray) -> np.ndarray:
        if self.prediction == "eps":
            return x - output * sigma
        if self.prediction == "x0":
            return output
        s2 = sigma * sigma + 1.0
        return x / s2 - output * (sigma / math.sqrt(s2))

    def noise_scaling(self, sigma: float, noise: np.ndarray, latent: np.ndarray | None = None) -> np.ndarray:
        """The starting latent at ``sigma`` from unit noise (plus an image latent for img2img)."""
        out = noise * sigma
        return out if latent is None else out + latent


@dataclass
class EDMSchedule:
    """An EDM-trained model (Karras et al. 2022): the network sees ``x c_in`` at timestep ``0.25 ln sigma``.

    ``prediction`` is diffusers' word for the output: ``"eps"`` (diffusers' ``"epsilon"``, Playground v2.5:
    ``denoised = c_skip x + c_out F``) or ``"v"`` (``"v_prediction"``, CosXL: ``c_out`` negated), with
    ``c_skip = sd^2 / (sigma^2 + sd^2)`` and ``c_out = sigma sd / sqrt(sigma^2 + sd^2)`` for ``sd = sigma_data``,
    as diffusers' EDM schedulers and ComfyUI's ``EDM`` / ``V_PREDICTION_EDM`` compute it. The table of
    ``num_timesteps`` sigmas, log-spaced from ``sigma_min`` to ``sigma_max``, is ComfyUI's
    ``ModelSamplingContinuousEDM`` table (what the ``simple``, ``beta`` and ``ddim_uniform`` schedules walk).
    """

    prediction: str = "eps"
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    sigma_data: float = 0.5
    num_timesteps: int = 1000
    sigmas: np.ndarray = field(init=False, repr=False)

    kind = "edm"

    def __post_init__(self) -> None:
        if self.prediction not in ("eps", "v"):
            raise SamplerError(f"unknown prediction type {self.prediction!r} for an EDM model",
                               where="sdrt.samplers.EDMSchedule", fix="use prediction='eps' or 'v'")
        for name in ("sigma_min", "sigma_max", "sigma_data"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise SamplerError(f"{name} must be a positive number, got {value!r}",
                                   where="sdrt.samplers.EDMSchedule", fix=f"pass a positive {name}")
        if self.sigma_min >= self.sigma_max:
            raise SamplerError(f"sigma_min {self.sigma_min:g} is not below sigma_max {self.sigma_max:g}",
                               where="sdrt.samplers.EDMSchedule", fix="pass sigma_min < sigma_max")
        self.sigma_min, self.sigma_max, self.sigma_data = (float(self.sigma_min), float(self.sigma_max),
                                                           float(self.sigma_data))
        self.sigmas = np.exp(np.linspace(math.log(self.sigma_min), math.log(self.sigma_max), self.num_timesteps))

    def timestep(self, sigma: float | np.ndarray, *, quantize: bool = False) -> np.ndarray:
        """``c_noise = 0.25 ln sigma``: continuous, so ``quantize`` changes nothing."""
        return 0.25 * np.log(np.asarray(sigma, dtype=np.float64))

    def sigma(self, timestep: float | np.ndarray) -> np.ndarray:
        return np.exp(np.asarray(timestep, dtype=np.float64) / 0.25)

    def scale_input(self, x: np.ndarray, sigma: float) -> np.ndarray:
        return x / math.sqrt(sigma * sigma + self.sigma_data * self.sigma_data)

    def denoised(self, x: np.ndarray, sigma: float, output: np.ndarray) -> np.ndarray:
        sd2 = self.sigma_data * self.sigma_data
        s2 = sigma * sigma + sd2
        c_out = sigma * self.sigma_data / math.sqrt(s2)
        return x * (sd2 / s2) + output * (c_out if self.prediction == "eps" else -c_out)

    def noise_scaling(self, sigma: float, noise: np.ndarray, latent: np.ndarray | None = None) -> np.ndarray:
        """The starting latent at ``sigma``: ``latent + sigma noise``, as for the other VE (eps / v) models."""
        out = noise * sigma
        return out if latent is None else out + latent


def _time_snr_shift(shift: float, t: np.ndarray) -> np.ndarray:
    if shift == 1.0:
        return t
    return shift * t / (1 + (shift - 1) * t)


def _flux_time_shift(mu: float, t: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return math.exp(mu) / (math.exp(mu) + (1 / t - 1))


@dataclass
class FlowSchedule:
    """A rectified-flow model (SD3, Flux): the network predicts velocity ``noise - x0``.

    ``shift`` is SD3's constant shift (``sigma = s t / (1 + (s - 1) t)``);
    ``mu`` (when set) is Flux's exponential shift
    (``sigma = e^mu / (e^mu + 1/t - 1)``). ``multiplier`` scales sigma to the
    timestep the network takes (1000 for SD3, 1 for Flux).
    """

    shift: float = 1.0
    mu: float | None = None
    multiplier: float = 1000.0
    num_timesteps: int = 1000
    sigmas: np.ndarray = field(init=False, repr=False)

    kind = "flow"
    prediction = "flow"

    def __post_init__(self) -> None:
        t = np.arange(1, self.num_timesteps + 1, dtype=np.float64) / self.num_timesteps
        self.sigmas = self.shifted(t)

    def shifted(self, t: np.ndarray | float) -> np.ndarray:
        """sigma for flow time ``t`` in [0, 1] after the model's shift."""
        t = np.asarray(t, dtype=np.float64)
        return _flux_time_shift(self.mu, t) if self.mu is not None else _time_snr_shift(self.shift, t)

    @property
    def sigma_min(self) -> float:
        return float(self.sigmas[0])

    @property
    def sigma_max(self) -> float:
        return float(self.sigmas[-1])

    def timestep(self, sigma: float | np.ndarray, *, quantize: bool = False) -> np.ndarray:
        return np.asarray(sigma, dtype=np.float64) * self.multiplier

    def sigma(self, timestep: float | np.ndarray) -> np.ndarray:
        return self.shifted(np.asarray(timestep, dtype=np.float64) / self.multiplier)

    def scale_input(self, x: np.ndarray, sigma: float) -> np.ndarray:
        return x

    def denoised(self, x: np.ndarray, sigma: float, output: np.ndarray) -> np.ndarray:
        return x - output * sigma

    def noise_scaling(self, sigma: float, noise: np.ndarray, latent: np.ndarray | None = None) -> np.ndarray:
        return noise * sigma if latent is None else noise * sigma + latent * (1.0 - sigma)


def sd3_schedule(shift: float = 3.0) -> FlowSchedule:
    """SD3/SD3.5: flow matching with a constant shift of 3 and ``timestep = 1000 sigma``."""
    return FlowSchedule(shift=shift, multiplier=1000.0)


def flux_mu(width: int, height: int, *, base_shift: float = 0.5, max_shift: float = 1.15,
            base_seq_len: int = 256, max_seq_len: int = 4096) -> float:
    """Flux's shift for an image of ``width x height`` pixels.

    The number of image tokens (``width * height / 256``: VAE factor 8, 2x2
    patches) is mapped linearly from (256 -> 0.5) to (4096 -> 1.15), as in
    diffusers' ``calculate_shift`` and ComfyUI's ``ModelSamplingFlux``.
    """
    if width <= 0 or height <= 0:
        raise SamplerError(f"image size {width}x{height} is not positive", where="sdrt.samplers.flux_mu",
                           fix="pass the output image size in pixels")
    tokens = width * height / (8 * 8 * 2 * 2)
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return tokens * slope + (base_shift - slope * base_seq_len)


def flux_schedule(width: int = 1024, height: int = 1024, *, mu: float | None = None) -> FlowSchedule:
    """Flux.1 dev/schnell: flow matching, shift from the image size, ``timestep = sigma``."""
    return FlowSchedule(mu=flux_mu(width, height) if mu is None else mu, multiplier=1.0, num_timesteps=10000)
