"""sdrt-ggml's own native kernels (``plugin-ggml/native/*.c``), as ggml custom ops.

pip builds the C sources into ``sdrt_ggml/_native*.so`` (``.pyd`` on Windows) with the
platform's C compiler (``plugin-ggml/setup.py``). This module loads that library with
ctypes, tells it where ggml-python's ``ggml_tensor`` keeps ``ne``, ``nb``, ``data`` and
``src`` (ggml-python installs no C headers), and checks that layout against ggml's own API
and a small GEMM computed by ggml before any kernel is used. If the library is missing, fails
to load or fails a check, ``native()`` returns None and logs why once; the lowerings then
use ggml's own ops.

Environment: ``SDRT_GGML_NATIVE=0`` turns the kernels off; ``SDRT_GGML_GEMM_ISA`` forces a
GEMM kernel (``portable``, ``avx2``, ``avx512``, ``neon``) instead of the best one the CPU has. The bf16
products (``precision="bf16"``: ``pack_b_bf16``, ``bf16_rows``) run on AMX tiles (``tdpbf16ps``) where the CPU
and the OS have AMX-BF16 (``SDRT_GGML_AMX=0`` turns that off), else ``vdpbf16ps`` where the CPU has
AVX-512-BF16; both need the active kernel ``avx512``; otherwise (another CPU, or another ISA pinned) the same
bf16 weights are widened to float32 block by block for the float32 kernels (``Native.bf16_kernel``).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("sdrt.ggml.native")

#: ISA ids of the C library (``SDRT_ISA_*`` in native/sdrt_native.h)
ISAS = {"portable": 0, "avx2": 1, "avx512": 2, "neon": 3}
#: B panels are 32 columns wide for every ISA (``SDRT_NR``)
NR = 32
#: userdata flags of ``sdrt_gemm_op``
_TRANS, _PACKED, _BIAS, _SHARED, _RES, _ACT, _BF16 = 1, 2, 4, 8, 16, 32, 64


@dataclass(frozen=True)
class Native:
    """The loaded library and the custom-op callbacks made from it (kept alive for the process)."""

    lib: ctypes.CDLL
    path: str
    gemm_op: Any  # ggml_custom_op_t pointing at sdrt_gemm_op
    conv_op: Any  # ... at sdrt_conv_op
    pad_op: Any  # ... at sdrt_pad_op
    winograd_op: Any  # ... at sdrt_winograd_op
    pair_pad_op: Any  # ... at sdrt_pair_pad_op
    im2col_op: Any  # ... at sdrt_im2col_op

    @property
    def isa(self) -> str:
        return self.lib.sdrt_gemm_isa_name(self.lib.sdrt_gemm_active_isa()).decode()

    def set_isa(self, name: str | None) -> str:
        """Use the GEMM kernel ``name`` (None: the best this CPU has); returns the active one.
        Raises ValueError when this build or CPU lacks it."""
        isa = -1 if name is None else ISAS.get(name, -2)
        if isa == -2 or self.lib.sdrt_gemm_set_isa(isa) < 0:
            raise ValueError(f"GEMM kernel {name!r} is not available here (have: {', '.join(self.available_isas())})")
        return self.isa

    @property
    def nr(self) -> int:
        """Columns one kernel call of the active ISA computes (16 or 32): the direct conv's slice."""
        return int(self.lib.sdrt_gemm_isa_nr(self.lib.sdrt_gemm_active_isa()))

    def available_isas(self) -> list[str]:
        return [n for n, i in ISAS.items() if self.lib.sdrt_gemm_isa_available(i)]

    @property
    def bf16_kernel(self) -> bool:
        """Whether bf16 products run on bf16 kernels now (AMX tiles or vdpbf16ps: AVX-512-BF16, ``avx512`` active,
        ``bf16_kernel_name`` says which); else they widen the bf16 weights to float32 for the active float32 kernel."""
        return bool(self.lib.sdrt_bf16_active())

    @property
    def bf16_kernel_name(self) -> str:
        """The bf16 products' kernels now: ``amx-bf16`` (AMX tiles), ``avx512bf16`` (vdpbf16ps) or ``none`` (the
        bf16 weights widened to float32)."""
        return self.lib.sdrt_bf16_kernel_name().decode()

    @property
    def amx_available(self) -> bool:
        """Whether this CPU, the OS and this build have AMX-BF16 tiles for this process."""
        return bool(self.lib.sdrt_amx_available())

    def set_amx(self, on: bool | None) -> bool:
        """Run the bf16 products on AMX tiles (True), on vdpbf16ps (False), or as ``SDRT_GGML_AMX`` says (None:
        on unless it is 0); returns whether AMX is used now (never where it is not available)."""
        return bool(self.lib.sdrt_amx_set(-1 if on is None else int(on)))


