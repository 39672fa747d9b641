"""sdrt-ggml's attention at bf16 on AMX tiles (native/amx_attention.c), inside real ggml graphs, against numpy in
float64 on the operands the tiles multiply: Q scaled by scale x log2 e and rounded to bf16, K and V rounded to bf16.
What is left is the rounding of the softmax weights to bf16 (relative 2^-9 each), so each output is within 2^-8 of
sum_j p_j |v_j| (plus float32 sums). Shapes: head dims that end in a partial step of 16 pairs (40: SD 1.5's,
odd ones), values past a multiple of 16 columns, keys past a multiple of 32 and across blocks of 512, query rows
past a multiple of 16 and 32, K and V read through transposed views, 1 to 3 threads, ggml's threads and the pool,
a later block whose scores move the running maximum, a first block whose scores all overflow to -inf.
Also: without bf16, with a mask, or with the tiles turned off the op keeps its float32 path (1e-4), and a bf16
lowering of an attention graph takes the bf16 path."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_helpers import run_native_graph

LOG2E = 1.4426950408889634


@pytest.fixture(scope="module")
def ops():
    from sdrt_ggml import native
    from sdrt_ggml.native_ops import native_ops, unavailable_reason

    o = native_ops()
    if o is None:
        pytest.skip(f"sdrt-ggml's native library is not usable here: {unavailable_reason()}")
    n = native.native()
    if n is None or not n.amx_available:
        pytest.skip(
            "no AMX-BF16 tiles here (CPU without AMX-TILE/AMX-BF16, an OS that does not grant them, or a "
            "build without AMX support): attention stays float32"
        )
    o.set_isa(None)
    n.set_amx(True)
    yield o
    n.set_amx(None)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even), as float64."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def bf16_reference(q, k, v, scale):
    """float64 attention of the tiles' operands; and the bound of the weights' rounding per output."""
    s = bf16(q * np.float32(scale * LOG2E)) @ np.swapaxes(bf16(k), -1, -2)
    p = np.exp2(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    vb = bf16(v)
    return p @ vb, 2.0**-8 * (p @ np.abs(vb)) + 1e-5


SHAPES = [  # b, h, n_q, n_kv, d, dv
    (1, 1, 1, 1, 1, 1),
    (1, 2, 3, 5, 7, 3),
    (2, 3, 17, 33, 8, 8),
    (1, 2, 67, 77, 40, 40),
    (1, 1, 33, 64, 80, 80),
    (1, 2, 40, 600, 40, 40),
    (1, 1, 70, 1100, 64, 65),
    (1, 1, 16, 300, 160, 160),
    (1, 3, 32, 31, 33, 17),
]


def _graph(ops, q, k, v, mask, scale, bf16_flag, transposed=True):
    from sdrt_ggml.native_ops import attention

    b, h, n_q, _ = q.shape
    dv = v.shape[-1]

    def build(g, ctx, put):
        if transposed:  # K and V through transposed views, as the lowering hands them over
            kt = g.ggml_permute(ctx, put(np.swapaxes(k, -1, -2)), 1, 0, 2, 3)
            vt = g.ggml_permute(ctx, put(np.swapaxes(v, -1, -2)), 1, 0, 2, 3)
        else:
            kt, vt = put(k), put(v)
        m = put(mask) if mask is not None else None
        return attention(ops, g, ctx, put(q), kt, vt, m, scale, bf16=bf16_flag), (b, n_q, h, dv)

    return build


def _inputs(shape, seed):
    b, h, n_q, n_kv, d, dv = shape
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((b, h, n_q, d)) * 2).astype(np.float32)
    k = rng.standard_normal((b, h, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((b, h, n_kv, dv)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("threads", [1, 3])
def test_amx_attention_matches_the_bf16_operands(ops, shape, threads):
    q, k, v = _inputs(shape, sum(shape))
    scale = shape[4] ** -0.5
    got = run_native_graph(_graph(ops, q, k, v, None, scale, True), threads).transpose(0, 2, 1, 3)
    want, bound = bf16_reference(q, k, v, scale)
    err = np.abs(got - want) / bound
    assert np.isfinite(got).all() and err.max() <= 1.0, f"{err.max():.3g} x the bound"
    # and it is the bf16 path that ran: float32 attention is closer to the unrounded operands than this
    from sdrt_ggml.native_ops import reference_attention

    exact = reference_attention(q, k, v, None, scale)
    if shape[3] > 1:
        assert np.abs(got - exact).max() > 1e-4


@pytest.mark.parametrize("threads", [1, 2])
def test_amx_attention_a_later_key_far_above_the_first_block(ops, threads):
    """The running maximum is the first 512-key block's and moves only where a later block's exceeds it by more than
    8 (weights up to 2^8): a key of 1100 whose scores are far above the rest in about half the rows (there it moves)
    and far below in the others, where a later block's largest score is mostly a little above the first block's
    (there it stays)."""
    shape = (1, 2, 48, 1100, 40, 40)
    q, k, v = _inputs(shape, 5)
    k[:, :, 700] = 8.0
    got = run_native_graph(_graph(ops, q, k, v, None, 40**-0.5, True), threads).transpose(0, 2, 1, 3)
    want, bound = bf16_reference(q, k, v, 40**-0.5)
    assert np.isfinite(got).all() and (np.abs(got - want) / bound).max() <= 1.0


def test_amx_attention_a_first_block_of_scores_past_float32(ops):
    """Scores that overflow float32 to -inf over the whole first block (a key dim of -1e38) weigh 0, as on the
    float32 path, and the later blocks give the answer: not NaN (2^(S - m) with m = -inf)."""
    q, k, v = _inputs((1, 1, 20, 700, 40, 40), 6)
    q[..., 0] = 1e3
    k[:, :, :512, 0] = -1e38
    got = run_native_graph(_graph(ops, q, k, v, None, 40**-0.5, True), 1).transpose(0, 2, 1, 3)
    want, bound = bf16_reference(q, k, v, 40**-0.5)
    assert np.isfinite(got).all() and (np.abs(got - want) / bound).max() <= 1.0


@pytest.mark.parametrize("via", ["ggml", "pool"])
def test_amx_attention_on_the_pool_and_dense_views(ops, via):
    shape = (2, 4, 100, 257, 40, 40)
    q, k, v = _inputs(shape, 11)
    got = run_native_graph(_graph(ops, q, k, v, None, 0.2, True, transposed=False), 2, via=via).transpose(0, 2, 1, 3)
    want, bound = bf16_reference(q, k, v, 0.2)
    assert (np.abs(got - want) / bound).max() <= 1.0


def test_float32_unless_asked_without_mask_with_tiles(ops):
    """bf16=False, a mask, or the tiles turned off: the float32 kernel (1e-4 of float64 on the unrounded operands)."""
    from sdrt_ggml import native
    from sdrt_ggml.native_ops import reference_attention

    shape = (1, 2, 40, 77, 40, 40)
    q, k, v = _inputs(shape, 3)
    mask = np.zeros((40, 77), np.float32)
    for flag, m in ((False, None), (True, mask)):
        got = run_native_graph(_graph(ops, q, k, v, m, 0.3, flag), 2).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(got, reference_attention(q, k, v, m, 0.3), rtol=1e-4, atol=1e-5)
    n = native.native()
    try:
        assert not n.set_amx(False)
        got = run_native_graph(_graph(ops, q, k, v, None, 0.3, True), 2).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(got, reference_attention(q, k, v, None, 0.3), rtol=1e-4, atol=1e-5)
    finally:
        n.set_amx(True)


def test_a_bf16_lowering_takes_the_bf16_attention(ops):
    """An ONNX attention (MatMul, Softmax, MatMul) compiled by the ggml backend at bf16 runs the bf16 path; at fp32
    the float32 one."""
    from ggml_helpers import compile_ggml
    from onnx import TensorProto, helper

    h, n, d = 2, 70, 40
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "sc"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info(x, f, [1, h, n, d]) for x in "qkv"],
        [helper.make_tensor_value_info("y", f, [1, h, n, d])],
        [helper.make_tensor("sc", f, [], [d**-0.5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    q, k, v = _inputs((1, h, n, n, d, d), 8)
    feeds = {"q": q, "k": k, "v": v}
    from sdrt_ggml.native_ops import reference_attention

    for precision in ("bf16", "fp32"):
        with compile_ggml(model, precision=precision) as s:
            got = s.run(feeds)["y"]
            hits = s.impl_hits
        assert hits.get("attention native"), hits
        if precision == "bf16":
            assert hits.get("attention bf16"), hits
            want, bound = bf16_reference(q, k, v, d**-0.5)
            assert (np.abs(got - want) / bound).max() <= 1.0
        else:
            assert not hits.get("attention bf16"), hits
            np.testing.assert_allclose(got, reference_attention(q, k, v, None, d**-0.5), rtol=1e-4, atol=1e-5)
