"""with_shapes, fold_constants and op_counts on an exporter-style dynamic-axes graph."""

from __future__ import annotations

import gw_models as M
import numpy as np
import pytest
from onnx import numpy_helper

from sdrt.errors import ModelError
from sdrt.graph import Graph

X = np.random.default_rng(4).standard_normal((2, 3, 8)).astype(np.float32)


@pytest.fixture
def chain() -> Graph:
    return Graph.load(M.exporter_chain_model().SerializeToString())


def test_description_has_symbolic_dims(chain):
    assert [str(i) for i in chain.inputs] == ["x: float32[batch, seq, 8]"]
    assert chain.outputs[0].shape == ("batch", 5)
    assert not chain.inputs[0].is_static


def test_op_counts(chain):
    counts = chain.op_counts()
    assert counts == {"Shape": 2, "Constant": 1, "Gather": 1, "Unsqueeze": 1, "Concat": 1, "Reshape": 1,
                      "MatMul": 1, "Cast": 1}
    assert list(counts)[0] == "Shape"  # most common first


def test_op_counts_include_subgraphs_and_domains():
    from onnx import TensorProto, helper

    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
         helper.make_node("Custom", ["y"], ["z"], domain="com.example")],
        "sub", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[*M.OPSET, helper.make_opsetid("com.example", 1)])
    assert Graph.load(m.SerializeToString()).op_counts() == {"If": 1, "com.example.Custom": 1, "Relu": 1, "Neg": 1}


def test_with_shapes_pins_and_infers_every_intermediate(chain):
    pinned = chain.with_shapes(x=(2, 3, 8))
    assert pinned is not chain and chain.inputs[0].shape == ("batch", "seq", 8)  # original untouched
    assert pinned.inputs[0].shape == (2, 3, 8)
    assert pinned.outputs[0].shape == (2, 5)
    infos = pinned.value_infos()
    intermediates = [o for n in pinned.model.graph.node for o in n.output]
    assert intermediates and all(infos[o].is_static for o in intermediates), {o: infos[o] for o in intermediates}
    assert infos["/Reshape_output_0"].shape == (2, 24)  # data propagation through the Shape chain


def test_with_shapes_by_dim_name(chain):
    pinned = chain.with_shapes(batch=2, seq=3)
    assert pinned.inputs[0].shape == (2, 3, 8)
    assert pinned.outputs[0].shape == (2, 5)
    partial = chain.with_shapes(batch=4)
    assert partial.inputs[0].shape == (4, "seq", 8)


def test_with_shapes_dict_for_non_identifier_names():
    m = M.linear_model()
    m.graph.input[0].name = "input.1"
    m.graph.node[0].input[0] = "input.1"
    g = Graph.load(m.SerializeToString()).with_shapes({"input.1": (3, 8)})
    assert g.inputs[0].shape == (3, 8) and g.outputs[0].shape == (3, 4)


@pytest.mark.parametrize(("spec", "match"), [
    ({"nope": (1, 2)}, "neither an input nor a symbolic dim"),
    ({"x": (2, 3)}, "rank 3"),
    ({"x": (2, 3, 9)}, "fixed shape"),
    ({"x": (2, -1, 8)}, "non-negative"),
    ({"x": "abc"}, "non-negative ints"),
    ({"batch": -2}, "non-negative int"),
    ({"x": (2, 3, 8), "batch": 5}, "pinned to both"),
])
def test_with_shapes_errors(chain, spec, match):
    with pytest.raises(ModelError, match=match):
        chain.with_shapes(spec)


def test_with_shapes_inconsistent_graph_is_a_model_error():
    m = M.linear_model()
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "k"  # x: [batch, k] feeding Gemm with K=8
    g = Graph.load(m.SerializeToString())
    with pytest.raises(ModelError, match="shape inference failed"):
        g.with_shapes(k=7)


