"""`sdrt plan` and the planner, on the tiny pipeline folders and single graphs; backend="auto" with a calibration."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import onnx
import pytest

from sdrt.cli import main
from sdrt.cost import devices
from sdrt.cost.model import Factors, save_calibration
from sdrt.cost.planner import make_plan, parse_memory
from sdrt.errors import SdrtError

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))


def _run_json(capsys, *argv):
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_folder_plan_json_follows_the_run_plan(capsys):
    d = _run_json(capsys, str(DATA / "tiny-sd15"), "--width", "64", "--steps", "5", "--device", "RTX 3060 12GB")
    names = [p["name"] for p in d["parts"]]
    assert names == ["text_encoder", "unet", "vae_decoder"]
    calls = {p["name"]: p["calls"] for p in d["parts"]}
    assert calls == {"text_encoder": 2, "unet": 5, "vae_decoder": 1}  # prompt + negative, one call per step (CFG rows)
    for p in d["parts"]:
        assert p["predicted_ms_per_call"] > 0 and p["predicted_peak_bytes"] > 0
    assert d["predicted_ms_per_image"] == pytest.approx(sum(p["predicted_ms_per_image"] for p in d["parts"]))
    assert d["fits"] is True and d["plan"]["backend"] in ("trt", "ggml") and d["plan"]["precision"] == "fp16"
    assert d["runner_up"] is not None and d["calibrated"] is False


def test_refiner_parts_join_the_plan(capsys):
    """``--refiner``: the refiner's parts (refiner.*) with the calls it takes over, and the base's fewer UNet calls;
    its weights count in the peak (both models stay loaded)."""
    base = _run_json(capsys, str(DATA / "tiny-sdxl-dyn"), "--width", "64", "--steps", "10", "--device", "cpu")
    d = _run_json(capsys, str(DATA / "tiny-sdxl-dyn"), "--width", "64", "--steps", "10", "--device", "cpu",
                  "--refiner", str(DATA / "tiny-sdxl-refiner"), "--refiner-switch-at", "0.7")
    calls = {p["name"]: p["calls"] for p in d["parts"]}
    # the default DPM++ 2M Karras's 10 steps, split at the switch's timestep (test_refiner.py checks the rule)
    assert calls["unet"] + calls["refiner.unet"] == 10 and calls["unet"] >= 3 and calls["refiner.unet"] >= 3
    assert calls["refiner.vae_decoder"] == 1
    assert "vae_decoder" not in calls and "refiner.text_encoder_2" in calls
    assert sum(p["weight_bytes"] for p in d["parts"]) > sum(p["weight_bytes"] for p in base["parts"])
    assert main(["plan", str(DATA / "tiny-sdxl-dyn"), "--device", "cpu", "--refiner", "no/such/refiner"]) == 1
    assert "the refiner model 'no/such/refiner' does not exist" in capsys.readouterr().err


def test_single_onnx_is_one_part_named_after_the_file(capsys):
    path = DATA / "tiny-sd15" / "vae_decoder" / "model.onnx"
    d = _run_json(capsys, str(path), "--device", "cpu")
    assert [p["name"] for p in d["parts"]] == ["model"] and d["parts"][0]["calls"] == 1


def _weight_free_graph(path: Path, layers: int = 6, width: int = 8192) -> Path:
    """A weight-free graph (as ``sdrt strip`` writes, its weights file absent) with ``layers`` MatMuls of
    ``width`` x ``width``: 1.5 GiB of fp32 weights, described and never allocated."""
    from onnx import TensorProto, helper

    from sdrt.graph import STRIPPED_KEY

    inits, nodes, x = [], [], "x"
    for i in range(layers):
        t = onnx.TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[width, width])
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "weights.safetensors"), ("offset", str(i * width * width * 4)),
                     ("length", str(width * width * 4))):
            t.external_data.add(key=k, value=v)
        inits.append(t)
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
        x = f"y{i}"
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 77, width])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    m.metadata_props.add(key=STRIPPED_KEY, value="weights.safetensors")
    path.write_bytes(m.SerializeToString())
    return path


def test_memory_budget_changes_the_plan(tmp_path):
    gpu = devices.find("RTX 3060 12GB")
    model = _weight_free_graph(tmp_path / "big.onnx")
    roomy = make_plan(model, gpu)
    assert roomy.chosen.offload == "none" and roomy.chosen.precision in ("fp16", "bf16")
    assert roomy.chosen.parts[0]["weight_bytes"] == 6 * 8192 * 8192 * 2
    tight = make_plan(model, gpu, memory=roomy.chosen.peak_bytes * 0.8)
    assert tight.chosen is not None and tight.chosen.peak_bytes <= roomy.chosen.peak_bytes * 0.8
    assert (tight.chosen.offload, tight.chosen.precision) != (roomy.chosen.offload, roomy.chosen.precision)
    assert tight.chosen.ms_per_image > roomy.chosen.ms_per_image  # streaming or quantizing costs time
    none = make_plan(model, gpu, memory=64 * 2**20)
    assert none.chosen is None and none.to_dict()["fits"] is False


def test_sizes_scale_the_unet_time():
    cpu = devices.find("cpu")
    small = make_plan(DATA / "tiny-sdxl-dyn", cpu, width=64, height=64, steps=2, backends=["openvino"])
    big = make_plan(DATA / "tiny-sdxl-dyn", cpu, width=128, height=128, steps=2, backends=["openvino"])
    ms = {p["name"]: p["predicted_ms_per_call"] for p in small.chosen.parts}
    ms2 = {p["name"]: p["predicted_ms_per_call"] for p in big.chosen.parts}
    assert ms2["unet"] > ms["unet"] and ms2["text_encoder"] == pytest.approx(ms["text_encoder"])


@pytest.mark.parametrize(("argv", "match"), [
    (["--memory", "lots"], "--memory"),
    (["--device", "Voodoo 2"], "no single library device"),
    (["--precision", "fp12"], "unknown precision"),
    (["--width", "0"], "--width"),
    (["--steps", "100000000000"], "--steps 100000000000 is above the limit of 10000"),  # was a numpy MemoryError
    (["--height", "100000"], "--height 100000 is above the limit of 16384"),
])
def test_bad_flags_are_one_line_errors(capsys, argv, match):
    assert main(["plan", str(DATA / "tiny-sd15"), *argv]) == 1
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "match"), [
    (["--backend", "bogus"], "unknown backend 'bogus'. Where: --backend."),
    (["--backend", "trt", "--device", "cpu"], "the trt backend does not run on this CPU"),
    (["--memory", "1000T", "--device", "RTX 3060 12GB"],
     "more than RTX 3060 12GB has (12.0 GiB). Where: --memory. What to do: pass at most 12.0GiB"),
])
def test_flags_a_plan_cannot_honour_are_refused(capsys, argv, match):
    """No plan for a backend that does not exist or run there, nor under a budget silently capped."""
    assert main(["plan", str(DATA / "tiny-sd15"), "--width", "64", *argv]) == 1
    captured = capsys.readouterr()
    assert match in captured.err and captured.out == ""


def test_the_default_size_is_the_models_own(capsys):
    """As sdrt generate: the demo model makes 64x64 only, and a plan without --width plans that."""
    from sdrt.pipelines import DEMO_MODEL

    assert main(["plan", str(DEMO_MODEL), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["width"], d["height"]) == (64, 64)


def test_not_a_model(capsys, tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    assert main(["plan", str(tmp_path / "x.txt")]) == 1  # a file is read as a checkpoint, as sdrt generate reads it
    assert "cannot open the checkpoint x.txt" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "nothing")]) == 1
    assert "neither a model folder, a checkpoint file nor an .onnx file" in capsys.readouterr().err


def test_parse_memory():
    assert parse_memory("8G") == 8 * 2**30 == parse_memory("8GiB") == parse_memory("8gib")
    assert parse_memory("8GB") == 8e9  # GB and MB are SI units, as sdrt generate --memory reads them
    assert parse_memory("512M") == 512 * 2**20
    with pytest.raises(SdrtError):
        parse_memory("-1G")


def test_list_devices_needs_no_model(capsys):
    """`sdrt plan --list-devices`, as the help says: argparse refused it for want of a MODEL."""
    assert main(["plan", "--list-devices"]) == 0
    assert "RTX 3060 12GB" in capsys.readouterr().out
    assert main(["plan"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no model given") and len(err.strip().splitlines()) == 1


def test_list_devices(capsys):
    assert main(["plan", "x", "--list-devices"]) == 0
    assert "RTX 4090 24GB" in capsys.readouterr().out


def _both_cpu_backends(reg):
    """The registry with OpenVINO and ggml registered, the backend the fixed priority picks and the other one."""
    from sdrt.runtime import _auto

    for name in ("openvino", "ggml"):
        mod = pytest.importorskip(f"sdrt_{name}", reason=f"needs the {name} plugin installed")
        reg.register_plugin(mod, name, distribution=f"sdrt-{name}")
    if not {"openvino", "ggml"} <= set(reg.backends):
        pytest.skip("the openvino and ggml plugins did not register here")
    fixed, _ = _auto(reg, None)
    return reg, fixed, "ggml" if fixed.name == "openvino" else "openvino"


def test_auto_backend_follows_a_calibration(caplog, registry):
    """With both CPU backends calibrated, backend="auto" takes the one the model predicts faster, and says why;
    with nothing calibrated, the fixed priority decides."""
    from sdrt.runtime import _auto

    reg, fixed, other = _both_cpu_backends(registry)
    cpu = devices.this_cpu()
    slow = Factors({c: 0.01 for c in ("matmul", "conv", "attention", "norm", "elementwise", "data")},
                   {c: 1e-3 for c in ("matmul", "conv", "attention", "norm", "elementwise", "data")}, calibrated=True)
    quick = Factors({c: 0.9 for c in slow.efficiency}, {c: 0.0 for c in slow.efficiency}, calibrated=True)
    save_calibration({f"{fixed.name}/cpu/fp32": slow, f"{other}/cpu/fp32": quick}, cpu.to_dict())
    with caplog.at_level(logging.INFO, logger="sdrt.runtime"):
        be, dev = _auto(reg, None)
    assert be.name == other and dev.kind == "cpu"
    assert "calibrated cost model predicts" in caplog.text and f"fixed priority would pick {fixed.name}" in caplog.text


def test_auto_backend_predicts_at_the_precision_the_load_uses(caplog, registry, monkeypatch):
    """backend="auto" ranks the backends at the precision each would compile at (``SDRT_PRECISION`` here; sdrt's
    default on a CPU with bf16 dot products is bf16) from that precision's calibration where one is stored: fp32's
    factors make the fixed priority's backend the faster, bf16's the other."""
    from sdrt.runtime import _auto

    reg, fixed, other = _both_cpu_backends(registry)
    classes = ("matmul", "conv", "attention", "norm", "elementwise", "data")
    slow = Factors({c: 0.01 for c in classes}, {c: 1e-3 for c in classes}, calibrated=True)
    quick = Factors({c: 0.9 for c in classes}, {c: 0.0 for c in classes}, calibrated=True)
    save_calibration({f"{fixed.name}/cpu/fp32": quick, f"{other}/cpu/fp32": slow,
                      f"{fixed.name}/cpu/bf16": slow, f"{other}/cpu/bf16": quick}, devices.this_cpu().to_dict())
    for prec, want in (("fp32", fixed.name), ("bf16", other)):
        monkeypatch.setenv("SDRT_PRECISION", prec)
        be, _ = _auto(reg, None)
        assert be.name == want, prec


DEMO_UNET = Path(__file__).resolve().parents[2] / "core" / "src" / "sdrt" / "data" / "demo-sd" / "unet" / "model.onnx"


@pytest.mark.parametrize(("argv", "match"), [
    (["--width", "63"], "--width 63 is not a multiple of 8 of at least 8. Where: --width. What to do: use 56 or 64."),
    (["--width", "1"], "--width 1 is not a multiple of 8 of at least 8"),
    # the graph's latents are fixed at 8x8: 512x512 was planned without a word
    (["--width", "512"], "model.onnx is fixed at 64x64 pixels"),
    (["--precision", ""], "--precision '' names an empty precision"),  # was ignored, exit 0
    (["--precision", "fp32,"], "names an empty precision"),
])
def test_a_single_onnx_gets_the_folder_forms_size_checks(capsys, argv, match):
    assert main(["plan", str(DEMO_UNET), *argv]) == 1
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and err.count("\n") == 1


def test_a_single_onnx_of_fixed_size_is_planned_at_that_size(capsys):
    d = _run_json(capsys, str(DEMO_UNET))
    assert (d["width"], d["height"]) == (64, 64)
    d = _run_json(capsys, str(DEMO_UNET), "--width", "64", "--height", "64")
    assert (d["width"], d["height"]) == (64, 64)


def test_without_a_size_the_plan_takes_the_models_own():
    """The API as the command line: a graph fixed at 64x64 (the demo UNet) and the demo folder plan 64x64 (the
    API's 512 default refused the graph: 'fixed at 64x64 ... leave out width and height', which it could not)."""
    from sdrt.pipelines import DEMO_MODEL as DEMO_SD

    cpu = devices.find("cpu")
    for model in (DEMO_SD / "unet" / "model.onnx", DEMO_SD):
        plan = make_plan(model, cpu, steps=2, backends=["openvino"])
        assert (plan.width, plan.height) == (64, 64) and plan.to_dict()["width"] == 64


@pytest.mark.parametrize(("name", "planned", "note"), [
    ("NVIDIA GeForce RTX 3060", "RTX 3060 12GB", "note: planning RTX 3060 12GB, the device sdrt would run on here"),
    ("Voodoo 5 6000", "this CPU", "which the device library does not hold: planning this CPU"),
])
def test_the_default_device_is_where_sdrt_would_run(capsys, monkeypatch, name, planned, note):
    """Without --device, `sdrt plan` plans the device backend="auto" picks here (a GPU the library holds), saying so
    on stderr; with none, or one the library lacks, this CPU. (``_auto_device`` stands for a machine with that GPU.)"""
    from sdrt.backend import Device
    from sdrt.cli import plan as plan_cli

    gpu = Device(backend="ggml", id="CUDA0", name=name, kind="gpu", memory_bytes=12 * 2**30)
    monkeypatch.setattr(plan_cli, "_auto_device", lambda: gpu)
    assert main(["plan", str(DATA / "tiny-sd15"), "--width", "64", "--steps", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("SD 1.x") and f" on {planned}" in out.splitlines()[0], out
    assert note in err


def test_the_default_device_on_a_machine_without_a_gpu_is_this_cpu(capsys):
    assert main(["plan", str(DATA / "tiny-sd15"), "--width", "64", "--steps", "2"]) == 0
    out, err = capsys.readouterr()
    assert " on this CPU" in out.splitlines()[0] and "note:" not in err


@pytest.mark.parametrize("name, calls", [
    ("tiny-sd15-inpaint", {"text_encoder": 2, "unet": 4, "vae_encoder": 1, "vae_decoder": 1}),
    ("tiny-sd2-inpaint", {"text_encoder": 2, "unet": 4, "vae_encoder": 1, "vae_decoder": 1}),
    ("tiny-sdxl-refiner", {"unet": 1, "vae_encoder": 1, "vae_decoder": 1}),
])
def test_models_that_need_an_image_are_planned_with_one(capsys, name, calls):
    """An inpainting UNet needs an init image and a mask, the SDXL refiner an init image: the plan takes the run
    they make (the refiner at its usual low strength), where it refused them with the pipeline's API words
    ("Where: mask. What to do: pass init_image= and mask=") with no flag to pass them."""
    d = _run_json(capsys, str(DATA / name), "--steps", "4", "--device", "cpu")
    got = {p["name"]: p["calls"] for p in d["parts"]}
    assert {k: v for k, v in got.items() if k in calls} == calls
    assert d["predicted_ms_per_image"] > 0
