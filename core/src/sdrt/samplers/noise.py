"""Seeded noise that matches torch's CPU generator, per-step noise, and a Brownian tree.

``randn(seed, shape)`` reproduces
``torch.randn(shape, generator=torch.Generator().manual_seed(seed))`` bit for
bit in float32. The port follows torch's CPU path:

- the engine is a 32-bit Mersenne twister (mt19937) seeded with the low 32
  bits of the seed (torch keeps the full 64-bit seed but initialises the
  twister from ``seed & 0xffffffff``), so seeds ``s`` and ``s + 2**32`` give
  the same noise, exactly as in torch;
- a float32 tensor of 16 or more elements is filled with 24-bit uniforms
  (one 32-bit draw each), turned into normals 16 at a time by Box-Muller in
  float32 (the first 8 uniforms give the radius, the next 8 the angle); when
  the size is not a multiple of 16 the last 16 values are drawn again and
  recomputed;
- a smaller tensor is filled one element at a time from
  ``normal_distribution<double>``: two 53-bit uniforms (two 32-bit draws
  each), Box-Muller in double, with the sine half cached in the generator for
  the next element.

torch computes that float32 Box-Muller with the AVX2 polynomial approximations
of ``avx_mathfun.h`` on x86 CPUs with AVX2 or AVX-512 (checked on torch 2.13:
bit for bit, including the FMAs the compiler fuses), and with the C library's
``logf``/``cosf``/``sinf`` in builds without AVX2 (CPU capability "default").
The two differ in the last bits, so torch itself gives different noise on
different machines. ``randn`` follows the x86 kernel (``kernel="avx2"``, the
default); ``kernel="scalar"`` approximates the other one (exact below 16
elements, within 1-2 ulp on about 1.5% of the values above).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import InputError, SamplerError

__all__ = [
    "BrownianTreeNoiseSampler",
    "TorchGenerator",
    "TorchNoiseSampler",
    "brownian_interval",
    "check_seed",
    "randn",
]

_U64 = 1 << 64
_KERNELS = ("scalar", "avx2")


def check_seed(seed: object, arg: str = "seed") -> int:
    """``seed`` as an int: an integer in [-2**63, 2**64), what ``torch.Generator.manual_seed`` takes (a negative
    seed is ``seed + 2**64``); else an error about the argument ``arg`` (``seed``, ``subseed``): one check, in
    one wording, for every seed."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InputError(f"the {arg} must be an integer, got {type(seed).__name__} {str(seed)[:40]!r}", where=arg,
                         fix=f"pass an integer {{@{arg}}}, such as 42")
    if not -(1 << 63) <= int(seed) < _U64:
        raise SamplerError(f"{arg} {seed} is out of range", where=arg,
                           fix=f"use a {{@{arg}}} from -2**63 to 2**64 - 1 (a 64-bit seed; A1111's are below 2**32)")
    return int(seed)


def _seed32(seed: int) -> int:
    return (check_seed(seed) % _U64) & 0xFFFFFFFF


def _mt_key(seed32: int) -> np.ndarray:
    key = np.empty(624, dtype=np.uint32)
    value = seed32
    key[0] = value
    for i in range(1, 624):
        value = (1812433253 * (value ^ (value >> 30)) + i) & 0xFFFFFFFF
        key[i] = value
    return key


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise SamplerError(
            f"bad noise shape {shape!r}",
            where="sdrt.samplers.randn",
            fix="pass a tuple of non-negative ints such as (1, 4, 64, 64)",
        )
    return tuple(int(d) for d in dims)


