"""The cost model's terms for conv-kernel traffic, integer (host) work and shape arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.cost import devices
from sdrt.cost.calibrate import features, fit
from sdrt.cost.model import Factors, node_time_s, predict
from sdrt.cost.nodes import GraphCost, NodeCost, graph_costs
from sdrt.graph import Graph

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _graph(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return Graph.load(m.SerializeToString())


def test_shape_arithmetic_folds_at_pinned_shapes():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch exports a reshape: at pinned shapes only the
    Reshape (a view) and the MatMul remain; nothing of the shape chain is timed or held, unless the graph's
    dims are dynamic and the runtime keeps them so (``dynamic_shape_nodes``, at the fitted ``shape_node_s``)."""
    inits = [numpy_helper.from_array(np.array(2, np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus"),
             numpy_helper.from_array(np.zeros((8, 8), np.float32), "w")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["d"], axis=0),
             helper.make_node("Unsqueeze", ["d", "zero_axes"], ["du"]),
             helper.make_node("Concat", ["minus", "du"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["y"])]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero_axes"))
    g = _graph(nodes, [helper.make_tensor_value_info("x", F, [2, 4, 8])], [helper.make_tensor_value_info("y", F, None)],
               inits)
    c = graph_costs(g)
    assert [n.op for n in c.nodes if n.op_class != "view"] == ["MatMul"]
    assert c.dynamic_shape_nodes == 0  # static inputs: no runtime runs the chain
    dyn = _graph(nodes, [helper.make_tensor_value_info("x", F, ["b", 4, 8])], [helper.make_tensor_value_info("y", F, None)],
                 inits)
    c = graph_costs(dyn, {"x": (2, 4, 8)})
    assert [n.op for n in c.nodes if n.op_class != "view"] == ["MatMul"]
    assert c.dynamic_shape_nodes == 4  # Shape, Gather, Unsqueeze, Concat: run every call where dims stay dynamic
    f = Factors({"matmul": 1.0}, {}, additive=True, bandwidth_bytes_per_s=1e10, weight_bandwidth_efficiency=1.0,
                shape_node_s=5e-6)
    cpu = devices.find("cpu")
    assert predict(c, cpu, "openvino", "fp32", f).by_class_ms["shapes"] == pytest.approx(4 * 5e-3)
    assert features(c, 1e11, 1e10)["shape_nodes"] == 4
    assert features(c, 1e11, 1e10)["dyn_nodes"] == 1  # the MatMul: its shapes inferred every call
    f.dynamic_node_s = 2e-6
    assert predict(c, cpu, "openvino", "fp32", f).by_class_ms["shapes"] == pytest.approx(4 * 5e-3 + 2e-3)


def test_conv_batch_is_its_input_images():
    g = _graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
               [helper.make_tensor_value_info("x", F, [2, 4, 6, 6])], [helper.make_tensor_value_info("y", F, None)],
               [numpy_helper.from_array(np.zeros((4, 4, 3, 3), np.float32), "w")])
    (n,) = graph_costs(g).nodes
    assert (n.batch, n.time_class) == (2, "conv")
    assert features(graph_costs(g), 1e11, 1e10)["conv_weight_batch_ms"] == pytest.approx(1000 * 4 * 4 * 4 * 9 / 1e10)


def test_integer_work_on_token_ids_is_its_own_timing_class():
    """Equal/Cast/ArgMax on int64 ids are ``int`` nodes (a runtime may run them on the host); the Gather they
    feed writes floats and keeps its class."""
    nodes = [helper.make_node("Equal", ["ids", "eos"], ["e"]),
             helper.make_node("Cast", ["e"], ["ei"], to=I64),
             helper.make_node("ArgMax", ["ei"], ["pos"], axis=-1, keepdims=0),
             helper.make_node("Gather", ["x", "pos"], ["y"], axis=1)]
    g = _graph(nodes, [helper.make_tensor_value_info("x", F, [1, 77, 16]), helper.make_tensor_value_info("ids", I64, [1, 77])],
               [helper.make_tensor_value_info("y", F, None)], [numpy_helper.from_array(np.array(3, np.int64), "eos")])
    c = graph_costs(g)
    kinds = {n.op: n.time_class for n in c.nodes}
    assert kinds == {"Equal": "int", "Cast": "int", "ArgMax": "int", "Gather": "data"}
    feats = features(c, 1e11, 1e10)
    assert (feats["int_nodes"], feats["nodes"]) == (3, 1)


def test_conv_kernels_stream_at_their_own_efficiency():
    """A 3x3 conv's kernel bytes take ``conv_weight_bandwidth_efficiency`` (and, per image after the first,
    the per-image one); a 1x1 conv's and a matmul's take the weights' efficiency; without the conv term (an
    older calibration) both take the weights'."""
    cpu = devices.find("cpu")
    f = Factors({"conv": 1.0, "conv1x1": 1.0, "matmul": 1.0}, {}, additive=True, bandwidth_bytes_per_s=1e10,
                weight_bandwidth_efficiency=1.0, conv_weight_bandwidth_efficiency=0.25)
    conv3 = node_time_s("conv", 0.0, 1e8, cpu, "fp32", f, weight_bytes=1e8, time_class="conv")
    conv1 = node_time_s("conv", 0.0, 1e8, cpu, "fp32", f, weight_bytes=1e8, time_class="conv1x1")
    assert conv3 == pytest.approx(1e8 / 2.5e9) and conv1 == pytest.approx(1e8 / 1e10)
    # a conv over 3 images that reads its kernel once per image: twice more at the per-image efficiency
    f.conv_weight_batch_bandwidth_efficiency = 0.5
    conv3_b3 = node_time_s("conv", 0.0, 1e8, cpu, "fp32", f, weight_bytes=1e8, time_class="conv", batch=3)
    assert conv3_b3 == pytest.approx(conv3 + 2 * 1e8 / 5e9)
    assert node_time_s("conv", 0.0, 1e8, cpu, "fp32", f, weight_bytes=1e8, time_class="conv1x1", batch=3) == conv1
    f.conv_weight_bandwidth_efficiency = None
    assert node_time_s("conv", 0.0, 1e8, cpu, "fp32", f, weight_bytes=1e8, time_class="conv") == pytest.approx(conv1)


def _synthetic_rows():
    """Cases made from known factors: 3x3 kernels at 0.4 of the bandwidth, other weights at 1.0, 2 us per node,
    each image after the first reads the kernels again at 0.5, 8 us per integer node, 3 us per node of dynamic
    shape arithmetic, 10 us per call."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(12):
        feats = {"flops_matmul": float(rng.uniform(0, 5)), "flops_conv": float(rng.uniform(0, 5)),
                 "weight_ms": float(rng.uniform(0, 5)), "conv_weight_ms": float(rng.uniform(0, 5)) * (i % 2),
                 "conv_weight_batch_ms": float(rng.uniform(0, 5)) * (i % 4 == 1),
                 "nodes": float(rng.integers(1, 50)), "int_nodes": float(rng.integers(0, 30)) * (i % 3 == 0),
                 "shape_nodes": float(rng.integers(0, 40)) * (i % 3 == 1), "call": 1.0, "fixed_ms": 0.0}
        ms = (feats["flops_matmul"] / 0.8 + feats["flops_conv"] / 0.6 + feats["weight_ms"] / 1.0
              + feats["conv_weight_ms"] / 0.4 + feats["conv_weight_batch_ms"] / 0.5 + 0.002 * feats["nodes"]
              + 0.008 * feats["int_nodes"] + 0.003 * feats["shape_nodes"] + 0.01)
        rows.append({"case": f"c{i}", "features": feats, "robust_ms": ms, "weight_bytes": 0.0,
                     "activation_bytes": 0.0, "peak_bytes": 1e6})
    return rows


def test_fit_separates_conv_kernel_traffic_and_integer_nodes():
    got = fit(_synthetic_rows(), 1e10, "test")
    assert got.conv_weight_bandwidth_efficiency == pytest.approx(0.4, rel=1e-3)
    assert got.weight_bandwidth_efficiency == pytest.approx(1.0, rel=1e-3)
    assert got.conv_weight_batch_bandwidth_efficiency == pytest.approx(0.5, rel=1e-3)
    assert got.overhead_s["int"] == pytest.approx(8e-6, rel=1e-3)
    assert got.shape_node_s == pytest.approx(3e-6, rel=1e-3)
    assert got.overhead_s["matmul"] == pytest.approx(2e-6, rel=1e-3)
    # the fitted factors put an int node's fixed cost into a prediction
    cost = GraphCost("g", "fp32", [NodeCost("a", "ArgMax", "elementwise", 0.0, 0.0, 0.0, 0.0, kind="int")], 0.0, 0.0,
                     0.0)
    assert predict(cost, devices.find("cpu"), "ggml", "fp32", got).ms == pytest.approx(0.008 + 0.01, rel=1e-3)


def test_attention_traffic_is_its_own_term(tmp_path):
    """Attention's matmuls and softmax (the scores) stream at their own efficiency, apart from the other activations:
    the calibration's attention as torch exports it (heads by Reshape and Transposes, the scale's root on Q and on K)
    puts its scores' traffic in ``attn_act_ms`` and its head transposes' nowhere (in ``data_ms`` where the backend
    copies them); a calibration without the term
    (None) keeps the activations' efficiency."""
    from sdrt.cost.calibrate import build_case

    model, feeds = build_case("attn_sdpa")  # 2 x 4 heads of 1024 x 1024 scores, two layers
    path = tmp_path / "sdpa.onnx"
    path.write_bytes(model.SerializeToString())
    cost = graph_costs(Graph.load(path), {k: v.shape for k, v in feeds.items()}, "fp32")
    att = [n for n in cost.nodes if n.op_class == "attention"]
    assert sorted(n.op for n in att) == ["MatMul"] * 4 + ["Softmax"] * 2
    scores = 2 * 4 * 1024 * 1024 * 4
    # each layer: QK^T writes the scores, the softmax reads and writes them, @ V reads them (+ Q, K, V and the output)
    assert sum(n.bytes_written for n in att if n.op == "Softmax") == 2 * scores
    feats = features(cost, 1e12, 1e10)
    assert feats["attn_act_ms"] == pytest.approx(1000 * sum(n.bytes for n in att) / 1e10)
    # its head transposes: strides of the attention on a CPU, copies where the backend makes operands dense (ggml's GPUs)
    assert feats["act_ms"] < 0.01 * feats["attn_act_ms"] and feats["data_ms"] == 0
    heads = [n for n in cost.nodes if n.head]
    # K and V split once (both layers read them), Q split and the heads merged in each layer
    assert len(heads) == 2 + 2 * 2 and all(n.op == "Transpose" for n in heads)
    assert features(cost, 1e12, 1e10, dense_heads=True)["data_ms"] == pytest.approx(
        1000 * sum(n.bytes for n in heads) / 1e10)
    cpu = devices.find("cpu")
    base = Factors({"attention": 1.0}, {"attention": 0.0}, additive=True, bandwidth_bytes_per_s=1e10,
                   bandwidth_efficiency=1.0, weight_bandwidth_efficiency=1.0)
    own = Factors(**{**base.to_dict(), "attention_bandwidth_efficiency": 0.5})
    t, t2 = (node_time_s("attention", 0.0, 1e8, cpu, "fp32", f) for f in (base, own))
    assert t == pytest.approx(1e8 / 1e10) and t2 == pytest.approx(2 * t)
    assert node_time_s("elementwise", 0.0, 1e8, cpu, "fp32", own) == pytest.approx(t)


