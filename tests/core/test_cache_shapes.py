"""The dry run's output shapes kept across processes (sdrt.cache.shapes): a second process (a new Part on the same
file) takes them without pinning the graph; a file written anew, another edit or other dims pin it again; a cache
folder that cannot be written or holds a corrupt entry changes nothing but the time."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from sdrt.graph import Graph
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


def _dry(path, batch: int, edit=None, key=None):
    part = Part("unet", path).dry()
    if edit is not None:
        part.graph_edit, part.graph_edit_key = edit, key
    return part.run({"x": np.zeros((batch, 3), np.float32)})["y"].shape


@pytest.fixture
def pins(monkeypatch, tmp_path):
    """Counts Graph.with_shapes calls; the cache under tmp_path."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = Graph.with_shapes

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Graph, "with_shapes", counting)
    return calls


def test_a_second_process_takes_the_shapes_without_pinning(tmp_path, pins):
    path = tmp_path / "model.onnx"
    _model(path)
    assert _dry(path, 5) == (5, 6)
    assert len(pins) == 1
    assert _dry(path, 5) == (5, 6)  # a new Part: as a new process would make it
    assert len(pins) == 1
    assert _dry(path, 2) == (2, 6)  # other dims
    assert len(pins) == 2
    assert list((tmp_path / "cache" / "shapes").glob("*.json"))


def test_a_file_written_anew_is_pinned_again(tmp_path, pins):
    path = tmp_path / "model.onnx"
    _model(path)
    assert _dry(path, 4) == (4, 6)
    _model(tmp_path / "other.onnx", width=5)
    os.replace(tmp_path / "other.onnx", path)  # same name, another graph
    part = Part("unet", path).dry()
    assert part.run({"x": np.zeros((4, 5), np.float32)})["y"].shape == (4, 10)
    assert len(pins) == 2


def test_edits_are_keyed_and_unnamed_edits_never_stored(tmp_path, pins):
    path = tmp_path / "model.onnx"
    _model(path)
    same = lambda g: g  # noqa: E731
    _dry(path, 3, same, "edit-a")
    _dry(path, 3, same, "edit-a")
    assert len(pins) == 1
    _dry(path, 3, same, "edit-b")
    assert len(pins) == 2
    _dry(path, 3, same, None)
    _dry(path, 3, same, None)
    assert len(pins) == 4


def test_an_unwritable_or_corrupt_cache_changes_nothing_but_the_time(tmp_path, pins, monkeypatch):
    path = tmp_path / "model.onnx"
    _model(path)
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    monkeypatch.setenv("SDRT_CACHE_DIR", str(blocker))  # the cache root is a file: nothing can be written under it
    assert _dry(path, 3) == (3, 6)
    assert _dry(path, 3) == (3, 6)
    assert len(pins) == 2
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache2"))
    assert _dry(path, 3) == (3, 6)
    for f in (tmp_path / "cache2" / "shapes").glob("*.json"):
        f.write_text("{not json")
    assert _dry(path, 3) == (3, 6)
    assert len(pins) == 4


def test_the_memory_plans_activation_peaks_are_kept_too(tmp_path, pins):
    from sdrt.pipelines.budget import MemoryMixin

    path = tmp_path / "model.onnx"
    _model(path)
    calls = {"unet": [{"x": (8, 3)}, {"x": (2, 3)}]}

    class Plan(MemoryMixin):
        def __init__(self):
            self._parts = {"unet": Part("unet", path)}

    first, heaviest = Plan()._activations(calls, None, None)
    assert len(pins) == 2 and first["unet"] > 0
    again, heaviest2 = Plan()._activations(calls, None, None)  # a new process's plan: nothing pinned
    assert len(pins) == 2 and again == first
    assert heaviest["unet"][1:] == heaviest2["unet"][1:] == ("unet", {"x": (8, 3)}, 1.0)
