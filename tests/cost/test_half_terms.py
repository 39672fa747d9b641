"""The cost model's terms for a half precision (bf16) as the runtimes hold it: small weights counted as the file's
float32 tensors, float32 activations on a backend that keeps them so (ggml), the float32 weights in flight while
a half copy is made (OpenVINO's bf16 twin), and a half-precision time fit that holds the float32 kernels' terms."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.cost import devices
from sdrt.cost.calibrate import (
    COMPILE_TERMS,
    RUN_TERMS,
    SHARED_TERMS,
    _fit_memory,
    _fit_times,
    _phase_columns,
    float32_activations,
    half_held_memory,
    held_terms,
)
from sdrt.cost.model import HALF_COPY_CHUNK_BYTES, Factors, activation_scale, memory_phases, node_time_s, predict
from sdrt.cost.nodes import GraphCost, NodeCost, graph_costs
from sdrt.graph import Graph

MIB = 2**20


def _model_bytes(nodes, shape, inits=()) -> bytes:
    """A float32 graph of ``nodes`` from input x of ``shape`` to output y, serialized."""
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _two_matmuls() -> Graph:
    """x (1, 8, 384) @ A (384, 512): 768 KiB as float32; then @ B (512, 768): 1.5 MiB as float32, 0.75 MiB as bf16."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((384, 512)).astype(np.float32), "a"),
             numpy_helper.from_array(rng.standard_normal((512, 768)).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "a"], ["h"]), helper.make_node("MatMul", ["h", "b"], ["y"])]
    return Graph.load(_model_bytes(nodes, [1, 8, 384], inits))


def test_small_weights_and_half_source_count_the_files_float32_tensors():
    """A tensor is small by its float32 size in the file (under 1 MiB there it is read into the process; larger ones
    are mapped), at any precision: B, 0.75 MiB as bf16, is not small. The half precision's source: both matrices'
    float32 bytes, and none at fp32."""
    g = _two_matmuls()
    fp32, bf16 = graph_costs(g, precision="fp32"), graph_costs(g, precision="bf16")
    assert fp32.small_weight_bytes == bf16.small_weight_bytes == 384 * 512 * 4
    assert bf16.weight_bytes == (384 * 512 + 512 * 768) * 2
    assert bf16.half_source_bytes == (384 * 512 + 512 * 768) * 4
    assert fp32.half_source_bytes == 0.0


def _cost(precision: str = "bf16", dynamic: bool = False, half_source: float = 0.0) -> GraphCost:
    """10 MiB of matmul weights, 40 MiB of live activations (1 MiB of them the input), a 2 MiB output; one node."""
    nodes = [NodeCost("m", "MatMul", "matmul", 1e9, 10 * MIB + 3 * MIB, 2 * MIB, 10 * MIB)]
    return GraphCost("g", precision, nodes, 10 * MIB, 40 * MIB, 3 * MIB, peak_activation_bytes_inplace=40 * MIB,
                     peak_activation_bytes_fused=40 * MIB, input_bytes=MIB, output_bytes=2 * MIB, dynamic=dynamic,
                     half_source_bytes=half_source)


F = Factors({"matmul": 1.0}, {"matmul": 0.0}, weight_factor=1.0, activation_factor=1.0, base_bytes=100 * MIB,
            inplace_activations=True, compile_weight_factor=2.0, compile_input_factor=1.0, output_factor=1.0,
            dynamic_compile_weight_factor=1.0, dynamic_run_weight_factor=2.0, additive=True,
            bandwidth_bytes_per_s=1e10, bandwidth_efficiency=1.0, weight_bandwidth_efficiency=1.0)


