"""The two-phase memory model (compile, then runs) against hand-computed values, and its fit recovering
known factors from synthetic measurements."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sdrt.cost import devices
from sdrt.cost.calibrate import COMPILE_TERMS, RUN_TERMS, _fit_memory, _phase_columns
from sdrt.cost.model import Factors, memory_phases, predict, transient_bytes
from sdrt.cost.nodes import GraphCost, NodeCost

MIB = 2**20


def _cost(dynamic: bool = False) -> GraphCost:
    """100 MiB of weights: 60 MiB of 3x3 kernels (largest 20), 10 MiB of table, 30 MiB of others (largest 5),
    4 MiB of them in small tensors; 50 MiB of live activations (1 MiB of them the input), a 2 MiB output; two
    nodes."""
    nodes = [NodeCost("k", "Conv", "conv", 1e9, 61 * MIB, MIB, 60 * MIB),
             NodeCost("m", "MatMul", "matmul", 1e9, 31 * MIB, MIB, 30 * MIB)]
    return GraphCost("g", "fp32", nodes, 100 * MIB, 50 * MIB, 3 * MIB, table_bytes=10 * MIB,
                     largest_conv_bytes=20 * MIB, largest_weight_bytes=5 * MIB, peak_activation_bytes_fused=50 * MIB,
                     peak_activation_bytes_inplace=50 * MIB, input_bytes=MIB, output_bytes=2 * MIB,
                     small_weight_bytes=4 * MIB, dynamic=dynamic)


F = Factors({"matmul": 1.0, "conv": 1.0}, {"matmul": 0.0, "conv": 0.0}, weight_factor=1.0, activation_factor=1.0,
            base_bytes=100 * MIB, conv_weight_factor=3.0, table_factor=0.0, node_bytes=MIB, transient_conv_factor=3.0,
            transient_factor=1.0, inplace_activations=True, compile_weight_factor=2.0, compile_conv_weight_factor=4.0,
            compile_table_factor=1.0, compile_input_factor=1.0, output_factor=2.0, retained_factor=0.5,
            compile_small_factor=1.0,
            dynamic_compile_weight_factor=2.0, dynamic_compile_conv_weight_factor=1.0,
            dynamic_run_weight_factor=1.0, dynamic_run_conv_weight_factor=2.0)


def test_peak_is_the_larger_phase():
    # compile: 2 x 30 + 4 x 60 + 1 x 10 + 3 x 20 + 1 x 5 + 1 x 1 (input) + 1 x 4 (small) + 2 nodes + 100 = 482 MiB
    # run: 1 x 30 + 3 x 60 + 0 x 10 + 1 x (50 - 1) + 2 x 2 (output) + 0.5 x 4 (small) + 2 + 100 = 367 MiB
    comp, run, resident = memory_phases(_cost(), F)
    assert (comp / MIB, run / MIB, resident / MIB) == pytest.approx((482, 367, 214))
    p = predict(_cost(), devices.find("cpu"), "ggml", "fp32", F)
    assert p.peak_bytes == pytest.approx(482 * MIB) and (p.compile_peak_bytes, p.run_peak_bytes) == (comp, run)
    # a graph compiled with dynamic dims: its kernels prepared at the first run (1 x compiling, 2 x running)
    comp, run, _ = memory_phases(_cost(dynamic=True), F)
    assert (comp / MIB, run / MIB) == pytest.approx((302, 307))
    # ... where 10 MiB of the other weights are matmuls with a fused activation, prepared at the first run:
    # compile 2 x 20 + 1 x 10 + 60 + 10 + 65 + 1 + 4 + 2 + 100; run 20 + 2 x 10 + 120 + 2 + 49 + 4 + 2 + 100
    cost = replace(_cost(dynamic=True), epilogue_weight_bytes=10 * MIB)
    f = replace(F, dynamic_compile_epilogue_weight_factor=1.0, dynamic_run_epilogue_weight_factor=2.0)
    comp, run, _ = memory_phases(cost, f)
    assert (comp / MIB, run / MIB) == pytest.approx((292, 317))
    assert memory_phases(replace(cost, dynamic=False), f)[:2] == memory_phases(_cost(), f)[:2]  # static: no split


def test_one_phase_calibration_adds_the_terms():
    f = Factors({"matmul": 1.0}, {"matmul": 0.0}, weight_factor=2.0, activation_factor=0.5, base_bytes=MIB,
                transient_factor=1.0)
    comp, run, resident = memory_phases(_cost(), f)
    assert comp == run == pytest.approx(2 * 100 * MIB + 5 * MIB + 25 * MIB + MIB)
    assert resident == pytest.approx(200 * MIB)


def test_dynamic_layout_copies_held_in_the_run_phase():
    """A graph compiled with dynamic dims holds ``dynamic_relayout_memory_factor`` x its largest layout copy beside the
    rest of the run phase (OpenVINO allocates a dynamic graph's copies as it runs); a static graph does not (its
    memory plan shares them), nor does a calibration without the factor."""
    f = replace(F, dynamic_relayout_memory_factor=2.0)
    dyn = replace(_cost(dynamic=True), largest_relayout_bytes=16 * MIB)
    # run: 307 MiB as above + 2 x 16
    assert memory_phases(dyn, f)[1] / MIB == pytest.approx(307 + 32)
    assert memory_phases(dyn, f)[0] / MIB == pytest.approx(302)  # compiling: nothing runs yet
    assert memory_phases(replace(dyn, dynamic=False), f)[1] / MIB == pytest.approx(367)
    assert memory_phases(dyn, F)[1] / MIB == pytest.approx(307)


def _synthetic_rows():
    true = dict(zip(COMPILE_TERMS, (2.0, 4.0, 1.0, 3.0, 0.5, 1.0, 2.5))) | dict(zip(RUN_TERMS, (1.0, 3.0, 0.1, 1.1, 2.0, 0.7)))
    dyn = {"compile": (2.0, 1.0), "run": (1.0, 2.0)}
    rng = np.random.default_rng(5)
    base, per_node = 100 * MIB, 20e3
    rows = [{"case": "call", "weight_bytes": 0.0, "activation_bytes": 0.0, "peak_bytes": 10 * MIB,
             "peak_rss": base, "rss_before": 70 * MIB, "compile_peak_rss": base, "run_peak_rss": base, "mem_nodes": 1},
            {"case": "nodes", "weight_bytes": 1e5, "activation_bytes": 0.0, "peak_bytes": 10 * MIB + 399 * per_node,
             "peak_rss": base + 399 * per_node, "rss_before": 70 * MIB, "compile_peak_rss": base + 399 * per_node,
             "run_peak_rss": base + 399 * per_node, "mem_nodes": 400},
            {"case": "runtime", "weight_bytes": 0.0, "activation_bytes": 0.0, "peak_bytes": 12 * MIB,
             "peak_rss": base + 2 * MIB, "rss_before": 70 * MIB, "compile_peak_rss": base + 2 * MIB,
             "run_peak_rss": base + 2 * MIB, "mem_nodes": 1}]
    for i in range(24):
        dynamic = i >= 20
        w = [float(x) for x in rng.uniform(0, 200 * MIB, 3)]
        if dynamic:  # one kind of weight each
            w = [w[0], 0.0, 0.0] if i % 2 else [0.0, w[1], 0.0]
        r = {"case": f"c{i}", "weight_bytes": sum(w), "conv_weight_bytes": w[1], "table_bytes": w[2],
             "largest_conv_bytes": w[1] * rng.uniform(0.1, 1), "largest_weight_bytes": (w[0] + w[2]) * rng.uniform(0.1, 1),
             "activation_bytes": float(rng.uniform(2, 300) * MIB), "input_bytes": float(rng.uniform(0, 1) * MIB),
             "output_bytes": float(rng.uniform(0, 50) * MIB), "small_weight_bytes": sum(w) * rng.uniform(0, 0.5),
             "mem_nodes": int(rng.integers(1, 50)), "dynamic": dynamic,
             "rss_before": 70 * MIB}
        cols = _phase_columns(r)
        c = {t: true[t] for t in COMPILE_TERMS}
        u = {t: true[t] for t in RUN_TERMS}
        if dynamic:
            c["compile_weight_factor"], c["compile_conv_weight_factor"] = dyn["compile"]
            u["weight_factor"], u["conv_weight_factor"] = dyn["run"]
        nodes = per_node * (r["mem_nodes"] - 1)
        r["compile_peak_rss"] = base + nodes + sum(c[t] * cols[t] for t in COMPILE_TERMS)
        r["run_peak_rss"] = base + nodes + sum(u[t] * cols[t] for t in RUN_TERMS)
        r["peak_rss"] = max(r["compile_peak_rss"], r["run_peak_rss"])
        r["peak_bytes"] = r["peak_rss"] - 90 * MIB
        rows.append(r)
    return rows, true, dyn, base, per_node


def test_a_table_mapped_at_an_offset_ggml_maps_is_not_held_by_ggml_on_a_cpu():
    """ggml runs a lookup table from its mapped file when the offset is 64-byte aligned (``MAPPED_TABLE_BACKENDS``):
    the 10 MiB table's compile-phase share (compile_table_factor 1 x 10 MiB) leaves ggml's peak on a CPU; a table at
    an offset ggml copies from, another backend, and a GPU (the table uploaded) keep it."""
    cpu = devices.find("cpu")
    mapped = replace(_cost(), mapped_tables=((10.0 * MIB, 4096),),
                     weight_order=((10 * MIB, "table"), (30 * MIB, "weight"), (60 * MIB, "kernel")))
    assert predict(mapped, cpu, "ggml", "fp32", F).peak_bytes == pytest.approx(472 * MIB)
    assert predict(mapped, cpu, "openvino", "fp32", F).peak_bytes == pytest.approx(482 * MIB)
    unaligned = replace(mapped, mapped_tables=((10.0 * MIB, 4096 + 49),))
    assert predict(unaligned, cpu, "ggml", "fp32", F).peak_bytes == pytest.approx(482 * MIB)
    gpu = next(d for d in devices.library() if d.kind == "gpu")
    assert predict(mapped, gpu, "ggml", "fp32", F).peak_bytes == predict(_cost(), gpu, "ggml", "fp32", F).peak_bytes


def test_fit_phases_recovers_known_factors():
    """Cases measured in two phases, made from known factors, static and dynamic, are fitted back."""
    rows, true, dyn, base, per_node = _synthetic_rows()
    got = _fit_memory(rows)
    for t, v in true.items():
        assert got[t] == pytest.approx(v, rel=1e-6, abs=1e-6), t
    assert (got["dynamic_compile_weight_factor"], got["dynamic_compile_conv_weight_factor"]) == pytest.approx(dyn["compile"])
    assert (got["dynamic_run_weight_factor"], got["dynamic_run_conv_weight_factor"]) == pytest.approx(dyn["run"])
    assert got["node_bytes"] == pytest.approx(per_node) and got["base"] == pytest.approx(base + 2 * MIB)


def test_fit_dynamic_layout_copies():
    """Weight-free dynamic cases with layout copies, measured as the static factors plus 2.5 x their largest copy:
    the factor comes back, fitted over what the static terms leave (and they stay as they were); a backend without
    copies (``relayout=False``, ggml) gets no such factor."""
    rows, true, _, base, per_node = _synthetic_rows()
    for k, (act, copy) in enumerate([(48, 16), (12, 4), (100, 30)]):
        r = {"case": f"rb{k}", "weight_bytes": 1e4, "activation_bytes": act * MIB, "input_bytes": MIB,
             "output_bytes": 0.0, "largest_relayout_bytes": copy * MIB, "mem_nodes": 20, "dynamic": True,
             "rss_before": 70 * MIB, "small_weight_bytes": 1e4}
        cols = _phase_columns(r)
        static_run = sum(true[t] * cols[t] for t in RUN_TERMS)
        r["compile_peak_rss"] = base + per_node * 19 + sum(true[t] * cols[t] for t in COMPILE_TERMS)
        r["run_peak_rss"] = base + per_node * 19 + static_run + 2.5 * copy * MIB
        r["peak_rss"] = max(r["compile_peak_rss"], r["run_peak_rss"])
        r["peak_bytes"] = r["peak_rss"] - 90 * MIB
        rows.append(r)
    got = _fit_memory(rows)
    assert got["dynamic_relayout_memory_factor"] == pytest.approx(2.5, rel=1e-6)
    for t in RUN_TERMS:
        assert got[t] == pytest.approx(true[t], rel=1e-6, abs=1e-6), t
    assert "dynamic_relayout_memory_factor" not in _fit_memory(rows, relayout=False)


def test_bytes_per_node_against_the_same_op_once():
    """The 400-node case against ``node1`` (its op once), not the one-Add ``call``: the 5 MiB that the op kind's code
    takes (OpenVINO's bf16 matmul kernels) is not charged to the nodes."""
    base, per_node, code = 120 * MIB, 90e3, 5 * MIB

    def row(case, extra, nodes):
        return {"case": case, "weight_bytes": 0.0, "activation_bytes": 0.0, "peak_bytes": 10 * MIB + extra,
                "peak_rss": base + extra, "rss_before": 70 * MIB, "mem_nodes": nodes}

    rows = [row("call", 0.0, 1), row("node1", code, 1), row("nodes", code + 399 * per_node, 400)]
    assert _fit_memory(rows)["node_bytes"] == pytest.approx(per_node)
    assert _fit_memory([rows[0], rows[2]])["node_bytes"] == pytest.approx(per_node + code / 399)


def test_sequential_transients_hold_one_weight_less_what_is_read_after_it():
    """A backend that converts its weights one at a time in the nodes' order (ggml) has one weight's temporaries in
    flight on top of the weights before it: the compile transient is the largest over the weights of its transient
    less what the weights read after it hold compiling. The order here: a 20 MiB kernel, a 10 MiB table, 30 MiB of
    other weights, 40 MiB of kernels (the 5 MiB weight last)."""
    order = ((20 * MIB, "kernel"), (10 * MIB, "table"), (25 * MIB, "weight"), (40 * MIB, "kernel"), (5 * MIB, "weight"))
    cost = replace(_cost(), weight_order=order)
    seq = replace(F, sequential_transients=True, table_factor=1.0)  # the table held once, compiling as running
    # the 5 MiB weight: 1 x 5; the 40 MiB kernels: 3 x 40 - 2 x 5 = 110; the 25 MiB: 25 - (4 x 40 + 2 x 5) < 0; the
    # table: none (kept as stored); the first kernel: 3 x 20 - (1 x 10 + 2 x 30 + 4 x 40) < 0
    assert transient_bytes(cost, seq, 4.0, 2.0, 1.0) == pytest.approx(110 * MIB)
    # the factors' own, where memory_phases takes them: compile 482 - (3 x 20 + 1 x 5) + 110 MiB
    assert memory_phases(cost, seq)[0] / MIB == pytest.approx(482 - 65 + 110)
    # without it (an older calibration, or a backend that compiles the whole graph at once) the largest kernel's and
    # the largest other weight's transients add wherever they come: 3 x 20 + 1 x 5
    assert transient_bytes(cost, F) == pytest.approx(65 * MIB)
    assert memory_phases(cost, F) == memory_phases(_cost(), F)
    # the same weights with the largest kernel last: its whole transient is in flight at the end
    last = replace(cost, weight_order=((5 * MIB, "weight"), (25 * MIB, "weight"), (10 * MIB, "table"),
                                       (40 * MIB, "kernel")))
    assert transient_bytes(last, seq, 4.0, 2.0, 1.0) == pytest.approx(120 * MIB)


def test_kernels_of_small_maps_are_held_as_stored_under_plain_conv_pixels():
    """A backend that routes convs on small maps so that their kernels stay as stored (``Factors.plain_conv_pixels``:
    ggml keeps Winograd's 16/9-sized kernels for larger maps only) counts those kernels with the other weights'
    factors, held and in flight; 0 keeps every dense kernel with the conv factors."""
    from sdrt.cost.model import conv_weight_bytes, held_order, largest_weights
    from sdrt.cost.nodes import NodeCost

    def conv(name, mib, px):
        return NodeCost(name, "Conv", "conv", 1e9, mib * MIB, 1.0, mib * MIB, pixels=px)

    nodes = [conv("deep", 40, 16), conv("wide", 20, 1024), NodeCost("mm", "MatMul", "matmul", 1e9, 0, 0, 5 * MIB)]
    cost = replace(_cost(), nodes=nodes, weight_bytes=65 * MIB, table_bytes=0.0, largest_conv_bytes=40 * MIB,
                   largest_weight_bytes=5 * MIB, weight_order=((40 * MIB, "kernel"), (20 * MIB, "kernel"),
                                                              (5 * MIB, "weight")),
                   weight_order_pixels=(16, 1024, 0))
    assert conv_weight_bytes(cost) == 60 * MIB and conv_weight_bytes(cost, 64) == 20 * MIB
    assert conv_weight_bytes(cost, 1024) == 0
    assert held_order(cost) == cost.weight_order
    assert held_order(cost, 64) == ((40 * MIB, "weight"), (20 * MIB, "kernel"), (5 * MIB, "weight"))
    assert largest_weights(cost) == (40 * MIB, 5 * MIB) and largest_weights(cost, 64) == (20 * MIB, 40 * MIB)
    # held: the 40 MiB kernel moves from the conv factor (2) to the weights' (1)
    f = replace(F, conv_weight_factor=2.0, weight_factor=1.0)
    small = replace(f, plain_conv_pixels=64)
    assert memory_phases(cost, f)[2] - memory_phases(cost, small)[2] == pytest.approx(40 * MIB)
    # no maps recorded (a cost from before the field): every kernel with the conv factors
    old = replace(cost, nodes=[replace(n, pixels=0) for n in nodes], weight_order_pixels=())
    assert memory_phases(old, small) == memory_phases(old, f)


def test_a_table_copied_one_weight_at_a_time_holds_its_source_only_while_it_is_copied():
    """ggml copies its weights one at a time: a lookup table's compile factor (fitted on the ``embedding`` case, the
    table alone: 2.1 x on Zen 5, the file's pages beside the copy) is the copy held (``table_factor``, as it runs) and
    the source in flight while it is copied. CLIP's table comes first, and the weights after it hold more than its
    source: the text encoders' compile peak is their run's (fp32 on Zen 5: 591 MiB measured, 736 predicted with the
    2.1 x held to the end)."""
    seq = replace(F, sequential_transients=True, table_factor=1.0, compile_table_factor=2.1, compile_weight_factor=1.0,
                  transient_factor=0.0, transient_conv_factor=0.0)
    alone = GraphCost("g", "fp32", [], 100 * MIB, 0.0, 0.0, table_bytes=100 * MIB,
                      weight_order=((100 * MIB, "table"),))
    bare = replace(alone, weight_bytes=0.0, table_bytes=0.0, weight_order=((1.0, "weight"),))
    # the table alone: its whole compile factor, as the case was fitted
    assert (memory_phases(alone, seq)[0] - memory_phases(bare, seq)[0]) / MIB == pytest.approx(210, abs=0.01)
    # the table first, then 300 MiB of other weights: the table held once, its source covered by what comes after
    first = replace(alone, weight_bytes=400 * MIB, weight_order=((100 * MIB, "table"), (300 * MIB, "weight")))
    assert (memory_phases(first, seq)[0] - memory_phases(bare, seq)[0]) / MIB == pytest.approx(100 + 300, abs=0.01)
    # a backend that compiles the whole graph at once keeps the fitted factor to the end
    whole = replace(seq, sequential_transients=False)
    assert (memory_phases(first, whole)[0] - memory_phases(bare, whole)[0]) / MIB == pytest.approx(210 + 300, abs=0.01)


def test_a_pinned_part_holds_the_pin_once_on_both_peaks():
    """``predict(pinned=True)``: a part whose shapes the process pinned first (a pipeline's) adds ``pin_bytes`` to
    both phases' peaks, not to what it holds once compiled (the planner counts it once, in the largest extra)."""
    f = replace(F, pin_bytes=12 * MIB)
    cpu = devices.find("cpu")
    free, pinned = predict(_cost(), cpu, "openvino", "fp32", f), predict(_cost(), cpu, "openvino", "fp32", f, pinned=True)
    assert pinned.compile_peak_bytes - free.compile_peak_bytes == pytest.approx(12 * MIB)
    assert pinned.run_peak_bytes - free.run_peak_bytes == pytest.approx(12 * MIB)
    assert pinned.peak_bytes - free.peak_bytes == pytest.approx(12 * MIB)
    assert pinned.resident_bytes == free.resident_bytes
