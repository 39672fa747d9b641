"""OpenVINO through the core's compile cache: hits, misses on any key change, atomic entries, corrupted
entries rebuilt, and a hit that maps the blob instead of reading it."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ov_helpers import conv_model, ort_run

import sdrt

X = np.random.default_rng(11).standard_normal((1, 3, 8, 8), dtype=np.float32)


def _entries(tmp_path, root="cache"):
    found = (tmp_path / root / "compiled" / "openvino").glob("*/model.blob")
    return sorted(p for p in found if not p.parent.name.startswith("."))


def _lookup(entry):
    from sdrt.cache import CompileCache

    return CompileCache("openvino", entry.parents[3]).lookup(entry.parent.name)


def _load(**options):
    return sdrt.load(conv_model().SerializeToString(), backend="openvino", device="CPU", **options)


def test_second_load_imports_from_the_cache(ov_registry, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sdrt.openvino")
    first = _load().run({"x": X})["y"]
    assert len(_entries(tmp_path)) == 1
    caplog.clear()
    second = _load().run({"x": X})["y"]
    assert any("loaded" in r.getMessage() and "cache" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(first, second)
    assert not list((tmp_path / "cache" / "compiled" / "openvino").glob(".*")), "no temporary folder may stay behind"


def test_key_changes_with_options_weights_and_graph(ov_registry, tmp_path):
    _load()
    _load(precision="bf16")
    _load(threads=1)
    sdrt.load(conv_model(seed=5).SerializeToString(), backend="openvino", device="CPU")
    assert len(_entries(tmp_path)) == 4


def test_cache_can_be_turned_off_or_moved(ov_registry, tmp_path):
    _load(cache=False)
    assert _entries(tmp_path) == []
    _load(cache_dir=str(tmp_path / "elsewhere"))
    assert len(_entries(tmp_path, "elsewhere")) == 1


@pytest.mark.parametrize("damage", ["flip_payload_bytes", "truncate", "garbage_with_valid_checksum", "empty"])
def test_corrupted_cache_entry_is_rebuilt(ov_registry, tmp_path, caplog, damage):
    """Corrupt a real cache file on disk; the next load warns, recompiles, runs right and rewrites the entry."""
    import hashlib
    import json

    expected = ort_run(conv_model(), {"x": X})[0]
    _load()
    (entry,) = _entries(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "flip_payload_bytes":
        mid = len(data) // 2
        data[mid:mid + 16] = bytes(b ^ 0xFF for b in data[mid:mid + 16])
    elif damage == "truncate":
        data = data[: len(data) // 3]
    elif damage == "garbage_with_valid_checksum":  # passes the cache's checksum, so OpenVINO's import must fail
        data = bytearray(b"not an OpenVINO blob" * 50)
    else:
        data = bytearray()
    entry.write_bytes(bytes(data))
    if damage == "garbage_with_valid_checksum":
        manifest = entry.parent / "sdrt-entry.json"
        info = json.loads(manifest.read_text())
        info["files"]["model.blob"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        manifest.write_text(json.dumps(info))

    caplog.set_level(logging.WARNING, logger="sdrt")
    out = _load().run({"x": X})["y"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert any("unusable" in r.getMessage() for r in caplog.records)
    # the entry was rewritten whole and now reads back clean
    assert _lookup(entry) is not None
    caplog.clear()
    _load()
    assert not any("unusable" in r.getMessage() for r in caplog.records)


def test_a_cache_hit_maps_the_blob_and_resolves_no_weight(ov_registry, tmp_path, monkeypatch):
    """On a hit the blob is handed to OpenVINO as a map of the file (never read into Python), and the
    weights are neither resolved nor hashed before the session needs them."""
    import builtins

    import sdrt.weights.resolve as resolve_mod

    model_path = tmp_path / "conv.onnx"
    model_path.write_bytes(conv_model().SerializeToString())
    sdrt.Graph.load(model_path).strip(tmp_path / "s.onnx")
    first = sdrt.load(tmp_path / "s.onnx", backend="openvino").run({"x": X})["y"]
    (entry,) = _entries(tmp_path)
    calls = []
    monkeypatch.setattr(resolve_mod, "resolve_weights", lambda *a, **k: calls.append(a) or {})
    real_open = builtins.open

    class NoRead:  # the blob's file object: mapping it is allowed, reading it into Python is not
        def __init__(self, f):
            self._f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

        def __getattr__(self, name):
            assert not name.startswith("read"), "the blob was read into Python"
            return getattr(self._f, name)

    def no_blob_read(file, *args, **kwargs):
        f = real_open(file, *args, **kwargs)
        return NoRead(f) if str(file) == str(entry) else f

    monkeypatch.setattr(builtins, "open", no_blob_read)
    session = sdrt.load(tmp_path / "s.onnx", backend="openvino")
    assert calls == []
    assert session.blob is not None and str(session.blob.filename) == str(entry)
    np.testing.assert_array_equal(session.run({"x": X})["y"], first)


def test_unwritable_cache_dir_only_logs(ov_registry, tmp_path, caplog):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    caplog.set_level(logging.WARNING, logger="sdrt.cache")
    out = _load(cache_dir=str(blocker)).run({"x": X})["y"]
    assert out.shape == (1, 4, 8, 8)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"the compile cache cannot go in {blocker}" in said[0] and "is a file" in said[0]


def test_processes_compiling_at_once_share_the_cache_safely(ov_registry, tmp_path):
    """Three processes load the same model at the same moment: each runs; one whole entry remains."""
    script = textwrap.dedent(f"""
        import os, sys, numpy as np
        sys.path.insert(0, {str(tmp_path)!r})
        os.environ["SDRT_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        import sdrt
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from ov_helpers import conv_model
        s = sdrt.load(conv_model().SerializeToString(), backend="openvino", device="CPU")
        print(float(s.run({{"x": np.ones((1, 3, 8, 8), np.float32)}})["y"].sum()))
    """)
    env = {"SDRT_PLUGINS": "openvino,reference", **__import__("os").environ}
    env.pop("SDRT_LOAD_ENTRY_POINTS", None)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1][-500:] for r in results]
    assert len({r[0].strip() for r in results}) == 1
    (entry,) = _entries(tmp_path)
    assert _lookup(entry) is not None


def test_models_whose_blob_breaks_on_import_are_not_cached(ov_registry, tmp_path):
    """RotaryEmbedding compiles to a RoPE layer that OpenVINO's CPU blob does not restore right."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], name="rope")
    graph = helper.make_graph([node], "rope", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 8]),
        helper.make_tensor_value_info("cos", TensorProto.FLOAT, [50, 4]),
        helper.make_tensor_value_info("sin", TensorProto.FLOAT, [50, 4]),
        helper.make_tensor_value_info("pos", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=11)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4, 3, 8), dtype=np.float32),
             "cos": rng.random((50, 4), dtype=np.float32), "sin": rng.random((50, 4), dtype=np.float32),
             "pos": rng.integers(0, 50, (2, 3))}
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    for _ in range(2):
        out = sdrt.load(model.SerializeToString(), backend="openvino").run(feeds)["y"]
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert _entries(tmp_path) == []