def test_float32_activations_double_the_activation_terms():
    """At bf16 the costs hold activations at 2 bytes; a backend that keeps them float32 (ggml) has them at 4:
    its run phase holds 2 x (40 - 1) + 2 x 2 MiB, its compile phase 2 x 1 MiB of input, and a node's activation
    traffic doubles while its weight traffic does not. At fp32 nothing changes."""
    f32 = replace(F, float32_activations=True)
    assert activation_scale("bf16", F) == 1.0 and activation_scale("bf16", f32) == 2.0
    assert activation_scale("fp32", f32) == 1.0
    comp, run, _ = memory_phases(_cost(), F)
    assert (comp / MIB, run / MIB) == pytest.approx((2 * 10 + 1 + 100, 10 + 39 + 2 + 100))
    comp, run, _ = memory_phases(_cost(), f32)
    assert (comp / MIB, run / MIB) == pytest.approx((2 * 10 + 2 + 100, 10 + 78 + 4 + 100))
    assert memory_phases(_cost("fp32"), f32) == memory_phases(_cost("fp32"), F)
    cpu = devices.find("cpu")
    t = node_time_s("matmul", 0.0, 13 * MIB, cpu, "bf16", F, weight_bytes=10 * MIB)
    t32 = node_time_s("matmul", 0.0, 13 * MIB, cpu, "bf16", f32, weight_bytes=10 * MIB)
    assert t == pytest.approx(13 * MIB / 1e10) and t32 == pytest.approx(16 * MIB / 1e10)
    assert predict(_cost(), cpu, "ggml", "bf16", f32).activation_bytes == 80 * MIB
    assert float32_activations("ggml", "bf16") and float32_activations("ggml", "fp16")
    assert not float32_activations("ggml", "fp32") and not float32_activations("openvino", "bf16")


def test_float32_weights_in_flight_while_a_half_copy_is_made():
    """A graph compiled with dynamic dims holds, compiling, the fitted factor x its float32 source weights, at most
    256 MiB of them (OpenVINO's bf16 twin hands the pages back every 256 MiB); not running, and not a static graph
    (whose factors were fitted on whole small cases)."""
    f = replace(F, dynamic_compile_inflight_factor=0.75)
    base = memory_phases(_cost(dynamic=True), f)
    small = memory_phases(_cost(dynamic=True, half_source=100 * MIB), f)
    large = memory_phases(_cost(dynamic=True, half_source=3000 * MIB), f)
    assert small[0] - base[0] == pytest.approx(75 * MIB)
    assert large[0] - base[0] == pytest.approx(0.75 * HALF_COPY_CHUNK_BYTES)
    assert small[1] == large[1] == base[1]  # the run phase: the pages were handed back
    assert memory_phases(_cost(half_source=3000 * MIB), f) == memory_phases(_cost(), f)  # static
    # the pages are handed back before the runtime compiles the copy and reads its lookup tables: the larger of the
    # two, not both (4 of the 10 MiB a table, held 1.5 x compiling: 6 MiB, under the 75 in flight)
    table = replace(f, table_factor=0.0, dynamic_compile_table_factor=1.5)
    with_table = replace(_cost(dynamic=True, half_source=100 * MIB), table_bytes=4 * MIB)
    no_copy = replace(with_table, half_source_bytes=0.0)
    assert memory_phases(no_copy, table)[0] - base[0] == pytest.approx(6 * MIB - 4 * MIB)  # 4 MiB more at 1.5 x
    assert memory_phases(with_table, table)[0] - memory_phases(no_copy, table)[0] == pytest.approx(75 * MIB - 6 * MIB)


