"""The device library, the roofline model, the calibration fit and its storage."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
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


def test_a_chip_name_is_not_its_variants():
    """`sdrt plan --help` names "Apple M2" as a device: it matched the M2 and the M2 Ultra and was refused."""
    assert devices.find("Apple M2").name.startswith("Apple M2 (")
    assert devices.find("M2 Ultra").name.startswith("Apple M2 Ultra")
    assert devices.find("RTX 4070").name == "RTX 4070 12GB"  # not the 4070 Ti or SUPER
    with pytest.raises(SdrtError, match="no single library device matches 'H100'"):
        devices.find("H100")  # SXM and PCIe: boards of one chip, told apart by the user


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


def test_flops_a_cycle_by_isa_and_family():
    """AVX-512 on AMD's family 25 (Zen 4) runs on 256-bit units: AVX2's rate, not Zen 5's or an Intel core's; AVX2 on
    Zen 1 runs on 128-bit units: half of Zen 2's."""
    avx512 = {"avx2", "fma", "avx512f"}
    assert devices.fp32_flops_per_cycle(avx512, "amd", 25) == 32
    assert devices.fp32_flops_per_cycle(avx512, "amd", 26) == 64
    assert devices.fp32_flops_per_cycle(avx512, "intel", 6) == 64
    assert devices.fp32_flops_per_cycle({"avx2", "fma"}, "amd", 23, 0x31) == 32   # Zen 2
    assert devices.fp32_flops_per_cycle({"avx2", "fma"}, "amd", 23, 0x01) == 16   # Zen 1: 128-bit FMA pipes
    assert devices.fp32_flops_per_cycle({"avx2", "fma"}, "amd", 23, 0x08) == 16   # Zen+
    assert devices.fp32_flops_per_cycle({"avx2", "fma"}, "amd", 25, 0x01) == 32   # Zen 3
    assert devices.fp32_flops_per_cycle({"avx2", "fma"}, "amd", 23, None) == 32   # model unknown: the common rate
    assert devices.fp32_flops_per_cycle({"sse4_2"}, "intel", None) == 16
    assert devices._x86_family("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n") == (25, 17)
    assert devices._x86_family("", "AMD64 Family 26 Model 68 Stepping 0, AuthenticAMD") == (26, 68)
    assert devices._x86_family("", "") is None