def library_path() -> Path | None:
    """The compiled library inside the installed package, if pip built it."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"_native{suffix}"
        if p.exists():
            return p
    return None


_REASON: list[str] = []


def unavailable_reason() -> str | None:
    """Why the native kernels are not used (None when they are)."""
    native()
    return _REASON[0] if _REASON else None


@functools.cache
def native() -> Native | None:
    """The native kernels, or None (the reason logged once, and kept for ``unavailable_reason``)."""
    try:
        n, why = _load()
    except (OSError, AttributeError, ValueError, RuntimeError) as exc:  # a broken build or an unexpected ggml-python
        n, why = None, f"{type(exc).__name__}: {exc}"
    _REASON[:] = [why] if n is None else []
    if n is None:
        log.warning("sdrt-ggml native kernels not used (%s); falling back to ggml's own matmul", why)
    else:
        log.info("sdrt-ggml native kernels loaded from %s (GEMM: %s)", n.path, n.isa)
    return n


#: the pool's tuning variables (native/pool.c reads them once, with strtol) -> (default, lowest, highest)
POOL_VARIABLES = {"SDRT_GGML_SPIN_US": (200, 0, 10**7), "SDRT_GGML_WAIT_US": (50, 0, 10**7),
                  "SDRT_GGML_TASKS": (4, 1, 64), "SDRT_GGML_SHARED_TASKS": (1, 1, 64),
                  "SDRT_GGML_YIELD_US": (20, -1, 10**7), "SDRT_GGML_PIN": (3, 0, 3),
                  "SDRT_GGML_WAIT_PINNED_US": (1000, 0, 10**7), "SDRT_GGML_CONTENDED_MS": (100, 0, 10**6),
                  "SDRT_GGML_LONG_JOB_US": (200, 0, 10**7), "SDRT_GGML_PIN_HOLD_MS": (1000, 0, 10**6)}


def check_pool_variables(environ: Any = os.environ) -> list[str]:
    """Pool variables that are set but not a whole number in their range are dropped from ``environ`` (the C code
    would read "abc" as 0 and overflow on a huge value), each with a warning naming it; returns their names."""
    dropped = []
    for name, (default, low, high) in POOL_VARIABLES.items():
        text = environ.get(name)
        if text is None:
            continue
        # strtol's whole numbers only: Python's int() also takes "1_000" and non-ASCII digits, which C reads as 1, 0
        ok = re.fullmatch(r"\s*[+-]?[0-9]+\s*", text, re.ASCII) is not None and low <= int(text) <= high
        if not ok:
            log.warning("%s=%r is not a whole number from %d to %d; using the default %d", name, text, low, high,
                        default)
            del environ[name]
            dropped.append(name)
    return dropped


def _load() -> tuple[Native | None, str]:
    """The checked kernels, or None and why not."""
    if os.environ.get("SDRT_GGML_NATIVE", "1").lower() in ("0", "off", "false", "no"):
        return None, "SDRT_GGML_NATIVE=0"
    check_pool_variables()  # before the pool first starts and reads them
    path = library_path()
    if path is None:
        return None, ("the compiled library sdrt_ggml/_native is not installed: pip found no C compiler when it built "
                      "sdrt-ggml; install one (gcc/clang, or MSVC Build Tools) and reinstall sdrt-ggml")
    from .bindings import ggml_lib

    g = ggml_lib()
    lib = ctypes.CDLL(str(path))
    _declare(lib)
    why = _check_layout(lib, g)
    if why:
        return None, (f"ggml-python's ggml_tensor layout does not match what the kernels read ({why}); "
                      f"ggml-python {_ggml_version()} is not a version sdrt-ggml was checked with")
    ops = [g.ggml_custom_op_t(ctypes.cast(getattr(lib, f), ctypes.c_void_p).value) for f in ("sdrt_gemm_op", "sdrt_conv_op", "sdrt_pad_op",
                                                                                  "sdrt_winograd_op", "sdrt_pair_pad_op",
                                                                                  "sdrt_im2col_op")]
    n = Native(lib, str(path), *ops)
    want = os.environ.get("SDRT_GGML_GEMM_ISA")
    try:
        n.set_isa(want or None)
    except ValueError as exc:
        log.warning("SDRT_GGML_GEMM_ISA=%s ignored: %s; using %s", want, exc, n.set_isa(None))
    why = _self_test(n, g)
    if why:
        return None, f"the GEMM kernel's self-test inside a ggml graph failed ({why})"
    return n, ""


def _ggml_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ggml-python")
    except metadata.PackageNotFoundError:
        return "(unknown version)"


def _declare(lib: ctypes.CDLL) -> None:
    P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_ssize_t  # noqa: N806, E741
    lib.sdrt_set_tensor_layout.argtypes = [ctypes.c_size_t] * 4 + [I, ctypes.c_size_t]
    lib.sdrt_set_tensor_layout.restype = I
    lib.sdrt_probe_tensor.argtypes = [P, ctypes.POINTER(ctypes.c_int64)]
    lib.sdrt_probe_tensor.restype = I
    lib.sdrt_gemm_isa_available.argtypes = [I]
    lib.sdrt_gemm_set_isa.argtypes = [I]
    lib.sdrt_gemm_isa_name.argtypes = [I]
    lib.sdrt_gemm_isa_name.restype = ctypes.c_char_p
    lib.sdrt_gemm_active_isa.argtypes = []
    lib.sdrt_gemm_isa_nr.argtypes = [I]
    lib.sdrt_gemm_isa_nr.restype = I
    lib.sdrt_bf16_active.argtypes = []
    lib.sdrt_bf16_active.restype = I
    lib.sdrt_bf16_kernel_name.argtypes = []
    lib.sdrt_bf16_kernel_name.restype = ctypes.c_char_p
    lib.sdrt_amx_available.argtypes = []
    lib.sdrt_amx_available.restype = I
    lib.sdrt_amx_set.argtypes = [I]
    lib.sdrt_amx_set.restype = I
    lib.sdrt_gemm.argtypes = [I, I, I, I, P, S, P, S, S, I, P, P, S, I, I, I]
    lib.sdrt_gemm.restype = I
    lib.sdrt_pool_set_width.argtypes = [I]
    lib.sdrt_pool_set_width.restype = None
    lib.sdrt_pool_release.argtypes = []
    lib.sdrt_pool_release.restype = None
    lib.sdrt_pool_workers.argtypes = []
    lib.sdrt_pool_workers.restype = I
    lib.sdrt_pool_jobs.argtypes = []
    lib.sdrt_pool_jobs.restype = ctypes.c_long
    L = ctypes.c_int64  # noqa: N806
    lib.sdrt_pack_b_bf16.argtypes = [P, L, L, L, L, P]
    lib.sdrt_pack_b_bf16.restype = None
    lib.sdrt_pack_b_f32.argtypes = [P, L, L, L, L, P]
    lib.sdrt_pack_b_f32.restype = None
    lib.sdrt_bf16_rows.argtypes = [P, L, L, L, P]
    lib.sdrt_bf16_rows.restype = None
    lib.sdrt_pairs_weights.argtypes = [P, L, L, L, L, P]
    lib.sdrt_pairs_weights.restype = None
    lib.sdrt_winograd_weights.argtypes = [P, L, L, L, L, L, P]
    lib.sdrt_winograd_weights.restype = None


def _check_layout(lib: ctypes.CDLL, g: Any) -> str | None:
    """Pass ggml-python's field offsets to the library, then check what it reads through them
    against ggml's API on real tensors (reads stay inside the structure: no crash if wrong)."""
    t = g.ggml_tensor
    size = ctypes.sizeof(t)
    if g.ggml_tensor_overhead() != size + g.GGML_OBJECT_SIZE:
        return f"ggml_tensor_overhead() is {g.ggml_tensor_overhead()}, ctypes says {size} + {g.GGML_OBJECT_SIZE}"
    if lib.sdrt_set_tensor_layout(t.ne.offset, t.nb.offset, t.data.offset, t.src.offset, g.GGML_MAX_SRC, size):
        return "field offsets outside the structure"
    ctx = g.ggml_init(g.ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=False))
    try:
        a = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 3, 5, 7, 11)
        b = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 3, 5, 7, 11)
        c = g.ggml_add(ctx, a, b)
        out = (ctypes.c_int64 * 12)()
        lib.sdrt_probe_tensor(ctypes.cast(a, ctypes.c_void_p), out)
        if list(out[:8]) != [3, 5, 7, 11, 4, 12, 60, 420]:
            return f"ne/nb read as {list(out[:8])}"
        if out[8] != (g.ggml_get_data(a) or 0):
            return "data pointer"
        lib.sdrt_probe_tensor(ctypes.cast(c, ctypes.c_void_p), out)
        addr = [ctypes.cast(p, ctypes.c_void_p).value for p in (a, b)]
        if [out[9], out[10], out[11]] != [addr[0], addr[1], 0]:
            return "src pointers"
    finally:
        g.ggml_free(ctx)
    return None


