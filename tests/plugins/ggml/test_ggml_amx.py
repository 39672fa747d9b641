"""sdrt-ggml's bf16 products on AMX tiles (native/amx.c): the GEMM op and the packed conv op at bf16, against the
float64 product of the bf16-rounded operands (the products of bf16 values are exact in float32, so only the
float32 sums differ: within 1e-5 of the sum of the absolute terms), and against the vdpbf16ps kernels they replace.
Shapes with row tails (M past a multiple of 16 and 32), pair tails (K2 past a multiple of 16), odd K, several
blocks of K, column tails, and the epilogue (bias, row bias, residual, activations, transposed output)."""

from __future__ import annotations

import ctypes

import ggml
import numpy as np
import pytest

from sdrt_ggml import native


@pytest.fixture(scope="module")
def nat():
    n = native.native()
    assert n is not None, f"native kernels not loaded: {native.unavailable_reason()}"
    if not n.amx_available:
        pytest.skip(
            "no AMX-BF16 tiles here (CPU without AMX-TILE/AMX-BF16, an OS that does not grant them, or a "
            "build without AMX support): the bf16 products run on vdpbf16ps or widen to float32"
        )
    n.set_isa(None)
    yield n
    n.set_amx(None)


def _act(name: str | None, v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    if name == "relu":
        return np.maximum(v, 0)
    if name == "clip":
        return np.clip(v, lo, hi)
    if name == "silu":
        return v / (1 + np.exp(-lo * v))
    if name == "gelu_tanh":
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))
    return v


def _within(got: np.ndarray, ref: np.ndarray, mag: np.ndarray, what: str) -> None:
    err = np.abs(got.astype(np.float64) - ref) / (1e-5 * (1 + mag))
    assert np.isfinite(got).all() and err.max() <= 1.0, f"{what}: {err.max():.3g} x the bound"


def _run(nat, outs, threads: int, ctx, amx: bool) -> list[np.ndarray]:
    assert nat.set_amx(amx) == amx
    assert nat.bf16_kernel_name == ("amx-bf16" if amx else "avx512bf16")
    gf = ggml.ggml_new_graph(ctx)
    for t, _ in outs:
        ggml.ggml_build_forward_expand(gf, t)
    ggml.ggml_graph_compute_with_ctx(ctx, gf, threads)
    return [
        np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(t), ctypes.POINTER(ctypes.c_float)), shape=shape).copy()
        for t, shape in outs
    ]


GEMM_SHAPES = [
    (1, 1, 1),
    (16, 32, 32),
    (32, 64, 64),
    (33, 40, 37),
    (47, 70, 67),
    (31, 33, 1031),
    (77, 100, 768),
    (130, 64, 600),
    (5, 17, 3),
]


@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
@pytest.mark.parametrize("trans", [False, True])
def test_gemm_on_tiles_matches_the_rounded_product(nat, m, n, k, trans):
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((n, m) if trans else (m, n)).astype(np.float32)
    ar, wr = native.bf16_round(a).astype(np.float64), native.bf16_round(w).astype(np.float64)
    prod, mag = ar @ wr.T, np.abs(ar) @ np.abs(wr).T + np.abs(bias)
    acts = [(None, 0.0, 0.0), ("relu", 0.0, 0.0), ("clip", -0.5, 0.7), ("silu", 1.702, 0.0), ("gelu_tanh", 0.0, 0.0)]
    g = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 << 20, mem_buffer=None, no_alloc=False))
    try:
        ta, tb = native._tensor(ggml, g, a), native._tensor(ggml, g, bias)
        tw = native._tensor(ggml, g, native.pack_b_bf16(w), dtype=np.uint16)
        tr = native._tensor(ggml, g, res)
        outs = []
        for i, (act, lo, hi) in enumerate(acts):
            # every other op with the residual, the last without the bias
            ops = dict(
                res=tr if i % 2 else None,
                act=native._tensor(ggml, g, native.act_params(act, lo, hi), np.int32) if act else None,
            )
            y = native.gemm_op(
                nat,
                ggml,
                g,
                ta,
                tw,
                tb if i < 4 else None,
                m=m,
                n=n,
                trans=trans,
                packed=True,
                bf16=True,
                state=native.state_tensor(ggml, g),
                **ops,
            )
            outs.append((y, (n, m) if trans else (m, n)))
        for threads in (1, 3):
            got = _run(nat, outs, threads, g, amx=True)
            dp = _run(nat, outs, threads, g, amx=False)
            for i, (act, lo, hi) in enumerate(acts):
                pre = prod + (bias if i < 4 else 0) + ((res.T if trans else res) if i % 2 else 0)
                mg = mag + (np.abs(res.T if trans else res) if i % 2 else 0)
                g_amx, g_dp = (x.T if trans else x for x in (got[i], dp[i]))
                _within(g_amx, _act(act, pre, lo, hi), mg, f"amx act={act} threads={threads}")
                _within(g_amx, g_dp.astype(np.float64), mg, f"amx vs vdpbf16ps act={act} threads={threads}")
    finally:
        ggml.ggml_free(g)


