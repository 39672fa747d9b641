"""Build a corpus of ONNX files shaped like the ones users bring to ``sdrt plan``/``run``/``info``/``compile``/
``strip``/``quantize``: exporter outputs (torch.onnx legacy and dynamo, Optimum), fp16, external data, opsets 11-21,
dynamic and unknown dims, control flow, QDQ, com.microsoft ops, sequence/optional types, zero-size inputs, no
inputs, corrupt files, an empty folder, paths with spaces and unicode.

    PYTHONPATH=/work/optlib /work/refvenv/bin/python scripts/make_user_onnx_corpus.py OUT

Random-initialised tiny configs (no download). Writes OUT/<name>.onnx (or OUT/<name>/ folders) and
OUT/manifest.json: {name: {"path": ..., "kind": ...}}. scripts/check_user_onnx_corpus.py runs the commands on it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.modules.setdefault("torchvision", None)  # type: ignore[arg-type]

MANIFEST: dict[str, dict] = {}


def add(name: str, path: Path, kind: str) -> None:
    MANIFEST[name] = {"path": str(path), "kind": kind}


def section(fn):
    def wrapped(out: Path) -> None:
        try:
            fn(out)
        except Exception:  # noqa: BLE001 - one exporter failing leaves the rest of the corpus
            print(f"section {fn.__name__} failed:", file=sys.stderr)
            traceback.print_exc()
    wrapped.__name__ = fn.__name__
    return wrapped


# ---------------------------------------------------------------- torch.onnx.export
@section
def torch_exports(out: Path) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.norm = torch.nn.GroupNorm(4, 8)
            self.lin = torch.nn.Linear(8, 5)

        def forward(self, x):
            y = torch.nn.functional.silu(self.norm(self.conv(x)))
            y = y.mean(dim=(2, 3))
            return torch.softmax(self.lin(y), -1)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 3, 16, 16)
    for opset in (11, 13, 14, 17, 18, 20):
        p = out / f"legacy_opset{opset}.onnx"
        torch.onnx.export(net, (x,), str(p), opset_version=opset, dynamo=False, input_names=["x"],
                          output_names=["probs"], dynamic_axes={"x": {0: "batch", 2: "height", 3: "width"}})
        add(p.stem, p, "torch-legacy")
    p = out / "legacy_static.onnx"
    torch.onnx.export(net, (x,), str(p), opset_version=17, dynamo=False, input_names=["x"], output_names=["probs"])
    add(p.stem, p, "torch-legacy")
    try:
        p = out / "dynamo_default.onnx"
        batch = torch.export.Dim("batch", min=1, max=64)
        torch.onnx.export(net, (x,), str(p), dynamo=True, input_names=["x"], output_names=["probs"],
                          dynamic_shapes={"x": {0: batch}})
        add(p.stem, p, "torch-dynamo")
        p = out / "dynamo_static_opset21.onnx"
        torch.onnx.export(net, (x,), str(p), dynamo=True, opset_version=21)
        add(p.stem, p, "torch-dynamo")
    except Exception:  # noqa: BLE001 - an exporter failing leaves the rest
        traceback.print_exc()

    class Attn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)
            self.out = torch.nn.Linear(16, 16)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, -1)
            b, n, _ = x.shape
            q, k, v = (t.reshape(b, n, 2, 8).transpose(1, 2) for t in (q, k, v))
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.out(o.transpose(1, 2).reshape(b, n, 16))

    attn = Attn().eval()
    xs = torch.randn(1, 10, 16)
    p = out / "legacy_sdpa_fp16.onnx"
    torch.onnx.export(attn.half(), (xs.half(),), str(p), opset_version=17, dynamo=False, input_names=["hidden"],
                      output_names=["out"], dynamic_axes={"hidden": {0: "batch", 1: "seq"}})
    add(p.stem, p, "torch-legacy fp16")
    attn = attn.float()
    p = out / "legacy_sdpa_unnamed_dims.onnx"  # dynamic axes without names: torch writes its own names
    torch.onnx.export(attn, (xs,), str(p), opset_version=14, dynamo=False, dynamic_axes={"input": [0, 1]},
                      input_names=["input"])
    add(p.stem, p, "torch-legacy")
    # scripted control flow: an If/Loop graph from torch.jit.script
    class Flow(torch.nn.Module):
        def forward(self, x):
            for _ in range(int(x.shape[0])):
                x = x * 0.5 + 1.0
            if bool(x.sum() > 0):
                return x - 1.0
            return x + 1.0

    try:
        p = out / "legacy_scripted_loop_if.onnx"
        torch.onnx.export(torch.jit.script(Flow()), (torch.randn(3, 4),), str(p), opset_version=13, dynamo=False,
                          input_names=["x"], dynamic_axes={"x": {0: "n"}})
        add(p.stem, p, "torch-legacy control-flow")
    except Exception:  # noqa: BLE001 - an exporter failing leaves the rest
        traceback.print_exc()
    # a big-ish model saved with external data by the exporter (> 2 GiB is not needed: force it)
    big = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).eval()
    d = out / "legacy_external"
    d.mkdir(exist_ok=True)
    p = d / "model.onnx"
    torch.onnx.export(big, (torch.randn(4, 256),), str(p), opset_version=17, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    m = onnx.load(str(p))
    onnx.save_model(m, str(p), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx_data", size_threshold=0)
    add("legacy_external", p, "external data")


@section
def dynamo_diffusers(out: Path) -> None:
    """A tiny SD VAE decoder and UNet through torch's dynamo exporter (GroupNormalization nodes at opset 18+, which
    onnx's shape inference cannot type), with dynamic height and width."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
                        layers_per_block=1, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=8, sample_size=32).eval()

    class Dec(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vae = vae

        def forward(self, latent_sample):
            return self.vae.decode(latent_sample, return_dict=False)[0]

    h, w = torch.export.Dim("h", min=2, max=64), torch.export.Dim("w", min=2, max=64)
    for opset in (18, 21):
        p = out / f"dynamo_vae_decoder_opset{opset}.onnx"
        torch.onnx.export(Dec().eval(), (torch.randn(1, 4, 8, 8),), str(p), dynamo=True, opset_version=opset,
                          input_names=["latent_sample"], output_names=["sample"],
                          dynamic_shapes={"latent_sample": {2: 2 * h, 3: 2 * w}})
        add(p.stem, p, "torch-dynamo diffusers")
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=8, attention_head_dim=(2, 4)).eval()

    class U(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, sample, timestep, encoder_hidden_states):
            return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]

    p = out / "dynamo_unet.onnx"
    torch.onnx.export(U().eval(), (torch.randn(2, 4, 8, 8), torch.tensor(10.0), torch.randn(2, 77, 32)), str(p),
                      dynamo=True, input_names=["sample", "timestep", "encoder_hidden_states"], output_names=["out"])
    add(p.stem, p, "torch-dynamo diffusers")