def _self_test(n: Native, g: Any) -> str | None:
    """A small GEMM (odd sizes, bias, both output orders) run by ggml's CPU graph compute."""
    rng = np.random.default_rng(0)
    m, nn, k = 19, 37, 23
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((nn, k)).astype(np.float32)
    bias = rng.standard_normal(nn).astype(np.float32)
    ctx = g.ggml_init(g.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=False))
    try:
        ta = _tensor(g, ctx, a)
        tw = _tensor(g, ctx, pack_b(w, lib=n.lib))
        tb = _tensor(g, ctx, bias)
        outs = [gemm_op(n, g, ctx, ta, tw, tb, m=m, n=nn, trans=tr, packed=True, state=state_tensor(g, ctx) if tr else None)
                for tr in (False, True)]
        # the bf16 product (vdpbf16ps, or widened bf16 weights): against the rounded operands
        tw16 = _tensor(g, ctx, pack_b_bf16(w, n.lib), dtype=np.uint16)
        outs.append(gemm_op(n, g, ctx, ta, tw16, tb, m=m, n=nn, packed=True, bf16=True, state=state_tensor(g, ctx)))
        gf = g.ggml_new_graph(ctx)
        for o in outs:
            g.ggml_build_forward_expand(gf, o)
        g.ggml_graph_compute_with_ctx(ctx, gf, 2)
        want = a @ w.T + bias
        wr = bf16_round(w)
        want16 = (bf16_round(a) if n.bf16_kernel else a).astype(np.float64) @ wr.T.astype(np.float64) + bias
        for o, tr, ref in zip(outs, (False, True, None), (want, want, want16)):
            got = np.ctypeslib.as_array(ctypes.cast(g.ggml_get_data(o), ctypes.POINTER(ctypes.c_float)),
                                        shape=(nn, m) if tr else (m, nn))
            got = got.T if tr else got
            if not np.allclose(got, ref, rtol=1e-4, atol=1e-4):
                kind = "bf16" if tr is None else "transposed" if tr else "row-major"
                return f"max error {float(np.abs(got - ref).max()):.3g} ({kind} output)"
    finally:
        g.ggml_free(ctx)
    return None


