"""sdrt-ggml's native attention and GELU kernels (``plugin-ggml/native/ops.c``) as ggml custom ops.

They live in the same compiled library as the GEMM (``native.native()`` loads it and checks
ggml-python's tensor layout). Before first use they are checked once against numpy inside a
ggml graph (odd sizes, a mask, strided K); if the library is missing or a check fails,
``native_ops()`` returns None, logs why once, and the lowerings use ggml's own ops
(``ggml_flash_attn_ext``, ``ggml_gelu_erf``).

Environment: ``SDRT_GGML_OPS_ISA`` forces a kernel body (``portable``, ``avx2``, ``avx512``,
``neon``, or ``scalar``: the plain C code that compilers without vector extensions get).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .native import ISAS, native

log = logging.getLogger("sdrt.ggml.native")

#: ``sdrt_ops_set_isa`` ids: the GEMM's, plus the scalar code (``SDRT_ISA_COUNT``)
OPS_ISAS = {**ISAS, "scalar": 4}


@dataclass(frozen=True)
class NativeOps:
    """The custom-op callbacks of the attention and GELU kernels (kept alive for the process)."""

    lib: ctypes.CDLL
    attention_op: Any
    gelu_op: Any
    gn_stats_op: Any
    gn_apply_op: Any
    dwconv_op: Any
    rowmean_op: Any
    layer_norm_op: Any
    copy_op: Any
    concat_op: Any
    upscale_op: Any
    rope_op: Any

    def set_isa(self, name: str | None) -> str:
        """Use the kernel body ``name`` (None: the widest this CPU runs); returns the active one.
        Raises ValueError when this build or CPU lacks it."""
        got = self.lib.sdrt_ops_set_isa(-1 if name is None else OPS_ISAS.get(name, -2))
        if got < 0:
            raise ValueError(f"kernel body {name!r} is not available here (have: {', '.join(self.available_isas())})")
        return {v: k for k, v in OPS_ISAS.items()}[got]

    def available_isas(self) -> list[str]:
        active = self.lib.sdrt_ops_active_isa()
        have = [n for n, i in OPS_ISAS.items() if self.lib.sdrt_ops_set_isa(i) >= 0]
        self.lib.sdrt_ops_set_isa(active)
        return have


_REASON: list[str] = []


def unavailable_reason() -> str | None:
    """Why the attention and GELU kernels are not used (None when they are)."""
    native_ops()
    return _REASON[0] if _REASON else None


@functools.cache
def native_ops() -> NativeOps | None:
    """The kernels, or None (the reason logged once)."""
    nat = native()
    if nat is None:
        _REASON.append("the native library is not loaded (see the sdrt.ggml.native log)")
        return None
    try:
        from .bindings import ggml_lib

        g = ggml_lib()
        lib = nat.lib
        lib.sdrt_ops_set_isa.argtypes = [ctypes.c_int]
        lib.sdrt_ops_set_isa.restype = ctypes.c_int
        lib.sdrt_ops_active_isa.restype = ctypes.c_int
        ops = NativeOps(lib, *(g.ggml_custom_op_t(ctypes.cast(getattr(lib, f), ctypes.c_void_p).value)
                               for f in ("sdrt_attention_op", "sdrt_gelu_erf_op", "sdrt_gn_stats_op",
                                         "sdrt_gn_apply_op", "sdrt_dwconv_op", "sdrt_rowmean_op",
                                         "sdrt_layer_norm_op", "sdrt_copy_op", "sdrt_concat_op",
                                         "sdrt_upscale_op", "sdrt_rope_op")))
        ops.set_isa(os.environ.get("SDRT_GGML_OPS_ISA") or None)
        why = _self_test(ops, g)
    except (OSError, AttributeError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    if why:
        _REASON.append(why)
        log.warning("sdrt-ggml native attention/GELU kernels not used (%s); using ggml's own", why)
        return None
    return ops


@functools.cache
def _scale_arg(scale: float) -> ctypes.c_float:
    """The userdata of a layer norm (its eps): one float per distinct value, alive for the process."""
    return ctypes.c_float(scale)


class AttnParams(ctypes.Structure):
    """``sdrt_attn_params`` (native/sdrt_ops.h)."""

    _fields_ = [("scale", ctypes.c_float), ("bf16", ctypes.c_int32)]


@functools.cache
def _attn_arg(scale: float, bf16: bool) -> AttnParams:
    """The userdata of an attention op: one per distinct (scale, bf16), alive for the process."""
    return AttnParams(scale, int(bf16))


def attention(ops: NativeOps, g: Any, ctx: Any, q: Any, k: Any, v: Any, mask: Any, scale: float,
              bf16: bool = False) -> Any:
    """softmax(Q K^T * scale + mask) V. ``q`` ne (D, n_q, H, B), ``k`` ne (D, n_kv, H, B),
    ``v`` ne (Dv, n_kv, H, B), any strides; ``mask`` None or float32 ne (n_kv, n_q or 1), dense
    rows. Result ne (Dv, H, n_q, B), the layout of ``ggml_flash_attn_ext``. ``bf16``: the products may take
    bf16-rounded operands (``precision="bf16"``): on AMX tiles where the CPU has them and there is no mask
    (``native/amx_attention.c``), in float32 otherwise."""
    qn, vn = q.contents.ne, v.contents.ne
    args = [q, k, v] + ([mask] if mask is not None else [])
    arr = (ctypes.POINTER(g.ggml_tensor) * len(args))(*args)
    ud = ctypes.cast(ctypes.pointer(_attn_arg(float(scale), bool(bf16))), ctypes.c_void_p)
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, vn[0], qn[2], qn[1], qn[3], arr, len(args),
                                      ops.attention_op, g.GGML_N_TASKS_MAX, ud), "sdrt_attention")


def gelu_erf(ops: NativeOps, g: Any, ctx: Any, x: Any, gate: Any = None) -> Any:
    """0.5 x (1 + erf(x / sqrt 2)) [* gate]; ``x`` (and ``gate``, same shape) float32 with dense rows
    (nb[0] = 4; the rows themselves may be strided, e.g. slices of one wider tensor). Result dense."""
    args = [x] + ([gate] if gate is not None else [])
    arr = (ctypes.POINTER(g.ggml_tensor) * len(args))(*args)
    ne = x.contents.ne
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, ne[0], ne[1], ne[2], ne[3], arr, len(args), ops.gelu_op,
                                      g.GGML_N_TASKS_MAX, None), "sdrt_gelu")


class GnParams(ctypes.Structure):
    """``sdrt_gn_params`` (native/sdrt_ops.h)."""

    _fields_ = [("groups", ctypes.c_int32), ("silu", ctypes.c_int32), ("cl", ctypes.c_int32), ("eps", ctypes.c_float),
                ("pad", ctypes.c_int32), ("W", ctypes.c_int32), ("top", ctypes.c_int32), ("left", ctypes.c_int32)]


@functools.cache
def _gn_arg(groups: int, silu: bool, cl: bool, eps: float, pad: tuple[int, int, int] | None = None) -> GnParams:
    """The userdata of a group-norm op: one per distinct parameter set, alive for the process.
    ``pad``: (W, top, left) of a padded output."""
    w, top, left = pad or (0, 0, 0)
    return GnParams(groups, int(silu), int(cl), eps, int(pad is not None), w, top, left)


def _ud(p: Any) -> ctypes.c_void_p:
    return ctypes.cast(ctypes.pointer(p), ctypes.c_void_p)


def gn_stats(ops: NativeOps, g: Any, ctx: Any, x: Any, groups: int, eps: float) -> Any:
    """Mean and 1/sqrt(var + eps) per group: ``x`` dense float32 ne (HW, C, N) -> ne (2, G, N)."""
    arr = (ctypes.POINTER(g.ggml_tensor) * 1)(x)
    n = x.contents.ne[2]
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, 2, groups, n, 1, arr, 1, ops.gn_stats_op,
                                      g.GGML_N_TASKS_MAX, _ud(_gn_arg(groups, False, False, eps))), "sdrt_gn_stats")


def gn_apply(ops: NativeOps, g: Any, ctx: Any, x: Any, stats: Any, gamma: Any, beta: Any, groups: int, *,
             silu: bool, cl: bool, pad: tuple[int, int, int, int, int] | None = None) -> Any:
    """act((x - mean) * rstd * gamma + beta) from ``gn_stats``; gamma/beta: C floats or None.
    Result ne (HW, C, N), or channels-last ne (C, HW) with ``cl`` (N must be 1), or with ``pad`` =
    (W, top, left, Wp, Hp) each plane's W-wide rows at (top, left) of zero-padded ne (Wp, Hp, C, N):
    the input of a direct conv."""
    ne = x.contents.ne
    # ggml_custom_4d takes a fixed source count: absent gamma/beta are passed as NULL sources
    args = [x, stats, gamma, beta]
    arr = (ctypes.POINTER(g.ggml_tensor) * 4)(*[a if a is not None else ctypes.POINTER(g.ggml_tensor)() for a in args])
    if pad is not None:
        shape = (pad[3], pad[4], ne[1], ne[2])
    else:
        shape = (ne[1], ne[0], 1, 1) if cl else (ne[0], ne[1], ne[2], 1)
    ud = _gn_arg(groups, silu, cl and pad is None, 0.0, None if pad is None else tuple(pad[:3]))
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, *shape, arr, 4, ops.gn_apply_op, g.GGML_N_TASKS_MAX,
                                      _ud(ud)), "sdrt_group_norm")


def rowmean(ops: NativeOps, g: Any, ctx: Any, x: Any) -> Any:
    """The mean of each row of ``x`` (ne (n, r1, r2, r3), dense rows): ne (1, r1, r2, r3). ggml's mean op
    runs on one thread with a scalar loop; global average pooling calls it on every channel."""
    ne = x.contents.ne
    arr = (ctypes.POINTER(g.ggml_tensor) * 1)(x)
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, 1, ne[1], ne[2], ne[3], arr, 1, ops.rowmean_op,
                                      g.GGML_N_TASKS_MAX, None), "sdrt_rowmean")


def layer_norm(ops: NativeOps, g: Any, ctx: Any, x: Any, gamma: Any, beta: Any, eps: float) -> Any:
    """(x - mean) / sqrt(var + eps) * gamma + beta over each row of ``x`` (ne0 floats, dense rows, any
    row strides); ``gamma`` and ``beta`` dense, ne0 floats each. Result shaped as ``x``, dense. ggml's
    norm is a scalar loop, and the scale and bias are two more ops."""
    ne = x.contents.ne
    arr = (ctypes.POINTER(g.ggml_tensor) * 3)(x, gamma, beta)
    ud = ctypes.cast(ctypes.pointer(_scale_arg(float(eps))), ctypes.c_void_p)
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, ne[0], ne[1], ne[2], ne[3], arr, 3, ops.layer_norm_op,
                                      g.GGML_N_TASKS_MAX, ud), "sdrt_layer_norm")


def rope(ops: NativeOps, g: Any, ctx: Any, x: Any, cos: Any, sin: Any) -> Any:
    """The rotary embedding of interleaved pairs: ``x cos + rot(x) sin``, rot(x) = (-x1, x0, -x3, x2, ...)
    along each row. ``x`` float32 with dense rows of an even ne0 (any row strides); ``cos`` and ``sin``
    dense rows of the same ne0, each of dims 1-3 either ``x``'s or 1. Result shaped as ``x``, dense."""
    ne = x.contents.ne
    arr = (ctypes.POINTER(g.ggml_tensor) * 3)(x, cos, sin)
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, ne[0], ne[1], ne[2], ne[3], arr, 3, ops.rope_op,
                                      g.GGML_N_TASKS_MAX, None), "sdrt_rope")


