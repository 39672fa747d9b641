"""What a pipeline reads from its parts' pinned graphs, kept across processes under the pinned structure's digest
(sdrt.graph.pinned_store): a new process (the in-process memo emptied, a new Part on the same file) neither infers
shapes again for the dry run nor counts the activation peak again; a file written anew with another graph is
pinned anew; a cache folder that cannot be written or holds corrupt entries changes nothing but the time."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import sdrt.graph.shapes as shapes
import sdrt.pipelines.streaming as streaming
from sdrt.pipelines.budget import MemoryMixin
from sdrt.pipelines.parts import Part


def _model(path, width: int = 3) -> None:
    """y = concat(x, x) along axis 1 then + c: y's dims follow x's (batch dynamic)."""
    c = helper.make_tensor("c", TensorProto.FLOAT, [1, 2 * width], np.arange(2 * width, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("Concat", ["x", "x"], ["t"], axis=1), helper.make_node("Add", ["t", "c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2 * width])],
        [c],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _dry(path, batch: int, width: int = 3):
    return Part("unet", path).dry().run({"x": np.zeros((batch, width), np.float32)})["y"].shape


class _Plan(MemoryMixin):
    def __init__(self, path):
        self._parts = {"unet": Part("unet", path)}


@pytest.fixture
def work(monkeypatch, tmp_path):
    """The cache under tmp_path, an empty process memo, and counts of shape inference and activation counting."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(shapes, "_INFERRED", type(shapes._INFERRED)())
    counts = {"infer": 0, "peaks": 0}
    real_infer, real_peaks = shapes.infer, streaming.activation_peaks

    def infer(*args, **kwargs):
        counts["infer"] += 1
        return real_infer(*args, **kwargs)

    def peaks(*args, **kwargs):
        counts["peaks"] += 1
        return real_peaks(*args, **kwargs)

    monkeypatch.setattr(shapes, "infer", infer)
    monkeypatch.setattr(streaming, "activation_peaks", peaks)
    return counts


def test_a_new_process_takes_the_dry_runs_shapes_without_inferring(tmp_path, work):
    path = tmp_path / "model.onnx"
    _model(path)
    assert _dry(path, 5) == (5, 6)
    assert work["infer"] == 1
    shapes._INFERRED.clear()  # a new process
    assert _dry(path, 5) == (5, 6)
    assert work["infer"] == 1
    assert _dry(path, 2) == (2, 6)  # other dims: another structure
    assert work["infer"] == 2


def test_a_file_written_anew_is_pinned_anew(tmp_path, work):
    path = tmp_path / "model.onnx"
    _model(path)
    assert _dry(path, 4) == (4, 6)
    _model(tmp_path / "other.onnx", width=5)
    os.replace(tmp_path / "other.onnx", path)  # same name, same size class, another graph
    shapes._INFERRED.clear()
    assert _dry(path, 4, width=5) == (4, 10)
    assert work["infer"] == 2


def test_the_memory_plans_activation_peaks_are_kept(tmp_path, work):
    path = tmp_path / "model.onnx"
    _model(path)
    calls = {"unet": [{"x": (8, 3)}, {"x": (2, 3)}]}
    first, heaviest = _Plan(path)._activations(calls, None, None)
    assert work["peaks"] == 2 and first["unet"] > 0
    shapes._INFERRED.clear()  # a new process's plan: nothing inferred, nothing counted
    again, heaviest2 = _Plan(path)._activations(calls, None, None)
    assert (work["infer"], work["peaks"]) == (2, 2) and again == first
    assert heaviest["unet"][1:] == heaviest2["unet"][1:] == ("unet", {"x": (8, 3)}, 1.0)
    assert len(list((tmp_path / "cache" / "pinned").glob("*.fact"))) == 2


def test_an_unwritable_or_corrupt_cache_changes_nothing_but_the_time(tmp_path, work, monkeypatch):
    path = tmp_path / "model.onnx"
    _model(path)
    calls = {"unet": [{"x": (3, 3)}]}
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    monkeypatch.setenv("SDRT_CACHE_DIR", str(blocker))  # the cache root is a file: nothing can be written under it
    want = _Plan(path)._activations(calls, None, None)[0]
    shapes._INFERRED.clear()
    assert _Plan(path)._activations(calls, None, None)[0] == want
    assert _dry(path, 3) == (3, 6)
    assert (work["infer"], work["peaks"]) == (2, 2)
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache2"))
    shapes._INFERRED.clear()
    assert _Plan(path)._activations(calls, None, None)[0] == want
    for f in (tmp_path / "cache2" / "pinned").iterdir():
        f.write_bytes(b"-1" if f.suffix == ".fact" else b"SDRTPIN1\xff")
    shapes._INFERRED.clear()
    assert _Plan(path)._activations(calls, None, None)[0] == want
    assert _dry(path, 3) == (3, 6)
    assert (work["infer"], work["peaks"]) == (4, 4)


def test_a_weight_fed_as_an_input_is_another_structure(tmp_path, work):
    """A large initializer and a graph input of the same name and type have the same inference skeleton, but the
    activation peak counts the input and not the weight: a file rewritten so is counted anew, not read back."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], np.ones((64, 64), np.float32))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])
    node = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    path = tmp_path / "model.onnx"
    calls = {"unet": [{"x": (2, 64)}]}
    opset = [helper.make_opsetid("", 17)]
    onnx.save(helper.make_model(helper.make_graph(node, "g", [x], [y], [w]), opset_imports=opset), str(path))
    as_weight = _Plan(path)._activations(calls, None, None)[0]["unet"]
    wi = helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 64])
    onnx.save(helper.make_model(helper.make_graph(node, "g", [x, wi], [y]), opset_imports=opset), str(path))
    shapes._INFERRED.clear()  # a new process
    as_input = _Plan(path)._activations(calls, None, None)[0]["unet"]
    assert as_input == as_weight + 64 * 64 * 4
    assert work["peaks"] == 2


def test_only_the_stores_own_entries_are_pruned(tmp_path, work, monkeypatch):
    """The folder keeps the newest KEEP entries and facts; a file of another name (or a link) there is not sdrt's."""
    from sdrt.graph import pinned_store

    monkeypatch.setattr(pinned_store, "KEEP", 1)
    folder = tmp_path / "cache" / "pinned"
    folder.mkdir(parents=True)
    for name in ("notes.bin", "notes.fact"):
        (folder / name).write_text("mine")
        os.utime(folder / name, (0, 0))
    (folder / f"{'0' * 64}.fact").symlink_to(folder / "notes.fact")
    path = tmp_path / "model.onnx"
    _model(path)
    calls = {"unet": [{"x": (8, 3)}, {"x": (2, 3)}]}
    _Plan(path)._activations(calls, None, None)
    names = sorted(p.name for p in folder.iterdir())
    assert [n for n in names if n.endswith(".bin") and n != "notes.bin"] and "notes.bin" in names
    assert len([n for n in names if n.endswith(".fact")]) == 3 and "notes.fact" in names
