"""Per-node costs against hand-computed values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.cost.nodes import WEIGHT_BYTES, graph_costs
from sdrt.errors import SdrtError
from sdrt.graph import Graph


def _graph(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return Graph.load(m.SerializeToString())


def _w(name, shape):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


F = TensorProto.FLOAT


def test_conv_flops_bytes_and_weights():
    # 3x3 conv, 16 -> 32 channels, 20x20 input, pad 1, bias: out 1x32x20x20
    g = _graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
               [helper.make_tensor_value_info("x", F, [1, 16, 20, 20])], [helper.make_tensor_value_info("y", F, None)],
               [_w("w", (32, 16, 3, 3)), _w("b", (32,))])
    c = graph_costs(g)
    (n,) = c.nodes
    assert n.op_class == "conv"
    assert n.flops == 2 * (32 * 20 * 20) * (16 * 9)  # 2 x outputs x (Cin x kh x kw)
    assert n.bytes_read == 4 * (16 * 400) + 4 * (32 * 16 * 9) + 4 * 32
    assert n.bytes_written == 4 * 32 * 400
    assert c.weight_bytes == 4 * (32 * 16 * 9 + 32)
    # at fp16 the kernel and activations halve; q4_0: 18 bytes per 32 kernel values, the bias stays fp16
    h = graph_costs(g, precision="fp16")
    assert h.weight_bytes == 2 * (32 * 16 * 9 + 32)
    q = graph_costs(g, precision="q4_0")
    assert q.weight_bytes == pytest.approx(32 * 16 * 9 * 18 / 32 + 2 * 32)


def test_grouped_conv_counts_per_group():
    g = _graph([helper.make_node("Conv", ["x", "w"], ["y"], group=8, pads=[1, 1, 1, 1])],
               [helper.make_tensor_value_info("x", F, [1, 8, 10, 10])], [helper.make_tensor_value_info("y", F, None)],
               [_w("w", (8, 1, 3, 3))])
    assert graph_costs(g).nodes[0].flops == 2 * 8 * 100 * 9  # depthwise: 9 MACs per output


def test_matmul_and_gemm():
    g = _graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                helper.make_node("Reshape", ["h", "shape"], ["h2"]),
                helper.make_node("Gemm", ["h2", "w2", "b2"], ["y"], transB=1)],
               [helper.make_tensor_value_info("x", F, [2, 77, 64])], [helper.make_tensor_value_info("y", F, None)],
               [_w("w", (64, 128)), _w("w2", (10, 128)), _w("b2", (10,)),
                numpy_helper.from_array(np.array([154, 128], np.int64), "shape")])
    c = graph_costs(g)
    mm, reshape, gemm = c.nodes
    assert (mm.op_class, gemm.op_class, reshape.op_class) == ("matmul", "matmul", "view")
    assert mm.flops == 2 * 2 * 77 * 128 * 64
    assert gemm.flops == 2 * 154 * 10 * 128 + 154 * 10  # plus the bias add
    assert reshape.bytes_read == reshape.bytes_written == 0


def test_a_weight_matmul_over_few_rows_is_timed_as_narrow():
    """A weight matmul over fewer than NARROW_ROWS rows (a text encoder's 77 tokens, batch 1 or 2) has its own timing
    class; from NARROW_ROWS rows up, and a matmul of two activations, keep theirs."""
    from sdrt.cost.nodes import NARROW_ROWS

    def kinds(rows):
        g = _graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("MatMul", ["h", "hT"], ["s"])],
                   [helper.make_tensor_value_info("x", F, [1, rows, 64]),
                    helper.make_tensor_value_info("hT", F, [1, 128, rows])],
                   [helper.make_tensor_value_info("s", F, None)], [_w("w", (64, 128))])
        return [n.time_class for n in graph_costs(g).nodes]

    assert kinds(77) == ["matmul_narrow", "attention"]
    assert kinds(NARROW_ROWS - 1) == ["matmul_narrow", "attention"]
    assert kinds(NARROW_ROWS) == ["matmul", "attention"]
    gemm = _graph([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)],
                  [helper.make_tensor_value_info("x", F, [154, 64])], [helper.make_tensor_value_info("y", F, None)],
                  [_w("w", (10, 64))])
    assert [n.time_class for n in graph_costs(gemm).nodes] == ["matmul_narrow"]


def test_attention_pattern_and_liveness():
    """softmax(Q K^T * s) V with Q, K, V activations: both matmuls are attention, not weights."""
    b, s, d = 4, 64, 32
    g = _graph([helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
                helper.make_node("MatMul", ["q", "kt"], ["sc"]),
                helper.make_node("Mul", ["sc", "scale"], ["ss"]),
                helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
                helper.make_node("MatMul", ["p", "v"], ["o"])],
               [helper.make_tensor_value_info(n, F, [b, s, d]) for n in "qkv"],
               [helper.make_tensor_value_info("o", F, None)],
               [numpy_helper.from_array(np.array(0.1, np.float32), "scale")])
    c = graph_costs(g)
    by = {n.op: n for n in c.nodes}
    classes = [n.op_class for n in c.nodes]
    assert classes == ["data", "attention", "elementwise", "attention", "attention"]
    assert c.nodes[1].flops == 2 * b * s * s * d  # QK^T
    assert c.nodes[4].flops == 2 * b * s * d * s  # PV
    assert by["Softmax"].flops == 5 * b * s * s
    assert c.weight_bytes == 4  # the scale only
    # by hand, in node order (q, k, v alive at the start; a value dies after its last reader):
    # Transpose: q k v kt = 4 x bsd, then k dies; QK^T: q kt v sc = 3 bsd + bss, then q, kt die;
    # Mul: v sc ss = bsd + 2 bss; Softmax: v ss p = bsd + 2 bss; PV: v p o = 2 bsd + bss
    bsd, bss = b * s * d, b * s * s
    assert c.peak_activation_bytes == 4 * max(4 * bsd, 3 * bsd + bss, bsd + 2 * bss, 2 * bsd + bss)


def test_graph_that_folds_its_weights_counts_them_as_weights():
    """torch's dynamo exporter writes Linear as MatMul(x, Transpose(W)): still a weight matmul."""
    g = _graph([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"])],
               [helper.make_tensor_value_info("x", F, [1, 8, 16])], [helper.make_tensor_value_info("y", F, None)],
               [_w("w", (24, 16))])
    c = graph_costs(g, precision="q8_0")
    (mm,) = c.nodes  # the Transpose folds at compile time: no node
    assert mm.op_class == "matmul" and mm.flops == 2 * 8 * 24 * 16
    assert c.weight_bytes == pytest.approx(24 * 16 * WEIGHT_BYTES["q8_0"])


def test_sd_unet_macs_match_an_independent_count():
    """The bench SD 1.x UNet: Conv/MatMul/Gemm FLOPs equal 2 x the multiply-adds that onnx's own shape
    inference gives (counted here independently), and its weights are its parameters x 4 bytes."""
    from onnx import shape_inference

    from sdrt.testing import models

    model, feeds = models.build("unet", "tiny")
    m = shape_inference.infer_shapes(model, data_prop=True)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in [*m.graph.input, *m.graph.value_info, *m.graph.output]}
    shapes.update({t.name: list(t.dims) for t in m.graph.initializer})
    macs = 0
    for n in m.graph.node:
        if n.op_type == "Conv":
            macs += int(np.prod(shapes[n.output[0]])) * int(np.prod(shapes[n.input[1]][1:]))
        elif n.op_type in ("MatMul", "Gemm"):
            macs += int(np.prod(shapes[n.output[0]])) * shapes[n.input[0]][-1]
    c = graph_costs(Graph.load(model.SerializeToString()), {k: v.shape for k, v in feeds.items()})
    counted = sum(n.flops for n in c.nodes if n.op in ("Conv", "MatMul", "Gemm"))
    gemm_bias = sum(n.flops - 2 * (n.flops // 2) for n in c.nodes if n.op == "Gemm")
    assert counted - gemm_bias == pytest.approx(2 * macs, rel=1e-3)
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert c.weight_bytes == 4 * params
    assert {n.op_class for n in c.nodes} >= {"conv", "matmul", "attention", "norm", "elementwise", "data"}


def test_sd15_unet_full_size_flops():
    """SD 1.x's UNet at 512x512 (64x64 latents), built without weights: about 400 G multiply-adds per row,
    the figure the SD 1.5 literature gives (e.g. the SnapFusion and MobileDiffusion papers' ~0.4 TMACs)."""
    from unittest import mock

    from sdrt.testing import models
    from sdrt.testing.builder import Builder

    class ShapeOnly(Builder):
        def param(self, name, shape, std=None, fill=None):
            self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
            return name

        def _shift_param(self, name, offset):
            pass

    with mock.patch.object(models, "Builder", ShapeOnly):
        model, _ = models.unet("full")
    g = Graph.load(model.SerializeToString())
    shapes = {i.name: tuple(d if isinstance(d, int) else 1 for d in i.shape) for i in g.inputs}
    c = graph_costs(g, shapes)
    gmacs = sum(n.flops for n in c.nodes if n.op_class in ("conv", "matmul", "attention") and n.op != "Softmax") / 2e9
    assert 330 < gmacs < 440


def test_dynamic_inputs_must_be_pinned():
    g = _graph([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, ["n", 4])],
               [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(SdrtError, match="dynamic dims"):
        graph_costs(g)
    assert graph_costs(g, {"x": (3, 4)}).nodes[0].flops == 12
    with pytest.raises(SdrtError, match="unknown precision"):
        graph_costs(g, {"x": (3, 4)}, precision="fp12")


def test_onnx_is_imported():  # keeps the import used for readers
    assert onnx.__version__


def test_embedding_lookup_reads_only_the_rows_taken():
    g = _graph([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
               [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 77])],
               [helper.make_tensor_value_info("y", F, None)], [_w("table", (1000, 64))])
    c = graph_costs(g)
    assert c.nodes[0].weight_bytes == 4 * 77 * 64  # 77 rows read
    assert c.weight_bytes == 4 * 1000 * 64  # the whole table stays resident


def test_a_table_left_mapped_from_its_file_is_listed_with_its_offset(tmp_path):
    """A lookup table sdrt maps from the model's files (``Graph.external_refs``) is listed with where it lies, so
    that a backend that runs tables from the mapped file (ggml, where the offset suits it) is not charged for them:
    a large inline table at its offset in the .onnx file (as CLIP-L's; a model's external data over 2 GiB stays
    mapped too, as SDXL's second text encoder's), and not one parsed from bytes."""
    table = np.arange(4096 * 128, dtype=np.float32).reshape(4096, 128)  # 2 MiB: mapped, not read in
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 77])], [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(table, "table")]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "model.onnx")
    graph = Graph.load(tmp_path / "model.onnx")
    ref = graph.external_refs["table"]
    assert ref is not None and ref.length == table.nbytes
    assert graph_costs(graph).mapped_tables == ((float(table.nbytes), ref.offset),)
    assert graph_costs(Graph.load(model.SerializeToString())).mapped_tables == ()


