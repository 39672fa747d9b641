"""Seeds as AUTOMATIC1111's web UI turns them into noise: random sources, batches, variation seeds.

A1111 draws each image's initial noise from its own generator seeded with that
image's seed, in the shape ``(C, H / 8, W / 8)``, then stacks the images
(``modules/rng.py``, ``ImageRNG``). This module does the same in numpy:

- ``rng``: ``"gpu"`` (A1111's default ``RNG: GPU``, torch's CUDA Philox
  generator, ``sdrt.samplers.philox``), ``"cpu"`` (torch's CPU generator,
  ``sdrt.samplers.randn``) or ``"nv"`` (A1111's "NV" numpy imitation of the GPU);
- ``batch_seeds``: image ``i`` of a batch gets ``seed + i``, or ``seed`` for every
  image and ``subseed + i`` when a variation strength is set, as A1111 does;
- variation seeds: the noise of ``seed`` and of ``subseed`` mixed by A1111's
  ``slerp`` with ``subseed_strength``;
- "resize seed from": the noise is drawn at another size and pasted centred;
- ``eta_noise_seed_delta`` (ENSD): later draws (ancestral noise) come from
  generators seeded with ``seed + ENSD``;
- ``resolve_seed(-1)`` picks a random seed the way A1111 does; write the seed it
  returns into the infotext.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np

from ..errors import SamplerError
from .noise import TorchGenerator, check_seed
from .philox import CudaGenerator, NvGenerator

__all__ = [
    "RNG_SOURCES",
    "ImageNoise",
    "batch_seeds",
    "make_generator",
    "resolve_seed",
    "rng_infotext",
    "seed_infotext",
    "slerp",
]

RNG_SOURCES = ("gpu", "cpu", "nv")
_INFOTEXT = {"gpu": "GPU", "cpu": "CPU", "nv": "NV"}


def _rng(rng: str, where: str) -> str:
    key = str(rng).lower()
    if key not in RNG_SOURCES:
        raise SamplerError(f"unknown random source {rng!r}", where=where,
                           fix=f"use one of {', '.join(RNG_SOURCES)} (A1111's GPU, CPU and NV)")
    return key


def make_generator(rng: str, seed: int, *, cuda_threads: int | None = None
                   ) -> TorchGenerator | CudaGenerator | NvGenerator:
    """A generator for ``rng`` seeded with ``seed``; every kind has ``randn(shape) -> float32``."""
    kind = _rng(rng, "sdrt.samplers.make_generator")
    if kind == "cpu":
        return TorchGenerator(seed)
    if kind == "nv":
        return NvGenerator(seed)
    return CudaGenerator(seed, cuda_threads=cuda_threads)


def resolve_seed(seed: int | None) -> int:
    """A1111's ``get_fixed_seed``: ``None`` or ``-1`` becomes a random seed in ``[0, 4294967294)``; any other
    seed is an integer in ``[-2**63, 2**64)`` (:func:`sdrt.samplers.noise.check_seed`)."""
    if seed is None or (not isinstance(seed, bool) and isinstance(seed, (int, np.integer)) and seed == -1):
        return secrets.randbelow(4294967294)
    return check_seed(seed)  # an integer torch.Generator.manual_seed takes, else an error about the seed


def batch_seeds(seed: int, subseed: int, count: int, subseed_strength: float = 0.0) -> tuple[list[int], list[int]]:
    """The seeds and variation seeds of ``count`` images, as A1111's ``process_images`` lays them out."""
    if count < 1:
        raise SamplerError(f"batch of {count} images", where="sdrt.samplers.batch_seeds",
                           fix="ask for at least one image")
    step = 1 if subseed_strength == 0 else 0
    return [int(seed) + i * step for i in range(count)], [int(subseed) + i for i in range(count)]


def rng_infotext(rng: str) -> dict[str, str]:
    """The infotext field for ``rng``: A1111 writes ``RNG: CPU`` / ``RNG: NV`` and leaves its default GPU out."""
    kind = _rng(rng, "sdrt.samplers.rng_infotext")
    return {} if kind == "gpu" else {"RNG": _INFOTEXT[kind]}


