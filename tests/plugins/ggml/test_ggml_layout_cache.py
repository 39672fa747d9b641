"""The compile cache on ggml: a CPU lowering's weight layouts stored once, mapped by the next compile
(sdrt_ggml/layout_cache.py). References: onnxruntime on the same graph, and the session compiled without the cache."""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pytest
from ggml_helpers import I64, F, compile_ggml, make_model, rand, run_ort
from onnx import helper

mk = helper.make_node


@pytest.fixture
def small_entries(monkeypatch):
    """Entries for graphs of any size (the tests' graphs are far below ``MIN_BYTES``)."""
    from sdrt_ggml import layout_cache

    monkeypatch.setattr(layout_cache, "MIN_BYTES", 0)


def _model():
    """A 3x3 conv on a 16 x 16 map (Winograd's route, whose kernels are not stored), a 1x1 conv, a MatMul and a Gemm
    (GEMM panels), a LayerNormalization and a Gather table: weights with and without a layout transform."""
    inits = {"k3": rand(32, 32, 3, 3) * 0.1, "b3": rand(32), "k1": rand(24, 32, 1, 1) * 0.2, "w": rand(64, 40) * 0.1,
             "g": rand(40) + 1.0, "beta": rand(40), "gw": rand(40, 32) * 0.1, "gb": rand(32),
             "table": rand(10, 32)}
    nodes = [mk("Conv", ["x", "k3", "b3"], ["c3"], pads=[1, 1, 1, 1]), mk("Relu", ["c3"], ["r3"]),
             mk("Conv", ["r3", "k1"], ["c1"]),
             mk("Reshape", ["c1", "shape"], ["flat"]), mk("MatMul", ["flat", "w"], ["m"]),
             mk("LayerNormalization", ["m", "g", "beta"], ["ln"], axis=-1),
             mk("Gemm", ["ln", "gw", "gb"], ["gm"]), mk("Transpose", ["gm"], ["gmT"], perm=[1, 0]),
             mk("Gather", ["table", "idx"], ["rows"]), mk("MatMul", ["rows", "gmT"], ["z"])]
    inits["shape"] = np.array([96, 64], np.int64)  # (1, 24, 16, 16) -> (96, 64)
    return make_model(nodes, INPUTS, {"z": (None, F)}, inits)


INPUTS = {"x": ((1, 32, 16, 16), F), "idx": ((3,), I64)}


def _feeds(seed):
    return {"x": rand(1, 32, 16, 16, seed=seed), "idx": np.array([1, 7, 3], np.int64)}