def test_memory_fields_tables_largest_kernels_and_fused_attention(tmp_path):
    """Lookup tables, the largest conv kernel / other weight, and the activations' peak without attention's
    scores, on the calibration's own graphs (hand-computed sizes)."""
    from sdrt.cost.calibrate import build_case

    def cost(case):
        model, feeds = build_case(case)
        path = tmp_path / f"{case}.onnx"
        path.write_bytes(model.SerializeToString())
        return graph_costs(Graph.load(path), {k: v.shape for k, v in feeds.items()}, "fp32")

    emb = cost("embedding")
    # a table is kept as stored, never transformed: not the largest weight in flight (the LayerNorm's 768 are)
    assert emb.table_bytes == 49408 * 768 * 4 and emb.largest_weight_bytes == 768 * 4 and emb.largest_conv_bytes == 0
    assert emb.weight_order == ((49408 * 768 * 4, "table"), (768 * 4, "weight"), (768 * 4, "weight"))
    conv = cost("conv3_640x16")  # three 640x640x3x3 kernels
    assert conv.largest_conv_bytes == 640 * 640 * 9 * 4 and conv.table_bytes == 0
    assert conv.largest_weight_bytes == 640 * 4  # a bias: the largest weight that is not a 3x3 kernel
    assert conv.weight_order == ((640 * 640 * 9 * 4, "kernel"), (640 * 4, "weight")) * 3  # in the order nodes read them
    # each kernel's map (16 x 16 output pixels), for a backend that keeps the kernels of small maps as stored
    assert conv.weight_order_pixels == (256, 0) * 3
    assert [n.pixels for n in conv.nodes if n.op == "Conv"] == [256] * 3
    att = cost("attn_1024x8")  # 8 heads x 1024 x 1024 scores: counted by liveness, not when attention fuses
    scores = 8 * 1024 * 1024 * 4
    assert att.peak_activation_bytes >= 2 * scores
    assert att.peak_activation_bytes_fused < scores / 4