def test_a_calibration_keeps_its_predictions_when_the_peak_rule_changes():
    """Calibrated efficiencies are fractions of the peak the calibration assumed (stored with it); against another
    peak for the same CPU (a corrected FLOPs-a-cycle rule, another clock reading) they scale, so a prediction holds."""
    import dataclasses

    cpu = devices.find("cpu")
    cost = GraphCost("g", "fp32", [NodeCost("a", "MatMul", "matmul", 1e10, 1e6, 1e6, 1e6)], 1e6, 1e6, 0.0)
    f = Factors({"matmul": 0.4, "conv": 100.0}, {"matmul": 0.0}, calibrated=True, fused_flops_efficiency=0.2)
    cal = {"entries": {"ggml/cpu/fp32": f.to_dict()}, "device": cpu.to_dict()}
    before = predict(cost, cpu, "ggml", "fp32", factors_for("ggml", cpu, "fp32", cal)).ms
    half = dataclasses.replace(cpu, peak_flops={k: v / 2 for k, v in cpu.peak_flops.items()})
    got = factors_for("ggml", half, "fp32", cal)
    assert got.efficiency == {"matmul": pytest.approx(0.8), "conv": 100.0}  # an absent class stays absent
    assert got.fused_flops_efficiency == pytest.approx(0.4)
    assert predict(cost, half, "ggml", "fp32", got).ms == pytest.approx(before)


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
    """Synthetic measurements made from known factors (each class's FLOPs efficiency, traffic efficiencies,
    40 us per node, 120 us per call; memory 1.5 x weights + 0.8 x activations + 60 MiB) are fitted back."""
    eff = {"matmul": 0.7, "conv": 0.5, "dwconv": 0.1, "attention": 0.3, "softmax": 0.05, "norm": 0.2, "groupnorm": 0.02,
           "elementwise": 0.25, "data": 1.0}
    traffic = {"act_ms": 0.6, "data_ms": 0.3, "weight_ms": 0.8, "fused_ms": 2.0, "stream_weight_ms": 1.7}
    rows = []
    rng = np.random.default_rng(3)
    for i in range(27):
        f = {f"flops_{c}": 0.0 for c in eff}
        f[f"flops_{list(eff)[i % 9]}"] = float(rng.uniform(1, 50))
        f.update({k: float(rng.uniform(0, 10)) for k in traffic}, nodes=float(rng.integers(1, 60)), call=1.0,
                 fixed_ms=0.01)
        f["flops_data"] = 0.0
        ms = (sum(v / eff[k[6:]] for k, v in f.items() if k.startswith("flops_"))
              + sum(f[k] / e for k, e in traffic.items()) + 0.04 * f["nodes"] + 0.12 + 0.01)
        small = i < 3
        w, a = (0.0, 0.0) if small else (float(rng.uniform(1e6, 1e9)), float(rng.uniform(1e6, 1e9)))
        rows.append({"case": f"c{i}", "features": f, "robust_ms": ms, "weight_bytes": w, "activation_bytes": a,
                     "peak_bytes": 1.5 * w + 0.8 * a + 60 * 2**20})
    got = fit(rows, 20e9, "test")
    for c, e in eff.items():
        if c != "data":
            assert got.efficiency[c] == pytest.approx(e, rel=1e-3), c
    assert got.overhead_s["conv"] == pytest.approx(40e-6, rel=1e-3) and got.call_s == pytest.approx(120e-6, rel=1e-3)
    assert (got.bandwidth_efficiency, got.data_bandwidth_efficiency, got.weight_bandwidth_efficiency,
            got.fused_bandwidth_efficiency, got.stream_weight_bandwidth_efficiency) == pytest.approx(
        (0.6, 0.3, 0.8, 2.0, 1.7), rel=1e-3)
    assert got.additive and got.calibrated
    assert got.base_bytes == pytest.approx(60 * 2**20)  # from the small cases alone
    assert (got.weight_factor, got.activation_factor) == (pytest.approx(1.5), pytest.approx(0.8))
    # what pinning first adds: the one-node case's peak pinned less unpinned, where the calibration measured it
    assert got.pin_bytes == 0.0
    rows[0] = {**rows[0], "case": "cal_call", "peak_rss": 100e6, "pinned_peak_rss": 108e6}
    assert fit(rows, 20e9, "test").pin_bytes == pytest.approx(8e6)


def test_calibrated_time_terms_add_up():
    """A calibrated node: overhead + FLOPs at its class's efficiency + activation and weight traffic at theirs;
    a grouped conv and a softmax take their own class's efficiency; a call adds its fixed cost once."""
    cpu = devices.find("cpu")
    f = Factors({"conv": 0.5, "dwconv": 0.1}, {"conv": 1e-5, "dwconv": 1e-5}, additive=True, bandwidth_bytes_per_s=1e10,
                bandwidth_efficiency=0.5, weight_bandwidth_efficiency=0.25, call_s=2e-4)
    t = node_time_s("conv", 1e9, 3e8, cpu, "fp32", f, weight_bytes=1e8, time_class="dwconv")
    assert t == pytest.approx(1e-5 + 1e9 / (0.1 * cpu.peak("fp32")) + 2e8 / 5e9 + 1e8 / 2.5e9)
    cost = GraphCost("g", "fp32", [NodeCost("a", "Conv", "conv", 1e9, 3e8, 0.0, 1e8, kind="dwconv")], 1e8, 1e7, 0.0)
    assert predict(cost, cpu, "openvino", "fp32", f).ms == pytest.approx(1000 * (t + 2e-4))


