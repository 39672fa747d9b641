"""iPNDM, PLMS and DEIS: explicit multistep samplers in sigma (EDM time), numpy."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._common import Callback, emit, prepare

__all__ = ["deis", "deis_coefficients", "ipndm", "plms"]

_IPNDM = {1: (1.0,), 2: (3 / 2, -1 / 2), 3: (23 / 12, -16 / 12, 5 / 12), 4: (55 / 24, -59 / 24, 37 / 24, -9 / 24)}


def ipndm(model: Any, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
          callback: Callback | None = None, max_order: int = 4) -> np.ndarray:
    """Improved PNDM (Adams-Bashforth in sigma), Zhang & Chen 2022 (ComfyUI ``sample_ipndm``)."""
    x, s, kw, _ = prepare(x, sigmas, extra_args, "sampler ipndm")
    history: list[np.ndarray] = []
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        d = (x - denoised) / s[i]
        order = min(max_order, i + 1)
        if s[i + 1] == 0:
            x_next = denoised
        else:
            coeffs = _IPNDM[order]
            grads = [d] + history[::-1][: order - 1]
            x_next = x + (s[i + 1] - s[i]) * sum(c * g for c, g in zip(coeffs, grads))
        history.append(d)
        if len(history) > max_order - 1:
            history.pop(0)
        x = x_next
    return x


def plms(model: Any, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
         callback: Callback | None = None, pseudo_first: bool = False) -> np.ndarray:
    """Pseudo linear multistep (PLMS), Liu et al. 2022 "Pseudo Numerical Methods for Diffusion Models": a
    pseudo improved Euler first step (the noise prediction averaged with one at the step's end, one more
    model call), then Adams-Bashforth of order 2, 3 and 4 on the noise predictions, each applied with the
    DDIM transfer, which is an Euler step in sigma. CompVis' and A1111's PLMS; diffusers' PNDMScheduler with
    ``skip_prk_steps=True`` (SD 1.x's default scheduler). ``len(sigmas) - 1`` steps take one model call more.
    Every step, the last to sigma 0 too, applies the combined prediction (iPNDM lands on the denoised estimate
    there instead). ``pseudo_first``: the first step is the pseudo improved Euler one even when it is the only one
    (CompVis' and A1111's loop, which ends above sigma 0: sdrt.pipelines.compvis)."""
    x, s, kw, _ = prepare(x, sigmas, extra_args, "sampler plms")
    history: list[np.ndarray] = []
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        d = (x - denoised) / s[i]
        dt = s[i + 1] - s[i]
        if history:
            order = min(len(history) + 1, 4)
            combined = sum(c * g for c, g in zip(_IPNDM[order], [d] + history[::-1][: order - 1]))
        elif (len(s) > 2 or pseudo_first) and s[i + 1] > 0:  # the first of two or more steps: pseudo improved Euler
            ahead = x + dt * d
            combined = (d + (ahead - model(ahead, s[i + 1], **kw)) / s[i + 1]) / 2
        else:
            combined = d
        history.append(d)
        if len(history) > 3:
            history.pop(0)
        x = x + dt * combined
    return x


def _edm_to_vp_t(sigmas: np.ndarray, eps_s: float = 1e-3, sigma_min: float = 0.002,
                 sigma_max: float = 80.0) -> tuple[np.ndarray, float, float]:
    """Map EDM sigmas to VP-SDE time t (DEIS' change of variable); returns t, beta_0, beta_1."""
    beta_d = 2 * (math.log(sigma_min**2 + 1) / eps_s - math.log(sigma_max**2 + 1)) / (eps_s - 1)
    beta_min = math.log(sigma_max**2 + 1) - 0.5 * beta_d
    t = (np.sqrt(beta_min**2 + 2 * beta_d * np.log(sigmas**2 + 1)) - beta_min) / beta_d
    return t, beta_min, beta_d + beta_min


def deis_coefficients(sigmas: Any, max_order: int = 3, n: int = 10000) -> list[list[float]]:
    """DEIS 'tab' coefficients: each Lagrange basis times the VP integrand, integrated on n points."""
    t, b0, b1 = _edm_to_vp_t(np.asarray(sigmas, dtype=np.float64))
    out: list[list[float]] = []
    for i in range(len(t) - 1):
        order = min(i + 1, max_order)
        if order == 1:
            out.append([])
            continue
        taus = np.linspace(t[i], t[i + 1], n)
        dtau = (t[i + 1] - t[i]) / n
        log_alpha_grad = -taus * (b1 - b0) - b0
        alpha = np.exp(-0.5 * taus**2 * (b1 - b0) - taus * b0)
        with np.errstate(divide="ignore", invalid="ignore"):  # t = 0 (sigma 0) on a final, first-order step
            integrand = -0.5 * log_alpha_grad / np.sqrt(alpha * (1 - alpha))
        prev = [t[i - k] for k in range(order)]
        row = []
        for j in range(order):
            poly = np.ones_like(taus)
            for k in range(order):
                if k != j:
                    poly = poly * (taus - prev[k]) / (prev[j] - prev[k])
            row.append(float(np.sum(integrand * poly) * dtau))
        out.append(row)
    return out


def deis(model: Any, x: np.ndarray, sigmas: Any, *, extra_args: Mapping[str, Any] | None = None,
         callback: Callback | None = None, max_order: int = 3) -> np.ndarray:
    """DEIS multistep (tAB), Zhang & Chen 2022 (ComfyUI ``sample_deis``, from zju-pi/diff-sampler)."""
    x, s, kw, _ = prepare(x, sigmas, extra_args, "sampler deis")
    coeffs = deis_coefficients(s, max_order)
    history: list[np.ndarray] = []
    for i in range(len(s) - 1):
        denoised = model(x, s[i], **kw)
        emit(callback, x, i, s[i], s[i], denoised)
        d = (x - denoised) / s[i]
        order = min(max_order, i + 1)
        if s[i + 1] <= 0:
            order = 1
        if order == 1:
            x_next = x + (s[i + 1] - s[i]) * d
        else:
            grads = [d] + history[::-1][: order - 1]
            x_next = x + sum(c * g for c, g in zip(coeffs[i], grads))
        history.append(d)
        if len(history) > max_order - 1:
            history.pop(0)
        x = x_next
    return x
