"""sdrt-ggml's native packed GEMM (plugin-ggml/native): the kernel against numpy, inside ggml graphs
with 1 to 4 threads, every ISA this CPU runs, the lowerings that use it, and its fallbacks."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import ggml
import numpy as np
import pytest
from ggml_helpers import F, check, compile_ggml, make_model, rand
from onnx import helper

from sdrt_ggml import native

mk = helper.make_node


@pytest.fixture(scope="module")
def nat():
    n = native.native()
    # the tests session builds sdrt-ggml with a C compiler: the kernels must be there, not skipped
    assert n is not None, f"native kernels not loaded: {native.unavailable_reason()}"
    yield n
    n.set_isa(None)


def _isas(n: native.Native) -> list[str]:
    return n.available_isas()


SHAPES = [  # M, N, K: ones, primes, non-multiples of the tiles (14 and 6 rows, 32 columns, 384 K)
    (1, 1, 1), (1, 33, 7), (13, 1, 5), (2, 3, 1), (7, 31, 13), (14, 32, 16), (15, 33, 17), (29, 64, 129),
    (37, 97, 389), (100, 5, 771), (6, 160, 1031), (3, 17, 3072),
]


def _gemm(nat, isa, a, m, n, k, wp, *, trans, bias, threads) -> np.ndarray:
    """C = A . W^T + bias by the kernel with packed W, as ``threads`` shares (ith = 0 .. threads-1)."""
    c = np.full((n, m) if trans else (m, n), np.nan, np.float32)
    for ith in range(threads):
        rc = nat.lib.sdrt_gemm(native.ISAS[isa], m, n, k, a.ctypes.data, k, wp.ctypes.data, native.NR, 1, 1,
                               bias.ctypes.data, c.ctypes.data, c.shape[1], int(trans), ith, threads)
        assert rc == 0
    return c.T if trans else c


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_kernel_matches_numpy_on_odd_shapes(nat, m, n, k):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    want = a.astype(np.float64) @ w.T.astype(np.float64)
    wp = native.pack_b(w)
    for isa in _isas(nat):
        for trans in (False, True):
            for threads in (1, 2, 3, 4):
                got = _gemm(nat, isa, a, m, n, k, wp, trans=trans, bias=bias, threads=threads)
                np.testing.assert_allclose(got, want + bias, rtol=1e-4, atol=1e-4 * np.sqrt(k),
                                           err_msg=f"{isa} trans={trans} threads={threads}")


@pytest.mark.parametrize("m,n,k", [(5, 7, 3), (29, 45, 130), (16, 33, 400)])
def test_kernel_reads_strided_and_overlapping_rows_and_unpacked_b(nat, m, n, k):
    """A rows further apart than K, and overlapping (the window conv); B as (K, N) rows or
    K-contiguous columns (a transposed view), packed by the kernel per thread."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((n, k)).astype(np.float32)
    buf = rng.standard_normal(m * (k + 9) + k).astype(np.float32)
    for lda in (k + 9, max(1, k // 3)):  # padded rows, overlapping rows
        a = np.lib.stride_tricks.as_strided(buf, shape=(m, k), strides=(lda * 4, 4))
        want = a.astype(np.float64) @ w.T.astype(np.float64)
        bkn = np.ascontiguousarray(w.T)  # (K, N): sbk = N, sbn = 1
        for isa in _isas(nat):
            for b, sbk, sbn in ((bkn, n, 1), (w, 1, k)):
                for trans in (False, True):
                    c = np.zeros((n, m) if trans else (m, n), np.float32)
                    for ith in range(3):
                        assert nat.lib.sdrt_gemm(native.ISAS[isa], m, n, k, buf.ctypes.data, lda, b.ctypes.data, sbk,
                                                 sbn, 0, None, c.ctypes.data, c.shape[1], int(trans), ith, 3) == 0
                    got = c.T if trans else c
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k),
                                               err_msg=f"{isa} lda={lda} sbn={sbn} trans={trans}")


