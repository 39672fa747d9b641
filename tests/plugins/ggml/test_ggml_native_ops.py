"""sdrt-ggml's native attention and GELU kernels against numpy (float64), inside real ggml
graphs: odd sizes (1, primes, not multiples of the 4-row tile, the 32-key padding or the
vector width), masks, K and V read through transposed views, 1 to 4 threads, and every
kernel body this build and CPU have (AVX-512, AVX2, the 4-wide baseline, scalar)."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_helpers import run_native_graph


def _ops():
    from sdrt_ggml.native_ops import native_ops, unavailable_reason

    ops = native_ops()
    if ops is None:
        pytest.skip(f"sdrt-ggml's native library is not usable here: {unavailable_reason()}")
    return ops


def _isas():
    from sdrt_ggml.native_ops import native_ops

    ops = native_ops()
    return ops.available_isas() if ops is not None else ["none"]


@pytest.fixture(params=_isas())
def isa(request):
    ops = _ops()
    ops.set_isa(request.param)
    yield request.param
    ops.set_isa(None)


def _run(build, threads):
    """Build tensors with ``build(g, ctx, put)``, compute its output on ``threads`` of ggml's threads, return it."""
    return run_native_graph(build, threads)


SHAPES = [  # b, h, n_q, n_kv, d, dv
    (1, 1, 1, 1, 1, 1),
    (1, 2, 3, 5, 7, 3),
    (2, 3, 13, 33, 8, 8),
    (1, 2, 67, 77, 40, 40),
    (1, 1, 130, 64, 80, 64),
    (1, 8, 64, 31, 16, 17),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_attention_matches_numpy(isa, shape, threads):
    from sdrt_ggml.native_ops import attention, reference_attention

    ops = _ops()
    b, h, n_q, n_kv, d, dv = shape
    rng = np.random.default_rng(sum(shape))
    q = rng.standard_normal((b, h, n_q, d)).astype(np.float32)
    k = rng.standard_normal((b, h, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((b, h, n_kv, dv)).astype(np.float32)
    mask = np.triu(np.full((n_q, n_kv), -np.inf, np.float32), max(1, n_kv - n_q + 1)) + \
        rng.standard_normal((n_q, n_kv)).astype(np.float32)
    scale = d ** -0.5

    def build(g, ctx, put):
        kt = g.ggml_permute(ctx, put(np.swapaxes(k, -1, -2)), 1, 0, 2, 3)  # K through a transposed view
        vt = g.ggml_permute(ctx, put(np.swapaxes(v, -1, -2)), 1, 0, 2, 3)
        return attention(ops, g, ctx, put(q), kt, vt, put(mask), scale), (b, n_q, h, dv)

    got = _run(build, threads).transpose(0, 2, 1, 3)
    want = reference_attention(q, k, v, mask, scale)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_attention_skips_the_keys_a_causal_mask_drops(isa, threads):
    """CLIP's causal mask (float32 min above the diagonal, as the text encoder exports it): the kernel
    reads each 4-row group's keys only up to its last kept one. The result matches numpy, also for
    a row that masks every key (equal scores: uniform weights, as onnxruntime gives) and a row
    whose masked keys are not all trailing."""
    from sdrt_ggml.native_ops import attention, reference_attention

    ops = _ops()
    b, h, n, d = 1, 3, 77, 64
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(3))
    lo = np.finfo(np.float32).min
    mask = np.triu(np.full((n, n), lo, np.float32), 1)
    mask[40] = lo  # every key masked
    mask[50, 10:20] = lo  # masked keys in the middle, then kept ones
    got = _run(lambda g, ctx, put: (attention(ops, g, ctx, put(q), put(k), put(v), put(mask), 0.125), (b, n, h, d)),
               threads).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, reference_attention(q, k, v, mask, 0.125), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 3])
def test_attention_without_mask_and_fully_masked_rows(isa, threads):
    """No mask; and a row whose every key is masked gives zeros (not NaN)."""
    from sdrt_ggml.native_ops import attention, reference_attention

    ops = _ops()
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 9, 5)).astype(np.float32) for _ in range(3))
    got = _run(lambda g, ctx, put: (attention(ops, g, ctx, put(q), put(k), put(v), None, 0.3), (1, 9, 2, 5)),
               threads).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, reference_attention(q, k, v, None, 0.3), rtol=1e-4, atol=1e-5)
    mask = np.zeros((9, 9), np.float32)
    mask[4] = -np.inf
    got = _run(lambda g, ctx, put: (attention(ops, g, ctx, put(q), put(k), put(v), put(mask), 0.3), (1, 9, 2, 5)),
               threads).transpose(0, 2, 1, 3)
    assert np.all(got[:, :, 4] == 0)
    keep = [i for i in range(9) if i != 4]
    np.testing.assert_allclose(got[:, :, keep], reference_attention(q[:, :, keep], k, v, None, 0.3),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [1, 7, 16, 17, 100, 1031])
