"""``sdrt.precision.to_half``: what becomes half, what stays float32, and the error paths."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.errors import ModelError, SdrtError
from sdrt.graph import Graph
from sdrt.precision import PRECISION_KEY, half_array, plan, to_half

F, H = TensorProto.FLOAT, TensorProto.FLOAT16


def _model(nodes, inputs, outputs, inits=None, opset=17) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    out = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.input) + list(g.output)}
    out.update({t.name: t.data_type for t in g.initializer})
    return out


def _attention_block() -> onnx.ModelProto:
    """MatMul -> Softmax -> MatMul -> LayerNormalization, as a transformer block exports."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="/attn/to_q/MatMul"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="/attn/MatMul"),
        helper.make_node("Softmax", ["s"], ["p"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="/attn/MatMul_1"),
        helper.make_node("LayerNormalization", ["o", "gamma", "beta"], ["y"], name="/norm/LayerNormalization",
                         axis=-1, epsilon=1e-5),
    ]
    inits = {"wq": rng.standard_normal((16, 16), dtype=np.float32) * 0.25,
             "kt": rng.standard_normal((16, 8), dtype=np.float32),
             "v": rng.standard_normal((8, 16), dtype=np.float32),
             "gamma": np.ones(16, np.float32), "beta": np.zeros(16, np.float32)}
    return _model(nodes, {"x": ([2, 16], F)}, {"y": ([2, 16], F)}, inits)


def test_matmuls_run_half_while_softmax_and_layernorm_stay_float32() -> None:
    half = to_half(Graph(_attention_block()))
    onnx.checker.check_model(half.model, full_check=True)
    types = _types(half.model)
    by_name = {n.name: n for n in half.model.graph.node}
    assert types["wq"] == H and types["kt"] == H and types["v"] == H, "weights of half nodes are stored in half"
    assert types["gamma"] == F and types["beta"] == F, "weights only a float32 node reads keep float32"
    assert types[by_name["/attn/MatMul"].output[0]] == H
    assert types[by_name["/attn/Softmax"].input[0]] == F and types["p"] == F
    assert types[by_name["/norm/LayerNormalization"].input[0]] == F
    assert types["x"] == F and types["y"] == F, "inputs and outputs keep float32"
    meta = {p.key: p.value for p in half.model.metadata_props}
    assert meta[PRECISION_KEY].startswith("float16")


def test_half_graph_output_close_to_float32() -> None:
    model = _attention_block()
    x = {"x": np.random.default_rng(1).standard_normal((2, 16), dtype=np.float32)}
    want = _ort(model, x)["y"]
    got = _ort(to_half(Graph(model)).model, x)["y"]
    err = np.abs(want - got).max()
    assert 0 < err < 2e-2


def test_keep_io_types_false_makes_inputs_and_outputs_half() -> None:
    half = to_half(Graph(_attention_block()), keep_io_types=False)
    assert half.inputs[0].dtype == "float16" and half.outputs[0].dtype == "float16"
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float16)
    assert _ort(half.model, {"x": x})["y"].dtype == np.float16


def test_plan_names_every_float32_node_and_why() -> None:
    reasons = plan(Graph(_attention_block()))
    assert reasons == {"op Softmax": ["/attn/Softmax"], "op LayerNormalization": ["/norm/LayerNormalization"]}
    assert plan(Graph(_attention_block()), keep_float32=[]) == {}


def _timestep_embedding() -> onnx.ModelProto:
    """The SD timestep embedding: t * freqs -> Sin/Cos -> Concat -> Linear."""
    freqs = np.exp(-np.log(10000.0) * np.arange(8, dtype=np.float32) / 8).astype(np.float32)
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Unsqueeze", ["t", "axis1"], ["t2"], name="/time_proj/Unsqueeze"),
        helper.make_node("Mul", ["t2", "freqs"], ["arg"], name="/time_proj/Mul"),
        helper.make_node("Sin", ["arg"], ["sin"], name="/time_proj/Sin"),
        helper.make_node("Cos", ["arg"], ["cos"], name="/time_proj/Cos"),
        helper.make_node("Concat", ["sin", "cos"], ["emb"], name="/time_proj/Concat", axis=-1),
        helper.make_node("MatMul", ["emb", "w"], ["y"], name="/time_embedding/linear_1/MatMul"),
    ]
    inits = {"axis1": np.array([1], np.int64), "freqs": freqs[None, :],
             "w": rng.standard_normal((16, 4), dtype=np.float32)}
    return _model(nodes, {"t": ([1], F)}, {"emb": ([1, 16], F), "y": ([1, 4], F)}, inits)


