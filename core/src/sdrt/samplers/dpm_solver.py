"""DPM-Solver with a fixed budget of model calls (``dpm_fast``) and with adaptive steps (``dpm_adaptive``).

Lu et al. 2022, "DPM-Solver: A Fast ODE Solver for Diffusion Probabilistic Model Sampling in Around 10
Steps" (arXiv:2206.00927): single-step solvers of order 1, 2 and 3 in ``t = -log(sigma)`` on the noise
prediction ``eps = (x - denoised) / sigma``, the paper's fixed-budget split ("DPM-Solver-fast") and its
adaptive order-2/3 pair, as crowsonkb/k-diffusion's ``sample_dpm_fast`` and ``sample_dpm_adaptive``
run them (their step-size controller, tolerances and optional ancestral noise ``eta``). A1111's
"DPM fast" and "DPM adaptive" call those two.

Both take sdrt's sampler signature ``(model, x, sigmas, ...)``, but integrate from ``sigma_max`` to
``sigma_min`` rather than visit every sigma: by default the first sigma and the smallest positive one
(ComfyUI's rule); A1111's txt2img passes the model's own range instead (the pipeline does so), and neither
ends at sigma 0. ``dpm_fast`` spends exactly ``len(sigmas) - 1`` model calls. ``dpm_adaptive`` ignores the
number of sigmas: it takes as many steps as its error control needs (25 model calls at the defaults on the
tests' Gaussian model; a real model's count depends on it and on the tolerances).

Progress: ``callback`` gets ``i`` on the scale of ``len(sigmas) - 1`` steps, as the pipeline counts them:
for ``dpm_fast`` the number of model calls the step brings the run to, minus one (it moves by up to 3);
for ``dpm_adaptive`` the share of the log-sigma range covered so far, after each attempted step (repeated
when a step is rejected).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SamplerError
from ._common import Callback, NoiseSampler, ancestral_step, default_noise, prepare

__all__ = ["dpm_adaptive", "dpm_fast"]

Model = Any


def _sigma(t: float) -> float:
    return math.exp(-t)


class _Eps:
    """The noise prediction at (x, t), counting model calls."""

    def __init__(self, model: Model, kw: dict[str, Any], where: str) -> None:
        self.model, self.kw, self.where = model, kw, where
        self.calls = 0

    def __call__(self, x: np.ndarray, t: float) -> np.ndarray:
        sigma = _sigma(t)
        self.calls += 1
        return (x - self.model(x, sigma, **self.kw)) / sigma


def _first_order(x: np.ndarray, t: float, t_next: float, eps: np.ndarray) -> np.ndarray:
    """DPM-Solver-1 (DDIM): exact for a constant eps over [t, t_next]."""
    return x - (_sigma(t_next) * math.expm1(t_next - t)) * eps


def _midpoint(x: np.ndarray, t: float, h: float, r: float, eps: np.ndarray) -> np.ndarray:
    """The intermediate point at ``t + r h``: a first-order step there."""
    return x - (_sigma(t + r * h) * math.expm1(r * h)) * eps


def _second_order(f: _Eps, x: np.ndarray, t: float, t_next: float, eps: np.ndarray, r1: float = 0.5,
                  eps_1: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """DPM-Solver-2 with its intermediate point at ``r1`` of the step; returns (x_next, eps there)."""
    h = t_next - t
    if eps_1 is None:
        eps_1 = f(_midpoint(x, t, h, r1, eps), t + r1 * h)
    a = _sigma(t_next) * math.expm1(h)
    return x - a * eps - (a / (2 * r1)) * (eps_1 - eps), eps_1


def _third_order(f: _Eps, x: np.ndarray, t: float, t_next: float, eps: np.ndarray,
                 eps_1: np.ndarray | None = None) -> np.ndarray:
    """DPM-Solver-3 with intermediate points at 1/3 and 2/3 of the step (``eps_1``: the one at 1/3, if known)."""
    r1, r2 = 1 / 3, 2 / 3
    h = t_next - t
    if eps_1 is None:
        eps_1 = f(_midpoint(x, t, h, r1, eps), t + r1 * h)
    s2 = t + r2 * h
    phi = math.expm1(r2 * h) / (r2 * h) - 1
    u2 = _midpoint(x, t, h, r2, eps) - (_sigma(s2) * (r2 / r1) * phi) * (eps_1 - eps)
    eps_2 = f(u2, s2)
    a = _sigma(t_next) * math.expm1(h)
    return x - a * eps - (_sigma(t_next) / r2 * (math.expm1(h) / h - 1)) * (eps_2 - eps)


def _range(sigmas: list[float], sigma_min: float | None, sigma_max: float | None, where: str) -> tuple[float, float]:
    positive = [s for s in sigmas if s > 0]
    lo = float(sigma_min) if sigma_min is not None else (min(positive) if positive else 0.0)
    hi = float(sigma_max) if sigma_max is not None else sigmas[0]
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi <= 0:
        raise SamplerError(f"sigma_min {lo!r} and sigma_max {hi!r} must be finite and above 0", where=where,
                           fix="pass sigmas with at least one noise level above 0, or a positive sigma_min/sigma_max")
    return lo, hi


def _ancestral(t: float, t_next: float, t_end: float, eta: float) -> tuple[float, float]:
    """(where the deterministic step lands, the noise added back) for eta > 0."""
    if not eta:
        return t_next, 0.0
    down, _ = ancestral_step(_sigma(t), _sigma(t_next), eta)
    landing = t_end if down <= 0 else min(t_end, -math.log(down))
    return landing, math.sqrt(max(_sigma(t_next) ** 2 - _sigma(landing) ** 2, 0.0))


def fast_orders(calls: int) -> list[int]:
    """The orders of dpm_fast's steps for a budget of ``calls`` model calls (DPM-Solver-fast's split)."""
    steps = calls // 3 + 1
    if calls % 3 == 0:
        return [3] * (steps - 2) + [2, 1]
    return [3] * (steps - 1) + [calls % 3]


def dpm_fast(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
             callback: Callback | None = None, eta: float = 0.0, s_noise: float = 1.0,
             noise_sampler: NoiseSampler | None = None, sigma_min: float | None = None,
             sigma_max: float | None = None) -> np.ndarray:
    """DPM-Solver-fast: ``len(sigmas) - 1`` model calls spent in steps of order 3 (then 2 and 1), evenly spaced
    in log sigma from ``sigma_max`` to ``sigma_min`` (k-diffusion ``sample_dpm_fast``). With ``eta > 0`` each
    step lands lower and adds noise back, as an ancestral sampler (A1111 runs it at eta 1); at eta 0 no noise
    is drawn."""
    where = "sampler dpm_fast"
    x, s, kw, seed = prepare(x, sigmas, extra_args, where)
    calls = len(s) - 1
    if calls < 1:
        return x
    lo, hi = _range(s, sigma_min, sigma_max, where)
    t_start, t_end = -math.log(hi), -math.log(lo)
    if t_end <= t_start:
        return x
    noise = default_noise(x, seed, noise_sampler) if eta > 0 else None
    orders = fast_orders(calls)
    ts = np.linspace(t_start, t_end, len(orders) + 1)
    f = _Eps(model, kw, where)
    done = 0
    for i, order in enumerate(orders):
        t, t_next = float(ts[i]), float(ts[i + 1])
        landing, up = _ancestral(t, t_next, t_end, eta)
        eps = f(x, t)
        done += order
        if callback is not None:
            callback({"x": x, "i": done - 1, "sigma": _sigma(t), "sigma_hat": _sigma(t), "denoised": x - _sigma(t) * eps})
        if order == 1:
            x = _first_order(x, t, landing, eps)
        elif order == 2:
            x = _second_order(f, x, t, landing, eps)[0]
        else:
            x = _third_order(f, x, t, landing, eps)
        if noise is not None:
            x = x + (up * s_noise) * noise(_sigma(t), _sigma(t_next))
    return x


class _StepControl:
    """The PID step-size controller of k-diffusion's DPM-Solver (an integral controller at its defaults)."""

    def __init__(self, h: float, pcoeff: float, icoeff: float, dcoeff: float, order: float, accept_safety: float,
                 eps: float = 1e-8) -> None:
        self.h = h
        self.b = ((pcoeff + icoeff + dcoeff) / order, -(pcoeff + 2 * dcoeff) / order, dcoeff / order)
        self.accept_safety, self.eps = accept_safety, eps
        self.inv: list[float] = []  # inverse errors: this attempt's, the last accepted one's, the one before

    def propose(self, error: float) -> bool:
        inv = 1 / (error + self.eps)
        if not self.inv:
            self.inv = [inv, inv, inv]
        self.inv[0] = inv
        factor = self.inv[0] ** self.b[0] * self.inv[1] ** self.b[1] * self.inv[2] ** self.b[2]
        factor = 1 + math.atan(factor - 1)  # a smooth limiter
        accept = factor >= self.accept_safety
        if accept:
            self.inv[2], self.inv[1] = self.inv[1], self.inv[0]
        self.h *= factor
        return accept