def test_an_efficiency_far_below_the_peak_is_taken_as_fitted():
    """A float32 elementwise kernel measured against a matrix unit's peak runs at a tiny fraction of it (ggml's at
    bf16: 4.2e-4 of the AMX peak): the node's time is its FLOPs at that fraction, as the fit that found it counts
    them, so at bf16 it takes what it takes at fp32 when the two fractions are in the peaks' ratio."""
    cpu = dataclasses.replace(devices.find("cpu"), peak_flops={"fp32": 3.3e11, "bf16": 5.3e12})  # AVX-512 and AMX
    ratio = cpu.peak("bf16") / cpu.peak("fp32")
    f32 = Factors({"elementwise": 6.7e-3}, {}, additive=True, bandwidth_bytes_per_s=1e10, bandwidth_efficiency=100.0)
    f16 = Factors({"elementwise": 6.7e-3 / ratio}, {}, additive=True, bandwidth_bytes_per_s=1e10,
                  bandwidth_efficiency=100.0)
    t32 = node_time_s("elementwise", 1e6, 8e6, cpu, "fp32", f32)
    t16 = node_time_s("elementwise", 1e6, 8e6, cpu, "bf16", f16)
    assert t32 == pytest.approx(1e6 / (6.7e-3 * cpu.peak("fp32")) + 8e6 / 1e12)
    assert t16 == pytest.approx(t32, rel=1e-3)


def test_calibration_cases_build_and_cover_the_classes():
    from sdrt.cost.calibrate import CASES, SIZED_CASES, build_case, features, stream_count
    from sdrt.cost.nodes import graph_costs
    from sdrt.graph import Graph

    seen: dict[str, float] = {}
    gpu: dict[str, float] = {}  # a device with memory of its own: per-class node counts and the host transfers
    convert = half = 0.0  # float32 activations into half matmuls and convs (a backend that keeps them float32 at bf16)
    cache = 16 * 2**20  # a last-level cache: the sized case's weights are twice it
    for case in CASES:
        model, feeds = build_case(case, stream_count(cache, "fp32") if case in SIZED_CASES else None)
        cost = graph_costs(Graph.load(model.SerializeToString()), {k: v.shape for k, v in feeds.items()})
        for k, v in features(cost, 1e11, 1e10, cache_bytes=cache).items():
            seen[k] = seen.get(k, 0.0) + v
        f32 = features(cost, 1e11, 1e10, act_scale=2.0)
        convert, half = convert + f32["matmul_convert_ms"], half + f32["half_convs"]
        for k, v in features(cost, 1e11, 1e10, transfers=True).items():
            gpu[k] = gpu.get(k, 0.0) + v
    per_class = [k for k in seen if k.startswith("nodes_")] + ["im2col_ms"]
    assert all(seen[k] == 0 < gpu[k] for k in per_class), gpu  # each class's nodes and im2col's traffic: on a GPU
    assert all(seen[k] > 0 for k in seen if k not in ("fixed_ms", "flops_data", "io_ms", "matmul_convert_ms",
                                                      "half_convs", *per_class)), seen  # data nodes: no FLOPs
    assert seen["matmul_convert_ms"] == 0 < convert and seen["half_convs"] == 0 < half
    assert seen["io_ms"] == 0 < gpu["io_ms"]  # fp32 converts nothing on a CPU; a GPU copies the inputs and outputs


