"""Session.update_weights on the reference backend: swap weights, no re-parse; stripped graphs compile."""

from __future__ import annotations

import gw_models as M
import numpy as np
import pytest

import sdrt
from sdrt.errors import WeightsError
from sdrt.graph import Graph
from sdrt.weights import Weights

X = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)


def _doubled(graph: Graph) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) * 2 for k, v in graph.initializer_arrays().items()}


def _expected(arrays: dict[str, np.ndarray]) -> np.ndarray:
    from onnx import numpy_helper

    m = M.linear_model()
    for t in m.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(arrays[t.name], t.name))
    return M.run_reference(m, {"x": X})["y"]


def test_update_weights_swaps_without_rebuilding(registry):
    graph = Graph.load(M.linear_model().SerializeToString())
    own = {k: np.array(v) for k, v in graph.initializer_arrays().items()}
    with sdrt.load(graph, backend="reference") as s:
        evaluator = s._evaluator
        before = s.run({"x": X})["y"]
        s.update_weights(Weights.from_arrays(_doubled(graph)))
        assert s._evaluator is evaluator  # the graph was not parsed or built again
        np.testing.assert_array_equal(s.run({"x": X})["y"], _expected(_doubled(graph)))
        s.update_weights(Weights.from_arrays(own))
        assert s.run({"x": X})["y"].tobytes() == before.tobytes()


def test_update_weights_with_bad_weights_changes_nothing(registry):
    graph = Graph.load(M.linear_model().SerializeToString())
    with sdrt.load(graph, backend="reference") as s:
        before = s.run({"x": X})["y"]
        bad = _doubled(graph)
        bad["fc2.bias"] = np.zeros(5, np.float32)
        del bad["fc1.bias"]
        with pytest.raises(WeightsError) as e:
            s.update_weights(Weights.from_arrays(bad))
        assert "fc2.bias" in str(e.value) and "fc1.bias" in str(e.value)
        assert s.run({"x": X})["y"].tobytes() == before.tobytes()


def test_stripped_graph_compiles_and_updates(tmp_path, registry):
    res = Graph.load(M.linear_model().SerializeToString()).strip(tmp_path / "s.onnx")
    doubled = tmp_path / "doubled.safetensors"
    w = Weights.open(res.weights_path)
    Weights.from_arrays({k: np.asarray(w[k]) * 2 for k in w}).save(doubled)
    with sdrt.load(res.graph_path, weights=res.weights_path, backend="reference") as s:
        first = s.run({"x": X})["y"]
        s.update_weights(Weights.open(doubled))
        second = s.run({"x": X})["y"]
    graph = Graph.load(M.linear_model().SerializeToString())
    assert first.tobytes() == M.run_reference(graph, {"x": X})["y"].tobytes()
    np.testing.assert_array_equal(second, _expected(_doubled(graph)))


def test_weights_from_run_cli(tmp_path, registry, capsys):
    """`sdrt run --weights` goes through the same path."""
    from sdrt.cli import main

    res = Graph.load(M.linear_model().SerializeToString()).strip(tmp_path / "s.onnx")
    np.save(tmp_path / "x.npy", X)
    assert main(["run", str(res.graph_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--weights", str(res.weights_path), "--backend", "reference"]) == 0
    y = np.load(tmp_path / "o.npz")["y"]
    assert y.tobytes() == M.run_reference(M.linear_model(), {"x": X})["y"].tobytes()
