"""ZoeDepth: sd-webui-controlnet's ``depth_zoe`` module, ``ZoeD_M12_N.pt`` run through sdrt.

The file is ZoeDepth N (``{"model": state_dict}``): MiDaS v3.1's DPT over BEiT-L/16-384 under ``core.core.``
(timm's ``beit_large_patch16_384``: 24 blocks of width 1024, 16 heads, a relative position bias table per block,
LayerScale ``gamma_1``/``gamma_2``, q and v biases; the DPT readout projections ``pretrained.act_postprocess1``-``4``
on blocks 5, 11, 17 and 23; the ``scratch.`` fusion head) and the metric head: a bottleneck conv, the seed bin
regressor (64 softplus bin centres), projectors and attractor layers (16, 8, 4 and 1 inverse attractors, alpha 300,
gamma 2, averaged) on the four fusion outputs, and the conditional log-binomial over MiDaS's last 32 features and
its relative depth. sdrt reads it with its safe torch-file reader and builds the network as an ONNX graph in memory
(:mod:`sdrt.pipelines.netgraph`), one per network input size (the relative position bias is resized to the patch grid
when the graph is built, as the extension's patched ``_get_rel_pos_bias`` resizes it), which runs on any backend in
float32. Widths, heads and bin counts are read from the file's shapes (a narrower file of the same layout runs too).

Around the network, numpy follows the extension (its processor's ``zoe_depth``, ``annotator/zoe``'s ``ZoeDetector``
and ZoeDepth's ``infer``) step for step:

- the image (RGB, at the processor resolution, padded with its edges to multiples of 64 by
  ``resize_image_with_pad``; sdrt pads an image given at its own size the same way) as ``x / 255`` in float32;
- ``infer`` with its defaults: the picture and its mirror image (``with_flip_aug``), each reflect-padded by
  ``int(sqrt(h / 2) * 3)`` rows and ``int(sqrt(w / 2) * 3)`` columns on both sides (``pad_input``), resized
  bilinearly (aligned corners) to the "minimal" keep-aspect size nearest 384 x 512 in multiples of 32, normalised as
  ``(x - 0.5) / 0.5``; the metric depth resized back bicubically (torch's, A = -0.75) to the padded size, the padding
  cropped, the mirror's depth flipped back and the two averaged;
- the map: ``(d - p2) / (p85 - p2)`` with numpy's 2nd and 85th percentiles, inverted (``1 - v``), ``* 255``, clipped
  and truncated to uint8, then cropped to the resized image.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .netgraph import AnnotatorNet, Net

__all__ = ["ZOE_FILE", "MAX_PATCHES", "PUBLISHED", "Config", "ZoeDepth", "build_graph", "config_of", "depth_map", "expected_shapes",
           "net_size", "rel_pos_index", "rel_pos_table"]

ZOE_FILE = "ZoeD_M12_N.pt"
_P = "core.core.pretrained."
_V = _P + "model."
_S = "core.core.scratch."
#: the BEiT blocks whose outputs the DPT head reads (MiDaS's hooks for beitl16_384)
HOOKS = (5, 11, 17, 23)
PATCH = 16
#: ZoeDepth N's configuration (config_zoedepth.json, "infer"): the head's constants
#: the attractors' strength: the layers call ``inv_attractor(dx)`` with its defaults (alpha 300, gamma 2), not the
#: configuration's ``attractor_alpha`` (1000), which they store and never pass
ALPHA = 300.0
MIN_TEMP = 0.0212
MAX_TEMP = 50.0
P_EPS = 1e-4
#: MidasCore's input size (h, w), kept-aspect "minimal" resize to multiples of 32
NET_SIZE = (384, 512)
#: the most patches the network reads (384 x 4096 pixels, a picture up to about 1:10): the kept-aspect resize makes a
#: long picture a long input, and BEiT's attention grows with the square of its tokens (16 heads x 6145^2 floats:
#: 2.4 GB a block at this bound, 4.2 GB at a 1:16 picture's 8113 tokens; past about 1:20 the position index alone
#: leaves the graph above ONNX's 2 GB)
MAX_PATCHES = 6144


@dataclass(frozen=True)
class Config:
    """The network's sizes: BEiT's width, blocks, heads and pretraining grid; the reassemble widths; the DPT fusion
    width and head widths; the bins, bin embedding, attractors and the head's MLP widths."""

    embed: int
    depth: int
    heads: int
    grid: int
    mlp: int
    post: tuple[int, int, int, int]
    features: int
    head1: int
    head2: int
    bins: int
    emb: int
    attractors: tuple[int, ...]
    seed_mlp: int
    proj_mlp: int
    attr_mlp: int
    cond_mlp: int