# ---------------------------------------------------------------- Optimum exports
@section
def optimum_exports(out: Path) -> None:
    import torch
    from optimum.exporters.onnx import main_export
    from transformers import (
        BertConfig,
        BertModel,
        ResNetConfig,
        ResNetForImageClassification,
        T5Config,
        T5EncoderModel,
        ViTConfig,
        ViTForImageClassification,
    )

    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp())
    models = {
        "t5_encoder": (T5EncoderModel(T5Config(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                               num_heads=4)), "feature-extraction"),
        "bert": (BertModel(BertConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                      num_hidden_layers=2)), "feature-extraction"),
        "vit": (ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                                    intermediate_size=64, num_attention_heads=4,
                                                    num_hidden_layers=2, num_labels=10)), "image-classification"),
        "resnet": (ResNetForImageClassification(ResNetConfig(embedding_size=8, hidden_sizes=[8, 16],
                                                             depths=[1, 1], num_labels=10)), "image-classification"),
    }
    for name, (model, task) in models.items():
        src = work / name
        model.eval().save_pretrained(src)
        dst = out / f"optimum_{name}"
        try:
            main_export(str(src), output=str(dst), task=task, device="cpu", do_validation=False)
            add(f"optimum_{name}", dst / "model.onnx", f"optimum {task}")
        except Exception:  # noqa: BLE001 - an exporter failing leaves the rest
            traceback.print_exc()
    # a tiny diffusers pipeline: unet, vae decoder/encoder, text encoder as Optimum writes them
    try:
        src = work / "sd15"
        tiny_sd15(src)
        dst = out / "optimum_sd15"
        main_export(str(src), output=str(dst), task="text-to-image", device="cpu", do_validation=False)
        add("optimum_sd15", dst, "optimum text-to-image folder")
        for part in ("unet", "vae_decoder", "vae_encoder", "text_encoder"):
            add(f"optimum_sd15_{part}", dst / part / "model.onnx", "optimum sd part")
    except Exception:  # noqa: BLE001 - an exporter failing leaves the rest
        traceback.print_exc()
    shutil.rmtree(work, ignore_errors=True)


