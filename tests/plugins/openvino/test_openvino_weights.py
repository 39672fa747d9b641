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