def test_a_fused_attention_has_its_own_fixed_cost():
    """Attention's matmuls and softmax count as ``attn_nodes`` too (one fused attention's fixed cost on top of a node's:
    OpenVINO runs each as one subgraph, ~12 us at test width where a tiny matmul node takes 1-3); the fit's coefficient
    goes to the attention and softmax classes' fixed cost, and no other class's."""
    x = [helper.make_tensor_value_info(n, F, [1, 8, 16]) for n in ("q", "kt", "v")]
    x[1] = helper.make_tensor_value_info("kt", F, [1, 16, 8])
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"]), helper.make_node("Relu", ["o"], ["y"])]
    cost = graph_costs(_graph(nodes, x, [helper.make_tensor_value_info("y", F, None)]), precision="fp32")
    feats = features(cost, 1e12, 1e10)
    assert feats["attn_nodes"] == 3 and feats["nodes"] == 3  # the Relu is the matmul's epilogue (fused)
    rows = [{"case": f"c{i}", "features": {"nodes": float(n), "attn_nodes": float(a), "call": 1.0},
             "robust_ms": 0.001 * n + 0.01 * a + 0.02, "weight_bytes": 0.0, "activation_bytes": 0.0,
             "peak_bytes": 0.0, "peak_rss": 1.0} for i, (n, a) in enumerate([(400, 0), (100, 36), (75, 36), (10, 3)])]
    f = fit(rows, 1e10, "openvino")
    assert f.overhead_s["attention"] == f.overhead_s["softmax"] == pytest.approx(11e-6)
    assert f.overhead_s["matmul"] == pytest.approx(1e-6) and f.call_s == pytest.approx(2e-5)