def tiny_sd15(dst: Path) -> None:
    """A random tiny SD 1.x diffusers folder (byte-level CLIP vocabulary, no merges)."""
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    tokdir = dst.parent / "tok"
    tokdir.mkdir(parents=True, exist_ok=True)
    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    (tokdir / "vocab.json").write_text(json.dumps(vocab))
    (tokdir / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(tokdir / "vocab.json"), str(tokdir / "merges.txt"), model_max_length=77)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=48,
                                        num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=77,
                                        bos_token_id=len(vocab) - 2, eos_token_id=len(vocab) - 1,
                                        pad_token_id=len(vocab) - 1)).eval()
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=8, attention_head_dim=(2, 4)).eval()
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
                        layers_per_block=1, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=8, sample_size=64).eval()
    sched = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True)
    StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tok, unet=unet, scheduler=sched,
                            safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(dst)


# ---------------------------------------------------------------- onnx.helper graphs
def _save(m: onnx.ModelProto, path: Path, kind: str, check: bool = True) -> None:
    if check:
        onnx.checker.check_model(m)
    onnx.save(m, str(path))
    add(path.stem, path, kind)


def _model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=(), name="g", value_info=()):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits), value_info=list(value_info))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])


@section
def helper_graphs(out: Path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    # a plain matmul for FLOP counting: [8, 64] x [64, 32] = 2*8*64*32 = 32768 FLOPs
    _save(_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])], [w]),
          out / "matmul_8x64x32.onnx", "flops")
    # conv: 1x3x32x32 -> 1x16x32x32, 3x3 kernel: 2*16*32*32*3*3*3 = 884736 FLOPs (+bias)
    cw = numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "cw")
    cb = numpy_helper.from_array(np.zeros(16, np.float32), "cb")
    _save(_model([helper.make_node("Conv", ["x", "cw", "cb"], ["y"], pads=[1, 1, 1, 1])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32, 32])], [cw, cb]),
          out / "conv_3to16_32px.onnx", "flops")
    # every opset 11..21 with a conv+relu+matmul model
    for opset in range(11, 22):
        _save(_model([helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", ["c"], ["y"])],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, "H", "W"])], [cw, cb],
                     opset=opset), out / f"helper_opset{opset}.onnx", "opset")
    # fully unknown dims (no dim_param, no dim_value) and an unknown rank
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    x_unknown_dims = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])
    _save(_model([helper.make_node("Relu", ["x"], ["y"])], [x_unknown_dims],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])]),
          out / "unknown_dims.onnx", "dynamic")
    _save(_model([helper.make_node("Relu", ["x"], ["y"])], [x],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), out / "unknown_rank.onnx", "dynamic",
          check=False)
    # If with subgraphs
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])])
    _save(_model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                  helper.make_node("Greater", ["s", "zero"], ["c"]),
                  helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                 [numpy_helper.from_array(np.array(0, np.float32), "zero")], opset=13),
          out / "if_subgraph.onnx", "control-flow")
    # Loop: 4 iterations of x = x * 2 + 1
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["xi", "two"], ["m"]), helper.make_node("Add", ["m", "one"], ["xo"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("xi", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("xo", TensorProto.FLOAT, [2, 3])])
    _save(_model([helper.make_node("Loop", ["n", "cond", "x"], ["y"], body=body)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                 [numpy_helper.from_array(np.array(4, np.int64), "n"),
                  numpy_helper.from_array(np.array(True), "cond"),
                  numpy_helper.from_array(np.array(2, np.float32), "two"),
                  numpy_helper.from_array(np.array(1, np.float32), "one")], opset=13),
          out / "loop_subgraph.onnx", "control-flow")
    # Scan: cumulative sum over the first axis
    sbody = helper.make_graph([helper.make_node("Add", ["acc", "row"], ["acc_out"]),
                               helper.make_node("Identity", ["acc_out"], ["scan_out"])], "sbody",
                              [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("row", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, [3])])
    _save(_model([helper.make_node("Scan", ["init", "x"], ["final", "ys"], body=sbody, num_scan_inputs=1)],
                 [helper.make_tensor_value_info("init", TensorProto.FLOAT, [3]),
                  helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])],
                 [helper.make_tensor_value_info("final", TensorProto.FLOAT, [3]),
                  helper.make_tensor_value_info("ys", TensorProto.FLOAT, [5, 3])], opset=16),
          out / "scan_subgraph.onnx", "control-flow")
    # com.microsoft ops: Gelu, FusedMatMul (ORT's contrib ops)
    ms = helper.make_opsetid("com.microsoft", 1)
    _save(_model([helper.make_node("FusedMatMul", ["x", "w"], ["m"], domain="com.microsoft", alpha=0.5),
                  helper.make_node("Gelu", ["m"], ["y"], domain="com.microsoft")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], [w], extra_opsets=[ms]),
          out / "com_microsoft_ops.onnx", "custom-domain", check=False)
    # an unknown domain altogether
    _save(_model([helper.make_node("MyOp", ["x"], ["y"], domain="ai.example.custom")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
                 extra_opsets=[helper.make_opsetid("ai.example.custom", 1)]),
          out / "unknown_domain_op.onnx", "custom-domain", check=False)
    # sequence and optional types
    seq_out = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2, 2])
    _save(_model([helper.make_node("SequenceConstruct", ["a", "b"], ["seq"])],
                 [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 2]),
                  helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 2])], [seq_out]),
          out / "sequence_output.onnx", "sequence")
    seq_in = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2, 2])
    _save(_model([helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)], [seq_in],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])]),
          out / "sequence_input.onnx", "sequence")
    opt_type = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    opt_in = helper.make_value_info("maybe", opt_type)
    _save(_model([helper.make_node("OptionalHasElement", ["maybe"], ["has"])], [opt_in],
                 [helper.make_tensor_value_info("has", TensorProto.BOOL, [])], opset=18),
          out / "optional_input.onnx", "optional")
    # zero-size input dim
    _save(_model([helper.make_node("Relu", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 4])]), out / "zero_size_input.onnx", "zero")
    # zero-size initializer feeding a Concat
    _save(_model([helper.make_node("Concat", ["x", "empty"], ["y"], axis=0)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                 [numpy_helper.from_array(np.zeros((0, 4), np.float32), "empty")]),
          out / "zero_size_initializer.onnx", "zero")
    # no inputs at all
    _save(_model([helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones((2, 2), np.float32))),
                  helper.make_node("Relu", ["c"], ["y"])], [],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])]), out / "no_inputs.onnx", "no-inputs")
    # no nodes: the input is the output
    _save(_model([], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])]), out / "no_nodes.onnx", "no-nodes")
    # fp16 model built by hand, with a Cast to float32 on the way out
    w16 = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float16), "w16")
    _save(_model([helper.make_node("MatMul", ["x", "w16"], ["m"]), helper.make_node("Cast", ["m"], ["y"], to=1)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], [w16]),
          out / "fp16_matmul.onnx", "fp16")
    # bf16 and int inputs
    _save(_model([helper.make_node("Cast", ["x"], ["y"], to=1)],
                 [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]), out / "bf16_input.onnx", "bf16")
    _save(_model([helper.make_node("Gather", ["table", "ids"], ["y"])],
                 [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])],
                 [numpy_helper.from_array(rng.standard_normal((100, 32)).astype(np.float32), "table")]),
          out / "int64_ids_embedding.onnx", "int")
    # a string input
    _save(_model([helper.make_node("Identity", ["s"], ["y"])],
                 [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
                 [helper.make_tensor_value_info("y", TensorProto.STRING, [2])]), out / "string_input.onnx", "string")
    # a model whose declared input shape carries both a dim_param and a negative / huge dim_value
    _save(_model([helper.make_node("Relu", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])]), out / "negative_dim.onnx",
          "odd", check=False)
    _save(_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**40, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**40, 32])], [w]), out / "huge_dim.onnx",
          "odd")
    # an initializer that is also a graph input (old exporters, IR < 4): an input with a default
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64]),
                helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 32])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])], [w], opset=9)
    m.ir_version = 3
    _save(m, out / "initializer_as_input_ir3.onnx", "old")
    # a model with several outputs, one of them an input passed through, one an initializer
    _save(_model([helper.make_node("Relu", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2]),
                  helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])]), out / "output_is_input.onnx",
          "odd")
    # an input name with characters a file system or a shell dislikes
    _save(_model([helper.make_node("Relu", ["input:0/a b"], ["out/0"])],
                 [helper.make_tensor_value_info("input:0/a b", TensorProto.FLOAT, ["batch size", 4])],
                 [helper.make_tensor_value_info("out/0", TensorProto.FLOAT, ["batch size", 4])]),
          out / "odd_names.onnx", "odd")