def test_weights_past_the_last_level_cache_stream_every_call():
    """A part whose weights (lookup tables apart) do not fit in the CPU's last-level cache reads them all from memory
    each call, at the fitted stream efficiency, on top of their other terms; one that fits, a GPU, or factors without
    the term (an older calibration) pay nothing more. ``stream_count`` sizes the case that fits it past the cache."""
    from dataclasses import replace

    from sdrt.cost.calibrate import stream_count

    mib = 2**20
    cpu = replace(devices.find("cpu"), cache_bytes=32 * mib)
    f = Factors({"matmul": 0.5}, {"matmul": 0.0}, additive=True, bandwidth_bytes_per_s=1e10, bandwidth_efficiency=1.0,
                weight_bandwidth_efficiency=4.0, stream_weight_bandwidth_efficiency=0.5)

    def part(weights: float, table: float = 0.0) -> GraphCost:
        return GraphCost("g", "bf16", [NodeCost("m", "MatMul", "matmul", 1e6, weights + 1e3, 1e3, weights)],
                         weights + table, 1e3, 0.0, table_bytes=table)

    small, big = part(30 * mib), part(40 * mib)
    assert "stream" not in predict(small, cpu, "ggml", "bf16", f).by_class_ms
    extra = predict(big, cpu, "ggml", "bf16", f).ms - predict(big, cpu, "ggml", "bf16", replace(
        f, stream_weight_bandwidth_efficiency=None)).ms
    assert extra == pytest.approx(1000 * 40 * mib / (1e10 * 0.5))
    assert "stream" not in predict(part(30 * mib, table=20 * mib), cpu, "ggml", "bf16", f).by_class_ms  # rows looked up
    gpu = next(d for d in devices.library() if d.kind == "gpu")
    assert "stream" not in predict(big, gpu, "ggml", "bf16", f).by_class_ms
    assert "stream" not in predict(big, replace(cpu, cache_bytes=0), "ggml", "bf16", f).by_class_ms  # unknown
    # twice the cache at the precision's bytes: 480 MiB of L3 at bf16, 8 MiB a weight -> 120 (1.9 GiB as float32);
    # past protobuf's 2 GiB as float32: none
    assert stream_count(480 * mib, "bf16") == 120 and stream_count(480 * mib, "fp32") == 60
    assert stream_count(32 * mib, "bf16") == 8 and stream_count(0, "bf16") == 0 and stream_count(1024 * mib, "bf16") == 0
    # a calibration's own threshold (Factors.stream_cache_bytes, from its ladder) comes before the reported cache
    assert "stream" in predict(small, cpu, "ggml", "bf16", replace(f, stream_cache_bytes=16 * mib)).by_class_ms


def test_the_cache_that_holds_weights_is_measured_on_a_ladder_of_sizes():
    """``effective_cache``: the largest ladder size read clearly faster per byte than ``mm_stream`` (at most 0.8 of its
    time per byte), every smaller one too, at most the reported cache; half the smallest where none is, the reported
    cache where all are or the cases are missing. Rows' stream features follow it, and the ladder stays out of the fit."""
    from sdrt.cost.calibrate import LADDER_MIB, _stream_feature, effective_cache

    mib = 2**20

    def row(case, size_mib, ms):
        return {"case": f"cal_{case}", "stream_bytes": size_mib * mib, "robust_ms": ms, "features": {"weight_ms": 1.0}}

    stream = row("mm_stream", 960, 48.0)  # 0.05 ms a MiB
    ms_per_mib = {16: 0.031, 32: 0.028, 64: 0.025, 128: 0.044, 256: 0.05}
    ladder = [row(f"cache_{m}", m, m * ms_per_mib[m]) for m in LADDER_MIB]
    assert effective_cache([stream, *ladder], 480 * mib) == 64 * mib
    assert effective_cache([stream, *ladder], 32 * mib) == 32 * mib  # never past what the OS reports
    slow = [row(f"cache_{m}", m, m * 0.05) for m in LADDER_MIB]
    assert effective_cache([stream, *slow], 480 * mib) == 8 * mib
    fast = [row(f"cache_{m}", m, m * 0.01) for m in LADDER_MIB]
    assert effective_cache([stream, *fast], 480 * mib) == 480 * mib
    assert effective_cache(ladder, 480 * mib) == 480 * mib and effective_cache([stream, *ladder], 0) == 0
    # 100 MiB of weights past a 64 MiB cache: read again at the copy bandwidth's 10 GB/s; 32 MiB: not
    assert _stream_feature(row("x", 100, 1.0), 64 * mib, 1e10)["features"]["stream_weight_ms"] == pytest.approx(
        1000 * 100 * mib / 1e10)
    assert _stream_feature(row("x", 32, 1.0), 64 * mib, 1e10)["features"]["stream_weight_ms"] == 0.0