#: ZoeD_M12_N.pt: BEiT-L/16-384, DPT features 256, 64 bins (344.8 M float32 values)
PUBLISHED = Config(1024, 24, 16, 24, 4096, (256, 512, 1024, 1024), 256, 128, 32, 64, 128, (16, 8, 4, 1), 256, 128,
                   128, 80)


def _bias(out: dict[str, tuple[int, ...]], name: str, o: int, i: int, k: int = 1, bias: bool = True) -> None:
    out[name + ".weight"] = (o, i, k, k)
    if bias:
        out[name + ".bias"] = (o,)


def expected_shapes(cfg: Config = PUBLISHED) -> dict[str, tuple[int, ...]]:
    """The float tensors the network reads and their shapes, by bare name (the file also holds BEiT's unused
    ``fc_norm`` and ``head``, its ``relative_position_index`` buffers and the log-binomial's ``k_idx``/``K_minus_1``,
    which are not read)."""
    d, out = cfg.embed, {}
    out[_V + "cls_token"] = (1, 1, d)
    _bias(out, _V + "patch_embed.proj", d, 3, PATCH)
    rows = (2 * cfg.grid - 1) ** 2 + 3
    for b in range(cfg.depth):
        p = f"{_V}blocks.{b}."
        for n in ("gamma_1", "gamma_2", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.q_bias",
                  "attn.v_bias", "attn.proj.bias"):
            out[p + n] = (d,)
        out[p + "attn.relative_position_bias_table"] = (rows, cfg.heads)
        out[p + "attn.qkv.weight"] = (3 * d, d)
        out[p + "attn.proj.weight"] = (d, d)
        out[p + "mlp.fc1.weight"] = (cfg.mlp, d)
        out[p + "mlp.fc1.bias"] = (cfg.mlp,)
        out[p + "mlp.fc2.weight"] = (d, cfg.mlp)
        out[p + "mlp.fc2.bias"] = (d,)
    for k, c in enumerate(cfg.post, 1):
        p = f"{_P}act_postprocess{k}."
        out[p + "0.project.0.weight"] = (d, 2 * d)
        out[p + "0.project.0.bias"] = (d,)
        _bias(out, p + "3", c, d)
        if k == 1:
            _bias(out, p + "4", c, c, 4)
        elif k == 2:
            _bias(out, p + "4", c, c, 2)
        elif k == 4:
            _bias(out, p + "4", c, c, 3)
    f = cfg.features
    for k, c in enumerate(cfg.post, 1):
        _bias(out, f"{_S}layer{k}_rn", f, c, 3, bias=False)
    for k in range(1, 5):
        p = f"{_S}refinenet{k}."
        _bias(out, p + "out_conv", f, f)
        for unit in (1, 2):
            for conv in (1, 2):
                _bias(out, f"{p}resConfUnit{unit}.conv{conv}", f, f, 3)
    _bias(out, _S + "output_conv.0", cfg.head1, f, 3)
    _bias(out, _S + "output_conv.2", cfg.head2, cfg.head1, 3)
    _bias(out, _S + "output_conv.4", 1, cfg.head2)
    _bias(out, "conv2", f, f)
    _bias(out, "seed_bin_regressor._net.0", cfg.seed_mlp, f)
    _bias(out, "seed_bin_regressor._net.2", cfg.bins, cfg.seed_mlp)
    for p in ["seed_projector"] + [f"projectors.{i}" for i in range(len(cfg.attractors))]:
        _bias(out, p + "._net.0", cfg.proj_mlp, f)
        _bias(out, p + "._net.2", cfg.emb, cfg.proj_mlp)
    for i, n in enumerate(cfg.attractors):
        _bias(out, f"attractors.{i}._net.0", cfg.attr_mlp, cfg.emb)
        _bias(out, f"attractors.{i}._net.2", n, cfg.attr_mlp)
    _bias(out, "conditional_log_binomial.mlp.0", cfg.cond_mlp, cfg.head2 + 1 + cfg.emb)
    _bias(out, "conditional_log_binomial.mlp.2", 4, cfg.cond_mlp)
    return out