def test_fold_constants_after_pinning_removes_the_shape_chain(chain):
    folded = chain.with_shapes(x=(2, 3, 8)).fold_constants()
    assert folded.op_counts() == {"Reshape": 1, "MatMul": 1}
    # the Reshape target is now a constant initializer
    shape_input = folded.model.graph.node[0].input[1]
    np.testing.assert_array_equal(folded.initializer_arrays([shape_input])[shape_input], [2, -1])
    # dead branch and consumed constants are gone
    assert set(folded.initializer_names) == {"head.weight_t", shape_input}
    assert folded.outputs[0].shape == (2, 5)
    want = M.run_reference(chain, {"x": X})["y"]
    np.testing.assert_array_equal(M.run_reference(folded, {"x": X})["y"], want)


def test_fold_constants_without_pinning_keeps_the_dynamic_chain(chain):
    folded = chain.fold_constants()
    counts = folded.op_counts()
    assert "Cast" not in counts and "Constant" not in counts  # dead branch and Constant folded away
    assert counts["Shape"] == 1 and counts["Reshape"] == 1  # the runtime shape is still needed
    x = np.random.default_rng(1).standard_normal((5, 3, 8)).astype(np.float32)
    np.testing.assert_array_equal(M.run_reference(folded, {"x": x})["y"], M.run_reference(chain, {"x": x})["y"])


def test_fold_after_pinning_only_the_gathered_dim(chain):
    """batch pinned, seq still dynamic: Shape -> Gather(0) folds from the known dim alone."""
    folded = chain.with_shapes(batch=2).fold_constants()
    assert folded.op_counts() == {"Reshape": 1, "MatMul": 1}
    x = np.random.default_rng(2).standard_normal((2, 3, 8)).astype(np.float32)
    with pytest.raises(ModelError):
        folded.with_shapes(x=(3, 3, 8))  # batch is fixed now
    np.testing.assert_array_equal(M.run_reference(folded, {"x": x})["y"], M.run_reference(chain, {"x": x})["y"])


def test_fold_partial_shape_slice_and_unknown_dim():
    from onnx import TensorProto, helper, numpy_helper

    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    g = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Slice", ["s", "st", "en", "", ""], ["tail"]),  # dims 1.. : [seq?, 8]
         helper.make_node("Slice", ["s", "st2", "en2"], ["last"]),  # dims 2.. : [8]
         helper.make_node("Concat", ["minus_one", "last"], ["shape"], axis=0),
         helper.make_node("Reshape", ["x", "shape"], ["y"]),
         helper.make_node("Cast", ["tail"], ["t"], to=TensorProto.INT64)],
        "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8]),
         helper.make_tensor_value_info("t", TensorProto.INT64, [2])],
        [i64("st", [1]), i64("en", [3]), i64("st2", [2]), i64("en2", [2**62]), i64("minus_one", [-1])])
    graph = Graph.load(helper.make_model(g, opset_imports=M.OPSET, ir_version=M.IR).SerializeToString())
    folded = graph.fold_constants()
    counts = folded.op_counts()
    assert counts["Slice"] == 1 and "Concat" not in counts  # the tail keeps the unknown seq; the last dim folds
    x = np.ones((2, 5, 8), np.float32)
    for name in ("y", "t"):
        np.testing.assert_array_equal(M.run_reference(folded, {"x": x})[name], M.run_reference(graph, {"x": x})[name])


def test_fold_keeps_weights_by_name_unless_asked():
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["x", "wt"], ["y"])],
        "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [numpy_helper.from_array(w.T.copy(), "w")])
    graph = Graph.load(helper.make_model(g, opset_imports=M.OPSET).SerializeToString())
    assert graph.fold_constants().op_counts() == {"Transpose": 1, "MatMul": 1}
    folded = graph.fold_constants(fold_weights=True)
    assert folded.op_counts() == {"MatMul": 1} and folded.initializer_names == ["wt"]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(M.run_reference(folded, {"x": x})["y"], M.run_reference(graph, {"x": x})["y"])