def _tensor(g: Any, ctx: Any, arr: np.ndarray, dtype: Any = np.float32) -> Any:
    arr = np.ascontiguousarray(arr, dtype=dtype)
    ne = list(reversed(arr.shape)) + [1] * (4 - arr.ndim)
    t = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_BF16 if arr.dtype == np.uint16 else g.GGML_TYPE_F32, *ne)
    ctypes.memmove(g.ggml_get_data(t), arr.ctypes.data, arr.nbytes)
    return t


def for_lowering(lowering: Any) -> Native | None:
    """The native kernels when this lowering may use them: on the CPU device (custom ops run only
    on ggml's CPU backend), unless the compile option ``gemm="ggml"`` asks for ggml's mul_mat."""
    choice = lowering.options.get("gemm", "auto")  # checked by GgmlBackend.compile
    if choice == "ggml" or not lowering.on_cpu:
        return None
    return native()


#: ggml ops whose work ggml's own threads must share: a graph with one of them is computed on ggml's
#: threads, not on the ops' pool (``pool_width``)
_GGML_THREADED = ("MUL_MAT", "MUL_MAT_ID", "OUT_PROD", "FLASH_ATTN_EXT", "IM2COL", "CONV_2D", "CONV_2D_DW",
                  "CONV_TRANSPOSE_1D", "CONV_TRANSPOSE_2D", "POOL_2D")


def pool_width(g: Any, graph: Any, threads: int, choice: Any = "auto") -> int:
    """The width of the ops' thread pool (native/pool.c) for a CPU graph, 0 for none.

    With a width, ggml computes the graph on one thread (no barrier after every node) and each
    sdrt op spreads over the pool, whose caller never waits for a thread that has not started:
    a core taken by another program then costs its share of the work, not a stall of the whole
    graph at ggml's next barrier. ggml's own ops run on that one thread, so ``choice`` "auto"
    keeps ggml's threads for a graph with one of the heavy ones (``gemm="ggml"``, ggml's
    convolutions or flash attention); True uses the pool regardless, False never."""
    if choice is False or threads < 2 or native() is None:
        return 0
    if choice == "auto":
        heavy = {getattr(g, f"GGML_OP_{name}", -1) for name in _GGML_THREADED}
        for i in range(int(g.ggml_graph_n_nodes(graph))):
            if g.ggml_graph_node(graph, i).contents.op in heavy:
                return 0
    return threads