def test_timestep_embedding_keeps_its_sin_cos_chain_in_float32() -> None:
    model = _timestep_embedding()
    feeds = {"t": np.array([999.0], np.float32)}
    want = _ort(model, feeds)["emb"]
    kept = _ort(to_half(Graph(model)).model, feeds)["emb"]
    naive = _ort(to_half(Graph(model), keep_float32=[]).model, feeds)["emb"]
    assert np.abs(kept - want).max() < 5e-4, "float32 up to the sin/cos; only their result is rounded to half"
    assert np.abs(naive - want).max() > 5e-2, "sin(999 * f) at half precision is far off: the reason"
    assert plan(Graph(model))["feeds Sin/Cos"] == ["/time_proj/Unsqueeze", "/time_proj/Mul"]


def test_vae_last_layers_are_kept_by_name() -> None:
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="/decoder/up_blocks.3/resnets.2/conv2/Conv",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["h", "w2"], ["y"], name="/decoder/conv_out/Conv", pads=[1, 1, 1, 1])]
    inits = {"w1": rng.standard_normal((4, 4, 3, 3), dtype=np.float32),
             "w2": rng.standard_normal((3, 4, 3, 3), dtype=np.float32)}
    model = _model(nodes, {"x": ([1, 4, 8, 8], F)}, {"y": ([1, 3, 8, 8], F)}, inits)
    half = to_half(Graph(model))
    types = _types(half.model)
    assert types["w1"] == H and types["w2"] == F
    assert plan(Graph(model)) == {"name conv_out": ["/decoder/conv_out/Conv"]}
    unkept = {t.name: t.data_type for t in to_half(Graph(model), keep_nodes=[]).model.graph.initializer}
    assert unkept["w2"] == H, "keep_nodes=[] converts the last conv too"


def test_resize_scales_stay_float32() -> None:
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="/up/Resize", mode="nearest")]
    model = _model(nodes, {"x": ([1, 2, 4, 4], F)}, {"y": ([1, 2, 8, 8], F)},
                   {"scales": np.array([1, 1, 2, 2], np.float32)})
    half = to_half(Graph(model))
    onnx.checker.check_model(half.model, full_check=True)
    types = _types(half.model)
    assert types["scales"] == F
    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    np.testing.assert_array_equal(_ort(half.model, {"x": x})["y"], _ort(model, {"x": x})["y"])


def test_casts_constants_and_constant_of_shape_are_retyped() -> None:
    nodes = [
        helper.make_node("Cast", ["i"], ["f"], name="/Cast", to=F),
        helper.make_node("Constant", [], ["c"], name="/Constant", value=numpy_helper.from_array(np.float32(0.5))),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], name="/ConstantOfShape",
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Mul", ["f", "c"], ["m"], name="/Mul"),
        helper.make_node("Add", ["m", "ones"], ["y"], name="/Add"),
    ]
    model = _model(nodes, {"i": ([3], TensorProto.INT64)}, {"y": ([3], F)}, {"shape": np.array([3], np.int64)})
    half = to_half(Graph(model))
    types = _types(half.model)
    assert types["f"] == H and types["c"] == H and types["ones"] == H and types["y"] == F
    out = _ort(half.model, {"i": np.array([1, 2, 3], np.int64)})["y"]
    np.testing.assert_array_equal(out, [1.5, 2.0, 2.5])


