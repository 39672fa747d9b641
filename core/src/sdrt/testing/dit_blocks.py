"""Bench models for the diffusion transformers: one Flux.1 double-stream block, one single-stream block, and
one SD3.5 (Large) joint block, at the real width, built with ``Builder`` (no torch).

Each follows diffusers' module (``FluxTransformerBlock``, ``FluxSingleTransformerBlock``,
``JointTransformerBlock`` with RMS q/k norm) and writes its ops as ``torch.onnx.export`` does at opset 17
(checked against the tiny diffusers exports under tests/data/pipelines): AdaLayerNormZero as SiLU, Gemm,
Split and LayerNormalization without affine, RMSNorm as Pow/ReduceMean/Add/Sqrt/Div/Mul, the rotary embedding
as strided Slices, Neg, Unsqueeze, Concat and Reshape, attention as MatMul/Softmax/MatMul, GELU (tanh) as its
Mul/Tanh polynomial. The rotary cos/sin tables (``[text + image, head_dim]``) are inputs, as the full
transformer computes them once per run from ``img_ids``/``txt_ids``.

Sizes: ``bench`` is the real width and token count (Flux: 3072 wide, 24 heads, 4096 image + 512 text tokens,
a 1024x1024 image; SD3.5 Large: 2432 wide, 38 heads, 4096 image + 333 text tokens); ``tiny`` is for tests.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from .builder import Builder

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "flux_double_block": {
        "full": {"dim": 3072, "heads": 24, "img": 4096, "txt": 512},
        "bench": {"dim": 3072, "heads": 24, "img": 4096, "txt": 512},
        "tiny": {"dim": 64, "heads": 4, "img": 16, "txt": 8},
    },
    "flux_single_block": {
        "full": {"dim": 3072, "heads": 24, "img": 4096, "txt": 512},
        "bench": {"dim": 3072, "heads": 24, "img": 4096, "txt": 512},
        "tiny": {"dim": 64, "heads": 4, "img": 16, "txt": 8},
    },
    "sd35_block": {
        "full": {"dim": 2432, "heads": 38, "img": 4096, "txt": 333},
        "bench": {"dim": 2432, "heads": 38, "img": 4096, "txt": 333},
        "tiny": {"dim": 64, "heads": 4, "img": 16, "txt": 8},
    },
}

F32 = np.float32


def _layer_norm_plain(b: Builder, x: str, name: str, dim: int) -> str:
    """nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6): constant ones and zeros as scale and bias."""
    return b.op("LayerNormalization", [x, b.const(np.ones(dim), F32), b.const(np.zeros(dim), F32)],
                name=f"/{name}/LayerNormalization", axis=-1, epsilon=1e-6)


def _ada_ln(b: Builder, x: str, emb: str, name: str, dim: int, chunks: int) -> tuple[str, list[str]]:
    """AdaLayerNormZero(Single): Linear(SiLU(temb)) split in ``chunks``; x = LN(x) (1 + scale) + shift.
    Returns the modulated x and the remaining chunks (gate, ...), each unsqueezed to [B, 1, dim]."""
    mod = b.gemm(emb, f"{name}.linear", dim, chunks * dim)
    parts = b.op_multi("Split", [mod, b.const([dim] * chunks)], name=f"/{name}/Split", outputs=chunks, axis=1)
    parts = [b.op("Unsqueeze", [p, b.const([1])], name=f"/{name}/Unsqueeze_{i}") for i, p in enumerate(parts)]
    shift, scale = parts[0], parts[1]
    h = _layer_norm_plain(b, x, f"{name}/norm", dim)
    one = b.op("Add", [scale, b.const(1.0, F32)], name=f"/{name}/Add")
    h = b.op("Mul", [h, one], name=f"/{name}/Mul")
    return b.op("Add", [h, shift], name=f"/{name}/Add_1"), parts[2:]


def _rms_norm(b: Builder, x: str, name: str, dim: int) -> str:
    sq = b.op("Pow", [x, b.const(2.0, F32)], name=f"/{name}/Pow")
    mean = b.op("ReduceMean", [sq], name=f"/{name}/ReduceMean", axes=[-1], keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [mean, b.const(1e-6, F32)], name=f"/{name}/Add")], name=f"/{name}/Sqrt")
    inv = b.op("Div", [b.const(1.0, F32), std], name=f"/{name}/Div")
    y = b.op("Mul", [x, inv], name=f"/{name}/Mul")
    w = b.param(f"{name}.weight", [dim], std=0.1)
    b._shift_param(w, 1.0)
    return b.op("Mul", [y, w], name=f"/{name}/Mul_1")


def _heads(b: Builder, x: str, name: str, heads: int, hd: int) -> str:
    return b.op("Reshape", [x, b.const([0, -1, heads, hd])], name=f"/{name}/Reshape")


def _rotary(b: Builder, x: str, cos: str, sin: str, name: str) -> str:
    """x [B, N, H, d] * cos + rotate_half_interleaved(x) * sin, with cos/sin [N, 1, d]."""
    big = 1 << 62
    last = b.const([-1])
    real = b.op("Slice", [x, b.const([0]), b.const([big]), last, b.const([2])], name=f"/{name}/Slice")
    imag = b.op("Slice", [x, b.const([1]), b.const([big]), last, b.const([2])], name=f"/{name}/Slice_1")
    neg = b.op("Neg", [imag], name=f"/{name}/Neg")
    pair = b.op("Concat", [b.op("Unsqueeze", [neg, last], name=f"/{name}/Unsqueeze"),
                           b.op("Unsqueeze", [real, last], name=f"/{name}/Unsqueeze_1")], name=f"/{name}/Concat",
                axis=-1)
    rot = b.op("Reshape", [pair, b.const([0, 0, 0, -1])], name=f"/{name}/Reshape")
    a = b.op("Mul", [x, cos], name=f"/{name}/Mul")
    return b.op("Add", [a, b.op("Mul", [rot, sin], name=f"/{name}/Mul_1")], name=f"/{name}/Add")


def _sdpa(b: Builder, q: str, k: str, v: str, name: str, heads: int, hd: int) -> str:
    """q, k, v [B, N, H, d] -> [B, N, H d]: scaled_dot_product_attention as torch exports it."""
    qt = b.op("Transpose", [q], name=f"/{name}/Transpose", perm=[0, 2, 1, 3])
    kt = b.op("Transpose", [k], name=f"/{name}/Transpose_1", perm=[0, 2, 3, 1])
    vt = b.op("Transpose", [v], name=f"/{name}/Transpose_2", perm=[0, 2, 1, 3])
    s = b.op("MatMul", [qt, kt], name=f"/{name}/MatMul")
    s = b.op("Mul", [s, b.const(1.0 / math.sqrt(hd), F32)], name=f"/{name}/Mul")
    p = b.op("Softmax", [s], name=f"/{name}/Softmax", axis=-1)
    o = b.op("MatMul", [p, vt], name=f"/{name}/MatMul_1")
    o = b.op("Transpose", [o], name=f"/{name}/Transpose_3", perm=[0, 2, 1, 3])
    return b.op("Reshape", [o, b.const([0, -1, heads * hd])], name=f"/{name}/Reshape")


def _gelu_tanh(b: Builder, x: str, name: str) -> str:
    """GELU(approximate='tanh'), 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in torch's opset-17 order:
    the cube as x * (x * x), constants first."""
    cube = b.op("Mul", [x, b.op("Mul", [x, x], name=f"/{name}/Mul")], name=f"/{name}/Mul_1")
    inner = b.op("Add", [x, b.op("Mul", [b.const(0.044715, F32), cube], name=f"/{name}/Mul_2")], name=f"/{name}/Add")
    t = b.op("Tanh", [b.op("Mul", [b.const(math.sqrt(2 / math.pi), F32), inner], name=f"/{name}/Mul_3")],
             name=f"/{name}/Tanh")
    gate = b.op("Mul", [x, b.op("Add", [b.const(1.0, F32), t], name=f"/{name}/Add_1")], name=f"/{name}/Mul_4")
    return b.op("Mul", [b.const(0.5, F32), gate], name=f"/{name}/Mul_5")


def _ff(b: Builder, x: str, name: str, dim: int) -> str:
    h = _gelu_tanh(b, b.linear(x, f"{name}.net.0.proj", dim, 4 * dim), f"{name}/net.0")
    return b.linear(h, f"{name}.net.2", 4 * dim, dim)


def _gated(b: Builder, x: str, gate: str, y: str, name: str) -> str:
    return b.op("Add", [x, b.op("Mul", [gate, y], name=f"/{name}/Mul")], name=f"/{name}/Add")


def _qkv(b: Builder, x: str, name: str, dim: int, heads: int, prefix: str = "to_", norm: str = "norm_") -> list[str]:
    hd = dim // heads
    out = []
    for t in "qkv":
        h = _heads(b, b.linear(x, f"{name}.{prefix}{t}" + ("_proj" if prefix == "add_" else ""), dim, dim),
                   f"{name}/{prefix}{t}", heads, hd)
        if t != "v":
            h = _rms_norm(b, h, f"{name}.{norm}{t}", hd)
        out.append(h)
    return out


def _inputs(b: Builder, cfg: dict[str, int], rotary: bool, joint: bool = True) -> dict[str, str]:
    d, n_img, n_txt = cfg["dim"], cfg["img"], cfg["txt"]
    names = {"temb": b.input("temb", TensorProto.FLOAT, [1, d])}
    if joint:
        names["img"] = b.input("hidden_states", TensorProto.FLOAT, [1, n_img, d])
        names["txt"] = b.input("encoder_hidden_states", TensorProto.FLOAT, [1, n_txt, d])
    else:
        names["img"] = b.input("hidden_states", TensorProto.FLOAT, [1, n_txt + n_img, d])
    if rotary:
        hd = d // cfg["heads"]
        for t in ("cos", "sin"):
            raw = b.input(f"freqs_{t}", TensorProto.FLOAT, [n_txt + n_img, hd])
            names[t] = b.op("Unsqueeze", [raw, b.const([1])], name=f"/rotary/Unsqueeze_{t}")
    return names


def _feeds(cfg: dict[str, int], rotary: bool, joint: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, n_img, n_txt, hd = cfg["dim"], cfg["img"], cfg["txt"], cfg["dim"] // cfg["heads"]
    feeds = {"temb": rng.standard_normal((1, d), dtype=F32)}
    if joint:
        feeds["hidden_states"] = rng.standard_normal((1, n_img, d), dtype=F32)
        feeds["encoder_hidden_states"] = rng.standard_normal((1, n_txt, d), dtype=F32)
    else:
        feeds["hidden_states"] = rng.standard_normal((1, n_txt + n_img, d), dtype=F32)
    if rotary:  # Flux's axes (16, 56, 56) of ids (0, row, col) for image tokens, zeros for text, theta 10000
        side = int(math.isqrt(n_img))
        ids = np.zeros((n_txt + n_img, 3), np.float64)
        ids[n_txt:, 1] = np.repeat(np.arange(side), n_img // side)[:n_img]
        ids[n_txt:, 2] = np.tile(np.arange(n_img // side), side)[:n_img]
        a0 = hd // 8 // 2 * 2
        a1 = (hd - a0) // 2 // 2 * 2
        axes = [a0, a1, hd - a0 - a1]  # 16, 56, 56 at head_dim 128
        angles = []
        for i, dim_i in enumerate(axes):
            freqs = 1.0 / 10000 ** (np.arange(0, dim_i, 2, dtype=np.float64) / dim_i)
            angles.append(np.repeat(np.outer(ids[:, i], freqs), 2, axis=1))
        ang = np.concatenate(angles, axis=1)
        feeds["freqs_cos"], feeds["freqs_sin"] = np.cos(ang).astype(F32), np.sin(ang).astype(F32)
    return feeds


def _joint_tail(b: Builder, name: str, cfg: dict[str, int], x: dict[str, str], o: str, first: str,
                img_mods: tuple[str, str, str, str], txt_mods: tuple[str, str, str, str]) -> None:
    """A joint (double-stream) block after attention: the attention output split into its image and text
    tokens (``first`` holds the tokens that come first: Flux puts the text first, SD3 the image), each
    projected, gated into its stream, then an AdaLN-modulated feed-forward; the two block outputs."""
    d = cfg["dim"]
    lead = cfg[first]
    head = b.op("Slice", [o, b.const([0]), b.const([lead]), b.const([1])], name=f"/{name}/attn/Slice")
    rest = b.op("Slice", [o, b.const([lead]), b.const([1 << 62]), b.const([1])], name=f"/{name}/attn/Slice_1")
    img_o, ctx_o = (rest, head) if first == "txt" else (head, rest)
    img_o = b.linear(img_o, f"{name}.attn.to_out.0", d, d)
    ctx_o = b.linear(ctx_o, f"{name}.attn.to_add_out", d, d)
    outs = []
    for stream, a, (gate, sh, sc, g2), tag in ((x["img"], img_o, img_mods, "ff"), (x["txt"], ctx_o, txt_mods,
                                                                                     "ff_context")):
        y = _gated(b, stream, gate, a, f"{name}/{tag}/attn_res")
        n = _layer_norm_plain(b, y, f"{name}/{tag}/norm2", d)
        n = b.op("Add", [b.op("Mul", [n, b.op("Add", [sc, b.const(1.0, F32)], name=f"/{name}/{tag}/Add_s")],
                              name=f"/{name}/{tag}/Mul_s"), sh], name=f"/{name}/{tag}/Add_sh")
        outs.append(_gated(b, y, g2, _ff(b, n, f"{name}.{tag}", d), f"{name}/{tag}/ff_res"))
    b.rename(outs[1], "out_encoder_hidden_states")
    b.rename(outs[0], "out_hidden_states")
    b.output("out_encoder_hidden_states", shape=[1, cfg["txt"], d])
    b.output("out_hidden_states", shape=[1, cfg["img"], d])


def _joint_head(b: Builder, name: str, cfg: dict[str, int], x: dict[str, str], first: str
                ) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
    """A double-stream block's head (Flux, SD3.5): AdaLayerNormZero of the image and the context stream, each
    stream's q/k/v, and q, k, v of both streams joined along the tokens, ``first`` (``"txt"``: Flux,
    ``"img"``: SD3) first. Returns the joined q, k, v and each stream's (gate, shift, scale, gate) of its MLP."""
    d, heads = cfg["dim"], cfg["heads"]
    emb = b.silu(x["temb"], "norm1/silu")
    h, mods = _ada_ln(b, x["img"], emb, f"{name}.norm1", d, 6)
    c, cmods = _ada_ln(b, x["txt"], emb, f"{name}.norm1_context", d, 6)
    q, k, v = _qkv(b, h, f"{name}.attn", d, heads)
    cq, ck, cv = _qkv(b, c, f"{name}.attn", d, heads, prefix="add_", norm="norm_added_")
    joint = [b.op("Concat", [a, m] if first == "txt" else [m, a], name=f"/{name}/attn/Concat_{t}", axis=1)
             for t, a, m in (("q", cq, q), ("k", ck, k), ("v", cv, v))]
    return joint, tuple(mods), tuple(cmods)