def seed_infotext(seed: int, *, subseed: int | None = None, subseed_strength: float = 0.0,
                  seed_resize_from: tuple[int, int] = (0, 0), rng: str = "gpu",
                  eta_noise_seed_delta: int = 0, uses_eta_noise: bool = False) -> dict[str, object]:
    """One image's seed fields of A1111's infotext, named and left out as A1111's ``create_infotext`` does.

    ``seed``/``subseed`` are that image's (from ``batch_seeds``), after ``resolve_seed``. ``ENSD`` is
    written only for samplers that draw noise after the first step (``uses_eta_noise``) and a delta set.
    """
    fields: dict[str, object] = {"Seed": int(seed)}
    if subseed_strength != 0:
        if subseed is None:
            raise SamplerError("a variation strength without a variation seed", where="sdrt.samplers.seed_infotext",
                               fix="pass subseed= (after resolve_seed) or subseed_strength=0")
        fields["Variation seed"] = int(subseed)
        fields["Variation seed strength"] = float(subseed_strength)
    w, h = (int(v) for v in seed_resize_from)
    if w > 0 and h > 0:
        fields["Seed resize from"] = f"{w}x{h}"
    if uses_eta_noise and eta_noise_seed_delta:
        fields["ENSD"] = int(eta_noise_seed_delta)
    fields.update(rng_infotext(rng))
    return fields