def test_fit_recovers_the_inflight_factor():
    """Dynamic cases made from known factors plus 0.8 x the float32 weights in flight: small ones (all of their
    float32 weights in flight, twice their bf16 bytes) and one past the chunk, which tells the two apart."""
    rng = np.random.default_rng(3)
    base, per_node = 120 * MIB, 50e3
    true = {t: 0.0 for t in COMPILE_TERMS + RUN_TERMS}
    true.update(compile_weight_factor=2.5, weight_factor=2.0, activation_factor=1.0, output_factor=1.0,
                compile_input_factor=1.0, transient_factor=0.5)
    zero = {"weight_bytes": 0.0, "activation_bytes": 0.0, "rss_before": 70 * MIB}
    rows = [{"case": "call", **zero, "peak_bytes": 10 * MIB, "peak_rss": base, "compile_peak_rss": base,
             "run_peak_rss": base, "mem_nodes": 1},
            {"case": "nodes", **zero, "weight_bytes": 1e5, "peak_bytes": 10 * MIB, "peak_rss": base + 399 * per_node,
             "compile_peak_rss": base + 399 * per_node, "run_peak_rss": base + 399 * per_node, "mem_nodes": 400}]
    for i, w in enumerate([float(x) for x in rng.uniform(4, 60, 8)] + [20.0, 36.0, 320.0]):
        dynamic = i >= 8
        r = {"case": f"c{i}", "weight_bytes": w * MIB, "largest_weight_bytes": w * MIB * rng.uniform(0.1, 1),
             "activation_bytes": float(rng.uniform(2, 30) * MIB), "input_bytes": MIB, "output_bytes": MIB,
             "mem_nodes": 4, "dynamic": dynamic, "rss_before": 70 * MIB,
             "inflight_bytes": min(2 * w * MIB, HALF_COPY_CHUNK_BYTES)}
        cols = _phase_columns(r)
        comp = sum(true[t] * cols[t] for t in COMPILE_TERMS)
        if dynamic:
            comp += (1.0 - 2.5) * w * MIB + 0.8 * r["inflight_bytes"]  # 1 x the weights, 0.8 x those in flight
        r["compile_peak_rss"] = base + per_node * 3 + comp
        r["run_peak_rss"] = base + per_node * 3 + sum(true[t] * cols[t] for t in RUN_TERMS)
        r["peak_rss"] = max(r["compile_peak_rss"], r["run_peak_rss"])
        r["peak_bytes"] = r["peak_rss"] - 70 * MIB
        rows.append(r)
    got = _fit_memory(rows)
    assert got["dynamic_compile_inflight_factor"] == pytest.approx(0.8, rel=1e-6)
    assert got["dynamic_compile_weight_factor"] == pytest.approx(1.0, rel=1e-6)
    assert got["compile_weight_factor"] == pytest.approx(2.5, rel=1e-6)


def test_half_precision_memory_fit_holds_the_float32_activation_factor():
    """Static cases whose run peaks come from known factors (1.25 bytes held per live activation byte): fitted with the
    activation factor held at its value, the run phase's other factors come back and the held one is kept as it is;
    ``half_held_memory`` holds the float32 calibration's factor at a half precision only."""
    rng = np.random.default_rng(11)
    base = 120 * MIB
    true = {t: 0.0 for t in COMPILE_TERMS + RUN_TERMS}
    true.update(compile_weight_factor=2.0, weight_factor=1.0, activation_factor=1.25, output_factor=3.0,
                compile_input_factor=1.0)
    zero = {"weight_bytes": 0.0, "activation_bytes": 0.0, "rss_before": 70 * MIB, "mem_nodes": 1}
    rows = [{"case": "call", **zero, "peak_bytes": 10 * MIB, "peak_rss": base, "compile_peak_rss": base,
             "run_peak_rss": base}]
    for i in range(10):
        act = float(rng.uniform(2, 60)) * MIB
        r = {"case": f"c{i}", "weight_bytes": float(rng.uniform(4, 60)) * MIB, "activation_bytes": act,
             "input_bytes": MIB, "output_bytes": act * float(rng.uniform(0.2, 0.9)), "mem_nodes": 1,
             "rss_before": 70 * MIB}
        cols = _phase_columns(r)
        r["compile_peak_rss"] = base + sum(true[t] * cols[t] for t in COMPILE_TERMS)
        r["run_peak_rss"] = base + sum(true[t] * cols[t] for t in RUN_TERMS)
        r["peak_rss"] = max(r["compile_peak_rss"], r["run_peak_rss"])
        r["peak_bytes"] = r["peak_rss"] - 70 * MIB
        rows.append(r)
    got = _fit_memory(rows, held={"activation_factor": 1.25})
    assert got["activation_factor"] == 1.25
    assert got["output_factor"] == pytest.approx(3.0, rel=1e-6)
    assert got["weight_factor"] == pytest.approx(1.0, rel=1e-6)
    ref = Factors({}, {}, activation_factor=1.13, calibrated=True)
    assert half_held_memory("bf16", ref) == {"activation_factor": 1.13}
    assert half_held_memory("fp32", ref) == {} and half_held_memory("bf16", None) == {}
    assert half_held_memory("bf16", Factors({}, {}, activation_factor=1.13)) == {}  # the defaults: nothing to hold


