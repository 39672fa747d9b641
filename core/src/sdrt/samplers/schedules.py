"""Noise schedules: functions that return a decreasing array of sigmas ending in 0.

Two shapes of function, as in ComfyUI's scheduler table:

- ``f(n, sigma_min, sigma_max, ...)``: karras, exponential, polyexponential,
  kl_optimal (k-diffusion style, need only the sigma range);
- ``f(n, model_sampling, ...)``: normal, simple, sgm_uniform, ddim_uniform,
  beta, linear_quadratic (need the model's own sigma table).

``get_sigmas(name, steps, model_sampling)`` calls either shape by name, and
applies the discard-penultimate-sigma rule for the samplers that need it.
Every array is float64 with ``n + 1`` entries (fewer for ``beta`` when
timesteps collide, as in ComfyUI).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import SamplerError

__all__ = [
    "AYS_NOISE_LEVELS",
    "DISCARD_PENULTIMATE_SIGMA",
    "align_your_steps",
    "beta",
    "ddim_uniform",
    "exponential",
    "karras",
    "kl_optimal",
    "linear_quadratic",
    "normal",
    "polyexponential",
    "sgm_uniform",
    "simple",
]

#: Samplers that take one extra step and drop the next-to-last sigma
#: (ComfyUI ``KSampler.DISCARD_PENULTIMATE_SIGMA_SAMPLERS``; A1111 sets
#: ``discard_next_to_last_sigma`` for DPM2 and DPM2 a).
DISCARD_PENULTIMATE_SIGMA = frozenset({"dpm_2", "dpm_2_ancestral", "uni_pc", "uni_pc_bh2"})

#: Align Your Steps noise levels for 10 steps (Sabour et al. 2024, NVIDIA's how-to page).
AYS_NOISE_LEVELS: dict[str, tuple[float, ...]] = {
    "SD1": (14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177, 1.3943805092,
            0.9642583904, 0.6523686016, 0.3977456272, 0.1515232662, 0.0291671582),
    "SDXL": (14.6146412293, 6.3184485287, 3.7681790315, 2.1811480769, 1.3405244945, 0.8620721141,
             0.5550693289, 0.3798540708, 0.2332364134, 0.1114188177, 0.0291671582),
    "SVD": (700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002),
}


def _check_steps(n: int, where: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise SamplerError(f"steps must be a positive int, got {n!r}", where=where, fix="pass steps >= 1")
    return int(n)


def _append_zero(sigmas: np.ndarray) -> np.ndarray:
    return np.concatenate([np.asarray(sigmas, dtype=np.float64), [0.0]])


def karras(n: int, sigma_min: float, sigma_max: float, rho: float = 7.0) -> np.ndarray:
    """Karras et al. (2022) schedule, k-diffusion ``get_sigmas_karras``."""
    n = _check_steps(n, "schedule karras")
    ramp = np.linspace(0, 1, n)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return _append_zero((hi + ramp * (lo - hi)) ** rho)


def exponential(n: int, sigma_min: float, sigma_max: float) -> np.ndarray:
    """Uniform in log sigma, k-diffusion ``get_sigmas_exponential``."""
    n = _check_steps(n, "schedule exponential")
    return _append_zero(np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), n)))


def polyexponential(n: int, sigma_min: float, sigma_max: float, rho: float = 1.0) -> np.ndarray:
    """Polynomial in log sigma, k-diffusion ``get_sigmas_polyexponential``."""
    n = _check_steps(n, "schedule polyexponential")
    ramp = np.linspace(1, 0, n) ** rho
    return _append_zero(np.exp(ramp * (math.log(sigma_max) - math.log(sigma_min)) + math.log(sigma_min)))


def kl_optimal(n: int, sigma_min: float, sigma_max: float) -> np.ndarray:
    """KL-optimal schedule (A1111 PR 15608, ComfyUI ``kl_optimal_scheduler``)."""
    n = _check_steps(n, "schedule kl_optimal")
    adj = np.arange(n, dtype=np.float64) / (n - 1) if n > 1 else np.zeros(1)
    return _append_zero(np.tan(adj * math.atan(sigma_min) + (1 - adj) * math.atan(sigma_max)))


def _is_zero(value: float) -> bool:
    return math.isclose(float(value), 0.0, abs_tol=1e-5)


def normal(n: int, ms: Any, *, sgm: bool = False) -> np.ndarray:
    """Uniform in timestep between the model's sigma_max and sigma_min (ComfyUI ``normal``)."""
    n = _check_steps(n, "schedule normal")
    start = float(ms.timestep(ms.sigma_max, quantize=True))
    end = float(ms.timestep(ms.sigma_min, quantize=True))
    append = True
    if sgm:
        timesteps = np.linspace(start, end, n + 1)[:-1]
    else:
        if _is_zero(ms.sigma(end)):
            n += 1
            append = False
        timesteps = np.linspace(start, end, n)
    sigmas = np.asarray(ms.sigma(timesteps), dtype=np.float64)
    return _append_zero(sigmas) if append else sigmas