def test_a_graph_output_that_another_node_reads_is_renamed_consistently() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="/Relu"),
             helper.make_node("Neg", ["a"], ["b"], name="/Neg")]
    model = _model(nodes, {"x": ([4], F)}, {"a": ([4], F), "b": ([4], F)})
    half = to_half(Graph(model))
    onnx.checker.check_model(half.model, full_check=True)
    out = _ort(half.model, {"x": np.array([-1, 2, -3, 4], np.float32)})
    np.testing.assert_array_equal(out["a"], [0, 2, 0, 4])
    np.testing.assert_array_equal(out["b"], [0, -2, 0, -4])
    assert out["a"].dtype == np.float32


def test_initializers_are_clipped_to_the_half_range_and_keep_infinities() -> None:
    arr = np.array([1e6, -1e6, -np.inf, 1.0], np.float32)
    np.testing.assert_array_equal(half_array(arr), np.array([65504, -65504, -np.inf, 1], np.float16))
    assert str(half_array(arr, "bfloat16").dtype) == "bfloat16"
    nodes = [helper.make_node("Add", ["x", "mask"], ["y"], name="/Add")]
    model = _model(nodes, {"x": ([2], F)}, {"y": ([2], F)}, {"mask": np.array([0, np.finfo(np.float32).min],
                                                                                np.float32)})
    out = _ort(to_half(Graph(model)).model, {"x": np.zeros(2, np.float32)})["y"]
    assert out[1] == -65504, "torch's finfo.min attention masks become the half minimum, not -inf"


def test_bfloat16_graph() -> None:
    half = to_half(Graph(_attention_block()), "bf16")
    types = _types(half.model)
    assert types["wq"] == TensorProto.BFLOAT16 and types["gamma"] == F
    from sdrt_reference import ReferenceBackend

    be = ReferenceBackend()
    x = np.random.default_rng(1).standard_normal((2, 16), dtype=np.float32)
    with be.compile(half, None, be.devices()[0]) as s:
        got = s.run({"x": x})["y"]
    want = _ort(_attention_block(), {"x": x})["y"]
    assert 0 < np.abs(got - want).max() < 0.1


def test_stripped_graph_converts_its_mapped_weights(tmp_path) -> None:  # type: ignore[no-untyped-def]
    Graph(_attention_block()).strip(tmp_path / "g.onnx")
    stripped = Graph.load(tmp_path / "g.onnx")
    assert stripped.mapped_initializers
    half = to_half(stripped)
    assert {t.name: t.data_type for t in half.model.graph.initializer}["wq"] == H
    from sdrt_reference import ReferenceBackend

    be = ReferenceBackend()
    x = {"x": np.ones((2, 16), np.float32)}
    with be.compile(half, None, be.devices()[0]) as s:
        got = s.run(x)["y"]
    np.testing.assert_allclose(got, _ort(to_half(Graph(_attention_block())).model, x)["y"], rtol=1e-3, atol=1e-3)


def test_unknown_dtype_is_an_error() -> None:
    with pytest.raises(SdrtError, match="cannot convert a graph to 'int8'.*float16"):
        to_half(Graph(_attention_block()), "int8")


def test_control_flow_is_refused_with_a_clear_error() -> None:
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", F, [2])])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="/If", then_branch=branch, else_branch=branch)]
    model = _model(nodes, {"cond": ([], TensorProto.BOOL), "x": ([2], F)}, {"y": ([2], F)})
    with pytest.raises(ModelError, match="control flow \\(If\\).*float32"):
        to_half(Graph(model))


def test_custom_domain_nodes_stay_float32() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="/Relu"),
             helper.make_node("FastGelu", ["a"], ["y"], name="/ms/FastGelu", domain="com.microsoft")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4])],
                              [helper.make_tensor_value_info("y", F, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    half = to_half(Graph(model))
    fast = next(n for n in half.model.graph.node if n.op_type == "FastGelu")
    cast = next(n for n in half.model.graph.node if n.output and n.output[0] == fast.input[0])
    assert cast.op_type == "Cast" and cast.attribute[0].i == F
    assert plan(Graph(model)) == {"domain com.microsoft": ["/ms/FastGelu"]}
