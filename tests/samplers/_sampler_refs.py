"""Shared by the sampler tests: the reference data and the numpy twin of the script's Gaussian model.

The data comes from scripts/gen_sampler_refs.py (torch, k-diffusion, ComfyUI,
diffusers), run once and committed.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).parent / "data"
SHAPE = (1, 4, 4, 4)
DATA_STD = 0.5


@cache
def load(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


def data_mean() -> np.ndarray:
    return np.linspace(-1.0, 1.0, int(np.prod(SHAPE))).reshape(SHAPE) ** 3


def noise_list(count: int, seed: int = 1234) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count,) + SHAPE)


def start_noise(seed: int = 99) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE)


class ListNoise:
    """The k-th call returns the k-th array; records each call's (sigma, sigma_next)."""

    def __init__(self, arrays: np.ndarray) -> None:
        self.arrays = arrays
        self.calls: list[tuple[float, float]] = []

    def __call__(self, sigma: float, sigma_next: float) -> np.ndarray:
        k = len(self.calls)
        self.calls.append((float(sigma), float(sigma_next)))
        return self.arrays[k]


class GaussianVE:
    """Exact denoiser E[x0 | x0 + sigma n] for x0 ~ N(mu, DATA_STD^2) elementwise."""

    def __init__(self, mu: np.ndarray | None = None) -> None:
        self.mu = data_mean() if mu is None else mu
        self.calls = 0

    def __call__(self, x: np.ndarray, sigma: float, **kw: Any) -> np.ndarray:
        self.calls += 1
        s2, g2 = DATA_STD**2, float(sigma) ** 2
        return (s2 * x + g2 * self.mu) / (s2 + g2)


class GaussianFlow:
    """Exact denoiser E[x0 | (1 - sigma) x0 + sigma n] (rectified flow), with model_sampling for flow samplers."""

    def __init__(self, model_sampling: Any, mu: np.ndarray | None = None) -> None:
        self.mu = data_mean() if mu is None else mu
        self.model_sampling = model_sampling

    def __call__(self, x: np.ndarray, sigma: float, **kw: Any) -> np.ndarray:
        s2, a = DATA_STD**2, 1 - float(sigma)
        return self.mu + a * s2 / (a * a * s2 + float(sigma) ** 2) * (x - a * self.mu)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|: the relative error of a whole latent."""
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))