def test_inplace_liveness_and_inputs_outputs():
    """x -> Relu -> Sigmoid -> Tanh -> + x -> ReduceSum, the input read to the end: without reuse two of the
    4 KiB values live beside it (3 x 4 KiB at the peak); in place, Sigmoid, Tanh and the Add write into the value
    that dies at them (2 x 4 KiB); the graph input is never written into. Inputs and outputs are counted apart."""
    g = _graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
                helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Add", ["c", "x"], ["d"]),
                helper.make_node("ReduceSum", ["d"], ["y"], keepdims=0)],
               [helper.make_tensor_value_info("x", F, [1, 1024])], [helper.make_tensor_value_info("y", F, None)])
    c = graph_costs(g)
    assert c.peak_activation_bytes == 3 * 4096
    assert c.peak_activation_bytes_inplace == 2 * 4096
    assert (c.input_bytes, c.output_bytes) == (4096, 4)


def test_inplace_silu_and_shape_readers():
    """a = x @ W (1 x 1024 floats, 4 KiB, from a 256-byte input); SiLU as torch exports it (s = Sigmoid(a),
    m = a * s); y = ReduceSum(m); and a Shape node at the end reading a. Without reuse a, s and m live at the
    Mul (3 x 4 KiB). In place, the sigmoid is fused into the Mul (never held) and the Mul writes into a, which
    dies at it: the Shape node keeps nothing alive (were it to hold a, m would need its own 4 KiB), so the
    peak is the matmul's input and output (256 B + 4 KiB)."""
    g = _graph([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Sigmoid", ["a"], ["s"]),
                helper.make_node("Mul", ["a", "s"], ["m"]), helper.make_node("ReduceSum", ["m"], ["y"], keepdims=0),
                helper.make_node("Shape", ["a"], ["sh"])],
               [helper.make_tensor_value_info("x", F, [1, 64])],
               [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("sh", TensorProto.INT64,
                                                                                          None)],
               [_w("w", (64, 1024))])
    c = graph_costs(g)
    assert c.peak_activation_bytes == 3 * 4096
    assert c.peak_activation_bytes_inplace == 4096 + 256


