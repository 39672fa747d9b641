"""The device library, the roofline model, the calibration fit and its storage."""

from __future__ import annotations

import json

import pytest

from sdrt.cost import devices
from sdrt.cost.calibrate import fit, robust_ms
from sdrt.cost.model import DEFAULTS, Factors, factors_for, load_calibration, node_time_s, predict, save_calibration
from sdrt.cost.nodes import GraphCost, NodeCost
from sdrt.errors import SdrtError

FAMILIES = ["RTX 20", "RTX 30", "RTX 40", "RTX 50", "RX 6", "RX 7", "RX 9", "Radeon 8", "XDNA", "Arc A", "Arc B",
            "Core Ultra", "NPU", "Apple M1", "Apple M2", "Apple M3", "Apple M4"]


def test_library_covers_the_families_and_names_sources():
    lib = devices.library()
    names = [d.name for d in lib]
    for fam in FAMILIES:
        stem = fam.replace("RTX 20", "RTX 2").replace("RTX 30", "RTX 3").replace("RTX 40", "RTX 4").replace("RTX 50", "RTX 5")
        assert any(stem in n for n in names), fam
    for d in lib:
        assert d.source and d.derived, d.name
        assert d.memory_bytes > 2**30 and d.bandwidth_bytes_per_s > 50e9
        assert d.peak_flops and all(v > (1e11 if d.kind == "cpu" else 1e12) for v in d.peak_flops.values()), d.name
        if d.kind == "cpu":
            assert d.cores and d.isa


def test_find_by_loose_name_and_errors():
    assert devices.find("rtx 3060 12gb").name == "RTX 3060 12GB"
    assert devices.find("RTX4090").memory_bytes == 24 * 2**30
    with pytest.raises(SdrtError, match="no single library device"):
        devices.find("RTX")  # many match
    with pytest.raises(SdrtError, match="no single library device"):
        devices.find("Voodoo 2")


def test_this_cpu_from_detection():
    cpu = devices.find("cpu")
    assert cpu.kind == "cpu" and cpu.cores >= 1 and cpu.peak("fp32") > 1e9
    assert "detect" in cpu.source and "FLOPs/cycle" in cpu.derived


def test_roofline_compute_and_memory_bound():
    gpu = devices.find("RTX 3060 12GB")
    f = Factors({"matmul": 0.5, "elementwise": 0.5}, {"matmul": 0.0, "elementwise": 1e-5})
    # compute bound: 1 TFLOP at 0.5 x fp16 peak
    t = node_time_s("matmul", 1e12, 1e6, gpu, "fp16", f)
    assert t == pytest.approx(1e12 / (0.5 * gpu.peak("fp16")))
    # memory bound, plus its fixed cost
    t = node_time_s("elementwise", 1e6, 1e9, gpu, "fp16", f)
    assert t == pytest.approx(1e-5 + 1e9 / (0.5 * gpu.bandwidth_bytes_per_s))
    assert node_time_s("view", 1e9, 1e9, gpu, "fp16", f) == 0
    # q4_0 computes at the fp16 rate
    assert gpu.peak("q4_0") == gpu.peak("fp16") > gpu.peak("fp32")


def test_predict_memory_uses_the_factors():
    cost = GraphCost("g", "fp32", [NodeCost("a", "MatMul", "matmul", 1e9, 1e6, 1e6, 1e6)], 1e8, 1e7, 0.0)
    f = Factors({"matmul": 1.0}, {"matmul": 0.0}, weight_factor=2.0, activation_factor=0.5, base_bytes=1e6)
    p = predict(cost, devices.find("cpu"), "openvino", "fp32", f)
    assert p.peak_bytes == pytest.approx(2e8 + 5e6 + 1e6)
    assert p.ms > 0 and p.by_class_ms.keys() == {"matmul"}


def test_fit_recovers_known_factors():
    """Synthetic measurements made with efficiency 0.4 (0.2 for attention) and 50 us per node are fitted back."""
    rows = []
    i = 0
    for cls in ("matmul", "conv", "attention", "norm", "elementwise", "data"):
        for size, roof in ((0, 1.0), (1, 10.0)):
            nodes = 8
            i += 1
            w, a = 1e6 * i, 2e6 * ((7 * i) % 5 + 1)
            moved = 0.3 * roof * (1 + (i % 3))  # ms at the measured bandwidth, fitted at efficiency 0.5
            rows.append({"class": cls, "size": size, "all_nodes": nodes, "roofline_ms": roof,
                         "flops_ms_by_class": {cls: roof}, "bytes_ms": moved,
                         "robust_ms": nodes * 0.05 + roof / (0.2 if cls == "attention" else 0.4) + moved / 0.5, "weight_bytes": w,
                         "activation_bytes": a, "peak_bytes": 3 * w + 0.5 * a + 4e8})
    f = fit(rows, 20e9, "test")
    assert f.efficiency["conv"] == pytest.approx(0.4, rel=0.05)
    assert f.efficiency["attention"] == pytest.approx(0.2, rel=0.05)
    assert f.overhead_s["conv"] == pytest.approx(50e-6, rel=0.05)
    assert f.bandwidth_efficiency == pytest.approx(0.5, rel=0.05) and f.additive
    assert (f.weight_factor, f.activation_factor) == (pytest.approx(3.0), pytest.approx(0.5))
    assert f.base_bytes == pytest.approx(4e8)


def test_robust_time_sheds_scheduling_noise():
    assert robust_ms([10, 50, 11, 12, 90, 10.5, 10.2, 13, 40]) == pytest.approx(10.2)


def test_calibration_storage_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    assert load_calibration() == {"entries": {}}
    cpu = devices.find("cpu")
    f = Factors({"matmul": 0.3}, {"matmul": 1e-4}, 2.0, 1.0, 5e7, True, 3e10, "test")
    path = save_calibration({"openvino/cpu/fp32": f}, cpu.to_dict())
    assert path.parent.parent == tmp_path and json.loads(path.read_text())["entries"]
    got = factors_for("openvino", cpu, "fp32")
    assert got.calibrated and got.efficiency == {"matmul": 0.3}
    # calibration describes this machine only: a library GPU keeps its kind's defaults
    assert factors_for("openvino", devices.find("Arc A770"), "fp16") is DEFAULTS["gpu"]
    path.write_text("{not json")
    assert load_calibration() == {"entries": {}}
