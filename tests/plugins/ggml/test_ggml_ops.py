"""Per-op tests: small ONNX graphs lowered to ggml, compared with onnxruntime at float32."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_helpers import I64, F, check, compile_ggml, make_model, rand, run_ort
from onnx import helper

from sdrt_ggml import native

mk = helper.make_node


def _unary(op: str, x: np.ndarray, **attrs):
    m = make_model([mk(op, ["x"], ["y"], **attrs)], {"x": (x.shape, F)}, {"y": (None, F)})
    return check(m, {"x": x})


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Erf", "Softplus", "HardSwish"])
def test_unary(op):
    _unary(op, rand(2, 3, 4, 5))


def test_sqrt_log_reciprocal():
    x = np.abs(rand(3, 7)) + 0.1
    for op in ("Sqrt", "Log", "Reciprocal"):
        _unary(op, x)


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(approx):
    m = make_model([mk("Gelu", ["x"], ["y"], approximate=approx)], {"x": ((4, 33), F)}, {"y": (None, F)},
                   opset=20)
    check(m, {"x": rand(4, 33)})


def test_clip_hardsigmoid_leaky():
    x = rand(2, 8, 3) * 4
    _unary("HardSigmoid", x, alpha=0.2, beta=0.5)
    _unary("LeakyRelu", x, alpha=0.1)
    m = make_model([mk("Clip", ["x", "lo", "hi"], ["y"])], {"x": (x.shape, F)}, {"y": (None, F)},
                   {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)})
    check(m, {"x": x})


@pytest.mark.parametrize("slope_shape", [(3, 1, 1), (1,), (1, 3, 5, 5)])
def test_prelu(slope_shape):
    """PRelu with a per-channel slope (ArcFace's iResNet, InsightFace's w600k_r50.onnx), a scalar one, a full one."""
    x = rand(1, 3, 5, 5) * 4
    m = make_model([mk("PRelu", ["x", "slope"], ["y"])], {"x": (x.shape, F)}, {"y": (None, F)},
                   {"slope": rand(*slope_shape, seed=2)})
    check(m, {"x": x})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("sa,sb", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)),
                                   ((2, 1, 4), (1, 3, 1)), ((1, 3, 1, 1), (2, 3, 5, 5))])
def test_binary_broadcast(op, sa, sb):
    m = make_model([mk(op, ["a", "b"], ["y"])], {"a": (sa, F), "b": (sb, F)}, {"y": (None, F)})
    b = rand(*sb, seed=1)
    if op == "Div":
        b = np.abs(b) + 0.5
    check(m, {"a": rand(*sa), "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_constant_scalar_both_sides(op):
    c = np.array(1.7, np.float32)
    for ins in (["x", "c"], ["c", "x"]):
        m = make_model([mk(op, ins, ["y"])], {"x": ((3, 5), F)}, {"y": (None, F)}, {"c": c})
        check(m, {"x": np.abs(rand(3, 5)) + 0.5})


def test_pow():
    for e in (2.0, 0.5, 3.0):
        m = make_model([mk("Pow", ["x", "e"], ["y"])], {"x": ((3, 5), F)}, {"y": (None, F)},
                       {"e": np.array(e, np.float32)})
        check(m, {"x": np.abs(rand(3, 5)) + 0.1})


@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((2, 3, 5, 7), (2, 3, 7, 4)),
                                   ((2, 3, 5, 7), (1, 3, 7, 4)), ((7,), (7, 3)), ((2, 5, 7), (7,))])
@pytest.mark.parametrize("const_b", [True, False])
def test_matmul(sa, sb, const_b):
    b = rand(*sb, seed=2)
    if const_b:
        m = make_model([mk("MatMul", ["a", "b"], ["y"])], {"a": (sa, F)}, {"y": (None, F)}, {"b": b})
        check(m, {"a": rand(*sa)})
    else:
        m = make_model([mk("MatMul", ["a", "b"], ["y"])], {"a": (sa, F), "b": (sb, F)}, {"y": (None, F)})
        check(m, {"a": rand(*sa), "b": b})


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm(trans_b):
    w = rand(6, 5) if trans_b else rand(5, 6)
    m = make_model([mk("Gemm", ["a", "w", "c"], ["y"], transB=trans_b, alpha=0.5, beta=2.0)],
                   {"a": ((3, 5), F)}, {"y": (None, F)}, {"w": w, "c": rand(6, seed=3)})
    check(m, {"a": rand(3, 5)})


@pytest.mark.parametrize("kw", [
    dict(),
    dict(strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(pads=[0, 1, 1, 0]),
    dict(dilations=[2, 2], pads=[2, 2, 2, 2]),
    dict(group=2, pads=[1, 1, 1, 1]),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
])
@pytest.mark.parametrize("batch", [1, 2])
def test_conv2d(kw, batch):
    group = kw.get("group", 1)
    w = rand(8, 4 // group, 3, 3, seed=4)
    m = make_model([mk("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], **kw)], {"x": ((batch, 4, 9, 10), F)},
                   {"y": (None, F)}, {"w": w, "b": rand(8, seed=5)})
    check(m, {"x": rand(batch, 4, 9, 10)})


def test_conv_depthwise_and_1x1_without_bias():
    w = rand(6, 1, 3, 3)
    m = make_model([mk("Conv", ["x", "w"], ["h"], group=6, pads=[1, 1, 1, 1], strides=[2, 2]),
                    mk("Conv", ["h", "w2"], ["y"])], {"x": ((1, 6, 11, 11), F)}, {"y": (None, F)},
                   {"w": w, "w2": rand(5, 6, 1, 1)})
    check(m, {"x": rand(1, 6, 11, 11)})


def test_conv1d():
    m = make_model([mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1], strides=[1])], {"x": ((2, 3, 16), F)},
                   {"y": (None, F)}, {"w": rand(4, 3, 3), "b": rand(4)})
    check(m, {"x": rand(2, 3, 16)})


@pytest.mark.parametrize("impl", ["direct", "im2col", "im2col_nhwc", "taps", "rowcopy", "window"])
@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 0, 0, 0], [2, 1, 2, 1], [0, 1, 1, 0]])
def test_conv_impls_match(impl, pads):
    m = make_model([mk("Conv", ["x", "w", "b"], ["y"], pads=pads)], {"x": ((1, 16, 9, 11), F)},
                   {"y": (None, F)}, {"w": rand(8, 16, 3, 3), "b": rand(8)})
    check(m, {"x": rand(1, 16, 9, 11)}, conv_impl=impl)


@pytest.mark.parametrize("kernel", [(3, 3), (5, 5), (1, 3), (3, 1), (2, 4)])
@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 2, 0, 2], [2, 0, 1, 1]])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_window(kernel, pads, bias):
    """The overlapping-window conv (conv_impl="window"; the CPU default for stride-1 kxk convs before
    the native implicit-GEMM conv, and with gemm="ggml" still, where K is aligned):
    every kernel shape, symmetric and asymmetric pads, with and without bias, against
    onnxruntime and against the row-copy conv; and it is the one that ran."""
    kh, kw = kernel
    c = 16
    inits = {"w": rand(6, c, kh, kw, seed=kh + kw)} | ({"b": rand(6, seed=3)} if bias else {})
    m = make_model([mk("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["y"], pads=pads)],
                   {"x": ((1, c, 7, 9), F)}, {"y": (None, F)}, inits)
    feeds = {"x": rand(1, c, 7, 9)}
    got = check(m, feeds, conv_impl="window")
    with compile_ggml(m, conv_impl="window") as s, compile_ggml(m, conv_impl="rowcopy") as r:
        assert s.impl_hits == {"conv window": 1} and r.impl_hits == {"conv rowcopy": 1}
        np.testing.assert_allclose(got["y"], r.run(feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hw,kernel,pads", [((1, 1), (3, 3), [1, 1, 1, 1]), ((7, 1), (3, 3), [1, 1, 1, 1]),
                                             ((1, 7), (3, 3), [1, 1, 1, 1]), ((3, 3), (5, 5), [2, 2, 2, 2]),
                                             ((4, 4), (3, 3), [3, 3, 3, 3]), ((6, 6), (2, 2), [0, 0, 0, 0])])
def test_conv_window_edge_shapes(hw, kernel, pads):
    """Maps of one pixel, one row or one column; pads as wide as the kernel or wider (whole
    output rows read only padding); even kernels."""
    m = make_model([mk("Conv", ["x", "w", "b"], ["y"], pads=pads)], {"x": ((1, 16, *hw), F)}, {"y": (None, F)},
                   {"w": rand(5, 16, *kernel), "b": rand(5)})
    check(m, {"x": rand(1, 16, *hw)}, conv_impl="window")
    check(m, {"x": rand(1, 16, *hw)})  # the CPU default (the native implicit-GEMM conv where it loaded)


def test_conv_window_takes_a_channels_last_input_and_repeated_runs():
    """A 1x1 conv hands its channels-last result to the window conv; the padding zeros are
    rewritten each run, so a second run with other inputs is right too."""
    m = make_model([mk("Conv", ["x", "w1"], ["h"]), mk("Relu", ["h"], ["r"]),
                    mk("Conv", ["r", "w2", "b2"], ["y"], pads=[1, 1, 1, 1])],
                   {"x": ((1, 8, 6, 6), F)}, {"y": (None, F)},
                   {"w1": rand(16, 8, 1, 1), "w2": rand(4, 16, 3, 3), "b2": rand(4)})
    with compile_ggml(m, conv_impl="window") as s:
        assert s.impl_hits.get("conv window") == 1
        for seed in (1, 2):
            feeds = {"x": rand(1, 8, 6, 6, seed=seed)}
            np.testing.assert_allclose(s.run(feeds)["y"], run_ort(m, feeds)["y"], rtol=1e-4, atol=1e-5)


def test_conv_window_not_used_where_it_does_not_fit():
    """Strided convs go to the row-copy conv; so does unaligned K (5 channels x 9 taps) with ggml's
    mul_mat, whose fast path needs it aligned, but not with the native GEMM, which takes any K."""
    m = make_model([mk("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]),
                    mk("Conv", ["h", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
                   {"x": ((1, 5, 8, 8), F)}, {"y": (None, F)}, {"w": rand(16, 5, 3, 3), "w2": rand(4, 16, 3, 3)})
    check(m, {"x": rand(1, 5, 8, 8)})
    check(m, {"x": rand(1, 5, 8, 8)}, gemm="ggml")
    with compile_ggml(m, pad_k=False, gemm="ggml") as s:
        assert s.impl_hits == {"conv rowcopy": 2}
    if native.native() is not None:  # the CPU default: the implicit-GEMM conv for both
        with compile_ggml(m, pad_k=False) as s:
            assert s.impl_hits == {"conv implicit": 2}
        with compile_ggml(m, pad_k=False, conv_impl="window") as s:
            assert s.impl_hits == {"conv window": 1}


def test_conv_transpose():
    m = make_model([mk("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                       output_padding=[1, 1])],
                   {"x": ((1, 4, 6, 6), F)}, {"y": (None, F)}, {"w": rand(4, 3, 3, 3), "b": rand(3)})
    check(m, {"x": rand(1, 4, 6, 6)})


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(axis):
    m = make_model([mk("Softmax", ["x"], ["y"], axis=axis)], {"x": ((2, 3, 5), F)}, {"y": (None, F)})
    check(m, {"x": rand(2, 3, 5)})


@pytest.mark.parametrize("axis", [-1, -2])
def test_layer_norm(axis):
    shape = (2, 5, 8)
    ns = shape[axis:]
    m = make_model([mk("LayerNormalization", ["x", "s", "b"], ["y"], axis=axis, epsilon=1e-5)],
                   {"x": (shape, F)}, {"y": (None, F)}, {"s": rand(*ns), "b": rand(*ns, seed=1)})
    check(m, {"x": rand(*shape)})


def test_group_norm_op18():
    m = make_model([mk("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=4, epsilon=1e-5)],
                   {"x": ((2, 8, 5, 5), F)}, {"y": (None, F)}, {"s": rand(4), "b": rand(4, seed=1)}, opset=18)
    check(m, {"x": rand(2, 8, 5, 5)})


def test_instance_norm():
    m = make_model([mk("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)],
                   {"x": ((2, 3, 4, 5), F)}, {"y": (None, F)}, {"s": rand(3), "b": rand(3, seed=1)})
    check(m, {"x": rand(2, 3, 4, 5)})


@pytest.mark.parametrize("mode,extra", [
    ("nearest", dict(coordinate_transformation_mode="asymmetric", nearest_mode="floor")),
    ("linear", dict(coordinate_transformation_mode="half_pixel")),
    ("linear", dict(coordinate_transformation_mode="pytorch_half_pixel")),
    ("linear", dict(coordinate_transformation_mode="align_corners")),
])
def test_resize(mode, extra):
    scales = np.array([1, 1, 2, 2], np.float32)
    m = make_model([mk("Resize", ["x", "", "s"], ["y"], mode=mode, **extra)], {"x": ((1, 3, 5, 6), F)},
                   {"y": (None, F)}, {"s": scales})
    check(m, {"x": rand(1, 3, 5, 6)})


def test_resize_sizes_downscale_linear():
    m = make_model([mk("Resize", ["x", "", "", "sz"], ["y"], mode="linear")], {"x": ((1, 2, 8, 8), F)},
                   {"y": (None, F)}, {"sz": np.array([1, 2, 4, 4], np.int64)})
    check(m, {"x": rand(1, 2, 8, 8)})


def test_layout_ops():
    nodes = [
        mk("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
        mk("Reshape", ["t", "shape"], ["r"]),
        mk("Unsqueeze", ["r", "ax0"], ["u"]),
        mk("Squeeze", ["u", "ax0"], ["s"]),
        mk("Flatten", ["s"], ["f"], axis=1),
        mk("Slice", ["f", "st", "en", "axs", "steps"], ["sl"]),
        mk("Expand", ["b", "eshape"], ["e"]),
        mk("Concat", ["sl", "e"], ["y"], axis=1),
    ]
    inits = {"shape": np.array([2, -1, 3], np.int64), "ax0": np.array([0], np.int64),
             "st": np.array([1, 2], np.int64), "en": np.array([2, 40], np.int64),
             "axs": np.array([0, 1], np.int64), "steps": np.array([1, 3], np.int64),
             "eshape": np.array([1, 4], np.int64)}
    m = make_model(nodes, {"x": ((2, 3, 4, 5), F), "b": ((1, 1), F)}, {"y": (None, F)}, inits)
    check(m, {"x": rand(2, 3, 4, 5), "b": rand(1, 1)})


def test_split_and_gather_constant_indices():
    nodes = [mk("Split", ["x", "sp"], ["a", "b", "c"], axis=2),
             mk("Gather", ["b", "i"], ["g"], axis=1),
             mk("Gather", ["c", "j"], ["h"], axis=3)]
    inits = {"sp": np.array([1, 2, 3], np.int64), "i": np.array(1, np.int64), "j": np.array([3, 0, 1], np.int64)}
    m = make_model(nodes, {"x": ((2, 3, 6, 4), F)}, {"a": (None, F), "g": (None, F), "h": (None, F)}, inits)
    check(m, {"x": rand(2, 3, 6, 4)})


def test_gather_embedding_runtime_ids():
    table = rand(50, 8)
    m = make_model([mk("Gather", ["emb", "ids"], ["y"])], {"ids": ((2, 7), I64)}, {"y": (None, F)},
                   {"emb": table})
    ids = np.random.default_rng(0).integers(0, 50, (2, 7)).astype(np.int64)
    check(m, {"ids": ids})


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
@pytest.mark.parametrize("axes,keep", [([-1], 1), ([1], 0), ([2, 3], 1)])
def test_reduce(op, axes, keep):
    m = make_model([mk(op, ["x", "axes"], ["y"], keepdims=keep)], {"x": ((2, 3, 4, 5), F)}, {"y": (None, F)},
                   {"axes": np.array(axes, np.int64)}, opset=18)
    check(m, {"x": rand(2, 3, 4, 5)})


@pytest.mark.parametrize("op,kw", [("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                                   ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2])),
                                   ("GlobalAveragePool", dict())])
def test_pool(op, kw):
    m = make_model([mk(op, ["x"], ["y"], **kw)], {"x": ((1, 3, 8, 8), F)}, {"y": (None, F)})
    check(m, {"x": rand(1, 3, 8, 8)})


def test_pad_constant_and_reflect():
    m = make_model([mk("Pad", ["x", "p"], ["y"])], {"x": ((1, 2, 4, 5), F)}, {"y": (None, F)},
                   {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)})
    check(m, {"x": rand(1, 2, 4, 5)})
    m = make_model([mk("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": ((2, 6), F)}, {"y": (None, F)},
                   {"p": np.array([0, 2, 0, 3], np.int64)})
    check(m, {"x": rand(2, 6)})


def test_where_with_constant_mask_and_cast():
    cond = np.triu(np.ones((4, 4), bool), 1)
    nodes = [mk("Where", ["c", "ninf", "x"], ["w"]), mk("Cast", ["w"], ["y"], to=F)]
    m = make_model(nodes, {"x": ((2, 4, 4), F)}, {"y": (None, F)},
                   {"c": cond, "ninf": np.array(-1e9, np.float32)})
    check(m, {"x": rand(2, 4, 4)})


def test_shape_arithmetic_is_folded():
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: all constant once shapes are static
    nodes = [mk("Shape", ["x"], ["s"]), mk("Gather", ["s", "zero"], ["n"], axis=0),
             mk("Unsqueeze", ["n", "ax"], ["nu"]), mk("Concat", ["nu", "m1"], ["shape"], axis=0),
             mk("Reshape", ["x", "shape"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "ax": np.array([0], np.int64), "m1": np.array([-1], np.int64)}
    m = make_model(nodes, {"x": ((3, 4, 5), F)}, {"y": (None, F)}, inits)
    check(m, {"x": rand(3, 4, 5)})


def test_reduce_max_and_min_of_a_shape_constant_fold():
    # Optimum's Flux transformer (FluxPosEmbed): ReduceMax over ConstantOfShape(the ids' length), constant once
    # shapes are static; the ggml backend refused the whole graph for the op type
    nodes = [mk("Shape", ["ids"], ["s"]), mk("Gather", ["s", "zero"], ["n"], axis=0),
             mk("Unsqueeze", ["n", "ax"], ["nu"]), mk("ConstantOfShape", ["nu"], ["ones"],
                                                       value=helper.make_tensor("v", I64, [1], [3])),
             mk("ReduceMax", ["ones"], ["hi"], keepdims=0), mk("ReduceMin", ["ones"], ["lo"], keepdims=0),
             mk("Add", ["hi", "lo"], ["k"]), mk("Cast", ["k"], ["kf"], to=F), mk("Mul", ["x", "kf"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "ax": np.array([0], np.int64)}
    m = make_model(nodes, {"x": ((2, 4), F), "ids": ((5, 3), I64)}, {"y": (None, F)}, inits)
    got = check(m, {"x": rand(2, 4), "ids": np.zeros((5, 3), np.int64)})
    np.testing.assert_allclose(got["y"], rand(2, 4) * 6, rtol=1e-6)


def test_batch_norm_sum_and_dropout_mask():
    c = 4
    nodes = [mk("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"], epsilon=1e-3),
             mk("Sum", ["bn", "x", "x"], ["sm"]), mk("Dropout", ["sm"], ["y", "mask"])]
    inits = {"s": rand(c), "b": rand(c, seed=1), "m": rand(c, seed=2), "v": np.abs(rand(c, seed=3)) + 0.5}
    m = make_model(nodes, {"x": ((2, c, 3, 3), F)}, {"y": (None, F), "mask": (None, helper.TensorProto.BOOL)}, inits)
    check(m, {"x": rand(2, c, 3, 3)})


def test_softmax_before_opset_13_flattens_at_axis_1():
    m = make_model([mk("Softmax", ["x"], ["y"])], {"x": ((2, 3, 4), F)}, {"y": (None, F)}, opset=11)
    check(m, {"x": rand(2, 3, 4)})


def test_conv_input_channels_padded_for_aligned_gemm():
    # 14 channels x 9 taps = 126: padded to 16 channels (144) with zero weights
    m = make_model([mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": ((1, 14, 8, 8), F)},
                   {"y": (None, F)}, {"w": rand(6, 14, 3, 3), "b": rand(6)})
    check(m, {"x": rand(1, 14, 8, 8)})
    check(m, {"x": rand(1, 14, 8, 8)}, pad_k=False)


@pytest.mark.parametrize("kw", [dict(strides=[2, 2], pads=[1, 1, 1, 1]), dict(dilations=[2, 2], pads=[2, 2, 2, 2]),
                                dict(strides=[2, 1], pads=[0, 1, 1, 0])])
def test_conv_rowcopy_strides_and_dilations(kw):
    m = make_model([mk("Conv", ["x", "w", "b"], ["y"], **kw)], {"x": ((1, 5, 11, 10), F)},
                   {"y": (None, F)}, {"w": rand(6, 5, 3, 3), "b": rand(6)})
    check(m, {"x": rand(1, 5, 11, 10)}, conv_impl="rowcopy")
    check(m, {"x": rand(1, 5, 11, 10)}, conv_impl="rowcopy", transpose="write")
    check(m, {"x": rand(1, 5, 11, 10)}, conv_impl="rowcopy", transpose="write", scheduler=True)


def test_depthwise_with_strided_write_transpose():
    m = make_model([mk("Conv", ["x", "w"], ["y"], group=6, pads=[1, 1, 1, 1])], {"x": ((1, 6, 9, 9), F)},
                   {"y": (None, F)}, {"w": rand(6, 1, 3, 3)})
    check(m, {"x": rand(1, 6, 9, 9)}, transpose="write")


@pytest.mark.parametrize("layouts", [True, False])
def test_inverted_residual_block_in_both_layouts(layouts):
    """1x1 expand -> ReLU6 -> depthwise 3x3 -> HardSwish -> 1x1 project -> residual add, as MobileNets
    export it: with ``layouts`` the channels-last values flow from op to op without transposes."""
    c, e = 8, 24
    nodes = [mk("Conv", ["x", "w1", "b1"], ["a"]), mk("Clip", ["a", "lo", "hi"], ["ar"]),
             mk("Conv", ["ar", "wd", "bd"], ["d"], group=e, pads=[1, 1, 1, 1]), mk("HardSwish", ["d"], ["dr"]),
             mk("Conv", ["dr", "w2", "b2"], ["p"]), mk("Add", ["p", "x"], ["s"]), mk("Relu", ["s"], ["y"])]
    inits = {"w1": rand(e, c, 1, 1), "b1": rand(e), "wd": rand(e, 1, 3, 3), "bd": rand(e), "w2": rand(c, e, 1, 1),
             "b2": rand(c), "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    m = make_model(nodes, {"x": ((1, c, 10, 10), F)}, {"y": (None, F), "d": (None, F)}, inits)
    check(m, {"x": rand(1, c, 10, 10)}, layouts=layouts)


@pytest.mark.parametrize("layouts", [True, False])
def test_squeeze_excite_block_in_both_layouts(layouts):
    c = 16
    nodes = [mk("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1]), mk("Relu", ["d"], ["dr"]),
             mk("GlobalAveragePool", ["dr"], ["g"]), mk("Conv", ["g", "f1", "c1"], ["h"]), mk("Relu", ["h"], ["hr"]),
             mk("Conv", ["hr", "f2", "c2"], ["s"]), mk("HardSigmoid", ["s"], ["sg"], alpha=1 / 6, beta=0.5),
             mk("Mul", ["dr", "sg"], ["m"]), mk("Sub", ["m", "shift"], ["ms"]),
             mk("Conv", ["ms", "wp", "bp"], ["y"])]
    inits = {"wd": rand(c, 1, 3, 3), "bd": rand(c), "f1": rand(4, c, 1, 1), "c1": rand(4), "f2": rand(c, 4, 1, 1),
             "c2": rand(c), "shift": rand(1, c, 1, 1), "wp": rand(8, c, 1, 1), "bp": rand(8)}
    m = make_model(nodes, {"x": ((1, c, 7, 7), F)}, {"y": (None, F)}, inits)
    check(m, {"x": rand(1, c, 7, 7)}, layouts=layouts)


@pytest.mark.parametrize("style", ["gather_nd", "flat_gather"])
def test_clip_pooled_output_from_token_ids(style):
    """CLIP's pooled output: hidden[arange(B), argmax(ids)]: the integer work runs on the host."""
    b, n, d = 2, 7, 5
    nodes = [mk("MatMul", ["emb", "w"], ["hidden"]), mk("Cast", ["ids"], ["ids32"], to=helper.TensorProto.INT32),
             mk("ArgMax", ["ids32"], ["am"], axis=-1, keepdims=0)]
    inits = {"w": rand(d, d), "ar": np.arange(b, dtype=np.int64)}
    if style == "gather_nd":
        nodes += [mk("Cast", ["am"], ["am64"], to=I64), mk("Unsqueeze", ["ar", "ax"], ["a1"]),
                  mk("Unsqueeze", ["am64", "ax"], ["a2"]), mk("Concat", ["a1", "a2"], ["idx"], axis=-1),
                  mk("GatherND", ["hidden", "idx"], ["pooled"])]
        inits["ax"] = np.array([-1], np.int64)
    else:
        nodes += [mk("Cast", ["am"], ["am64"], to=I64), mk("Mul", ["ar", "n"], ["base"]),
                  mk("Add", ["base", "am64"], ["flat"]), mk("Reshape", ["hidden", "shape"], ["rows"]),
                  mk("Gather", ["rows", "flat"], ["pooled"], axis=0)]
        inits.update(n=np.array(n, np.int64), shape=np.array([b * n, d], np.int64))
    m = make_model(nodes, {"emb": ((b, n, d), F), "ids": ((b, n), I64)},
                   {"pooled": (None, F), "am": (None, I64)}, inits)
    ids = np.array([[3, 9, 1, 0, 0, 0, 0], [5, 2, 8, 49407, 0, 0, 0]], np.int64)
    check(m, {"emb": rand(b, n, d), "ids": ids})


