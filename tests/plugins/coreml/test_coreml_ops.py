"""Each lowering against onnxruntime, evaluated in numpy by the MIL ops' own value inference."""

from __future__ import annotations

import numpy as np
import pytest
from coreml_helpers import check, make_model, mil_eval, ort_intermediates, run_ort
from onnx import TensorProto as TP
from onnx import helper

F = TP.FLOAT
rng = np.random.default_rng(0)


def _x(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _unary(op: str, x: np.ndarray, opset: int = 17, **attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    return make_model([node], {"x": (x.shape, F)}, {"y": (None, F)}, opset=opset)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Sin", "Cos", "Abs", "Neg", "Floor",
                                "Ceil", "Softplus", "HardSwish", "Identity", "Sign"])
def test_unary(op):
    x = _x(2, 3, 5)
    check(_unary(op, x), {"x": x})


def test_sqrt_log_reciprocal():
    x = np.abs(_x(4, 6)) + 0.1
    for op in ("Sqrt", "Log", "Reciprocal"):
        check(_unary(op, x), {"x": x})


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(approx):
    x = _x(3, 8)
    check(_unary("Gelu", x, opset=20, approximate=approx), {"x": x})


def test_activations_with_attributes():
    x = _x(2, 9)
    check(_unary("HardSigmoid", x, alpha=0.3, beta=0.4), {"x": x})
    check(_unary("LeakyRelu", x, alpha=0.2), {"x": x})
    check(_unary("Elu", x, alpha=0.7), {"x": x})
    check(_unary("Clip", x, opset=10, min=-0.5, max=0.5), {"x": x})


def test_clip_with_constant_bounds_one_sided_and_both():
    x = _x(4, 4)
    for lo, hi in ((np.float32(0), np.float32(6)), (np.float32(-1), None), (None, np.float32(1))):
        inits, names = {}, ["x"]
        for tag, v in (("lo", lo), ("hi", hi)):
            if v is not None:
                inits[tag] = np.asarray(v)
            names.append(tag if v is not None else "")
        node = helper.make_node("Clip", names, ["y"])
        check(make_model([node], {"x": (x.shape, F)}, {"y": (None, F)}, inits), {"x": x})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize(("sa", "sb"), [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((1, 3, 1), (2, 1, 4))])
def test_binary_broadcast(op, sa, sb):
    a, b = _x(*sa), _x(*sb) + (3.0 if op == "Div" else 0.0)
    node = helper.make_node(op, ["a", "b"], ["y"])
    check(make_model([node], {"a": (sa, F), "b": (sb, F)}, {"y": (None, F)}), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Mul", "Div", "Sub", "Pow"])
def test_binary_with_a_scalar_constant(op):
    x = np.abs(_x(3, 4)) + 0.5
    node = helper.make_node(op, ["x", "c"], ["y"])
    check(make_model([node], {"x": (x.shape, F)}, {"y": (None, F)}, {"c": np.asarray(2.0, np.float32)}), {"x": x})


def test_compare_and_where():
    a, b = _x(3, 4), _x(3, 4)
    nodes = [helper.make_node("Greater", ["a", "b"], ["g"]), helper.make_node("Not", ["g"], ["n"]),
             helper.make_node("Where", ["n", "a", "b"], ["y"])]
    check(make_model(nodes, {"a": ((3, 4), F), "b": ((3, 4), F)}, {"y": (None, F)}), {"a": a, "b": b})


@pytest.mark.parametrize(("sa", "sb", "const_b"), [((4, 8), (8, 5), False), ((2, 3, 4, 8), (8, 6), True),
                                                   ((2, 3, 4, 8), (2, 3, 8, 5), False)])
def test_matmul(sa, sb, const_b):
    a, b = _x(*sa), _x(*sb)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    if const_b:
        check(make_model([node], {"a": (sa, F)}, {"y": (None, F)}, {"b": b}), {"a": a})
    else:
        check(make_model([node], {"a": (sa, F), "b": (sb, F)}, {"y": (None, F)}), {"a": a, "b": b})


@pytest.mark.parametrize(("trans_b", "alpha", "beta"), [(1, 1.0, 1.0), (0, 1.0, 1.0), (1, 0.5, 2.0)])
def test_gemm(trans_b, alpha, beta):
    a = _x(3, 8)
    w = _x(5, 8) if trans_b else _x(8, 5)
    node = helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=trans_b, alpha=alpha, beta=beta)
    check(make_model([node], {"a": ((3, 8), F)}, {"y": (None, F)}, {"w": w, "c": _x(5)}), {"a": a})


