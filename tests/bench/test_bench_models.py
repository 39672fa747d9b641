"""The bench models build at tiny size, are valid ONNX, and run the same on onnxruntime and the reference backend."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from bench import harness
from sdrt.testing import models

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is needed to run the bench models")


@pytest.fixture(scope="module")
def tiny_models():
    return {name: models.build(name, "tiny") for name in models.MODELS}


@pytest.mark.parametrize("name", list(models.MODELS))
def test_model_is_valid_onnx_at_opset_17(tiny_models, name):
    model, feeds = tiny_models[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    assert {i.name for i in model.graph.input} == set(feeds)


@pytest.mark.parametrize("name", list(models.MODELS))
def test_model_runs_on_onnxruntime_and_reference_alike(tiny_models, name):
    from onnx.reference import ReferenceEvaluator

    model, feeds = tiny_models[name]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    ref = ReferenceEvaluator(model).run(None, feeds)
    for g, r in zip(got, ref):
        assert np.isfinite(g).all()
        assert g.std() > 1e-3, "activations collapsed: the weights' scale is wrong"
        assert harness.max_rel_err([g], [r]) < 1e-4


def test_models_keep_the_architecture(tiny_models):
    ops = {name: {n.op_type for n in m.graph.node} for name, (m, _) in tiny_models.items()}
    assert {"InstanceNormalization", "Resize", "Softmax", "Sigmoid"} <= ops["vae_decoder"]
    assert {"Erf", "Split", "LayerNormalization", "Concat", "Cos", "Sin", "Gemm"} <= ops["unet"]
    assert {"Gather", "LayerNormalization", "Softmax"} <= ops["text_encoder"]
    assert {"HardSwish", "HardSigmoid", "GlobalAveragePool"} <= ops["mobilenet_v3"]
    assert "Clip" in ops["mobilenet_v2"]
    for block in ("flux_double_block", "flux_single_block", "sd35_block"):  # RMSNorm, GELU-tanh, AdaLN
        assert {"ReduceMean", "Sqrt", "Tanh", "Pow", "Split", "Gemm", "LayerNormalization", "Softmax"} <= ops[block]
        assert "Pow" not in {n.op_type for n in tiny_models[block][0].graph.node if "net.0" in n.name}  # x*(x*x)
    assert {"Neg", "Slice"} <= ops["flux_double_block"] & ops["flux_single_block"]  # the rotary embedding
    names = {t.name for t in tiny_models["unet"][0].graph.initializer}
    assert "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight.T" in names
    assert any(n.startswith("up_blocks.3.resnets.2.") for n in names)


def test_unknown_model_or_size_is_refused():
    with pytest.raises(KeyError, match="unknown bench model"):
        models.build("resnet", "tiny")
    with pytest.raises(KeyError, match="unknown size"):
        models.build("unet", "huge")


def test_harness_times_peers_and_reference(tmp_path, registry):
    rows = harness.bench_model("mobilenet_v2", "tiny", tmp_path, ["reference"], rounds=2, min_seconds=0,
                               warmup=0, threads=1, peers=["onnxruntime"])
    by_runner = {r.runner: r for r in rows}
    assert set(by_runner) == {"onnxruntime", "sdrt-reference"}
    assert by_runner["onnxruntime"].ratio_to_best_peer == pytest.approx(1.0)
    assert by_runner["sdrt-reference"].runs == 2
    assert by_runner["sdrt-reference"].max_rel_err < 1e-4
    text = harness.render(rows)
    assert "sdrt-reference" in text and "vs best peer" in text
    data = json.loads(json.dumps(harness.to_json(rows, {"size": "tiny"})))
    assert data["results"][0]["model"] == "mobilenet_v2"


def test_backend_discovery_skips_reference_unless_asked(registry):
    assert "reference" not in harness.sdrt_backends()
    assert "reference" in harness.sdrt_backends(include_reference=True)
    assert harness.sdrt_backends(only=["reference"]) == ["reference"]


def test_max_rel_err_is_relative_to_the_reference_scale():
    ref = np.array([10.0, -20.0], np.float32)
    assert harness.max_rel_err([ref + np.float32(0.002)], [ref]) == pytest.approx(1e-4, rel=1e-3)
    assert harness.max_rel_err([np.zeros(3)], [ref]) == float("inf")


def test_sdrt_backends_run_the_stripped_graph(tmp_path, registry):
    path, _, _ = harness.model_file("mobilenet_v2", "tiny", tmp_path)
    stripped = harness.stripped_file(path)
    assert stripped is not None and stripped.with_suffix(".safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".strip-")]
    rows = harness.bench_model("mobilenet_v2", "tiny", tmp_path, ["reference"], rounds=2, min_seconds=0,
                               warmup=0, threads=1, peers=["onnxruntime"], sdrt_input="stripped")
    ref = next(r for r in rows if r.runner == "sdrt-reference")
    assert ref.error is None and ref.max_rel_err < 1e-4
    assert ref.paired_with == "onnxruntime" and ref.paired_ratio > 0


def test_update_weights_bench_agrees_with_a_reload(registry, tmp_path, monkeypatch):
    pytest.importorskip("openvino", reason="the openvino package is not installed")
    import sdrt_openvino
    from bench import update_weights

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    registry.register_plugin(sdrt_openvino, "openvino")
    r = update_weights.measure("mobilenet_v2", "tiny", "openvino", rounds=2, options={"device": "CPU"})
    assert r["update_s"] > 0 and r["reload_s"] > 0 and r["reload_cached_s"] > 0


def test_ggml_kernel_microbenchmark_runs(registry, monkeypatch, capsys):
    """bench.ggml_gemm times each kernel against its peers; at tiny shapes every section runs."""
    pytest.importorskip("ggml", reason="ggml-python (sdrt-ggml's dependency) is not installed")
    import sdrt_ggml
    from bench import ggml_gemm

    registry.register_plugin(sdrt_ggml, "ggml")  # the gemm and conv sections load through sdrt.load

    monkeypatch.setattr(ggml_gemm, "GEMMS", [(64, 32, 16, "tiny matmul")])  # M, K, N
    # C, HW, OC; Winograd above 64 output pixels (below, with the AVX-512 kernels, the cols route over patches, and
    # under 36 on every ISA the implicit GEMM)
    monkeypatch.setattr(ggml_gemm, "CONVS", [(16, 8, 16, "tiny conv"), (32, 12, 32, "tiny winograd"),
                                             (32, 4, 32, "tiny patches")])
    monkeypatch.setattr(ggml_gemm, "ATTENTION", [(32, 16, 8, 2)])
    monkeypatch.setattr(ggml_gemm.time, "sleep", lambda s: None)
    assert ggml_gemm.main(["--threads", "1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "gemm: GFLOPS" in out and "conv (3x3, pad 1" in out and "attention (float32)" in out
    assert "64 x 32 x 16" in out and "16 x 8 x 16" in out and "32 x 16 x 8 x 2" in out
    assert out.count("after 30 ms of untimed ones") == 2  # each contender warms up before its timed calls
    rows = {what: next(line.split() for line in out.splitlines() if line.endswith(what))
            for what in ("tiny matmul", "tiny conv", "tiny winograd", "tiny patches")}
    assert rows["tiny conv"][-3] in ("direct", "implicit") and rows["tiny winograd"][-3] == "winograd"
    from sdrt_ggml import native as ggml_native

    avx512 = ggml_native.native().isa == "avx512"
    want = ("cols_over_patches",) if avx512 else ("direct", "implicit")
    assert rows["tiny patches"][-3] in want
    # sdrt agrees with onnxruntime (the error column: before the words, and before the route for convs)
    assert max(float(rows["tiny matmul"][-3]), *(float(rows[w][-4]) for w in ("tiny conv", "tiny winograd", "tiny patches"))) < 1e-4


def test_unet_batch_axis_can_be_dynamic_with_rows_kept_apart():
    """The pipeline row's UNet takes the 2 rows of classifier-free guidance; each row is what batch 1 gives."""
    fixed, feeds = models.unet("tiny")
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim][0] == 1
    dynamic, _ = models.unet("tiny", batch="batch")
    assert {i.type.tensor_type.shape.dim[0].dim_param for i in dynamic.graph.input} == {"batch"}
    onnx.checker.check_model(dynamic, full_check=True)
    sess = ort.InferenceSession(dynamic.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    two = {"sample": rng.standard_normal((2, *feeds["sample"].shape[1:]), dtype=np.float32),
           "timestep": np.array([981.0, 21.0], np.float32),
           "encoder_hidden_states": rng.standard_normal((2, *feeds["encoder_hidden_states"].shape[1:]),
                                                        dtype=np.float32)}
    (both,) = sess.run(None, two)
    for row in range(2):
        (one,) = sess.run(None, {k: v[row:row + 1] for k, v in two.items()})
        assert harness.max_rel_err([both[row:row + 1]], [one]) < 1e-5
    assert harness.max_rel_err([both[:1]], [both[1:]]) > 0.1  # the rows really differ


def test_mac_count_of_a_known_graph():
    from onnx import TensorProto, helper

    from bench import pipeline

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Reshape", ["y", "s"], ["r"]),
         helper.make_node("MatMul", ["r", "m"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.zeros((5, 3, 3, 3), np.float32), "w"),
         onnx.numpy_helper.from_array(np.array([2, 5, 64], np.int64), "s"),
         onnx.numpy_helper.from_array(np.zeros((64, 7), np.float32), "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # Conv: 2*5*8*8 outputs x 3*3*3 each; MatMul: 2*5*7 outputs x 64 each
    assert pipeline.count_macs(model) == 2 * 5 * 64 * 27 + 2 * 5 * 7 * 64


def test_mac_report_sets_the_bench_folder_against_sd15():
    from bench import pipeline

    text = pipeline.macs_report(steps=20)
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in text.splitlines()
            if line.startswith("| bench") or line.startswith("| SD 1.5")}
    bench = next(v for k, v in rows.items() if k.startswith("bench"))
    sd15 = rows["SD 1.5 (64x64 latents, 512x512)"]
    assert bench[0] == sd15[0]  # the same CLIP ViT-L-size text encoder: 6.65 GMAC a prompt
    assert float(sd15[1]) > 300  # SD 1.5's UNet: ~400 GMAC a row at 64x64
    assert float(sd15[-1].strip(" %")) < 0.2 < float(bench[-1].strip(" %"))


def test_pipeline_row_runs_guided_steps_on_a_diffusers_export(registry):
    """The row runs what a user runs: cfg 7, prompt and negative prompt, 2 UNet rows a step."""
    from bench import pipeline

    folder = pipeline.ROOT / "tests" / "data" / "pipelines" / "tiny-sd15"
    row = pipeline.bench_backend(folder, "reference", steps=3, rounds=1)
    assert row["cfg"] == 7.0 and row["unet_batch"] == 2
    assert row["step_ms"] > 0 and row["raw_unet_ms"] > 0 and 0 < row["encode_share"] < 1
    assert "| sdrt-reference | 7 (2) |" in pipeline.render([row])


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/schedstat"),
                    reason="bench.thread_sched reads Linux's per-thread scheduler statistics (/proc/self/task/*/schedstat)")
def test_thread_sched_counts_the_calling_threads_cpu_time():
    """bench.thread_sched: a call that keeps this thread busy shows it running, on a CPU it may use."""
    import time

    from bench import thread_sched

    def burn():
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.02:
            pass

    res = thread_sched.thread_stats(burn, 0.3)
    main = [t for t in res["threads"] if t["main"]]
    assert res["runs"] >= 2 and res["median_ms"] >= 20 and len(main) == 1
    t = main[0]
    # it ran for part of the window (how much depends on what else the machine runs), at most all of it give or
    # take a scheduler tick: a running thread's CPU time is brought up to date at ticks (up to 10 ms of this
    # 0.3 s window; 1.011 and 1.003 seen)
    assert 0.02 < t["run"] <= 1.1 and 0 <= t["runqueue_wait"] < 1 and t["voluntary"] >= 0 and t["involuntary"] >= 0
    allowed = {int(c) for part in t["allowed"].split(",") for c in range(int(part.split("-")[0]),
                                                                          int(part.split("-")[-1]) + 1)}
    assert t["cpu"] in allowed