def reference_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """numpy, as the export computes it: x cos + stack(-x_odd, x_even) sin."""
    rot = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
    return x.astype(np.float64) * cos + rot.astype(np.float64) * sin


def copy(ops: NativeOps, g: Any, ctx: Any, x: Any) -> Any:
    """``x`` (float32, any strides: a permuted or sliced view) copied dense, as ``ggml_cont`` does
    (native/copy.c: rows, or tiles transposed where the source's dense dim is not its first)."""
    ne = x.contents.ne
    arr = (ctypes.POINTER(g.ggml_tensor) * 1)(x)
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, ne[0], ne[1], ne[2], ne[3], arr, 1, ops.copy_op,
                                      g.GGML_N_TASKS_MAX, None), "sdrt_copy")


def concat(ops: NativeOps, g: Any, ctx: Any, a: Any, b: Any, dim: int) -> Any:
    """``a`` and ``b`` (float32, any strides, equal outside ggml dim ``dim``) joined along it, dense."""
    ne = list(a.contents.ne)
    ne[dim] += b.contents.ne[dim]
    arr = (ctypes.POINTER(g.ggml_tensor) * 2)(a, b)
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, *ne, arr, 2, ops.concat_op, g.GGML_N_TASKS_MAX,
                                      ctypes.c_void_p(dim or None)), "sdrt_concat")