def test_layer_norm_and_softmax():
    x = _x(2, 5, 16)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Softmax", ["n"], ["y"], axis=-1)]
    check(make_model(nodes, {"x": (x.shape, F)}, {"y": (None, F)}, {"g": _x(16), "b": _x(16)}), {"x": x})


def test_group_norm_torch_pattern():
    """torch's GroupNorm export: Reshape -> InstanceNormalization -> Reshape -> Mul -> Add."""
    x = _x(1, 8, 4, 4)
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["i"], epsilon=1e-6),
             helper.make_node("Reshape", ["i", "s2"], ["b"]),
             helper.make_node("Mul", ["b", "gamma"], ["m"]), helper.make_node("Add", ["m", "beta"], ["y"])]
    inits = {"s1": np.array([0, 4, -1], np.int64), "s2": np.array([1, 8, 4, 4], np.int64),
             "ones": np.ones(4, np.float32), "zeros": np.zeros(4, np.float32),
             "gamma": _x(8, 1, 1), "beta": _x(8, 1, 1)}
    check(make_model(nodes, {"x": (x.shape, F)}, {"y": (None, F)}, inits), {"x": x})


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_op(opset):
    x = _x(2, 6, 3, 3)
    per = 3 if opset == 18 else 6  # opset 18: one scale per group; 21: per channel
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-5)
    model = make_model([node], {"x": (x.shape, F)}, {"y": (None, F)}, {"s": _x(per), "b": _x(per)}, opset=opset)
    if opset == 18:  # onnxruntime implements opset 18's per-group form; check against numpy instead
        ev = mil_eval(model, {"x": x})
        g = x.reshape(2, 3, -1)
        n = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
        init = {i.name: i for i in model.graph.initializer}
        s = np.repeat(np.frombuffer(init["s"].raw_data, np.float32), 2).reshape(1, 6, 1, 1)
        b = np.repeat(np.frombuffer(init["b"].raw_data, np.float32), 2).reshape(1, 6, 1, 1)
        np.testing.assert_allclose(ev.outputs["y"], n * s + b, rtol=1e-4, atol=1e-5)
    else:
        check(model, {"x": x})


def test_instance_norm_with_affine():
    x = _x(2, 3, 5, 5)
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)
    check(make_model([node], {"x": (x.shape, F)}, {"y": (None, F)}, {"s": _x(3), "b": _x(3)}), {"x": x})


def test_batch_norm_inference():
    x = _x(1, 4, 3, 3)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-5)
    inits = {"s": _x(4), "b": _x(4), "m": _x(4), "v": np.abs(_x(4)) + 0.5}
    check(make_model([node], {"x": (x.shape, F)}, {"y": (None, F)}, inits), {"x": x})


def test_layout_ops():
    x = _x(2, 3, 4, 6)
    i64 = np.int64
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "shape"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "ax0"], ["u"]),
             helper.make_node("Squeeze", ["u", "ax0"], ["q"]),
             helper.make_node("Slice", ["q", "st", "en", "axs", "sp"], ["s"]),
             helper.make_node("Split", ["s", "parts"], ["p0", "p1"], axis=1),
             helper.make_node("Concat", ["p1", "p0", "p1"], ["c"], axis=1),
             helper.make_node("Flatten", ["c"], ["y"], axis=1)]
    inits = {"shape": np.array([0, 4, -1], i64), "ax0": np.array([0], i64), "st": np.array([1, 0], i64),
             "en": np.array([100, 17], i64), "axs": np.array([2, 1], i64), "sp": np.array([2, 1], i64),
             "parts": np.array([1, 3], i64)}
    check(make_model(nodes, {"x": (x.shape, F)}, {"y": (None, F)}, inits), {"x": x})