def test_fold_leaves_random_ops_and_large_expansions():
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [helper.make_node("RandomNormal", [], ["r"], shape=[2, 2]),
         helper.make_node("ConstantOfShape", ["big_shape"], ["big"], value=numpy_helper.from_array(
             np.array([1.0], np.float32))),
         helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
         helper.make_node("Add", ["r", "s"], ["y"])],
        "r", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.array([1024, 1024], np.int64), "big_shape")])
    graph = Graph.load(helper.make_model(g, opset_imports=M.OPSET).SerializeToString())
    counts = graph.fold_constants().op_counts()
    assert counts["RandomNormal"] == 1  # never folded: not deterministic
    assert counts["ConstantOfShape"] == 1  # 4 MiB from 16 bytes: left alone
    assert graph.fold_constants(max_bytes=8 << 20).op_counts() == {"RandomNormal": 1, "Add": 1}


def test_folded_record_lets_weights_from_the_unfolded_graph_bind(chain, tmp_path):
    """Weights saved from the original graph still bind after folding (small constants it consumed
    are not 'unexpected', the constants it created are not 'missing')."""
    from sdrt.weights import Weights

    folded = chain.with_shapes(x=(2, 3, 8)).fold_constants()
    w = Weights.from_graph(chain)
    bound = w.bind(folded)
    assert set(bound) == {"head.weight_t"}


def test_lazy_graph_with_shapes_and_fold_keep_mapping(tmp_path):
    p = M.save_external(M.exporter_chain_model(), tmp_path / "c.onnx")
    g = Graph.load(p, load_external=False)
    folded = g.with_shapes(x=(2, 3, 8)).fold_constants()
    assert folded.mapped_initializers == ["head.weight_t"]
    np.testing.assert_array_equal(M.run_reference(Graph.load(p).with_shapes(x=(2, 3, 8)).fold_constants(),
                                                  {"x": X})["y"],
                                  M.run_reference(Graph.load(p), {"x": X})["y"])


@pytest.mark.parametrize("attr,value", [("value", np.arange(6, dtype=np.float16).reshape(2, 3)),
                                        ("value", np.array(7, dtype=np.int64)), ("value_int", 5),
                                        ("value_ints", [1, -2, 3]), ("value_float", 0.25),
                                        ("value_floats", [0.5, -1.5])])
