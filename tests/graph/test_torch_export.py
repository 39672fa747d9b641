"""A graph exported by torch.onnx (2.13, TorchScript exporter) with dynamic batch/height/width axes.

tests/graph/data/export_attention_block.py made the .onnx and torch's reference outputs (.npz);
torch is not needed here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import sdrt
from sdrt.graph import Graph
from sdrt.lora import Lora, merge

DATA = Path(__file__).parent / "data"
REF = dict(np.load(DATA / "attention_block_ref.npz"))
SHAPE_CHAIN = {"Shape", "Gather", "Unsqueeze", "Concat", "Constant", "Cast"}


@pytest.fixture
def graph() -> Graph:
    return Graph.load(DATA / "attention_block.onnx")


def _run(graph: Graph, x: np.ndarray, weights=None) -> np.ndarray:
    with sdrt.load(graph, weights=weights, backend="reference") as s:
        return s.run({"sample": x})["out"]


def test_export_has_dynamic_axes_and_shape_chains(graph):
    assert [str(i) for i in graph.inputs] == ["sample: float32[batch, 16, height, width]"]
    assert graph.outputs[0].shape == ("batch", 16, "height", "width")
    counts = graph.op_counts()
    assert counts["Shape"] >= 4 and counts["Gather"] >= 4 and counts["Concat"] >= 4 and counts["Reshape"] >= 4


def test_dynamic_graph_matches_torch_at_two_shapes(graph, registry):
    np.testing.assert_allclose(_run(graph, REF["x1"]), REF["y1"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_run(graph, REF["x2"]), REF["y2"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("pins", "x", "y"), [
    ({"sample": (2, 16, 4, 6)}, "x1", "y1"),
    ({"batch": 1, "height": 3, "width": 5}, "x2", "y2"),
])
def test_pin_infer_fold_matches_torch(graph, registry, pins, x, y):
    pinned = graph.with_shapes(pins)
    assert pinned.inputs[0].shape == REF[x].shape and pinned.outputs[0].shape == REF[y].shape
    infos = pinned.value_infos()
    inter = [o for n in pinned.model.graph.node for o in n.output]
    assert all(infos[o].is_static for o in inter), [str(infos.get(o)) for o in inter if not infos[o].is_static]
    folded = pinned.fold_constants()
    onnx.checker.check_model(pinned.model, full_check=True)
    onnx.checker.check_model(folded.model, full_check=True)
    counts = folded.op_counts()
    assert not SHAPE_CHAIN & set(counts), counts  # every runtime-shape chain is gone
    assert sum(counts.values()) < sum(graph.op_counts().values()) - 50
    # every weight keeps its name, so weights saved from the export still bind
    assert {n for n in graph.initializer_names if "weight" in n or "MatMul" in n} <= set(folded.initializer_names)
    np.testing.assert_allclose(_run(folded, REF[x]), REF[y], rtol=1e-4, atol=1e-5)


def test_kohya_lora_on_anonymous_transposed_matmul_matches_torch(graph, registry):
    """attn.to_q is exported as MatMul with anonymous square weight onnx::MatMul_*, stored [in, out]."""
    lora = Lora.from_arrays({k[len("lora."):]: v for k, v in REF.items() if k.startswith("lora.")})
    merged = merge(graph, [(lora, 0.75)])
    assert set(merged.report.applied) == {"proj_in.weight"} | {
        n.input[1] for n in graph.model.graph.node if n.name == "/attn/to_q/MatMul"}
    with sdrt.load(graph, backend="reference") as s:
        s.update_weights(merged)
        np.testing.assert_allclose(s.run({"sample": REF["x1"]})["out"], REF["y1_lora"], rtol=1e-4, atol=1e-5)
        s.update_weights(merged.unmerge())
        np.testing.assert_allclose(s.run({"sample": REF["x1"]})["out"], REF["y1"], rtol=1e-4, atol=1e-5)


def test_strip_round_trip_of_the_export(graph, registry, tmp_path):
    res = graph.strip(tmp_path / "block.onnx")
    assert res.graph_bytes < (DATA / "attention_block.onnx").stat().st_size
    assert _run(Graph.load(res.graph_path), REF["x1"], weights=res.weights_path).tobytes() == \
        _run(graph, REF["x1"]).tobytes()