def test_expand_tile_pad():
    x = _x(3, 1, 4)
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Tile", ["e", "reps"], ["t"]),
             helper.make_node("Pad", ["t", "pads", "val"], ["y"], mode="constant")]
    inits = {"shape": np.array([2, 3, 5, 4], np.int64), "reps": np.array([1, 1, 2, 1], np.int64),
             "pads": np.array([0, 0, 1, 2, 0, 0, 1, 0], np.int64), "val": np.asarray(0.5, np.float32)}
    check(make_model(nodes, {"x": (x.shape, F)}, {"y": (None, F)}, inits), {"x": x})


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_modes(mode):
    x = _x(1, 2, 5, 5)
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    check(make_model([node], {"x": (x.shape, F)}, {"y": (None, F)},
                     {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}), {"x": x})


def test_gather_embedding_with_int64_ids_and_argmax():
    """CLIP's token embedding lookup and its pooled-token pick."""
    table = _x(10, 6)
    ids = np.array([[1, 4, 9, 0]], np.int64)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("ArgMax", ["ids"], ["am"], axis=-1, keepdims=0),
             helper.make_node("Gather", ["e", "idx"], ["y"], axis=1)]
    model = make_model(nodes, {"ids": ((1, 4), TP.INT64)}, {"y": (None, F), "am": (None, TP.INT64)},
                       {"table": table, "idx": np.asarray(-1, np.int64)})
    check(model, {"ids": ids})


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
def test_reduce(op):
    x = _x(2, 3, 4)
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1) if op == "ReduceSum" else \
        helper.make_node(op, ["x"], ["y"], axes=[1, -1], keepdims=0)
    inits = {"axes": np.array([1, -1], np.int64)} if op == "ReduceSum" else {}
    check(make_model([node], {"x": (x.shape, F)}, {"y": (None, F)}, inits), {"x": x})


def test_global_average_pool_and_cast():
    x = _x(1, 5, 4, 4)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Cast", ["p"], ["y"], to=TP.FLOAT16)]
    check(make_model(nodes, {"x": (x.shape, F)}, {"y": (None, TP.FLOAT16)}), {"x": x}, rtol=1e-3, atol=1e-3)


def _attention_model(scale: float, mask: bool) -> tuple:
    """Multi-head attention as torch exports it: scores, scale, (mask), softmax, values."""
    b, h, n, d = 1, 2, 5, 8
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "c"], ["s1"])]
    last = "s1"
    inits = {"c": np.asarray(scale, np.float32)}
    if mask:
        nodes.append(helper.make_node("Add", ["s1", "mask"], ["s2"]))
        inits["mask"] = np.triu(np.full((n, n), -1e4, np.float32), 1)[None, None]
        last = "s2"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    shapes = {t: ((b, h, n, d), F) for t in "qkv"}
    feeds = {t: _x(b, h, n, d) for t in "qkv"}
    return make_model(nodes, shapes, {"y": (None, F)}, inits), feeds


@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("scale", [8 ** -0.5, 0.2])
def test_attention_fused_on_ios18_and_decomposed_before(mask, scale):
    model, feeds = _attention_model(scale, mask)
    fused = check(model, feeds, target="macOS15")
    assert fused.fused_attention == 1
    plain = check(model, feeds, target="macOS14")
    assert plain.fused_attention == 0


def test_attention_not_fused_when_the_scores_are_used_twice():
    model, feeds = _attention_model(0.3, False)
    model.graph.output.append(helper.make_tensor_value_info("s1", F, None))
    assert check(model, feeds, target="macOS15").fused_attention == 0