def test_cache_hit_session_converts_only_when_weights_change(ov_registry, tmp_path):
    from sdrt.weights import Weights

    model_path = tmp_path / "conv.onnx"
    model_path.write_bytes(conv_model().SerializeToString())
    sdrt.Graph.load(model_path).strip(tmp_path / "s.onnx")
    sdrt.load(tmp_path / "s.onnx", backend="openvino")
    session = sdrt.load(tmp_path / "s.onnx", backend="openvino")  # served from the cache
    assert session._converted is None
    rng = np.random.default_rng(4)
    new = {"conv.weight": rng.standard_normal((4, 3, 3, 3), dtype=np.float32),
           "conv.bias": rng.standard_normal(4, dtype=np.float32)}
    session.update_weights(Weights.from_arrays(new))
    from onnx import numpy_helper

    model = conv_model()
    for t in model.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(new[t.name], t.name))
    np.testing.assert_allclose(session.run({"x": X})["y"], ort_run(model, {"x": X})[0], rtol=1e-5, atol=1e-5)


def test_weight_files_are_keyed_by_identity_and_content(ov_registry, tmp_path):
    """A rewritten weights file, or a key mapping that swaps two same-shaped tensors, is a cache miss."""
    from onnx import TensorProto, helper

    from sdrt.weights import Weights

    nodes = [helper.make_node("MatMul", ["x", "a"], ["m"]), helper.make_node("Sub", ["m", "b"], ["y"])]
    graph = helper.make_graph(nodes, "ab", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor("a", TensorProto.FLOAT, [4, 4], np.zeros(16)),
                               helper.make_tensor("b", TensorProto.FLOAT, [4, 4], np.zeros(16))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    wfile = tmp_path / "w.safetensors"
    eye, twos = np.eye(4, dtype=np.float32), np.full((4, 4), 2.0, np.float32)
    Weights.from_arrays({"a": eye, "b": twos}).save(wfile)
    x = np.arange(4, dtype=np.float32)[None]
    run = lambda w: sdrt.load(model.SerializeToString(), weights=w, backend="openvino").run({"x": x})["y"]  # noqa: E731
    np.testing.assert_allclose(run(Weights.open(wfile)), x @ eye - twos)
    np.testing.assert_allclose(run(Weights.open(wfile, mapping={"a": "b", "b": "a"})), x @ twos - eye)
    Weights.from_arrays({"a": twos, "b": twos}).save(tmp_path / "new.safetensors")
    import os

    os.replace(tmp_path / "new.safetensors", wfile)
    np.testing.assert_allclose(run(Weights.open(wfile)), x @ twos - twos)
    assert len(_entries(tmp_path)) == 3


def test_temporary_files_of_killed_writers_are_swept(ov_registry, tmp_path):
    """A process killed mid-write leaves '.<key>.<rand>.tmp/'; the next write removes old ones only."""
    import os
    import time

    root = tmp_path / "cache" / "compiled" / "openvino"
    root.mkdir(parents=True)
    old, fresh = root / ".0123456789abcdef.x1.tmp", root / ".fedcba9876543210.x2.tmp"
    for f in (old, fresh):
        f.mkdir()
        (f / "model.blob").write_bytes(b"\0" * 1024)
    week_ago = time.time() - 7 * 24 * 3600
    os.utime(old, (week_ago, week_ago))
    sdrt.load(conv_model().SerializeToString(), backend="openvino").run({"x": X})  # a miss: writes an entry
    assert not old.exists() and fresh.exists()
    assert len(_entries(tmp_path)) == 1


def test_pages_read_only_at_import_are_released_unless_written(tmp_path):
    """The blob map's pages go out of the process after an import, but never once a page was written."""
    from sdrt_openvino.backend import release_read_pages

    path = tmp_path / "blob"
    path.write_bytes(bytes(range(256)) * 4096)
    clean = np.memmap(path, dtype=np.uint8, mode="c")
    assert int(clean.sum()) > 0  # every page read
    assert release_read_pages(clean) is True
    assert clean[:256].tolist() == list(range(256))  # faulted back in from the file
    written = np.memmap(path, dtype=np.uint8, mode="c")
    written[5] = 0
    assert release_read_pages(written) is False and written[5] == 0
    assert path.read_bytes()[5] == 5  # a private map never writes the file


def test_the_blob_is_written_by_openvino_while_it_compiles_not_exported_in_memory(ov_registry, tmp_path, monkeypatch):
    """A compile the cache stores has OpenVINO stream its blob to a file (CACHE_DIR) that the entry takes over:
    ``export_model`` (the whole blob in memory) is not called, and a compile with the cache off writes none."""
    import openvino as ov

    seen = []
    real_compile = ov.Core.compile_model
    monkeypatch.setattr(ov.Core, "compile_model", lambda self, m, d, props=None: seen.append(dict(props or {}))
                        or real_compile(self, m, d, props or {}))
    monkeypatch.setattr(ov.CompiledModel, "export_model", lambda *a: pytest.fail("export_model was called"))
    first = _load().run({"x": X})["y"]
    (entry,) = _entries(tmp_path)
    assert entry.read_bytes()[:5] == b"<?xml" and b"<compiled_blob" in entry.read_bytes()[:4096]
    assert "CACHE_DIR" in seen[-1]
    assert not list((tmp_path / "cache" / "compiled" / "openvino").glob(".*")), "no staging folder may stay behind"
    np.testing.assert_array_equal(_load().run({"x": X})["y"], first)  # imported past the header
    seen.clear()
    _load(cache=False, threads=1)
    assert seen and all("CACHE_DIR" not in p for p in seen)


def _matmul_model(seed: int = 0) -> bytes:
    """x[4,256] @ W[256,256] -> y: one 256 KB float32 weight, which dominates its blob."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((256, 256), dtype=np.float32) * 0.1
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_half_precision_entry_holds_16_bit_weights(ov_registry, tmp_path):
    """A bf16 compile that stores as it compiles binds the bf16 twin of its weights (``bf16.twin``): its cache
    entry is about half a float32 compile's, its outputs stay within bf16's error of float32 from the compile
    and from the cache alike, and update_weights still swaps the (float32) weights it was given. On a CPU
    without native bf16 OpenVINO computes in float32, with the float32 weights, and stores those."""
    import openvino as ov
    x = np.random.default_rng(1).standard_normal((4, 256), dtype=np.float32)
    model = tmp_path / "mm.onnx"  # a file: its weights are mapped, so the float16 copy can hand their pages back
    model.write_bytes(_matmul_model())
    ref = sdrt.load(model, backend="openvino", device="CPU", precision="fp32")
    want = ref.run({"x": x})["y"]
    (f32_entry,) = _entries(tmp_path)
    half = sdrt.load(model, backend="openvino", device="CPU", precision="bf16")
    (entry,) = [e for e in _entries(tmp_path) if e != f32_entry]
    if "BF16" in {str(c).upper() for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")}:
        assert entry.stat().st_size < 0.6 * f32_entry.stat().st_size, (entry.stat().st_size,
                                                                       f32_entry.stat().st_size)
    else:
        assert entry.stat().st_size > 0.9 * f32_entry.stat().st_size, (entry.stat().st_size,
                                                                       f32_entry.stat().st_size)
    assert f32_entry.stat().st_size > 256 * 256 * 4
    tol = dict(rtol=0, atol=0.05 * float(np.abs(want).max()))
    np.testing.assert_allclose(half.run({"x": x})["y"], want, **tol)
    hit = sdrt.load(model, backend="openvino", device="CPU", precision="bf16")
    np.testing.assert_array_equal(hit.run({"x": x})["y"], half.run({"x": x})["y"])
    w2 = np.random.default_rng(7).standard_normal((256, 256), dtype=np.float32) * 0.1
    hit.update_weights(sdrt.Weights.from_arrays({"w": w2}))
    np.testing.assert_allclose(hit.run({"x": x})["y"], x @ w2, rtol=0, atol=0.05 * float(np.abs(x @ w2).max()))


def test_a_store_held_by_a_job_is_written_after_it_from_what_was_compiled(ov_registry, tmp_path):
    """Inside ``sdrt.cache.deferred.hold()`` (a pipeline's job) a bf16 compile writes nothing; the entry appears
    once the job has ended, holds the model as compiled then (a weight update inside the job compiled a new one),
    and a later load imports it with the original weights' outputs. A float32 compile stores as it compiles."""
    from sdrt.cache import deferred, wait_for_stores

    x = np.random.default_rng(1).standard_normal((4, 256), dtype=np.float32)
    model = tmp_path / "mm.onnx"
    model.write_bytes(_matmul_model())
    want = sdrt.load(model, backend="openvino", device="CPU", precision="bf16", cache=False).run({"x": x})["y"]
    w2 = np.random.default_rng(7).standard_normal((256, 256), dtype=np.float32) * 0.1
    with deferred.hold():
        sess = sdrt.load(model, backend="openvino", device="CPU", precision="bf16")
        np.testing.assert_array_equal(sess.run({"x": x})["y"], want)
        sess.update_weights(sdrt.Weights.from_arrays({"w": w2}))  # a LoRA, say: the session compiles anew
        assert _entries(tmp_path) == [], "nothing is written while the job runs"
        sdrt.load(model, backend="openvino", device="CPU", precision="fp32")  # its blob is the model's full size
        (f32_entry,) = _entries(tmp_path)
    assert wait_for_stores(timeout=120)
    (entry,) = [e for e in _entries(tmp_path) if e != f32_entry]
    hit = sdrt.load(model, backend="openvino", device="CPU", precision="bf16")
    assert getattr(hit, "blob", None) is not None, "the second load imports the stored blob"
    np.testing.assert_array_equal(hit.run({"x": x})["y"], want)
