"""The cost model on a device with memory of its own (a GPU): its library spec from what a backend lists, its
calibration stored beside the CPU's, and the measuring child's device-memory figures. The GPU runs themselves need
a GPU (docs/plan.md records the lent H200's); these hold everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sdrt.backend import Device
from sdrt.cost import devices
from sdrt.cost.model import DEFAULTS, Factors, factors_for, is_calibrated, load_calibration, save_calibration
from sdrt.errors import SdrtError

ROOT = Path(__file__).resolve().parents[2]


def gpu(name: str, gib: float, kind: str = "gpu") -> Device:
    return Device(backend="ggml", id="CUDA0", name=name, kind=kind, memory_bytes=int(gib * 2**30))


@pytest.mark.parametrize(("name", "gib", "want"), [
    ("NVIDIA H200", 140.4, "H200 SXM 141GB"),
    ("NVIDIA H100 80GB HBM3", 79.6, "H100 SXM 80GB"),
    ("NVIDIA H100 PCIe", 79.6, "H100 PCIe 80GB"),
    ("NVIDIA GeForce RTX 3060", 12, "RTX 3060 12GB"),
    ("NVIDIA GeForce RTX 3060 Ti", 8, "RTX 3060 Ti 8GB"),
    ("NVIDIA GeForce RTX 4070 Ti SUPER", 16, "RTX 4070 Ti SUPER 16GB"),
    ("AMD Radeon RX 7900 XTX", 24, "RX 7900 XTX 24GB"),
    ("Intel(R) Arc(TM) A770 Graphics", 16, "Arc A770 16GB"),
    ("NVIDIA GeForce RTX 3060 Ti", 0, "RTX 3060 Ti 8GB"),  # no memory reported: the variant word decides
    ("AMD Radeon RX 9070 XT", 16, "RX 9070 XT 16GB"),
    ("AMD Radeon RX 9070", 16, "RX 9070 16GB"),
])
def test_a_listed_gpu_is_its_library_entry(name, gib, want):
    assert devices.for_runtime(gpu(name, gib)).name == want


def test_a_cpu_is_this_cpu_and_an_unknown_gpu_is_refused():
    assert devices.for_runtime(Device(backend="ggml", id="CPU", kind="cpu")) is devices.this_cpu()
    with pytest.raises(SdrtError, match=r"no entry for CUDA0 \(Voodoo 5 6000\).*share `sdrt selftest --report"):
        devices.for_runtime(gpu("Voodoo 5 6000", 0.1))
    # another product of a model number the library holds is not that entry
    for name, gib in [("NVIDIA GeForce RTX 4070 Ti", 12), ("NVIDIA GeForce RTX 4070 SUPER", 12),
                      ("NVIDIA GeForce RTX 3080 Ti", 12),
                      ("NVIDIA GeForce RTX 4060 Laptop GPU", 8)]:
        with pytest.raises(SdrtError, match="holds no entry"):
            devices.for_runtime(gpu(name, gib))


def test_the_h200_entry_holds_the_datasheet_rates():
    h200 = devices.find("H200")
    assert h200.kind == "gpu" and h200.bandwidth_bytes_per_s == 4.8e12
    assert h200.peak("fp32") == pytest.approx(66.9e12) and h200.peak("bf16") == pytest.approx(989.4e12)
    assert "datasheet" in h200.source


def test_a_gpu_calibration_is_used_for_that_gpu_only(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    h200, h100 = devices.find("H200"), devices.find("H100 SXM")
    cpu = devices.this_cpu()
    f_cpu = Factors({"matmul": 0.3}, {"matmul": 1e-5}, 1.0, 1.0, 1e8, True)
    f_gpu = Factors({"matmul": 0.7}, {"matmul": 4e-6}, 1.0, 1.0, 5e8, True)
    save_calibration({"ggml/cpu/fp32": f_cpu}, cpu.to_dict())
    save_calibration({"ggml/gpu/fp32": f_gpu}, h200.to_dict())
    stored = load_calibration()
    assert stored["device"]["name"] == cpu.name and stored["devices"]["gpu"]["name"] == h200.name
    assert factors_for("ggml", h200, "fp32").efficiency == {"matmul": 0.7}
    assert factors_for("ggml", h200, "fp16").efficiency == {"matmul": 0.7}  # any precision of the backend
    assert factors_for("ggml", cpu, "fp32").efficiency == {"matmul": 0.3}  # the CPU's own, kept
    assert factors_for("ggml", h100, "fp32") is DEFAULTS["gpu"]  # another GPU: the kind's defaults
    assert is_calibrated("ggml", "gpu") and is_calibrated("ggml", "cpu")
    # calibrating another GPU drops the first one's entries, not the CPU's
    save_calibration({"openvino/gpu/fp32": f_gpu}, h100.to_dict())
    stored = load_calibration()
    assert "ggml/gpu/fp32" not in stored["entries"] and "ggml/cpu/fp32" in stored["entries"]
    assert factors_for("ggml", h200, "fp32") is DEFAULTS["gpu"]
    assert factors_for("openvino", h100, "fp32").calibrated


def test_selftest_calibrates_a_gpu_at_fp32_and_its_default_precision():
    from sdrt.cli import selftest

    class Backend:
        precisions = {"fp32": {}, "fp16": {}}

        def __init__(self, default):
            self.default = default

        def precision_for(self, device):
            return self.default

    dev = gpu("NVIDIA H200", 140.4)
    assert selftest._precisions(Backend("fp32"), dev) == [("fp32", 2)]
    assert selftest._precisions(Backend("fp16"), dev) == [("fp32", 2), ("fp16", selftest.BF16_PASSES)]


def test_the_child_reads_the_device_memory_between_the_runs(capsys):
    """``_device_child``: the figures are the device's memory in use (read after compiling and after every run),
    on a real session (ggml's CPU device) with a counter standing for the device's memory."""
    pytest.importorskip("sdrt_ggml", reason="the sdrt-ggml plugin is not installed")
    from onnx import TensorProto, helper

    from sdrt.cost.calibrate import _device_child
    from sdrt.graph import Graph
    from sdrt_ggml import GgmlBackend

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    readings = iter([300, 450, 420, 400, 410, 405, 400, 400])  # after compiling, then after each run
    be = GgmlBackend()
    sess = be.compile(Graph(model), None, next(d for d in be.devices() if d.kind == "cpu"))
    spec = {"warmup": 2, "repeats": 3, "budget_s": None}
    _device_child(spec, sess, {"x": np.ones((4, 8), np.float32)}, 100, lambda: next(readings))
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["memory"] == "device" and len(out["times_ms"]) == 3
    assert out["rss_before"] == 100 and out["compiled_rss"] == out["compile_peak_rss"] == 300
    assert out["run_peak_rss"] == out["peak_rss"] == 450 and out["peak_bytes"] == 350
    assert out["host_peak_rss"] > 0


def test_weightless_pack_and_fill_keep_the_graph_and_the_small_weights(tmp_path):
    """scripts/weightless.py: the big float weights leave the graph and come back as seeded random values of their
    shapes; the small ones and the integer ones stay as they were; onnxruntime runs the filled graph."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install onnxruntime)")
    rng = np.random.default_rng(0)
    big = numpy_helper.from_array(rng.standard_normal((64, 512)).astype(np.float32), "w")  # 128 KiB
    bias = numpy_helper.from_array(np.arange(64, dtype=np.float32), "b")
    shape = numpy_helper.from_array(np.array([2, 64], np.int64), "shape")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
             helper.make_node("Reshape", ["h", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [big, bias, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = tmp_path / "src"
    (src / "part").mkdir(parents=True)
    onnx.save(model, str(src / "part" / "model.onnx"))
    (src / "model_index.json").write_text("{}")
    dst = tmp_path / "dst"
    script = ROOT / "scripts" / "weightless.py"
    subprocess.run([sys.executable, str(script), "pack", str(src), str(dst)], check=True, capture_output=True)
    packed = dst / "part" / "model.onnx"
    assert (dst / "model_index.json").is_file() and not (dst / "part" / "model.onnx_data").exists()
    assert packed.stat().st_size < 4096  # the 128 KiB weight left the graph
    subprocess.run([sys.executable, str(script), "fill", str(dst), "--seed", "3"], check=True, capture_output=True)
    filled = onnx.load(str(packed))
    w = {t.name: numpy_helper.to_array(t) for t in filled.graph.initializer}
    assert np.array_equal(w["b"], np.arange(64, dtype=np.float32))  # small: as it was
    assert w["shape"].tolist() == [2, 64]  # integer: as it was
    assert w["w"].shape == (64, 512) and not np.array_equal(w["w"], numpy_helper.to_array(big))
    assert abs(float(w["w"].std()) - 1 / np.sqrt(512)) < 0.005  # 1/sqrt(fan-in)
    out = ort.InferenceSession(str(packed)).run(None, {"x": np.ones((2, 512), np.float32)})[0]
    assert out.shape == (2, 64) and np.isfinite(out).all()


def test_a_gpu_part_pays_its_host_transfers_at_fp32():
    """On a device with memory of its own the inputs and outputs are copied every call: ``io_ms`` at fp32 too."""
    from sdrt.cost.calibrate import features
    from sdrt.cost.model import predict
    from sdrt.cost.nodes import GraphCost, NodeCost

    cost = GraphCost("g", "fp32", [NodeCost("n", "elementwise", "elementwise", 1e6, 8e6, 0.0, 0.0)], 0.0, 8e6, 4e6)
    cost.io_bytes = 8e6
    assert features(cost, 1e12, 1e12)["io_ms"] == 0.0  # a CPU at fp32: nothing crosses
    assert features(cost, 1e12, 1e12, transfers=True)["io_ms"] == pytest.approx(8e-3)
    on_gpu = Factors({"elementwise": 1.0}, {"elementwise": 0.0}, 1.0, 1.0, 0.0, True, 1e12,
                     io_bandwidth_efficiency=0.01, host_transfers=True)
    off = Factors({"elementwise": 1.0}, {"elementwise": 0.0}, 1.0, 1.0, 0.0, True, 1e12, io_bandwidth_efficiency=0.01)
    h200 = devices.find("H200")
    assert predict(cost, h200, "ggml", "fp32", on_gpu).by_class_ms["io"] == pytest.approx(0.8)  # 8 MB at 10 GB/s
    assert "io" not in predict(cost, h200, "ggml", "fp32", off).by_class_ms


def test_the_h200_report_refits_into_a_gpu_calibration(tmp_path, monkeypatch):
    """scripts/refit_calibration.py on the report the lent H200 wrote (`selftest --calibrate --device CUDA0 --report`,
    docs/plan-gpu): its `ggml/gpu` measurements fit `ggml/gpu/fp32`, stored for that GPU, with the host transfers."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    report = ROOT / "docs" / "plan-gpu" / "h200-calibration-report.json"
    script = ROOT / "scripts" / "refit_calibration.py"
    bad = subprocess.run([sys.executable, str(script), str(report)], capture_output=True, text=True)
    assert bad.returncode != 0 and "name it with --device" in bad.stderr
    subprocess.run([sys.executable, str(script), str(report), "--device", "H200 SXM 141GB"], check=True,
                   capture_output=True, env={**__import__("os").environ, "SDRT_CACHE_DIR": str(tmp_path)})
    stored = load_calibration()
    assert stored["devices"]["gpu"]["name"] == "H200 SXM 141GB" and "ggml/gpu/fp32" in stored["entries"]
    f = factors_for("ggml", devices.find("H200"), "fp32")
    assert f.calibrated and f.host_transfers and 0 < f.io_bandwidth_efficiency < 0.05  # PCIe, not HBM


def test_plans_for_a_data_centre_gpu_and_a_calibrated_one(tmp_path, monkeypatch):
    """TensorRT-RTX builds for RTX GPUs only: an H100/H200 is planned on ggml; a GPU calibrated here is planned at
    the precisions it was measured at (fp32's factors would price fp16 at the tensor cores' peak)."""
    from sdrt.cost.planner import backends_for, precisions_for

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    h200 = devices.find("H200")
    assert backends_for(h200) == ["ggml"] and backends_for(devices.find("H100 PCIe")) == ["ggml"]
    assert backends_for(devices.find("RTX 4090")) == ["trt", "ggml"]
    assert "fp16" in precisions_for("ggml", h200)  # uncalibrated: the backend's vocabulary
    save_calibration({"ggml/gpu/fp32": Factors({"matmul": 0.5}, {"matmul": 1e-5}, 1.0, 1.0, 1e8, True)}, h200.to_dict())
    assert precisions_for("ggml", h200) == ["fp32"]
    assert "fp16" in precisions_for("ggml", devices.find("H100 SXM"))  # another GPU: not this calibration's


def test_a_dense_convs_im2col_buffer_is_costed():
    """ggml's GPU convs run through im2col: a 3x3 conv's unfolded input (N x Ho x Wo x Cin x 9) is traffic and, for the
    largest, memory on a GPU calibrated for it; a 1x1 and a depthwise conv have none."""
    from onnx import TensorProto, helper, numpy_helper

    from sdrt.cost.model import memory_phases
    from sdrt.cost.nodes import graph_costs
    from sdrt.graph import Graph

    w3 = numpy_helper.from_array(np.zeros((16, 8, 3, 3), np.float32), "w3")
    w1 = numpy_helper.from_array(np.zeros((16, 16, 1, 1), np.float32), "w1")
    wd = numpy_helper.from_array(np.zeros((16, 1, 3, 3), np.float32), "wd")
    nodes = [helper.make_node("Conv", ["x", "w3"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"]),
             helper.make_node("Conv", ["b", "wd"], ["y"], pads=[1, 1, 1, 1], group=16)]
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 32, 32])], [w3, w1, wd])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cost = graph_costs(Graph(model), {"x": (2, 8, 32, 32)})
    want = 2 * 32 * 32 * 8 * 9 * 4.0  # N x Ho x Wo x Cin x kh x kw float32
    assert [n.im2col_bytes for n in cost.nodes] == [want, 0.0, 0.0]
    assert cost.im2col_bytes == cost.largest_im2col_bytes == want
    plain = Factors({}, {}, 1.0, 1.0, 0.0, True, compile_weight_factor=1.0)
    gpu = Factors({}, {}, 1.0, 1.0, 0.0, True, compile_weight_factor=1.0, im2col_memory_factor=1.0)
    assert memory_phases(cost, gpu)[1] - memory_phases(cost, plain)[1] == pytest.approx(want)