def test_clip_does_not_clamp_a_shared_input_in_place():
    # ggml_clamp is in-place: the conv output also feeds the Add, which must see it unclamped
    nodes = [mk("Conv", ["x", "w"], ["c"]), mk("Clip", ["c", "lo", "hi"], ["r"]), mk("Add", ["r", "c"], ["y"]),
             mk("Clip", ["x", "lo", "hi"], ["xr"]), mk("Sub", ["xr", "x"], ["z"])]
    m = make_model(nodes, {"x": ((1, 4, 5, 5), F)}, {"y": (None, F), "z": (None, F)},
                   {"w": rand(4, 4, 1, 1) * 4, "lo": np.array(0.0, np.float32), "hi": np.array(0.5, np.float32)})
    check(m, {"x": rand(1, 4, 5, 5)})


@pytest.mark.parametrize("after_depthwise", [True, False])
def test_pointwise_conv_with_padded_channels(after_depthwise):
    # 24x24 pixels x 40 -> 120 channels: big enough that K is padded to 48 for the fast GEMM
    c, oc = 40, 120
    nodes = [mk("Conv", ["x", "wd"], ["d"], group=c, pads=[1, 1, 1, 1])] if after_depthwise else [
        mk("Relu", ["x"], ["d"])]
    nodes.append(mk("Conv", ["d", "w", "b"], ["y"]))
    m = make_model(nodes, {"x": ((1, c, 24, 24), F)}, {"y": (None, F)},
                   {"wd": rand(c, 1, 3, 3), "w": rand(oc, c, 1, 1), "b": rand(oc)})
    check(m, {"x": rand(1, c, 24, 24)})