def test_half_precision_converts_the_inputs_and_outputs():
    """At bf16 a case's float32 inputs and outputs are converted every call (``io_ms``: their bytes, as costed at the
    precision, over the bandwidth), and a dynamic graph that the backend ran pinned has no dynamic-dims work; the
    calibrated prediction adds the conversion at its fitted efficiency, at a half precision only."""
    from sdrt.cost.calibrate import build_case, features
    from sdrt.cost.nodes import graph_costs
    from sdrt.graph import Graph

    model, feeds = build_case("heads")  # 1 x 77 x 64 floats in and out, dims dynamic
    g = Graph.load(model.SerializeToString())
    cost = graph_costs(g, {k: v.shape for k, v in feeds.items()}, "bf16")
    assert cost.io_bytes == 2 * 77 * 64 * 2
    f = features(cost, 1e11, 1e10)
    assert f["io_ms"] == pytest.approx(1000 * 2 * 77 * 64 * 2 / 1e10)
    assert f["dyn_nodes"] > 0 and f["shape_nodes"] > 0
    pinned = features(cost, 1e11, 1e10, pinned=True)
    assert pinned["dyn_nodes"] == 0 and pinned["shape_nodes"] == 0 and pinned["nodes"] == f["nodes"]
    cpu = devices.find("cpu")
    fac = Factors({}, {}, additive=True, calibrated=True, bandwidth_bytes_per_s=1e10, io_bandwidth_efficiency=0.5)
    assert predict(cost, cpu, "openvino", "bf16", fac).by_class_ms["io"] == pytest.approx(
        1000 * 2 * 77 * 64 * 2 / 0.5e10)
    assert "io" not in predict(graph_costs(g, {k: v.shape for k, v in feeds.items()}), cpu, "openvino", "fp32",
                               fac).by_class_ms


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


def test_measure_times_a_calibration_case_in_a_child(tmp_path, monkeypatch):
    """The one-node case through a real backend: a sub-millisecond call is timed over a loop of calls."""
    from sdrt.cost.calibrate import build_case, measure

    pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
    backend = "openvino"
    monkeypatch.setenv("SDRT_LOAD_ENTRY_POINTS", "1")  # the child finds the installed plugin as sdrt does
    model, feeds = build_case("call")
    path = tmp_path / "call.onnx"
    path.write_bytes(model.SerializeToString())
    m = measure(path, feeds, backend, repeats=3, options={"precision": "fp32"}, quiet_s=0)
    assert len(m["times_ms"]) == 3 and 0 < m["robust_ms"] < 5 and m["peak_bytes"] > 0
    assert m["quiet_wait_s"] == 0


@pytest.mark.parametrize("backend", ["openvino", "ggml"])
def test_measure_pins_a_dynamic_graph_to_the_shapes_given(tmp_path, monkeypatch, backend):
    """``shapes=``: the child compiles the graph pinned to them, as a pipeline compiles its parts, on any backend
    (OpenVINO would otherwise compile the dims dynamic, which runs its fused attention up to 2x slower)."""
    from onnx import TensorProto, helper

    from sdrt.cost.calibrate import measure

    pytest.importorskip(f"sdrt_{backend}", reason=f"the sdrt-{backend} plugin is not installed")
    if backend == "openvino":
        pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
    monkeypatch.setenv("SDRT_LOAD_ENTRY_POINTS", "1")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "dyn.onnx"
    path.write_bytes(model.SerializeToString())
    feeds = {"x": np.ones((3, 16), np.float32)}
    m = measure(path, feeds, backend, repeats=3, options={"precision": "fp32"}, quiet_s=0, shapes={"x": (3, 16)})
    assert m["inputs"] == {"x": [3, 16]} and len(m["times_ms"]) == 3
    if backend == "openvino":  # unpinned, the compiled input keeps its symbolic batch
        free = measure(path, feeds, backend, repeats=3, options={"precision": "fp32"}, quiet_s=0)
        assert free["inputs"]["x"][0] != 3


def test_an_unknown_device_lists_no_near_misses_by_a_vendor_word_and_says_where_the_whole_list_is():
    """"Nonexistent GPU" was answered with the Arc and Apple devices (their names hold "GPU") as the names to use;
    a list cut at 12 ("RTX 9999": every RTX) did not say it was cut nor where the whole list is."""
    with pytest.raises(SdrtError) as e:
        devices.find("Nonexistent GPU")
    assert "Apple M1 (8-core GPU)" not in str(e.value) and "sdrt plan --list-devices" in str(e.value), str(e.value)
    with pytest.raises(SdrtError) as e:
        devices.find("RTX 9999")
    assert "RTX 3060 12GB, " in str(e.value) and ", ...;" in str(e.value), str(e.value)
    assert "sdrt plan --list-devices" in str(e.value)
