"""The native conv's and GEMM's epilogue fusions (rewrites_epilogue.py), the native depthwise conv
and the group norm written padded for a direct conv: each against onnxruntime, with the fusion
checked to have happened (and the fused node to emit nothing), on odd shapes and 1 to 4 threads."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_helpers import F, check, compile_ggml, make_model, rand
from onnx import helper

from sdrt_ggml import native
from sdrt_ggml.native_ops import native_ops

mk = helper.make_node


@pytest.fixture(scope="module", autouse=True)
def kernels():
    # the tests session builds sdrt-ggml with a C compiler: the kernels must be there, not skipped
    assert native.native() is not None, native.unavailable_reason()
    assert native_ops() is not None


def _ops(session) -> dict[str, int]:
    """{ggml op (a custom op by its name): count} of a compiled session's graph."""
    from sdrt_ggml.ops._common import ggml_lib

    g = ggml_lib()
    out: dict[str, int] = {}
    for i in range(g.ggml_graph_n_nodes(session._graph)):
        node = g.ggml_graph_node(session._graph, i)
        name = g.ggml_op_desc(node).decode()
        if name == "CUSTOM":
            name = (g.ggml_get_name(node) or b"").decode()
        out[name] = out.get(name, 0) + 1
    return out


ACTS = {
    "Relu": lambda y: [mk("Relu", [y], ["out"])],
    "Clip": lambda y: [mk("Clip", [y, "lo", "hi"], ["out"])],
    "HardSwish": lambda y: [mk("HardSwish", [y], ["out"])],
}


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("impl", ["auto", "implicit"])
@pytest.mark.parametrize("c,hw,oc,k", [(5, (9, 37), 7, 3), (16, (6, 16), 13, 1), (3, (1, 1), 2, 3), (40, (8, 33), 33, 3)])
def test_conv_residual_and_activation_fuse(threads, impl, c, hw, oc, k):
    """Conv -> Add(residual) -> Relu/Clip/HardSwish: one conv op, no ADD, no activation op."""
    for act, tail in ACTS.items():
        nodes = [mk("Conv", ["x", "w", "b"], ["y"], pads=[k // 2] * 4), mk("Add", ["r", "y"], ["z"]), *tail("z")]
        inits = {"w": rand(oc, c, k, k) * 0.3, "b": rand(oc), "lo": np.array(-0.5, np.float32),
                 "hi": np.array(0.7, np.float32)}
        m = make_model(nodes, {"x": ((2, c, *hw), F), "r": ((2, oc, *hw), F)}, {"out": (None, F)}, inits)
        check(m, {"x": rand(2, c, *hw), "r": rand(2, oc, *hw, seed=4)}, atol=1e-4, threads=threads, conv_impl=impl)
        with compile_ggml(m, threads=threads, conv_impl=impl) as s:
            assert s.rewrite_hits.get("conv_epilogue") == 2, (act, s.rewrite_hits)
            ops = _ops(s)
            convs = ops.get("sdrt_conv", 0) + ops.get("sdrt_winograd", 0)
            assert convs == 1 and "ADD" not in ops and "RELU" not in ops and "CLAMP" not in ops, ops


@pytest.mark.parametrize("threads", [1, 2])
def test_conv_runtime_channel_bias_fuses(threads):
    """Conv + Add of a runtime (N, C, 1, 1) tensor (the UNet's time embedding) -> the conv's row bias."""
    nodes = [mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]), mk("Add", ["y", "t"], ["out"])]
    m = make_model(nodes, {"x": ((2, 6, 5, 19), F), "t": ((2, 11, 1, 1), F)}, {"out": (None, F)},
                   {"w": rand(11, 6, 3, 3), "b": rand(11)})
    check(m, {"x": rand(2, 6, 5, 19), "t": rand(2, 11, 1, 1, seed=3)}, atol=1e-4, threads=threads)
    with compile_ggml(m, threads=threads) as s:
        assert s.rewrite_hits.get("conv_epilogue") == 1 and "ADD" not in _ops(s)


def test_conv_output_read_twice_is_not_fused():
    """A conv output with a second reader keeps its own value: the Add is a separate op."""
    nodes = [mk("Conv", ["x", "w"], ["y"]), mk("Add", ["y", "r"], ["z"]), mk("Relu", ["y"], ["u"])]
    m = make_model(nodes, {"x": ((1, 4, 5, 6), F), "r": ((1, 3, 5, 6), F)}, {"z": (None, F), "u": (None, F)},
                   {"w": rand(3, 4, 1, 1)})
    check(m, {"x": rand(1, 4, 5, 6), "r": rand(1, 3, 5, 6)}, atol=1e-4)
    with compile_ggml(m) as s:
        assert "conv_epilogue" not in s.rewrite_hits


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("m_,k,n", [(1, 1, 1), (7, 5, 33), (77, 300, 40), (3, 64, 129)])
def test_gemm_bias_and_residual_fuse(threads, m_, k, n):
    """MatMul + Add(bias) + Add(residual), as transformers export a Linear layer and its skip."""
    nodes = [mk("MatMul", ["x", "w"], ["y"]), mk("Add", ["y", "b"], ["z"]), mk("Add", ["r", "z"], ["out"])]
    model = make_model(nodes, {"x": ((2, m_, k), F), "r": ((2, m_, n), F)}, {"out": (None, F)},
                       {"w": rand(k, n) * 0.3, "b": rand(n)})
    check(model, {"x": rand(2, m_, k), "r": rand(2, m_, n, seed=5)}, atol=1e-4, threads=threads)
    with compile_ggml(model, threads=threads) as s:
        assert s.rewrite_hits.get("conv_epilogue") == 2 and "ADD" not in _ops(s)


def test_gemm_bias_after_a_residual_is_not_fused():
    """Only a bias before any residual is taken (the kernel adds it first); later ones stay Adds."""
    nodes = [mk("MatMul", ["x", "w"], ["y"]), mk("Add", ["y", "r"], ["z"]), mk("Add", ["z", "b"], ["out"])]
    model = make_model(nodes, {"x": ((3, 4), F), "r": ((3, 5), F)}, {"out": (None, F)}, {"w": rand(4, 5), "b": rand(5)})
    check(model, {"x": rand(3, 4), "r": rand(3, 5)}, atol=1e-5)
    with compile_ggml(model) as s:
        assert s.rewrite_hits.get("conv_epilogue") == 1


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512", "neon", "scalar"])
@pytest.mark.parametrize("c,hw,k,strides,dil", [
    (5, (9, 70), (3, 3), (1, 1), (1, 1)),    # wide rows: the whole padded plane as one run
    (3, (7, 7), (3, 3), (2, 2), (1, 1)),     # stride 2: even/odd phases
    (4, (14, 13), (5, 5), (1, 1), (1, 1)),   # 5x5 (MobileNetV3)
    (2, (11, 12), (3, 3), (2, 1), (1, 1)),   # vertical stride only
    (3, (9, 17), (3, 3), (1, 1), (2, 2)),    # dilation
    (2, (1, 1), (3, 3), (1, 1), (1, 1)),     # a one-pixel plane
    (2, (10, 33), (1, 7), (1, 2), (1, 1)),   # a wide kernel at stride 2
    (3, (13, 12), (3, 3), (1, 1), (1, 1)),   # 3x3, four output rows a call: 13 rows leave one
    (2, (17, 23), (5, 5), (2, 2), (1, 1)),   # 5x5 at stride 2, odd pad: phase planes swap parity
    (2, (16, 19), (3, 3), (3, 3), (1, 1)),   # stride 3: nine phase planes
    (2, (15, 14), (3, 5), (2, 2), (2, 1)),   # stride and dilation together
    (3, (14, 14), (3, 3), (2, 2), (1, 1)),   # stride 2, short even rows: the plane split at once
    (2, (6, 46), (3, 3), (2, 2), (1, 1)),    # stride 2, rows of 46: the split's last vector overlaps
    (3, (7, 7), (3, 3), (1, 1), (1, 1)),     # 7x7 at stride 1: the run's end as two or four chains
    (2, (7, 40), (5, 5), (1, 1), (1, 1)),    # 5x5, rows of 40: three vectors a row, the first and last masked
    (2, (9, 50), (5, 5), (2, 2), (1, 1)),    # 5x5 at stride 2, rows of 50: two vectors a row
    (2, (11, 35), (3, 3), (2, 2), (1, 1)),   # 3x3 at stride 2, odd rows of 35
    (2, (9, 20), (7, 7), (1, 1), (1, 1)),    # 7x7 kernel: the masked-load route's general body
    (2, (10, 21), (3, 5), (2, 2), (1, 1)),   # 3x5 at stride 2
])
def test_native_depthwise_conv(isa, c, hw, k, strides, dil):
    """sdrt-ggml's NCHW depthwise conv with its fused activation, every kernel body this CPU runs,
    1 to 4 threads, batch 2."""
    ops = native_ops()
    if isa not in ops.available_isas():
        pytest.skip(f"{isa} kernel body: not on this CPU or build")
    pads = [k[0] // 2 * dil[0], k[1] // 2 * dil[1]] * 2
    try:
        ops.set_isa(isa)
        for act, tail in ACTS.items():
            nodes = [mk("Conv", ["x", "w", "b"], ["y"], group=c, pads=pads, strides=list(strides),
                        dilations=list(dil)), *tail("y")]
            inits = {"w": rand(c, 1, *k), "b": rand(c), "lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}
            m = make_model(nodes, {"x": ((2, c, *hw), F)}, {"out": (None, F)}, inits)
            for threads in (1, 2, 3, 4):
                check(m, {"x": rand(2, c, *hw)}, atol=1e-5, threads=threads)
            with compile_ggml(m) as s:
                assert s.impl_hits.get("conv depthwise native") == 1 and s.rewrite_hits.get("conv_epilogue") == 1, act
                assert _ops(s).get("sdrt_dwconv") == 1
    finally:
        ops.set_isa(None)


def test_depthwise_layout_option_keeps_ggmls_kernel():
    nodes = [mk("Conv", ["x", "w"], ["y"], group=4, pads=[1, 1, 1, 1])]
    m = make_model(nodes, {"x": ((1, 4, 6, 7), F)}, {"y": (None, F)}, {"w": rand(4, 1, 3, 3)})
    for layout in ("nhwc", "nchw"):
        check(m, {"x": rand(1, 4, 6, 7)}, atol=1e-5, dw_layout=layout)
        with compile_ggml(m, dw_layout=layout) as s:
            assert "conv depthwise native" not in s.impl_hits and "sdrt_dwconv" not in _ops(s)


@pytest.mark.parametrize("threads", [1, 3])
def test_group_norm_writes_the_direct_convs_padded_input(threads):
    """GroupNorm + SiLU -> 3x3 conv: the group norm writes its output zero-padded for the conv's
    direct route; no pad op, same values."""
    c, h, w = 8, 6, 40
    nodes = [
        mk("Reshape", ["x", "gshape"], ["g0"]),
        mk("InstanceNormalization", ["g0", "ones", "zeros"], ["g1"], epsilon=1e-5),
        mk("Reshape", ["g1", "xshape"], ["g2"]),
        mk("Mul", ["g2", "gamma"], ["g3"]), mk("Add", ["g3", "beta"], ["g4"]),
        mk("Sigmoid", ["g4"], ["sg"]), mk("Mul", ["g4", "sg"], ["act"]),
        mk("Conv", ["act", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = {"gshape": np.array([1, 4, -1], np.int64), "xshape": np.array([1, c, h, w], np.int64),
             "ones": np.ones(4, np.float32), "zeros": np.zeros(4, np.float32),
             "gamma": rand(c, 1, 1), "beta": rand(c, 1, 1, seed=2), "w": rand(5, c, 3, 3) * 0.3, "b": rand(5)}
    m = make_model(nodes, {"x": ((1, c, h, w), F)}, {"y": (None, F)}, inits)
    check(m, {"x": rand(1, c, h, w) * 3 + 1}, atol=1e-4, threads=threads)
    with compile_ggml(m, threads=threads) as s:
        assert s.impl_hits.get("conv input padded by its producer") == 1, s.impl_hits
        assert "sdrt_pad" not in _ops(s)


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("n,c,hw,oc,pads", [
    (1, 32, (8, 33), 32, [1, 1, 1, 1]),     # odd width: the last tile column half outside
    (2, 40, (7, 9), 35, [1, 1, 1, 1]),      # odd height and width, batch 2, 35 = 5 tiles of 6 + 5
    (1, 3, (1, 1), 2, [1, 1, 1, 1]),        # one pixel
    (1, 17, (12, 70), 9, [0, 0, 0, 0]),     # no padding ("valid")
    (1, 64, (5, 6), 70, [1, 2, 0, 1]),      # asymmetric pads (padded before the op)
    (1, 400, (4, 4), 8, [1, 1, 1, 1]),      # C = 400: two blocks of K in the 16 products
])
def test_winograd_conv_matches_onnxruntime(threads, n, c, hw, oc, pads):
    """Winograd F(2x2, 3x3) (conv_impl="winograd" forces it at any channel count) against onnxruntime,
    with the epilogue: bias, a runtime per-channel bias, a residual, ReLU."""
    nodes = [mk("Conv", ["x", "w", "b"], ["y"], pads=pads), mk("Add", ["y", "t"], ["y2"]), mk("Add", ["r", "y2"], ["z"]),
             mk("Relu", ["z"], ["out"])]
    oh, ow = hw[0] + pads[0] + pads[2] - 2, hw[1] + pads[1] + pads[3] - 2
    m = make_model(nodes, {"x": ((n, c, *hw), F), "t": ((n, oc, 1, 1), F), "r": ((n, oc, oh, ow), F)},
                   {"out": (None, F)}, {"w": rand(oc, c, 3, 3) * (3 / c) ** 0.5, "b": rand(oc)})
    feeds = {"x": rand(n, c, *hw), "t": rand(n, oc, 1, 1, seed=2), "r": rand(n, oc, oh, ow, seed=3)}
    check(m, feeds, rtol=1e-4, atol=2e-5, threads=threads, conv_impl="winograd")
    with compile_ggml(m, conv_impl="winograd") as s:
        # a 1x1 output takes the per-channel bias as its residual: the second Add (and the Relu after it) stay
        fused = 1 if oh * ow == 1 else 3
        assert s.impl_hits.get("conv winograd") == 1 and s.rewrite_hits.get("conv_epilogue") == fused, s.rewrite_hits
        assert _ops(s).get("sdrt_winograd") == 1


def test_winograd_is_the_default_for_wide_3x3_convs_only():
    """...and for maps of WINOGRAD_MIN_PIXELS output pixels or more (on fewer its tiles are mostly padding);
    ``conv_impl="winograd"`` takes any."""
    from sdrt_ggml.ops.conv_kernels import WINOGRAD_MIN_C, WINOGRAD_MIN_OC, WINOGRAD_MIN_PIXELS

    def hits(c, oc, hw=(6, 40), **opts):
        m = make_model([mk("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": ((1, c, *hw), F)}, {"y": (None, F)},
                       {"w": rand(oc, c, 3, 3)})
        with compile_ggml(m, **opts) as s:
            return s.impl_hits

    assert "conv winograd" in hits(WINOGRAD_MIN_C, WINOGRAD_MIN_OC)
    assert "conv winograd" not in hits(WINOGRAD_MIN_C - 1, WINOGRAD_MIN_OC)
    assert "conv winograd" not in hits(WINOGRAD_MIN_C, WINOGRAD_MIN_OC, conv_impl="implicit")
    small = (5, (WINOGRAD_MIN_PIXELS - 1) // 5)
    assert "conv winograd" not in hits(64, 64, small)
    assert "conv winograd" in hits(64, 64, small, conv_impl="winograd")


def test_plain_conv_pixels_is_where_the_routes_start_holding_winograd_kernels():
    """The cost model's cut (``GgmlBackend.plain_conv_pixels``, ``Factors.plain_conv_pixels``) agrees with the routes
    on this CPU: a wide 3x3 conv writing that many output pixels keeps its kernel as stored, one writing more holds
    Winograd's; at bf16 no route takes Winograd by the map's size."""
    from sdrt_ggml.backend import GgmlBackend

    be = GgmlBackend()
    cpu = next(d for d in be.devices() if d.kind == "cpu")
    cut = be.plain_conv_pixels(cpu, "fp32")
    assert cut > 0 and be.plain_conv_pixels(cpu, "bf16") == 0

    def winograd(pixels):
        m = make_model([mk("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": ((2, 64, 1, pixels), F)},
                       {"y": (None, F)}, {"w": rand(64, 64, 3, 3)})
        with compile_ggml(m, precision="fp32") as s:
            return "conv winograd" in s.impl_hits

    assert not winograd(cut) and winograd(cut + 1)


class _Weights:
    """The part of sdrt.weights.Weights that a backend uses: bind(graph) -> name -> array."""

    def __init__(self, arrays):
        self.arrays = arrays

    def bind(self, graph):
        return dict(self.arrays)


def test_winograd_follows_update_weights():
    """The 16 transformed kernels come from the weight through its transform: new weights, new U."""
    nodes = [mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    m = make_model(nodes, {"x": ((1, 32, 6, 20), F)}, {"y": (None, F)}, {"w": rand(32, 32, 3, 3), "b": rand(32)})
    new = {"w": rand(32, 32, 3, 3, seed=7), "b": rand(32, seed=8)}
    m2 = make_model(nodes, {"x": ((1, 32, 6, 20), F)}, {"y": (None, F)}, new)
    x = rand(1, 32, 6, 20)
    want = check(m2, {"x": x}, atol=1e-4)["y"]
    with compile_ggml(m) as s:
        assert s.impl_hits.get("conv winograd") == 1
        s.update_weights(_Weights(new))
        np.testing.assert_allclose(s.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("c", [1.0, 1.702])
def test_gemm_silu_fuses(threads, c):
    """MatMul + bias, then x * sigmoid(c x) (SiLU; CLIP's quick GELU at c = 1.702): one GEMM, its
    epilogue applying the activation (exp vectorised in the kernels)."""
    if c == 1.0:
        tail = [mk("Sigmoid", ["z"], ["s"]), mk("Mul", ["z", "s"], ["out"])]
    else:
        tail = [mk("Mul", ["z", "cst"], ["zc"]), mk("Sigmoid", ["zc"], ["s"]), mk("Mul", ["z", "s"], ["out"])]
    nodes = [mk("MatMul", ["x", "w"], ["y"]), mk("Add", ["y", "b"], ["z"]), *tail]
    model = make_model(nodes, {"x": ((2, 13, 40), F)}, {"out": (None, F)},
                       {"w": rand(40, 70) * 2, "b": rand(70), "cst": np.array(c, np.float32)})
    check(model, {"x": rand(2, 13, 40) * 3}, rtol=1e-4, atol=1e-5, threads=threads)
    with compile_ggml(model, threads=threads) as s:
        assert s.rewrite_hits.get("conv_epilogue") == 2, s.rewrite_hits
        ops = _ops(s)
        assert "SILU" not in ops and "SCALE" not in ops and ops.get("sdrt_gemm") == 1, ops


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("k,pads", [(1, [0, 0, 0, 0]), (3, [1, 1, 1, 1])])
def test_squeeze_excitation_gate_fuses_into_the_conv(threads, k, pads):
    """MobileNetV3's squeeze-excitation: global average pool (the native row mean), two 1x1 convs,
    a hard sigmoid, then x * gate into a conv: the conv scales its input channels as it packs them,
    no Mul op, no broadcast."""
    n, c, h, w = 2, 12, 9, 11
    nodes = [mk("GlobalAveragePool", ["x"], ["p"]), mk("Conv", ["p", "w1", "b1"], ["q"]), mk("Relu", ["q"], ["q2"]),
             mk("Conv", ["q2", "w2", "b2"], ["r"]), mk("HardSigmoid", ["r"], ["gate"], alpha=1 / 6, beta=0.5),
             mk("Mul", ["x", "gate"], ["xs"]), mk("Conv", ["xs", "w3", "b3"], ["out"], pads=pads)]
    inits = {"w1": rand(4, c, 1, 1), "b1": rand(4), "w2": rand(c, 4, 1, 1), "b2": rand(c, seed=2),
             "w3": rand(7, c, k, k) * 0.3, "b3": rand(7, seed=3)}
    m = make_model(nodes, {"x": ((n, c, h, w), F)}, {"out": (None, F)}, inits)
    check(m, {"x": rand(n, c, h, w) * 2}, rtol=1e-4, atol=1e-5, threads=threads)
    with compile_ggml(m, threads=threads) as s:
        ops = _ops(s)
        assert "MUL" not in ops and ops.get("sdrt_rowmean") == 1 and "MEAN" not in ops, ops


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_mean_reductions_use_the_native_row_mean(threads):
    """GlobalAveragePool and ReduceMean over trailing axes: sdrt_rowmean, odd row lengths."""
    nodes = [mk("GlobalAveragePool", ["x"], ["g"]), mk("ReduceMean", ["x"], ["r"], axes=[2, 3], keepdims=0),
             mk("ReduceMean", ["t"], ["u"], axes=[-1])]
    m = make_model(nodes, {"x": ((2, 5, 7, 9), F), "t": ((3, 4, 37), F)},
                   {"g": (None, F), "r": (None, F), "u": (None, F)}, opset=17)
    check(m, {"x": rand(2, 5, 7, 9) + 3, "t": rand(3, 4, 37, seed=2)}, rtol=1e-5, atol=1e-6, threads=threads)
    with compile_ggml(m, threads=threads) as s:
        ops = _ops(s)
        assert ops.get("sdrt_rowmean") == 3 and "MEAN" not in ops, ops


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("shape,axis,bias", [
    ((2, 7, 37), -1, True),      # odd width (a vector tail), rows split over the threads
    ((1, 77, 768), -1, True),    # the CLIP text encoder's
    ((3, 5, 4, 9), -2, True),    # normalised over two dims: per-element scale of 36
    ((4, 33), -1, False),        # no bias input
])
def test_layer_norm_is_one_native_op(threads, shape, axis, bias):
    """LayerNormalization with constant scale and bias is sdrt_layer_norm (no NORM, MUL, ADD), against
    onnxruntime, with a mean far from zero (the two-pass variance keeps the precision)."""
    ns = shape[axis:]
    inputs = ["x", "s", "b"] if bias else ["x", "s"]
    inits = {"s": rand(*ns), **({"b": rand(*ns, seed=1)} if bias else {})}
    m = make_model([mk("LayerNormalization", inputs, ["y"], axis=axis, epsilon=1e-5)], {"x": (shape, F)},
                   {"y": (None, F)}, inits)
    check(m, {"x": rand(*shape) * 3 + 50}, rtol=1e-4, atol=1e-5, threads=threads)
    with compile_ggml(m, threads=threads) as s:
        ops = _ops(s)
        assert ops.get("sdrt_layer_norm") == 1 and not {"NORM", "MUL", "ADD"} & set(ops), ops


def test_layer_norm_with_a_runtime_scale_keeps_ggml_norm():
    """A scale that is a graph input (not a constant) takes ggml_norm, then the multiply and add."""
    m = make_model([mk("LayerNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)],
                   {"x": ((3, 10), F), "s": ((10,), F)}, {"y": (None, F)}, {"b": rand(10, seed=1)})
    check(m, {"x": rand(3, 10), "s": rand(10, seed=2)})
    with compile_ggml(m) as s:
        ops = _ops(s)
        assert "sdrt_layer_norm" not in ops and ops.get("NORM") == 1, ops


def _gelu_tanh_nodes(z: str, out: str, form: str) -> list:
    """GELU(approximate='tanh') of ``z`` as torch exports it (``torch``: x * (x * x), constants first), or with
    the cube as Pow(x, 3) and the products in the other association order (``pow``)."""
    if form == "torch":
        cube = [mk("Mul", [z, z], ["xx"]), mk("Mul", [z, "xx"], ["x3"]), mk("Mul", ["c044", "x3"], ["x3c"])]
    else:
        cube = [mk("Pow", [z, "three"], ["x3"]), mk("Mul", ["x3", "c044"], ["x3c"])]
    return cube + [mk("Add", [z, "x3c"], ["inner"]), mk("Mul", ["csq", "inner"], ["u"]), mk("Tanh", ["u"], ["t"]),
                   mk("Add", ["one", "t"], ["t1"])] + (
        [mk("Mul", [z, "t1"], ["g"]), mk("Mul", ["half", "g"], [out])] if form == "torch" else
        [mk("Mul", ["half", z], ["g"]), mk("Mul", ["g", "t1"], [out])])


GELU_CONSTS = {"c044": np.array(0.044715, np.float32), "csq": np.array(np.sqrt(2 / np.pi), np.float32),
               "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32), "three": np.array(3.0, np.float32)}


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable", "neon", "scalar"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("form", ["torch", "pow"])
def test_gemm_gelu_tanh_fuses(isa, threads, form):
    """MatMul + bias, then GELU (tanh form, the diffusion transformers' MLP): one GEMM whose epilogue applies
    x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (= 0.5 x (1 + tanh(..))); no TANH (ggml's is a scalar tanhf
    an element) and no elementwise ops. N = 70: full 32-column tiles and a masked edge; values out to +-20."""
    nat = native.native()
    if isa not in nat.available_isas():
        pytest.skip(f"{isa} GEMM kernel: not on this CPU or build")
    nodes = [mk("MatMul", ["x", "w"], ["y"]), mk("Add", ["y", "b"], ["z"]), *_gelu_tanh_nodes("z", "out", form)]
    model = make_model(nodes, {"x": ((2, 13, 40), F)}, {"out": (None, F)},
                       {"w": rand(40, 70) * 0.8, "b": rand(70), **GELU_CONSTS})
    x = rand(2, 13, 40) * 3
    x[0, 0] *= 4  # a row of large values: both tails of the GELU
    nat.set_isa(isa)
    try:
        check(model, {"x": x}, rtol=1e-4, atol=1e-5, threads=threads)
        with compile_ggml(model, threads=threads) as s:
            assert s.rewrite_hits.get("conv_epilogue") == 2, s.rewrite_hits
            ops = _ops(s)
            assert ops == {"sdrt_gemm": 1}, ops
    finally:
        nat.set_isa(None)


def test_gemm_gelu_tanh_input_read_elsewhere_is_not_fused():
    """The GEMM's output also read outside the GELU (a residual): no fusion, the same values."""
    nodes = [mk("MatMul", ["x", "w"], ["y"]), mk("Add", ["y", "b"], ["z"]), *_gelu_tanh_nodes("z", "gl", "torch"),
             mk("Add", ["gl", "z"], ["out"])]
    model = make_model(nodes, {"x": ((1, 9, 24), F)}, {"out": (None, F)}, {"w": rand(24, 40), "b": rand(40),
                                                                          **GELU_CONSTS})
    check(model, {"x": rand(1, 9, 24)}, rtol=1e-4, atol=1e-5)
    with compile_ggml(model) as s:
        assert "TANH" in _ops(s)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("k", [8192, 8211])
def test_gemm_large_k_blocking(threads, k):
    """K >= 8192 takes half the AVX-512 kernels' K block (native/gemm.c, split_of): more blocks of K summed into
    C, the bias with the first and the residual and activation with the last; an odd K leaves a short block."""
    nodes = [mk("MatMul", ["x", "w"], ["y"]), mk("Add", ["y", "b"], ["z"]), mk("Add", ["z", "r"], ["s"]),
             mk("Relu", ["s"], ["out"])]
    model = make_model(nodes, {"x": ((1, 37, k), F), "r": ((1, 37, 70), F)}, {"out": (None, F)},
                       {"w": (rand(k, 70) / np.sqrt(k)).astype(np.float32), "b": rand(70)})
    check(model, {"x": rand(1, 37, k), "r": rand(1, 37, 70, seed=2)}, rtol=1e-4, atol=1e-5, threads=threads)


@pytest.mark.parametrize("threads", [1, 3])
def test_gemm_gelu_op_tanh_fuses(threads):
    """Gelu(approximate='tanh') (opset 20) of a MatMul + bias: the same GEMM epilogue."""
    nodes = [mk("MatMul", ["x", "w"], ["y"]), mk("Add", ["y", "b"], ["z"]), mk("Gelu", ["z"], ["out"],
                                                                            approximate="tanh")]
    model = make_model(nodes, {"x": ((2, 13, 40), F)}, {"out": (None, F)}, {"w": rand(40, 70) * 0.8, "b": rand(70)},
                       opset=20)
    check(model, {"x": rand(2, 13, 40) * 3}, rtol=1e-4, atol=1e-5, threads=threads)
    with compile_ggml(model, threads=threads) as s:
        assert s.rewrite_hits.get("conv_epilogue") == 2, s.rewrite_hits
        assert _ops(s) == {"sdrt_gemm": 1}, _ops(s)
