"""sdrt.resolve_weights: the one place a graph's weights are put together, for every backend.

The graph is a real torch.onnx export (tests/graph/data) whose attention weights are anonymous
``onnx::MatMul_*`` initializers, stored transposed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

import sdrt
from sdrt.errors import ModelError, WeightsError
from sdrt.graph import Graph
from sdrt.keymap import KeyMap
from sdrt.weights import Weights

EXPORT = Path(__file__).parents[1] / "graph" / "data" / "attention_block.onnx"


@pytest.fixture
def graph() -> Graph:
    return Graph.load(EXPORT)


def _other(graph: Graph, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(a.shape).astype(a.dtype) for n, a in graph.initializer_arrays().items()}


def test_an_inline_graph_resolves_to_its_own_data(graph):
    arrays = sdrt.resolve_weights(graph)
    assert list(arrays) == graph.initializer_names
    assert any(n.startswith("onnx::MatMul_") for n in arrays)
    for t in graph.model.graph.initializer:
        np.testing.assert_array_equal(arrays[t.name], numpy_helper.to_array(t))


def test_a_stripped_graph_resolves_from_its_file_mapped_not_copied(graph, tmp_path):
    res = graph.strip(tmp_path / "block.onnx")
    stripped = Graph.load(res.graph_path)
    assert stripped.is_stripped and set(stripped.mapped_initializers) == set(graph.initializer_names)
    arrays = sdrt.resolve_weights(stripped)
    own = graph.initializer_arrays()
    assert set(arrays) == set(own)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(arr, own[name])
        assert not arr.flags.writeable, f"{name} was copied into memory instead of mapped from the file"


def test_given_weights_override_after_their_key_mapping(graph, tmp_path):
    """Checkpoint keys 'unet.<name>' map to initializer names, the anonymous MatMul weights included."""
    other = _other(graph)
    Weights.from_arrays({f"unet.{k}": v for k, v in other.items()}).save(tmp_path / "ckpt.safetensors")
    res = graph.strip(tmp_path / "block.onnx")
    weights = Weights.open(tmp_path / "ckpt.safetensors", mapping=KeyMap(strip_prefix="unet."))
    arrays = sdrt.resolve_weights(Graph.load(res.graph_path), weights)
    assert set(arrays) == set(other)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(arr, other[name])


def test_weights_that_do_not_fit_raise_one_error_listing_every_problem(graph):
    other = _other(graph)
    anonymous = next(n for n in other if n.startswith("onnx::MatMul_"))
    del other["proj_in.bias"]
    other[anonymous] = other[anonymous][:8]
    other["stray"] = np.zeros(2, np.float32)
    with pytest.raises(WeightsError) as e:
        sdrt.resolve_weights(graph, Weights.from_arrays(other))
    msg = str(e.value)
    assert "1 missing" in msg and "proj_in.bias" in msg and "1 unexpected" in msg and "stray" in msg
    assert f"{anonymous}: weights float32[8, 16] vs graph float32[16, 16]" in msg


def test_a_stripped_graph_whose_file_is_gone_names_the_tensor_and_the_file(graph, tmp_path):
    res = graph.strip(tmp_path / "block.onnx")
    stripped = Graph.load(res.graph_path)
    res.weights_path.unlink()
    with pytest.raises(ModelError, match=r"block\.safetensors"):
        sdrt.resolve_weights(stripped)
    # weights that name every tensor make the absent file irrelevant
    arrays = sdrt.resolve_weights(stripped, Weights.from_arrays(_other(graph)))
    assert set(arrays) == set(graph.initializer_names)