def _compute(tensors: list, threads: int, ctx) -> None:
    gf = ggml.ggml_new_graph(ctx)
    for t in tensors:
        ggml.ggml_build_forward_expand(gf, t)
    ggml.ggml_graph_compute_with_ctx(ctx, gf, threads)


def _as_np(t, shape) -> np.ndarray:
    return np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(t), ctypes.POINTER(ctypes.c_float)), shape=shape).copy()


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_custom_op_in_a_ggml_graph_with_threads_and_batches(nat, threads):
    """The op as the lowering emits it, split over ggml's own threads: packed weights with bias,
    and a runtime B (a transposed view) broadcast over A's batch dims, as attention's matmuls."""
    g = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 << 20, mem_buffer=None, no_alloc=False))
    try:
        rng = np.random.default_rng(threads)
        m, n, k = 53, 70, 45
        a = rng.standard_normal((3, 2, m, k)).astype(np.float32)  # ONNX (d3, d2, M, K)
        w = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        bt = rng.standard_normal((3, 1, n, k)).astype(np.float32)  # B^T per d3, broadcast over d2
        ta, tw, tb, tbt = (native._tensor(ggml, g, x) for x in (a, native.pack_b(w), bias, bt))
        y1 = native.gemm_op(nat, ggml, g, ta, tw, tb, m=m, n=n, packed=True, batch=(2, 3))
        y2 = native.gemm_op(nat, ggml, g, ta, tw, None, m=m, n=n, trans=True, packed=True, batch=(2, 3))
        y3 = native.gemm_op(nat, ggml, g, ta, ggml.ggml_transpose(g, tbt), m=m, n=n, batch=(2, 3),
                            state=native.state_tensor(ggml, g))
        for isa in _isas(nat):
            nat.set_isa(isa)
            _compute([y1, y2, y3], threads, g)
            np.testing.assert_allclose(_as_np(y1, (3, 2, m, n)), a @ w.T + bias, rtol=1e-4, atol=1e-4, err_msg=isa)
            np.testing.assert_allclose(_as_np(y2, (3, 2, n, m)), np.swapaxes(a @ w.T, -1, -2), rtol=1e-4, atol=1e-4,
                                       err_msg=isa)
            np.testing.assert_allclose(_as_np(y3, (3, 2, m, n)), a @ np.swapaxes(bt, -1, -2), rtol=1e-4, atol=1e-4,
                                       err_msg=isa)
        # new data in the runtime B: the next run packs it again (the threads' packed copy is per run)
        bt2 = bt * -0.5
        ctypes.memmove(ggml.ggml_get_data(tbt), bt2.ctypes.data, bt2.nbytes)
        _compute([y3], threads, g)
        np.testing.assert_allclose(_as_np(y3, (3, 2, m, n)), a @ np.swapaxes(bt2, -1, -2), rtol=1e-4, atol=1e-4)
    finally:
        nat.set_isa(None)
        ggml.ggml_free(g)


def test_every_isa_can_be_forced_and_unknown_ones_are_refused(nat):
    for isa in _isas(nat):
        assert nat.set_isa(isa) == isa
    with pytest.raises(ValueError, match="not available"):
        nat.set_isa("sve9")
    assert nat.set_isa(None) in _isas(nat)
    assert "portable" in _isas(nat)


