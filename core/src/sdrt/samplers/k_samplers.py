"""The k-diffusion family of samplers, in numpy.

Every sampler has k-diffusion's signature
``(model, x, sigmas, *, extra_args=None, callback=None, ...)``, where
``model(x, sigma, **extra_args)`` returns the denoised estimate and ``sigma``
is a Python float. ``extra_args["seed"]`` (if present) seeds the default noise
and is not passed to the model. The math follows crowsonkb/k-diffusion
``k_diffusion/sampling.py`` and, for flow models (``model.model_sampling.kind ==
"flow"``), ComfyUI's ``comfy/k_diffusion/sampling.py`` variants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..errors import SamplerError
from ._common import (
    Callback,
    NoiseSampler,
    ancestral_step,
    brownian_noise,
    default_noise,
    emit,
    half_log_snr,
    is_flow,
    offset_first_sigma,
    prepare,
    sigma_from_half_log_snr,
    to_d,
)

__all__ = [
    "dpm_2",
    "dpm_2_ancestral",
    "dpmpp_2m",
    "dpmpp_2m_sde",
    "dpmpp_2s_ancestral",
    "dpmpp_3m_sde",
    "dpmpp_sde",
    "euler",
    "euler_ancestral",
    "heun",
    "lms",
]

Model = Any


def _churn(x: np.ndarray, sigmas: list[float], i: int, s_churn: float, s_tmin: float, s_tmax: float,
           s_noise: float, noise: NoiseSampler | None, seed: int | None) -> tuple[np.ndarray, float, NoiseSampler | None]:
    if s_churn <= 0:
        return x, sigmas[i], noise
    gamma = min(s_churn / (len(sigmas) - 1), 2**0.5 - 1) if s_tmin <= sigmas[i] <= s_tmax else 0.0
    sigma_hat = sigmas[i] * (gamma + 1)
    if gamma > 0:
        noise = default_noise(x, seed, noise)
        x = x + noise(sigmas[i], sigma_hat) * s_noise * (sigma_hat**2 - sigmas[i] ** 2) ** 0.5
    return x, sigma_hat, noise


def euler(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
          callback: Callback | None = None, s_churn: float = 0.0, s_tmin: float = 0.0,
          s_tmax: float = float("inf"), s_noise: float = 1.0, noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """Euler steps, Karras et al. 2022 Algorithm 2 (k-diffusion ``sample_euler``)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler euler")
    for i in range(len(s) - 1):
        x, sigma_hat, noise_sampler = _churn(x, s, i, s_churn, s_tmin, s_tmax, s_noise, noise_sampler, seed)
        denoised = model(x, sigma_hat, **kw)
        d = to_d(x, sigma_hat, denoised)
        emit(callback, x, i, s[i], sigma_hat, denoised)
        x = x + d * (s[i + 1] - sigma_hat)
    return x