def sgm_uniform(n: int, ms: Any) -> np.ndarray:
    """Like ``normal`` but with ``n + 1`` points and the last dropped (ComfyUI ``sgm_uniform``)."""
    return normal(n, ms, sgm=True)


def simple(n: int, ms: Any) -> np.ndarray:
    """Every (len/n)-th sigma of the model's table from the top (ComfyUI ``simple``)."""
    n = _check_steps(n, "schedule simple")
    table = np.asarray(ms.sigmas, dtype=np.float64)
    step = len(table) / n
    return _append_zero([table[-(1 + int(i * step))] for i in range(n)])


def ddim_uniform(n: int, ms: Any) -> np.ndarray:
    """DDIM's uniform timestep spacing over the model's table (ComfyUI ``ddim_uniform``)."""
    n = _check_steps(n, "schedule ddim_uniform")
    table = np.asarray(ms.sigmas, dtype=np.float64)
    if _is_zero(table[1]):
        n += 1
        sigs: list[float] = []
    else:
        sigs = [0.0]
    stride = max(len(table) // n, 1)
    sigs += [float(v) for v in table[1::stride]]
    return np.asarray(sigs[::-1], dtype=np.float64)


def _betacf(a: float, b: float, x: np.ndarray) -> np.ndarray:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = np.where(np.abs(d) < tiny, tiny, d)
    d = 1.0 / d
    h = d.copy()
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = np.where(np.abs(d) < tiny, tiny, d)
        c = 1.0 + aa / c
        c = np.where(np.abs(c) < tiny, tiny, c)
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = np.where(np.abs(d) < tiny, tiny, d)
        c = 1.0 + aa / c
        c = np.where(np.abs(c) < tiny, tiny, c)
        d = 1.0 / d
        delta = d * c
        h *= delta
        if np.all(np.abs(delta - 1.0) < 1e-15):
            break
    return h


def _betainc(a: float, b: float, x: np.ndarray) -> np.ndarray:
    """Regularized incomplete beta I_x(a, b) for x in [0, 1]."""
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    out = np.where(x >= 1.0, 1.0, 0.0)
    inner = (x > 0) & (x < 1)
    xi = np.where(inner, x, 0.5)
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = np.exp(lbeta + a * np.log(xi) + b * np.log1p(-xi))
    direct = xi < (a + 1) / (a + b + 2)
    val = np.empty_like(xi)
    if np.any(direct):
        val[direct] = front[direct] * _betacf(a, b, xi[direct]) / a
    if np.any(~direct):
        val[~direct] = 1.0 - front[~direct] * _betacf(b, a, 1.0 - xi[~direct]) / b
    return np.where(inner, val, out)


def _beta_ppf(q: np.ndarray, a: float, b: float) -> np.ndarray:
    """Inverse of ``_betainc``: bisection to a 2**-20 bracket, then Newton steps inside it."""
    q = np.asarray(q, dtype=np.float64)
    lo, hi = np.zeros_like(q), np.ones_like(q)
    for _ in range(20):
        mid = 0.5 * (lo + hi)
        below = _betainc(a, b, mid) < q
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    x = 0.5 * (lo + hi)
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(6):
            pdf = np.exp(log_norm + (a - 1) * np.log(x) + (b - 1) * np.log1p(-x))
            step = np.where(pdf > 0, (_betainc(a, b, x) - q) / pdf, 0.0)
            x = np.clip(x - step, lo, hi)
    return np.where(q <= 0, 0.0, np.where(q >= 1, 1.0, x))


def beta(n: int, ms: Any, alpha: float = 0.6, beta: float = 0.6) -> np.ndarray:
    """Beta-distributed timesteps (Lee et al. 2024, arXiv:2407.12173; ComfyUI ``beta``)."""
    n = _check_steps(n, "schedule beta")
    table = np.asarray(ms.sigmas, dtype=np.float64)
    total = len(table) - 1
    ts = 1 - np.linspace(0, 1, n, endpoint=False)
    # At the symmetric midpoint (q = 0.5, every even n with alpha == beta) the exact ppf is 0.5 and
    # 0.5 * 999 is a tie that rint sends to the even neighbour; snap values within 1e-7 of a tie onto
    # it so that our last-bit differences from scipy (which ComfyUI uses) cannot flip the rounding.
    v = _beta_ppf(ts, alpha, beta) * total
    near_tie = np.abs(v - np.floor(v) - 0.5) < 1e-7
    ts = np.rint(np.where(near_tie, np.floor(v) + 0.5, v))
    sigs: list[float] = []
    last = -1.0
    for t in ts:
        if t != last:
            sigs.append(float(table[int(t)]))
        last = t
    return _append_zero(sigs)


def linear_quadratic(n: int, ms: Any, threshold_noise: float = 0.025, linear_steps: int | None = None) -> np.ndarray:
    """Linear then quadratic schedule from Mochi (genmoai; ComfyUI ``linear_quadratic``)."""
    n = _check_steps(n, "schedule linear_quadratic")
    if n == 1:
        schedule = [1.0, 0.0]
    else:
        if linear_steps is None:
            linear_steps = n // 2
        linear = [i * threshold_noise / linear_steps for i in range(linear_steps)]
        diff = linear_steps - threshold_noise * n
        quadratic_steps = n - linear_steps
        quad_coef = diff / (linear_steps * quadratic_steps**2)
        lin_coef = threshold_noise / linear_steps - 2 * diff / (quadratic_steps**2)
        const = quad_coef * (linear_steps**2)
        quad = [quad_coef * (i**2) + lin_coef * i + const for i in range(linear_steps, n)]
        schedule = [1.0 - v for v in linear + quad + [1.0]]
    return np.asarray(schedule, dtype=np.float64) * float(ms.sigma_max)


def _loglinear_interp(levels: np.ndarray, num: int) -> np.ndarray:
    xs = np.linspace(0, 1, len(levels))
    ys = np.log(levels[::-1])
    return np.exp(np.interp(np.linspace(0, 1, num), xs, ys))[::-1].copy()


def align_your_steps(n: int, model_type: str = "SD1") -> np.ndarray:
    """Align Your Steps (Sabour et al. 2024): the paper's 10-step levels, log-linearly resampled."""
    n = _check_steps(n, "schedule align_your_steps")
    key = {"SD15": "SD1", "SD1.5": "SD1", "SD2": "SD1"}.get(model_type, model_type)
    if key not in AYS_NOISE_LEVELS:
        raise SamplerError(f"no Align Your Steps table for model type {model_type!r}",
                           where="schedule align_your_steps", fix=f"use one of {', '.join(AYS_NOISE_LEVELS)}")
    sigmas = np.asarray(AYS_NOISE_LEVELS[key], dtype=np.float64)
    if n + 1 != len(sigmas):
        sigmas = _loglinear_interp(sigmas, n + 1)
    sigmas = sigmas.copy()
    sigmas[-1] = 0.0
    return sigmas
