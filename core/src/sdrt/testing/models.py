"""The benchmark models: stand-ins for the real Stable Diffusion workload, built with onnx.helper.

Each keeps its architecture's layer structure (block counts, norms, attention
layout, skip connections, op patterns as torch.onnx writes them at opset 17);
only channel widths and resolutions shrink where two CPU cores demand it.
``SIZES`` says how much for each size; bench/README.md explains the choice.

``build(name, size)`` returns ``(onnx.ModelProto, feeds)`` with deterministic
weights and inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from . import dit_blocks
from .builder import Builder

# ---------------------------------------------------------------------------
# sizes: "full" is the real model; "bench" is what the harness times on 2 CPU
# cores; "tiny" is for the test suite.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "vae_decoder": {
        "full": {"channels": (128, 256, 512, 512), "latent": 64},
        "bench": {"channels": (32, 64, 128, 128), "latent": 16},
        "tiny": {"channels": (32, 32, 32, 32), "latent": 4},
    },
    "unet": {
        "full": {"c0": 320, "latent": 64, "heads": 8},
        "bench": {"c0": 64, "latent": 32, "heads": 8},
        "tiny": {"c0": 32, "latent": 8, "heads": 4},
    },
    "text_encoder": {
        "full": {"width": 768, "layers": 12, "heads": 12, "vocab": 49408},
        "bench": {"width": 768, "layers": 12, "heads": 12, "vocab": 49408},
        "tiny": {"width": 64, "layers": 2, "heads": 4, "vocab": 1000},
    },
    "mobilenet_v3": {
        "full": {"resolution": 224, "width": 1.0},
        "bench": {"resolution": 224, "width": 1.0},
        "tiny": {"resolution": 32, "width": 0.5},
    },
    "mobilenet_v2": {
        "full": {"resolution": 224, "width": 1.0},
        "bench": {"resolution": 224, "width": 1.0},
        "tiny": {"resolution": 32, "width": 0.5},
    },
}

CONTEXT_LEN, CONTEXT_DIM = 77, 768  # CLIP ViT-L/14 text features that SD 1.x cross-attends to


# ---------------------------------------------------------------------------
# SD-1.x VAE decoder (diffusers AutoencoderKL.decode: post_quant_conv + Decoder)
def _resnet(b: Builder, x: str, name: str, cin: int, cout: int, temb: str | None = None,
            temb_dim: int = 0) -> str:
    h = b.silu(b.group_norm(x, f"{name}.norm1", cin), f"{name}/act1")
    h = b.conv(h, f"{name}.conv1", cin, cout, 3)
    if temb is not None:
        t = b.gemm(b.silu(temb, f"{name}/act_t"), f"{name}.time_emb_proj", temb_dim, cout)
        t = b.op("Unsqueeze", [t, b.const([2, 3])], name=f"/{name}/Unsqueeze")
        h = b.op("Add", [h, t], name=f"/{name}/Add_t")
    h = b.silu(b.group_norm(h, f"{name}.norm2", cout), f"{name}/act2")
    h = b.conv(h, f"{name}.conv2", cout, cout, 3, gain=0.5)
    skip = b.conv(x, f"{name}.conv_shortcut", cin, cout, 1) if cin != cout else x
    return b.op("Add", [skip, h], name=f"/{name}/Add")


def _vae_attention(b: Builder, x: str, name: str, c: int) -> str:
    """The VAE mid-block attention: GroupNorm, one head over all H*W positions, residual."""
    shape = b.op("Shape", [x], name=f"/{name}/Shape")
    h = b.group_norm(x, f"{name}.group_norm", c)
    h = b.op("Reshape", [h, b.const([0, c, -1])], name=f"/{name}/Reshape")
    h = b.op("Transpose", [h], name=f"/{name}/Transpose", perm=[0, 2, 1])
    q = b.linear(h, f"{name}.to_q", c, c)
    k = b.linear(h, f"{name}.to_k", c, c)
    v = b.linear(h, f"{name}.to_v", c, c)
    a = b.attention(q, k, v, f"{name}/attn", heads=1, dim=c)
    a = b.linear(a, f"{name}.to_out.0", c, c)
    a = b.op("Transpose", [a], name=f"/{name}/Transpose_1", perm=[0, 2, 1])
    a = b.op("Reshape", [a, shape], name=f"/{name}/Reshape_1")
    return b.op("Add", [a, x], name=f"/{name}/Add")


def _upsample(b: Builder, x: str, name: str, c: int) -> str:
    """F.interpolate(scale_factor=2, mode="nearest") then a 3x3 conv."""
    up = b.op("Resize", [x, "", b.const([1.0, 1.0, 2.0, 2.0], np.float32)], name=f"/{name}/Resize",
              coordinate_transformation_mode="asymmetric", cubic_coeff_a=-0.75, mode="nearest",
              nearest_mode="floor")
    return b.conv(up, f"{name}.conv", c, c, 3)


def vae_decoder(size: str = "bench") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    cfg = SIZES["vae_decoder"][size]
    chans = list(cfg["channels"])
    lat = cfg["latent"]
    b = Builder("vae_decoder", seed=1)
    z = b.input("latent_sample", TensorProto.FLOAT, [1, 4, lat, lat])
    x = b.conv(z, "post_quant_conv", 4, 4, 1)
    top = chans[-1]
    x = b.conv(x, "decoder.conv_in", 4, top, 3)
    x = _resnet(b, x, "decoder.mid_block.resnets.0", top, top)
    x = _vae_attention(b, x, "decoder.mid_block.attentions.0", top)
    x = _resnet(b, x, "decoder.mid_block.resnets.1", top, top)
    rev = chans[::-1]
    cin = top
    for i, cout in enumerate(rev):
        for j in range(3):  # layers_per_block + 1
            x = _resnet(b, x, f"decoder.up_blocks.{i}.resnets.{j}", cin, cout)
            cin = cout
        if i < len(rev) - 1:
            x = _upsample(b, x, f"decoder.up_blocks.{i}.upsamplers.0", cout)
    x = b.silu(b.group_norm(x, "decoder.conv_norm_out", cin), "decoder/conv_act")
    x = b.conv(x, "decoder.conv_out", cin, 3, 3)
    b.rename(x, "sample")
    side = lat * 2 ** (len(chans) - 1)
    b.output("sample", shape=[1, 3, side, side])
    rng = np.random.default_rng(100)
    return b.model(), {"latent_sample": rng.standard_normal((1, 4, lat, lat), dtype=np.float32)}


# ---------------------------------------------------------------------------
# SD-1.x UNet2DConditionModel
def _transformer(b: Builder, x: str, ctx: str, name: str, c: int, heads: int) -> str:
    """Transformer2DModel (SD 1.x): GroupNorm, 1x1 proj_in, one BasicTransformerBlock, 1x1 proj_out."""
    shape = b.op("Shape", [x], name=f"/{name}/Shape")
    h = b.group_norm(x, f"{name}.norm", c)
    h = b.conv(h, f"{name}.proj_in", c, c, 1)
    h = b.op("Reshape", [h, b.const([0, c, -1])], name=f"/{name}/Reshape")
    h = b.op("Transpose", [h], name=f"/{name}/Transpose", perm=[0, 2, 1])
    blk = f"{name}.transformer_blocks.0"
    n = b.layer_norm(h, f"{blk}.norm1", c)
    q, k, v = (b.linear(n, f"{blk}.attn1.to_{t}", c, c, bias=False) for t in "qkv")
    a = b.linear(b.attention(q, k, v, f"{blk}/attn1", heads, c), f"{blk}.attn1.to_out.0", c, c)
    h = b.op("Add", [a, h], name=f"/{blk}/Add")
    n = b.layer_norm(h, f"{blk}.norm2", c)
    q = b.linear(n, f"{blk}.attn2.to_q", c, c, bias=False)
    k = b.linear(ctx, f"{blk}.attn2.to_k", CONTEXT_DIM, c, bias=False)
    v = b.linear(ctx, f"{blk}.attn2.to_v", CONTEXT_DIM, c, bias=False)
    a = b.linear(b.attention(q, k, v, f"{blk}/attn2", heads, c), f"{blk}.attn2.to_out.0", c, c)
    h = b.op("Add", [a, h], name=f"/{blk}/Add_1")
    n = b.layer_norm(h, f"{blk}.norm3", c)
    proj = b.linear(n, f"{blk}.ff.net.0.proj", c, 8 * c)  # GEGLU: one Linear, split in half
    hidden, gate = b.op_multi("Split", [proj, b.const([4 * c, 4 * c])], name=f"/{blk}/ff/Split", outputs=2, axis=-1)
    f = b.op("Mul", [hidden, b.gelu_erf(gate, f"{blk}/ff/gelu")], name=f"/{blk}/ff/Mul")
    f = b.linear(f, f"{blk}.ff.net.2", 4 * c, c)
    h = b.op("Add", [f, h], name=f"/{blk}/Add_2")
    h = b.op("Transpose", [h], name=f"/{name}/Transpose_1", perm=[0, 2, 1])
    h = b.op("Reshape", [h, shape], name=f"/{name}/Reshape_1")
    h = b.conv(h, f"{name}.proj_out", c, c, 1)
    return b.op("Add", [h, x], name=f"/{name}/Add")


def _timestep_embedding(b: Builder, t: str, c0: int) -> str:
    """Timesteps (sinusoidal, flip_sin_to_cos) then TimestepEmbedding: Linear, SiLU, Linear."""
    half = c0 // 2
    freqs = np.exp(-math.log(10000.0) * np.arange(half, dtype=np.float32) / half).astype(np.float32)
    tt = b.op("Unsqueeze", [t, b.const([1])], name="/time_proj/Unsqueeze")
    arg = b.op("Mul", [tt, b.const(freqs[None, :], np.float32)], name="/time_proj/Mul")
    emb = b.op("Concat", [b.op("Cos", [arg], name="/time_proj/Cos"), b.op("Sin", [arg], name="/time_proj/Sin")],
               name="/time_proj/Concat", axis=-1)
    emb = b.gemm(emb, "time_embedding.linear_1", c0, 4 * c0)
    emb = b.silu(emb, "time_embedding/act")
    return b.gemm(emb, "time_embedding.linear_2", 4 * c0, 4 * c0)


def unet(size: str = "bench", batch: int | str = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``batch``: the batch axis of every input and the output; a name (``"batch"``) makes it dynamic,
    as diffusers' and Optimum's exports are, so a pipeline can feed 2 rows (classifier-free guidance).
    The feeds have the batch given, or 1 for a dynamic one."""
    cfg = SIZES["unet"][size]
    c0, lat, heads = cfg["c0"], cfg["latent"], cfg["heads"]
    chans = [c0, 2 * c0, 4 * c0, 4 * c0]
    cross = [True, True, True, False]  # CrossAttnDownBlock2D x3, DownBlock2D
    b = Builder("unet", seed=2)
    sample = b.input("sample", TensorProto.FLOAT, [batch, 4, lat, lat])
    timestep = b.input("timestep", TensorProto.FLOAT, [batch])
    ctx = b.input("encoder_hidden_states", TensorProto.FLOAT, [batch, CONTEXT_LEN, CONTEXT_DIM])
    temb = _timestep_embedding(b, timestep, c0)
    tdim = 4 * c0
    x = b.conv(sample, "conv_in", 4, c0, 3)
    skips, skip_ch = [x], [c0]
    cin = c0
    for i, (cout, has_attn) in enumerate(zip(chans, cross)):
        for j in range(2):  # layers_per_block
            x = _resnet(b, x, f"down_blocks.{i}.resnets.{j}", cin, cout, temb, tdim)
            if has_attn:
                x = _transformer(b, x, ctx, f"down_blocks.{i}.attentions.{j}", cout, heads)
            skips.append(x)
            skip_ch.append(cout)
            cin = cout
        if i < len(chans) - 1:
            x = b.conv(x, f"down_blocks.{i}.downsamplers.0.conv", cout, cout, 3, stride=2)
            skips.append(x)
            skip_ch.append(cout)
    top = chans[-1]
    x = _resnet(b, x, "mid_block.resnets.0", top, top, temb, tdim)
    x = _transformer(b, x, ctx, "mid_block.attentions.0", top, heads)
    x = _resnet(b, x, "mid_block.resnets.1", top, top, temb, tdim)
    rev_ch, rev_cross = chans[::-1], cross[::-1]  # UpBlock2D, CrossAttnUpBlock2D x3
    cin = top
    for i, (cout, has_attn) in enumerate(zip(rev_ch, rev_cross)):
        for j in range(3):  # layers_per_block + 1, each concatenating one skip
            s, sc = skips.pop(), skip_ch.pop()
            x = b.op("Concat", [x, s], name=f"/up_blocks.{i}/Concat_{j}", axis=1)
            x = _resnet(b, x, f"up_blocks.{i}.resnets.{j}", cin + sc, cout, temb, tdim)
            if has_attn:
                x = _transformer(b, x, ctx, f"up_blocks.{i}.attentions.{j}", cout, heads)
            cin = cout
        if i < len(rev_ch) - 1:
            x = _upsample(b, x, f"up_blocks.{i}.upsamplers.0", cout)
    x = b.silu(b.group_norm(x, "conv_norm_out", cin, eps=1e-5), "conv_act")
    x = b.conv(x, "conv_out", cin, 4, 3)
    b.rename(x, "out_sample")
    b.output("out_sample", shape=[batch, 4, lat, lat])
    n = batch if isinstance(batch, int) else 1
    rng = np.random.default_rng(200)
    feeds = {
        "sample": rng.standard_normal((n, 4, lat, lat), dtype=np.float32),
        "timestep": np.full((n,), 981.0, dtype=np.float32),
        "encoder_hidden_states": rng.standard_normal((n, CONTEXT_LEN, CONTEXT_DIM), dtype=np.float32),
    }
    return b.model(), feeds