# -- the lowerings that no other test reaches (issue 20): each against onnxruntime -----------------


@pytest.mark.parametrize("op", ["Sin", "Cos", "Floor", "Ceil"])
def test_math_unary_on_runtime_tensors(op):
    x = rand(2, 3, 7) * 3
    x[0, 0, :4] = [-1.5, -0.5, 0.5, 2.0]  # exact halves and integers for Floor/Ceil
    _unary(op, x)


def test_elu_alpha_one_and_other_alpha_refused():
    _unary("Elu", rand(3, 9) * 2)
    m = make_model([mk("Elu", ["x"], ["y"], alpha=0.5, name="elu_half")], {"x": ((3, 9), F)}, {"y": (None, F)})
    from sdrt.errors import UnsupportedGraph

    with pytest.raises(UnsupportedGraph, match="elu_half"):
        compile_ggml(m)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_log_softmax_is_not_softmax(axis):
    x = rand(3, 5, 6) * 4
    got = _unary("LogSoftmax", x, axis=axis)
    assert np.all(got["y"] < 0)  # a Softmax lowering in its place would give values in (0, 1)


def test_size_of_a_runtime_tensor_feeds_arithmetic():
    nodes = [mk("Size", ["x"], ["n"]), mk("Cast", ["n"], ["nf"], to=F), mk("Div", ["x", "nf"], ["y"])]
    m = make_model(nodes, {"x": ((2, 3, 5), F)}, {"y": (None, F)})
    check(m, {"x": rand(2, 3, 5)})