@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("gated", [False, True])
def test_gelu_matches_erf(isa, n, threads, gated):
    from sdrt_ggml.native_ops import gelu_erf, reference_gelu

    ops = _ops()
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[: min(n, 4)] = [0.0, -12.0, 12.0, -1e-6][: min(n, 4)]
    gate = rng.standard_normal(n).astype(np.float32)
    got = _run(lambda g, ctx, put: (gelu_erf(ops, g, ctx, put(x), put(gate) if gated else None), (n,)), threads)
    want = reference_gelu(x) * (gate if gated else 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_isa_choice_is_checked():
    ops = _ops()
    with pytest.raises(ValueError, match="not available"):
        ops.set_isa("sparc")
    assert ops.set_isa(None) in ops.available_isas()


@pytest.mark.parametrize("rows,width", [(1, 37), (3, 16), (64, 40), (5, 1)])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_gelu_reads_strided_rows(isa, rows, width, threads):
    """GEGLU: x and the gate are the two halves of one (rows, 2*width) tensor, read in place."""
    from sdrt_ggml.native_ops import gelu_erf, reference_gelu

    ops = _ops()
    both = (np.random.default_rng(rows).standard_normal((rows, 2 * width)) * 3).astype(np.float32)

    def build(g, ctx, put):
        t = put(both)
        nb1 = t.contents.nb[1]
        gate = g.ggml_view_2d(ctx, t, width, rows, nb1, 0)
        x = g.ggml_view_2d(ctx, t, width, rows, nb1, width * 4)
        return gelu_erf(ops, g, ctx, x, gate), (rows, width)

    got = _run(build, threads)
    want = reference_gelu(both[:, width:]) * both[:, :width]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("shape,groups", [((1, 1, 1, 1), 1), ((1, 6, 3, 5), 3), ((2, 32, 17, 13), 8),
                                          ((1, 64, 31, 1), 32), ((3, 4, 1, 97), 2)])
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("silu", [False, True])
def test_group_norm_matches_numpy(isa, shape, groups, threads, silu):
    """Statistics, then the affine (+ SiLU) pass, in NCHW and (batch 1) channels-last."""
    from sdrt_ggml.native_ops import gn_apply, gn_stats, reference_group_norm

    ops = _ops()
    n, c, h, w = shape
    rng = np.random.default_rng(c * h + w)
    x = (rng.standard_normal(shape) * 3 + 5).astype(np.float32)  # an offset mean: the variance needs two passes
    gamma, beta = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    want = reference_group_norm(x, groups, 1e-5, gamma, beta, silu)
    for cl in ([False, True] if n == 1 else [False]):
        def build(g, ctx, put, cl=cl):
            x3 = g.ggml_reshape_3d(ctx, put(x), h * w, c, n)
            st = gn_stats(ops, g, ctx, x3, groups, 1e-5)
            y = gn_apply(ops, g, ctx, x3, st, put(gamma), put(beta), groups, silu=silu, cl=cl)
            return y, ((h * w, c) if cl else shape)

        got = _run(build, threads)
        if cl:
            got = got.T.reshape(shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_group_norm_without_affine():
    from sdrt_ggml.native_ops import gn_apply, gn_stats, reference_group_norm

    ops = _ops()
    x = np.random.default_rng(1).standard_normal((1, 8, 5, 5)).astype(np.float32)

    def build(g, ctx, put):
        x3 = g.ggml_reshape_3d(ctx, put(x), 25, 8, 1)
        return gn_apply(ops, g, ctx, x3, gn_stats(ops, g, ctx, x3, 4, 1e-6), None, None, 4, silu=False,
                        cl=False), x.shape

    np.testing.assert_allclose(_run(build, 2), reference_group_norm(x, 4, 1e-6, None, None, False), rtol=1e-4,
                               atol=1e-5)
