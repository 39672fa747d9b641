"""Noise as torch draws it on an NVIDIA GPU (A1111's ``RNG: GPU``) and A1111's ``NV`` generator, in numpy.

``randn_cuda(seed, shape)`` follows
``torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))``:

- the engine is Philox4x32-10 (Salmon et al. 2011, as in curand): the key is the
  64-bit seed split into two 32-bit words (low first), the 128-bit counter is
  ``(offset // 4, thread)``: its low 64 bits count 4-word blocks from the
  generator's offset, its high 64 bits are the CUDA thread index (curand's
  "subsequence");
- torch launches blocks of 256 threads, as many blocks as the tensor needs but
  no more than the GPU keeps resident (``SMs * max threads per SM / 256``);
  each thread draws ``curand_normal4`` per round: one Philox block, two
  Box-Muller pairs giving ``(r1 sin t1, r1 cos t1, r2 sin t2, r2 cos t2)``,
  written to elements ``i, i + S, i + 2S, i + 3S`` of its round (``S`` the number
  of threads), the rest discarded. A tensor no larger than the GPU's resident
  thread count therefore takes the first value of thread ``i`` for element
  ``i``; a larger one uses the cosines and later rounds, so its noise depends on
  the GPU (``cuda_threads``);
- after a draw the generator's offset moves on by 4 per round, so successive
  draws from one generator match successive torch draws.

``CudaGenerator.rand`` is ``torch.rand`` on the same layout (``curand_uniform4``), which
recorded prints from three GPUs check (tests/samplers/data/cuda_randn_recorded.json).

The uniforms are ``x * 2**-32 + 2**-33`` in float32 with one rounding (nvcc fuses
the multiply-add); ``log``, ``sin`` and ``cos`` are correctly rounded here, while
the GPU uses its own float32 ``logf`` and the ``__sincosf`` intrinsic, so single
values may differ from a GPU's in the last bits (a few float32 ulps).

``NvGenerator`` is A1111's "NV" source (``modules/rng_philox.py``): the same
Philox stream with one thread per element, the sine half only, the uniforms and
Box-Muller in double precision, and the counter moved on by one block per draw
whatever the size. On tensors within the GPU's thread count its first draw is
the GPU's noise to within float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import SamplerError
from ._avx_mathfun import _fma

__all__ = [
    "CudaGenerator",
    "NvGenerator",
    "cuda_thread_capacity",
    "philox4x32_10",
    "randn_cuda",
    "randn_nv",
]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LO32 = np.uint64(0xFFFFFFFF)
_U64 = 1 << 64
_BLOCK = 256
_INV32 = np.float32(2.3283064e-10)                 # curand's CURAND_2POW32_INV
_INV32_2PI = np.float32(2.3283064e-10 * 6.2831855)  # CURAND_2POW32_INV_2PI, a float32 product


def philox4x32_10(counter: np.ndarray, key: np.ndarray, rounds: int = 10) -> np.ndarray:
    """Philox4x32 on columns: ``counter`` (4, N) and ``key`` (2, N) or (2,) uint32 -> (4, N) uint32."""
    c = [np.asarray(counter[i], dtype=np.uint32).copy() for i in range(4)]
    k = np.asarray(key, dtype=np.uint32).reshape(2, -1)  # arrays wrap silently; numpy scalars warn
    k0, k1 = k[0].copy(), k[1].copy()
    for r in range(rounds):
        if r:
            k0 = k0 + _W0
            k1 = k1 + _W1
        p0 = c[0].astype(np.uint64) * _M0
        p1 = c[2].astype(np.uint64) * _M1
        hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & _LO32).astype(np.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & _LO32).astype(np.uint32)
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return np.stack(c)


def _seed64(seed: int, where: str) -> int:
    from .noise import check_seed

    return check_seed(seed) % _U64


def _shape(shape: int | Sequence[int], where: str) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise SamplerError(f"bad noise shape {shape!r}", where=where,
                           fix="pass a tuple of non-negative ints such as (1, 4, 64, 64)")
    return tuple(int(d) for d in dims)


def _blocks(seed: int, block_index: np.ndarray | int, thread: np.ndarray) -> np.ndarray:
    """The Philox block number ``block_index`` of each thread: (4, N) uint32."""
    n = thread.size
    bi = np.broadcast_to(np.asarray(block_index, dtype=np.uint64), (n,))
    th = thread.astype(np.uint64)
    counter = np.stack([(bi & _LO32).astype(np.uint32), (bi >> np.uint64(32)).astype(np.uint32),
                        (th & _LO32).astype(np.uint32), (th >> np.uint64(32)).astype(np.uint32)])
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32)
    return philox4x32_10(counter, key)


def _box_muller_cuda(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """curand's Box-Muller pair in float32: (r sin t, r cos t)."""
    u = _fma(x.astype(np.float32), _INV32, np.float32(_INV32 / np.float32(2)))
    v = _fma(y.astype(np.float32), _INV32_2PI, np.float32(_INV32_2PI / np.float32(2)))
    log_u = np.log(u.astype(np.float64)).astype(np.float32)
    s = np.sqrt(np.float32(-2.0) * log_u)
    v64 = v.astype(np.float64)
    return s * np.sin(v64).astype(np.float32), s * np.cos(v64).astype(np.float32)