def config_of(shapes: Mapping[str, Sequence[int]]) -> Config:
    """The network a file holds, from its tensors' bare names and shapes; the published one where the file does not
    say or could not be ZoeDepth (so that a file missing tensors is named by what it lacks)."""
    def s(name: str) -> tuple[int, ...]:
        return tuple(int(v) for v in shapes[name])

    try:
        d = s(_V + "cls_token")[-1]
        depth = len({int(m.group(1)) for n in shapes if (m := re.match(re.escape(_V) + r"blocks\.(\d+)\.", n))})
        rows, heads = s(_V + "blocks.0.attn.relative_position_bias_table")
        side = math.isqrt(rows - 3)
        attractors = []
        while f"attractors.{len(attractors)}._net.2.weight" in shapes:
            attractors.append(s(f"attractors.{len(attractors)}._net.2.weight")[0])
        cfg = Config(d, depth, heads, (side + 1) // 2, s(_V + "blocks.0.mlp.fc1.weight")[0],
                     tuple(s(f"{_P}act_postprocess{k}.3.weight")[0] for k in range(1, 5)),
                     s(_S + "layer1_rn.weight")[0], s(_S + "output_conv.0.weight")[0],
                     s(_S + "output_conv.2.weight")[0], s("seed_bin_regressor._net.2.weight")[0],
                     s("seed_projector._net.2.weight")[0], tuple(attractors), s("seed_bin_regressor._net.0.weight")[0],
                     s("seed_projector._net.0.weight")[0], s("attractors.0._net.0.weight")[0],
                     s("conditional_log_binomial.mlp.0.weight")[0])
    except (KeyError, IndexError, TypeError, ValueError):
        return PUBLISHED
    if (depth <= max(HOOKS) or heads < 1 or d % heads or side * side != rows - 3 or side % 2 == 0
            or len(attractors) != 4):
        return PUBLISHED
    return cfg


# ------------------------------------------------------------------------------------------ the relative position bias
def _bilinear_matrix(src: int, dst: int) -> np.ndarray:
    from .midasdepth import _bilinear_matrix as m

    return m(src, dst)


def rel_pos_table(table: np.ndarray, grid: int, gh: int, gw: int) -> np.ndarray:
    """The extension's ``_get_rel_pos_bias`` table for a ``gh`` x ``gw`` patch grid: the ``(2g-1)^2`` relative
    distances of the pretraining grid resized bilinearly (corners not aligned) to ``(2gh-1) x (2gw-1)``, the three
    class-token rows kept after them."""
    t = np.asarray(table, np.float32)
    old = 2 * grid - 1
    sub = t[: old * old].reshape(old, old, -1)
    nh, nw = 2 * gh - 1, 2 * gw - 1
    if (nh, nw) != (old, old):
        rows, cols = _bilinear_matrix(old, nh), _bilinear_matrix(old, nw)
        sub = np.einsum("hH,HWc->hWc", rows, sub)
        sub = np.einsum("wW,hWc->hwc", cols, sub).astype(np.float32)
    return np.concatenate([sub.reshape(nh * nw, -1), t[old * old:]], 0).astype(np.float32)


def rel_pos_index(gh: int, gw: int) -> np.ndarray:
    """timm's ``gen_relative_position_index`` for a ``gh`` x ``gw`` window: (1 + gh*gw)^2 int64 rows of the table
    (token pairs by their offset; class token to token, token to class token and class to itself last)."""
    ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    ys, xs = ys.reshape(-1), xs.reshape(-1)
    rel = (ys[:, None] - ys[None, :] + gh - 1) * (2 * gw - 1) + (xs[:, None] - xs[None, :] + gw - 1)
    n = (2 * gh - 1) * (2 * gw - 1)
    out = np.zeros((gh * gw + 1,) * 2, np.int64)
    out[1:, 1:] = rel
    out[0, :] = n
    out[:, 0] = n + 1
    out[0, 0] = n + 2
    return out


def _log_binom(k_classes: int) -> np.ndarray:
    """The log-binomial's constant term ``log_binom(K - 1, k)`` (Stirling, eps 1e-7) in float32 as torch computes it."""
    f32 = np.float32
    n = f32(k_classes - 1) + f32(1e-7)
    k = np.arange(k_classes, dtype=np.float32) + f32(1e-7)
    return (n * np.log(n) - k * np.log(k) - (n - k) * np.log(n - k + f32(1e-7))).astype(np.float32)