def flux_double_block(size: str | dict[str, int] = "bench") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    cfg = size if isinstance(size, dict) else SIZES["flux_double_block"][size]
    d, heads = cfg["dim"], cfg["heads"]
    b = Builder("flux_double_block", seed=11)
    x = _inputs(b, cfg, rotary=True)
    name = "transformer_blocks.0"
    joint, mods, cmods = _joint_head(b, name, cfg, x, "txt")
    jq = _rotary(b, joint[0], x["cos"], x["sin"], f"{name}/attn/rotary_q")
    jk = _rotary(b, joint[1], x["cos"], x["sin"], f"{name}/attn/rotary_k")
    o = _sdpa(b, jq, jk, joint[2], f"{name}/attn/sdpa", heads, d // heads)
    _joint_tail(b, name, cfg, x, o, "txt", mods, cmods)
    return b.model(), _feeds(cfg, True, True, 1100)


def flux_single_block(size: str | dict[str, int] = "bench") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    cfg = size if isinstance(size, dict) else SIZES["flux_single_block"][size]
    d, heads = cfg["dim"], cfg["heads"]
    b = Builder("flux_single_block", seed=12)
    x = _inputs(b, cfg, rotary=True, joint=False)
    name = "single_transformer_blocks.0"
    emb = b.silu(x["temb"], f"{name}/norm/silu")
    h, (gate,) = _ada_ln(b, x["img"], emb, f"{name}.norm", d, 3)
    mlp = _gelu_tanh(b, b.linear(h, f"{name}.proj_mlp", d, 4 * d), f"{name}/act_mlp")
    q, k, v = _qkv(b, h, f"{name}.attn", d, heads)
    q = _rotary(b, q, x["cos"], x["sin"], f"{name}/attn/rotary_q")
    k = _rotary(b, k, x["cos"], x["sin"], f"{name}/attn/rotary_k")
    a = _sdpa(b, q, k, v, f"{name}/attn/sdpa", heads, d // heads)
    cat = b.op("Concat", [a, mlp], name=f"/{name}/Concat", axis=2)
    out = _gated(b, x["img"], gate, b.linear(cat, f"{name}.proj_out", 5 * d, d), f"{name}/res")
    b.rename(out, "out_hidden_states")
    b.output("out_hidden_states", shape=[1, cfg["txt"] + cfg["img"], d])
    return b.model(), _feeds(cfg, True, False, 1200)


def sd35_block(size: str = "bench") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    cfg = SIZES["sd35_block"][size]
    d, heads = cfg["dim"], cfg["heads"]
    b = Builder("sd35_block", seed=13)
    x = _inputs(b, cfg, rotary=False)
    name = "transformer_blocks.0"
    joint, mods, cmods = _joint_head(b, name, cfg, x, "img")  # SD3: image tokens first, then the context
    o = _sdpa(b, *joint, f"{name}/attn/sdpa", heads, d // heads)
    _joint_tail(b, name, cfg, x, o, "img", mods, cmods)
    return b.model(), _feeds(cfg, False, True, 1300)


BUILDERS = {"flux_double_block": flux_double_block, "flux_single_block": flux_single_block,
            "sd35_block": sd35_block}


def flux_chain(double: int, single: int, size: str | dict[str, int] = "tiny", data_file: Any = None,
               stub: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A reduced-depth Flux.1 transformer body: ``double`` double-stream blocks, the text and image streams
    concatenated (text first, as Flux does), then ``single`` single-stream blocks; every block reads the same
    ``temb`` and rotary tables. Block ``k`` of a kind holds block 0's weights times ``1 + k / 100``, so no two
    blocks hold equal values. ``size``: a name of ``SIZES`` or ``{"dim", "heads", "img", "txt"}``.
    ``data_file``: the weights are appended there block by block as external data (a full-width chain is
    several GB, above protobuf's 2 GB), with the location relative to the file's folder. ``stub``: the weights
    are not kept at all: the graph is a weight-free one (as ``sdrt strip`` writes) whose weights the caller
    supplies as ``sdrt.Weights`` (a full-width chain without the disk space for it)."""
    from onnx import helper, numpy_helper

    cfg = size if isinstance(size, dict) else SIZES["flux_double_block"][size]
    d, hd = cfg["dim"], cfg["dim"] // cfg["heads"]
    shared = {"temb", "freqs_cos", "freqs_sin"}
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    out = open(data_file, "wb") if data_file is not None else None  # noqa: SIM115 (closed below)
    feeds: dict[str, np.ndarray] = {}

    def add(model: onnx.ModelProto, names: dict[str, str], prefix: str, scale: float) -> None:
        def rn(x: str) -> str:
            return x if not x or x in shared else names.get(x, prefix + x)

        for node in model.graph.node:
            node.input[:] = [rn(x) for x in node.input]
            node.output[:] = [rn(x) for x in node.output]
            node.name = prefix + node.name
            nodes.append(node)
        for t in model.graph.initializer:
            arr = numpy_helper.to_array(t)
            if arr.dtype == np.float32 and arr.size >= 1024 and scale != 1.0:
                arr = arr * np.float32(scale)
            new = numpy_helper.from_array(arr, rn(t.name))
            if stub and arr.size >= 1024:
                new.ClearField("raw_data")
                new.data_location = TensorProto.EXTERNAL
                for k, v in (("location", "weights.safetensors"), ("offset", "0"), ("length", str(arr.nbytes))):
                    e = new.external_data.add()
                    e.key, e.value = k, v
            elif out is not None and arr.size >= 1024:
                offset = out.tell()
                out.write(new.raw_data)
                new.ClearField("raw_data")
                new.data_location = TensorProto.EXTERNAL
                for k, v in (("location", os.path.basename(data_file)), ("offset", str(offset)),
                             ("length", str(arr.nbytes))):
                    e = new.external_data.add()
                    e.key, e.value = k, v
            inits.append(new)

    try:
        for k in range(double):
            model, f = flux_double_block(cfg)
            feeds = feeds or f
            add(model, {"hidden_states": f"h{k}", "encoder_hidden_states": f"e{k}", "out_hidden_states": f"h{k + 1}",
                        "out_encoder_hidden_states": f"e{k + 1}"}, f"double{k}/", 1 + k / 100)
        if double:
            nodes.append(helper.make_node("Concat", [f"e{double}", f"h{double}"], ["s0"], name="/Concat", axis=1))
        for j in range(single):
            model, f = flux_single_block(cfg)
            feeds = feeds or f
            add(model, {"hidden_states": "s0" if j == 0 and double else f"s{j}", "out_hidden_states": f"s{j + 1}"},
                f"single{j}/", 1 + j / 100)
    finally:
        if out is not None:
            out.close()
    n_img, n_txt = cfg["img"], cfg["txt"]
    ins = [helper.make_tensor_value_info("temb", TensorProto.FLOAT, [1, d]),
           helper.make_tensor_value_info("freqs_cos", TensorProto.FLOAT, [n_txt + n_img, hd]),
           helper.make_tensor_value_info("freqs_sin", TensorProto.FLOAT, [n_txt + n_img, hd])]
    if double:
        ins += [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, n_img, d]),
                helper.make_tensor_value_info("e0", TensorProto.FLOAT, [1, n_txt, d])]
        feeds = {"h0": feeds.pop("hidden_states"), "e0": feeds.pop("encoder_hidden_states"), **feeds}
    else:
        ins.append(helper.make_tensor_value_info("s0", TensorProto.FLOAT, [1, n_txt + n_img, d]))
        feeds = {"s0": feeds.pop("hidden_states"), **feeds}
    last = f"s{single}" if single else f"h{double}"
    for node in nodes:
        node.output[:] = ["out_hidden_states" if x == last else x for x in node.output]
    shape = [1, n_txt + n_img, d] if single else [1, n_img, d]
    graph = helper.make_graph(nodes, "flux_chain", ins,
                              [helper.make_tensor_value_info("out_hidden_states", TensorProto.FLOAT, shape)], inits)
    from .builder import IR_VERSION, OPSET

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="sdrt-bench")
    if stub:
        from ..graph import STRIPPED_KEY

        helper.set_model_props(model, {STRIPPED_KEY: "weights.safetensors"})
    return model, feeds