def dpm_adaptive(model: Model, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
                 callback: Callback | None = None, order: int = 3, rtol: float = 0.05, atol: float = 0.0078,
                 h_init: float = 0.05, pcoeff: float = 0.0, icoeff: float = 1.0, dcoeff: float = 0.0,
                 accept_safety: float = 0.81, eta: float = 0.0, s_noise: float = 1.0,
                 noise_sampler: NoiseSampler | None = None, sigma_min: float | None = None,
                 sigma_max: float | None = None) -> np.ndarray:
    """DPM-Solver-23 (``order=3``) or -12 (``order=2``) with adaptive step size from ``sigma_max`` to
    ``sigma_min`` (k-diffusion ``sample_dpm_adaptive``): each step compares the two orders, and the error
    (scaled by ``rtol``/``atol``) accepts or rejects it and sets the next step size. The number of model calls
    follows from the tolerances, not from ``len(sigmas)``. A rejected step's first model call is reused by the
    next attempt (k-diffusion makes it again: the same result, one call fewer)."""
    where = "sampler dpm_adaptive"
    if order not in (2, 3):
        raise SamplerError(f"order {order!r} is not 2 or 3", where=where, fix="use order=3 (DPM-Solver-23) or 2")
    x, s, kw, seed = prepare(x, sigmas, extra_args, where)
    if len(s) < 2:
        return x
    lo, hi = _range(s, sigma_min, sigma_max, where)
    t_start, t_end = -math.log(hi), -math.log(lo)
    if t_end <= t_start:
        return x
    noise = default_noise(x, seed, noise_sampler) if eta > 0 else None
    progress_steps = len(s) - 1
    control = _StepControl(abs(h_init), pcoeff, icoeff, dcoeff, 1.5 if eta else order, accept_safety)
    f = _Eps(model, kw, where)
    t = t_start
    x_prev = x
    eps: np.ndarray | None = None
    info = {"n_accept": 0, "n_reject": 0}
    while t < t_end - 1e-5:
        t_next = min(t_end, t + control.h)
        landing, up = _ancestral(t, t_next, t_end, eta)
        if eps is None:
            eps = f(x, t)
        denoised = x - _sigma(t) * eps
        if order == 2:
            x_low = _first_order(x, t, landing, eps)
            x_high = _second_order(f, x, t, landing, eps)[0]
        else:
            x_low, eps_1 = _second_order(f, x, t, landing, eps, r1=1 / 3)
            x_high = _third_order(f, x, t, landing, eps, eps_1)
        scale = np.maximum(atol, rtol * np.maximum(np.abs(x_low), np.abs(x_prev)))
        error = float(np.sqrt(np.mean(np.square(((x_low - x_high) / scale).astype(np.float64)))))
        if not math.isfinite(error):
            raise SamplerError("the model returned NaN or infinite values", where=where,
                               fix="check the model and its inputs; another backend or precision may help")
        if control.propose(error):
            x_prev = x_low
            x = x_high
            if noise is not None:
                x = x + (up * s_noise) * noise(_sigma(t), _sigma(t_next))
            t = t_next
            eps = None
            info["n_accept"] += 1
        else:
            info["n_reject"] += 1
        if callback is not None:
            covered = (t - t_start) / (t_end - t_start)
            i = min(progress_steps - 1, max(0, math.ceil(covered * progress_steps) - 1))
            callback({"x": x, "i": i, "sigma": _sigma(t), "sigma_hat": _sigma(t), "denoised": denoised,
                      "error": error, "h": control.h, "nfe": f.calls, **info})
    return x