# ---------------------------------------------------------------------------
# CLIP text encoder (CLIPTextModel, ViT-L/14 as in SD 1.x)
def text_encoder(size: str = "bench") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    cfg = SIZES["text_encoder"][size]
    width, layers, heads, vocab = cfg["width"], cfg["layers"], cfg["heads"], cfg["vocab"]
    b = Builder("text_encoder", seed=3)
    ids = b.input("input_ids", TensorProto.INT64, [1, CONTEXT_LEN])
    tok = b.param("text_model.embeddings.token_embedding.weight", [vocab, width], std=0.02)
    pos = b.param("text_model.embeddings.position_embedding.weight", [CONTEXT_LEN, width], std=0.01)
    x = b.op("Gather", [tok, ids], name="/text_model/embeddings/token_embedding/Gather", axis=0)
    p = b.op("Gather", [pos, b.const(np.arange(CONTEXT_LEN)[None, :])],
             name="/text_model/embeddings/position_embedding/Gather", axis=0)
    x = b.op("Add", [x, p], name="/text_model/embeddings/Add")
    mask = np.triu(np.full((CONTEXT_LEN, CONTEXT_LEN), np.finfo(np.float32).min, dtype=np.float32), k=1)
    mask_name = b.const(mask[None, None], np.float32)
    for i in range(layers):
        name = f"text_model.encoder.layers.{i}"
        h = b.layer_norm(x, f"{name}.layer_norm1", width)
        q, k, v = (b.linear(h, f"{name}.self_attn.{t}_proj", width, width) for t in "qkv")
        a = b.attention(q, k, v, f"{name}/self_attn", heads, width, mask=mask_name)
        x = b.op("Add", [x, b.linear(a, f"{name}.self_attn.out_proj", width, width)], name=f"/{name}/Add")
        h = b.layer_norm(x, f"{name}.layer_norm2", width)
        h = b.quick_gelu(b.linear(h, f"{name}.mlp.fc1", width, 4 * width), f"{name}/mlp/act")
        x = b.op("Add", [x, b.linear(h, f"{name}.mlp.fc2", 4 * width, width)], name=f"/{name}/Add_1")
    x = b.layer_norm(x, "text_model.final_layer_norm", width)
    b.rename(x, "last_hidden_state")
    b.output("last_hidden_state", shape=[1, CONTEXT_LEN, width])
    rng = np.random.default_rng(300)
    n_tokens = 12  # BOS, some words, EOS, then padding with EOS like the SD tokenizer
    ids_arr = np.full((1, CONTEXT_LEN), vocab - 1, dtype=np.int64)
    ids_arr[0, 0] = vocab - 2
    ids_arr[0, 1:n_tokens] = rng.integers(0, vocab - 2, n_tokens - 1)
    return b.model(), {"input_ids": ids_arr}