@pytest.mark.parametrize("shape,reps", [((2, 3), (2, 1)), ((2, 3), (1, 3)), ((1, 2, 3, 2), (2, 2, 1, 3)), ((4,), (3,))])
def test_tile(shape, reps):
    m = make_model([mk("Tile", ["x", "r"], ["y"])], {"x": (shape, F)}, {"y": (None, F)},
                   {"r": np.array(reps, np.int64)})
    check(m, {"x": rand(*shape)})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_opset9(mode):
    m = make_model([mk("Upsample", ["x", "s"], ["y"], mode=mode)], {"x": ((1, 2, 3, 4), F)}, {"y": (None, F)},
                   {"s": np.array([1, 1, 2, 2], np.float32)}, opset=9)
    if mode == "linear":  # opset 9 linear is asymmetric: not among the supported transforms
        from sdrt.errors import UnsupportedGraph

        with pytest.raises(UnsupportedGraph):
            compile_ggml(m)
        return
    check(m, {"x": rand(1, 2, 3, 4)})


# -- regressions found by the random-graph run (scripts/ggml_fuzz.py) ----------------------------


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_transpose_with_batch_above_one(stride):
    # ggml's CPU kernel computed batch item 0 only: the other items came out wrong
    w = rand(4, 3, 2, 2, seed=3)
    m = make_model([mk("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], strides=[stride, stride])],
                   {"x": ((3, 4, 3, 5), F)}, {"y": (None, F)}, {"w": w})
    check(m, {"x": rand(3, 4, 3, 5)})


def test_conv_with_one_channel_and_group_one():
    # group == channels == 1 was taken for a depthwise conv whose dense fallback had no weights
    m = make_model([mk("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1], pads=[0, 0, 0, 1])],
                   {"x": ((2, 1, 1, 3), F)}, {"y": (None, F)},
                   {"w": np.full((1, 1, 1, 1), 0.5, np.float32), "b": np.ones(1, np.float32)})
    check(m, {"x": rand(2, 1, 1, 3)})


def test_depthwise_conv_on_a_one_pixel_wide_input():
    # the channels-last depthwise kernel aborted the process (GGML_ABORT) when W == 1
    m = make_model([mk("Conv", ["x", "w"], ["y"], kernel_shape=[2, 2], pads=[0, 1, 0, 1], strides=[2, 2], group=5)],
                   {"x": ((1, 5, 6, 1), F)}, {"y": (None, F)}, {"w": rand(5, 1, 2, 2, seed=2)})
    check(m, {"x": rand(1, 5, 6, 1)})


# -- what the flow transformers (SD3, Flux, Chroma) export ----------------------------------------------------

def test_einsum_unpatchify_permutes_six_dims():
    # SD3: Reshape to (n, h, w, p, q, c), Einsum nhwpqc->nchpwq, Reshape to (n, c, h p, w q), batch 2
    n, h, w, p, c = 2, 3, 5, 2, 4
    nodes = [mk("Reshape", ["x", "s6"], ["a"]), mk("Einsum", ["a"], ["b"], equation="nhwpqc->nchpwq"),
             mk("Reshape", ["b", "s4"], ["y"])]
    inits = {"s6": np.array([n, h, w, p, p, c], np.int64), "s4": np.array([n, c, h * p, w * p], np.int64)}
    m = make_model(nodes, {"x": ((n, h * w, p * p * c), F)}, {"y": (None, F)}, inits)
    check(m, {"x": rand(n, h * w, p * p * c)}, rtol=0, atol=0)


def test_einsum_outer_product_of_rotary_angles():
    nodes = [mk("Einsum", ["pos", "freqs"], ["y"], equation="i,j->ij")]
    m = make_model(nodes, {"pos": ((24,), F)}, {"y": (None, F)}, {"freqs": rand(8, seed=1)})
    check(m, {"pos": rand(24)})


@pytest.mark.parametrize("batch", [1, 2])
def test_rotary_pairs_stacked_in_five_dims(batch):
    # Flux/Chroma (diffusers' apply_rotary_emb, exported): the pairs (x0, x1) of q [B, S, H, D] become
    # (-x1, x0) through Unsqueeze(-1) and a Concat of [B, S, H, D/2, 1] values, then a Reshape back to
    # [B, S, H, D]; at batch 2 the five dims do not fit ggml's four
    s, h, d = 6, 3, 8
    nodes = [mk("Slice", ["x", "one", "big", "ax3", "two"], ["odd"]), mk("Neg", ["odd"], ["nodd"]),
             mk("Slice", ["x", "zero", "big", "ax3", "two"], ["even"]),
             mk("Unsqueeze", ["nodd", "last"], ["a"]), mk("Unsqueeze", ["even", "last"], ["b"]),
             mk("Concat", ["a", "b"], ["ab"], axis=-1), mk("Reshape", ["ab", "shape"], ["rot"]),
             mk("Mul", ["x", "cos"], ["xc"]), mk("Mul", ["rot", "sin"], ["rs"]), mk("Add", ["xc", "rs"], ["y"])]
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"zero": i64(0), "one": i64(1), "big": i64(2**62), "ax3": i64(3), "two": i64(2), "last": i64(-1),
             "shape": i64(batch, s, h, d), "cos": rand(1, s, 1, d, seed=1), "sin": rand(1, s, 1, d, seed=2)}
    m = make_model(nodes, {"x": ((batch, s, h, d), F)}, {"y": (None, F)}, inits)
    check(m, {"x": rand(batch, s, h, d)}, rtol=0, atol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat_of_five_dim_values_on_any_axis(axis):
    # the axes either side of the joined one are merged: (before, axis, after) fits ggml; a constant operand too
    shape = (2, 3, 2, 4, 5)
    other = list(shape)
    other[axis] = 1
    nodes = [mk("Reshape", ["x", "s5"], ["a"]), mk("Concat", ["a", "c", "a"], ["b"], axis=axis),
             mk("Squeeze", ["b"], ["y"]) if axis == -1 else mk("Reshape", ["b", "flat"], ["y"])]
    inits = {"s5": np.array(shape, np.int64), "c": rand(*other, seed=3), "flat": np.array([-1], np.int64)}
    m = make_model(nodes, {"x": ((2, 6, 20), F)}, {"y": (None, F)}, inits)
    check(m, {"x": rand(2, 6, 20)}, rtol=0, atol=0)


@pytest.mark.parametrize("batch", [1, 2])
def test_rotary_as_the_original_flux_writes_it_in_six_dims(batch):
    # BFL's apply_rope: x.reshape(B, H, L, D/2, 1, 2); out = f[..., 0] * x[..., 0] + f[..., 1] * x[..., 1] with
    # rotations f [B, 1, L, D/2, 2, 2]; the elementwise ops run on views with the axes they treat alike merged
    h, n, d = 3, 5, 8
    nodes = [mk("Reshape", ["x", "s6"], ["x6"]),
             mk("Gather", ["x6", "i0"], ["x0"], axis=-1), mk("Gather", ["x6", "i1"], ["x1"], axis=-1),
             mk("Gather", ["f", "i0"], ["f0"], axis=-1), mk("Gather", ["f", "i1"], ["f1"], axis=-1),
             mk("Mul", ["f0", "x0"], ["a"]), mk("Mul", ["f1", "x1"], ["b"]), mk("Add", ["a", "b"], ["r"]),
             mk("Reshape", ["r", "s4"], ["r4"]), mk("Relu", ["r"], ["pos"]), mk("Reshape", ["pos", "s4"], ["p4"])]
    inits = {"s6": np.array([batch, h, n, d // 2, 1, 2], np.int64), "s4": np.array([batch, h, n, d], np.int64),
             "i0": np.array(0, np.int64), "i1": np.array(1, np.int64)}
    m = make_model(nodes, {"x": ((batch, h, n, d), F), "f": ((batch, 1, n, d // 2, 2, 2), F)},
                   {"r4": (None, F), "p4": (None, F)}, inits)
    check(m, {"x": rand(batch, h, n, d), "f": rand(batch, 1, n, d // 2, 2, 2, seed=1)}, rtol=0, atol=1e-6)


@pytest.mark.parametrize("how", ["gather", "split", "slice"])
def test_fused_qkv_cut_in_five_dims(how):
    # qkv [B, S, 3 H D] -> [B, S, 3, H, D]: q, k, v by a Gather after a permutation to [3, B, H, S, D], a Split
    # on axis 2, or Slices (one strided) of the five-dim value
    b, s, h, d = 2, 4, 3, 5
    shape5 = np.array([b, s, 3, h, d], np.int64)
    nodes = [mk("Reshape", ["x", "s5"], ["x5"])]
    if how == "gather":
        nodes += [mk("Transpose", ["x5"], ["t"], perm=[2, 0, 3, 1, 4])]
        nodes += [mk("Gather", ["t", f"i{i}"], [n], axis=0) for i, n in enumerate("qkv")]
    elif how == "split":
        nodes += [mk("Split", ["x5"], ["q5", "k5", "v5"], axis=2)]
        nodes += [mk("Squeeze", [f"{n}5", "ax2"], [n]) for n in "qkv"]
    else:
        nodes += [mk("Slice", ["x5", "st", "en", "ax"], ["q5"]), mk("Slice", ["x5", "st1", "en1", "ax2"], ["k5"]),
                  mk("Slice", ["x5", "st2", "en2", "ax2", "two"], ["v5"])]
        nodes += [mk("Reshape", [f"{n}5", "any"], [n]) for n in "qkv"]
    nodes += [mk("Mul", ["q", "k"], ["qk"]), mk("Sub", ["qk", "v"], ["y"])]
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"s5": shape5, "i0": i64(0), "i1": i64(1), "i2": i64(2), "ax2": i64(2),
             "st": i64(0, 0), "en": i64(1, 1), "ax": i64(2, 0), "st1": i64(1), "en1": i64(2), "st2": i64(2),
             "en2": i64(3), "two": i64(1), "any": i64(b if how == "slice" else -1, -1, d)}
    if how == "slice":  # q keeps batch row 0 only: (1, S, H, D) against k's and v's (B, S, H, D)
        inits["any"] = i64(-1, s, h, d)
    m = make_model(nodes, {"x": ((b, s, 3 * h * d), F)}, {"y": (None, F)}, inits)
    check(m, {"x": rand(b, s, 3 * h * d)}, rtol=0, atol=1e-6)


def test_six_dim_value_read_by_another_op_is_refused_not_aborted():
    nodes = [mk("Reshape", ["x", "s6"], ["a"]), mk("Softmax", ["a"], ["y"])]
    m = make_model(nodes, {"x": ((2, 3, 4), F)}, {"y": (None, F)}, {"s6": np.array([2, 3, 2, 2, 1, 1], np.int64)})
    from sdrt.errors import UnsupportedGraph

    with pytest.raises(UnsupportedGraph, match="more than 4 dimensions"):
        compile_ggml(m)


def test_five_dim_broadcast_that_merges_to_five_groups_is_refused_not_aborted():
    # the operands alternate between spanning and broadcasting: no two adjacent axes merge
    nodes = [mk("Reshape", ["x", "s5"], ["a"]), mk("Add", ["a", "c"], ["y"])]
    m = make_model(nodes, {"x": ((2, 3, 8), F)}, {"y": (None, F)},
                   {"s5": np.array([2, 3, 2, 2, 2], np.int64), "c": rand(2, 1, 2, 1, 2)})
    from sdrt.errors import UnsupportedGraph

    with pytest.raises(UnsupportedGraph, match="more than 4 distinct axis groups"):
        compile_ggml(m)


def test_where_on_a_mask_computed_from_a_bool_input():
    # Chroma: mask[:, None, None, :] & mask[:, None, :, None]; masked_fill(~m, min); softmax; masked_fill(~m, 0)
    nodes = [mk("Unsqueeze", ["m", "ax_k"], ["mk"]), mk("Unsqueeze", ["m", "ax_q"], ["mq"]),
             mk("And", ["mk", "mq"], ["m2"]), mk("Not", ["m2"], ["drop"]),
             mk("Where", ["drop", "low", "s"], ["s2"]), mk("Softmax", ["s2"], ["p"], axis=-1),
             mk("Where", ["drop", "zero", "p"], ["y"])]
    inits = {"ax_k": np.array([1, 2], np.int64), "ax_q": np.array([1, 3], np.int64),
             "low": np.array(np.finfo(np.float32).min, np.float32), "zero": np.array(0.0, np.float32)}
    m = make_model(nodes, {"s": ((1, 2, 6, 6), F), "m": ((1, 6), helper.TensorProto.BOOL)}, {"y": (None, F)}, inits)
    mask = np.array([[True, True, True, False, False, True]])
    with compile_ggml(m) as sess:  # one session: the mask is read each run, not folded at compile time
        for other in (mask, np.ones_like(mask), np.array([[True, False, False, False, False, False]])):
            feeds = {"s": rand(1, 2, 6, 6, seed=int(other.sum())), "m": other}
            got, want = sess.run(feeds)["y"], run_ort(m, feeds)["y"]
            assert np.isfinite(got).all()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
