"""UniPC multistep predictor-corrector, Zhao et al. 2023, in sigma space (numpy).

Follows ComfyUI's ``comfy/extra_samplers/uni_pc.py`` use of the solver:
data prediction, B(h) variants ``bh1``/``bh2``, order ``min(3, steps - 1)``,
lower order at the end, the corrector on every step but the last, and a final
sigma of 0 replaced by 0.001.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SamplerError
from ._common import Callback, prepare

__all__ = ["uni_pc", "uni_pc_bh2"]


def _lambda(sigma: float) -> float:
    # VP view of sigma: alpha = 1/sqrt(1+s^2), std = s/sqrt(1+s^2), lambda = log(alpha/std) = -log(s)
    return -math.log(sigma)


def _alpha(sigma: float) -> float:
    return 1.0 / math.sqrt(1.0 + sigma * sigma)


class _UniPC:
    def __init__(self, data_fn: Any, variant: str) -> None:
        self.data_fn = data_fn
        self.variant = variant

    def update(self, x: np.ndarray, model_prev: list[np.ndarray], t_prev: list[float], t: float, order: int,
               use_corrector: bool) -> tuple[np.ndarray, np.ndarray | None]:
        t_prev_0 = t_prev[-1]
        lam_prev_0, lam_t = _lambda(t_prev_0), _lambda(t)
        m0 = model_prev[-1]
        sigma_prev_0 = t_prev_0 * _alpha(t_prev_0)
        sigma_t = t * _alpha(t)
        alpha_t = _alpha(t)
        h = lam_t - lam_prev_0
        rks: list[float] = []
        d1s: list[np.ndarray] = []
        for i in range(1, order):
            rk = (_lambda(t_prev[-(i + 1)]) - lam_prev_0) / h
            rks.append(rk)
            d1s.append((model_prev[-(i + 1)] - m0) / rk)
        rks.append(1.0)
        hh = -h
        h_phi_1 = math.expm1(hh)
        h_phi_k = h_phi_1 / hh - 1
        factorial = 1
        b_h = hh if self.variant == "bh1" else math.expm1(hh)
        rows, b = [], []
        for i in range(1, order + 1):
            rows.append([r ** (i - 1) for r in rks])
            b.append(h_phi_k * factorial / b_h)
            factorial *= i + 1
            h_phi_k = h_phi_k / hh - 1 / factorial
        r_mat = np.asarray(rows, dtype=np.float64)
        b_vec = np.asarray(b, dtype=np.float64)
        rhos_p = None
        if d1s:
            rhos_p = np.array([0.5]) if order == 2 else np.linalg.solve(r_mat[:-1, :-1], b_vec[:-1])
        rhos_c = np.array([0.5]) if order == 1 else np.linalg.solve(r_mat, b_vec)
        x_t_ = (sigma_t / sigma_prev_0) * x - (alpha_t * h_phi_1) * m0
        pred = sum(float(r) * d for r, d in zip(rhos_p, d1s)) if rhos_p is not None else 0.0
        x_t = x_t_ - (alpha_t * b_h) * pred
        model_t = None
        if use_corrector:
            model_t = self.data_fn(x_t, t)
            corr = sum(float(r) * d for r, d in zip(rhos_c[:-1], d1s)) if d1s else 0.0
            x_t = x_t_ - (alpha_t * b_h) * (corr + float(rhos_c[-1]) * (model_t - m0))
        return x_t, model_t


def _sample(model: Any, x: np.ndarray, sigmas: Any, extra_args: Mapping[str, Any] | None,
            callback: Callback | None, variant: str) -> np.ndarray:
    x, s, kw, _ = prepare(x, sigmas, extra_args, f"sampler uni_pc ({variant})")
    steps = len(s) - 1
    if steps < 2:
        raise SamplerError(f"uni_pc needs at least 2 steps, got {steps}", where="sampler uni_pc",
                           fix="use more steps, or euler for a single step")
    ts = list(s)
    if ts[-1] == 0:
        ts[-1] = 0.001

    def data_fn(xv: np.ndarray, sigma: float) -> np.ndarray:
        # The solver works on VP latents xv = x / sqrt(1 + sigma^2); the model denoises VE latents.
        return model(xv / _alpha(sigma), sigma, **kw)

    solver = _UniPC(data_fn, variant)
    order = min(3, steps - 1)
    xv = x * _alpha(ts[0])
    model_prev = [data_fn(xv, ts[0])]
    t_prev = [ts[0]]
    for step_index in range(steps):
        if step_index == 0:
            pass
        elif step_index < order:
            xv, model_x = solver.update(xv, model_prev, t_prev, ts[step_index], step_index, True)
            model_prev.append(model_x if model_x is not None else data_fn(xv, ts[step_index]))
            t_prev.append(ts[step_index])
        else:
            last = step_index == steps - 1
            for step in range(step_index, step_index + 1 + int(last)):
                step_order = min(order, steps + 1 - step)
                use_corrector = step != steps
                xv, model_x = solver.update(xv, model_prev, t_prev, ts[step], step_order, use_corrector)
                for k in range(order - 1):
                    t_prev[k] = t_prev[k + 1]
                    model_prev[k] = model_prev[k + 1]
                t_prev[-1] = ts[step]
                if step < steps:
                    model_prev[-1] = model_x if model_x is not None else data_fn(xv, ts[step])
        if callback is not None:
            callback({"x": xv, "i": step_index, "denoised": model_prev[-1]})
    return xv / _alpha(ts[-1])


def uni_pc(model: Any, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
           callback: Callback | None = None, variant: str = "bh1") -> np.ndarray:
    """UniPC (B(h) = h), Zhao et al. 2023 (ComfyUI ``uni_pc``)."""
    if variant not in ("bh1", "bh2"):
        raise SamplerError(f"unknown UniPC variant {variant!r}", where="sampler uni_pc", fix="use 'bh1' or 'bh2'")
    return _sample(model, x, sigmas, extra_args, callback, variant)


def uni_pc_bh2(model: Any, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
               callback: Callback | None = None) -> np.ndarray:
    """UniPC (B(h) = e^h - 1), Zhao et al. 2023 (ComfyUI ``uni_pc_bh2``)."""
    return _sample(model, x, sigmas, extra_args, callback, "bh2")