def upscale(ops: NativeOps, g: Any, ctx: Any, x: Any, ne: tuple[int, int, int, int]) -> Any:
    """``x`` (float32, dense rows) upscaled to ``ne`` by nearest neighbour, as ggml's nearest mode:
    whole factors along ne0 and ne1, ne2 and ne3 unchanged."""
    arr = (ctypes.POINTER(g.ggml_tensor) * 1)(x)
    return _named(g, g.ggml_custom_4d(ctx, g.GGML_TYPE_F32, *ne, arr, 1, ops.upscale_op, g.GGML_N_TASKS_MAX, None),
                  "sdrt_upscale")


def dwconv(ops: NativeOps, g: Any, ctx: Any, x: Any, w: Any, params: Any, bias: Any, *,
           out_ne: tuple[int, int, int, int], pairs: bool = False) -> Any:
    """Depthwise conv by ``sdrt_dwconv_op`` (contract in native/dwconv.c): ``x`` NCHW ne (W, H, C, N)
    contiguous, ``w`` ne (KH*KW, C), ``params`` int32 [KH, KW, sh, sw, dh, dw, ph, pw, act, lo, hi, pairs, top,
    left] (``dw_params``), ``bias`` C floats or None; ``out_ne`` (OW, OH, C, N) float32, or with ``pairs`` (params
    with ``pairs=(top, left)``) (2 Wp, Hp, C2, N) 16-bit: bf16 channel pairs as ``sdrt_pair_pad_op`` writes them."""
    args = [x, w, params, bias if bias is not None else ctypes.POINTER(g.ggml_tensor)()]
    arr = (ctypes.POINTER(g.ggml_tensor) * 4)(*args)
    kind = g.GGML_TYPE_BF16 if pairs else g.GGML_TYPE_F32
    return _named(g, g.ggml_custom_4d(ctx, kind, *out_ne, arr, 4, ops.dwconv_op, g.GGML_N_TASKS_MAX, None),
                  "sdrt_dwconv")