class TorchGenerator:
    """A numpy port of ``torch.Generator()`` on the CPU, for ``randn`` only.

    Successive ``randn`` calls on one generator match successive
    ``torch.randn(shape, generator=g)`` calls on one torch generator.
    """

    def __init__(self, seed: int, *, kernel: str = "avx2") -> None:
        if kernel not in _KERNELS:
            raise SamplerError(
                f"unknown randn kernel {kernel!r}",
                where="sdrt.samplers.TorchGenerator",
                fix=f"use one of {', '.join(_KERNELS)}",
            )
        self.seed = check_seed(seed)
        self.kernel = kernel
        self._bits = np.random.MT19937(0)
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": _mt_key(_seed32(seed)), "pos": 624}}
        self._cached_normal: float | None = None

    def _raw32(self, n: int) -> np.ndarray:
        return self._bits.random_raw(n).astype(np.uint32) if n else np.empty(0, np.uint32)

    def _uniform_f32(self, n: int) -> np.ndarray:
        return ((self._raw32(n) & np.uint32(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)).astype(np.float32)

    def _uniform_f64(self) -> float:
        hi, lo = (int(v) for v in self._raw32(2))
        return float(((hi << 32) | lo) & ((1 << 53) - 1)) * 2.0**-53

    def _normal_f64(self) -> float:
        if self._cached_normal is not None:
            value, self._cached_normal = self._cached_normal, None
            return value
        u1 = self._uniform_f64()
        u2 = self._uniform_f64()
        r = math.sqrt(-2.0 * math.log1p(-u2))
        theta = 2.0 * math.pi * u1
        self._cached_normal = r * math.sin(theta)
        return r * math.cos(theta)

    def randn(self, shape: int | Sequence[int], dtype: type | np.dtype = np.float32) -> np.ndarray:
        """Standard normal noise, like ``torch.randn(shape, generator=self)``."""
        dims = _shape(shape)
        size = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if size >= 16:
            data = self._uniform_f32(size)
            full = size - size % 16
            if full:
                data[:full] = self._box_muller16(data[:full].reshape(-1, 16)).reshape(-1)
            if size % 16:
                tail = self._uniform_f32(16)
                data[size - 16:] = self._box_muller16(tail.reshape(1, 16)).reshape(-1)
        else:
            data = np.array([self._normal_f64() for _ in range(size)], dtype=np.float64).astype(np.float32)
        return data.reshape(dims).astype(dtype, copy=False)

    def _box_muller16(self, blocks: np.ndarray) -> np.ndarray:
        u1 = np.float32(1.0) - blocks[:, :8]
        u2 = blocks[:, 8:]
        if self.kernel == "avx2":
            from ._avx_mathfun import cos_sin_f32, log_f32

            radius = np.sqrt(np.float32(-2.0) * log_f32(u1))
            theta = np.float32(2.0 * math.pi) * u2
            cos, sin = cos_sin_f32(theta)
        else:
            # glibc's logf/cosf/sinf work in double and round once: do the same.
            radius = np.sqrt(np.float32(-2.0) * np.log(u1.astype(np.float64)).astype(np.float32))
            theta = (2.0 * math.pi * u2.astype(np.float64)).astype(np.float32)
            cos = np.cos(theta.astype(np.float64)).astype(np.float32)
            sin = np.sin(theta.astype(np.float64)).astype(np.float32)
        return np.concatenate([radius * cos, radius * sin], axis=1).astype(np.float32)


def randn(seed: int, shape: int | Sequence[int], *, dtype: type | np.dtype = np.float32,
          kernel: str = "avx2") -> np.ndarray:
    """``torch.randn(shape, generator=torch.Generator().manual_seed(seed))``, in numpy, bit for bit."""
    return TorchGenerator(seed, kernel=kernel).randn(shape, dtype=dtype)


class TorchNoiseSampler:
    """Per-step noise for ancestral and SDE samplers: successive ``randn`` draws from one generator.

    ``TorchNoiseSampler(x, seed)`` matches ComfyUI's default noise sampler on the
    CPU, which seeds a fresh generator with ``seed + 1`` (``offset=1``), and
    k-diffusion's ``torch.randn_like`` given a generator seeded with ``seed``
    (``offset=0``).
    """

    def __init__(self, x: np.ndarray, seed: int, *, offset: int = 1, kernel: str = "avx2") -> None:
        self.shape = tuple(np.shape(x))
        self.dtype = np.asarray(x).dtype
        self.generator = TorchGenerator(check_seed(seed) + offset, kernel=kernel)

    def __call__(self, sigma: float, sigma_next: float) -> np.ndarray:
        return self.generator.randn(self.shape).astype(self.dtype, copy=False)


# -- Brownian tree ---------------------------------------------------------------------------------


def _split_seed(seed: int, salt: int) -> int:
    """A child seed from a parent seed, by SplitMix64 (deterministic, well mixed)."""
    z = (seed * 0x9E3779B97F4A7C15 + salt * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % _U64
    return z ^ (z >> 31)


class brownian_interval:  # noqa: N801 - a small value type used like a function
    """A Brownian motion W on ``[t0, t1]`` with ``W(t0) = 0``, queried by increments.

    The path is defined by a binary tree of Brownian bridges: the node for an
    interval ``[a, b]`` with a known increment draws its midpoint from the
    bridge distribution with its own seed, which is derived from the tree
    seed and the node's position. So ``W(s, t)`` depends only on the seed and
    on ``s, t``, never on the order of queries, which is what SDE samplers
    need (the same noise when a step is evaluated twice). Query points are
    resolved to within ``tol`` (default ``(t1 - t0) * 2**-30``) by descending
    the tree; below that the path is linearly interpolated. The most recently
    used nodes are cached (``cache_size`` arrays of the noise shape).
    """

    def __init__(self, shape: Sequence[int], t0: float, t1: float, seed: int, *, tol: float | None = None,
                 dtype: type | np.dtype = np.float32, cache_size: int = 64) -> None:
        if not t0 < t1:
            raise SamplerError(f"Brownian interval needs t0 < t1, got [{t0}, {t1}]",
                               where="sdrt.samplers.brownian_interval", fix="pass the sigma range in increasing order")
        self.shape, self.t0, self.t1, self.dtype = tuple(shape), float(t0), float(t1), dtype
        self.tol = float(tol) if tol is not None else (self.t1 - self.t0) * 2.0**-30
        self.seed = int(seed) % _U64
        self._total = self._normal(self.seed, 0) * math.sqrt(self.t1 - self.t0)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cache_size = int(cache_size)

    def _normal(self, seed: int, salt: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(_split_seed(seed, salt)))
        return rng.standard_normal(self.shape)

    def _w(self, t: float) -> np.ndarray:
        """W(t) - W(t0)."""
        t = min(max(float(t), self.t0), self.t1)
        a, b = self.t0, self.t1
        wa = np.zeros(self.shape)
        wb = self._total
        node = 1
        while b - a > self.tol:
            if t == a:
                return wa
            if t == b:
                return wb
            mid = 0.5 * (a + b)
            wm = self._cache.get(node)
            if wm is None:
                # Brownian bridge midpoint: mean of the ends, variance (b - a) / 4.
                wm = 0.5 * (wa + wb) + self._normal(self.seed, node) * (0.5 * math.sqrt(b - a))
                self._cache[node] = wm
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(node)
            if t < mid:
                b, wb, node = mid, wm, 2 * node
            else:
                a, wa, node = mid, wm, 2 * node + 1
        return wa + (wb - wa) * ((t - a) / (b - a))

    def __call__(self, s: float, t: float) -> np.ndarray:
        """The increment ``W(t) - W(s)``."""
        return (self._w(t) - self._w(s)).astype(self.dtype)


class BrownianTreeNoiseSampler:
    """Noise for SDE samplers from a Brownian tree over sigma, like k-diffusion's.

    ``sampler(sigma, sigma_next)`` returns ``(W(t_next) - W(t)) / sqrt(|t_next - t|)``
    with ``t = transform(sigma)``: a standard normal for each step whose values
    are consistent across steps (sub-steps of dpmpp_sde see the same path).

    This is a numpy Brownian tree with its own random stream. It does not
    reproduce torchsde's BrownianTree values bit for bit (torchsde draws from
    torch's generator in its own tree order); its statistics are the same.
    """

    def __init__(self, x: np.ndarray, sigma_min: float, sigma_max: float, seed: int, *,
                 transform: Callable[[float], float] = lambda s: s) -> None:
        self.transform = transform
        t0, t1 = float(transform(float(sigma_min))), float(transform(float(sigma_max)))
        lo, hi = min(t0, t1), max(t0, t1)
        if not hi > lo:  # one step: a single positive sigma, whose step (to 0) draws no noise; any range serves
            hi = lo + 1.0
        self.tree = brownian_interval(np.shape(x), lo, hi, seed, dtype=np.asarray(x).dtype)

    def __call__(self, sigma: float, sigma_next: float) -> np.ndarray:
        t0, t1 = float(self.transform(float(sigma))), float(self.transform(float(sigma_next)))
        sign = 1.0 if t1 >= t0 else -1.0
        lo, hi = min(t0, t1), max(t0, t1)
        w = self.tree(lo, hi) * sign
        return (w / math.sqrt(abs(t1 - t0))).astype(self.tree.dtype)