@section
def external_data(out: Path) -> None:
    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 128)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((128, 16)).astype(np.float32), "w2")

    def mk():
        return _model([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                       helper.make_node("MatMul", ["r", "w2"], ["y"])],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [w1, w2])

    d = out / "ext_one_file"
    d.mkdir(exist_ok=True)
    onnx.save_model(mk(), str(d / "model.onnx"), save_as_external_data=True, location="model.onnx_data",
                    size_threshold=0)
    add("ext_one_file", d / "model.onnx", "external data")
    d = out / "ext_many_files"
    d.mkdir(exist_ok=True)
    onnx.save_model(mk(), str(d / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0)
    add("ext_many_files", d / "model.onnx", "external data")
    d = out / "ext_subfolder"
    (d / "weights").mkdir(parents=True, exist_ok=True)
    onnx.save_model(mk(), str(d / "model.onnx"), save_as_external_data=True, location="weights/model.onnx_data",
                    size_threshold=0)
    add("ext_subfolder", d / "model.onnx", "external data")
    d = out / "ext_missing"
    d.mkdir(exist_ok=True)
    onnx.save_model(mk(), str(d / "model.onnx"), save_as_external_data=True, location="model.onnx_data",
                    size_threshold=0)
    (d / "model.onnx_data").unlink()
    add("ext_missing", d / "model.onnx", "external data missing")
    d = out / "ext_truncated"
    d.mkdir(exist_ok=True)
    onnx.save_model(mk(), str(d / "model.onnx"), save_as_external_data=True, location="model.onnx_data",
                    size_threshold=0)
    data = (d / "model.onnx_data").read_bytes()
    (d / "model.onnx_data").write_bytes(data[: len(data) // 2])
    add("ext_truncated", d / "model.onnx", "external data truncated")
    d = out / "ext_outside"
    (d / "inner").mkdir(parents=True, exist_ok=True)
    onnx.save_model(mk(), str(d / "inner" / "model.onnx"), save_as_external_data=True, location="shared.bin",
                    size_threshold=0)
    (d / "inner" / "shared.bin").rename(d / "shared.bin")  # onnx refuses to write outside; users' tools do not
    m = onnx.load(str(d / "inner" / "model.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../shared.bin"
    onnx.save(m, str(d / "inner" / "model.onnx"))
    add("ext_outside", d / "inner" / "model.onnx", "external data outside the folder")


@section
def quantized(out: Path) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    src = out / "conv_3to16_32px.onnx"
    rng = np.random.default_rng(2)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.items, None)

    p = out / "qdq_static_conv.onnx"
    quantize_static(str(src), str(p), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    add(p.stem, p, "qdq")
    p = out / "qoperator_static_conv.onnx"
    quantize_static(str(src), str(p), Reader(), quant_format=QuantFormat.QOperator)
    add(p.stem, p, "qoperator")
    p = out / "qdq_per_channel_conv.onnx"
    quantize_static(str(src), str(p), Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    add(p.stem, p, "qdq")
    p = out / "dynamic_int8_matmul.onnx"
    quantize_dynamic(str(out / "matmul_8x64x32.onnx"), str(p), weight_type=QuantType.QInt8)
    add(p.stem, p, "dynamic-int8")
    bert = out / "optimum_bert" / "model.onnx"
    if bert.exists():
        p = out / "dynamic_int8_bert.onnx"
        quantize_dynamic(str(bert), str(p), weight_type=QuantType.QInt8)
        add(p.stem, p, "dynamic-int8")
        try:  # onnxruntime's transformer optimizer: Attention, SkipLayerNormalization, FastGelu (com.microsoft)
            from onnxruntime.transformers import optimizer

            opt = optimizer.optimize_model(str(bert), model_type="bert", num_heads=4, hidden_size=32)
            p = out / "ort_fused_bert.onnx"
            opt.save_model_to_file(str(p))
            add(p.stem, p, "com.microsoft fused")
        except Exception:  # noqa: BLE001 - an exporter failing leaves the rest
            traceback.print_exc()


@section
def broken_and_paths(out: Path) -> None:
    good = (out / "matmul_8x64x32.onnx").read_bytes()
    (out / "truncated.onnx").write_bytes(good[: len(good) // 3])
    add("truncated", out / "truncated.onnx", "corrupt")
    (out / "empty.onnx").write_bytes(b"")
    add("empty", out / "empty.onnx", "corrupt")
    (out / "not_onnx.onnx").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    add("not_onnx", out / "not_onnx.onnx", "corrupt")
    (out / "text.onnx").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    add("lfs_pointer", out / "text.onnx", "corrupt")
    (out / "empty_folder").mkdir(exist_ok=True)
    add("empty_folder", out / "empty_folder", "no model")
    (out / "folder_no_model").mkdir(exist_ok=True)
    (out / "folder_no_model" / "README.md").write_text("no model here\n")
    (out / "folder_no_model" / "config.json").write_text("{}\n")
    add("folder_no_model", out / "folder_no_model", "no model")
    d = out / "dir with spaces ✓ ünïcode"
    d.mkdir(exist_ok=True)
    p = d / "módel ñame.onnx"
    p.write_bytes(good)
    add("unicode_path", p, "path")
    d2 = out / "one_model_folder"
    d2.mkdir(exist_ok=True)
    (d2 / "model.onnx").write_bytes(good)
    add("one_model_folder", d2, "folder with one model.onnx")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for fn in (helper_graphs, external_data, torch_exports, dynamo_diffusers, optimum_exports, quantized,
               broken_and_paths):
        fn(out)
    (out / "manifest.json").write_text(json.dumps(MANIFEST, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(MANIFEST)} entries in {out}")


if __name__ == "__main__":
    main()
