"""What the plugin fixes before MIGraphX sees a graph or a feed (no MIGraphX needed).

Each fix answers a class of conformance failures or crashes found on the ref
target (docs/migraphx.md): negative run-time reduce axes (MIGraphX aborted),
run-time reshape shapes with -1 and 0 (std::bad_alloc), and parser messages
that mean "MIGraphX does not handle this form of the op".
"""

from __future__ import annotations

import numpy as np
import pytest
from mx_helpers import model
from onnx import TensorProto, helper

import sdrt
from sdrt.errors import InputError, UnsupportedGraph
from sdrt_migraphx import feeds
from sdrt_migraphx.errors import MIGraphXError
from sdrt_migraphx.program import parse_error


def _vi(name, dims, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, dims)


def reduce_graph(data_dims=(3, 2, 2), op="ReduceL1"):
    """Abs -> ReduceL1(axes fed at run time): the reduce's input rank comes from shape inference."""
    nodes = [helper.make_node("Abs", ["x"], ["a"], name="abs"),
             helper.make_node(op, ["a", "axes"], ["y"], name="reduce", keepdims=1)]
    m = model(nodes, [_vi("x", list(data_dims)), _vi("axes", [1], TensorProto.INT64)], [_vi("y", None)],
              opsets=(("", 18),))
    return sdrt.Graph.load(m.SerializeToString())


def test_runtime_reduce_axes_are_found_with_their_rank_through_shape_inference():
    assert feeds.runtime_axes(reduce_graph()) == {"axes": 3}


def test_negative_axes_are_wrapped_and_others_left_alone():
    x = np.ones((3, 2, 2), np.float32)
    out = feeds.fix({"x": x, "axes": np.array([-2], np.int64)}, {"axes": 3}, "g")
    assert out["axes"].tolist() == [1] and out["axes"].dtype == np.int64 and out["x"] is x
    same = np.array([0, 2], np.int64)
    assert feeds.fix({"axes": same}, {"axes": 3}, "g")["axes"] is same


def test_axes_out_of_range_are_an_input_error_not_an_out_of_bounds_read():
    with pytest.raises(InputError, match=r"reduce axes \[-4\] are out of range for a rank-3 input.*'axes'.*\[-3, 2\]"):
        feeds.fix({"axes": np.array([-4], np.int64)}, {"axes": 3}, "g")


def test_runtime_axes_of_a_reduce_whose_rank_is_unknown_are_unsupported():
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum")]
    m = model(nodes, [_vi("x", None), _vi("axes", [1], TensorProto.INT64)], [_vi("y", None)], opsets=(("", 18),))
    with pytest.raises(UnsupportedGraph, match=r"negative run-time reduce axes.*ReduceSum with run-time axes of "
                                               r"unknown or mixed rank \(nodes: sum\)"):
        feeds.runtime_axes(sdrt.Graph.load(m.SerializeToString()))


def test_constant_axes_need_no_fix():
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"])]
    m = model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 1])], [axes], opsets=(("", 18),))
    assert feeds.runtime_axes(sdrt.Graph.load(m.SerializeToString())) == {}


@pytest.mark.parametrize("shape, allowzero, want", [
    ([-1, 2], False, [12, 2]),
    ([0, -1], False, [2, 12]),
    ([0, 3, 4], False, [2, 3, 4]),
    ([6, 0], True, [6, 0]),  # allowzero: 0 is a size, not a copy
    ([5, -1], False, [5, -1]),  # 24 is not a multiple of 5: left for MIGraphX to refuse
])
def test_runtime_reshape_shapes_resolve_zero_and_minus_one(shape, allowzero, want):
    got = feeds.resolve_shape(np.array(shape, np.int64), (2, 3, 4), allowzero)
    assert got.tolist() == want and got.dtype == np.int64


def test_runtime_reshape_inputs_are_found_with_the_static_data_shape():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)]
    m = model(nodes, [_vi("x", [2, 3, 4]), _vi("shape", [2], TensorProto.INT64)], [_vi("y", None)],
              opsets=(("", 14),))
    assert feeds.runtime_reshapes(sdrt.Graph.load(m.SerializeToString())) == {"shape": ((2, 3, 4), True)}


def test_a_parser_limitation_is_unsupported_graph_naming_the_op_nodes():
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk0")]
    m = model(nodes, [_vi("x", [3, 4]), _vi("k", [1], TensorProto.INT64)], [_vi("v", None), _vi("i", None)])
    graph = sdrt.Graph.load(m.SerializeToString())
    err = parse_error("check_arg_empty: PARSE_TopK: k input must be constant", graph, "g for ref")
    assert isinstance(err, UnsupportedGraph) and err.unsupported == {"TopK": ["topk0"]}
    assert "does not handle this graph (check_arg_empty: PARSE_TopK: k input must be constant)" in str(err)


def test_a_parser_failure_on_a_form_it_claims_is_a_migraphx_error():
    graph = reduce_graph()
    err = parse_error("compute_shape: TRANSPOSE: Permutation has wrong number of axes", graph, "g for ref")
    assert type(err) is MIGraphXError and "could not parse the graph" in str(err)


def test_ops_whose_output_size_depends_on_the_data_are_refused_up_front():
    from sdrt_migraphx import ops

    nodes = [helper.make_node("NonZero", ["x"], ["y"], name="nz")]
    m = model(nodes, [_vi("x", [2, 2])], [_vi("y", [2, None], TensorProto.INT64)])
    with pytest.raises(UnsupportedGraph, match=r"depends on the data.*pads it to the largest size.*NonZero \(nodes: nz\)"):
        ops.check(sdrt.Graph.load(m.SerializeToString()), None)


def test_every_declared_migraphx_failure_names_real_node_tests():
    """The xfail list (MIGraphX's own failures) is exact: each entry matches node tests, none a typo."""
    import re

    from sdrt.testing.cases import node_cases
    from sdrt_migraphx.backend import MIGraphXBackend

    names = [c.name + "_ref" for c in node_cases()]
    xfail = MIGraphXBackend.conformance["xfail"]
    counts = {pattern: sum(1 for n in names if re.search(pattern, n)) for pattern in xfail}
    assert all(counts.values()), [p for p, c in counts.items() if not c]
    assert sum(counts.values()) == 114  # the failures tools/raw_check.py confirmed on raw MIGraphX
    assert all(re.search(p, "test_celu_float16_gpu_0") for p in xfail if "celu" in p)  # any device tag