def test_ops_without_value_inference_are_counted_and_fed_from_a_reference():
    """conv, pools and upsample have no value inference in coremltools: with onnxruntime's
    intermediates standing in for them, everything after them is still checked by value."""
    x = _x(1, 3, 8, 8)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["a", "", "sc"], ["u"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Resize", ["u", "", "sc"], ["l"], mode="linear"),
             helper.make_node("Sigmoid", ["l"], ["y"])]
    inits = {"w": _x(4, 3, 3, 3), "b": _x(4), "sc": np.array([1, 1, 2, 2], np.float32)}
    model = make_model(nodes, {"x": (x.shape, F)}, {"y": (None, F)}, inits)
    blind = mil_eval(model, {"x": x})
    assert blind.outputs["y"] is None and blind.stand_ins == {"conv": 1}
    ev = mil_eval(model, {"x": x}, reference=ort_intermediates(model, {"x": x}))
    assert ev.stand_ins == {"conv": 1, "max_pool": 1, "avg_pool": 1, "upsample_nearest_neighbor": 1,
                            "upsample_bilinear": 1}
    np.testing.assert_allclose(ev.outputs["y"], run_ort(model, {"x": x})["y"], rtol=1e-5, atol=1e-6)


def test_a_unet_upsampler_off_the_grid_picks_the_rows_torch_picks():
    """diffusers' UNet at a side that is not a multiple of 64 sizes each upsampler from its skip (12 -> 23 rows):
    sizes read from a Shape, folded once the shapes are pinned; not a whole factor, so gathers by fixed indices."""
    x, skip = _x(1, 3, 12, 6), _x(1, 2, 23, 11)
    nodes = [helper.make_node("Shape", ["skip"], ["s"]),
             helper.make_node("Slice", ["s", "two", "four"], ["hw"]),
             helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    inits = {"two": np.array([2], np.int64), "four": np.array([4], np.int64), "nc": np.array([1, 3], np.int64)}
    model = make_model(nodes, {"x": (x.shape, F), "skip": (skip.shape, F)}, {"y": (None, F)}, inits)
    ev = check(model, {"x": x, "skip": skip}, rtol=0, atol=0)
    assert ev.stand_ins == {}


_MODES = [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("pytorch_half_pixel", "round_prefer_ceil"),
          ("align_corners", "ceil"), ("tf_half_pixel_for_nn", "round_prefer_floor")]


@pytest.mark.parametrize(("ctm", "pick", "scales"), [
    *[(c, p, s) for c, p in _MODES for s in ((1.5, 2.25), (0.5, 0.75))],
    # whole factors with a rounding that picks floor(i / s) are upsample_nearest_neighbor, which has no value
    # inference (the test above feeds it); these two pick other rows, so they are gathers too
    ("align_corners", "ceil", (3.0, 2.0)), ("tf_half_pixel_for_nn", "round_prefer_floor", (3.0, 2.0))])
def test_nearest_resize_by_any_factor_and_rounding(ctm, pick, scales):
    x = _x(1, 2, 8, 8)
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest", coordinate_transformation_mode=ctm,
                            nearest_mode=pick)
    model = make_model([node], {"x": (x.shape, F)}, {"y": (None, F)}, {"sc": np.array([1, 1, *scales], np.float32)})
    check(model, {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize(("equation", "sa", "sb"), [
    ("bhid,bhjd->bhij", (1, 2, 4, 8), (1, 2, 5, 8)),   # attention scores, old diffusers exports
    ("bhij,bhjd->bhid", (1, 2, 4, 5), (1, 2, 5, 8)),   # attention values
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
    ("ij,kj->ki", (3, 4), (5, 4)),                     # output in another order
])
def test_einsum_as_batched_matmul(equation, sa, sb):
    a, b = _x(*sa), _x(*sb)
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)
    check(make_model([node], {"a": (a.shape, F), "b": (b.shape, F)}, {"y": (None, F)}, opset=17), {"a": a, "b": b})


@pytest.mark.parametrize("equation", ["ij->ji", "nhwpc->nchpw"])  # SD3's unpatchify permutes this way
def test_einsum_of_one_operand_is_a_transpose(equation):
    a = _x(*range(2, 2 + len(equation.split("->")[0])))
    node = helper.make_node("Einsum", ["a"], ["y"], equation=equation)
    check(make_model([node], {"a": (a.shape, F)}, {"y": (None, F)}, opset=17), {"a": a})


@pytest.mark.parametrize(("equation", "why"), [("ij->i", "only axis permutations"), ("ii,ij->j", "repeated indices"),
                                               ("ij,jk->i", "summed within one operand")])
def test_einsum_forms_not_lowered_are_unsupported_naming_the_node(equation, why):
    from sdrt.errors import UnsupportedGraph

    a = _x(3, 3)
    names = ["a"] if equation.count(",") == 0 else ["a", "a"]
    node = helper.make_node("Einsum", names, ["y"], equation=equation, name="my_einsum")
    with pytest.raises(UnsupportedGraph, match=f"my_einsum.*{why}"):
        mil_eval(make_model([node], {"a": (a.shape, F)}, {"y": (None, F)}), {"a": a})


def test_shape_and_size_of_a_runtime_tensor_are_constants():
    x = _x(2, 3, 4)
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1), helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("Reshape", ["x", "s2"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    model = make_model(nodes, {"x": (x.shape, F)}, {"y": (None, F), "s": (None, TP.INT64), "n": (None, TP.INT64)},
                       {"s2": np.array([6, 4], np.int64)})
    check(model, {"x": x})


def test_isnan_isinf_and_gather_nd():
    x = _x(2, 5)
    x[0, 1], x[1, 3], x[1, 0] = np.nan, np.inf, -np.inf
    nodes = [helper.make_node("IsNaN", ["x"], ["n"]), helper.make_node("IsInf", ["x"], ["i"]),
             helper.make_node("Or", ["n", "i"], ["bad"]), helper.make_node("Where", ["bad", "zero", "x"], ["c"]),
             helper.make_node("GatherND", ["c", "idx"], ["y"])]
    model = make_model(nodes, {"x": (x.shape, F)}, {"c": (None, F), "y": (None, F)},
                       {"zero": np.asarray(0, np.float32), "idx": np.array([[1, 3], [0, 2]], np.int64)})
    ev = mil_eval(model, {"x": x}, reference=ort_intermediates(model, {"x": x}))
    assert ev.stand_ins == {"gather_nd": 1}  # coremltools has no value inference for gather_nd
    want = run_ort(model, {"x": x})
    np.testing.assert_array_equal(ev.outputs["c"], want["c"])
    np.testing.assert_array_equal(ev.outputs["y"], want["y"])


@pytest.mark.parametrize(("mask_value", "fused"), [(-1e4, 1), (-np.inf, 0)])
def test_attention_with_torch_dynamo_nan_guard(mask_value, fused):
    """Where(IsNaN(P), 0, P) after the softmax fuses when the mask is finite, and is kept otherwise."""
    b, h, n, d = 1, 2, 4, 8
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "c"], ["s1"]),
             helper.make_node("Add", ["s1", "mask"], ["s2"]), helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pg"]),
             helper.make_node("MatMul", ["pg", "v"], ["y"])]
    mask = np.triu(np.full((n, n), mask_value, np.float32), 1)[None, None]
    inits = {"c": np.asarray(d ** -0.5, np.float32), "mask": mask, "zero": np.asarray(0, np.float32)}
    shapes = {"q": ((b, h, n, d), F), "kt": ((b, h, d, n), F), "v": ((b, h, n, d), F)}
    feeds = {"q": _x(b, h, n, d), "kt": _x(b, h, d, n), "v": _x(b, h, n, d)}
    ev = check(make_model(nodes, shapes, {"y": (None, F)}, inits), feeds, target="macOS15")
    assert ev.fused_attention == fused