def test_matmuls_with_a_fused_activation():
    """x @ W1 + b1 -> Relu -> @ W2 + b2 -> + x (a residual): W1's matmul has an activation epilogue (past its
    bias), W2's only a residual add, so only W1's 64 x 128 floats count."""
    g = _graph([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
                helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
                helper.make_node("Add", ["o", "b2"], ["ob"]), helper.make_node("Add", ["ob", "x"], ["y"])],
               [helper.make_tensor_value_info("x", F, [1, 8, 64])], [helper.make_tensor_value_info("y", F, None)],
               [_w("w1", (64, 128)), _w("b1", (128,)), _w("w2", (128, 64)), _w("b2", (64,))])
    assert graph_costs(g).epilogue_weight_bytes == 4 * 64 * 128


def test_relayout_bytes_of_narrow_convs_regrouped():
    """Two 3x3 convs on an 8x8 map: one to 16 channels read by a GroupNorm-style Reshape to (N, 4, -1) (16 channels:
    narrow, 2 x 16 x 64 floats copied), one to 32 channels reaching a Reshape to (N, 8, -1) past a scale (a fused
    epilogue: 2 x 32 x 64 floats), and a Reshape that keeps the channels (N, 32, 64): no copy. The predicted time
    adds each at its fitted efficiency; the largest copy (32 x 64 floats) is what memory counts."""
    from sdrt.cost.devices import this_cpu
    from sdrt.cost.model import Factors, predict

    shape_g = numpy_helper.from_array(np.array([0, 4, -1], np.int64), "g4")
    shape_h = numpy_helper.from_array(np.array([0, 8, -1], np.int64), "g8")
    shape_k = numpy_helper.from_array(np.array([0, 32, -1], np.int64), "keep")
    g = _graph([helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4),
                helper.make_node("Reshape", ["a", "g4"], ["ra"]),
                helper.make_node("Conv", ["a", "w2"], ["b"], pads=[1] * 4),
                helper.make_node("Mul", ["b", "s"], ["bs"]),
                helper.make_node("Reshape", ["bs", "g8"], ["rb"]),
                helper.make_node("Reshape", ["bs", "keep"], ["rk"])],
               [helper.make_tensor_value_info("x", F, [1, 8, 8, 8])],
               [helper.make_tensor_value_info(o, F, None) for o in ("ra", "rb", "rk")],
               [_w("w1", (16, 8, 3, 3)), _w("w2", (32, 16, 3, 3)), _w("s", (1,)), shape_g, shape_h, shape_k])
    c = graph_costs(g)
    assert c.relayout_narrow_bytes == 2 * 16 * 64 * 4
    assert c.relayout_bytes == 2 * 32 * 64 * 4
    assert c.largest_relayout_bytes == 32 * 64 * 4  # one copy of the larger map (memory, not traffic)
    f = Factors({}, {}, additive=True, calibrated=True, bandwidth_bytes_per_s=1e9, relayout_bandwidth_efficiency=0.5,
                relayout_narrow_bandwidth_efficiency=1.0)
    ms = predict(c, this_cpu(), "openvino", "fp32", f).by_class_ms["relayout"]
    assert ms == pytest.approx(1000 * (2 * 32 * 64 * 4 / 0.5e9 + 2 * 16 * 64 * 4 / 1e9))


