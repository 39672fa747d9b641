"""Weight-free full-size graphs for `sdrt plan` demonstrations: SDXL's UNet and Flux.1's transformer.

Built with sdrt.testing's Builder, every parameter written as a typed, shaped initializer whose data
lives in an external file that is never written (as `sdrt strip` leaves a graph without its weights
file), so the graphs are a few hundred KB and cost nothing to hold. Layer structure follows the
releases' configurations (stabilityai/stable-diffusion-xl-base-1.0 unet/config.json;
black-forest-labs/FLUX.1-dev transformer/config.json); simplifications that change the op counts by
little are named where made (Flux: RoPE and the QK RMS norms are left out; the second norm of each double block gets its own
small modulation, so the graph holds ~3% more parameters than the release's 11.9 B). The SD 1.5 parts, CLIP-L,
CLIP-G, T5-XXL and the VAEs come from sdrt's shipped weight-free graphs (the `ckpt` work).

    python scripts/make_plan_graphs.py OUT_DIR
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from sdrt.graph import STRIPPED_KEY
from sdrt.testing import models
from sdrt.testing.builder import Builder


class WeightFree(Builder):
    def param(self, name, shape, std=None, fill=None):
        t = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
        t.data_location = TensorProto.EXTERNAL
        n = int(np.prod(shape)) * 4
        for k, v in (("location", "weights.safetensors"), ("offset", "0"), ("length", str(n))):
            t.external_data.add(key=k, value=v)
        self.inits.append(t) if hasattr(self, "inits") else self.initializers.append(t)
        return name

    def _shift_param(self, name, offset):
        pass

    def model(self):
        m = super().model()
        m.metadata_props.add(key=STRIPPED_KEY, value="weights.safetensors")
        return m


def _block(b, h, ctx, name, c, heads, ctx_dim):
    n = b.layer_norm(h, f"{name}.norm1", c)
    q, k, v = (b.linear(n, f"{name}.attn1.to_{t}", c, c, bias=False) for t in "qkv")
    h = b.op("Add", [b.linear(b.attention(q, k, v, f"{name}/attn1", heads, c), f"{name}.attn1.to_out.0", c, c), h])
    n = b.layer_norm(h, f"{name}.norm2", c)
    q = b.linear(n, f"{name}.attn2.to_q", c, c, bias=False)
    k = b.linear(ctx, f"{name}.attn2.to_k", ctx_dim, c, bias=False)
    v = b.linear(ctx, f"{name}.attn2.to_v", ctx_dim, c, bias=False)
    h = b.op("Add", [b.linear(b.attention(q, k, v, f"{name}/attn2", heads, c), f"{name}.attn2.to_out.0", c, c), h])
    n = b.layer_norm(h, f"{name}.norm3", c)
    proj = b.linear(n, f"{name}.ff.net.0.proj", c, 8 * c)
    hid, gate = b.op_multi("Split", [proj, b.const([4 * c, 4 * c])], outputs=2, axis=-1)
    f = b.linear(b.op("Mul", [hid, b.gelu_erf(gate, f"{name}/gelu")]), f"{name}.ff.net.2", 4 * c, c)
    return b.op("Add", [f, h])


def _transformer2d(b, x, ctx, name, c, depth, ctx_dim):
    shape = b.op("Shape", [x])
    h = b.group_norm(x, f"{name}.norm", c)
    h = b.op("Transpose", [b.op("Reshape", [h, b.const([0, c, -1])])], perm=[0, 2, 1])
    h = b.linear(h, f"{name}.proj_in", c, c)
    for d in range(depth):
        h = _block(b, h, ctx, f"{name}.transformer_blocks.{d}", c, c // 64, ctx_dim)
    h = b.linear(h, f"{name}.proj_out", c, c)
    h = b.op("Reshape", [b.op("Transpose", [h], perm=[0, 2, 1]), shape])
    return b.op("Add", [h, x])


def sdxl_unet():
    b = WeightFree("sdxl_unet")
    sample = b.input("sample", TensorProto.FLOAT, ["batch", 4, "h", "w"])
    t = b.input("timestep", TensorProto.FLOAT, ["batch"])
    ctx = b.input("encoder_hidden_states", TensorProto.FLOAT, ["batch", "seq", 2048])
    te = b.input("text_embeds", TensorProto.FLOAT, ["batch", 1280])
    ids = b.input("time_ids", TensorProto.FLOAT, ["batch", 6])
    temb = models._timestep_embedding(b, t, 320)  # 320 -> 1280 -> 1280
    freqs = np.exp(-math.log(10000.0) * np.arange(128, dtype=np.float32) / 128).astype(np.float32)
    arg = b.op("Mul", [b.op("Unsqueeze", [ids, b.const([2])]), b.const(freqs[None, None, :], np.float32)])
    tid = b.op("Reshape", [b.op("Concat", [b.op("Cos", [arg]), b.op("Sin", [arg])], axis=-1), b.const([0, 1536])])
    add = b.gemm(b.op("Concat", [te, tid], axis=1), "add_embedding.linear_1", 2816, 1280)
    add = b.gemm(b.silu(add, "add_embedding/act"), "add_embedding.linear_2", 1280, 1280)
    temb = b.op("Add", [temb, add])
    chans, depth = [320, 640, 1280], [0, 2, 10]
    x = b.conv(sample, "conv_in", 4, 320, 3)
    skips, skip_ch, cin = [x], [320], 320
    for i, (cout, dep) in enumerate(zip(chans, depth)):
        for j in range(2):
            x = models._resnet(b, x, f"down_blocks.{i}.resnets.{j}", cin, cout, temb, 1280)
            if dep:
                x = _transformer2d(b, x, ctx, f"down_blocks.{i}.attentions.{j}", cout, dep, 2048)
            skips.append(x)
            skip_ch.append(cout)
            cin = cout
        if i < 2:
            x = b.conv(x, f"down_blocks.{i}.downsamplers.0.conv", cout, cout, 3, stride=2)
            skips.append(x)
            skip_ch.append(cout)
    x = models._resnet(b, x, "mid_block.resnets.0", 1280, 1280, temb, 1280)
    x = _transformer2d(b, x, ctx, "mid_block.attentions.0", 1280, 10, 2048)
    x = models._resnet(b, x, "mid_block.resnets.1", 1280, 1280, temb, 1280)
    cin = 1280
    for i, (cout, dep) in enumerate(zip(chans[::-1], depth[::-1])):
        for j in range(3):
            s, sc = skips.pop(), skip_ch.pop()
            x = b.op("Concat", [x, s], axis=1)
            x = models._resnet(b, x, f"up_blocks.{i}.resnets.{j}", cin + sc, cout, temb, 1280)
            if dep:
                x = _transformer2d(b, x, ctx, f"up_blocks.{i}.attentions.{j}", cout, dep, 2048)
            cin = cout
        if i < 2:
            x = models._upsample(b, x, f"up_blocks.{i}.upsamplers.0", cout)
    x = b.conv(b.silu(b.group_norm(x, "conv_norm_out", cin, eps=1e-5), "conv_act"), "conv_out", cin, 4, 3)
    b.rename(x, "out_sample")
    b.output("out_sample", shape=["batch", 4, "h", "w"])
    return b.model()


def _temb(b, t, name, dim=256, out=3072):
    """Timesteps (sinusoidal) then a Linear, SiLU, Linear embedder, each node named under ``name``."""
    half = dim // 2
    freqs = np.exp(-math.log(10000.0) * np.arange(half, dtype=np.float32) / half).astype(np.float32)
    arg = b.op("Mul", [b.op("Unsqueeze", [t, b.const([1])], name=f"/{name}/Unsqueeze"),
                       b.const(freqs[None, :], np.float32)], name=f"/{name}/Mul")
    emb = b.op("Concat", [b.op("Cos", [arg], name=f"/{name}/Cos"), b.op("Sin", [arg], name=f"/{name}/Sin")],
               name=f"/{name}/Concat", axis=-1)
    emb = b.gemm(emb, f"{name}.linear_1", dim, out)
    return b.gemm(b.silu(emb, f"{name}/act"), f"{name}.linear_2", out, out)


def _joint_attention(b, q, k, v, name, heads, dim):
    return b.attention(q, k, v, name, heads, dim)


def flux_transformer(double=19, single=38, dim=3072, heads=24):
    b = WeightFree("flux_transformer")
    img = b.input("hidden_states", TensorProto.FLOAT, ["batch", "img_tokens", 64])
    txt = b.input("encoder_hidden_states", TensorProto.FLOAT, ["batch", "txt_tokens", 4096])
    pooled = b.input("pooled_projections", TensorProto.FLOAT, ["batch", 768])
    t = b.input("timestep", TensorProto.FLOAT, ["batch"])
    g = b.input("guidance", TensorProto.FLOAT, ["batch"])
    vec = b.op("Add", [_temb(b, t, "time_text_embed.timestep_embedder"),
                       _temb(b, g, "time_text_embed.guidance_embedder")])
    vec = b.op("Add", [vec, b.gemm(b.silu(b.gemm(pooled, "time_text_embed.text_embedder.linear_1", 768, dim), "te"),
                                   "time_text_embed.text_embedder.linear_2", dim, dim)])
    sv = b.silu(vec, "vec_act")
    x = b.linear(img, "x_embedder", 64, dim)
    c = b.linear(txt, "context_embedder", 4096, dim)

    def modulated(h, name, n_mod):
        mod = b.gemm(sv, f"{name}.norm1.linear", dim, n_mod * dim)
        n = b.layer_norm(h, f"{name}.norm1.norm", dim)
        scale = b.op("Unsqueeze", [b.op("Slice", [mod, b.const([0]), b.const([dim]), b.const([1])]), b.const([1])])
        return b.op("Add", [b.op("Mul", [n, scale]), scale])

    def mlp(h, name):
        u = b.linear(h, f"{name}.net.0.proj", dim, 4 * dim)
        u = b.gelu_erf(u, f"{name}/gelu")
        return b.linear(u, f"{name}.net.2", 4 * dim, dim)

    for i in range(double):
        name = f"transformer_blocks.{i}"
        nx, nc = modulated(x, f"{name}.img", 6), modulated(c, f"{name}.txt", 6)
        qkv = [b.op("Concat", [b.linear(nc, f"{name}.attn.add_{t}_proj", dim, dim),
                               b.linear(nx, f"{name}.attn.to_{t}", dim, dim)], axis=1) for t in "qkv"]
        a = _joint_attention(b, *qkv, f"{name}/attn", heads, dim)
        ac, ax = b.op_multi("Split", [a, b.op("Concat", [b.op("Slice", [b.op("Shape", [c]), b.const([1]), b.const([2])]),
                                                         b.op("Slice", [b.op("Shape", [x]), b.const([1]), b.const([2])])],
                                              axis=0)], outputs=2, axis=1)
        x = b.op("Add", [x, b.linear(ax, f"{name}.attn.to_out.0", dim, dim)])
        c = b.op("Add", [c, b.linear(ac, f"{name}.attn.to_add_out", dim, dim)])
        x = b.op("Add", [x, mlp(modulated(x, f"{name}.img2", 0 or 1), f"{name}.ff")])
        c = b.op("Add", [c, mlp(modulated(c, f"{name}.txt2", 1), f"{name}.ff_context")])
    h = b.op("Concat", [c, x], axis=1)
    for i in range(single):
        name = f"single_transformer_blocks.{i}"
        n = modulated(h, name, 3)
        q, k, v = (b.linear(n, f"{name}.attn.to_{t}", dim, dim) for t in "qkv")
        a = _joint_attention(b, q, k, v, f"{name}/attn", heads, dim)
        m = b.gelu_erf(b.linear(n, f"{name}.proj_mlp", dim, 4 * dim), f"{name}/gelu")
        h = b.op("Add", [h, b.linear(b.op("Concat", [a, m], axis=-1), f"{name}.proj_out", 5 * dim, dim)])
    x = b.op("Slice", [h, b.op("Slice", [b.op("Shape", [c]), b.const([1]), b.const([2])]), b.const([1 << 30]),
                       b.const([1])])
    x = b.linear(modulated(x, "norm_out", 2), "proj_out", dim, 64)
    b.rename(x, "out_hidden_states")
    b.output("out_hidden_states", shape=["batch", "img_tokens", 64])
    return b.model()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, fn in (("sdxl_unet", sdxl_unet), ("flux_transformer", flux_transformer)):
        m = fn()
        params = sum(int(np.prod(t.dims)) for t in m.graph.initializer)
        (out / f"{name}.onnx").write_bytes(m.SerializeToString())
        print(f"{name}: {len(m.graph.node)} nodes, {params / 1e9:.2f} B parameters")
