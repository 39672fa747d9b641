"""`sdrt plan` and the cost model on graphs as exporters and tools write them, not as sdrt's own tests do: torch's
dynamo exporter (GroupNormalization, which onnx cannot infer), onnxruntime's com.microsoft ops and QOperator
quantization, values of unknown rank, and Optimum's one-graph folders (scripts/make_user_onnx_corpus.py builds the
full corpus these come from)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.cli import main
from sdrt.cost.nodes import graph_costs
from sdrt.graph import Graph

MS = helper.make_opsetid("com.microsoft", 1)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))


def _init(name, *shape, dtype=np.float32):
    return numpy_helper.from_array(np.random.default_rng(0).standard_normal(shape).astype(dtype), name)


def _save(path, nodes, inputs, outputs, inits=(), opset=21, extra=()):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset), *extra])
    onnx.save(m, str(path))
    return path


def _group_norm_gemm(path):
    """Conv -> GroupNormalization -> SiLU -> ReduceMean -> Gemm, as torch.onnx.export(dynamo=True) writes a small
    classifier at opset 21 (its ReduceMean takes its axes as an input)."""
    return _save(path, [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("GroupNormalization", ["c", "gs", "gb"], ["gn"], num_groups=4),
        helper.make_node("Sigmoid", ["gn"], ["sg"]), helper.make_node("Mul", ["gn", "sg"], ["silu"]),
        helper.make_node("ReduceMean", ["silu", "axes"], ["mean"], keepdims=0),
        helper.make_node("Gemm", ["mean", "lw", "lb"], ["y"], transB=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [_init("cw", 8, 3, 3, 3), _init("cb", 8), _init("gs", 8), _init("gb", 8), _init("lw", 5, 8), _init("lb", 5),
         numpy_helper.from_array(np.array([2, 3], np.int64), "axes")])


def test_shapes_run_on_past_a_group_norm(tmp_path):
    """onnx infers no shape for GroupNormalization (opsets 18 and 21): everything after it was unknown, and the
    Gemm's input read as a scalar made `sdrt plan` die with an IndexError traceback."""
    g = Graph.load(_group_norm_gemm(tmp_path / "dynamo.onnx")).with_shapes()
    infos = g.value_infos()
    assert infos["gn"].shape == (2, 8, 16, 16) and infos["mean"].shape == (2, 8)
    cost = graph_costs(g, None, "fp32", inferred=True)
    gemm = next(n for n in cost.nodes if n.op == "Gemm")
    assert gemm.flops == 2 * 2 * 5 * 8 + 2 * 5  # 2*M*N*K plus the bias
    assert cost.unknown == []