def test_constants_fold_to_what_onnx_reference_evaluator_gives(attr, value):
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from sdrt.graph.fold import _evaluate

    kw = {attr: numpy_helper.from_array(value) if attr == "value" else value}
    node = helper.make_node("Constant", [], ["c"], **kw)
    got = _evaluate(node, {}, [helper.make_opsetid("", 17)], 8)["c"]
    model = helper.make_model(helper.make_graph([node], "g", [], [helper.make_empty_tensor_value_info("c")]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (want,) = ReferenceEvaluator(model).run(None, {})
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_folding_log_of_zero_is_quiet():
    """T5's relative-position buckets take the log of a 0 position and cast it (masked off later): folding it printed
    numpy's 'divide by zero' and 'invalid value encountered in cast' warnings on every sdrt run of a T5 encoder."""
    import warnings

    from onnx import TensorProto, helper, numpy_helper

    zero = numpy_helper.from_array(np.array([0.0, 4.0], np.float32), "pos")
    g = helper.make_graph([helper.make_node("Log", ["pos"], ["l"]), helper.make_node("Cast", ["l"], ["i"], to=7),
                           helper.make_node("Cast", ["i"], ["f"], to=1), helper.make_node("Add", ["x", "f"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [zero])
    graph = Graph.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folded = graph.fold_constants(fold_weights=True)
    assert [n.op_type for n in folded.model.graph.node] == ["Add"]


def test_lowering_folds_through_the_evaluator_quietly():
    """A plugin's lowering folds what numpy_fold leaves to onnx's reference ops without numpy's warnings on stderr
    (a tiny Flux pipeline on ggml printed 'invalid value encountered in cast' from T5's buckets), and the value is
    the evaluator's."""
    import warnings

    from onnx import helper

    from sdrt.lowering import fold_node

    node = helper.make_node("Atanh", ["x"], ["y"])  # not folded with numpy: the evaluator's op
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = fold_node(node, [np.array([0.5, 2.0], np.float32)], {"": 17})
    assert got[0] == np.arctanh(np.float32(0.5)) and np.isnan(got[1])


_I64 = np.array([[3, -1, 7], [0, 2, 5]], np.int64)


@pytest.mark.parametrize("op,inputs,attrs,opset", [
    ("Unsqueeze", [np.array(5, np.int64), np.array([0], np.int64)], {}, 17),
    ("Unsqueeze", [_I64, np.array([-1, 0], np.int64)], {}, 17),
    ("Unsqueeze", [_I64, np.array([1, 3], np.int64)], {}, 13),
    ("Unsqueeze", [np.array([4, 8], np.int64)], {"axes": [0, -1]}, 11),
    ("Concat", [np.array([1], np.int64), np.array([2, 3], np.int64), np.array([4], np.int64)], {"axis": 0}, 17),
    ("Concat", [_I64, _I64[:1]], {"axis": -2}, 17),
    ("Gather", [np.array([2, 77, 768], np.int64), np.array(1, np.int64)], {}, 17),
    ("Gather", [np.array([2, 77, 768], np.int64), np.array([-1, 0], np.int64)], {"axis": 0}, 17),
    ("Gather", [_I64, np.array([[2], [-3]], np.int64)], {"axis": 1}, 17),
    ("Gather", [np.array([1.5, 2.5], np.float32), np.array([1], np.int32)], {}, 17),
    ("Cast", [np.array([3, -2], np.int64)], {"to": 1}, 17),
    ("Cast", [np.array([3, 0], np.int64)], {"to": 9}, 17),
    ("Cast", [np.array([True, False])], {"to": 7}, 17),
    ("Cast", [np.array([70000, 2], np.int64)], {"to": 10}, 17),
    ("Cast", [np.array(12, np.int32)], {"to": 7}, 17),
    ("Shape", [np.zeros((2, 77, 768), np.float32)], {}, 13),
    ("Shape", [np.zeros((2, 4, 8, 8), np.float32)], {"start": 1, "end": -1}, 15),
    ("Shape", [np.zeros((2, 4, 8, 8), np.float32)], {"start": -2}, 15),
    ("Shape", [np.zeros((2, 4, 8), np.float32)], {"start": -9, "end": 9}, 15),  # clamped to the rank
    ("Shape", [np.zeros((2, 4, 8), np.float32)], {"start": 2, "end": 1}, 15),  # empty
    ("Shape", [np.array(3.0, np.float32)], {}, 17),
    ("Size", [np.zeros((2, 4, 8), np.float32)], {}, 17),
    ("Identity", [_I64], {}, 17),
    ("Constant", [], {"value_ints": [1, -1, 768]}, 17),
    ("Constant", [], {"value_float": 0.5}, 17),
    ("Constant", [], {"value": numpy_helper.from_array(np.array([[1.5, -2.0]], np.float16))}, 17),
    # the rest of an SD pipeline's folds: the attention scale, the causal mask, slices and integer arithmetic
    ("Cast", [np.array([-2.7, 0.5, 3.9], np.float32)], {"to": 7}, 17),  # toward zero
    ("Cast", [np.array([1.0e6, -0.1], np.float64)], {"to": 10}, 17),  # past float16: inf
    ("Cast", [np.array([0.0, np.nan, -1.5], np.float32)], {"to": 9}, 17),
    ("Sqrt", [np.array([64.0], np.float32)], {}, 17),
    ("Sqrt", [np.array([2.0, -1.0], np.float16)], {}, 17),  # NaN
    ("Neg", [np.array([1.5, -0.0], np.float32)], {}, 17),
    ("Div", [np.array([1.0], np.float32), np.array([8.0], np.float32)], {}, 17),
    ("Div", [np.array([1.0, -1.0, 0.0], np.float32), np.array(0.0, np.float32)], {}, 17),  # inf, -inf, NaN
    ("Div", [np.array([7, -7, 7, -7, 6], np.int64), np.array([2, 2, -2, -2, 3], np.int64)], {}, 17),  # toward 0
    ("Div", [np.array(320, np.int64), np.array(8, np.int64)], {}, 17),
    ("Mul", [np.array([2], np.int64), np.array(40, np.int64)], {}, 17),
    ("Mul", [_I64, np.array([[2], [3]], np.int64)], {}, 17),
    ("Mul", [np.array([2**62], np.int64), np.array([4], np.int64)], {}, 17),  # wraps, as the runtime's does
    ("Add", [np.array([1, 77], np.int64), np.array([-1], np.int64)], {}, 17),
    ("Sub", [np.array([0.5], np.float16), np.array([[1.0], [2.0]], np.float16)], {}, 17),
    ("Equal", [np.triu(np.ones((4, 4), np.float32), 1), np.array([1.0], np.float32)], {}, 17),
    ("Equal", [np.array([2, 3], np.int64), np.array([3, 3], np.int64)], {}, 17),
    ("Less", [_I64, np.array(2, np.int64)], {}, 17),
    ("Greater", [np.array([0.5, np.nan], np.float32), np.array(0.0, np.float32)], {}, 17),
    ("Where", [np.array([[True, False], [False, True]]), np.array([-1e9], np.float32), np.array([0.0], np.float32)],
     {}, 17),
    ("Where", [np.array([True, False]), np.array([1, 2], np.int64), np.array(0, np.int64)], {}, 17),
    ("Trilu", [np.full((4, 4), 7.0, np.float32)], {}, 14),
    ("Trilu", [np.full((4, 4), 7.0, np.float32), np.array(1, np.int64)], {"upper": 1}, 14),
    ("Trilu", [np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.array(-1, np.int64)], {"upper": 0}, 14),
    ("Expand", [np.array([-1e9], np.float32), np.array([77, 77], np.int64)], {}, 17),
    ("Expand", [np.array([[1], [2]], np.int64), np.array([1, 1, 3], np.int64)], {}, 17),  # rank and 1s from data
    ("Slice", [np.array([2, 4, 64, 64], np.int64), np.array([2], np.int64), np.array([2**63 - 1], np.int64)], {}, 17),
    ("Slice", [_I64, np.array([0, -1], np.int64), np.array([1, -4], np.int64), np.array([0, 1], np.int64),
               np.array([1, -1], np.int64)], {}, 17),  # a negative step through index 0
    ("Slice", [np.arange(10, dtype=np.int64), np.array([-100], np.int64), np.array([100], np.int64),
               np.array([-1], np.int64), np.array([3], np.int64)], {}, 17),
    ("Slice", [np.arange(10, dtype=np.int64), np.array([8], np.int64), np.array([2], np.int64)], {}, 13),  # empty
    ("Slice", [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1], np.int32), np.array([3], np.int32),
               np.array([-1], np.int32)], {}, 17),
    ("Reshape", [np.arange(6, dtype=np.int64), np.array([2, -1], np.int64)], {}, 17),
    ("Reshape", [np.zeros((2, 3, 4), np.float32), np.array([0, -1], np.int64)], {}, 17),  # 0 copies the dim
    ("Reshape", [np.zeros((3, 0), np.float32), np.array([0, 3], np.int64)], {"allowzero": 1}, 17),  # a 0 dim
    ("ConstantOfShape", [np.array([2, 3], np.int64)], {}, 17),
    ("ConstantOfShape", [np.array([3], np.int64)], {"value": numpy_helper.from_array(np.array([1], np.int64))}, 17),
    ("ConstantOfShape", [np.array([], np.int64)], {"value": numpy_helper.from_array(np.array([0.5], np.float16))},
     17),
    ("Range", [np.array(0, np.int64), np.array(77, np.int64), np.array(1, np.int64)], {}, 17),
    ("Range", [np.array(10, np.int32), np.array(-3, np.int32), np.array(-4, np.int32)], {}, 17),
    ("Range", [np.array(5, np.int64), np.array(1, np.int64), np.array(2, np.int64)], {}, 17),  # empty
    ("ArgMax", [np.array([[3, 9, 9, 1], [4, 0, 2, 8]], np.int64)], {"axis": -1}, 17),
    ("ArgMax", [np.array([[3, 9, 9, 1], [4, 0, 2, 8]], np.int32)], {"axis": 1, "keepdims": 0}, 17),
    ("ArgMax", [np.array([[3, 9, 9, 1], [4, 0, 2, 8]], np.int64)], {"axis": 1, "keepdims": 0,
                                                                    "select_last_index": 1}, 17),
    ("ArgMax", [np.array([[0.5, -1.0], [2.0, 2.0]], np.float32)], {}, 17),
    # T5's relative position buckets (SD3, Flux), Flux's and Chroma's positions and masks
    ("Abs", [np.array([[0, -3], [5, -1]], np.int64)], {}, 17),
    ("Neg", [np.array(4, np.int64)], {}, 17),
    ("Min", [np.array([[9, 2], [7, 31]], np.int64), np.array([[8, 8], [8, 8]], np.int64)], {}, 17),
    ("Max", [np.array([1.0, np.nan, -2.0], np.float32), np.array(0.0, np.float32)], {}, 17),
    ("Log", [np.array([[0.0, 1.0], [8.0, -1.0]], np.float32)], {}, 17),  # -inf and NaN
    ("Cast", [np.array([[-np.inf, 1.9], [np.nan, 3.0e10]], np.float32)], {"to": 7}, 17),  # as the CPU converts
    ("Transpose", [np.arange(24, dtype=np.float32).reshape(2, 3, 4)], {"perm": [1, 2, 0]}, 17),
    ("Transpose", [np.arange(6, dtype=np.int64).reshape(2, 3)], {}, 17),
    ("Squeeze", [np.zeros((1, 3, 1), np.int64), np.array([-1], np.int64)], {}, 17),
    ("Squeeze", [np.zeros((1, 3, 1), np.int64)], {}, 17),
    ("Squeeze", [np.zeros((1, 3, 1), np.float32)], {"axes": [0]}, 11),
    ("Mod", [np.array([7, -7, 7, -7], np.int64), np.array([3, 3, -3, -3], np.int64)], {}, 17),  # the divisor's sign
    ("Mod", [np.array([7, -7, 7, -7], np.int64), np.array([3, 3, -3, -3], np.int64)], {"fmod": 1}, 17),
    ("Mod", [np.array([5.5, -5.5], np.float32), np.array([2.0, 2.0], np.float32)], {"fmod": 1}, 17),
    ("Pow", [np.array(10000.0, np.float32), np.array([0.0, 0.25, 0.5], np.float32)], {}, 17),
    ("Sin", [np.array([[0.0, 1.0]], np.float32)], {}, 17),
    ("Cos", [np.array([[0.0, 1.0]], np.float32)], {}, 17),
    ("Exp", [np.array([-1.0, 0.0, 100.0], np.float32)], {}, 17),
    ("Floor", [np.array([-1.5, 2.5], np.float32)], {}, 17),
    ("Ceil", [np.array([-1.5, 2.5], np.float32)], {}, 17),
    ("Reciprocal", [np.array([4.0, 0.0], np.float32)], {}, 17),
    ("And", [np.array([[[[True, False, True]]]]), np.array([[[[True], [False]]]])], {}, 17),
    ("Or", [np.array([True, False]), np.array([False, False])], {}, 17),
    ("Xor", [np.array([True, False]), np.array([True, True])], {}, 17),
    ("Not", [np.array([[True, False]])], {}, 17),
    ("LessOrEqual", [np.array([1, 2, 3], np.int64), np.array(2, np.int64)], {}, 17),
    ("GreaterOrEqual", [np.array([1.0, 2.0], np.float32), np.array(2.0, np.float32)], {}, 17),
])
def test_shape_arithmetic_folds_to_what_onnx_reference_evaluator_gives(op, inputs, attrs, opset):
    """Constants, shape arithmetic and the other ops an SD pipeline folds fold with numpy alone (graph.arith), in
    ``Graph.fold_constants`` and in the plugins' lowering (``sdrt.lowering.fold_node``): the same values, dtypes and
    shapes as onnx's ReferenceEvaluator gives for the node (NaN where it gives NaN)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from sdrt.graph.arith import numpy_fold
    from sdrt.graph.fold import _evaluate
    from sdrt.lowering import fold_node

    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["out"], **attrs)
    feeds = dict(zip(names, inputs))
    assert numpy_fold(node, inputs, opset) is not None  # the numpy path, not the evaluator, made it
    got = _evaluate(node, feeds, [helper.make_opsetid("", opset)], 8)["out"]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    model = helper.make_model(helper.make_graph([node], "g", ins, [helper.make_empty_tensor_value_info("out")]),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    with np.errstate(all="ignore"):  # 70000 as float16: inf; the square root of -1: NaN
        (want,) = ReferenceEvaluator(model).run(None, feeds)
    want = np.asarray(want)
    (lowered,) = fold_node(node, inputs, {"": opset})
    for value in (got, lowered):
        assert value.dtype == want.dtype and value.shape == want.shape
        np.testing.assert_array_equal(value, want)


@pytest.mark.parametrize("op,inputs,attrs", [
    ("Gather", [np.array([2, 3], np.int64), np.array([2], np.int64)], {}),  # out of range: the evaluator says so
    ("Cast", [np.array([1.5], np.float32)], {"to": 8}),  # into a string
    ("Cast", [np.array([1.5, 1e6], np.float32)], {"to": 19}),  # into float8 e5m2: saturating, the evaluator's
    ("Cast", [np.array([1.5], np.float32)], {"to": 16}),  # into bfloat16
    ("Mod", [np.array([5.5], np.float32), np.array([2.0], np.float32)], {}),  # a float without fmod=1: invalid
    ("Mod", [np.array([5], np.int64), np.array([0], np.int64)], {}),  # by 0
    ("Pow", [np.array([2], np.int64), np.array([3], np.int64)], {}),  # integers
    ("Neg", [np.array([1], np.uint8)], {}),
    ("Squeeze", [np.zeros((1, 3), np.float32), np.array([1], np.int64)], {}),  # a dim that is not 1
    ("Transpose", [np.zeros((2, 3), np.float32)], {"perm": [0, 0]}),
    ("Div", [np.array([4, 5], np.int64), np.array([2, 0], np.int64)], {}),  # an integer divided by 0
    ("Add", [np.array([1], np.int64), np.array([1], np.int32)], {}),  # mixed dtypes
    ("Range", [np.array(0.0, np.float32), np.array(1.0, np.float32), np.array(0.1, np.float32)], {}),  # floats
    ("Range", [np.array(0, np.int64), np.array(4, np.int64), np.array(0, np.int64)], {}),  # a zero step
    ("Slice", [np.arange(4, dtype=np.int64), np.array([0], np.int64), np.array([2], np.int64),
               np.array([0], np.int64), np.array([0], np.int64)], {}),  # a zero step
    ("Expand", [np.array([1, 2, 3], np.int64), np.array([2], np.int64)], {}),  # does not broadcast
    ("Reshape", [np.zeros(6, np.float32), np.array([4, -1], np.int64)], {}),  # 6 into 4 x ?
    ("Cast", [np.array([300], np.int64)], {"to": 2}),  # does not fit uint8
    ("Concat", [np.array([1], np.int64), np.array([1], np.int32)], {"axis": 0}),  # mixed dtypes
    ("Unsqueeze", [_I64, np.array([0, 0], np.int64)], {}),  # an axis twice
])
def test_shape_arithmetic_leaves_the_rest_to_the_evaluator(op, inputs, attrs):
    from onnx import helper

    from sdrt.graph.arith import numpy_fold

    node = helper.make_node(op, [f"i{k}" for k in range(len(inputs))], ["out"], **attrs)
    assert numpy_fold(node, inputs, 17) is None


def test_keep_outputs_drops_what_only_the_others_read_and_keeps_the_pinned_types():
    """A text encoder cut to one hidden state: the nodes and weights only the other output reads go (recorded as
    folding records its own, so whole-graph weights still bind), the pinned value types stay, and the kept output
    is what onnx's ReferenceEvaluator computes on the whole graph."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from sdrt.graph.fold import folded_record

    rng = np.random.default_rng(0)
    w1, w2 = (numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), n) for n in ("w1", "w2"))
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["hidden"]),
         helper.make_node("MatMul", ["hidden", "w2"], ["p"]), helper.make_node("Tanh", ["p"], ["pooled"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 8])], [w1, w2])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    pinned = Graph.load(model.SerializeToString()).with_shapes(x=(3, 8))
    cut = pinned.keep_outputs(["hidden"])
    assert [o.name for o in cut.outputs] == ["hidden"] and cut.outputs[0].shape == (3, 8)
    assert [n.op_type for n in cut.model.graph.node] == ["MatMul", "Relu"]
    assert cut.initializer_names == ["w1"] and folded_record(cut.model)["removed"] == ["w2"]
    assert cut.value_infos()["h"].shape == (3, 8)  # from the pinning, not inferred again
    x = rng.standard_normal((3, 8)).astype(np.float32)
    (want,) = ReferenceEvaluator(model).run(["hidden"], {"x": x})
    np.testing.assert_array_equal(M.run_reference(cut, {"x": x})["hidden"], want)
    with pytest.raises(ModelError, match="no output 'nope'"):
        pinned.keep_outputs(["nope"])


