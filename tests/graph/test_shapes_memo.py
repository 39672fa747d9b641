"""``Graph.with_shapes`` infers once per pinned structure: the memo gives what inference gives, and a change in
anything inference reads (a shape constant, the pinned dims) is a different structure."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from sdrt.graph import Graph


def _reshape_model(target: list[int]) -> bytes:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(target, np.int64), "shape")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _shapes(g: Graph) -> dict[str, list]:
    return {t.name: list(t.shape) for t in g.outputs}


def test_the_same_structure_pinned_again_gives_the_same_shapes():
    first = Graph.load(_reshape_model([-1, 8])).with_shapes(x=(2, 16))
    again = Graph.load(_reshape_model([-1, 8])).with_shapes(x=(2, 16))  # another Graph of the same bytes
    assert _shapes(first) == _shapes(again) == {"y": [4, 8]}
    assert [v.SerializeToString() for v in first.model.graph.value_info] == \
        [v.SerializeToString() for v in again.model.graph.value_info]


def test_a_changed_shape_constant_or_pin_is_inferred_anew():
    assert _shapes(Graph.load(_reshape_model([-1, 8])).with_shapes(x=(2, 16))) == {"y": [4, 8]}
    assert _shapes(Graph.load(_reshape_model([-1, 4])).with_shapes(x=(2, 16))) == {"y": [8, 4]}
    assert _shapes(Graph.load(_reshape_model([-1, 8])).with_shapes(x=(4, 16))) == {"y": [8, 8]}


def _clip_projection_model() -> bytes:
    """Optimum's CLIP-with-projection export in small: text_embeds is [batch, 4] but its declared axes are
    labelled (batch_size, sequence_length), as Optimum's CLIPTextWithProjectionOnnxConfig writes them."""
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["h"]),
         helper.make_node("ReduceMean", ["h"], ["pooled"], axes=[1], keepdims=0),
         helper.make_node("MatMul", ["pooled", "proj"], ["text_embeds"]),
         helper.make_node("Identity", ["h"], ["last_hidden_state"])], "clip",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
        [helper.make_tensor_value_info("text_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch_size", "sequence_length", 8])],
        [numpy_helper.from_array(np.ones((10, 8), np.float32), "table"),
         numpy_helper.from_array(np.ones((8, 4), np.float32), "proj")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_output_axis_labels_do_not_override_inference():
    # pinning sequence_length=77 used to write 77 into text_embeds' second dim: "shape inference failed ...
    # Inferred shape and existing shape differ in dimension 1: (4) vs (77)" on every Optimum SDXL/SD3 folder
    pinned = Graph.load(_clip_projection_model()).with_shapes(input_ids=(2, 77))
    assert _shapes(pinned) == {"text_embeds": [2, 4], "last_hidden_state": [2, 77, 8]}


def test_a_new_process_takes_what_an_earlier_one_inferred_from_disk(monkeypatch, tmp_path):
    """The memo is kept under the cache root (graph.pinned_store): with the process's memo empty, pinning the same
    structure reads it back (inference not run) and gives the same value infos; a corrupt entry is inferred anew."""
    import sdrt.graph.shapes as shapes

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(shapes, "_INFERRED", type(shapes._INFERRED)())
    first = Graph.load(_reshape_model([-1, 2])).with_shapes(x=(3, 16))
    entries = list((tmp_path / "pinned").glob("*.bin"))
    assert len(entries) == 1
    shapes._INFERRED.clear()  # a new process

    def no_inference(*args, **kwargs):
        raise AssertionError("inferred again")

    with monkeypatch.context() as m:
        m.setattr(shapes, "infer", no_inference)
        again = Graph.load(_reshape_model([-1, 2])).with_shapes(x=(3, 16))
    assert _shapes(again) == _shapes(first) == {"y": [24, 2]}
    assert [v.SerializeToString() for v in first.model.graph.value_info] == \
        [v.SerializeToString() for v in again.model.graph.value_info]
    shapes._INFERRED.clear()
    entries[0].write_bytes(b"SDRTPIN1\xff\xff")  # truncated: passed over
    assert _shapes(Graph.load(_reshape_model([-1, 2])).with_shapes(x=(3, 16))) == {"y": [24, 2]}