def heun(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
         callback: Callback | None = None, s_churn: float = 0.0, s_tmin: float = 0.0,
         s_tmax: float = float("inf"), s_noise: float = 1.0, noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """Heun steps, Karras et al. 2022 Algorithm 2 (k-diffusion ``sample_heun``)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler heun")
    for i in range(len(s) - 1):
        x, sigma_hat, noise_sampler = _churn(x, s, i, s_churn, s_tmin, s_tmax, s_noise, noise_sampler, seed)
        denoised = model(x, sigma_hat, **kw)
        d = to_d(x, sigma_hat, denoised)
        emit(callback, x, i, s[i], sigma_hat, denoised)
        dt = s[i + 1] - sigma_hat
        if s[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            d_2 = to_d(x_2, s[i + 1], model(x_2, s[i + 1], **kw))
            x = x + (d + d_2) / 2 * dt
    return x


def dpm_2(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
          callback: Callback | None = None, s_churn: float = 0.0, s_tmin: float = 0.0,
          s_tmax: float = float("inf"), s_noise: float = 1.0, noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """DPM-Solver-2 style midpoint steps, Karras Algorithm 2 framing (k-diffusion ``sample_dpm_2``)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler dpm_2")
    for i in range(len(s) - 1):
        x, sigma_hat, noise_sampler = _churn(x, s, i, s_churn, s_tmin, s_tmax, s_noise, noise_sampler, seed)
        denoised = model(x, sigma_hat, **kw)
        d = to_d(x, sigma_hat, denoised)
        emit(callback, x, i, s[i], sigma_hat, denoised)
        if s[i + 1] == 0:
            x = x + d * (s[i + 1] - sigma_hat)
        else:
            sigma_mid = math.exp(0.5 * (math.log(sigma_hat) + math.log(s[i + 1])))
            x_2 = x + d * (sigma_mid - sigma_hat)
            d_2 = to_d(x_2, sigma_mid, model(x_2, sigma_mid, **kw))
            x = x + d_2 * (s[i + 1] - sigma_hat)
    return x


def _rf_ancestral(sigma: float, sigma_next: float, eta: float) -> tuple[float, float, float]:
    """(sigma_down, alpha ratio, renoise coefficient) of ComfyUI's rectified-flow ancestral step."""
    sigma_down = sigma_next * (1 + (sigma_next / sigma - 1) * eta)
    alpha_next, alpha_down = 1 - sigma_next, 1 - sigma_down
    renoise = math.sqrt(max(sigma_next**2 - sigma_down**2 * alpha_next**2 / alpha_down**2, 0.0))
    return sigma_down, alpha_next / alpha_down, renoise


class _Ancestral(NamedTuple):
    """One ancestral split: a deterministic step down to ``down``, then noise added back."""

    down: float
    ratio: float  # 1 for k-diffusion's form; alpha_next / alpha_down for rectified flow
    up: float

    def renoise(self, x: np.ndarray, noise: np.ndarray, s_noise: float) -> np.ndarray:
        if self.ratio == 1.0:
            return x + noise * s_noise * self.up
        return self.ratio * x + noise * s_noise * self.up


def _ancestral(flow: bool, sigma: float, sigma_next: float, eta: float) -> _Ancestral:
    if flow:
        return _Ancestral(*_rf_ancestral(sigma, sigma_next, eta))
    down, up = ancestral_step(sigma, sigma_next, eta)
    return _Ancestral(down, 1.0, up)


def euler_ancestral(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
                    callback: Callback | None = None, eta: float = 1.0, s_noise: float = 1.0,
                    noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """Ancestral Euler steps (k-diffusion ``sample_euler_ancestral``; ComfyUI's RF variant for flow)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler euler_ancestral")
    noise = default_noise(x, seed, noise_sampler)
    flow = is_flow(model)
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        step = _ancestral(flow, s[i], s[i + 1], eta)
        if (s[i + 1] == 0) if flow else (step.down == 0):
            x = denoised
            continue
        if flow:
            x = (step.down / s[i]) * x + (1 - step.down / s[i]) * denoised
        else:
            x = x + to_d(x, s[i], denoised) * (step.down - s[i])
        if eta > 0 or not flow:  # ComfyUI's flow variant draws no noise at eta 0
            x = step.renoise(x, noise(s[i], s[i + 1]), s_noise)
    return x


def dpm_2_ancestral(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
                    callback: Callback | None = None, eta: float = 1.0, s_noise: float = 1.0,
                    noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """Ancestral DPM-Solver-2 steps (k-diffusion ``sample_dpm_2_ancestral``; ComfyUI's RF variant)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler dpm_2_ancestral")
    noise = default_noise(x, seed, noise_sampler)
    flow = is_flow(model)
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        step = _ancestral(flow, s[i], s[i + 1], eta)
        emit(callback, x, i, s[i], s[i], denoised)
        d = to_d(x, s[i], denoised)
        if step.down == 0:
            x = x + d * (step.down - s[i])
        else:
            sigma_mid = math.exp(0.5 * (math.log(s[i]) + math.log(step.down)))
            x_2 = x + d * (sigma_mid - s[i])
            d_2 = to_d(x_2, sigma_mid, model(x_2, sigma_mid, **kw))
            x = step.renoise(x + d_2 * (step.down - s[i]), noise(s[i], s[i + 1]), s_noise)
    return x


def _lms_coeff(order: int, t: list[float], i: int, j: int) -> float:
    """Integral over [t_i, t_i+1] of the j-th Lagrange basis polynomial on t_i, t_i-1, ..."""
    poly = np.poly1d([1.0])
    for k in range(order):
        if k != j:
            poly *= np.poly1d([1.0, -t[i - k]]) / (t[i - j] - t[i - k])
    integral = poly.integ()
    return float(integral(t[i + 1]) - integral(t[i]))


def lms(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
        callback: Callback | None = None, order: int = 4, denoise_last: bool = True) -> np.ndarray:
    """Linear multistep in sigma (k-diffusion ``sample_lms``; coefficients integrated exactly).

    ``denoise_last=True`` (ComfyUI) lands the step to sigma 0 on the denoised
    estimate; ``False`` (crowsonkb/k-diffusion, A1111) takes a multistep step there too.
    """
    x, s, kw, _ = prepare(x, sigmas, extra_args, "sampler lms")
    ds: list[np.ndarray] = []
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        ds.append(to_d(x, s[i], denoised))
        if len(ds) > order:
            ds.pop(0)
        emit(callback, x, i, s[i], s[i], denoised)
        if s[i + 1] == 0 and denoise_last:
            x = denoised
        else:
            cur = min(i + 1, order)
            coeffs = [_lms_coeff(cur, s, i, j) for j in range(cur)]
            x = x + sum(c * d for c, d in zip(coeffs, reversed(ds)))
    return x


def dpmpp_2s_ancestral(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
                       callback: Callback | None = None, eta: float = 1.0, s_noise: float = 1.0,
                       noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """Ancestral DPM-Solver++(2S), Lu et al. 2022 (k-diffusion ``sample_dpmpp_2s_ancestral``; ComfyUI RF)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler dpmpp_2s_ancestral")
    noise = default_noise(x, seed, noise_sampler)
    flow = is_flow(model)
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        step = _ancestral(flow, s[i], s[i + 1], eta)
        sigma_down = step.down
        emit(callback, x, i, s[i], s[i], denoised)
        if (s[i + 1] == 0) if flow else (sigma_down == 0):
            x = x + to_d(x, s[i], denoised) * (sigma_down - s[i])
        elif flow:
            if s[i] == 1.0:
                sigma_s = 0.9999
            else:
                lam_i, lam_down = half_log_snr(s[i], True), half_log_snr(sigma_down, True)
                sigma_s = sigma_from_half_log_snr(lam_i + 0.5 * (lam_down - lam_i), True)
            u = (sigma_s / s[i]) * x + (1 - sigma_s / s[i]) * denoised
            d_i = model(u, sigma_s, **kw)
            x = (sigma_down / s[i]) * x + (1 - sigma_down / s[i]) * d_i
        else:
            t, t_next = -math.log(s[i]), -math.log(sigma_down)
            h = t_next - t
            sig_s = math.exp(-(t + 0.5 * h))
            x_2 = (sig_s / s[i]) * x - math.expm1(-h * 0.5) * denoised
            denoised_2 = model(x_2, sig_s, **kw)
            x = (sigma_down / s[i]) * x - math.expm1(-h) * denoised_2
        if s[i + 1] > 0 and (eta > 0 or not flow):  # ComfyUI's flow variant draws no noise at eta 0
            x = step.renoise(x, noise(s[i], s[i + 1]), s_noise)
    return x


def dpmpp_sde(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
              callback: Callback | None = None, eta: float = 1.0, s_noise: float = 1.0,
              noise_sampler: NoiseSampler | None = None, r: float = 0.5) -> np.ndarray:
    """DPM-Solver++ (stochastic, 2 evaluations per step) (k-diffusion/ComfyUI ``sample_dpmpp_sde``)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler dpmpp_sde")
    if len(s) <= 1:
        return x
    noise = brownian_noise(x, s, seed, noise_sampler)
    flow = is_flow(model)
    s = offset_first_sigma(s, model, flow)
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        if s[i + 1] == 0:
            x = denoised
            continue
        lam_s, lam_t = half_log_snr(s[i], flow), half_log_snr(s[i + 1], flow)
        h = lam_t - lam_s
        lam_s1 = lam_s + r * h
        fac = 1 / (2 * r)
        sigma_s1 = sigma_from_half_log_snr(lam_s1, flow)
        alpha_s = s[i] * math.exp(lam_s)
        alpha_s1 = sigma_s1 * math.exp(lam_s1)
        alpha_t = s[i + 1] * math.exp(lam_t)
        sd, su = ancestral_step(math.exp(-lam_s), math.exp(-lam_s1), eta)
        h_ = -math.log(sd) - lam_s
        x_2 = (alpha_s1 / alpha_s) * math.exp(-h_) * x - alpha_s1 * math.expm1(-h_) * denoised
        if eta > 0 and s_noise > 0:
            x_2 = x_2 + alpha_s1 * noise(s[i], sigma_s1) * s_noise * su
        denoised_2 = model(x_2, sigma_s1, **kw)
        sd, su = ancestral_step(math.exp(-lam_s), math.exp(-lam_t), eta)
        h_ = -math.log(sd) - lam_s
        denoised_d = (1 - fac) * denoised + fac * denoised_2
        x = (alpha_t / alpha_s) * math.exp(-h_) * x - alpha_t * math.expm1(-h_) * denoised_d
        if eta > 0 and s_noise > 0:
            x = x + alpha_t * noise(s[i], s[i + 1]) * s_noise * su
    return x


def dpmpp_2m(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
             callback: Callback | None = None) -> np.ndarray:
    """DPM-Solver++(2M), Lu et al. 2022 (k-diffusion ``sample_dpmpp_2m``)."""
    x, s, kw, _ = prepare(x, sigmas, extra_args, "sampler dpmpp_2m")
    old_denoised: np.ndarray | None = None
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        if s[i + 1] == 0:
            # sigma_fn(t_next) / sigma_fn(t) = 0 and -(e^-inf - 1) = 1: the step lands on denoised.
            x = denoised
        else:
            t, t_next = -math.log(s[i]), -math.log(s[i + 1])
            h = t_next - t
            if old_denoised is None:
                x = (s[i + 1] / s[i]) * x - math.expm1(-h) * denoised
            else:
                r = (t - (-math.log(s[i - 1]))) / h
                denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised
                x = (s[i + 1] / s[i]) * x - math.expm1(-h) * denoised_d
        old_denoised = denoised
    return x


def dpmpp_2m_sde(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
                 callback: Callback | None = None, eta: float = 1.0, s_noise: float = 1.0,
                 noise_sampler: NoiseSampler | None = None, solver_type: str = "midpoint") -> np.ndarray:
    """DPM-Solver++(2M) SDE (k-diffusion/ComfyUI ``sample_dpmpp_2m_sde``)."""
    if solver_type not in ("heun", "midpoint"):
        raise SamplerError(f"solver_type {solver_type!r} is not known", where="sampler dpmpp_2m_sde",
                           fix="use solver_type='midpoint' or 'heun'")
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler dpmpp_2m_sde")
    if len(s) <= 1:
        return x
    noise = brownian_noise(x, s, seed, noise_sampler)
    flow = is_flow(model)
    s = offset_first_sigma(s, model, flow)
    old_denoised: np.ndarray | None = None
    h_last: float | None = None
    h: float | None = None
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        if s[i + 1] == 0:
            x = denoised
        else:
            lam_s, lam_t = half_log_snr(s[i], flow), half_log_snr(s[i + 1], flow)
            h = lam_t - lam_s
            h_eta = h * (eta + 1)
            alpha_t = s[i + 1] * math.exp(lam_t)
            x = s[i + 1] / s[i] * math.exp(-h * eta) * x + alpha_t * -math.expm1(-h_eta) * denoised
            if old_denoised is not None and h_last is not None:
                r = h_last / h
                if solver_type == "heun":
                    x = x + alpha_t * (-math.expm1(-h_eta) / (-h_eta) + 1) * (1 / r) * (denoised - old_denoised)
                else:
                    x = x + 0.5 * alpha_t * -math.expm1(-h_eta) * (1 / r) * (denoised - old_denoised)
            if eta > 0 and s_noise > 0:
                x = x + noise(s[i], s[i + 1]) * s[i + 1] * math.sqrt(-math.expm1(-2 * h * eta)) * s_noise
        old_denoised = denoised
        h_last = h
    return x


def dpmpp_3m_sde(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
                 callback: Callback | None = None, eta: float = 1.0, s_noise: float = 1.0,
                 noise_sampler: NoiseSampler | None = None) -> np.ndarray:
    """DPM-Solver++(3M) SDE (k-diffusion/ComfyUI ``sample_dpmpp_3m_sde``)."""
    x, s, kw, seed = prepare(x, sigmas, extra_args, "sampler dpmpp_3m_sde")
    if len(s) <= 1:
        return x
    noise = brownian_noise(x, s, seed, noise_sampler)
    flow = is_flow(model)
    s = offset_first_sigma(s, model, flow)
    denoised_1: np.ndarray | None = None
    denoised_2: np.ndarray | None = None
    h: float | None = None
    h_1: float | None = None
    h_2: float | None = None
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        if s[i + 1] == 0:
            x = denoised
        else:
            lam_s, lam_t = half_log_snr(s[i], flow), half_log_snr(s[i + 1], flow)
            h = lam_t - lam_s
            h_eta = h * (eta + 1)
            alpha_t = s[i + 1] * math.exp(lam_t)
            x = s[i + 1] / s[i] * math.exp(-h * eta) * x + alpha_t * -math.expm1(-h_eta) * denoised
            phi_2 = math.expm1(-h_eta) / h_eta + 1
            if h_2 is not None and h_1 is not None and denoised_1 is not None and denoised_2 is not None:
                r0, r1 = h_1 / h, h_2 / h
                d1_0 = (denoised - denoised_1) / r0
                d1_1 = (denoised_1 - denoised_2) / r1
                d1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1)
                d2 = (d1_0 - d1_1) / (r0 + r1)
                phi_3 = phi_2 / h_eta - 0.5
                x = x + (alpha_t * phi_2) * d1 - (alpha_t * phi_3) * d2
            elif h_1 is not None and denoised_1 is not None:
                r = h_1 / h
                x = x + (alpha_t * phi_2) * ((denoised - denoised_1) / r)
            if eta > 0 and s_noise > 0:
                x = x + noise(s[i], s[i + 1]) * s[i + 1] * math.sqrt(-math.expm1(-2 * h * eta)) * s_noise
        denoised_1, denoised_2 = denoised, denoised_1
        h_1, h_2 = h, h_1
    return x
