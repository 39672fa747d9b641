"""DDIM, DDPM and LCM samplers written in sigma space (k-diffusion signature, numpy)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._common import Callback, NoiseSampler, default_noise, emit, is_flow, prepare

__all__ = ["ddim", "ddpm", "lcm"]


def ddim(model: Any, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
         callback: Callback | None = None, eta: float = 0.0,
         noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """DDIM, Song et al. 2020 eq. 12; with eta=0 it is Euler in sigma space (ComfyUI ``ddim``, diffusers DDIMScheduler)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler ddim")
    noise = default_noise(x, seed, noise_sampler) if eta > 0 else None
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        eps = (x - denoised) / s[i]
        if noise is None or s[i + 1] == 0:
            x = denoised + eps * s[i + 1]
            continue
        # alphas_cumprod in VP terms, a = 1 / (1 + sigma^2); DDIM's sigma_t with eta, in x / sqrt(a) units.
        a_t, a_prev = 1 / (1 + s[i] ** 2), 1 / (1 + s[i + 1] ** 2)
        std = eta * math.sqrt((1 - a_prev) / (1 - a_t)) * math.sqrt(1 - a_t / a_prev)
        direction = math.sqrt(max(1 - a_prev - std**2, 0.0) / a_prev)
        x = denoised + eps * direction + noise(s[i], s[i + 1]) * (std / math.sqrt(a_prev))
    return x


def ddpm(model: Any, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
         callback: Callback | None = None, noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """DDPM ancestral steps, Ho et al. 2020 posterior (ComfyUI ``sample_ddpm``)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler ddpm")
    noise = default_noise(x, seed, noise_sampler)
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        sigma, sigma_prev = s[i], s[i + 1]
        eps = (x - denoised) / sigma
        xv = x / math.sqrt(1.0 + sigma**2)
        ac = 1 / (sigma * sigma + 1)
        ac_prev = 1 / (sigma_prev * sigma_prev + 1)
        alpha = ac / ac_prev
        mu = math.sqrt(1.0 / alpha) * (xv - (1 - alpha) * eps / math.sqrt(1 - ac))
        if sigma_prev > 0:
            mu = mu + math.sqrt((1 - alpha) * (1.0 - ac_prev) / (1.0 - ac)) * noise(sigma, sigma_prev)
            mu = mu * math.sqrt(1.0 + sigma_prev**2)
        x = mu
    return x


def lcm(model: Any, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
        callback: Callback | None = None, noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """Latent Consistency Model sampling, Luo et al. 2023 (ComfyUI ``sample_lcm``)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler lcm")
    noise = default_noise(x, seed, noise_sampler)
    flow = is_flow(model)
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        x = denoised
        if s[i + 1] > 0:
            n = noise(s[i], s[i + 1])
            x = n * s[i + 1] + x * (1.0 - s[i + 1]) if flow else x + n * s[i + 1]
    return x