def pack_b(w: np.ndarray, threads: int | None = None, lib: ctypes.CDLL | None = None) -> np.ndarray:
    """B given as (..., N, K) rows (a weight as ggml_mul_mat takes it) -> panels of 32 columns, each as
    two halves of 16: (..., ceil(N/32), 2, K, 16), zero-padded columns; the layout ``sdrt_gemm_op``
    reads with ``packed=True`` (``SDRT_HALF`` in native/sdrt_native.h says why). A 2-D ``w`` is packed by
    native/pack.c in one pass, read in place where it is a float32 view with positive strides (a transposed
    weight), split by panel among the layout threads; aligned, so that lowering keeps it without another copy."""
    w = np.asarray(w, dtype=np.float32)
    *lead, n, k = w.shape
    p = -(-n // NR)
    if not lead:
        if w.ctypes.data % 4 or any(st <= 0 or st % 4 for st in w.strides):
            w = np.ascontiguousarray(w)
        out = aligned_empty((p, 2, k, NR // 2), np.float32)
        fn, sn, sk = (lib or _lib()).sdrt_pack_b_f32, w.strides[0] // 4, w.strides[1] // 4
        _in_parts(p, n * k, lambda p0, p1: fn(w[p0 * NR:p1 * NR].ctypes.data, min(n, p1 * NR) - p0 * NR, k, sn, sk,
                                              out[p0:p1].ctypes.data), threads)
        return out
    if p * NR != n:
        w = np.concatenate([w, np.zeros((*lead, p * NR - n, k), np.float32)], axis=-2)
    out = aligned_empty((*lead, p, 2, k, NR // 2), np.float32)
    np.copyto(out, np.swapaxes(w.reshape(*lead, p, 2, NR // 2, k), -1, -2))
    return out


def bf16_round(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bf16 (nearest even) and back to float32."""
    from .half import round_to

    return round_to("bf16", a)


def bf16_for(lowering: Any) -> bool:
    """Whether this lowering multiplies bf16 weights with these kernels (``precision="bf16"``, the CPU device, the
    library loaded): MatMul/Gemm weights as ``packed_bf16``, dense conv kernels as ``rows_bf16`` (half.py); and
    attention without a mask on the AMX tiles where the CPU has them (``native_ops.attention``'s ``bf16``)."""
    from .half import kind

    return kind(lowering) == "bf16" and for_lowering(lowering) is not None


def packed_f32(lowering: Any, arr: np.ndarray, transform: Any, tag: str) -> Any:
    """A weights tensor of float32 GEMM panels (``pack_b``) of ``transform(arr)``, (N, K) rows; ``update_weights``
    packs new values the same way."""
    threads = threads_of(lowering)
    return lowering.const(arr, transform=lambda v: pack_b(transform(v), threads), tag=tag)


def packed_bf16(lowering: Any, arr: np.ndarray, transform: Any, tag: str) -> Any:
    """A weights tensor of bf16 GEMM panels (``pack_b_bf16``) of ``transform(arr)``, (N, K) rows;
    ``update_weights`` packs new values the same way."""
    lowering.used("gemm bf16")
    threads = threads_of(lowering)
    return lowering.const(arr, transform=lambda v: pack_b_bf16(transform(np.asarray(v, np.float32)), threads=threads),
                          tag=f"B16{tag}", dtype="uint16", ggml_type="GGML_TYPE_BF16")


def rows_bf16(lowering: Any, arr: np.ndarray, transform: Any, tag: str) -> Any:
    """A weights tensor of bf16 conv rows (``bf16_rows``) of ``transform(arr)``, (OC, K)."""
    lowering.used("conv bf16")
    threads = threads_of(lowering)
    return lowering.const(arr, transform=lambda v: bf16_rows(transform(np.asarray(v, np.float32)), threads),
                          tag=f"R16{tag}", dtype="uint16", ggml_type="GGML_TYPE_BF16")


#: the alignment of a weight array a CPU buffer wraps (ggml's CPU backend asserts 32 bytes)
HOST_ALIGN = 64


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array starting on a ``HOST_ALIGN`` boundary: the weight layouts below are made
    in one, so that lowering hands them to ggml's buffers as they are (``lower.host_array`` copies any other)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + HOST_ALIGN, np.uint8)
    start = -raw.ctypes.data % HOST_ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_pad(a: np.ndarray, after: tuple[int, ...] | list[int], threads: int | None = None) -> np.ndarray:
    """``a`` zero-padded at the end of each axis by ``after``, written once into an ``aligned_empty`` array (what
    ``numpy.pad`` gives is not aligned, and lowering copied it a second time: 1.19 GB of the float32 SD 1.5 UNet's
    implicit GEMM kernels at 256 px, 1.1 s of its compile), split by the first axis among the layout threads as the
    native layouts are (numpy's copies release the GIL)."""
    a = np.asarray(a)
    out = aligned_empty(tuple(s + p for s, p in zip(a.shape, after)), a.dtype)
    inner = tuple(slice(0, s) for s in a.shape[1:])

    def rows(r0: int, r1: int) -> None:
        out[(slice(r0, r1), *inner)] = a[r0:r1]
        for axis, (s, p) in enumerate(zip(a.shape, after)):
            if p and axis:
                out[(slice(r0, r1),) + (slice(None),) * (axis - 1) + (slice(s, None),)] = 0

    _in_parts(a.shape[0], a.size, rows, threads)
    if after[0]:
        out[a.shape[0]:] = 0
    return out


def pack_b_bf16(w: np.ndarray, lib: ctypes.CDLL | None = None, threads: int | None = None) -> np.ndarray:
    """B given as (N, K) rows -> bf16 panels of 32 columns, each two halves of 16, each K as ceil(K/2) pairs
    with the pair of a column side by side: (ceil(N/32), 2, ceil(K/2), 16 x 2) uint16 (bf16 bit patterns, zero
    columns and a zero last K where N or K fall short); what ``sdrt_gemm_op`` reads with ``bf16=True``
    (vdpbf16ps multiplies a pair of K a lane: native/sdrt_native.h). Written by native/pack.c in one pass, from
    ``w`` in place where it is a float32 view with positive strides (a transposed weight)."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.ctypes.data % 4 or any(st <= 0 or st % 4 for st in w.strides):
        w = np.ascontiguousarray(w)
    n, k = w.shape
    out = aligned_empty((-(-n // NR), 2, -(-k // 2), NR), np.uint16)
    fn, sn, sk = (lib or _lib()).sdrt_pack_b_bf16, w.strides[0] // 4, w.strides[1] // 4
    _in_parts(out.shape[0], n * k, lambda p0, p1: fn(w[p0 * NR:p1 * NR].ctypes.data, min(n, p1 * NR) - p0 * NR, k,
                                                     sn, sk, out[p0:p1].ctypes.data), threads)
    return out


def bf16_rows(w: np.ndarray, threads: int | None = None) -> np.ndarray:
    """A conv's kernel rows (OC, K) as bf16 bit patterns (uint16), each row padded with zeros to an even
    length whose pairs (4 bytes each) do not crowd into a few L1 sets (``row_stride``): ``sdrt_conv_op``'s
    W with ``conv_params(bf16=True)``."""
    w = np.require(w, np.float32, ["C", "A"])
    oc, k = w.shape
    out = aligned_empty((oc, 2 * row_stride(-(-k // 2))), np.uint16)
    fn = _lib().sdrt_bf16_rows
    _in_parts(oc, oc * k, lambda r0, r1: fn(w[r0:r1].ctypes.data, r1 - r0, k, out.shape[1], out[r0:r1].ctypes.data),
              threads)
    return out


def pairs_rows(lowering: Any, arr: np.ndarray) -> Any:
    """A weights tensor of a conv's kernel (OC, C, KH, KW) as ``pairs_weights``, remade so by ``update_weights``."""
    lowering.used("conv amx")
    threads = threads_of(lowering)
    return lowering.const(arr, transform=lambda v: pairs_weights(np.asarray(v, np.float32), threads), tag="P16",
                          dtype="uint16", ggml_type="GGML_TYPE_BF16")


def pairs_count(c: int) -> int:
    """Channel pairs of ``c`` input channels in the conv's "pairs" case: ceil(c / 2) rounded up to 16 (a tile's)."""
    return -(-c // 32) * 16


def pairs_weights(w: np.ndarray, threads: int | None = None) -> np.ndarray:
    """A kernel (OC, C, KH, KW) as bf16 bit patterns [OC16][tap][C2][2] (``pairs_count`` pairs, zeros past C; rows
    past OC zero up to a multiple of 16): ``sdrt_conv_op``'s W with ``conv_params(bf16=2)`` (native/amx_conv.c)."""
    w = np.require(w, np.float32, ["C", "A"])
    oc, c, kh, kw = w.shape
    c2 = pairs_count(c)
    out = aligned_empty((-(-oc // 16) * 16, kh * kw * 2 * c2), np.uint16)
    fn = _lib().sdrt_pairs_weights
    _in_parts(out.shape[0] // 16, oc * c * kh * kw, lambda b0, b1: fn(
        w[16 * b0:16 * b1].ctypes.data, min(oc, 16 * b1) - 16 * b0, c, kh * kw, c2, out[16 * b0:16 * b1].ctypes.data),
        threads)
    return out


#: weights of at least this many values are laid out by several threads (ctypes lets the GIL go during each call)
PARTS_FROM = 1 << 20


def _in_parts(units: int, values: int, run: Any, threads: int | None = None) -> None:
    """``run(u0, u1)`` over ``[0, units)``: whole for a small weight, else split among up to ``threads`` (the
    compile's ``threads=``; by default ``_layout_threads()``) threads, at most ``_layout_threads()`` at once (a
    model's lowering lays out its weights one after another: 860M values in SD 1.5's UNet)."""
    threads = min(units, threads or _layout_threads()) if values >= PARTS_FROM else 1
    if threads <= 1:
        run(0, units)
        return
    bounds = [units * i // threads for i in range(threads + 1)]
    list(_layout_pool().map(lambda i: run(bounds[i], bounds[i + 1]), range(threads)))


def threads_of(lowering: Any) -> int | None:
    """The compile's ``threads=`` (the weights' layouts use no more threads than the model will), None when unset."""
    return int(lowering.options.get("threads") or 0) or None


@functools.cache
def _layout_threads() -> int:
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8))


#: (the process's id, its layout threads): a child forked after a layout has none of its parent's threads, so each
#: process makes its own rather than rely on a copied executor's bookkeeping
_LAYOUT_POOL: list[tuple[int, Any]] = []
_LAYOUT_LOCK = threading.Lock()  # two lowerings at once (a pipeline's parts compiled ahead) make one pool


def _layout_pool() -> Any:
    from concurrent.futures import ThreadPoolExecutor

    with _LAYOUT_LOCK:
        if not _LAYOUT_POOL or _LAYOUT_POOL[0][0] != os.getpid():
            _LAYOUT_POOL[:] = [(os.getpid(), ThreadPoolExecutor(_layout_threads(),
                                                                 thread_name_prefix="sdrt-ggml-layout"))]
        return _LAYOUT_POOL[0][1]


def _lib() -> ctypes.CDLL:
    """The native library, for the weight layouts (only lowerings that use the native kernels make them)."""
    n = native()
    if n is None:
        raise RuntimeError(f"sdrt-ggml's native kernels are not loaded ({unavailable_reason()})")
    return n.lib


def pair_pad_op(nat: Native, g: Any, ctx: Any, x: Any, params: Any, *, wp: int, hp: int, c2: int, n: int) -> Any:
    """``x`` (ne (W, H, C, N), contiguous) as bf16 channel pairs zero-padded into ne (2 wp, hp, c2, n) at (top, left) =
    ``params`` (int32[2]) by ``sdrt_pair_pad_op``: the input of the conv's "pairs" case."""
    arr = (ctypes.POINTER(g.ggml_tensor) * 2)(x, params)
    out = g.ggml_custom_4d(ctx, g.GGML_TYPE_BF16, 2 * wp, hp, c2, n, arr, 2, nat.pair_pad_op, g.GGML_N_TASKS_MAX, None)
    g.ggml_set_name(out, b"sdrt_pair_pad")
    return out


def row_stride(k: int, rows: int = 14) -> int:
    """Floats between rows of an A operand of K floats that the kernel reads in place: K, or K plus
    a multiple of 16 when rows K apart would crowd into a few L1 sets (row strides near a
    multiple of 4 KiB), as the GEMM driver's own copy does (native/gemm.c, a_aliases)."""
    ld = k
    while True:
        sets = [(i * ld * 4 // 64) % 64 for i in range(rows)]
        if max(sets.count(x) for x in sets) <= 4:
            return ld
        ld += 16


#: activations the conv's epilogue applies (``SDRT_ACT_*`` in native/sdrt_native.h)
ACTS = {"relu": 1, "clip": 2, "hardswish": 3, "silu": 4, "gelu_tanh": 5}


def conv_params(kh: int, kw: int, strides: Any, dil: Any, ph: int, pw: int, *, padded: int = 0,
                act: str | None = None, lo: float = 0.0, hi: float = 0.0, bf16: int = 0) -> np.ndarray:
    """``sdrt_conv_op``'s int32 params: [KH, KW, sh, sw, dh, dw, ph, pw, padded, act, lo, hi, bf16], the
    clip bounds as float32 bits; padded 1: x is ``pad_op``'s, 2: the cols route (W is ``pack_b``'s panels of W^T);
    bf16 1: W is ``bf16_rows``, 2: W is ``pairs_weights``, x ``pair_pad_op``'s."""
    bounds = np.array([lo, hi], np.float32).view(np.int32)
    return np.array([kh, kw, strides[0], strides[1], dil[0], dil[1], ph, pw, int(padded), ACTS.get(act or "", 0),
                     bounds[0], bounds[1], int(bf16)], np.int32)


def conv_op(nat: Native, g: Any, ctx: Any, x: Any, w: Any, params: Any, state: Any, bias: Any = None,
            rbias: Any = None, res: Any = None, cscale: Any = None, *, out_ne: tuple[int, int, int, int]) -> Any:
    """The ggml tensor of a group-1 2-D conv by ``sdrt_conv_op`` (contract in native/conv.c):
    ``x`` NCHW (ne (W, H, C, N), contiguous; the ``pad_op`` output when params say padded),
    ``w`` ne (ldw, OC) rows of the OIHW kernel, ``params`` from ``conv_params``, ``state`` a zeroed
    int32[4] of its own, ``bias`` OC floats, ``rbias`` a runtime per-channel bias ne (OC, N),
    ``res`` a residual shaped as the output, ``cscale`` a runtime scale per input channel ne (C, N)
    (each None or a tensor); ``out_ne`` (OW, OH, OC, N)."""
    null = ctypes.POINTER(g.ggml_tensor)()
    args = [x, w, params, state, bias or null, rbias or null, res or null, cscale or null]
    arr = (ctypes.POINTER(g.ggml_tensor) * len(args))(*args)
    out = g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, *out_ne, arr, len(args), nat.conv_op, g.GGML_N_TASKS_MAX, None)
    g.ggml_set_name(out, b"sdrt_conv")
    return out


def winograd_const(lowering: Any, w: np.ndarray, ld: int) -> Any:
    """A weights tensor of a 3x3 kernel as ``winograd_weights``, remade so by ``update_weights``; not held by the
    compile cache (16/9 the size of the kernel: remade from the model at each load, layout_cache.py)."""
    threads = threads_of(lowering)
    return lowering.const(w, transform=lambda a: winograd_weights(a, ld, threads), tag=f"wino{ld}", store=False)


def winograd_weights(w: np.ndarray, ld: int, threads: int | None = None) -> np.ndarray:
    """A 3x3 kernel (OC, C, 3, 3) as the 16 matrices U[k] = (G g G^T)[k // 4, k % 4], (16, OC, ld) with rows
    zero-padded to ``ld`` floats: what ``sdrt_winograd_op`` multiplies the transformed input by (native/pack.c,
    in double, rounded once; split by output channel among the layout threads)."""
    w = np.require(w, np.float32, ["C", "A"])
    oc, c = w.shape[:2]
    out = aligned_empty((16, oc, ld), np.float32)
    fn = _lib().sdrt_winograd_weights
    _in_parts(oc, w.size, lambda o0, o1: fn(w.ctypes.data, oc, c, ld, o0, o1, out.ctypes.data), threads)
    return out


def winograd_params(top: int, left: int, *, act: str | None = None, lo: float = 0.0, hi: float = 0.0) -> np.ndarray:
    """``sdrt_winograd_op``'s int32 params [top, left, act, lo, hi] (the clip bounds as float32 bits)."""
    bounds = np.array([lo, hi], np.float32).view(np.int32)
    return np.array([top, left, ACTS.get(act or "", 0), bounds[0], bounds[1]], np.int32)


def winograd_op(nat: Native, g: Any, ctx: Any, xp: Any, u: Any, params: Any, state: Any, bias: Any = None,
                rbias: Any = None, res: Any = None, *, out_ne: tuple[int, int, int, int]) -> Any:
    """A 3x3 stride-1 conv by ``sdrt_winograd_op`` (contract in native/winograd.c): ``xp`` the padded
    input, ``u`` ne (ld, OC, 16) from ``winograd_weights``, the rest as ``conv_op``."""
    null = ctypes.POINTER(g.ggml_tensor)()
    args = [xp, u, params, state, bias or null, rbias or null, res or null]
    arr = (ctypes.POINTER(g.ggml_tensor) * len(args))(*args)
    out = g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, *out_ne, arr, len(args), nat.winograd_op, g.GGML_N_TASKS_MAX, None)
    g.ggml_set_name(out, b"sdrt_winograd")
    return out


def pad_op(nat: Native, g: Any, ctx: Any, x: Any, params: Any, *, out_ne: tuple[int, int, int, int]) -> Any:
    """``x`` (ne (W, H, C, N), contiguous) zero-padded into ne ``out_ne`` at (top, left) = ``params``
    (int32[2]) by ``sdrt_pad_op``: the input of a direct conv."""
    arr = (ctypes.POINTER(g.ggml_tensor) * 2)(x, params)
    out = g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, *out_ne, arr, 2, nat.pad_op, g.GGML_N_TASKS_MAX, None)
    g.ggml_set_name(out, b"sdrt_pad")
    return out


def im2col_op(nat: Native, g: Any, ctx: Any, x: Any, params: Any, *, out_ne: tuple[int, int, int, int]) -> Any:
    """The patches of ``x`` (ne (W, H, C, N), contiguous) as ne ``out_ne`` (OW, OH, C*KH*KW, N) by ``sdrt_im2col_op``,
    ``params`` int32 [KH, KW, sh, sw, dh, dw, ph, pw]: the cols route's input for a kxk conv (native/im2col.c)."""
    arr = (ctypes.POINTER(g.ggml_tensor) * 2)(x, params)
    out = g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, *out_ne, arr, 2, nat.im2col_op, g.GGML_N_TASKS_MAX, None)
    g.ggml_set_name(out, b"sdrt_im2col")
    return out


def state_tensor(g: Any, ctx: Any) -> Any:
    """Zeroed int32[4] for ``gemm_op(state=...)`` in a context that holds its own data."""
    t = g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_I32, 4)
    ctypes.memset(g.ggml_get_data(t), 0, 16)
    return t


def lowering_state(lowering: Any) -> Any:
    """A zeroed int32[4] weights tensor for one GEMM op of a lowering (its threads' work counter)."""
    return lowering.const(np.zeros(4, np.int32)).ptr


def act_params(act: str | None, lo: float = 0.0, hi: float = 0.0) -> np.ndarray:
    """An epilogue's activation as int32 [act, lo, hi] (the floats as bits): ``gemm_op``'s ``act``."""
    bounds = np.array([lo, hi], np.float32).view(np.int32)
    return np.array([ACTS.get(act or "", 0), bounds[0], bounds[1]], np.int32)


def gemm_op(nat: Native, g: Any, ctx: Any, a: Any, b: Any, bias: Any = None, *, m: int, n: int, trans: bool = False,
            packed: bool = False, batch: tuple[int, int] = (1, 1), state: Any = None, res: Any = None,
            act: Any = None, bf16: bool = False) -> Any:
    """The ggml tensor of ``A . B [+ bias]`` computed by ``sdrt_gemm_op`` (contract in native/gemm.c).

    ``a``: ne (K, M, d2, d3), unit stride along K (rows may overlap). ``b``: packed panels
    (``pack_b``) with ``packed=True``, bf16 ones (``pack_b_bf16``) with ``bf16=True`` as well, else
    ne (N, K, e2, e3) with any strides. Output ne is
    (N, M, d2, d3), or (M, N, d2, d3) with ``trans``; ``res``, a tensor shaped as the output, is
    added to it (after ``bias``, N floats), then ``act`` (an ``act_params`` tensor) applied. ``state``: a zeroed int32[4] tensor that
    only this op uses; with it, the threads share out the work as they come (a thread held back
    by a busy machine does not hold up the others), without it each takes a fixed share."""
    args = [a, b] + ([bias] if bias is not None else []) + ([res] if res is not None else [])
    args += ([act] if act is not None else []) + ([state] if state is not None else [])
    arr = (ctypes.POINTER(g.ggml_tensor) * len(args))(*args)
    flags = (_TRANS if trans else 0) | (_PACKED if packed else 0) | (_BIAS if bias is not None else 0)
    flags |= (_SHARED if state is not None else 0) | (_RES if res is not None else 0) | (_ACT if act is not None else 0)
    flags |= _BF16 if bf16 else 0
    ne = (m, n) if trans else (n, m)
    out = g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, ne[0], ne[1], batch[0], batch[1], arr, len(args), nat.gemm_op,
                           g.GGML_N_TASKS_MAX, ctypes.c_void_p(flags or None))
    g.ggml_set_name(out, b"sdrt_gemm")  # what op_timing's profiles call it
    return out