def dw_params(kh: int, kw: int, strides: Any, dil: Any, ph: int, pw: int, *, act: str | None = None, lo: float = 0.0,
              hi: float = 0.0, pairs: tuple[int, int] | None = None) -> np.ndarray:
    """``sdrt_dwconv_op``'s int32 params (the clip bounds as float32 bits); ``pairs``: the output written as bf16
    channel pairs with the image at (top, left)."""
    from .native import ACTS

    bounds = np.array([lo, hi], np.float32).view(np.int32)
    top, left = pairs or (0, 0)
    return np.array([kh, kw, strides[0], strides[1], dil[0], dil[1], ph, pw, ACTS.get(act or "", 0), bounds[0],
                     bounds[1], int(pairs is not None), top, left], np.int32)


def _named(g: Any, t: Any, name: str) -> Any:
    g.ggml_set_name(t, name.encode())  # what op_timing's profiles call the op
    return t


def reference_group_norm(x: np.ndarray, groups: int, eps: float, gamma: np.ndarray | None,
                         beta: np.ndarray | None, silu: bool) -> np.ndarray:
    """numpy: x (N, C, ...) -> the same shape."""
    n, c = x.shape[:2]
    xg = x.astype(np.float64).reshape(n, groups, -1)
    y = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + eps)).reshape(x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if gamma is not None:
        y = y * gamma.reshape(bshape)
    if beta is not None:
        y = y + beta.reshape(bshape)
    return y / (1 + np.exp(-y)) if silu else y


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                        scale: float) -> np.ndarray:
    """numpy: q (..., n_q, D), k (..., n_kv, D), v (..., n_kv, Dv) -> (..., n_q, Dv)."""
    s = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) * scale
    if mask is not None:
        s = s + mask
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return (s / s.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def reference_gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x.astype(np.float64) / math.sqrt(2.0)))