def test_silu_after_a_conv_is_its_epilogue():
    """Conv -> Sigmoid, Mul(conv output, sigmoid): SiLU as torch exports it. The conv's output is read by the SiLU
    alone (its Sigmoid and its Mul), so both are a fused epilogue; a Sigmoid of a value that a third node reads too
    (the Relu's output, read by the residual Add as well) is not (its Mul and the Add still fuse: each reads an
    elementwise output that nothing else reads)."""
    g = _graph([helper.make_node("Conv", ["x", "w"], ["a"], pads=[1] * 4), helper.make_node("Sigmoid", ["a"], ["s"]),
                helper.make_node("Mul", ["a", "s"], ["y"]), helper.make_node("Relu", ["y"], ["r"]),
                helper.make_node("Sigmoid", ["r"], ["t"]), helper.make_node("Mul", ["r", "t"], ["u"]),
                helper.make_node("Add", ["u", "r"], ["z"])],
               [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])], [helper.make_tensor_value_info("z", F, None)],
               [_w("w", (4, 4, 3, 3))])
    fused = {n.name.split("_")[0] + str(i): n.fused for i, n in enumerate(graph_costs(g).nodes)}
    assert fused == {"Conv0": False, "Sigmoid1": True, "Mul2": True, "Relu3": True, "Sigmoid4": False, "Mul5": True,
                     "Add6": True}


def test_slices_read_their_region_no_op_casts_and_head_transposes_are_free():
    """GEGLU's halves: a Slice reads the half it takes; a Cast to its input's own type (diffusers' exports hold dozens)
    is a view; a Transpose that splits heads for a matmul of two activations is marked ``head`` (strides of the
    attention), one that lays a projection's input out for a weight matmul is not."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "wp"], ["p"]),                          # (1, 8, 16) -> (1, 8, 32)
             helper.make_node("Slice", ["p", "s0", "s1", "ax"], ["h"]),               # the first half: (1, 8, 16)
             helper.make_node("Cast", ["h"], ["hc"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["hc", "split"], ["r"]),                     # (1, 8, 2, 8)
             helper.make_node("Transpose", ["r"], ["q"], perm=[0, 2, 1, 3]),          # heads: (1, 2, 8, 8)
             helper.make_node("Transpose", ["q"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),                          # scores: two activations
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),            # (1, 16, 8): not a head's
             helper.make_node("MatMul", ["xt", "wt"], ["y"])]
    g = _graph(nodes, [helper.make_tensor_value_info("x", F, [1, 8, 16])],
               [helper.make_tensor_value_info("s", F, None), helper.make_tensor_value_info("y", F, None)],
               [_w("wp", (16, 32)), _w("wt", (8, 4)), i64("s0", [0]), i64("s1", [16]), i64("ax", [2]),
                i64("split", [1, 8, 2, 8])])
    nodes_by_op = {}
    for n in graph_costs(g).nodes:
        nodes_by_op.setdefault(n.op, []).append(n)
    (sl,) = nodes_by_op["Slice"]
    assert sl.bytes_written == 4 * 8 * 16 and sl.bytes_read - sl.weight_bytes == 4 * 8 * 16
    (cast,) = nodes_by_op["Cast"]
    assert cast.op_class == "view" and cast.bytes == 0
    heads = [n.head for n in nodes_by_op["Transpose"]]
    assert heads == [True, True, False]  # the split, K's transpose, then the projection's input