def cuda_thread_capacity(multiprocessors: int, max_threads_per_multiprocessor: int) -> int:
    """How many threads torch's random kernels launch at most on a GPU (``cudaDeviceProp`` fields)."""
    if multiprocessors < 1 or max_threads_per_multiprocessor < _BLOCK:
        raise SamplerError(
            f"bad GPU description: {multiprocessors} multiprocessors, {max_threads_per_multiprocessor} threads each",
            where="sdrt.samplers.cuda_thread_capacity",
            fix="pass cudaDeviceProp.multiProcessorCount and maxThreadsPerMultiProcessor (e.g. 128 and 1536)")
    return int(multiprocessors) * (int(max_threads_per_multiprocessor) // _BLOCK) * _BLOCK


class CudaGenerator:
    """``torch.Generator("cuda")`` for ``randn`` in float32.

    ``cuda_threads`` is the GPU's resident thread count (``cuda_thread_capacity``);
    ``None`` means a GPU at least as large as every tensor drawn, which is the
    common case for one SD/SDXL latent on a desktop GPU.
    """

    def __init__(self, seed: int, *, cuda_threads: int | None = None) -> None:
        self.seed = _seed64(seed, "sdrt.samplers.CudaGenerator")
        if cuda_threads is not None and (int(cuda_threads) < _BLOCK or int(cuda_threads) % _BLOCK):
            raise SamplerError(f"cuda_threads={cuda_threads} is not a positive multiple of {_BLOCK}",
                               where="sdrt.samplers.CudaGenerator",
                               fix="pass cuda_thread_capacity(SMs, max threads per SM), or None")
        self.cuda_threads = None if cuda_threads is None else int(cuda_threads)
        self.offset = 0  # in 32-bit outputs, as torch's philox offset

    def _fill(self, shape: int | Sequence[int], where: str,
              values: Callable[[np.ndarray, int], list[np.ndarray]]) -> np.ndarray:
        """torch's grid-stride layout: ``values(blocks, k)`` turns (4, T) Philox words into the first k outputs."""
        dims = _shape(shape, where)
        n = math.prod(dims)
        if n == 0:
            return np.empty(dims, np.float32)
        blocks = -(-n // _BLOCK)
        if self.cuda_threads is not None:
            blocks = min(blocks, self.cuda_threads // _BLOCK)
        stride = blocks * _BLOCK
        rounds = (n - 1) // (stride * 4) + 1
        out = np.empty(rounds * 4 * stride, np.float32)
        threads = np.arange(stride, dtype=np.uint64)
        base = self.offset // 4
        for r in range(rounds):
            lo = r * 4 * stride
            left = n - lo
            # threads whose outputs all fall past the end need no block
            live = threads[:left] if left < stride else threads
            parts = values(_blocks(self.seed, base + r, live), min(4, -(-left // stride)))
            for ii, part in enumerate(parts):
                start = lo + ii * stride
                out[start:start + part.size] = part
        self.offset += rounds * 4
        return out[:n].reshape(dims)

    def randn(self, shape: int | Sequence[int]) -> np.ndarray:
        """Standard normal float32 noise, like ``torch.randn(shape, device="cuda", generator=self)``."""
        def normals(g: np.ndarray, k: int) -> list[np.ndarray]:
            s1, c1 = _box_muller_cuda(g[0], g[1])
            if k <= 2:
                return [s1, c1][:k]
            s2, c2 = _box_muller_cuda(g[2], g[3])
            return [s1, c1, s2, c2][:k]

        return self._fill(shape, "sdrt.samplers.CudaGenerator.randn", normals)

    def rand(self, shape: int | Sequence[int]) -> np.ndarray:
        """Uniform float32 noise in [0, 1), like ``torch.rand(shape, device="cuda", generator=self)``."""
        def uniforms(g: np.ndarray, k: int) -> list[np.ndarray]:
            out = []
            for word in g[:k]:
                u = _fma(word.astype(np.float32), _INV32, np.float32(_INV32 / np.float32(2)))
                out.append(np.where(u == np.float32(1.0), np.float32(0.0), u))  # torch maps (0, 1] to [0, 1)
            return out

        return self._fill(shape, "sdrt.samplers.CudaGenerator.rand", uniforms)


class NvGenerator:
    """A1111's "NV" random source: successive ``randn`` draws from one seed."""

    def __init__(self, seed: int) -> None:
        self.seed = _seed64(seed, "sdrt.samplers.NvGenerator")
        self.offset = 0  # Philox blocks, one per draw

    def randn(self, shape: int | Sequence[int]) -> np.ndarray:
        dims = _shape(shape, "sdrt.samplers.NvGenerator.randn")
        n = math.prod(dims)
        g = _blocks(self.seed, self.offset, np.arange(n, dtype=np.uint64))
        self.offset += 1
        inv = float(_INV32)
        inv_2pi = float(_INV32_2PI)
        u = g[0].astype(np.float64) * inv + inv / 2
        v = g[1].astype(np.float64) * inv_2pi + inv_2pi / 2
        return (np.sqrt(-2.0 * np.log(u)) * np.sin(v)).astype(np.float32).reshape(dims)


def randn_cuda(seed: int, shape: int | Sequence[int], *, cuda_threads: int | None = None) -> np.ndarray:
    """``torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))`` in numpy."""
    return CudaGenerator(seed, cuda_threads=cuda_threads).randn(shape)


def randn_nv(seed: int, shape: int | Sequence[int]) -> np.ndarray:
    """The first draw of A1111's "NV" generator for ``seed``."""
    return NvGenerator(seed).randn(shape)