def reference_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """numpy: normalise over the last axis."""
    x64 = x.astype(np.float64)
    m = x64.mean(-1, keepdims=True)
    return (x64 - m) / np.sqrt(((x64 - m) ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


def _self_test(ops: NativeOps, g: Any) -> str | None:
    """Attention (odd sizes, a mask, K read through a transposed view), GELU and the layer norm (a
    large mean, an odd width), by ggml's graph compute."""
    from .native import _tensor

    rng = np.random.default_rng(0)
    b, h, n_q, n_kv, d, dv = 1, 3, 7, 37, 5, 9
    q = rng.standard_normal((b, h, n_q, d)).astype(np.float32)
    k = rng.standard_normal((b, h, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((b, h, n_kv, dv)).astype(np.float32)
    mask = np.triu(np.full((n_q, n_kv), -np.inf, np.float32), 30)
    x = rng.standard_normal(1000).astype(np.float32) * 4
    xl = (rng.standard_normal((5, 37)) * 3 + 100).astype(np.float32)
    gam, bet = rng.standard_normal(37).astype(np.float32), rng.standard_normal(37).astype(np.float32)
    ctx = g.ggml_init(g.ggml_init_params(mem_size=1 << 22, mem_buffer=None, no_alloc=False))
    try:
        tk = _tensor(g, ctx, np.ascontiguousarray(np.swapaxes(k, -1, -2)))  # K^T dense: read K through a view
        kview = g.ggml_permute(ctx, tk, 1, 0, 2, 3)
        y = attention(ops, g, ctx, _tensor(g, ctx, q), kview, _tensor(g, ctx, v), _tensor(g, ctx, mask), 0.7)
        ge = gelu_erf(ops, g, ctx, _tensor(g, ctx, x))
        ln = layer_norm(ops, g, ctx, _tensor(g, ctx, xl), _tensor(g, ctx, gam), _tensor(g, ctx, bet), 1e-5)
        cp = copy(ops, g, ctx, g.ggml_permute(ctx, _tensor(g, ctx, v), 1, 0, 2, 3))  # (b, h, dv, n_kv) dense
        cat = concat(ops, g, ctx, _tensor(g, ctx, k), _tensor(g, ctx, v), 0)  # (b, h, n_kv, d + dv)
        up = upscale(ops, g, ctx, _tensor(g, ctx, xl), (37 * 2, 5 * 3, 1, 1))
        xr = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
        cs, sn = rng.standard_normal((2, 1, 4, 6)).astype(np.float32), rng.standard_normal((1, 3, 1, 6)).astype(np.float32)
        ro = rope(ops, g, ctx, _tensor(g, ctx, xr), _tensor(g, ctx, cs), _tensor(g, ctx, sn))
        gf = g.ggml_new_graph(ctx)
        for t in (y, ge, ln, cp, cat, up, ro):
            g.ggml_build_forward_expand(gf, t)
        g.ggml_graph_compute_with_ctx(ctx, gf, 2)
        got = _array(g, y, (b, n_q, h, dv)).transpose(0, 2, 1, 3)
        want = reference_attention(q, k, v, mask, 0.7)
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
            return f"attention max error {float(np.abs(got - want).max()):.3g}"
        gg, gw = _array(g, ge, x.shape), reference_gelu(x)
        if not np.allclose(gg, gw, rtol=1e-4, atol=1e-6):
            return f"GELU max error {float(np.abs(gg - gw).max()):.3g}"
        lg, lw = _array(g, ln, xl.shape), reference_layer_norm(xl, gam, bet, 1e-5)
        if not np.allclose(lg, lw, rtol=1e-4, atol=1e-5):
            return f"layer norm max error {float(np.abs(lg - lw).max()):.3g}"
        if not np.array_equal(_array(g, cp, (b, h, dv, n_kv)), np.swapaxes(v, -1, -2)):
            return "the transposed copy differs"
        if not np.array_equal(_array(g, cat, (b, h, n_kv, d + dv)), np.concatenate([k, v], -1)):
            return "the concatenation differs"
        if not np.array_equal(_array(g, up, (15, 74)), xl.repeat(3, 0).repeat(2, 1)):
            return "the nearest upscale differs"
        rg, rw = _array(g, ro, xr.shape), reference_rope(xr, cs, sn)
        if not np.allclose(rg, rw, rtol=1e-5, atol=1e-6):
            return f"rotary embedding max error {float(np.abs(rg - rw).max()):.3g}"
    finally:
        g.ggml_free(ctx)
    return None


def _array(g: Any, t: Any, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    ptr = ctypes.cast(g.ggml_get_data(t), ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(ptr, shape=(n,)).reshape(shape).copy()