def test_narrow_heads_and_short_rows_cost_as_the_attention_kernel_works():
    """QK^T over 4-wide heads costs a 16-long dot product per score (``MIN_DOT``: OpenVINO ran 2-, 4- and 8-wide heads at
    the same time per score), its reported FLOPs stay the true ones; P @ V reduces over 16 keys, unpadded. The softmax's
    rows (8 queries x 2 heads) are its ``rows``, counted as ``attn_rows`` and fitted as the seconds per row that
    ``predict`` adds to attention."""
    from sdrt.cost.nodes import MIN_DOT

    x = [helper.make_tensor_value_info("q", F, [2, 8, 4]), helper.make_tensor_value_info("kt", F, [2, 4, 16]),
         helper.make_tensor_value_info("v", F, [2, 16, 4])]
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    cost = graph_costs(_graph(nodes, x, [helper.make_tensor_value_info("y", F, None)]), precision="fp32")
    qk, sm, pv = cost.nodes
    assert qk.flops == 2 * 2 * 8 * 16 * 4 and qk.timed_flops == qk.flops * MIN_DOT / 4
    assert pv.timed_flops == pv.flops == 2 * 2 * 8 * 4 * 16
    assert (qk.rows, sm.rows, pv.rows) == (0, 16, 0)
    feats = features(cost, 1e12, 1e10)
    assert feats["attn_rows"] == 16
    assert feats["flops_attention"] == pytest.approx(1000 * (qk.timed_flops + pv.flops) / 1e12)
    rows = [{"case": f"c{i}", "features": {"attn_rows": float(r), "call": 1.0}, "robust_ms": 1e-5 * r + 0.02,
             "weight_bytes": 0.0, "activation_bytes": 0.0, "peak_bytes": 0.0, "peak_rss": 1.0}
            for i, r in enumerate([16384, 65536, 1848, 100])]
    f = fit(rows, 1e10, "openvino")
    assert f.attention_row_s == pytest.approx(1e-8)
    cpu = devices.this_cpu()
    plain = Factors({"attention": 1.0, "softmax": 1.0}, {}, additive=True, bandwidth_bytes_per_s=1e10,
                    weight_bandwidth_efficiency=1.0)
    per_row = Factors(**{**plain.to_dict(), "attention_row_s": 1e-6})
    assert predict(cost, cpu, "openvino", "fp32", per_row).ms == pytest.approx(
        predict(cost, cpu, "openvino", "fp32", plain).ms + 16e-3)