# ------------------------------------------------------------------------------------------ the network
def build_graph(arrays: Mapping[str, np.ndarray], cfg: Config, height: int, width: int,
                taps: Sequence[str] = ()) -> Any:
    """The ``onnx.ModelProto`` of ZoeDepth N for one ``(1, 3, height, width)`` normalised ``image`` (sides multiples
    of 32) -> the metric ``depth`` ``(1, 1, height, width)``; ``taps``: intermediate tensors to output too (``l4``,
    ``r1``, ``out_conv``, ``rel``, ``blockN``, ``centers``, ``prob``, ``temp``, ``probs``), as outputs of those
    names."""
    d, heads = cfg.embed, cfg.heads
    hd = d // heads
    gh, gw = height // PATCH, width // PATCH
    n_tok = 1 + gh * gw
    arr = dict(arrays)
    for k in range(1, 5):  # the readout projection split into its token and class-token halves
        p = f"{_P}act_postprocess{k}.0.project.0"
        w = np.asarray(arrays[p + ".weight"], np.float32)
        arr[p + ".tok.weight"], arr[p + ".cls.weight"] = np.ascontiguousarray(w[:, :d]), np.ascontiguousarray(w[:, d:])
        arr[p + ".tok.bias"] = arrays[p + ".bias"]
    for b in range(cfg.depth):  # qkv's bias: q, zeros for k, v
        p = f"{_V}blocks.{b}.attn."
        arr[p + "qkv.bias"] = np.concatenate([arrays[p + "q_bias"], np.zeros(d, np.float32), arrays[p + "v_bias"]])
    net = Net(arr)

    def gelu(x: str) -> str:  # exact GELU: x * 0.5 * (1 + erf(x / sqrt 2))
        e = net.node("Erf", [net.node("Div", [x, net.scalar(math.sqrt(2.0))])])
        return net.mul(net.mul(x, net.add(e, net.scalar(1.0))), net.scalar(0.5))

    def up(x: str, size: tuple[int, int]) -> str:
        return net.resize(x, size=size, mode="linear", align_corners=True)

    def softplus(x: str) -> str:
        """torch's Softplus as ``relu(x) + log(1 + exp(-|x|))``: ONNX's ``log(exp(x) + 1)`` overflows above 88
        on some backends, where torch returns x itself (above its threshold 20 the two agree in float32)."""
        tail = net.node("Log", [net.add(net.scalar(1.0), net.node("Exp", [net.node("Neg", [net.node("Abs", [x])])]))])
        return net.add(net.relu(x), tail)

    def mlp(x: str, p: str, soft: bool = False) -> str:  # conv 1x1, ReLU, conv 1x1 (then Softplus)
        y = net.conv(net.relu(net.conv(x, p + "._net.0", pad=0)), p + "._net.2", pad=0)
        return softplus(y) if soft else y

    # ---- BEiT over the 16 x 16 patches, tokens as (N, D)
    x = net.conv("image", _V + "patch_embed.proj", stride=PATCH, pad=0)
    x = net.node("Transpose", [net.node("Reshape", [x, net.ints(d, gh * gw)])], perm=[1, 0])
    cls = net.const("cls_token", np.asarray(arrays[_V + "cls_token"], np.float32).reshape(1, d))
    x = net.concat([cls, x], 0)
    index = net.const("rel_pos_index", rel_pos_index(gh, gw).reshape(-1))
    scale = net.scalar(hd ** -0.5)
    hooked: dict[int, str] = {}
    tags: dict[str, str] = {}
    for b in range(max(HOOKS) + 1):
        p = f"{_V}blocks.{b}."
        table = net.const(p + "rel_pos_table", rel_pos_table(arrays[p + "attn.relative_position_bias_table"],
                                                             cfg.grid, gh, gw))
        bias = net.node("Gather", [table, index], axis=0)  # (T*T, heads)
        bias = net.node("Transpose", [net.node("Reshape", [bias, net.ints(n_tok, n_tok, heads)])], perm=[2, 0, 1])
        qkv = net.linear(net.layer_norm(x, p + "norm1"), p + "attn.qkv")
        qkv = net.node("Transpose", [net.node("Reshape", [qkv, net.ints(n_tok, 3, heads, hd)])], perm=[1, 2, 0, 3])
        q, k, v = net.nodes_out("Split", [qkv, net.ints(1, 1, 1)], 3, axis=0)  # (1, heads, T, hd) each
        att = net.node("MatMul", [net.mul(q, scale), net.node("Transpose", [k], perm=[0, 1, 3, 2])])
        att = net.node("Softmax", [net.add(att, bias)], axis=-1)
        o = net.node("Transpose", [net.node("MatMul", [att, v])], perm=[0, 2, 1, 3])
        o = net.linear(net.node("Reshape", [o, net.ints(n_tok, d)]), p + "attn.proj")
        x = net.add(x, net.mul(o, net.weight(p + "gamma_1")))
        y = net.linear(gelu(net.linear(net.layer_norm(x, p + "norm2"), p + "mlp.fc1")), p + "mlp.fc2")
        x = tags[f"block{b}"] = net.add(x, net.mul(y, net.weight(p + "gamma_2")))
        if b in HOOKS:
            hooked[b] = x
    # ---- reassemble: the readout projection (Linear over [token, class token], GELU) to (D, gh, gw), then resample
    layers = []
    for k, b in enumerate(HOOKS, 1):
        p = f"{_P}act_postprocess{k}."
        tok = net.node("Slice", [hooked[b], net.ints(1), net.ints(n_tok), net.ints(0)])
        c = net.node("Slice", [hooked[b], net.ints(0), net.ints(1), net.ints(0)])
        y = gelu(net.add(net.linear(tok, p + "0.project.0.tok"), net.linear(c, p + "0.project.0.cls")))
        y = net.conv(net.node("Reshape", [net.node("Transpose", [y], perm=[1, 0]), net.ints(1, d, gh, gw)]), p + "3",
                     pad=0)
        if k == 1:
            y = net.conv_transpose(y, p + "4", stride=4)
        elif k == 2:
            y = net.conv_transpose(y, p + "4", stride=2)
        elif k == 4:
            y = net.conv(y, p + "4", stride=2, pad=1)
        layers.append(y)
    sizes = [(gh * 4, gw * 4), (gh * 2, gw * 2), (gh, gw), ((gh - 1) // 2 + 1, (gw - 1) // 2 + 1)]
    rn = [net.conv(t, f"{_S}layer{i}_rn", pad=1) for i, t in enumerate(layers, 1)]
    tags["l4"] = rn[3]

    def unit(t: str, p: str) -> str:
        return net.add(net.conv(net.relu(net.conv(net.relu(t), p + "conv1", pad=1)), p + "conv2", pad=1), t)

    path, fused = "", {}
    for i in (4, 3, 2, 1):
        p = f"{_S}refinenet{i}."
        out = rn[3] if i == 4 else net.add(path, unit(rn[i - 1], p + "resConfUnit1."))
        out = unit(out, p + "resConfUnit2.")
        size = sizes[i - 2] if i > 1 else (sizes[0][0] * 2, sizes[0][1] * 2)
        path = fused[i] = net.conv(up(out, size), p + "out_conv", pad=0)
    y = up(net.conv(path, _S + "output_conv.0", pad=1), (height, width))
    last = net.relu(net.conv(y, _S + "output_conv.2", pad=1))  # MidasCore's "out_conv" features
    rel = net.relu(net.conv(last, _S + "output_conv.4", pad=0))  # MiDaS's relative depth
    tags.update(r1=fused[1], out_conv=last, rel=rel)
    # ---- the metric head: seed bins on the bottleneck, attractors up the fusion outputs
    x0 = net.conv(rn[3], "conv2", pad=0)
    centers = mlp(x0, "seed_bin_regressor", True)
    prev = mlp(x0, "seed_projector")
    alpha = net.scalar(ALPHA)
    for i, (src, size) in enumerate(zip((fused[4], fused[3], fused[2], fused[1]),
                                        (sizes[2], sizes[1], sizes[0], (sizes[0][0] * 2, sizes[0][1] * 2)))):
        emb = mlp(src, f"projectors.{i}")
        a = mlp(net.add(emb, up(prev, size)), f"attractors.{i}", True)  # (1, n_attractors, h, w)
        c = up(centers, size)  # (1, bins, h, w)
        dx = net.node("Sub", [net.node("Unsqueeze", [a, net.ints(2)]), net.node("Unsqueeze", [c, net.ints(1)])])
        delta = net.node("Div", [dx, net.add(net.scalar(1.0), net.mul(alpha, net.mul(dx, dx)))])
        centers = net.add(c, net.node("ReduceMean", [delta], axes=[1], keepdims=0))
        prev = emb
    cond = net.concat([last, rel, up(prev, (height, width))], 1)
    pt = net.conv(gelu(net.conv(cond, "conditional_log_binomial.mlp.0", pad=0)), "conditional_log_binomial.mlp.2",
                  pad=0)
    pt = net.add(softplus(pt), net.scalar(P_EPS))
    p0, p1, t0, t1 = net.nodes_out("Split", [pt, net.ints(1, 1, 1, 1)], 4, axis=1)
    prob = net.node("Div", [p0, net.add(p0, p1)])
    temp = net.add(net.mul(net.node("Div", [t0, net.add(t0, t1)]), net.scalar(MAX_TEMP - MIN_TEMP)),
                   net.scalar(MIN_TEMP))
    k = np.arange(cfg.bins, dtype=np.float32).reshape(1, -1, 1, 1)
    one = net.scalar(1.0)
    lx = net.node("Log", [net.node("Clip", [prob, net.scalar(P_EPS), one])])
    l1x = net.node("Log", [net.node("Clip", [net.node("Sub", [one, prob]), net.scalar(P_EPS), one])])
    y = net.add(net.add(net.const("log_binom", _log_binom(cfg.bins).reshape(1, -1, 1, 1)),
                        net.mul(net.const("k_idx", k), lx)),
                net.mul(net.const("k_rest", np.float32(cfg.bins - 1) - k), l1x))
    probs = net.node("Softmax", [net.node("Div", [y, temp])], axis=1)
    tags.update(centers=centers, prob=prob, temp=temp, probs=probs)
    depth = net.node("ReduceSum", [net.mul(probs, up(centers, (height, width))), net.ints(1)], keepdims=1)
    return net.model("sdrt_zoedepth", {"image": (1, 3, height, width)}, {depth: "depth", **{tags[t]: t for t in taps}})


# ------------------------------------------------------------------------------------------ around it
def net_size(height: int, width: int) -> tuple[int, int]:
    """MidasCore's resize of a ``height`` x ``width`` input: kept aspect, the scale of 384 / h or 512 / w nearer 1
    ("minimal"), each side rounded to a multiple of 32 (numpy's round, ties to even)."""
    sh, sw = NET_SIZE[0] / height, NET_SIZE[1] / width
    if abs(1 - sw) < abs(1 - sh):
        sh = sw
    else:
        sw = sh
    return int(np.round(sh * height / 32) * 32), int(np.round(sw * width / 32) * 32)


def _aligned(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch's bilinear ``align_corners=True`` along one axis: the source rows, next rows and fractions (float32)."""
    f32 = np.float32
    scale = f32((src - 1) / (dst - 1)) if dst > 1 else f32(0)
    real = scale * np.arange(dst, dtype=f32)
    i0 = np.minimum(real.astype(np.int64), src - 1)
    return i0, np.minimum(i0 + 1, src - 1), (real - i0.astype(f32)).astype(f32)


def resize_aligned(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """``F.interpolate(x, (height, width), mode="bilinear", align_corners=True)`` of (C, H, W) float32."""
    y0, y1, ly = _aligned(x.shape[1], height)
    x0, x1, lx = _aligned(x.shape[2], width)
    one = np.float32(1)
    top = x[:, y0][:, :, x0] * (one - lx) + x[:, y0][:, :, x1] * lx
    bot = x[:, y1][:, :, x0] * (one - lx) + x[:, y1][:, :, x1] * lx
    return (top * (one - ly)[:, None] + bot * ly[:, None]).astype(np.float32)


def _bicubic(src: int, dst: int) -> np.ndarray:
    from .depthanything import _bicubic_axis

    return _bicubic_axis(src, dst, src / dst)


def depth_map(depth: np.ndarray) -> np.ndarray:
    """``ZoeDetector``'s map (HxW uint8) of the averaged depth: 2nd / 85th percentile scaling, inverted."""
    d = np.array(depth, np.float32)
    vmin, vmax = np.percentile(d, 2), np.percentile(d, 85)
    d -= vmin
    with np.errstate(invalid="ignore", divide="ignore"):
        d /= vmax - vmin
    d = 1.0 - d
    return np.nan_to_num(d * 255.0, nan=0.0).clip(0, 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------ the detector
def _strip(name: str) -> str:
    """A file's tensor name as ZoeDepth names it (without the checkpoint's ``model`` entry or a ``module.``)."""
    for prefix in ("model.module.", "model.", "module."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


class ZoeDepth(AnnotatorNet):
    """``ZoeD_M12_N.pt`` compiled on one backend, one session per network input size; ``depth(rgb)`` -> the averaged
    metric depth, ``__call__(rgb)`` -> the extension's ``depth_zoe`` map."""

    WHAT = "ZoeDepth's ZoeD_M12_N.pt"
    FIX = f"pass ZoeDepth's {ZOE_FILE} (lllyasviel/Annotators)"
    #: each compiled size holds its own copy of the 1.4 GB of weights; a size follows the picture's aspect (384 x 512
    #: for 4:3 and 3:4 pictures), so the two used last are kept
    KEEP = 2

    strip = staticmethod(_strip)
    ARCH = (config_of, expected_shapes, build_graph)

    def session(self, *size: int) -> Any:
        """As :meth:`AnnotatorNet.session`, but a new size lets the least recently used go before it is built and
        compiled (not after): each holds the 1.4 GB of weights, so no more than ``KEEP`` are held at once."""
        with self._session_lock:
            if size not in self._sessions:
                while self._sessions and len(self._sessions) >= self.KEEP:
                    self._sessions.pop(next(iter(self._sessions)))  # let go, not closed (another run may hold it)
            return super().session(*size)

    def _infer(self, x: np.ndarray) -> np.ndarray:
        """``_infer_with_pad_aug`` of one (3, H, W) float32 ``x / 255`` image: reflect pad, resize, network, bicubic
        back, crop; (H, W) float32."""
        _, h, w = x.shape
        ph, pw = int(np.sqrt(h / 2) * 3), int(np.sqrt(w / 2) * 3)
        x = np.pad(x, ((0, 0), (ph, ph), (pw, pw)), mode="reflect")
        hp, wp = x.shape[1:]
        nh, nw = net_size(hp, wp)
        if nh < 32 or nw < 32 or (nh // PATCH) * (nw // PATCH) > MAX_PATCHES:
            why = ("under 32 pixels on a side" if nh < 32 or nw < 32 else
                   f"above its {MAX_PATCHES} patches (384x4096 pixels): its attention would take "
                   f"{16 * ((nh // PATCH) * (nw // PATCH) + 1) ** 2 * 4 / 1e9:.1f} GB a block")
            raise InputError(f"sdrt.pipelines.zoedepth: the image is {w}x{h}; ZoeDepth's kept-aspect resize makes it "
                             f"{nw}x{nh} for its network, {why}", where="image",
                             fix="crop or pad the image nearer to 4:3 (at most about 1:10)")
        x = (resize_aligned(x, nh, nw) - np.float32(0.5)) / np.float32(0.5)
        out = self.session(nh, nw).run({"image": np.ascontiguousarray(x[None], np.float32)})["depth"][0, 0]
        out = np.asarray(out, np.float64)
        if (nh, nw) != (hp, wp):
            out = _bicubic(nh, hp) @ out @ _bicubic(nw, wp).T
        return np.asarray(out[ph:hp - ph, pw:wp - pw], np.float32)

    def depth(self, rgb: np.ndarray) -> np.ndarray:
        """ZoeDepth's ``infer`` (flip and pad augmentation) of an RGB uint8 image: the metric depth, HxW float32."""
        x = np.ascontiguousarray(rgb.transpose(2, 0, 1)).astype(np.float32) / np.float32(255.0)
        a = self._infer(x)
        b = self._infer(np.ascontiguousarray(x[:, :, ::-1]))[:, ::-1]
        return ((a + b) / np.float32(2)).astype(np.float32)

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        """The ``depth_zoe`` map (HxW uint8) of an RGB uint8 image: padded with its edges to multiples of 64 (the
        extension's processor pads every image so), scaled over the padded depth, cropped back."""
        h, w = rgb.shape[:2]
        padded = np.pad(rgb, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")
        return np.ascontiguousarray(depth_map(self.depth(padded))[:h, :w])
