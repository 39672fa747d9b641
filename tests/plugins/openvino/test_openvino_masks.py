"""OpenVINO and transformers' additive attention masks: ``(1 - mask) * min`` added to T5's position bias.

Without ``sdrt_openvino.masks.guard_additive_masks``, OpenVINO folds ``bias + min`` into one constant once the
shapes are pinned (the bias is constant then) and loses the bias: the tiny Chroma T5 encoder comes out 1.85
away from onnxruntime at float32, and Chroma's images 18 to 76 levels away from diffusers'.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[3]
TINY_T5 = ROOT / "tests" / "data" / "pipelines" / "tiny-chroma" / "text_encoder" / "model.onnx"
SHIPPED_T5 = ROOT / "core" / "src" / "sdrt" / "data" / "graphs" / "t5xxl.onnx.xz"


def _feeds(length: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((1, length), np.int64)
    mask[0, 10:] = 0
    return {"input_ids": rng.integers(0, 800, (1, length)).astype(np.int64), "attention_mask": mask}


def test_pinned_masked_t5_matches_onnxruntime(ov_registry) -> None:
    import sdrt
    from sdrt.graph import Graph

    feeds = _feeds()
    want = ort.InferenceSession(str(TINY_T5)).run(None, feeds)[0]
    pinned = Graph.load(TINY_T5).with_shapes({"batch_size": 1, "sequence_length": 32})
    for graph in (pinned, pinned.fold_constants()):  # as given, and as a pipeline part pins and folds it
        got = sdrt.load(graph, backend="openvino", precision="fp32").run(feeds)["last_hidden_state"]
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_guard_rewrites_the_pattern_and_keeps_values() -> None:
    from sdrt_openvino.masks import guard_additive_masks

    model = onnx.load(str(TINY_T5))
    guarded = guard_additive_masks(model)
    assert guarded is not model and sum(n.op_type == "Where" for n in guarded.graph.node) == \
        sum(n.op_type == "Where" for n in model.graph.node) + 1
    assert guard_additive_masks(guarded) is guarded  # a second pass finds nothing left to guard
    onnx.checker.check_model(guarded)
    feeds = _feeds(24)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    got = ort.InferenceSession(guarded.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(got, ref)


def test_guard_finds_the_shipped_t5_mask() -> None:
    """sdrt's shipped T5-XXL (dynamo export, its 1 and min as initializers bound later) has the pattern too."""
    from sdrt_openvino.masks import _constants, _matches

    model = onnx.load_from_string(lzma.decompress(SHIPPED_T5.read_bytes()))
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert len(_matches(model, _constants(model, {}))) == 1


def test_guard_leaves_other_graphs_alone() -> None:
    from onnx import TensorProto, helper, numpy_helper

    from sdrt_openvino.masks import guard_additive_masks

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Sub", ["one", "x"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])],
                              "g", [x], [y], [numpy_helper.from_array(np.array(1, np.float32), "one"),
                                              numpy_helper.from_array(np.array(3, np.float32), "c")])
    model = helper.make_model(graph)
    assert guard_additive_masks(model) is model  # a small factor is arithmetic, not a mask
