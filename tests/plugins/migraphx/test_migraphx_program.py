"""What the backend hands MIGraphX's parser: the graph with the resolved weights, and static input shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from mx_helpers import conv_model, mlp_model, ort_run

import sdrt
from sdrt.errors import UnsupportedGraph
from sdrt_migraphx.errors import first_lines
from sdrt_migraphx.program import INLINE_BYTES, input_dims, write_model


def test_written_model_runs_the_same_with_the_given_weights(tmp_path):
    graph = sdrt.Graph.load(mlp_model(seed=0).SerializeToString())
    new = sdrt.Graph.load(mlp_model(seed=5).SerializeToString()).initializer_arrays()
    path = write_model(graph, new, tmp_path)
    x = np.random.default_rng(1).standard_normal((2, 64), dtype=np.float32)
    import onnxruntime as ort

    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ort_run(mlp_model(seed=5), {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_large_weights_go_external_in_the_order_migraphx_reads(tmp_path):
    graph = sdrt.Graph.load(mlp_model().SerializeToString())
    arrays = graph.initializer_arrays()
    path = write_model(graph, arrays, tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    by_name = {t.name: t for t in model.graph.initializer}
    assert set(by_name) == set(arrays)
    external = {n for n, t in by_name.items() if t.data_location == onnx.TensorProto.EXTERNAL}
    assert external == {n for n, a in arrays.items() if a.nbytes > INLINE_BYTES} == {"fc1.weight", "fc2.weight"}
    offset = 0
    for name in [n for n in arrays if n in external]:  # MIGraphX reads entry 0, 1, 2 as location, offset, length
        entries = [(e.key, e.value) for e in by_name[name].external_data]
        assert entries == [("location", "weights.bin"), ("offset", str(offset)),
                           ("length", str(arrays[name].nbytes))]
        offset += arrays[name].nbytes
    assert (tmp_path / "weights.bin").stat().st_size == offset
    assert by_name["shape"].data_type == onnx.TensorProto.INT64 and by_name["shape"].raw_data


def test_weights_are_cast_to_the_graphs_declared_dtype(tmp_path):
    graph = sdrt.Graph.load(conv_model().SerializeToString())
    arrays = {k: v.astype(np.float64) for k, v in graph.initializer_arrays().items()}
    model = onnx.load(str(write_model(graph, arrays, tmp_path)))
    assert {t.data_type for t in model.graph.initializer} == {onnx.TensorProto.FLOAT}


def test_static_inputs_give_map_input_dims():
    graph = sdrt.Graph.load(conv_model(batch=2).SerializeToString())
    assert input_dims(graph) == {"x": [2, 3, 8, 8]}


def test_dynamic_inputs_are_refused_with_how_to_pin_them():
    graph = sdrt.Graph.load(conv_model(batch="batch").SerializeToString())
    with pytest.raises(UnsupportedGraph) as info:
        input_dims(graph)
    assert info.value.unsupported == {"dynamic input": ["x: float32[batch, 3, 8, 8]"]}
    assert "graph.with_shapes(" in str(info.value)
    assert input_dims(graph.with_shapes(batch=1)) == {"x": [1, 3, 8, 8]}


def test_first_lines_drops_migraphx_source_locations():
    exc = RuntimeError("/long/path/src/onnx/onnx_parser.cpp:512: parse_graph: Unknown operator: Frobnicate\n\n")
    assert first_lines(exc) == "parse_graph: Unknown operator: Frobnicate"
    assert first_lines(RuntimeError("")) == "RuntimeError"
    assert len(first_lines(RuntimeError("x" * 5000))) == 600