def _im2col(x: np.ndarray, kh: int, kw: int, s: int, p: int, d: int) -> tuple[np.ndarray, int, int]:
    """x (C, H, W) -> (C kh kw, OH OW) in (c, i, j) order (float64)."""
    c, h, w = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - d * (kh - 1) - 1) // s + 1, (w + 2 * p - d * (kw - 1) - 1) // s + 1
    cols = np.empty((c, kh, kw, oh, ow))
    for i in range(kh):
        for j in range(kw):
            cols[:, i, j] = xp[:, i * d : i * d + s * (oh - 1) + 1 : s, j * d : j * d + s * (ow - 1) + 1 : s]
    return cols.reshape(c * kh * kw, oh * ow), oh, ow


def _conv_expected(wr, col, shape, bias, rbias=None, res=None):
    """W . columns + bias (+ row bias and residual) in float64 as ``shape`` (OC, OH, OW), and the sum of the absolute
    terms."""
    pre = (wr @ col).reshape(shape) + bias[:, None, None]
    mag = (np.abs(wr) @ np.abs(col)).reshape(shape) + np.abs(bias)[:, None, None]
    if rbias is not None:
        pre = pre + rbias[:, None, None] + res
        mag = mag + np.abs(rbias)[:, None, None] + np.abs(res)
    return pre, mag


CONV_SHAPES = [  # C, H, W, OC, k, stride, pad, dilation
    (3, 9, 11, 33, 3, 1, 1, 1),  # K 27: pairs all in the tail; OC one row past 32
    (5, 6, 7, 16, 1, 1, 0, 1),  # pointwise, odd K
    (20, 10, 9, 70, 3, 2, 1, 1),  # stride 2, K 180 (90 pairs: 5 whole steps and a tail), OC 70
    (64, 8, 8, 48, 3, 1, 2, 2),  # dilated, K 576: two blocks of K
    (40, 5, 13, 130, 1, 1, 0, 1),  # pointwise, 65 pixels (a panel of one), 130 rows (8 whole tiles and 2)
    (15, 6, 6, 17, 3, 1, 1, 1),  # K 135: one block converted 64 rows at a time, the last chunk odd (7 rows)
    (63, 5, 6, 300, 3, 1, 1, 1),  # K 567: two blocks (the second odd, 283 rows), 300 rows in M blocks off 16
]


@pytest.mark.parametrize("c,h,w,oc,k,s,p,d", CONV_SHAPES)
def test_packed_conv_on_tiles_matches_the_rounded_product(nat, c, h, w, oc, k, s, p, d):
    rng = np.random.default_rng(c * 1000 + oc)
    n = 2
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c * k * k)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    rbias = rng.standard_normal((n, oc)).astype(np.float32)
    wr = native.bf16_round(wt).astype(np.float64)
    cols = [_im2col(native.bf16_round(x[i]), k, k, s, p, d) for i in range(n)]
    oh, ow = cols[0][1], cols[0][2]
    res = rng.standard_normal((n, oc, oh, ow)).astype(np.float32)
    cases = [(None, 0.0, 0.0, False), ("relu", 0.0, 0.0, True), ("silu", 1.0, 0.0, True), ("clip", -0.5, 0.7, False)]
    g = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 << 20, mem_buffer=None, no_alloc=False))
    try:
        tx = native._tensor(ggml, g, x)
        tw = native._tensor(ggml, g, native.bf16_rows(wt), dtype=np.uint16)
        tb, trb, tres = (native._tensor(ggml, g, v) for v in (bias, rbias, res))
        outs = []
        for act, lo, hi, extra in cases:
            prm = native._tensor(
                ggml, g, native.conv_params(k, k, (s, s), (d, d), p, p, act=act, lo=lo, hi=hi, bf16=True), np.int32
            )
            y = native.conv_op(
                nat,
                ggml,
                g,
                tx,
                tw,
                prm,
                native.state_tensor(ggml, g),
                tb,
                trb if extra else None,
                tres if extra else None,
                out_ne=(ow, oh, oc, n),
            )
            outs.append((y, (n, oc, oh, ow)))
        for threads in (1, 2):
            got = _run(nat, outs, threads, g, amx=True)
            dp = _run(nat, outs, threads, g, amx=False)
            for (act, lo, hi, extra), ga, gd in zip(cases, got, dp):
                for i in range(n):
                    more = (rbias[i], res[i]) if extra else ()
                    pre, mag = _conv_expected(wr, cols[i][0], (oc, oh, ow), bias, *more)
                    _within(ga[i], _act(act, pre, lo, hi), mag, f"amx act={act} item={i} threads={threads}")
                    _within(ga[i], gd[i].astype(np.float64), mag, f"amx vs vdpbf16ps act={act} threads={threads}")
    finally:
        ggml.ggml_free(g)


def test_environment_switch_turns_tiles_off(nat):
    """``SDRT_GGML_AMX=0`` (read again with ``set_amx(None)``): the vdpbf16ps kernels; unset: the tiles."""
    import os

    old = os.environ.get("SDRT_GGML_AMX")
    try:
        os.environ["SDRT_GGML_AMX"] = "0"
        assert not nat.set_amx(None) and nat.bf16_kernel_name == "avx512bf16"
        del os.environ["SDRT_GGML_AMX"]
        assert nat.set_amx(None) and nat.bf16_kernel_name == "amx-bf16"
    finally:
        if old is not None:
            os.environ["SDRT_GGML_AMX"] = old
        nat.set_amx(None)