# ---------------------------------------------------------------------------
# MobileNet V3-Large and V2 (torchvision layouts, BatchNorm folded into the convs)
def _div8(v: float) -> int:
    new = max(8, int(v + 4) // 8 * 8)
    return new + 8 if new < 0.9 * v else new


def _act(b: Builder, x: str, kind: str, name: str) -> str:
    if kind == "HS":
        return b.op("HardSwish", [x], name=f"/{name}/HardSwish")
    if kind == "RE6":
        return b.op("Clip", [x, b.const(0.0, np.float32), b.const(6.0, np.float32)], name=f"/{name}/Clip")
    return b.op("Relu", [x], name=f"/{name}/Relu")


def _conv_act(b: Builder, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
              act: str | None = "RE") -> str:
    gain = math.sqrt(2.0) if act else 1.0
    y = b.conv(x, f"{name}.0", cin, cout, k, stride=stride, group=group, gain=gain)
    return _act(b, y, act, name) if act else y


V3_LARGE = [  # kernel, expanded, out, squeeze-excite, activation, stride
    (3, 16, 16, False, "RE", 1), (3, 64, 24, False, "RE", 2), (3, 72, 24, False, "RE", 1),
    (5, 72, 40, True, "RE", 2), (5, 120, 40, True, "RE", 1), (5, 120, 40, True, "RE", 1),
    (3, 240, 80, False, "HS", 2), (3, 200, 80, False, "HS", 1), (3, 184, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1), (3, 480, 112, True, "HS", 1), (3, 672, 112, True, "HS", 1),
    (5, 672, 160, True, "HS", 2), (5, 960, 160, True, "HS", 1), (5, 960, 160, True, "HS", 1),
]


def mobilenet_v3(size: str = "bench") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    cfg = SIZES["mobilenet_v3"][size]
    res, wm = cfg["resolution"], cfg["width"]
    b = Builder("mobilenet_v3_large", seed=4)
    x = b.input("input", TensorProto.FLOAT, [1, 3, res, res])
    cin = _div8(16 * wm)
    x = _conv_act(b, x, "features.0", 3, cin, 3, stride=2, act="HS")
    for i, (k, exp, out, se, act, stride) in enumerate(V3_LARGE, start=1):
        exp, out = _div8(exp * wm), _div8(out * wm)
        name = f"features.{i}.block"
        h, j = x, 0
        if exp != cin:
            h = _conv_act(b, h, f"{name}.{j}", cin, exp, 1, act=act)
            j += 1
        h = _conv_act(b, h, f"{name}.{j}", exp, exp, k, stride=stride, group=exp, act=act)
        j += 1
        if se:
            sq = _div8(exp // 4)
            s = b.op("GlobalAveragePool", [h], name=f"/{name}.{j}/avgpool/GlobalAveragePool")
            s = b.op("Relu", [b.conv(s, f"{name}.{j}.fc1", exp, sq, 1)], name=f"/{name}.{j}/Relu")
            s = b.op("HardSigmoid", [b.conv(s, f"{name}.{j}.fc2", sq, exp, 1)], name=f"/{name}.{j}/HardSigmoid",
                     alpha=1.0 / 6.0, beta=0.5)
            h = b.op("Mul", [s, h], name=f"/{name}.{j}/Mul")
            j += 1
        h = _conv_act(b, h, f"{name}.{j}", exp, out, 1, act=None)
        x = b.op("Add", [h, x], name=f"/features.{i}/Add") if stride == 1 and cin == out else h
        cin = out
    last = 6 * cin
    x = _conv_act(b, x, f"features.{len(V3_LARGE) + 1}", cin, last, 1, act="HS")
    x = b.op("GlobalAveragePool", [x], name="/avgpool/GlobalAveragePool")
    x = b.op("Flatten", [x], name="/Flatten", axis=1)
    x = b.op("HardSwish", [b.gemm(x, "classifier.0", last, 1280)], name="/classifier/classifier.1/HardSwish")
    x = b.gemm(x, "classifier.3", 1280, 1000)
    b.rename(x, "logits")
    b.output("logits", shape=[1, 1000])
    rng = np.random.default_rng(400)
    return b.model(), {"input": rng.standard_normal((1, 3, res, res), dtype=np.float32)}


V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mobilenet_v2(size: str = "bench") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    cfg = SIZES["mobilenet_v2"][size]
    res, wm = cfg["resolution"], cfg["width"]
    b = Builder("mobilenet_v2", seed=5)
    x = b.input("input", TensorProto.FLOAT, [1, 3, res, res])
    cin = _div8(32 * wm)
    x = _conv_act(b, x, "features.0", 3, cin, 3, stride=2, act="RE6")
    idx = 1
    for t, c, n, s in V2:
        out = _div8(c * wm)
        for r in range(n):
            stride = s if r == 0 else 1
            name, hid = f"features.{idx}.conv", cin * t
            h, j = x, 0
            if t != 1:
                h = _conv_act(b, h, f"{name}.{j}", cin, hid, 1, act="RE6")
                j += 1
            h = _conv_act(b, h, f"{name}.{j}", hid, hid, 3, stride=stride, group=hid, act="RE6")
            h = b.conv(h, f"{name}.{j + 1}", hid, out, 1)
            x = b.op("Add", [x, h], name=f"/features.{idx}/Add") if stride == 1 and cin == out else h
            cin, idx = out, idx + 1
    x = _conv_act(b, x, f"features.{idx}", cin, 1280, 1, act="RE6")
    x = b.op("GlobalAveragePool", [x], name="/GlobalAveragePool")
    x = b.op("Flatten", [x], name="/Flatten", axis=1)
    x = b.gemm(x, "classifier.1", 1280, 1000)
    b.rename(x, "logits")
    b.output("logits", shape=[1, 1000])
    rng = np.random.default_rng(500)
    return b.model(), {"input": rng.standard_normal((1, 3, res, res), dtype=np.float32)}


MODELS: dict[str, Callable[[str], tuple[onnx.ModelProto, dict[str, np.ndarray]]]] = {
    "vae_decoder": vae_decoder,
    "unet": unet,
    "text_encoder": text_encoder,
    "mobilenet_v3": mobilenet_v3,
    "mobilenet_v2": mobilenet_v2,
    **dit_blocks.BUILDERS,  # the transformer row: Flux double- and single-stream blocks, an SD3.5 block
}
SIZES.update(dit_blocks.SIZES)


def build(name: str, size: str = "bench") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model ``name`` at ``size`` ("tiny", "bench" or "full") and its inputs."""
    if name not in MODELS:
        raise KeyError(f"unknown bench model {name!r}; known: {', '.join(MODELS)}")
    if size not in SIZES[name]:
        raise KeyError(f"unknown size {size!r}; known: {', '.join(SIZES[name])}")
    return MODELS[name](size)
