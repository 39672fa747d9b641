"""Weights: stripped graphs with their .safetensors, weights= at compile, and update_weights."""

from __future__ import annotations

import numpy as np
import pytest
from ov_helpers import conv_model, ort_run, two_output_model

import sdrt
from sdrt.errors import WeightsError
from sdrt.weights import Weights

X = np.random.default_rng(5).standard_normal((1, 3, 8, 8), dtype=np.float32)


@pytest.fixture
def stripped(tmp_path):
    path = tmp_path / "conv.onnx"
    path.write_bytes(conv_model().SerializeToString())
    sdrt.Graph.load(path).strip(tmp_path / "conv.stripped.onnx")
    return tmp_path / "conv.stripped.onnx"


def _new_weights(seed=9):
    rng = np.random.default_rng(seed)
    return {"conv.weight": rng.standard_normal((4, 3, 3, 3), dtype=np.float32),
            "conv.bias": rng.standard_normal(4, dtype=np.float32)}


def _expected(arrays):
    from onnx import numpy_helper

    model = conv_model()
    for t in model.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(arrays[t.name], t.name))
    return ort_run(model, {"x": X})[0]


def test_stripped_graph_runs_with_its_own_safetensors(ov_registry, stripped):
    out = sdrt.load(stripped, backend="openvino").run({"x": X})["y"]
    np.testing.assert_allclose(out, ort_run(conv_model(), {"x": X})[0], rtol=1e-5, atol=1e-5)


def test_weights_given_at_compile_replace_the_graphs(ov_registry, stripped, tmp_path):
    arrays = _new_weights()
    Weights.from_arrays(arrays).save(tmp_path / "other.safetensors")
    out = sdrt.load(stripped, weights=tmp_path / "other.safetensors", backend="openvino").run({"x": X})["y"]
    np.testing.assert_allclose(out, _expected(arrays), rtol=1e-5, atol=1e-5)


def test_update_weights_matches_a_fresh_compile(ov_registry, stripped, tmp_path):
    arrays = _new_weights()
    Weights.from_arrays(arrays).save(tmp_path / "other.safetensors")
    session = sdrt.load(stripped, backend="openvino")
    before = session.run({"x": X})["y"]
    session.update_weights(Weights.open(tmp_path / "other.safetensors"))  # read-only mmap arrays
    after = session.run({"x": X})["y"]
    np.testing.assert_allclose(after, _expected(arrays), rtol=1e-5, atol=1e-5)
    assert not np.allclose(before, after)
    session.update_weights(Weights.from_arrays(_new_weights(seed=10)))  # writable arrays, shared
    np.testing.assert_allclose(session.run({"x": X})["y"], _expected(_new_weights(seed=10)), rtol=1e-5, atol=1e-5)


def test_update_weights_on_an_inline_graph(ov_registry):
    model = two_output_model()
    session = sdrt.load(model.SerializeToString(), backend="openvino")
    w = np.full((6, 5), 0.5, np.float32)
    arrays = {"fc.weight": w, "shape": np.array([-1], np.int64)}
    session.update_weights(Weights.from_arrays(arrays))
    x = np.ones((2, 6), np.float32)
    np.testing.assert_allclose(session.run({"x": x})["mm"], x @ w, rtol=1e-6)


def test_update_weights_with_a_wrong_shape_is_refused(ov_registry, stripped):
    session = sdrt.load(stripped, backend="openvino")
    bad = _new_weights()
    bad["conv.weight"] = bad["conv.weight"][:2]
    with pytest.raises(WeightsError, match="conv.weight"):
        session.update_weights(Weights.from_arrays(bad))
    assert session.run({"x": X})["y"].shape == (1, 4, 8, 8)  # still usable with the old weights


def test_weights_that_do_not_fit_fail_at_compile(ov_registry, stripped):
    with pytest.raises(WeightsError, match="missing"):
        sdrt.load(stripped, weights=Weights.from_arrays({"conv.weight": _new_weights()["conv.weight"]}),
                  backend="openvino")


