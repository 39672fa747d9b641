"""The kernels' weight layouts (native/pack.c: ``native.pack_b_bf16``, ``bf16_rows``, ``pairs_weights``, ``winograd_weights``) against
the layouts written out in numpy here, with ml_dtypes' float32 -> bfloat16 cast as the rounding (round to nearest
even): odd K, N not a multiple of 32, OC not a multiple of 16, C not a multiple of 32, a transposed view read in
place, weights large enough to be laid out by several threads (``native.PARTS_FROM``; fewer units than threads
too), and the values rounding finds hard (ties, the largest finite, infinities, subnormals, NaN kept a NaN). Each
is made aligned for ggml's CPU buffers, so that lowering hands it over without another copy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sdrt_ggml import native


@pytest.fixture(scope="module", autouse=True)
def _loaded():
    assert native.native() is not None, f"native kernels not loaded: {native.unavailable_reason()}"


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _hard(shape, seed: int) -> np.ndarray:
    """Random values with the hard ones mixed in."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1)
    special = np.array([np.inf, -np.inf, 3.4028235e38, -3.4028235e38, 1e-40, -1e-40, 0.0, -0.0,
                        np.float32(1 + 2**-8), np.float32(1 + 3 * 2**-8), np.nan], np.float32)  # two ties
    where = rng.choice(flat.size, size=min(flat.size, special.size), replace=False)
    flat[where] = special[: where.size]
    return a


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bits, except that a NaN only has to stay a NaN."""
    assert got.shape == want.shape and got.dtype == np.uint16
    nan = np.isnan(want.view(ml_dtypes.bfloat16).astype(np.float32))
    assert np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)).all()
    np.testing.assert_array_equal(got[~nan], want[~nan])


def _pack_b_reference(w: np.ndarray) -> np.ndarray:
    n, k = w.shape
    p, k2 = -(-n // 32), -(-k // 2)
    full = np.zeros((p * 32, 2 * k2), np.uint16)
    full[:n, :k] = _bits(w)
    # (panel, half, column, pair, 2) -> (panel, half, pair, column, 2)
    return np.ascontiguousarray(full.reshape(p, 2, 16, k2, 2).transpose(0, 1, 3, 2, 4)).reshape(p, 2, k2, 32)


@pytest.mark.parametrize("n,k", [(1, 1), (31, 7), (32, 64), (33, 65), (320, 1280), (77, 768), (1001, 1100), (33, 40000)])
def test_gemm_panels(n, k):
    w = _hard((n, k), n * 1000 + k)
    _same(native.pack_b_bf16(w), _pack_b_reference(w))
    wt = np.ascontiguousarray(w.T).T  # the same values as a transposed view: read in place
    assert not wt.flags.c_contiguous or n == 1 or k == 1
    _same(native.pack_b_bf16(wt), _pack_b_reference(w))


@pytest.mark.parametrize("n,k", [(1, 1), (31, 7), (33, 65), (320, 1280), (1001, 1100), (33, 40000)])
def test_gemm_panels_f32(n, k):
    """The float32 panels (``native.pack_b``): (ceil(N/32), 2, K, 16), zero columns past N; from rows and from a
    transposed view read in place (a MatMul's (K, N) weight); a 3-D stack goes through numpy."""
    w = _hard((n, k), n + 7 * k)
    full = np.zeros((-(-n // 32) * 32, k), np.float32)
    full[:n] = w
    want = full.reshape(-1, 2, 16, k).transpose(0, 1, 3, 2)
    for given in (w, np.ascontiguousarray(w.T).T):
        got = native.pack_b(given)
        assert got.shape == want.shape and got.ctypes.data % native.HOST_ALIGN == 0
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(native.pack_b(np.stack([w, 2 * w]))[1], 2 * want)


@pytest.mark.parametrize("oc,k", [(1, 3), (16, 27), (17, 576), (64, 1152), (601, 1800), (1, 1100000)])
def test_conv_rows(oc, k):
    w = _hard((oc, k), oc + k)
    got = native.bf16_rows(w)
    ld = 2 * native.row_stride(-(-k // 2))
    want = np.zeros((oc, ld), np.uint16)
    want[:, :k] = _bits(w)
    _same(got, want)


@pytest.mark.parametrize("oc,c,kh,kw", [(1, 1, 1, 1), (16, 32, 3, 3), (17, 33, 3, 3), (40, 64, 1, 1), (8, 3, 3, 3),
                                         (130, 900, 3, 3), (3, 40000, 3, 3)])
def test_pairs_kernel(oc, c, kh, kw):
    w = _hard((oc, c, kh, kw), oc * c + kh)
    c2 = native.pairs_count(c)
    want = np.zeros((-(-oc // 16) * 16, kh * kw, 2 * c2), np.uint16)
    want[:oc, :, :c] = _bits(w).reshape(oc, c, kh * kw).transpose(0, 2, 1)
    _same(native.pairs_weights(w), want.reshape(want.shape[0], -1))


#: Winograd F(2x2, 3x3)'s kernel transform (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks")
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])


@pytest.mark.parametrize("oc,c", [(1, 1), (17, 33), (64, 320), (320, 640), (3, 40000)])
def test_winograd_kernel(oc, c):
    """U[k] = (G g G^T)[k // 4, k % 4] per (output, input) channel, rows zero-padded to ``ld``; the larger kernels
    are split among the layout threads."""
    w = np.random.default_rng(oc + c).standard_normal((oc, c, 3, 3)).astype(np.float32) * 3
    ld = native.row_stride(c)
    want = np.zeros((16, oc, ld))
    want[:, :, :c] = (G @ w.astype(np.float64) @ G.T).transpose(2, 3, 0, 1).reshape(16, oc, c)
    got = native.winograd_weights(w, ld)
    assert got.dtype == np.float32 and got.shape == (16, oc, ld)
    np.testing.assert_allclose(got, want, rtol=2**-23, atol=1e-30)
    assert not got[:, :, c:].any()


@pytest.mark.parametrize("shape,after,threads", [((5,), (3,), None), ((7, 9), (0, 7), 1), ((640, 11520), (0, 16), 2),
                                                 ((33, 5, 3, 3), (0, 3, 0, 0), 2), ((2, 3, 4), (1, 2, 3), None)])
def test_aligned_pad(shape, after, threads):
    """``aligned_pad`` is ``numpy.pad`` with zeros at the ends, written into aligned memory (split among threads for
    a large weight: the 640 x 11520 one, a transposed view of it too)."""
    a = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    for src in (a, np.ascontiguousarray(a.T).T) if a.ndim > 1 else (a,):
        got = native.aligned_pad(src, after, threads)
        want = np.pad(src, [(0, p) for p in after])
        assert got.ctypes.data % native.HOST_ALIGN == 0 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)


def test_the_layouts_reach_ggml_without_another_copy():
    from sdrt_ggml.lower import host_array

    w = _hard((40, 70), 3)
    k = _hard((20, 35, 3, 3), 4)
    for made, source in ((native.pack_b_bf16(w.T), w), (native.pack_b(w.T), w), (native.bf16_rows(w), w), (native.pairs_weights(k), k),
                         (native.winograd_weights(k, 48), k),
                         (native.aligned_pad(w, (0, 16)), w)):
        assert made.ctypes.data % native.HOST_ALIGN == 0
        assert host_array(made, made.dtype.name, source) is made


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="os.fork is POSIX-only")
def test_a_child_forked_after_a_layout_lays_out_too():
    """The layout threads are the process's own: a child forked after the parent used them (a server's or a test
    runner's worker) makes its own instead of queueing work on threads it does not have."""
    import multiprocessing

    w = _hard((1001, 1100), 5)
    want = native.pack_b_bf16(w)  # the parent's threads now exist
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(native.pack_b_bf16, (w,)).get(timeout=60)
    np.testing.assert_array_equal(got, want)


def test_a_compile_with_threads_1_lays_out_on_its_own_thread(monkeypatch):
    """The layouts use no more threads than the compile's ``threads=``: with 1, a large weight is laid out by the
    compiling thread alone; by default it is split."""
    from ggml_helpers import F, compile_ggml, make_model, rand
    from onnx import helper

    w = rand(1024, 1100)  # 1.1M values: at least PARTS_FROM
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ((2, 1024), F)}, {"y": ((2, 1100), F)},
                       {"w": w})
    used = []
    real = native._layout_pool
    monkeypatch.setattr(native, "_layout_pool", lambda: used.append(1) or real())
    x = rand(2, 1024, seed=1)
    alone = compile_ggml(model, precision="bf16", threads=1).run({"x": x})["y"]
    assert used == []
    split = compile_ggml(model, precision="bf16").run({"x": x})["y"]
    assert used or native._layout_threads() == 1
    np.testing.assert_array_equal(alone, split)