def test_a_calibration_without_narrow_matmuls_times_them_as_matmuls():
    """A calibration stored before the ``matmul_narrow`` class (or fitted from cases without one) times a narrow
    matmul at the matmuls' efficiency, never as free work; one fitted with it, at its own."""
    g = _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F, [1, 77, 256])],
               [helper.make_tensor_value_info("y", F, None)],
               [numpy_helper.from_array(np.zeros((256, 256), np.float32), "w")])
    c = graph_costs(g)
    assert [n.time_class for n in c.nodes] == ["matmul_narrow"]
    flops_ms = 1000 * c.nodes[0].flops / devices.find("cpu").peak("fp32")
    t_old, t_narrow = (_class_ms(c, eff, "matmul") for eff in ({"matmul": 0.5}, {"matmul": 0.5, "matmul_narrow": 0.1}))
    assert t_narrow - t_old == pytest.approx(flops_ms * (1 / 0.1 - 1 / 0.5), rel=1e-6)
    assert "matmul_narrow" in _fitted_classes(c)
    wide = _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F, [1, 512, 256])],
                  [helper.make_tensor_value_info("y", F, None)],
                  [numpy_helper.from_array(np.zeros((256, 256), np.float32), "w")])
    assert "matmul_narrow" not in _fitted_classes(graph_costs(wide))


def _class_ms(cost, efficiency, op_class):
    """``cost``'s predicted time in ``op_class`` with these FLOPs efficiencies (traffic at 10 GB/s) on the library CPU."""
    f = Factors(efficiency, {}, additive=True, bandwidth_bytes_per_s=1e10, weight_bandwidth_efficiency=1.0)
    return predict(cost, devices.find("cpu"), "openvino", "fp32", f).by_class_ms[op_class]