def test_plan_of_a_dynamo_export_is_one_part_with_sane_figures(tmp_path, capsys):
    path = _group_norm_gemm(tmp_path / "dynamo.onnx")
    assert main(["plan", str(path), "--json", "--device", "cpu"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in d["parts"]] == ["dynamo"] and d["unknown_shapes"] == []
    assert d["predicted_ms_per_image"] > 0 and d["parts"][0]["predicted_peak_bytes"] > 0


def test_an_unknown_rank_is_not_a_scalar(tmp_path, capsys):
    """A custom op's output has no shape at all (not even a rank): the Gemm that reads it is left uncosted, not
    costed as a matmul of a scalar (IndexError), and the plan says which op lost the shapes."""
    path = _save(tmp_path / "custom.onnx", [
        helper.make_node("MyOp", ["x"], ["h"], domain="ai.example"),
        helper.make_node("Gemm", ["h", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [_init("w", 8, 8)],
        extra=[helper.make_opsetid("ai.example", 1)])
    assert main(["plan", str(path), "--json", "--device", "cpu"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["unknown_shapes"] == [{"part": "custom", "values": 1, "ops": ["ai.example:MyOp"], "subgraph_matmuls": 0}]
    assert main(["plan", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "could not tell the shapes of 1 value(s) (from ai.example:MyOp)" in out and "underestimated" in out


def test_qlinearconv_counts_its_kernel(tmp_path):
    """QOperator quantization (onnxruntime quantize_static): the kernel is QLinearConv's 4th input, not its 2nd
    (the input's scale), which counted a 3->16 3x3 conv at 32 pixels as 2 * outputs FLOPs."""
    q = [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.uint8), "z"),
         numpy_helper.from_array(np.ones((16, 3, 3, 3), np.int8), "w"),
         numpy_helper.from_array(np.array(0, np.int8), "wz")]
    path = _save(tmp_path / "qconv.onnx", [
        helper.make_node("QLinearConv", ["x", "s", "z", "w", "s", "wz", "s", "z"], ["y"], pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 16, 32, 32])], q, opset=13)
    cost = graph_costs(Graph.load(path), None, "fp32")
    assert cost.nodes[0].flops == 2 * 16 * 32 * 32 * 3 * 3 * 3


def test_com_microsoft_matmul_and_attention_are_costed(tmp_path):
    """onnxruntime's contrib ops (an ORT-optimized BERT: FusedMatMul, Attention, SkipLayerNormalization, FastGelu):
    onnx infers none of them, so the graph after the first one had no shapes and cost nothing."""
    path = _save(tmp_path / "ort.onnx", [
        helper.make_node("FusedMatMul", ["x", "w"], ["m"], domain="com.microsoft", alpha=0.5, transB=1),
        helper.make_node("Attention", ["m", "qkv", "qkv_b"], ["a"], domain="com.microsoft", num_heads=4),
        helper.make_node("SkipLayerNormalization", ["a", "m", "g", "b"], ["n"], domain="com.microsoft"),
        helper.make_node("FastGelu", ["n"], ["f"], domain="com.microsoft"),
        helper.make_node("MatMul", ["f", "out_w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 10, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10, 16])],
        [_init("w", 32, 64), _init("qkv", 32, 96), _init("qkv_b", 96), _init("g", 32), _init("b", 32),
         _init("out_w", 32, 16)], opset=17, extra=[MS])
    g = Graph.load(path).with_shapes()
    assert g.value_infos()["f"].shape == (2, 10, 32)
    cost = graph_costs(g, None, "fp32", inferred=True)
    assert cost.unknown == []
    by_op = {n.op: n.flops for n in cost.nodes}
    assert by_op["FusedMatMul"] == 2 * (2 * 10) * 32 * 64  # x (2, 10, 64) @ w^T (64, 32)
    # the packed QKV projection, then QK^T and PV over 10 keys, then the softmax
    assert by_op["Attention"] == 2 * 2 * 10 * 32 * 96 + 2 * 2 * 10 * 10 * (32 + 32) + 5 * 2 * 4 * 10 * 10
    assert by_op["MatMul"] == 2 * 2 * 10 * 16 * 32


def test_a_folder_with_one_graph_plans_it(tmp_path, capsys):
    """`optimum-cli export onnx` of a classifier or an encoder writes FOLDER/model.onnx and its configs: `sdrt plan
    FOLDER` plans that graph, where it asked for text_encoder/, unet/ and vae_decoder/."""
    (tmp_path / "m").mkdir()
    _group_norm_gemm(tmp_path / "m" / "model.onnx")
    (tmp_path / "m" / "config.json").write_text("{}")
    assert main(["plan", str(tmp_path / "m"), "--json", "--device", "cpu"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"] == "model.onnx" and [p["name"] for p in d["parts"]] == ["model"]


def test_a_folder_of_several_graphs_is_refused_naming_them(tmp_path, capsys):
    for name in ("a.onnx", "b.onnx"):
        _group_norm_gemm(tmp_path / name)
    assert main(["plan", str(tmp_path), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds 2 .onnx files (a.onnx, b.onnx)" in err
    assert f"sdrt plan {tmp_path / 'a.onnx'}" in err


def test_an_image_classifiers_channels_are_pixels():
    """Optimum exports ViT/ResNet classifiers with pixel_values [batch_size, num_channels, height, width]: the
    channels were taken as 1, so the input as a latent, and a 512-pixel plan costed a 64x64 single-channel image."""
    from sdrt.cost.shapes import single_file_shapes

    class G:
        inputs = [type("I", (), {"name": "pixel_values", "shape": ("batch_size", "num_channels", "height", "width")})]

    assert single_file_shapes(G, 512, 384) == {"pixel_values": (1, 3, 384, 512)}


def test_an_optimum_unets_num_channels_are_its_conv_ins_not_pixels(tmp_path, capsys):
    """Optimum names a UNet's and a VAE's channels ``num_channels`` too (``sample [batch_size, num_channels, height,
    width]``): read as pixels, a tiny UNet planned at 512x512x3 instead of its 64x64x4 latent (18 s and 15 GiB per
    image for 0.05 s and 0.18 GiB) and took --width 300. The first Conv's in-channels say which it is."""
    from sdrt.cost.shapes import fixed_size, single_file_shapes, takes_pixels

    def graph(name, inp, cin, dims):
        conv = [helper.make_node("Cast", [inp], ["c"], to=TensorProto.FLOAT),
                helper.make_node("Conv", ["c", "w"], ["y"], pads=[1, 1, 1, 1])]
        return Graph.load(str(_save(tmp_path / name, conv, [helper.make_tensor_value_info(inp, TensorProto.FLOAT, dims)],
                                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                    [_init("w", 8, cin, 3, 3)], opset=17)))

    unet = graph("unet.onnx", "sample", 4, ["batch_size", "num_channels", "height", "width"])
    assert not takes_pixels(unet) and single_file_shapes(unet, 512, 384) == {"sample": (1, 4, 48, 64)}
    assert main(["plan", str(tmp_path / "unet.onnx"), "--device", "cpu", "--width", "300"]) == 1
    assert "--width 300 is not a multiple of 8" in capsys.readouterr().err
    cls = graph("cls.onnx", "x", 3, ["batch_size", "num_channels", 224, 224])
    assert takes_pixels(cls) and fixed_size(cls) == (224, 224)
    assert single_file_shapes(cls, 512, 512) == {"x": (1, 3, 224, 224)}


def test_an_optimum_flux_transformer_plans_with_one_value_per_dim_name(capsys):
    """Optimum's Flux transformer names its text length ``sequence_length`` on ``encoder_hidden_states [batch_size,
    sequence_length, 64]`` and on ``txt_ids [sequence_length, 3]``, its image tokens ``packed_height_width``: the first
    axis of txt_ids was taken as the batch, so ``sdrt plan transformer/model.onnx`` said "dim 'sequence_length'
    pinned to both 77 and 1. Where: Graph.with_shapes on model.onnx", and the image tokens were 77."""
    from pathlib import Path

    from sdrt.cost.shapes import single_file_shapes

    path = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-flux-dev" / "transformer" / "model.onnx"
    shapes = single_file_shapes(Graph.load(path, load_external=False), 128, 64)
    assert shapes["encoder_hidden_states"][1] == shapes["txt_ids"][0]
    assert shapes["hidden_states"][:2] == (1, 32) and shapes["img_ids"] == (32, 3)  # (64 / 16) x (128 / 16) tokens
    assert main(["plan", str(path), "--device", "cpu", "--width", "128", "--height", "64"]) == 0, capsys.readouterr()


@pytest.mark.parametrize("equation, a, b, flops", [
    ("bij,jk->bik", (2, 8, 16), (16, 4), 2 * 2 * 8 * 16 * 4),  # a weight: class matmul, once counted 0
    ("bhqd,bhkd->bhqk", (1, 2, 8, 4), (1, 2, 8, 4), 2 * 2 * 8 * 8 * 4),  # QK^T of two activations
    ("...ij,jk->...ik", (3, 2, 8, 16), (16, 4), 2 * 6 * 8 * 16 * 4),
])
def test_einsum_counts_its_products(tmp_path, equation, a, b, flops):
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a))]
    inits = [_init("b", *b)]
    if equation.startswith("bhqd"):
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b)))
        inits = []
    path = _save(tmp_path / "e.onnx", [helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], inputs,
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=17)
    assert graph_costs(Graph.load(path), None, "fp32").nodes[0].flops == flops


def test_an_asked_precision_is_planned_only_on_backends_that_run_it(tmp_path, capsys):
    """--precision q4_0 planned OpenVINO at ggml's block format, --precision fp8 ggml on a GPU, bf16 Core ML:
    precisions those backends do not offer. Each backend now plans the asked precisions it runs on the device."""
    path = str(_group_norm_gemm(tmp_path / "m.onnx"))
    assert main(["plan", path, "--json", "--device", "cpu", "--precision", "q4_0"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {(c["backend"], c["precision"]) for c in d["candidates"]} == {("ggml", "q4_0")}
    assert main(["plan", path, "--device", "cpu", "--backend", "openvino", "--precision", "q4_0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no backend runs q4_0 on this CPU") and "Where: --precision." in err
    assert "(openvino: fp32" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", path, "--device", "RTX 2060 6GB", "--precision", "bf16"]) == 1  # Turing: no bf16
    assert "no backend runs bf16 on RTX 2060 6GB" in capsys.readouterr().err


def test_group_norms_in_a_chain_keep_exact_shapes(tmp_path):
    """torch's dynamo exporter writes GroupNormalization over a view of an earlier norm's output (SD's attention
    blocks: Reshape to N, C, -1): the second norm was typed while the view's length was still unknown (the first
    norm untyped), and kept it after the length was found, so the attention after it cost nothing (a tiny SD VAE
    decoder at 512 px: 4.3 ms at opset 21 against 43.4 ms at opset 18)."""
    n = helper.make_node
    path = _save(tmp_path / "chain.onnx", [
        n("GroupNormalization", ["x", "s", "b"], ["g1"], num_groups=4), n("Reshape", ["g1", "to3"], ["view"]),
        n("GroupNormalization", ["view", "s", "b"], ["g2"], num_groups=4),
        n("Transpose", ["g2"], ["t"], perm=[0, 2, 1]), n("MatMul", ["t", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_init("s", 8), _init("b", 8), _init("w", 8, 4), numpy_helper.from_array(np.array([1, 8, -1], np.int64), "to3")])
    g = Graph.load(path).with_shapes(h=16, w=16)
    assert g.value_infos()["g2"].shape == (1, 8, 256) and g.value_infos()["y"].shape == (1, 256, 4)
    cost = graph_costs(g, None, "fp32", inferred=True)
    assert cost.unknown == [] and next(c for c in cost.nodes if c.op == "MatMul").flops == 2 * 256 * 4 * 8


def test_an_image_in_pixels_takes_any_size(tmp_path, capsys):
    """The multiple-of-8 rule is a latent's: an Inception-style classifier fixed at 299x299 could not be planned at
    all ('--width 299 is not a multiple of 8', with no --width given), nor a dynamic one at --width 299."""
    conv = [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    fixed = _save(tmp_path / "inception.onnx", conv, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                     [1, 3, 299, 299])], out,
                  [_init("w", 8, 3, 3, 3)], opset=17)
    assert main(["plan", str(fixed), "--json", "--device", "cpu"]) == 0
    assert (json.loads(capsys.readouterr().out)["width"]) == 299
    dyn = _save(tmp_path / "dyn.onnx", conv, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                out, [_init("w", 8, 3, 3, 3)], opset=17)
    assert main(["plan", str(dyn), "--json", "--device", "cpu", "--width", "299", "--height", "227"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["width"], d["height"]) == (299, 227) and d["parts"][0]["predicted_ms_per_call"] > 0


def test_matmuls_inside_a_loop_are_named_as_not_counted(tmp_path, capsys):
    """A Loop's body runs a number of times known at run time: its matmuls are not costed, and the plan said
    nothing (a scripted decoder loop planned as its few nodes outside)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("MatMul", ["h", "w"], ["h_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [2, 8])])
    path = _save(tmp_path / "loop.onnx", [helper.make_node("Loop", ["n", "cond", "x"], ["y"], body=body)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                 [_init("w", 8, 8), numpy_helper.from_array(np.array(4, np.int64), "n"),
                  numpy_helper.from_array(np.array(True), "cond")], opset=17)
    assert main(["plan", str(path), "--device", "cpu"]) == 0
    assert "loop: 1 matmul/conv node(s) inside If/Loop/Scan subgraphs are not counted" in capsys.readouterr().out