def test_shape_arithmetic_folds_without_importing_the_reference_evaluator():
    """A graph whose folding is constants and shape arithmetic folds, in ``Graph.fold_constants`` and in a plugin's
    lowering (``fold_node``), without importing onnx.reference: 12 MiB and 0.3 s of a process, which the calibrated
    runtime base (``sdrt selftest --calibrate``'s ``runtime`` case, such a graph) would otherwise count for every
    graph."""
    import subprocess
    import sys

    code = """
import sys
import numpy as np
from onnx import TensorProto, helper
from sdrt.graph import Graph
from sdrt.lowering import fold_node
nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Constant", [], ["i"], value_int=1),
         helper.make_node("Gather", ["s", "i"], ["c"], axis=0), helper.make_node("Constant", [], ["a"], value_ints=[0]),
         helper.make_node("Unsqueeze", ["c", "a"], ["u"]), helper.make_node("Constant", [], ["m"], value_ints=[-1]),
         helper.make_node("Concat", ["m", "u"], ["shape"], axis=0), helper.make_node("Reshape", ["x", "shape"], ["y"])]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
folded = Graph.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
folded = folded.fold_constants()
assert [n.op_type for n in folded.model.graph.node] == ["Reshape"], folded.model.graph.node
assert fold_node(nodes[0], [np.zeros((2, 3), np.float32)], {"": 17})[0].tolist() == [2, 3]
print("onnx.reference" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"