def _fitted_classes(cost):
    """The FLOPs efficiencies a calibration of ``cost`` alone (1 ms) fits: a time class it has no node of is left out."""
    mem = {"weight_bytes": 0.0, "activation_bytes": 0.0, "peak_bytes": 0.0, "peak_rss": 1.0}
    row = {"features": features(cost, devices.find("cpu").peak("fp32"), 1e10), "robust_ms": 1.0, "case": "one", **mem}
    return fit([row], 1e10, "openvino").efficiency


def _conv(channels: int, size: int, ks: int = 3):
    return _graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[ks // 2] * 4)],
                  [helper.make_tensor_value_info("x", F, [1, channels, size, size])],
                  [helper.make_tensor_value_info("y", F, None)],
                  [numpy_helper.from_array(np.zeros((channels, channels, ks, ks), np.float32), "w")])


def test_a_conv_past_the_cache_is_timed_as_large():
    """A dense conv whose input and output pass ``LARGE_CONV_BYTES`` is ``conv_large`` (its kernels still stream as a
    conv's); a 1x1 conv, one of 16 channels or fewer, or a small map stays in its class. A calibration without large
    convs times them at the convs' efficiency; one fitted with them, at their own."""
    from sdrt.cost.nodes import LARGE_CONV_BYTES

    def kinds(channels, size, ks=3, precision="fp32"):
        return [n.time_class for n in graph_costs(_conv(channels, size, ks), precision=precision).nodes]

    assert kinds(512, 64) == ["conv_large"]  # 2 x 8 MiB float32
    assert 2 * 512 * 32 * 32 * 4 <= LARGE_CONV_BYTES and kinds(512, 32) == ["conv"]
    assert kinds(512, 64, precision="bf16") == ["conv_large"]  # 2 x 4 MiB
    assert kinds(256, 64, precision="bf16") == ["conv"]  # 2 x 2 MiB: in the cores' L2
    assert kinds(512, 64, ks=1) == ["conv1x1"]
    assert kinds(16, 256) == ["conv"]  # 2 x 4 MiB, but 16 channels: traffic, not arithmetic
    big = graph_costs(_conv(512, 64))
    cpu = devices.find("cpu")
    feats = features(big, cpu.peak("fp32"), 1e10)
    assert feats["flops_conv_large"] > 0 and feats["flops_conv"] == 0 and feats["conv_weight_ms"] > 0
    flops_ms = 1000 * big.nodes[0].flops / cpu.peak("fp32")
    t_old, t_large = (_class_ms(big, eff, "conv") for eff in ({"conv": 0.8}, {"conv": 0.8, "conv_large": 0.4}))
    assert t_large - t_old == pytest.approx(flops_ms * (1 / 0.4 - 1 / 0.8), rel=1e-6)
    assert "conv_large" in _fitted_classes(big)
    assert "conv_large" not in _fitted_classes(graph_costs(_conv(512, 32)))


def test_node_cases_run_over_a_text_encoders_rows_and_old_reports_refit_as_measured(tmp_path):
    """The per-node cases are 32 x 32 matmuls over 77 rows (a text encoder's tokens: a node a runtime splits over its
    threads; over 8 rows OpenVINO ran each on one thread at a third of the cost), and a stored measurement refits with
    the case it measured: its recorded ``args``, else, for a report from before they were recorded, 8 rows."""
    from sdrt.cost.calibrate import case_cost, measured_args

    _, _, feeds, now = case_cost("nodes", tmp_path, "fp32")
    assert feeds["x"].shape == (1, 77, 32) and sum(n.op == "MatMul" for n in now.nodes) == 400
    old_args = measured_args({"case": "cal_nodes"})
    assert old_args == (400, 8)
    _, _, old_feeds, old = case_cost("nodes", tmp_path, "fp32", args=old_args)
    assert old_feeds["x"].shape == (1, 8, 32) and old.flops == pytest.approx(now.flops * 8 / 77)
    assert measured_args({"case": "cal_nodes", "args": [400, 77]}) == (400, 77)
    assert measured_args({"case": "cal_conv3_320x32"}) is None  # unchanged cases build as CASE_SPECS has them
    _, _, dyn_feeds, _ = case_cost("nodes_dyn", tmp_path, "fp32", args=measured_args({"case": "cal_nodes_dyn"}))
    assert dyn_feeds["x"].shape == (1, 8, 32)