def slerp(val: float, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """A1111's ``slerp`` of two noises of shape ``(C, H, W)``.

    As A1111 does: the vectors are taken along axis 1 (H) for every channel and
    column; when the mean cosine is above 0.9995 it falls back to
    ``low * val + high * (1 - val)`` (A1111's weights, reversed from the slerp's).
    """
    low = np.asarray(low, np.float32)
    high = np.asarray(high, np.float32)
    if low.shape != high.shape or low.ndim < 2:
        raise SamplerError(f"slerp of shapes {low.shape} and {high.shape}", where="sdrt.samplers.slerp",
                           fix="pass two noises of the same shape (C, H, W)")
    lo64, hi64 = low.astype(np.float64), high.astype(np.float64)
    ln = lo64 / np.linalg.norm(lo64, axis=1, keepdims=True)
    hn = hi64 / np.linalg.norm(hi64, axis=1, keepdims=True)
    dot = (ln * hn).sum(axis=1)
    v = float(val)
    if dot.mean() > 0.9995:
        return (lo64 * v + hi64 * (1 - v)).astype(np.float32)
    omega = np.arccos(np.clip(dot, -1.0, 1.0))
    so = np.sin(omega)
    a = np.expand_dims(np.sin((1.0 - v) * omega) / so, 1)
    b = np.expand_dims(np.sin(v * omega) / so, 1)
    return (a * lo64 + b * hi64).astype(np.float32)


class ImageNoise:
    """A1111's ``ImageRNG`` in numpy: the initial noise of a batch, then per-step noise.

    ``shape`` is one image's latent shape ``(C, H, W)``; ``seeds`` (and
    ``subseeds``) one per image, from ``batch_seeds``. ``seed_resize_from`` is
    A1111's "Resize seed from" ``(width, height)`` in pixels (``(0, 0)`` for off),
    ``latent_factor`` the VAE's downscale (8). ``first()`` returns the
    ``(B, C, H, W)`` initial noise; each later ``next()`` the noise an ancestral
    step draws (A1111 routes ``torch.randn_like`` there).
    """

    def __init__(self, shape: Sequence[int], seeds: Sequence[int], *, subseeds: Sequence[int] | None = None,
                 subseed_strength: float = 0.0, seed_resize_from: tuple[int, int] = (0, 0), rng: str = "gpu",
                 eta_noise_seed_delta: int = 0, latent_factor: int = 8, cuda_threads: int | None = None) -> None:
        self.rng = _rng(rng, "sdrt.samplers.ImageNoise")
        self.shape = tuple(int(d) for d in shape)
        if len(self.shape) != 3 or min(self.shape) < 1:
            raise SamplerError(f"noise shape {tuple(shape)} is not (C, H, W)", where="sdrt.samplers.ImageNoise",
                               fix="pass one image's latent shape, e.g. (4, 64, 64); the batch comes from seeds")
        if not seeds:
            raise SamplerError("no seeds", where="sdrt.samplers.ImageNoise", fix="pass one seed per image")
        if not 0.0 <= float(subseed_strength) <= 1.0:
            raise SamplerError(f"subseed_strength={subseed_strength} is outside [0, 1]",
                               where="sdrt.samplers.ImageNoise", fix="pass a variation strength from 0 to 1")
        self.seeds = [int(s) for s in seeds]
        self.subseeds = None if subseeds is None else [int(s) for s in subseeds]
        self.subseed_strength = float(subseed_strength)
        self.seed_resize_from = (int(seed_resize_from[0]), int(seed_resize_from[1]))
        self.eta_noise_seed_delta = int(eta_noise_seed_delta)
        self.latent_factor = int(latent_factor)
        self.cuda_threads = cuda_threads
        self.generators = [self._gen(s) for s in self.seeds]
        self._first_done = False

    def _gen(self, seed: int) -> TorchGenerator | CudaGenerator | NvGenerator:
        return make_generator(self.rng, seed, cuda_threads=self.cuda_threads)

    def _fresh(self, seed: int, shape: Sequence[int]) -> np.ndarray:
        return self._gen(seed).randn(tuple(shape))

    def first(self) -> np.ndarray:
        c, h, w = self.shape
        rw, rh = self.seed_resize_from
        resized = rw > 0 and rh > 0
        noise_shape = (c, rh // self.latent_factor, rw // self.latent_factor) if resized else self.shape
        if resized and min(noise_shape) < 1:
            raise SamplerError(f"seed_resize_from={self.seed_resize_from} is smaller than one latent pixel",
                               where="sdrt.samplers.ImageNoise", fix="pass (0, 0) or a size of at least 8x8")
        xs = []
        for i, (seed, gen) in enumerate(zip(self.seeds, self.generators)):
            sub = None
            if self.subseeds is not None and self.subseed_strength != 0:
                subseed = 0 if i >= len(self.subseeds) else self.subseeds[i]
                sub = self._fresh(subseed, noise_shape)
            noise = self._fresh(seed, noise_shape) if noise_shape != self.shape else gen.randn(self.shape)
            if sub is not None:
                noise = slerp(self.subseed_strength, noise, sub)
            if noise_shape != self.shape:
                x = gen.randn(self.shape)
                dx = (w - noise_shape[2]) // 2
                dy = (h - noise_shape[1]) // 2
                cw = noise_shape[2] if dx >= 0 else noise_shape[2] + 2 * dx
                ch = noise_shape[1] if dy >= 0 else noise_shape[1] + 2 * dy
                tx, ty = max(dx, 0), max(dy, 0)
                sx, sy = max(-dx, 0), max(-dy, 0)
                x[:, ty:ty + ch, tx:tx + cw] = noise[:, sy:sy + ch, sx:sx + cw]
                noise = x
            xs.append(noise)
        if self.eta_noise_seed_delta:
            self.generators = [self._gen(s + self.eta_noise_seed_delta) for s in self.seeds]
        self._first_done = True
        return np.stack(xs).astype(np.float32)

    def next(self) -> np.ndarray:
        if not self._first_done:
            return self.first()
        return np.stack([g.randn(self.shape) for g in self.generators]).astype(np.float32)

    def noise_sampler(self):
        """A ``noise_sampler(sigma, sigma_next)`` for ancestral samplers that draws ``next()``."""
        def sample(sigma: float, sigma_next: float) -> np.ndarray:
            return self.next()
        return sample

    @property
    def count(self) -> int:
        return len(self.seeds)

    def __repr__(self) -> str:
        return f"ImageNoise(rng={self.rng!r}, shape={self.shape}, seeds={self.seeds[:4]}{'...' if self.count > 4 else ''})"