def test_half_precision_time_fit_holds_the_float32_kernels_terms():
    """Cases timed from known coefficients: with the shared terms held at their true values, the rest (here the
    matmuls' FLOPs and the weights' traffic) come back; held_terms scales a FLOPs term by the two peaks (a
    feature at twice the peak is half as large) and leaves the others."""
    rng = np.random.default_rng(5)
    true = {"flops_matmul": 0.7, "weight_ms": 0.9, "flops_softmax": 8.0, "act_ms": 0.5, "nodes": 0.002, "call": 0.01}
    rows = []
    for i in range(12):
        feats = {k: float(rng.uniform(0, 3)) if k not in ("nodes", "call") else 1.0 for k in true}
        feats["nodes"] = float(rng.integers(1, 400))
        rows.append({"case": f"c{i}", "features": feats, "robust_ms": sum(true[k] * feats[k] for k in true)})
    held = {k: true[k] for k in ("flops_softmax", "act_ms", "nodes", "call")}
    got = _fit_times(rows, held)
    for k, v in true.items():
        assert got[k] == pytest.approx(v, rel=1e-6), k
    ref = Factors({}, {}, fit={"coefficients": {"flops_softmax": 8.0, "act_ms": 0.5, "flops_matmul": 0.7,
                                                "fused_flops_ms": 18.0}})
    h = held_terms(ref, 2e12, 1e12)
    assert set(h) == set(SHARED_TERMS) and "flops_matmul" not in h
    assert h["flops_softmax"] == pytest.approx(16.0) and h["fused_flops_ms"] == pytest.approx(36.0)
    assert h["act_ms"] == 0.5 and h["call"] == 0.0
    assert held_terms(None, 2e12, 1e12) == {}


def test_attention_is_fitted_at_bf16_where_ggml_runs_it_on_amx_tiles():
    """sdrt-ggml's attention at bf16 runs on AMX tiles where the CPU has them (its float32 kernel elsewhere): there its
    bf16 fit leaves the attention terms free, fitted from the bf16 cases, and holds the other float32 kernels' terms;
    without AMX, or on OpenVINO (whose activations are bf16: nothing held), the exception does not apply. Cases timed
    from known coefficients, attention 3x faster than float32's held term: the fit gets it back."""
    from sdrt.cost.calibrate import half_attention, half_held

    cpu = replace(devices.this_cpu(), peak_flops={"fp32": 1e12, "bf16": 1e12})  # equal peaks: FLOPs terms unscaled
    amx, avx512 = replace(cpu, isa=("avx512f", "avx512_bf16", "amx_bf16")), replace(cpu, isa=("avx512f", "avx512_bf16"))
    assert half_attention("ggml", "bf16", amx) and not half_attention("ggml", "bf16", avx512)
    assert not half_attention("ggml", "fp32", amx) and not half_attention("openvino", "bf16", amx)
    assert not half_attention("ggml", "bf16", replace(amx, kind="gpu"))
    rng = np.random.default_rng(7)
    true = {"flops_matmul": 0.7, "flops_attention": 2.0, "attn_act_ms": 0.4, "flops_norm": 5.0, "call": 0.01}
    rows = []
    for i in range(16):
        feats = {k: float(rng.uniform(0, 3)) for k in true} | {"call": 1.0}
        rows.append({"case": f"c{i}", "features": feats, "robust_ms": sum(true[k] * feats[k] for k in true)})
    ref = Factors({}, {}, fit={"coefficients": {"flops_attention": 6.0, "attn_act_ms": 1.2, "flops_norm": 5.0,
                                                "call": 0.01, "flops_matmul": 2.1}})
    held = half_held("ggml", "bf16", amx, ref)
    assert "flops_attention" not in held and "attn_act_ms" not in held and "attn_rows" not in held
    assert held["flops_norm"] == 5.0 and "flops_matmul" not in held
    got = _fit_times(rows, held)
    for k, v in true.items():
        assert got[k] == pytest.approx(v, rel=1e-6), k
    without = half_held("ggml", "bf16", avx512, ref)  # no AMX: the float32 kernel's terms
    assert without["flops_attention"] == 6.0 and without["attn_act_ms"] == 1.2
    assert half_held("openvino", "bf16", amx, ref) == {} and half_held("ggml", "fp32", amx, ref) == {}


