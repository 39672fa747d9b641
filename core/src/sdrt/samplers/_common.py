"""Small pieces the samplers share: argument handling, noise defaults, sigma algebra."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import SamplerError
from .noise import BrownianTreeNoiseSampler, TorchNoiseSampler

NoiseSampler = Callable[[float, float], np.ndarray]
Callback = Callable[[dict[str, Any]], None]


def prepare(x: np.ndarray, sigmas: Any, extra_args: Mapping[str, Any] | None,
            where: str) -> tuple[np.ndarray, list[float], dict[str, Any], int | None]:
    """Check inputs; return x, sigmas as floats, model kwargs (without ``seed``) and the seed."""
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        raise SamplerError(f"x must be a floating-point numpy array, got {type(x).__name__}"
                           f"{'' if not isinstance(x, np.ndarray) else ' of ' + str(x.dtype)}",
                           where=where, fix="pass the latent as np.float32 or np.float64")
    s = np.asarray(sigmas, dtype=np.float64)
    if s.ndim != 1 or s.size < 1 or not np.all(np.isfinite(s)) or np.any(s < 0):
        raise SamplerError("sigmas must be a 1-D array of finite, non-negative noise levels",
                           where=where, fix="build sigmas with a schedule from sdrt.samplers.schedules")
    if np.any(np.diff(s) > 0):
        raise SamplerError("sigmas must not increase", where=where,
                           fix="pass sigmas from high noise to low, ending in 0")
    kwargs = dict(extra_args or {})
    seed = kwargs.pop("seed", None)
    return x, [float(v) for v in s], kwargs, seed


def default_noise(x: np.ndarray, seed: int | None, noise_sampler: NoiseSampler | None) -> NoiseSampler:
    """ComfyUI's default per-step noise: a CPU generator seeded with ``seed + 1``."""
    if noise_sampler is not None:
        return noise_sampler
    return TorchNoiseSampler(x, secrets.randbits(63) if seed is None else seed, offset=1)


def brownian_noise(x: np.ndarray, sigmas: list[float], seed: int | None,
                   noise_sampler: NoiseSampler | None) -> NoiseSampler:
    """A Brownian-tree noise sampler over the positive sigma range (k-diffusion's SDE default)."""
    if noise_sampler is not None:
        return noise_sampler
    positive = [s for s in sigmas if s > 0]
    return BrownianTreeNoiseSampler(x, min(positive), max(sigmas), secrets.randbits(63) if seed is None else seed)


def to_d(x: np.ndarray, sigma: float, denoised: np.ndarray) -> np.ndarray:
    """Karras ODE derivative dx/dsigma."""
    return (x - denoised) / sigma


def ancestral_step(sigma_from: float, sigma_to: float, eta: float = 1.0) -> tuple[float, float]:
    """(sigma_down, sigma_up) for an ancestral step (k-diffusion ``get_ancestral_step``)."""
    if not eta:
        return sigma_to, 0.0
    sigma_up = min(sigma_to, eta * math.sqrt(sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2))
    sigma_down = math.sqrt(max(sigma_to**2 - sigma_up**2, 0.0))
    return sigma_down, sigma_up


def is_flow(model: Any) -> bool:
    """True when the model is a rectified-flow denoiser (``model.model_sampling.kind == "flow"``)."""
    return getattr(getattr(model, "model_sampling", None), "kind", None) == "flow"


def half_log_snr(sigma: float, flow: bool) -> float:
    """lambda = log(alpha / sigma): ``-log sigma`` for VE sigmas, ``log((1 - s) / s)`` for flow."""
    return math.log((1 - sigma) / sigma) if flow else -math.log(sigma)


def sigma_from_half_log_snr(lam: float, flow: bool) -> float:
    return 1.0 / (1.0 + math.exp(lam)) if flow else math.exp(-lam)


def offset_first_sigma(sigmas: list[float], model: Any, flow: bool) -> list[float]:
    """For flow models, move a first sigma of 1 just below it so that lambda stays finite."""
    if flow and len(sigmas) > 1 and sigmas[0] >= 1:
        ms = model.model_sampling
        return [float(ms.shifted(1.0 - 1e-4))] + sigmas[1:]
    return sigmas


def emit(callback: Callback | None, x: np.ndarray, i: int, sigma: float, sigma_hat: float,
         denoised: np.ndarray) -> None:
    if callback is not None:
        callback({"x": x, "i": i, "sigma": sigma, "sigma_hat": sigma_hat, "denoised": denoised})
