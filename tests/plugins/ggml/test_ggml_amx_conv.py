"""sdrt-ggml's bf16 conv on AMX tiles without packing (native/amx_conv.c: the input as bf16 channel pairs by the pair
pad op, B tiles read where they lie, the kernel as [OC][tap][C2][2]) against the float64 conv of the bf16-rounded
input and kernel (the products of bf16 values are exact in float32: within 1e-5 of the sum of the absolute terms),
with the tiles on and off (the op's scalar loop). Shapes with odd C and C not a multiple of 32, OC not a multiple of
32 or 16, maps narrower than a tile and wide ones, 1x1 and 3x3, dilation, pads 0 and 1, batch 2, the epilogue (bias,
row bias, residual, activations), 1 and 3 threads; and a bf16 ONNX Conv compiled by the ggml backend."""

from __future__ import annotations

import ggml
import numpy as np
import pytest
import test_ggml_amx
from ggml_helpers import F, compile_ggml, make_model, rand
from onnx import helper
from test_ggml_amx import _act, _conv_expected, _im2col, _run, _within

from sdrt_ggml import native

nat = test_ggml_amx.nat  # the fixture: the native kernels with AMX, skipped without


def _pairs_conv(g, nat, tx, x_shape, wt, k, p, d, bias, rbias, res, act, lo, hi):
    """The pair pad op and the conv op on it, as the lowering emits them (conv_kernels.conv_pairs)."""
    n, c, h, w = x_shape
    wp = w + 2 * p
    hp = h + 2 * p + -(-16 // wp)
    oh, ow = h + 2 * p - d * (k - 1), w + 2 * p - d * (k - 1)
    tl = native._tensor(ggml, g, np.array([p, p], np.int32), np.int32)
    src = native.pair_pad_op(nat, ggml, g, tx, tl, wp=wp, hp=hp, c2=native.pairs_count(c), n=n)
    prm = native._tensor(
        ggml, g, native.conv_params(k, k, (1, 1), (d, d), p, p, act=act, lo=lo, hi=hi, bf16=2), np.int32
    )
    oc = wt.shape[0]
    tw = native._tensor(ggml, g, native.pairs_weights(wt), dtype=np.uint16)
    y = native.conv_op(
        nat, ggml, g, src, tw, prm, native.state_tensor(ggml, g), bias, rbias, res, out_ne=(ow, oh, oc, n)
    )
    return y, (n, oc, oh, ow)


PAIRS_SHAPES = [  # C, H, W, OC, k, pad, dilation
    (32, 8, 8, 16, 3, 1, 1),  # one step of 16 pairs, a map narrower than a tile (3 output rows a tile)
    (33, 8, 8, 40, 3, 1, 1),  # odd C (17 pairs: a second step mostly zeros), OC 40 (a half-used row tile)
    (70, 9, 13, 48, 3, 0, 1),  # C off 32, no pads, three row tiles (a pair and one)
    (64, 11, 10, 33, 3, 1, 2),  # dilated, OC one past 32
    (48, 64, 64, 32, 3, 1, 1),  # a wide map: a tile within an output row, runs across the row ends
    (96, 8, 8, 20, 1, 0, 1),  # pointwise
    (35, 64, 64, 17, 1, 0, 1),  # pointwise, wide, odd C and OC
    (40, 7, 7, 24, 1, 0, 1),  # pointwise on 49 pixels: a tile of one pixel last, a row tile of 8 rows
    (40, 5, 3, 64, 3, 1, 1),  # rows of 5 padded pixels: four output rows a tile
]


@pytest.mark.parametrize("c,h,w,oc,k,p,d", PAIRS_SHAPES)
def test_pairs_conv_matches_the_rounded_conv(nat, c, h, w, oc, k, p, d):
    rng = np.random.default_rng(c * 1000 + oc + h)
    n = 2
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((oc, c, k, k)).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    rbias = rng.standard_normal((n, oc)).astype(np.float32)
    wr = native.bf16_round(wt).reshape(oc, -1).astype(np.float64)
    cols = [_im2col(native.bf16_round(x[i]), k, k, 1, p, d) for i in range(n)]
    oh, ow = cols[0][1], cols[0][2]
    res = rng.standard_normal((n, oc, oh, ow)).astype(np.float32)
    cases = [(None, 0.0, 0.0, False), ("relu", 0.0, 0.0, True), ("silu", 1.0, 0.0, True), ("clip", -0.5, 0.7, False)]
    g = ggml.ggml_init(ggml.ggml_init_params(mem_size=256 << 20, mem_buffer=None, no_alloc=False))
    try:
        tx = native._tensor(ggml, g, x)
        tb, trb, tres = (native._tensor(ggml, g, v) for v in (bias, rbias, res))
        outs = []
        for act, lo, hi, extra in cases:
            outs.append(
                _pairs_conv(
                    g, nat, tx, x.shape, wt, k, p, d, tb, trb if extra else None, tres if extra else None, act, lo, hi
                )
            )
        for threads in (1, 3):
            for amx in (True, False):  # the tiles, and the op's scalar loop where they are off
                got = _run(nat, outs, threads, g, amx=amx)
                for (act, lo, hi, extra), ga in zip(cases, got):
                    for i in range(n):
                        more = (rbias[i], res[i]) if extra else ()
                        pre, mag = _conv_expected(wr, cols[i][0], (oc, oh, ow), bias, *more)
                        _within(ga[i], _act(act, pre, lo, hi), mag, f"amx={amx} act={act} item={i} threads={threads}")
    finally:
        ggml.ggml_free(g)


@pytest.mark.parametrize(
    "top,left,wp,hp",
    [(1, 2, 24, 6), (0, 0, 21, 5)],  # padded all round; no columns of padding (a 1x1 conv's: one run a plane)
)
def test_pair_pad_op_writes_rounded_pairs_and_zeros(top, left, wp, hp):
    """The pair pad op (AVX-512-BF16 where there are AMX tiles, else a scalar loop; no tiles needed): channel 2p at
    even, 2p + 1 at odd positions, bf16 rounded to nearest even, zeros around the image, past C (odd C: the last
    pair's second element) and past ceil(C / 2) pairs."""
    nat = native.native()
    assert nat is not None, f"native kernels not loaded: {native.unavailable_reason()}"
    rng = np.random.default_rng(5)
    n, c, h, w = 2, 5, 3, 21
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    g = ggml.ggml_init(ggml.ggml_init_params(mem_size=16 << 20, mem_buffer=None, no_alloc=False))
    try:
        tx = native._tensor(ggml, g, x)
        tl = native._tensor(ggml, g, np.array([top, left], np.int32), np.int32)
        y = native.pair_pad_op(nat, ggml, g, tx, tl, wp=wp, hp=hp, c2=4, n=n)
        gf = ggml.ggml_new_graph(g)
        ggml.ggml_build_forward_expand(gf, y)
        ggml.ggml_graph_compute_with_ctx(g, gf, 2)
        import ctypes

        got = np.ctypeslib.as_array(
            ctypes.cast(ggml.ggml_get_data(y), ctypes.POINTER(ctypes.c_uint16)), shape=(n, 4, hp, wp, 2)
        ).copy()
    finally:
        ggml.ggml_free(g)
    from sdrt_ggml.half import bf16_bits

    want = np.zeros((n, 8, hp, wp), np.float32)
    want[:, :c, top : top + h, left : left + w] = x
    want = want.reshape(n, 4, 2, hp, wp).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(got, bf16_bits(want))


def _conv_model(c: int, oc: int, k: int, pad: int, dil: int, hw: tuple[int, int]):
    """relu(conv(x, w) + b + r): the bias, the residual and the activation in the conv's epilogue."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, dilations=[dil, dil]),
        helper.make_node("Add", ["c", "r"], ["cr"]),
        helper.make_node("Relu", ["cr"], ["y"]),
    ]
    inits = {"w": rand(oc, c, k, k, seed=3) / np.sqrt(c * k * k), "b": rand(oc, seed=4)}
    out_hw = tuple(d + 2 * pad - dil * (k - 1) for d in hw)
    inputs = {"x": ((2, c) + hw, F), "r": ((2, oc) + out_hw, F)}
    return make_model(nodes, inputs, {"y": (None, F)}, inits), inits, out_hw


def _rounded_conv(x: np.ndarray, r: np.ndarray, w: np.ndarray, b: np.ndarray, k: int, pad: int, dil: int):
    """relu(conv(bf16(x), bf16(w)) + b + r) in float64, and the sum of the absolute terms."""
    wr = native.bf16_round(w).reshape(w.shape[0], -1).astype(np.float64)
    outs, mags = [], []
    for xi, ri in zip(x, r):
        col, oh, ow = _im2col(native.bf16_round(xi), k, k, 1, pad, dil)
        outs.append(np.maximum((wr @ col).reshape(-1, oh, ow) + b[:, None, None] + ri, 0))
        mags.append((np.abs(wr) @ np.abs(col)).reshape(-1, oh, ow) + np.abs(b)[:, None, None] + np.abs(ri))
    return np.stack(outs), np.stack(mags)


@pytest.mark.parametrize(
    "c,oc,k,pad,dil,hw", [(48, 40, 3, 1, 1, (12, 20)), (35, 24, 3, 2, 2, (9, 9)), (64, 32, 1, 0, 1, (8, 8))]
)
def test_bf16_onnx_conv_takes_the_pairs_route_and_new_weights(nat, c, oc, k, pad, dil, hw):
    """A bf16 Conv (+ bias, + ReLU fused into the epilogue) compiled by the ggml backend records "conv amx" and
    matches the rounded conv; update_weights writes a new kernel through the same layout."""

    class _Weights:
        def __init__(self, arrays):
            self.arrays = arrays

        def bind(self, graph):
            return dict(self.arrays)

    assert nat.set_amx(True)  # whatever SDRT_GGML_AMX says (the fixture reads it again after the module)
    model, inits, out_hw = _conv_model(c, oc, k, pad, dil, hw)
    feeds = {"x": rand(2, c, *hw, seed=9), "r": rand(2, oc, *out_hw, seed=10)}
    with compile_ggml(model, precision="bf16") as s:
        assert s.impl_hits.get("conv amx", 0) == 1, s.impl_hits
        want, mag = _rounded_conv(feeds["x"], feeds["r"], inits["w"], inits["b"], k, pad, dil)
        _within(s.run(feeds)["y"], want, mag, "compiled")
        w2 = rand(oc, c, k, k, seed=11) / np.sqrt(c * k * k)
        s.update_weights(_Weights({"w": w2}))
        want2, mag2 = _rounded_conv(feeds["x"], feeds["r"], w2, inits["b"], k, pad, dil)
        _within(s.run(feeds)["y"], want2, mag2, "new weights")


def test_packed_route_where_the_tiles_are_off_or_conv_impl_implicit(nat):
    model = _conv_model(48, 40, 3, 1, 1, (12, 20))[0]
    for amx, opts in ((True, {"conv_impl": "implicit"}), (False, {})):
        assert nat.set_amx(amx) == amx
        with compile_ggml(model, precision="bf16", **opts) as s:
            assert "conv amx" not in s.impl_hits and s.impl_hits.get("conv bf16", 0) == 1, (amx, s.impl_hits)


@pytest.mark.parametrize(
    "c,hw,stride,oc,k,pad,also_output",
    [
        (40, (7, 7), 1, 24, 1, 0, False),  # 20 pairs in 32 pair planes, a 1x1 conv (no padding: one run a plane)
        (33, (14, 14), 2, 40, 3, 1, False),  # odd C (the last pair's second channel zero), a padded 3x3 conv after
        (40, (7, 7), 1, 24, 1, 0, True),  # the depthwise output read by the graph too: the pair pad op instead
    ],
)
@pytest.mark.parametrize("threads", [1, 3])
def test_depthwise_conv_writes_the_pairs_of_the_conv_after_it(nat, c, hw, stride, oc, k, pad, also_output, threads):
    """Depthwise 3x3 + ReLU6 (Clip) -> Conv at bf16, as in MobileNetV2's blocks: the depthwise conv writes its
    output as the AMX conv's bf16 channel pairs (no float32 output, no pair pad op) where the conv is its only
    reader. Small integers throughout the depthwise conv, so that its outputs are exact in bf16 and the reference
    (float64: depthwise, clip, then the conv of the rounded kernel) is tight."""
    assert nat.set_amx(True)
    rng = np.random.default_rng(c + oc + threads)
    n = 2
    x = rng.integers(-3, 4, (n, c, *hw)).astype(np.float32)
    wd = rng.integers(-2, 3, (c, 1, 3, 3)).astype(np.float32)
    bd = rng.integers(-2, 3, c).astype(np.float32)
    w = rand(oc, c, k, k, seed=7) / np.sqrt(c * k * k)
    b = rand(oc, seed=8)
    nodes = [
        helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1] * 4, strides=[stride] * 2),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
        helper.make_node("Conv", ["d6", "w", "b"], ["y"], pads=[pad] * 4),
    ]
    inits = {"wd": wd, "bd": bd, "lo": np.array(0, np.float32), "hi": np.array(6, np.float32), "w": w, "b": b}
    outs = {"y": (None, F), **({"d6": (None, F)} if also_output else {})}
    model = make_model(nodes, {"x": ((n, c, *hw), F)}, outs, inits)
    dcols = [_im2col(x[i], 3, 3, stride, 1, 1) for i in range(n)]
    oh, ow = dcols[0][1], dcols[0][2]
    d6 = np.stack(
        [
            np.clip(np.einsum("ck,ckp->cp", wd.reshape(c, 9).astype(np.float64), col.reshape(c, 9, -1)) + bd[:, None], 0, 6)
            for col, _, _ in dcols
        ]
    ).reshape(n, c, oh, ow)
    wr = native.bf16_round(w).reshape(oc, -1).astype(np.float64)
    with compile_ggml(model, precision="bf16", threads=threads) as s:
        fused = s.impl_hits.get("conv input as pairs by its producer", 0)
        assert s.impl_hits.get("conv amx", 0) == 1 and fused == (0 if also_output else 1), s.impl_hits
        got = s.run({"x": x})
    for i in range(n):
        col, yh, yw = _im2col(d6[i], k, k, 1, pad, 1)
        pre, mag = _conv_expected(wr, col, (oc, yh, yw), b)
        _within(got["y"][i], pre, mag, f"item {i}")
    if also_output:
        np.testing.assert_array_equal(got["d6"], d6.astype(np.float32))