def test_update_weights_swaps_constants_without_converting_again(ov_registry, stripped, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    session = sdrt.load(stripped, backend="openvino")
    session.update_weights(Weights.from_arrays(_new_weights()))
    session.update_weights(Weights.from_arrays(_new_weights(seed=3)))
    messages = [r.getMessage() for r in caplog.records]
    assert not any("converting the graph once more" in m for m in messages)
    assert any("weightless import" in m for m in messages)  # the second update compiles nothing
    np.testing.assert_allclose(session.run({"x": X})["y"], _expected(_new_weights(seed=3)), rtol=1e-5, atol=1e-5)


def test_update_weights_on_an_inline_graph_with_shared_constants(ov_registry, caplog):
    """One initializer feeding two ops: OpenVINO may fold it away; the session converts once, then swaps."""
    import logging

    from onnx import TensorProto, helper, numpy_helper

    w = np.full((3, 3), 2.0, np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Add", ["a", "w"], ["y"])]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 3])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = sdrt.load(model.SerializeToString(), backend="openvino")
    x = np.eye(3, dtype=np.float32)
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    for scale in (3.0, 5.0):
        w2 = np.full((3, 3), scale, np.float32)
        session.update_weights(Weights.from_arrays({"w": w2}))
        np.testing.assert_allclose(session.run({"x": x})["y"], x @ w2 + w2, rtol=1e-6)


def test_bfloat16_weights_bind_and_update(ov_registry, tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes provides numpy's bfloat16")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((6, 5)).astype(ml_dtypes.bfloat16)
    nodes = [helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT), helper.make_node("MatMul", ["x", "wf"], ["y"])]
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    sdrt.Graph.load(tmp_path / "m.onnx").strip(tmp_path / "s.onnx")
    x = np.ones((2, 6), np.float32)
    session = sdrt.load(tmp_path / "s.onnx", backend="openvino")
    np.testing.assert_allclose(session.run({"x": x})["y"], x @ w.astype(np.float32), rtol=1e-6)
    w2 = (w.astype(np.float32) * 2).astype(ml_dtypes.bfloat16)
    session.update_weights(Weights.from_arrays({"w": w2}))
    np.testing.assert_allclose(session.run({"x": x})["y"], x @ w2.astype(np.float32), rtol=1e-6)


def test_changing_a_shape_initializer_converts_the_graph_again(ov_registry, caplog):
    import logging

    session = sdrt.load(two_output_model().SerializeToString(), backend="openvino")
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    w = np.ones((6, 5), np.float32)
    session.update_weights(Weights.from_arrays({"fc.weight": w, "shape": np.array([-1], np.int64)}))
    session.update_weights(Weights.from_arrays({"fc.weight": w, "shape": np.array([10], np.int64)}))
    messages = [r.getMessage() for r in caplog.records]
    assert sum("compiled once more" in m for m in messages) == 2  # the blob bakes the shape in: a new one
    out = session.run({"x": np.ones((2, 6), np.float32)})
    np.testing.assert_allclose(out["flat"], np.full(10, 6.0, np.float32))
    session._swappable = False  # the compile path (other devices) converts the graph again
    session.update_weights(Weights.from_arrays({"fc.weight": w * 2, "shape": np.array([-1], np.int64)}))
    assert any("converting the graph once more" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(session.run({"x": np.ones((2, 6), np.float32)})["flat"], np.full(10, 12.0))


def test_every_float_weight_is_bound_as_its_own_constant(ov_registry):
    """The ONNX proto is read without its weights: each float initializer becomes one named Constant."""
    from sdrt_openvino import convert

    graph = sdrt.Graph.load(conv_model().SerializeToString())
    session = sdrt.load(graph, backend="openvino")
    assert set(convert.read(ov_registry.backends["openvino"].core, graph, sdrt.resolve_weights(graph)).consts) == {
        "conv.weight", "conv.bias"}
    out = session.run({"x": X})["y"]
    np.testing.assert_allclose(out, ort_run(conv_model(), {"x": X})[0], rtol=1e-5, atol=1e-5)