def _conv_tail() -> Graph:
    """x (1, 8, 16, 16) -> 3x3 Conv -> Sigmoid -> Add (a per-channel weight) -> y: the Sigmoid and the Add are the
    graph's tail (no conv, matmul or resize after them); 2048 elements a value."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "k"),
             numpy_helper.from_array(rng.standard_normal((8, 1, 1)).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1] * 4), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Add", ["s", "b"], ["y"])]
    return Graph.load(_model_bytes(nodes, [1, 8, 16, 16], inits))


def test_the_graphs_tail_is_held_float32_where_the_runtime_keeps_it_so():
    """OpenVINO at bf16 keeps what follows the last conv, matmul or resize float32: the Sigmoid's and the Add's
    outputs take 4 bytes an element, so the Sigmoid cannot run in the conv's (bf16) memory. Counted: x 4 kB + the
    conv's 4 kB, then the sigmoid 8 kB beside the conv's output, then the output 8 kB beside the sigmoid (16 kB),
    against 8 kB with every value bf16 (the sigmoid in place); at fp32 the two are the same. A graph without such
    ops is wholly tail; the factors take the tail's count where the runtime keeps the tail float32."""
    from sdrt.cost.calibrate import float32_tail
    from sdrt.cost.model import activation_bytes
    from sdrt.cost.nodes import float32_tail_values

    g = _conv_tail()
    assert float32_tail_values(g.model) == {"s", "y"}
    bf16, fp32 = graph_costs(g, precision="bf16"), graph_costs(g, precision="fp32")
    assert bf16.peak_activation_bytes_inplace == 8192 and bf16.peak_activation_bytes_tail == 16384
    assert fp32.peak_activation_bytes_tail == fp32.peak_activation_bytes_inplace == 16384
    silu = graph_costs(Graph.load(_silu_only()), precision="bf16")
    # wholly tail: the SiLU's output float32, 8 kB, beside the input (counted as the inputs are, ``input_bytes``)
    assert (silu.peak_activation_bytes_inplace, silu.peak_activation_bytes_tail) == (8192, 4096 + 8192)
    tail = replace(F, float32_tail=True)
    assert activation_bytes(bf16, tail) == 16384 and activation_bytes(bf16, F) == 8192
    assert activation_bytes(fp32, tail) == activation_bytes(fp32, F)
    assert float32_tail("openvino", "bf16") and not float32_tail("openvino", "fp32")
    assert not float32_tail("ggml", "bf16")  # ggml keeps every activation float32 (float32_activations)


def _silu_only() -> bytes:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    return _model_bytes(nodes, [1, 8, 16, 16])