def _run_child(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


def test_isa_environment_variable_and_switching_off(nat):
    code = "from sdrt_ggml import native; n = native.native(); print(n.isa if n else native.unavailable_reason())"
    r = _run_child(code, SDRT_GGML_GEMM_ISA="portable")
    assert r.stdout.strip() == "portable", r.stderr
    r = _run_child(code, SDRT_GGML_NATIVE="0")
    assert r.stdout.strip() == "SDRT_GGML_NATIVE=0", r.stderr
    r = _run_child(code, SDRT_GGML_GEMM_ISA="sve9")  # unknown: a warning, and the best kernel
    assert r.stdout.strip() == nat.available_isas()[-1] and "SDRT_GGML_GEMM_ISA=sve9 ignored" in r.stderr


def test_a_layout_that_does_not_match_is_refused_not_guessed(nat):
    """ggml-python's ctypes ggml_tensor with a field the C library does not have: the check says so."""

    class Shifted(ctypes.Structure):
        _fields_ = [("extra", ctypes.c_int64), *ggml.ggml_tensor._fields_]

    class FakeGgml:
        def __getattr__(self, name):
            return getattr(ggml, name)

    fake = FakeGgml()
    fake.ggml_tensor = Shifted  # type: ignore[attr-defined]
    try:
        why = native._check_layout(nat.lib, fake)
        assert why and "ggml_tensor_overhead" in why
    finally:
        assert native._check_layout(nat.lib, ggml) is None  # the real layout again


def test_missing_library_falls_back_with_a_reason(monkeypatch):
    monkeypatch.setattr(native, "library_path", lambda: None)
    n, why = native._load()
    assert n is None and "no C compiler" in why


def _gemm_nodes(session, name: bytes = b"sdrt_gemm") -> int:
    g = session._graph
    return sum(ggml.ggml_get_name(ggml.ggml_graph_node(g, i)) == name for i in range(ggml.ggml_graph_n_nodes(g)))


def test_lowerings_route_matmul_gemm_and_convs_to_the_kernel(nat):
    nodes = [mk("MatMul", ["x", "w"], ["h"]), mk("Gemm", ["h", "w2", "b2"], ["y"], transB=1, alpha=0.5, beta=2.0)]
    m = make_model(nodes, {"x": ((5, 9), F)}, {"y": (None, F)}, {"w": rand(9, 11), "w2": rand(7, 11), "b2": rand(7)})
    check(m, {"x": rand(5, 9)})
    with compile_ggml(m) as s:
        assert _gemm_nodes(s) == 2
    with compile_ggml(m, gemm="ggml") as s:
        assert _gemm_nodes(s) == 0
    conv = make_model([mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": ((1, 3, 9, 7), F)},
                      {"y": (None, F)}, {"w": rand(5, 3, 3, 3), "b": rand(5)})
    check(conv, {"x": rand(1, 3, 9, 7)})
    with compile_ggml(conv) as s:  # kxk: the implicit-GEMM conv straight from NCHW
        assert _gemm_nodes(s, b"sdrt_conv") == 1 and set(s.impl_hits) <= {"conv implicit", "conv direct"}
    check(conv, {"x": rand(1, 3, 9, 7)}, conv_impl="window")
    with compile_ggml(conv, conv_impl="window") as s:
        assert _gemm_nodes(s) == 1 and s.impl_hits == {"conv window": 1}


@pytest.mark.parametrize("impl", ["auto", "implicit", "window", "rowcopy", "im2col"])
def test_conv_routes_on_the_kernel_match_onnxruntime(nat, impl):
    nodes = [mk("Conv", ["x", "w", "b"], ["h"], pads=[1, 1, 1, 1]),
             mk("Conv", ["h", "w2"], ["p"]),  # 1x1
             mk("Conv", ["p", "w3"], ["q"], pads=[1, 0, 1, 0], strides=[2, 1]),
             mk("Conv", ["q", "w4"], ["y"], group=2)]
    m = make_model(nodes, {"x": ((2, 6, 11, 9), F)}, {"y": (None, F)},
                   {"w": rand(8, 6, 3, 3), "b": rand(8), "w2": rand(12, 8, 1, 1), "w3": rand(6, 12, 3, 2),
                    "w4": rand(4, 3, 2, 2)})
    # outputs reach 1e3: float32 rounding of the sums is about 1e-4 absolute
    check(m, {"x": rand(2, 6, 11, 9)}, atol=2e-3, conv_impl=impl)
    m1 = make_model(nodes, {"x": ((1, 6, 11, 9), F)}, {"y": (None, F)},
                    {"w": rand(8, 6, 3, 3), "b": rand(8), "w2": rand(12, 8, 1, 1), "w3": rand(6, 12, 3, 2),
                     "w4": rand(4, 3, 2, 2)})
    check(m1, {"x": rand(1, 6, 11, 9)}, atol=2e-3, conv_impl=impl)


def test_batched_runtime_matmul_with_broadcast(nat):
    m = make_model([mk("MatMul", ["a", "b"], ["y"])], {"a": ((2, 3, 5, 7), F), "b": ((3, 7, 4), F)}, {"y": (None, F)})
    check(m, {"a": rand(2, 3, 5, 7), "b": rand(3, 7, 4)})
    m = make_model([mk("MatMul", ["a", "b"], ["y"])], {"a": ((5, 7), F), "b": ((2, 7, 4), F)}, {"y": (None, F)})
    check(m, {"a": rand(5, 7), "b": rand(2, 7, 4)})
    m = make_model([mk("Transpose", ["b"], ["bt"], perm=[0, 2, 1]), mk("MatMul", ["a", "bt"], ["y"])],
                   {"a": ((3, 5, 7), F), "b": ((3, 4, 7), F)}, {"y": (None, F)})
    check(m, {"a": rand(3, 5, 7), "b": rand(3, 4, 7)})


class _Weights:
    """The part of sdrt.weights.Weights that a backend uses: bind(graph) -> name -> array."""

    def __init__(self, arrays):
        self.arrays = arrays

    def bind(self, graph):
        return dict(self.arrays)


def test_packed_weights_follow_update_weights(nat):
    """update_weights packs new weights through the same transform (Gemm: alpha folded, bias times beta)."""
    nodes = [mk("MatMul", ["x", "w"], ["h"]), mk("Gemm", ["h", "w2", "b2"], ["y"], transB=1, alpha=0.5, beta=2.0)]
    inits = {"w": rand(9, 40), "w2": rand(33, 40), "b2": rand(33)}
    new = {"w": rand(9, 40, seed=5), "w2": rand(33, 40, seed=6), "b2": rand(33, seed=7)}
    m = make_model(nodes, {"x": ((5, 9), F)}, {"y": (None, F)}, inits)
    m2 = make_model(nodes, {"x": ((5, 9), F)}, {"y": (None, F)}, new)
    x = rand(5, 9)
    want = check(m2, {"x": x})["y"]
    with compile_ggml(m) as s:
        assert _gemm_nodes(s) == 2
        s.update_weights(_Weights(new))
        np.testing.assert_allclose(s.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c,h,w,oc,kh,kw,attrs", [
    (3, 9, 70, 5, 3, 3, {"pads": [1, 1, 1, 1]}),                       # rows of 70 px: the contiguous-run packing
    (48, 11, 13, 17, 3, 3, {"pads": [1, 2, 0, 1]}),                    # asymmetric pads, K = 432 (two K blocks)
    (8, 20, 40, 29, 3, 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # stride 2: the gathering packing
    (6, 15, 37, 7, 3, 3, {"dilations": [2, 3], "pads": [2, 3, 2, 3]}),
    (4, 5, 6, 3, 1, 1, {"strides": [2, 2]}),                           # strided 1x1
    (5, 7, 33, 4, 5, 1, {"pads": [2, 0, 2, 0]}),
])
@pytest.mark.parametrize("impl", ["implicit", "auto"])
def test_implicit_conv_matches_onnxruntime(nat, c, h, w, oc, kh, kw, attrs, impl):
    """Both routes of the native conv: columns packed inside the op (conv_impl="implicit"), and by
    default, for stride-1 convs with rows wide enough, B read straight from a padded input."""
    from sdrt_ggml.ops.conv_kernels import direct_ok

    nodes = [mk("Conv", ["x", "w", "b"], ["y"], **attrs)]
    s = attrs.get("strides", [1, 1])
    pads, dil = attrs.get("pads", [0, 0, 0, 0]), attrs.get("dilations", [1, 1])
    ow = (w + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // s[1] + 1

    class _L:  # what direct_ok reads of a lowering
        options = {"conv_impl": impl}

    route = "conv direct" if direct_ok(_L, nat, s, ow, oc) else "conv implicit"
    for n in (1, 2):
        m = make_model(nodes, {"x": ((n, c, h, w), F)}, {"y": (None, F)}, {"w": rand(oc, c, kh, kw) * 0.3, "b": rand(oc)})
        check(m, {"x": rand(n, c, h, w)}, atol=1e-4, conv_impl=impl)
        with compile_ggml(m, conv_impl=impl) as sess:
            assert sess.impl_hits == {route: 1}


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512", "neon"])
@pytest.mark.parametrize("c,h,w,oc,kh,kw,pads,dil", [
    (3, 9, 70, 5, 3, 3, [1, 1], [1, 1]),      # several slices a row, the last one partial
    (48, 6, 33, 17, 3, 3, [1, 1], [1, 1]),    # K = 432: two K blocks; 17 rows: tiles of 5 and 6
    (6, 15, 37, 7, 3, 3, [2, 3], [2, 3]),     # dilations
    (5, 7, 40, 4, 5, 1, [2, 0], [1, 1]),      # a tall kernel, no width padding
    (16, 4, 32, 9, 1, 1, [0, 0], [1, 1]),     # 1x1 whose rows fill whole calls: no pad op
])
def test_direct_conv_route_on_every_isa(nat, isa, c, h, w, oc, kh, kw, pads, dil):
    """The direct route (B rows read through offsets from the padded input) against onnxruntime, with
    each ISA's offset kernels and slice width (16 on AVX2, 32 on AVX-512 and the portable C)."""
    if isa not in nat.available_isas():
        pytest.skip(f"{isa} kernels: not on this CPU or build")
    nodes = [mk("Conv", ["x", "w", "b"], ["y"], pads=[pads[0], pads[1], pads[0], pads[1]], dilations=dil)]
    try:
        nat.set_isa(isa)
        for n in (1, 2):
            m = make_model(nodes, {"x": ((n, c, h, w), F)}, {"y": (None, F)},
                           {"w": rand(oc, c, kh, kw) * 0.3, "b": rand(oc)})
            with compile_ggml(m) as s:
                hits = dict(s.impl_hits)
            check(m, {"x": rand(n, c, h, w)}, atol=1e-4)
            ow = w + 2 * pads[1] - dil[1] * (kw - 1)
            assert hits == {"conv direct" if ow * 4 >= 3 * nat.nr else "conv implicit": 1}
    finally:
        nat.set_isa(None)


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512", "neon"])
@pytest.mark.parametrize("c,hw,oc,auto", [
    (64, (7, 7), 160, "avx512"),         # 49 pixels: tiles of 13 and 12, five whole panels (AVX2: past 128 channels)
    (400, (3, 5), 40, "avx512 avx2"),    # K = 400: two K blocks; 40 channels: a panel and 8 of the next (a half)
    (96, (14, 14), 17, ""),              # 14 tiles of 14, one part panel (by default: under COLS_MIN_OC channels)
    (70, (1, 2), 33, "avx512 avx2"),     # two pixels; one channel in the second panel
    (64, (29, 31), 64, "avx512 avx2"),   # 899 pixels: several tile groups
    (64, (4, 8), 64, "avx512"),          # 32 pixels: whole slices of AVX2's direct route, which keeps them
    (16, (9, 16), 64, "avx512"),         # few input channels, whole panels, in place of the direct route
    (16, (9, 16), 48, ""),               # ... not with a part panel
    (40, (8, 8), 160, ""),               # ... nor past the direct route's channels
])
def test_cols_conv_route_on_every_isa(nat, isa, c, hw, oc, auto):
    """The cols route of a float32 pointwise conv (pixels along the tile's rows, output channels along the vectors,
    stored transposed) against onnxruntime, with its residual and clip fused, at batch 1 and 2, 1 to 3 threads:
    chosen by default with the AVX-512 and AVX2 kernels (``auto``: the ISAs where cols_ok's rule takes it), forced by
    conv_impl="cols" on any ISA (a scalar loop where the ISA has no column kernels)."""
    if isa not in nat.available_isas():
        pytest.skip(f"{isa} kernels: not on this CPU or build")
    nodes = [mk("Conv", ["x", "w", "b"], ["y"]), mk("Add", ["y", "r"], ["z"]), mk("Clip", ["z", "lo", "hi"], ["out"])]
    inits = {"w": rand(oc, c, 1, 1) * 0.2, "b": rand(oc), "lo": np.array(-1.5, np.float32),
             "hi": np.array(2.5, np.float32)}
    try:
        nat.set_isa(isa)
        for n in (1, 2):
            m = make_model(nodes, {"x": ((n, c, *hw), F), "r": ((n, oc, *hw), F)}, {"out": (None, F)}, inits)
            feeds = {"x": rand(n, c, *hw), "r": rand(n, oc, *hw, seed=3)}
            for impl in ("auto", "cols"):
                for threads in (1, 2, 3):
                    check(m, feeds, atol=1e-4, conv_impl=impl, threads=threads)
                with compile_ggml(m, conv_impl=impl) as s:
                    hits = dict(s.impl_hits)
                    fused = s.rewrite_hits.get("conv_epilogue")
                cols = impl == "cols" or isa in auto.split()
                assert ("conv cols" in hits) == cols and fused == 2, (impl, hits, s.rewrite_hits)
    finally:
        nat.set_isa(None)


@pytest.mark.parametrize("threads", [1, 2])
def test_cols_conv_route_scales_its_input_channels(nat, threads):
    """A squeeze-excitation gate before a pointwise conv on the cols route: the gate scales W^T's rows per call
    (the packed route scales the input's columns as it packs them), no Mul op."""
    n, c, h, w = 2, 72, 5, 9
    nodes = [mk("GlobalAveragePool", ["x"], ["p"]), mk("Conv", ["p", "w1", "b1"], ["q"]),
             mk("HardSigmoid", ["q"], ["gate"], alpha=1 / 6, beta=0.5), mk("Mul", ["x", "gate"], ["xs"]),
             mk("Conv", ["xs", "w3", "b3"], ["out"])]
    inits = {"w1": rand(c, c, 1, 1) * 0.2, "b1": rand(c), "w3": rand(40, c, 1, 1) * 0.2, "b3": rand(40, seed=3)}
    m = make_model(nodes, {"x": ((n, c, h, w), F)}, {"out": (None, F)}, inits)
    check(m, {"x": rand(n, c, h, w) * 2}, atol=1e-4, threads=threads, conv_impl="cols")
    with compile_ggml(m, threads=threads, conv_impl="cols") as s:
        assert s.impl_hits.get("conv cols") == 1, s.impl_hits
        assert "MUL" not in {ggml.ggml_op_desc(ggml.ggml_graph_node(s._graph, i)).decode()
                             for i in range(ggml.ggml_graph_n_nodes(s._graph))}


@pytest.mark.parametrize("threads", [1, 2])
def test_cols_conv_route_adds_a_runtime_channel_bias(nat, threads):
    """Conv (cols route) + Add of a runtime (N, OC, 1, 1) tensor (a time embedding): the conv's per-channel bias on
    the transposed store, no Add op."""
    nodes = [mk("Conv", ["x", "w", "b"], ["y"]), mk("Add", ["y", "t"], ["out"])]
    m = make_model(nodes, {"x": ((2, 64, 5, 7), F), "t": ((2, 40, 1, 1), F)}, {"out": (None, F)},
                   {"w": rand(40, 64, 1, 1) * 0.2, "b": rand(40)})
    check(m, {"x": rand(2, 64, 5, 7), "t": rand(2, 40, 1, 1, seed=3)}, atol=1e-4, threads=threads, conv_impl="cols")
    with compile_ggml(m, threads=threads, conv_impl="cols") as s:
        assert s.impl_hits.get("conv cols") == 1 and s.rewrite_hits.get("conv_epilogue") == 1, s.rewrite_hits


@pytest.mark.parametrize("c,hw,k,pads,route", [
    (64, (3, 4), 1, [0, 0, 0, 0], "conv cols"),               # pointwise: W^T read with the input in place
    (32, (4, 5), 3, [1, 1, 1, 1], "conv cols over patches"),  # 3x3: the same W^T panels over the patches
])
def test_cols_conv_follows_update_weights(nat, c, hw, k, pads, route):
    nodes = [mk("Conv", ["x", "w", "b"], ["y"], pads=pads)]
    m = make_model(nodes, {"x": ((1, c, *hw), F)}, {"y": (None, F)}, {"w": rand(40, c, k, k), "b": rand(40)})
    new = {"w": rand(40, c, k, k, seed=2), "b": rand(40, seed=3)}
    m2 = make_model(nodes, {"x": ((1, c, *hw), F)}, {"y": (None, F)}, new)
    x = rand(1, c, *hw)
    want = check(m2, {"x": x}, atol=1e-4)["y"]
    with compile_ggml(m, conv_impl="cols") as s:
        assert s.impl_hits.get(route) == 1
        s.update_weights(_Weights(new))
        np.testing.assert_allclose(s.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512", "neon"])
@pytest.mark.parametrize("c,hw,oc,k,attrs,auto", [
    (64, (4, 4), 64, 3, {"pads": [1, 1, 1, 1]}, True),                        # a UNet's bottom level: 16 pixels
    (32, (8, 8), 48, 3, {"pads": [1, 1, 1, 1]}, True),                        # 64 pixels, a part panel of 16
    (40, (5, 7), 24, 3, {"pads": [1, 1, 1, 1]}, False),                       # under COLS_MIN_OC: not by default
    (16, (9, 9), 32, 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, True),     # stride 2: 5x5 out
    (24, (7, 6), 40, 5, {"dilations": [2, 2], "pads": [4, 4, 4, 4]}, True),   # 5x5 dilated, pads wider than taps
    (48, (10, 10), 32, 1, {"strides": [2, 2]}, True),                         # a strided 1x1 (a shortcut's)
    (32, (12, 12), 32, 3, {"pads": [1, 1, 1, 1]}, False),                     # 144 pixels: Winograd by default
    (96, (3, 5), 40, 3, {"pads": [0, 1, 0, 1]}, True),                        # K = 864: four K blocks; no row pads
    (32, (1, 1), 32, 3, {"pads": [1, 1, 1, 1]}, True),                        # one pixel: one tile of one
])
def test_cols_conv_over_patches_on_every_isa(nat, isa, c, hw, oc, k, attrs, auto):
    """A conv that the pointwise cols route does not take, on the cols route over its patches (native/im2col.c: K
    rows of pixels, then a 1x1 conv of K channels) against onnxruntime, with its residual and clip fused, at batch 1
    and 2, 1 to 3 threads: by default on small maps with the AVX-512 kernels (``auto``: cols_kxk_ok's rule), forced by
    conv_impl="cols" on any ISA."""
    if isa not in nat.available_isas():
        pytest.skip(f"{isa} kernels: not on this CPU or build")
    st, pads, dil = attrs.get("strides", [1, 1]), attrs.get("pads", [0, 0, 0, 0]), attrs.get("dilations", [1, 1])
    oh = (hw[0] + pads[0] + pads[2] - dil[0] * (k - 1) - 1) // st[0] + 1
    ow = (hw[1] + pads[1] + pads[3] - dil[1] * (k - 1) - 1) // st[1] + 1
    nodes = [mk("Conv", ["x", "w", "b"], ["y"], **attrs), mk("Add", ["y", "r"], ["z"]),
             mk("Clip", ["z", "lo", "hi"], ["out"])]
    inits = {"w": rand(oc, c, k, k) * (2 / (c * k * k)) ** 0.5, "b": rand(oc), "lo": np.array(-1.5, np.float32),
             "hi": np.array(2.5, np.float32)}
    try:
        nat.set_isa(isa)
        for n in (1, 2):
            m = make_model(nodes, {"x": ((n, c, *hw), F), "r": ((n, oc, oh, ow), F)}, {"out": (None, F)}, inits)
            feeds = {"x": rand(n, c, *hw), "r": rand(n, oc, oh, ow, seed=3)}
            for impl in ("auto", "cols"):
                for threads in (1, 2, 3):
                    check(m, feeds, atol=1e-4, conv_impl=impl, threads=threads)
                with compile_ggml(m, conv_impl=impl) as s:
                    hits = dict(s.impl_hits)
                    fused = s.rewrite_hits.get("conv_epilogue")
                    patches = _gemm_nodes(s, b"sdrt_im2col")
                cols = impl == "cols" or (isa == "avx512" and auto)
                assert ("conv cols over patches" in hits) == cols and fused == 2, (impl, hits, s.rewrite_hits)
                assert patches == int(cols)
    finally:
        nat.set_isa(None)


def test_cols_conv_over_patches_leaves_a_gated_conv_to_the_packed_route(nat):
    """A squeeze-excitation gate before a 3x3 conv: the packed route scales the input channels as it packs them; the
    patches' K rows have no such scale, so conv_impl="cols" leaves this conv to the packed route."""
    n, c, h, w = 2, 32, 4, 4
    nodes = [mk("GlobalAveragePool", ["x"], ["p"]), mk("Conv", ["p", "w1", "b1"], ["q"]), mk("Sigmoid", ["q"], ["gate"]),
             mk("Mul", ["x", "gate"], ["xs"]), mk("Conv", ["xs", "w3", "b3"], ["out"], pads=[1, 1, 1, 1])]
    inits = {"w1": rand(c, c, 1, 1) * 0.2, "b1": rand(c), "w3": rand(40, c, 3, 3) * 0.1, "b3": rand(40, seed=3)}
    m = make_model(nodes, {"x": ((n, c, h, w), F)}, {"out": (None, F)}, inits)
    check(m, {"x": rand(n, c, h, w) * 2}, atol=1e-4, conv_impl="cols")
    with compile_ggml(m, conv_impl="cols") as s:
        # both convs packed-route ones: the gate's 1x1 conv of one pixel (dot products) and the gated 3x3
        assert s.impl_hits.get("conv implicit") == 2 and _gemm_nodes(s, b"sdrt_im2col") == 0, s.impl_hits


def test_implicit_conv_follows_update_weights(nat):
    nodes = [mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    m = make_model(nodes, {"x": ((1, 4, 8, 9), F)}, {"y": (None, F)}, {"w": rand(6, 4, 3, 3), "b": rand(6)})
    new = {"w": rand(6, 4, 3, 3, seed=2), "b": rand(6, seed=3)}
    m2 = make_model(nodes, {"x": ((1, 4, 8, 9), F)}, {"y": (None, F)}, new)
    x = rand(1, 4, 8, 9)
    want = check(m2, {"x": x})["y"]
    with compile_ggml(m) as s:
        s.update_weights(_Weights(new))
        np.testing.assert_allclose(s.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_gemm_option_is_checked_at_compile(nat, monkeypatch):
    from sdrt.errors import SdrtError

    m = make_model([mk("MatMul", ["x", "w"], ["y"])], {"x": ((2, 3), F)}, {"y": (None, F)}, {"w": rand(3, 4)})
    with pytest.raises(SdrtError, match="gemm='fast' is not a GEMM choice"):
        compile_ggml(m, gemm="fast")
    with compile_ggml(m, gemm="native") as s:
        assert _gemm_nodes(s) == 1
    monkeypatch.setattr(native, "native", lambda: None)
    monkeypatch.setattr(native, "unavailable_reason", lambda: "SDRT_GGML_NATIVE=0")
    with pytest.raises(SdrtError, match="native kernels are not loaded: SDRT_GGML_NATIVE=0"):
        compile_ggml(m, gemm="native")


def test_runtime_b_is_never_reused_from_a_closed_session(nat):
    """A session's GEMM state tensor can come back at the same address in the next session: the
    packed runtime B of the old one must not be taken for the new one's (same shapes, other data)."""
    m = make_model([mk("MatMul", ["a", "b"], ["y"])], {"a": ((2, 40, 24), F), "b": ((2, 24, 70), F)}, {"y": (None, F)})
    a = rand(2, 40, 24)
    for seed in range(6):
        b = rand(2, 24, 70, seed=seed)
        with compile_ggml(m) as s:
            np.testing.assert_allclose(s.run({"a": a, "b": b})["y"], a @ b, rtol=1e-4, atol=1e-4, err_msg=str(seed))
