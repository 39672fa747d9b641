"""The backend: devices, fail-early errors, options, ahead-of-time builds, bench models, sessions on macOS."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np
import pytest
from coreml_helpers import graph_of, make_model, mil_eval, ort_intermediates, run_ort
from onnx import TensorProto as TP
from onnx import helper

import sdrt
from sdrt import Device
from sdrt.errors import ModelError, NoDeviceError, SdrtError, UnsupportedGraph
from sdrt_coreml import package
from sdrt_coreml.backend import unavailable_reason
from sdrt_coreml.options import parse_options

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.models import build as bench_model  # noqa: E402

ON_MAC = platform.system() == "Darwin"
F = TP.FLOAT


def _relu_model(shape=(2, 3)):
    return make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (shape, F)}, {"y": (None, F)})


# -- devices ----------------------------------------------------------------
@pytest.mark.skipif(ON_MAC, reason="on macOS the backend lists its compute units")
def test_no_device_off_macos_and_the_reason(backend, caplog):
    caplog.set_level("INFO", logger="sdrt.coreml")
    assert backend.devices() == []
    assert "Core ML runs only on macOS" in unavailable_reason()
    assert "only on macOS" in caplog.text
    with pytest.raises(NoDeviceError, match="offers no device"):
        sdrt.load(_relu_model(), backend="coreml")


@pytest.mark.skipif(ON_MAC, reason="on macOS compile runs")
def test_compile_off_macos_says_to_build_instead(backend):
    with pytest.raises(NoDeviceError, match="only on macOS.*sdrt compile"):
        backend.compile(graph_of(_relu_model()), None, Device("coreml", "ALL", kind="auto"))


def test_compile_refuses_a_foreign_device(backend):
    with pytest.raises(NoDeviceError, match="belongs to backend 'openvino'"):
        backend.compile(graph_of(_relu_model()), None, Device("openvino", "CPU"))
    with pytest.raises(NoDeviceError, match="not a Core ML compute unit"):
        backend.compile(graph_of(_relu_model()), None, Device("coreml", "TPU"))


@pytest.mark.skipif(not ON_MAC, reason="Core ML runs models only on macOS; this machine is "
                    f"{platform.system()} (packages are checked here by MIL value inference instead)")
@pytest.mark.parametrize("unit", ["CPU", "GPU", "ANE", "ALL"])
def test_session_runs_on_every_compute_unit(backend, unit):
    model, feeds = bench_model("text_encoder", "tiny")
    want = run_ort(model, feeds)["last_hidden_state"]
    with sdrt.load(model.SerializeToString(), backend="coreml", device=unit) as s:
        got = s.run(feeds)["last_hidden_state"]
    np.testing.assert_allclose(got, want, atol=3e-2, rtol=3e-2)


# -- fail early -------------------------------------------------------------
def test_unsupported_graph_lists_every_op_before_any_work(backend, tmp_path, monkeypatch):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("NonMaxSuppression", ["a", "a"], ["b"], name="nms"),
             helper.make_node("Pad", ["x", "p"], ["c"], mode="wrap", name="pad_wrap"),
             helper.make_node("Custom", ["x"], ["d"], domain="com.vendor", name="custom"),
             helper.make_node("Gelu", ["x"], ["e"], approximate="cubic", name="gelu3"),
             helper.make_node("Resize", ["x", "", "s"], ["f"], mode="cubic", name="cubic")]
    model = make_model(nodes, {"x": ((1, 1, 2, 2), F)}, {"f": (None, F)},
                       {"p": np.zeros(8, np.int64), "s": np.ones(4, np.float32)}, opset=20)
    model.opset_import.append(helper.make_opsetid("com.vendor", 1))
    from sdrt.graph import Graph

    for step in ("with_shapes", "fold_constants"):  # pinning shapes and folding are the first long work
        monkeypatch.setattr(Graph, step, lambda *a, **k: pytest.fail("work started before the check"))
    with pytest.raises(UnsupportedGraph) as err:
        backend.build(graph_of(model), None, None, tmp_path / "m.mlpackage")
    found = err.value.unsupported
    assert set(found) == {"NonMaxSuppression", "Pad (mode=wrap)", "com.vendor.Custom", "Gelu (approximate='cubic')",
                          "Resize (mode=cubic)"}
    assert found["NonMaxSuppression"] == ["nms"]
    assert "\n" not in str(err.value) and "What to do" in str(err.value)


def test_value_dependent_limits_fail_while_lowering_naming_the_node(backend, tmp_path):
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest", name="up_channels",
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    model = make_model([node], {"x": ((1, 1, 4, 4), F)}, {"y": (None, F)}, {"s": np.array([1, 2, 1, 1], np.float32)})
    with pytest.raises(UnsupportedGraph, match=r"up_channels.*resizing the batch or channel axis"):
        backend.build(graph_of(model), None, None, tmp_path / "m.mlpackage")
    assert not (tmp_path / "m.mlpackage").exists()


def test_runtime_shape_input_is_unsupported(backend, tmp_path):
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="dyn_reshape")
    model = make_model([node], {"x": ((2, 3), F), "shape": ((2,), TP.INT64)}, {"y": (None, F)})
    with pytest.raises(UnsupportedGraph, match="dyn_reshape.*must be a constant"):
        backend.build(graph_of(model), None, None, tmp_path / "m.mlpackage")


def test_input_of_a_type_core_ml_cannot_take(backend, tmp_path):
    node = helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT)
    model = make_model([node], {"x": ((2, 3), TP.BOOL)}, {"y": (None, F)})
    with pytest.raises(UnsupportedGraph, match="input 'x' has type bool"):
        backend.build(graph_of(model), None, None, tmp_path / "m.mlpackage")


def test_dynamic_input_needs_shapes_then_builds(backend, tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (("batch", 3), F)}, {"y": (None, F)})
    with pytest.raises(ModelError, match="dynamic dimensions.*shapes="):
        backend.build(graph_of(model), None, None, tmp_path / "a.mlpackage")
    out = backend.build(graph_of(model), None, None, tmp_path / "b.mlpackage", shapes={"batch": 2})
    assert package.load(out).io["inputs"][0][3] == [2, 3]


# -- options ----------------------------------------------------------------
@pytest.mark.parametrize(("options", "match"), [
    ({"threads": 2}, "unknown options.*threads"),
    ({"precision": "int8"}, "precision 'int8' is not one this backend accepts.*fp16 \\(f16, float16, half\\)"),
    ({"target": "macOS12"}, "target 'macOS12'.*macOS13, macOS14, macOS15"),
    ({"shapes": [1, 2]}, "shapes must map"),
])
def test_bad_options(options, match):
    with pytest.raises(SdrtError, match=match):
        parse_options(options)


def test_the_cache_options_are_the_cores(backend):
    with pytest.raises(SdrtError, match="cache must be True or False"):
        backend.compile(graph_of(_relu_model()), None, Device("coreml", "ALL", kind="auto"), cache="yes")


def test_options_defaults_and_aliases():
    o = parse_options({})
    assert o.precision == "fp16"
    assert (o.target == "macOS14") if not ON_MAC else o.target in ("macOS13", "macOS14", "macOS15")
    o = parse_options({"precision": "float32", "target": "ios18"})
    assert (o.precision, o.target, o.opset, o.sdpa) == ("fp32", "iOS18", 18, True)


# -- ahead of time ----------------------------------------------------------
def test_build_refuses_a_bad_output(backend, tmp_path):
    with pytest.raises(SdrtError, match="does not end in .mlpackage"):
        backend.build(graph_of(_relu_model()), None, None, tmp_path / "m.onnx")
    (tmp_path / "there.mlpackage").mkdir()
    with pytest.raises(SdrtError, match="already exists"):
        backend.build(graph_of(_relu_model()), None, None, tmp_path / "there.mlpackage")


def test_targets_and_build_for_each(backend, tmp_path):
    assert backend.targets() == ["macOS13", "macOS14", "macOS15", "iOS16", "iOS17", "iOS18"]
    for target in ("macOS13", "iOS18"):
        out = backend.build(graph_of(_relu_model()), None, target, tmp_path / f"{target}.mlpackage")
        assert package.load(out).io["outputs"][0][0] == "y"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iOS18.mlpackage", "macOS13.mlpackage"]


def test_a_bench_model_builds(backend, tmp_path):
    """Every bench model builds (docs/coreml.md has the figures); the suite builds the quickest one."""
    name = "text_encoder"
    model, _ = bench_model(name, "tiny")
    out = backend.build(graph_of(model), None, None, tmp_path / f"{name}.mlpackage")
    built = package.load(out)
    assert built.n_ops > 50 and (out / package.WEIGHT_FILE).stat().st_size > 100_000


@pytest.mark.parametrize(("name", "target"), [("vae_decoder", "macOS14"), ("unet", "macOS15"),
                                              ("text_encoder", "macOS15"), ("mobilenet_v3", "macOS14"),
                                              ("mobilenet_v2", "macOS14")])
def test_bench_models_lower_like_onnxruntime(name, target):
    """The whole lowering of every bench model, by MIL value inference (conv and upsample fed by onnxruntime)."""
    model, feeds = bench_model(name, "tiny")
    want = run_ort(model, feeds)
    ref = ort_intermediates(model, feeds) if name != "text_encoder" else None
    ev = mil_eval(model, feeds, target=target, reference=ref)
    assert set(ev.stand_ins) <= {"conv", "upsample_nearest_neighbor"}
    if target == "macOS15" and name != "mobilenet_v2":
        assert ev.fused_attention > 0
    for k, w in want.items():
        np.testing.assert_allclose(ev.outputs[k], w, rtol=1e-4, atol=2e-5, err_msg=k)
