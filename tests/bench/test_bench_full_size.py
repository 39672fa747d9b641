"""The full-size rows: models above protobuf's 2 GB limit are written with external data that every
reader loads, and `python -m bench` times the full-size models after the bench-size ones.

The full-size UNet (~3.4 GB) is far too big for the test suite, so the external-data path is forced
on the tiny UNet (``external_above=0``), and sdrt's mapped route for models above 2 GiB is forced by
lowering ``sdrt.graph.graph.MAX_INLINE_BYTES``.
"""

from __future__ import annotations

import json

import onnx
import pytest

import bench.__main__ as bench_main
from bench import harness

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is needed to run the bench models")


@pytest.fixture(scope="module")
def external_unet(tmp_path_factory):
    """The tiny UNet written with external data, and the same model written inline."""
    ext = harness.model_file("unet", "tiny", tmp_path_factory.mktemp("external"), external_above=0)
    inline = harness.model_file("unet", "tiny", tmp_path_factory.mktemp("inline"))
    return ext, inline


def _ort_outputs(path, feeds, outputs):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(outputs, feeds)


def test_large_models_are_written_with_one_external_data_file(external_unet):
    (path, _, outputs), (inline_path, _, _) = external_unet
    data = path.with_name(path.name + ".data")
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, data.name, path.with_suffix(".npz").name])
    proto = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {data.name}  # relative, and the final name: valid after the move out of the build folder
    assert data.stat().st_mode == path.stat().st_mode
    assert path.stat().st_size < inline_path.stat().st_size < data.stat().st_size + path.stat().st_size
    assert outputs == [o.name for o in proto.graph.output]
    assert not onnx.load(str(inline_path), load_external_data=False).graph.initializer[0].external_data


def test_onnxruntime_and_openvino_read_the_external_data(external_unet):
    (path, feeds, outputs), (inline_path, _, _) = external_unet
    want = _ort_outputs(inline_path, feeds, outputs)
    got = _ort_outputs(path, feeds, outputs)
    assert harness.max_rel_err(got, want) == 0.0
    pytest.importorskip("openvino", reason="the openvino package is not installed")
    run = harness.openvino_runner(path, outputs, threads=1)
    assert harness.max_rel_err(run(feeds), want) < 1e-4


@pytest.mark.parametrize("mapped", [False, True], ids=["read-in", "mapped-as-above-2GiB"])
def test_sdrt_loads_and_strips_the_external_data(external_unet, tmp_path, monkeypatch, mapped):
    import shutil

    import sdrt
    import sdrt.graph.graph as graph_module

    (src, feeds, outputs), (inline_path, _, _) = external_unet
    path = tmp_path / src.name  # a private copy: stripped_file writes beside its input
    for f in (src, src.with_name(src.name + ".data")):
        shutil.copy(f, tmp_path / f.name)
    if mapped:  # the full-size UNet's route: its weights stay mapped from the .data file
        monkeypatch.setattr(graph_module, "MAX_INLINE_BYTES", 0)
    graph = sdrt.Graph.load(path)
    assert bool(graph.external_refs) == mapped
    stripped = harness.stripped_file(path)
    assert stripped is not None and stripped.with_suffix(".safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".strip-")]
    # the stripped pair holds the same model: read back in full, it runs as the inline build does
    # (onnxruntime cannot load a stripped graph itself: its shape inference needs the constants inline)
    whole = sdrt.Graph.load(stripped, load_external=True).model.SerializeToString()
    got = ort.InferenceSession(whole, providers=["CPUExecutionProvider"]).run(outputs, feeds)
    assert harness.max_rel_err(got, _ort_outputs(inline_path, feeds, outputs)) == 0.0


def test_a_cached_model_is_reused_unless_its_data_file_is_gone(tmp_path, monkeypatch):
    path, _, _ = harness.model_file("mobilenet_v2", "tiny", tmp_path, external_above=0)
    built = path.stat().st_mtime_ns

    def no_build(*args):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(harness.models, "build", no_build)
    assert harness.model_file("mobilenet_v2", "tiny", tmp_path)[0] == path
    assert path.stat().st_mtime_ns == built
    path.with_name(path.name + ".data").unlink()
    monkeypatch.undo()
    again, feeds, _ = harness.model_file("mobilenet_v2", "tiny", tmp_path)
    assert again == path and path.with_name(path.name + ".data").exists() is False  # rebuilt, inline this time
    assert _ort_outputs(path, feeds, None)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".build-")]


def test_rows_at_full_size_are_labelled_in_the_table_and_the_json():
    rows = [harness.Result("unet", "onnxruntime", "peer", median_ms=80.0, min_ms=79.0, p10_ms=79.0, p90_ms=81.0,
                           runs=3),
            harness.Result("unet", "onnxruntime", "peer", "full", median_ms=9000.0, min_ms=8900.0, p10_ms=8900.0,
                           p90_ms=9100.0, runs=3)]
    lines = harness.render(rows).splitlines()
    assert lines[2].startswith("unet ") and lines[4].startswith("unet@full ")
    data = json.loads(json.dumps(harness.to_json(rows, {})))
    assert [r["size"] for r in data["results"]] == ["bench", "full"]


@pytest.fixture
def planned(monkeypatch, tmp_path):
    """Run `python -m bench` with bench_model faked; returns the (model, size, rounds, warmup) it was asked for."""
    calls = []

    def fake_bench_model(name, size, workdir, backends, *, rounds, min_seconds, warmup, **kw):
        calls.append((name, size, rounds, warmup))
        return [harness.Result(name, "onnxruntime", "peer", size, median_ms=1.0, min_ms=1.0, p10_ms=1.0,
                               p90_ms=1.0, runs=rounds or 1)]

    monkeypatch.setattr(harness, "bench_model", fake_bench_model)
    monkeypatch.setattr(harness, "sdrt_backends", lambda *a, **k: [])

    def run(*argv):
        calls.clear()
        out = tmp_path / "results.json"
        assert bench_main.main([*argv, "--no-pipeline", "--workdir", str(tmp_path), "--json", str(out)]) == 0
        return list(calls), json.loads(out.read_text())

    return run


def test_the_default_run_adds_the_full_size_vae_decoder_and_unet(planned):
    calls, data = planned()
    bench_size = [c for c in calls if c[1] == "bench"]
    assert [c[0] for c in bench_size] == list(harness.models.MODELS)
    assert calls[len(bench_size):] == [("vae_decoder", "full", 3, 1), ("unet", "full", 3, 1)]
    assert [r["size"] for r in data["results"]].count("full") == 2
    assert data["config"]["full_models"] == ["vae_decoder", "unet"]


def test_full_size_rows_follow_the_options(planned):
    assert planned("--models", "unet,mobilenet_v2")[0][-1] == ("unet", "full", 3, 1)
    assert all(c[1] == "bench" for c in planned("--models", "mobilenet_v2")[0])
    assert all(c[1] == "bench" for c in planned("--no-full")[0])
    assert all(c[1] == "tiny" for c in planned("--size", "tiny")[0])
    assert [c[1] for c in planned("--size", "full", "--models", "unet")[0]] == ["full"]
    calls, _ = planned("--models", "mobilenet_v2", "--full-models", "unet", "--full-rounds", "5", "--full-warmup", "0")
    assert calls == [("mobilenet_v2", "bench", None, 3), ("unet", "full", 5, 0)]
    with pytest.raises(SystemExit):
        planned("--full-models", "resnet")
