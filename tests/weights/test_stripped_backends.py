"""A stripped torch export runs with its weights on every installed backend, with no backend code for it.

The reference, OpenVINO and ggml backends get their arrays from ``sdrt.resolve_weights``; the
export (tests/graph/data) holds anonymous ``onnx::MatMul_*`` weights and torch's reference output.
The plugins are imported directly: the tests session installs them, so a missing one fails here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sdrt
from sdrt.graph import Graph
from sdrt.weights import Weights

DATA = Path(__file__).parents[1] / "graph" / "data"
REF = dict(np.load(DATA / "attention_block_ref.npz"))
SHAPE = REF["x1"].shape
OPTIONS = {"reference": {}, "openvino": {"device": "CPU"}, "ggml": {"shapes": {"sample": SHAPE}}}


@pytest.fixture
def backends(registry, tmp_path, monkeypatch):
    import sdrt_ggml
    import sdrt_openvino

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    registry.register_plugin(sdrt_openvino, "openvino", distribution="sdrt-openvino", version="0.1.0")
    registry.register_plugin(sdrt_ggml, "ggml", distribution="sdrt-ggml", version="0.1.0")
    return registry


@pytest.fixture
def stripped(tmp_path) -> Path:
    return Graph.load(DATA / "attention_block.onnx").strip(tmp_path / "model" / "block.onnx").graph_path


def _load(path: Path, backend: str, weights=None) -> sdrt.Session:
    opts = dict(OPTIONS[backend])
    device = opts.pop("device", None)
    return sdrt.load(path, weights=weights, backend=backend, device=device, **opts)


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_stripped_export_matches_torch(backends, stripped, backend):
    with _load(stripped, backend) as s:
        np.testing.assert_allclose(s.run({"sample": REF["x1"]})["out"], REF["y1"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_stripped_export_with_other_weights_then_updated(backends, stripped, backend, tmp_path):
    graph = Graph.load(stripped)
    own = graph.initializer_arrays()
    other = {k: (v * 0.5).astype(v.dtype) for k, v in own.items()}
    Weights.from_arrays(other).save(tmp_path / "other.safetensors")
    with sdrt.load(stripped, weights=tmp_path / "other.safetensors", backend="reference") as ref:
        expected = ref.run({"sample": REF["x1"]})["out"]
    with _load(stripped, backend, weights=tmp_path / "other.safetensors") as s:
        np.testing.assert_allclose(s.run({"sample": REF["x1"]})["out"], expected, rtol=1e-4, atol=1e-4)
        s.update_weights(Weights.from_graph(graph))
        np.testing.assert_allclose(s.run({"sample": REF["x1"]})["out"], REF["y1"], rtol=1e-4, atol=1e-4)