def _entries(folder):
    from sdrt.cache import wait_for_stores

    wait_for_stores()  # outside a pipeline's job an entry is written in the background
    root = folder / "compiled" / "ggml"
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_second_compile_maps_the_stored_layouts_and_computes_the_same(tmp_path, small_entries, monkeypatch, caplog):
    from sdrt_ggml import native

    model = _model()
    x = _feeds(3)
    with compile_ggml(model, cache_dir=tmp_path) as s:
        first = s.run(x)["z"]
        assert s.impl_hits.get("conv winograd"), s.impl_hits  # the graph takes the route whose kernels stay out
    (entry,) = _entries(tmp_path)
    index = json.loads((entry / "layouts.json").read_text())["arrays"]
    tags = [r["tag"] for r in index]
    assert not any(t.startswith("wino") for t in tags), tags
    assert any(r["name"] == "w" for r in index) and any(r["name"] == "table" for r in index)
    np.testing.assert_allclose(first, run_ort(model, x)["z"], rtol=1e-4, atol=1e-4)

    def no_layouts(*a, **k):
        raise AssertionError("a layout was made again on a cache hit")

    monkeypatch.setattr(native, "pack_b", no_layouts)
    monkeypatch.setattr(native, "aligned_pad", no_layouts)
    caplog.set_level(logging.INFO, logger="sdrt.ggml")
    with compile_ggml(model, cache_dir=tmp_path) as s:
        again = s.run(x)["z"]
        assert s.impl_hits.get("conv winograd")
    assert any("from the compile cache" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(again, first)
    from sdrt.errors import UnsupportedGraph

    with pytest.raises(UnsupportedGraph, match="made again"):  # the probe: without the cache they are made
        compile_ggml(model, cache_dir=tmp_path, cache=False)


def test_weights_written_into_a_mapped_session_leave_the_entry_as_it_was(tmp_path, small_entries):
    model = _model()
    x = _feeds(4)
    with compile_ggml(model, cache_dir=tmp_path) as s:
        s.run(x)
    (entry,) = _entries(tmp_path)
    before = _digest(entry / "layouts.bin")

    class _W:
        def __init__(self, arrays):
            self.arrays = arrays

        def bind(self, graph):
            return dict(self.arrays)

    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    new = dict(inits, w=inits["w"][::-1].copy(), k1=-inits["k1"])
    changed = make_model(model.graph.node, INPUTS, {"z": (None, F)}, new)
    with compile_ggml(model, cache_dir=tmp_path) as s:  # a hit: the layouts are the file's, mapped copy-on-write
        s.update_weights(_W(new))
        got = s.run(x)["z"]
    np.testing.assert_allclose(got, run_ort(changed, x)["z"], rtol=1e-4, atol=1e-4)
    assert _digest(entry / "layouts.bin") == before
    with compile_ggml(model, cache_dir=tmp_path) as s:  # and the next hit computes the base weights again
        np.testing.assert_allclose(s.run(x)["z"], run_ort(model, x)["z"], rtol=1e-4, atol=1e-4)


def test_a_store_held_for_a_job_is_dropped_when_the_weights_changed_before_it(tmp_path, small_entries, caplog):
    from sdrt.cache import deferred, wait_for_stores
    from sdrt_ggml import native

    model = _model()
    caplog.set_level(logging.INFO, logger="sdrt.ggml")
    with deferred.hold():
        s = compile_ggml(model, cache_dir=tmp_path)
        w = native.aligned_empty((64, 40), np.float32)
        w[:] = 0.5

        class _W:
            def bind(self, graph):
                return {"w": w}

        s.update_weights(_W())  # a LoRA bound before the job's end: its values must not be stored as the base's
    wait_for_stores()
    s.close()
    assert _entries(tmp_path) == []
    assert any("weights changed since it was compiled" in r.getMessage() for r in caplog.records)
    with deferred.hold():  # unchanged: stored after the job
        compile_ggml(model, cache_dir=tmp_path).close()
        assert _entries(tmp_path) == []
    wait_for_stores()
    assert len(_entries(tmp_path)) == 1


def test_small_lowerings_and_other_options_get_their_own_entries_or_none(tmp_path, monkeypatch, caplog):
    from sdrt_ggml import layout_cache

    model = _model()
    compile_ggml(model, cache_dir=tmp_path).close()
    assert _entries(tmp_path) == []  # under MIN_BYTES: lowering it again is cheaper than an entry
    monkeypatch.setattr(layout_cache, "MIN_BYTES", 0)
    caplog.set_level(logging.INFO, logger="sdrt.ggml")
    compile_ggml(model, cache_dir=tmp_path).close()
    assert any("storing in the background" in r.getMessage() for r in caplog.records)  # no job: not in compile
    compile_ggml(model, cache_dir=tmp_path, precision="bf16").close()
    compile_ggml(model, cache_dir=tmp_path, gemm="ggml").close()
    compile_ggml(model, cache_dir=tmp_path, scheduler=True).close()  # weights uploaded: not cached
    compile_ggml(model, cache_dir=tmp_path, threads=1, pool=False).close()  # the same layouts: a hit
    assert len(_entries(tmp_path)) == 3


def test_replay_refuses_an_entry_that_does_not_match_the_lowering(tmp_path):
    from sdrt.errors import UnusableEntry
    from sdrt_ggml import layout_cache
    from sdrt_ggml.native import aligned_empty

    a, b = aligned_empty((3, 5), np.float32), aligned_empty((7,), np.int32)
    a[:], b[:] = 1.5, 7
    ra = layout_cache.Request("P32", "w", "(5, 3):float32", "")
    rb = layout_cache.Request("", "idx", "(7,):int64", "int32")
    layout_cache.write(tmp_path, [(ra, a), (rb, b)])
    replay = layout_cache.Replay(tmp_path)
    got = replay.take(ra)
    assert got.ctypes.data % 64 == 0 and got.flags.writeable and not got.flags.owndata
    np.testing.assert_array_equal(got, a)
    with pytest.raises(UnusableEntry, match="took 1 of the 2"):
        replay.finish()
    np.testing.assert_array_equal(replay.take(rb), b)
    replay.finish()
    with pytest.raises(UnusableEntry, match="more layouts"):
        replay.take(rb)
    with pytest.raises(UnusableEntry, match="was stored for"):
        layout_cache.Replay(tmp_path).take(rb)
    (tmp_path / "layouts.json").write_text('{"format": 99, "arrays": []}')
    with pytest.raises(UnusableEntry, match="format 99"):
        layout_cache.Replay(tmp_path)


def test_an_entry_that_lowering_cannot_replay_is_discarded_and_compiled_again(tmp_path, small_entries, caplog):
    model = _model()
    x = _feeds(5)
    compile_ggml(model, cache_dir=tmp_path).close()
    (entry,) = _entries(tmp_path)
    data = json.loads((entry / "layouts.json").read_text())
    data["arrays"] = data["arrays"][:-1]  # an index written by another lowering: one layout fewer
    (entry / "layouts.json").write_text(json.dumps(data))
    manifest = json.loads((entry / "sdrt-entry.json").read_text())  # as if its checksum matched (stamp renewed)
    st = (entry / "layouts.json").stat()
    manifest["files"]["layouts.json"].update(size=st.st_size, stamp=[st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                                                      st.st_ino],
                                             sha256=_digest(entry / "layouts.json"))
    (entry / "sdrt-entry.json").write_text(json.dumps(manifest))
    caplog.set_level(logging.INFO)
    with compile_ggml(model, cache_dir=tmp_path) as s:
        np.testing.assert_allclose(s.run(x)["z"], run_ort(model, x)["z"], rtol=1e-4, atol=1e-4)
    assert any("could not load it" in r.getMessage() for r in caplog.records)


def test_a_changed_graph_gets_its_own_entry(tmp_path, small_entries):
    """Two graphs with the same weights that differ in node attributes get two entries (the graph is in the key)."""
    model = _model()
    compile_ggml(model, cache_dir=tmp_path).close()
    other = _model()
    other.graph.node[0].attribute[0].ints[:] = [1, 1, 1, 1]
    for n in other.graph.node:
        if n.op_type == "LayerNormalization":
            n.attribute.append(helper.make_attribute("epsilon", 1e-3))
    compile_ggml(other, cache_dir=tmp_path).close()
    assert len(_entries(tmp_path)) == 2


def test_a_lowering_too_small_to_store_holds_no_store_for_the_job(tmp_path, caplog):
    from sdrt.cache import deferred

    caplog.set_level(logging.INFO, logger="sdrt.ggml")
    with deferred.hold():
        compile_ggml(_model(), cache_dir=tmp_path).close()
        assert deferred.current() == []  # "writing the compile cache for the next run" counts only real stores
    assert any("nothing to store" in r.getMessage() for r in caplog.records)
    assert _entries(tmp_path) == []


def test_a_held_store_does_not_keep_a_dropped_session_alive(tmp_path, small_entries):
    import gc
    import weakref

    from sdrt.cache import deferred

    with deferred.hold():
        s = compile_ggml(_model(), cache_dir=tmp_path)
        ref = weakref.ref(s)
        del s
        gc.collect()
        assert ref() is None  # its compute buffers go now, not after the store; the layouts it made are written
    assert len(_entries(tmp_path)) == 1


def _external_conv(tmp_path):
    """A 3x3 conv of 256 channels on a 4 x 4 map (on the implicit GEMM, whose rows are the kernel as it is) and a
    MatMul (GEMM panels), saved with external data as ONNX writes it: tensors over 1 MB at 64 kB boundaries."""
    import copy

    import onnx

    inits = {"k": rand(256, 256, 3, 3) * 0.02, "b": rand(256), "w": rand(4, 24) * 0.1}
    nodes = [mk("Conv", ["x", "k", "b"], ["c"], pads=[1, 1, 1, 1]), mk("MatMul", ["c", "w"], ["z"])]
    model = make_model(nodes, {"x": ((1, 256, 4, 4), F)}, {"z": (None, F)}, inits)
    path = tmp_path / "conv.onnx"
    onnx.save_model(copy.deepcopy(model), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="conv.onnx_data", size_threshold=0)
    return model, path


def _compile_path(path, **options):
    from sdrt.graph import Graph
    from sdrt_ggml import GgmlBackend

    be = GgmlBackend()
    # the conv pinned to the implicit GEMM: with the AVX-512 kernels a 4 x 4 map takes the cols route over patches
    # (W^T packed, a layout of its own), with AVX2 the implicit GEMM; the test is about the map, not the route
    options.setdefault("conv_impl", "implicit")
    # its external data mapped, as a model over 2 GiB's is (a smaller one's is read in unless asked so)
    graph = Graph.load(path, load_external=False)
    return be.compile(graph, None, next(d for d in be.devices() if d.kind == "cpu"), **options)


def test_a_kernel_kept_as_its_file_stores_it_is_mapped_not_copied_nor_stored(tmp_path, small_entries):
    """The conv's rows are the file's bytes: mapped copy-on-write (no copy while compiling, none in the cache entry);
    the result is onnxruntime's, and new weights written into the session leave the model's file as it was."""
    model, path = _external_conv(tmp_path)
    data = tmp_path / "conv.onnx_data"
    before = _digest(data)
    x = {"x": rand(1, 256, 4, 4, seed=8)}
    want = run_ort(model, x)["z"]
    cache = tmp_path / "cache"
    with _compile_path(path, cache_dir=cache) as s:
        assert s.impl_hits.get("weights mapped") == 1, s.impl_hits
        np.testing.assert_allclose(s.run(x)["z"], want, rtol=1e-4, atol=1e-4)
    (entry,) = _entries(cache)
    names = [r["name"] for r in json.loads((entry / "layouts.json").read_text())["arrays"]]
    assert "k" not in names and "w" in names, names  # the panels are a layout of their own; the kernel is the file's
    with _compile_path(path, cache_dir=cache) as s:  # a hit: the panels from the entry, the kernel from the model
        assert s.impl_hits.get("weights mapped") == 1, s.impl_hits
        np.testing.assert_allclose(s.run(x)["z"], want, rtol=1e-4, atol=1e-4)
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    new = dict(inits, k=-inits["k"])

    class _W:
        def bind(self, graph):
            return {"k": new["k"]}

    changed = make_model(model.graph.node, {"x": ((1, 256, 4, 4), F)}, {"z": (None, F)}, new)
    with _compile_path(path, cache=False) as s:
        s.update_weights(_W())
        np.testing.assert_allclose(s.run(x)["z"], run_ort(changed, x)["z"], rtol=1e-4, atol=1e-4)
    assert _digest(data) == before