def _residual_stream() -> Graph:
    """Two pre-norm blocks whose residual stream is the output (every layer's hidden state, as SDXL's text encoders
    give): h = x + x @ A; y = h + LayerNorm(h) @ B. The adds are the float32 tail, the matmuls and the norm the bf16
    body; 8 x 16 elements a value."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "a"),
             numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "b"),
             numpy_helper.from_array(np.ones(16, np.float32), "g"), numpy_helper.from_array(np.zeros(16, np.float32), "z")]
    nodes = [helper.make_node("MatMul", ["x", "a"], ["m"]), helper.make_node("Add", ["x", "m"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "z"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "b"], ["m2"]), helper.make_node("Add", ["h", "m2"], ["y"])]
    return Graph.load(_model_bytes(nodes, [1, 8, 16], inits))


def test_values_crossing_the_float32_tail_are_converted_by_a_node_each():
    """The residual stream (h, y) is the tail: m and m2 (bf16 matmul outputs) cross into it, h crosses out of it into
    the norm: three conversions, each a node (OpenVINO's ``Reorder``), 8 x 16 x (4 + 2) bytes each; the input x is the
    call's conversion (``io_bytes``), not one of them. None at fp32, none into a conv's own epilogue (the conv writes
    float32 itself), none on a backend that does not keep the tail float32; the time adds a data node's fixed cost per
    conversion, and the calibration's features count them as nodes."""
    from sdrt.cost.calibrate import features
    from sdrt.cost.nodes import float32_tail_values, tail_crossings

    g = _residual_stream()
    assert float32_tail_values(g.model) == {"h", "y"}
    assert tail_crossings(g.model, {"h", "y"}, {"a", "b", "g", "z"}) == {"m", "h", "m2"}
    bf16, fp32 = graph_costs(g, precision="bf16"), graph_costs(g, precision="fp32")
    assert (bf16.tail_conversions, bf16.tail_conversion_bytes) == (3, 3 * 8 * 16 * 6)
    assert fp32.tail_conversions == 0
    assert graph_costs(_conv_tail(), precision="bf16").tail_conversions == 0  # Conv -> Sigmoid: the conv's epilogue
    cpu = devices.this_cpu()
    f = replace(F, overhead_s={"matmul": 0.0, "data": 1e-6})
    tail = replace(f, float32_tail=True)
    assert predict(bf16, cpu, "openvino", "bf16", tail).by_class_ms["convert"] == pytest.approx(3e-3)
    assert "convert" not in predict(bf16, cpu, "ggml", "bf16", f).by_class_ms
    assert "convert" not in predict(fp32, cpu, "openvino", "fp32", tail).by_class_ms
    plain, crossed = (features(bf16, 1e12, 1e10, tail32=t) for t in (False, True))
    assert crossed["nodes"] == plain["nodes"] + 3


def test_float32_activations_into_half_matmuls_are_a_term_of_their_own():
    """On a backend that keeps activations float32 at a half precision (sdrt-ggml at bf16), each weight matmul's input
    is converted per call: ``matmul_convert_ms`` counts its float32 bytes; fitted from cases of several widths, it is
    told apart from the FLOPs (a 640-wide and a 2560-wide matmul: FLOPs per input element 4x apart) and predicted
    per input byte. At float32, or on a backend whose activations are the half type, there is none."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from sdrt.cost import devices
    from sdrt.cost.calibrate import features, fit
    from sdrt.cost.model import Factors, predict
    from sdrt.cost.nodes import graph_costs
    from sdrt.graph import Graph

    def mm(tokens, k, n):
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.zeros((k, n), np.float32), "w")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return graph_costs(Graph.load(m.SerializeToString()), precision="bf16")

    cpu = devices.find("cpu")
    peak, bw = cpu.peak("bf16"), 1e10
    assert features(mm(1024, 640, 640), peak, bw)["matmul_convert_ms"] == 0.0  # activations bf16: nothing converted
    rows = []
    mem = {"weight_bytes": 0.0, "activation_bytes": 0.0, "peak_bytes": 0.0, "peak_rss": 1.0}
    for i, (t, k, n) in enumerate([(1024, 640, 640), (4096, 320, 320), (1024, 640, 2560), (1024, 2560, 640),
                                   (512, 1280, 1280)]):
        feats = features(mm(t, k, n), peak, bw, act_scale=2.0)
        assert feats["matmul_convert_ms"] == pytest.approx(1000 * t * k * 4 / bw)
        ms = feats["flops_matmul"] / 0.25 + feats["matmul_convert_ms"] / 0.5 + 0.01
        rows.append({"case": f"c{i}", "features": feats, "robust_ms": ms, **mem})
    got = fit(rows, bw, "ggml", float32_activations=True)
    assert got.efficiency["matmul"] == pytest.approx(0.25, rel=1e-4)
    assert got.matmul_convert_bandwidth_efficiency == pytest.approx(0.5, rel=1e-4)
    wide = mm(2048, 1280, 5120)
    f = Factors({"matmul": 0.25}, {}, additive=True, bandwidth_bytes_per_s=bw, float32_activations=True,
                matmul_convert_bandwidth_efficiency=0.5, weight_bandwidth_efficiency=100.0, bandwidth_efficiency=100.0)
    by = predict(wide, cpu, "ggml", "bf16", f).by_class_ms
    assert by["matmul_convert"] == pytest.approx(1000 * 2048 * 1280 * 4 / (bw * 0.5))
    assert "matmul_convert" not in predict(wide, cpu, "ggml", "bf16", Factors({"matmul": 0.25}, {}, additive=True,
                                                                           bandwidth_bytes_per_s=bw)).by_class_ms


def test_half_convs_over_float32_activations_have_a_fixed_cost_each():
    """sdrt-ggml's bf16 convs pack and convert their columns every call (native/conv.c, conv_unit_bf16), which costs
    a conv of few channels more than its FLOPs: ``half_convs`` counts the dense convs (1x1 included; neither
    depthwise ones nor those of under 16 output channels, which ggml keeps float32) of a part on a backend that keeps
    activations float32 at a half precision; fitted from cases with 1 and 40 convs it is told apart from the FLOPs
    (a node's own fixed cost held at float32's, as ``half_held`` holds it), and predicted per conv. At float32, or
    without the calibrated figure, there is none."""
    from sdrt.cost.calibrate import features, fit
    from sdrt.cost.model import half_convs

    def convs(count, c, hw, k=3, group=1, last=None):
        nodes, prev, inits = [], "x", []
        for i in range(count):
            oc = last if last and i == count - 1 else c
            inits.append(numpy_helper.from_array(np.zeros((oc, c // group, k, k), np.float32), f"w{i}"))
            nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"y{i}"], pads=[k // 2] * 4, group=group))
            prev = f"y{i}"
        g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return graph_costs(Graph.load(m.SerializeToString()), precision="bf16")

    assert half_convs(convs(3, 32, 16)) == 3 and half_convs(convs(2, 32, 16, k=1)) == 2
    assert half_convs(convs(2, 32, 16, group=32)) == 0  # depthwise: a float32 kernel
    # a last conv to 3 channels (a VAE decoder's conv_out) stays float32 (ggml's BF16_MIN_OC); 16 do not
    assert half_convs(convs(3, 32, 16, last=3)) == 2 and half_convs(convs(3, 32, 16, last=16)) == 3
    cpu = devices.find("cpu")
    peak, bw = cpu.peak("bf16"), 1e10
    assert features(convs(3, 32, 16), peak, bw)["half_convs"] == 0.0  # activations bf16: no half kernels over float32
    rows = []
    mem = {"weight_bytes": 0.0, "activation_bytes": 0.0, "peak_bytes": 0.0, "peak_rss": 1.0}
    for i, (n, c, hw) in enumerate([(1, 320, 32), (3, 640, 16), (40, 128, 16), (1, 128, 64), (4, 64, 56)]):
        feats = features(convs(n, c, hw), peak, bw, act_scale=2.0)
        assert feats["half_convs"] == n
        ms = feats["flops_conv"] / 0.3 + 0.03 * feats["half_convs"] + 0.01
        rows.append({"case": f"c{i}", "features": feats, "robust_ms": ms, **mem})
    got = fit(rows, bw, "ggml", float32_activations=True, held={"nodes": 0.0})  # a node's cost: float32's (none here)
    assert got.half_conv_node_s == pytest.approx(3e-5, rel=1e-4)
    assert got.efficiency["conv"] == pytest.approx(0.3, rel=1e-4)
    part = convs(47, 64, 28, k=1)
    f = Factors({"conv": 0.3}, {}, additive=True, bandwidth_bytes_per_s=bw, float32_activations=True,
                half_conv_node_s=3e-5, weight_bandwidth_efficiency=100.0, bandwidth_efficiency=100.0)
    assert predict(part, cpu, "ggml", "bf16", f).by_class_ms["half_conv"] == pytest.approx(47 * 0.03)
    assert "half_conv" not in predict(part, cpu, "ggml", "fp32", f).by_class_ms
    assert "half_conv" not in predict(part, cpu, "openvino", "bf16", Factors({"conv": 0.3}, {}, additive=True,
                                                                          bandwidth_bytes_per_s=bw)).by_class_ms
