"""MiDaS depth: sd-webui-controlnet's ``depth_midas`` and ``normal_midas``, ``dpt_hybrid-midas-501f0c75.pt`` run
through sdrt.

The file is MiDaS v3's DPT-Hybrid as a PyTorch state dict: timm's ``vit_base_resnet50_384`` (a BiT ResNetV2-50 stem
and three stages of weight-standardised convolutions with GroupNorm, then ViT-B/16 over its 1/16 features) under
``pretrained.model.``, the two readout projections under ``pretrained.act_postprocess3/4``, and the DPT head under
``scratch.``. It is read with sdrt's safe torch-file reader and built as an ONNX graph in memory (one per input
size: the position embedding is resized to the image's grid when the graph is built), which runs on any backend.

Around the network, numpy follows the extension's ``annotator/midas/__init__.py`` (``apply_midas``) step for step:

- the image (RGB, at the processor resolution and padded with its edges to multiples of 64 by the extension's
  ``resize_image_with_pad``) goes in whole as ``x / 127.5 - 1`` (no 384 resize: ``apply_midas`` calls the network
  on the padded image; MiDaS's own 384 transform is loaded but not used);
- the depth (the network's one channel, through its ReLU) is min-max scaled, ``(d - min) / max`` of the shifted
  map, times 255, clipped and truncated to uint8;
- the normal map: OpenCV's 3x3 Sobel (``CV_32F``, reflect-101 edges) of the raw depth in x and y, both set to 0
  where the scaled depth is under the background threshold (``normal_midas``' slider, 0.4; ``depth_midas`` computes
  it with 0.1 and throws it away), z = 2 pi, normalised, ``* 127.5 + 127.5`` truncated to uint8, channels reversed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .netgraph import AnnotatorNet

__all__ = ["MIDAS_FILE", "MidasDepth", "build_graph", "depth_image", "expected_shapes", "find_file", "normal_image",
           "sobel3"]

MIDAS_FILE = "dpt_hybrid-midas-501f0c75.pt"
NORMAL_A = math.pi * 2.0
GROUPS = 32
HEAD_DIM = 64
#: ViT blocks whose outputs the DPT head reads (the extension's hooks for vitb_rn50_384: 8 and 11)
HOOKS = (8, 11)
_VIT = "pretrained.model."
_RES = "pretrained.model.patch_embed.backbone."


# ------------------------------------------------------------------------------------------ files
def find_file(where: str | Path | Sequence[str | Path], *, what: str = "preprocessor_models") -> Path:
    """``dpt_hybrid-midas-501f0c75.pt``: ``where`` is the file, a folder holding it, or a folder with the
    extension's (``annotator/downloads/midas``) or ComfyUI's (``ckpts/lllyasviel/Annotators``) layout under it;
    an ``InputError`` naming the places looked in otherwise."""
    from .annotators import find

    return find("depth_midas", where, what)[0]


# ------------------------------------------------------------------------------------------ the layout
def expected_shapes(*, embed: int = 768, depth: int = 12, stem: int = 64, channels: Sequence[int] = (256, 512, 1024),
                    layers: Sequence[int] = (3, 4, 9), features: int = 256, grid: int = 24,
                    mlp: int | None = None) -> dict[str, tuple[int, ...]]:
    """The tensors the network reads and their shapes: the published file's with the defaults (the file also holds
    timm's unused ``norm`` and ``head``, and refinenet4's unused first residual unit, which are not needed)."""
    mlp = mlp or 4 * embed
    out: dict[str, tuple[int, ...]] = {}
    out[_RES + "stem.conv.weight"] = (stem, 3, 7, 7)
    out[_RES + "stem.norm.weight"] = out[_RES + "stem.norm.bias"] = (stem,)
    cin = stem
    for s, (n, cout) in enumerate(zip(layers, channels)):
        mid = cout // 4
        for b in range(n):
            p = f"{_RES}stages.{s}.blocks.{b}."
            if b == 0:
                out[p + "downsample.conv.weight"] = (cout, cin, 1, 1)
                out[p + "downsample.norm.weight"] = out[p + "downsample.norm.bias"] = (cout,)
            for k, (o, i, ks) in enumerate(((mid, cin if b == 0 else cout, 1), (mid, mid, 3), (cout, mid, 1)), 1):
                out[f"{p}conv{k}.weight"] = (o, i, ks, ks)
                out[f"{p}norm{k}.weight"] = out[f"{p}norm{k}.bias"] = (o,)
        cin = cout
    out[_VIT + "patch_embed.proj.weight"] = (embed, cin, 1, 1)
    out[_VIT + "patch_embed.proj.bias"] = (embed,)
    out[_VIT + "cls_token"] = (1, 1, embed)
    out[_VIT + "pos_embed"] = (1, 1 + grid * grid, embed)
    for b in range(depth):
        p = f"{_VIT}blocks.{b}."
        for ln in ("norm1", "norm2"):
            out[f"{p}{ln}.weight"] = out[f"{p}{ln}.bias"] = (embed,)
        for name, o, i in (("attn.qkv", 3 * embed, embed), ("attn.proj", embed, embed), ("mlp.fc1", mlp, embed),
                           ("mlp.fc2", embed, mlp)):
            out[f"{p}{name}.weight"] = (o, i)
            out[f"{p}{name}.bias"] = (o,)
    for k in (3, 4):
        p = f"pretrained.act_postprocess{k}."
        out[p + "0.project.0.weight"] = (embed, 2 * embed)
        out[p + "0.project.0.bias"] = (embed,)
        out[p + "3.weight"] = (embed, embed, 1, 1)
        out[p + "3.bias"] = (embed,)
    out["pretrained.act_postprocess4.4.weight"] = (embed, embed, 3, 3)
    out["pretrained.act_postprocess4.4.bias"] = (embed,)
    for k, c in enumerate((channels[0], channels[1], embed, embed), 1):
        out[f"scratch.layer{k}_rn.weight"] = (features, c, 3, 3)
    for k in range(1, 5):
        p = f"scratch.refinenet{k}."
        out[p + "out_conv.weight"] = (features, features, 1, 1)
        out[p + "out_conv.bias"] = (features,)
        for unit in ((2,) if k == 4 else (1, 2)):
            for conv in (1, 2):
                out[f"{p}resConfUnit{unit}.conv{conv}.weight"] = (features, features, 3, 3)
                out[f"{p}resConfUnit{unit}.conv{conv}.bias"] = (features,)
    half = features // 2
    for k, shape in ((0, (half, features, 3, 3)), (2, (32, half, 3, 3)), (4, (1, 32, 1, 1))):
        out[f"scratch.output_conv.{k}.weight"] = shape
        out[f"scratch.output_conv.{k}.bias"] = (shape[0],)
    return out


PUBLISHED = dict(embed=768, depth=12, stem=64, channels=[256, 512, 1024], layers=[3, 4, 9], features=256, grid=24,
                 mlp=3072)


def bare(name: str) -> str:
    """A file's tensor by its name in the model (from ``pretrained.`` / ``scratch.``: a ``module.`` or ``model.``
    prefix is allowed)."""
    m = re.search(r"(?:^|\.)((?:pretrained|scratch)\..*)$", name)
    return m.group(1) if m else name


def sizes(shapes: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """The network's sizes read from its tensors' shapes (bare names), :data:`PUBLISHED` for the published file; a
    file whose sizes cannot be read, or that could not be DPT-Hybrid (fewer than 12 ViT blocks, a width that is no
    multiple of 64, channels GroupNorm(32) cannot split), is checked against the published sizes."""
    def shape(name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in shapes[name])

    def count(pattern: str) -> int:
        return len({int(m.group(1)) for n in shapes if (m := re.match(pattern, n))})

    try:
        size = dict(embed=shape(_VIT + "cls_token")[-1], depth=count(re.escape(_VIT) + r"blocks\.(\d+)\."),
                    stem=shape(_RES + "stem.conv.weight")[0],
                    channels=[shape(f"{_RES}stages.{s}.blocks.0.conv3.weight")[0] for s in range(3)],
                    layers=[count(re.escape(_RES) + rf"stages\.{s}\.blocks\.(\d+)\.") for s in range(3)],
                    features=shape("scratch.layer1_rn.weight")[0],
                    grid=int(round(math.sqrt(shape(_VIT + "pos_embed")[1] - 1))),
                    mlp=shape(_VIT + "blocks.0.mlp.fc1.weight")[0])
    except (KeyError, IndexError):
        return dict(PUBLISHED)
    if size["depth"] <= max(HOOKS) or size["embed"] % HEAD_DIM or size["stem"] % GROUPS \
            or any(c % (4 * GROUPS) for c in size["channels"]) or size["grid"] < 1:  # a class token alone
        return dict(PUBLISHED)
    return size


# ------------------------------------------------------------------------------------------ the graph
def _std_weight(w: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """timm's StdConv2dSame weight (eps 1e-8 in the hybrid ViT's ResNet): each output filter less its mean over its
    biased standard deviation; the weight is fixed, so it is standardised once here."""
    w64 = np.asarray(w, np.float64)
    flat = w64.reshape(w64.shape[0], -1)
    mean = flat.mean(1, keepdims=True)
    var = flat.var(1, keepdims=True)
    return ((flat - mean) / np.sqrt(var + eps)).reshape(w.shape).astype(np.float32)


def _same_pads(size: int, k: int, s: int) -> tuple[int, int]:
    """TF-style 'same' padding (timm's ``pad_same``): the total split with the extra pixel after."""
    total = max((math.ceil(size / s) - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def _bilinear_matrix(src: int, dst: int) -> np.ndarray:
    """(dst, src) weights of torch's ``interpolate(mode='bilinear', align_corners=False)`` along one axis (float32
    scale and lambdas, as its CPU kernel)."""
    m = np.zeros((dst, src), np.float32)
    scale = np.float32(src) / np.float32(dst)
    for d in range(dst):
        x = max(np.float32(scale * np.float32(d + 0.5) - np.float32(0.5)), np.float32(0))
        i0 = min(int(x), src - 1)
        i1 = i0 + (1 if i0 < src - 1 else 0)
        l1 = np.float32(x - np.float32(i0))
        m[d, i0] += np.float32(1) - l1
        m[d, i1] += l1
    return m


def resize_pos_embed(pos: np.ndarray, gh: int, gw: int) -> np.ndarray:
    """The extension's ``_resize_pos_embed``: the class token's row kept, the grid resized bilinearly to
    ``(gh, gw)``; ``(1 + gh * gw, D)`` float32."""
    pos = np.asarray(pos, np.float32).reshape(-1, pos.shape[-1])
    g = int(round(math.sqrt(pos.shape[0] - 1)))
    grid = pos[1:].reshape(g, g, -1)
    if (gh, gw) != (g, g):
        rows, cols = _bilinear_matrix(g, gh), _bilinear_matrix(g, gw)
        grid = np.einsum("hH,HWd->hWd", rows, grid)
        grid = np.einsum("wW,hWd->hwd", cols, grid).astype(np.float32)
    return np.concatenate([pos[:1], grid.reshape(gh * gw, -1)], 0)


def graph_arrays(arrays: Mapping[str, np.ndarray], size: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The tensors the graph holds, from the file's (bare names): the ResNet's convolutions standardised, and each
    readout projection split into its token and class-token halves (``.tok`` / ``.cls``)."""
    out = dict(arrays)
    for n in arrays:
        if n.startswith(_RES) and n.endswith(".weight") and len(arrays[n].shape) == 4:
            out[n] = _std_weight(arrays[n])
    d = size["embed"]
    for k in (3, 4):
        p = f"pretrained.act_postprocess{k}.0.project.0"
        w = np.asarray(arrays[p + ".weight"], np.float32)
        out[p + ".tok.weight"] = np.ascontiguousarray(w[:, :d])
        out[p + ".cls.weight"] = np.ascontiguousarray(w[:, d:])
        out[p + ".cls.bias"] = arrays[p + ".bias"]
    return out


def build_graph(arrays: Mapping[str, np.ndarray], height: int, width: int, size: Mapping[str, Any],
                taps: Sequence[str] = ()) -> Any:
    """The ``onnx.ModelProto`` of DPT-Hybrid for one ``(1, 3, height, width)`` input ``image`` (sides multiples of
    32) -> ``depth`` (1, 1, height, width); ``arrays`` by the model's (bare) names, ``size`` as :func:`sizes`;
    ``taps``: intermediate tensors to output too (``stem``, ``stage0``-``2``, ``tokens``, ``blockN``,
    ``refinenetN``), as outputs of those names."""
    from .netgraph import Net

    net = Net(graph_arrays(arrays, size))
    tags: dict[str, str] = {}

    def gn(x: str, name: str, c: int, relu: bool) -> str:
        y = net.group_norm(x, name, GROUPS, c)
        return net.relu(y) if relu else y

    def gelu(x: str) -> str:  # exact GELU as torch exports it: x * 0.5 * (1 + erf(x / sqrt 2))
        e = net.node("Erf", [net.node("Div", [x, net.scalar(math.sqrt(2.0))])])
        return net.mul(net.mul(x, net.add(e, net.scalar(1.0))), net.scalar(0.5))

    # ---- the BiT ResNetV2 stem: 7x7/2 'same' StdConv, GroupNorm + ReLU, 3x3/2 'same' max pool
    h, w = height, width
    (pt, pb), (pl, pr) = _same_pads(h, 7, 2), _same_pads(w, 7, 2)
    x = net.conv("image", _RES + "stem.conv", stride=2, pad=(pt, pl, pb, pr))
    h, w = math.ceil(h / 2), math.ceil(w / 2)
    x = tags["stem"] = gn(x, _RES + "stem.norm", size["stem"], True)
    (pt, pb), (pl, pr) = _same_pads(h, 3, 2), _same_pads(w, 3, 2)
    # timm pads with -inf; after the ReLU every value is >= 0, so a zero pad picks the same maxima
    x = net.max_pool(net.node("Pad", [x, net.ints(0, 0, pt, pl, 0, 0, pb, pr)]), 3, 2)
    h, w = (h + pt + pb - 3) // 2 + 1, (w + pl + pr - 3) // 2 + 1
    feats = []
    for s, (n, cout) in enumerate(zip(size["layers"], size["channels"])):
        mid = cout // 4
        for b in range(n):
            p = f"{_RES}stages.{s}.blocks.{b}."
            st = 2 if s > 0 and b == 0 else 1
            oh, ow = math.ceil(h / st), math.ceil(w / st)
            short = x
            if b == 0:
                short = gn(net.conv(x, p + "downsample.conv", stride=st, pad=0), p + "downsample.norm", cout, False)
            y = gn(net.conv(x, p + "conv1"), p + "norm1", mid, True)
            (pt, pb), (pl, pr) = _same_pads(h, 3, st), _same_pads(w, 3, st)
            y = gn(net.conv(y, p + "conv2", stride=st, pad=(pt, pl, pb, pr)), p + "norm2", mid, True)
            y = gn(net.conv(y, p + "conv3"), p + "norm3", cout, False)
            x = net.relu(net.add(y, short))
            h, w = oh, ow
        feats.append(x)
        tags[f"stage{s}"] = x
    # ---- ViT-B/16 over the 1/16 features, tokens as (N, D)
    d = size["embed"]
    heads = d // HEAD_DIM
    gh, gw = h, w
    n_tok = 1 + gh * gw
    x = net.conv(x, _VIT + "patch_embed.proj", pad=0)
    x = net.node("Transpose", [net.node("Reshape", [x, net.ints(d, gh * gw)])], perm=[1, 0])
    cls_token = net.const("cls_token", np.asarray(arrays[_VIT + "cls_token"], np.float32).reshape(1, d))
    pos = net.const("pos_embed_resized", resize_pos_embed(arrays[_VIT + "pos_embed"], gh, gw))
    x = tags["tokens"] = net.add(net.concat([cls_token, x], 0), pos)
    scale = net.scalar(HEAD_DIM ** -0.5)
    hooked = {}
    for b in range(max(HOOKS) + 1):
        p = f"{_VIT}blocks.{b}."
        qkv = net.linear(net.layer_norm(x, p + "norm1"), p + "attn.qkv")
        qkv = net.node("Transpose", [net.node("Reshape", [qkv, net.ints(n_tok, 3, heads, HEAD_DIM)])],
                       perm=[1, 2, 0, 3])  # (3, heads, N, hd)
        q, k, v = net.nodes_out("Split", [qkv, net.ints(1, 1, 1)], 3, axis=0)  # (1, heads, N, hd) each
        att = net.node("Softmax", [net.node("MatMul", [net.mul(q, scale),
                                                       net.node("Transpose", [k], perm=[0, 1, 3, 2])])], axis=-1)
        o = net.node("Transpose", [net.node("MatMul", [att, v])], perm=[0, 2, 1, 3])
        x = net.add(x, net.linear(net.node("Reshape", [o, net.ints(n_tok, d)]), p + "attn.proj"))
        y = gelu(net.linear(net.layer_norm(x, p + "norm2"), p + "mlp.fc1"))
        x = tags[f"block{b}"] = net.add(x, net.linear(y, p + "mlp.fc2"))
        if b in HOOKS:
            hooked[b] = x
    # ---- reassemble: Linear over [token, class token] and GELU (the readout projection), to (D, gh, gw)
    layers = list(feats[:2])
    for k, b in ((3, HOOKS[0]), (4, HOOKS[1])):
        p = f"pretrained.act_postprocess{k}."
        tok = net.node("Slice", [hooked[b], net.ints(1), net.ints(n_tok), net.ints(0)])
        cls = net.node("Slice", [hooked[b], net.ints(0), net.ints(1), net.ints(0)])
        y = gelu(net.add(net.linear(tok, p + "0.project.0.tok"), net.linear(cls, p + "0.project.0.cls")))
        y = net.node("Reshape", [net.node("Transpose", [y], perm=[1, 0]), net.ints(1, d, gh, gw)])
        y = net.conv(y, p + "3")
        layers.append(net.conv(y, p + "4", stride=2, pad=1) if k == 4 else y)
    # ---- the DPT head
    rn = [net.conv(t, f"scratch.layer{i}_rn") for i, t in enumerate(layers, 1)]

    def unit(x: str, p: str) -> str:
        y = net.conv(net.relu(net.conv(net.relu(x), p + "conv1")), p + "conv2")
        return net.add(y, x)

    path = ""
    for i in (4, 3, 2, 1):
        p = f"scratch.refinenet{i}."
        out = rn[i - 1] if i == 4 else net.add(path, unit(rn[i - 1], p + "resConfUnit1."))
        out = net.resize(unit(out, p + "resConfUnit2."), scale=2.0, align_corners=True)
        path = tags[f"refinenet{i}"] = net.conv(out, p + "out_conv")
    y = net.resize(net.conv(path, "scratch.output_conv.0"), scale=2.0, align_corners=True)
    y = net.relu(net.conv(net.relu(net.conv(y, "scratch.output_conv.2")), "scratch.output_conv.4"))
    return net.model("sdrt_midas_dpt_hybrid", {"image": (1, 3, height, width)},
                     {y: "depth", **{tags[t]: t for t in taps}})


# ------------------------------------------------------------------------------------------ around the network
def sobel3(a: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """``cv2.Sobel(a, cv2.CV_32F, dx, dy, ksize=3)`` of a float32 plane, bit for bit with OpenCV's 8-lane (AVX2)
    build: [-1, 0, 1] along the derivative's axis, [1, 2, 1] along the other, reflect-101 edges, the row pass then
    the column pass in float32. The [1, 2, 1] sums run ``(a + c) + 2b`` over the columns its vector loop covers
    (multiples of 8) and ``(a + 2b) + c`` in the scalar tail (the row pass: in pairs, a last odd column as the
    vector loop). The maps' planes are multiples of 64 wide, all vector loop."""
    a = np.asarray(a, np.float32)
    two = np.float32(2)
    p = np.pad(a, 1, mode="reflect") if min(a.shape) > 1 else np.pad(a, 1, mode="edge")
    w = a.shape[1]
    head = w - w % 8
    if dx:
        rows = p[:, 2:] - p[:, :-2]
        up, mid, dn = rows[:-2], rows[1:-1], rows[2:]
        out = (up + dn) + mid * two
        out[:, head:] = (up[:, head:] + mid[:, head:] * two) + dn[:, head:]
        return out
    left, mid, right = p[:, :-2], p[:, 1:-1], p[:, 2:]
    rows = (left + right) + mid * two
    pairs = head + (w - head) // 2 * 2
    rows[:, head:pairs] = (left[:, head:pairs] + mid[:, head:pairs] * two) + right[:, head:pairs]
    return rows[2:] - rows[:-2]


def _scaled(depth: np.ndarray) -> np.ndarray:
    """``depth_pt``: the depth less its minimum, over the shifted map's maximum (float32; a flat map is NaN)."""
    d = np.asarray(depth, np.float32)
    d = d - d.min()
    with np.errstate(invalid="ignore", divide="ignore"):
        return d / d.max()


def depth_image(depth: np.ndarray) -> np.ndarray:
    """The depth map (HxW uint8) of the network's raw depth, min-max scaled as ``apply_midas`` (a flat depth, whose
    scaling divides by zero in the extension, is black)."""
    s = _scaled(depth)
    return np.nan_to_num(s * np.float32(255.0), nan=0.0).clip(0, 255).astype(np.uint8)


def normal_image(depth: np.ndarray, bg_th: float = 0.4, a: float = NORMAL_A) -> np.ndarray:
    """The normal map (HxWx3 uint8) of the network's raw depth as ``apply_midas``: Sobel x and y of the depth (0
    where the scaled depth is under ``bg_th``), z = ``a``, normalised, ``* 127.5 + 127.5``, channels reversed."""
    d = np.asarray(depth, np.float32)
    s = _scaled(d)
    x, y = sobel3(d, 1, 0), sobel3(d, 0, 1)
    with np.errstate(invalid="ignore"):
        bg = s < bg_th
    x[bg] = 0
    y[bg] = 0
    n = np.stack([x, y, np.full_like(x, np.float32(a))], axis=2)
    n /= np.sum(n ** 2.0, axis=2, keepdims=True) ** 0.5
    return (n * 127.5 + 127.5).clip(0, 255).astype(np.uint8)[:, :, ::-1].copy()


# ------------------------------------------------------------------------------------------ the model
class MidasDepth(AnnotatorNet):
    """``dpt_hybrid-midas-501f0c75.pt`` compiled on one backend per input size; ``depth(rgb)`` -> the raw depth,
    ``maps(rgb, bg_th)`` -> the extension's ``(depth map, normal map)``."""

    WHAT = "MiDaS's DPT-Hybrid depth model"
    FIX = f"pass MiDaS's {MIDAS_FILE} (lllyasviel/Annotators)"

    def strip(self, name: str) -> str:
        return bare(name)

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        self.size = sizes({bare(n): s for n, s in shapes.items()})
        return expected_shapes(**self.size)

    def build(self, *size: int) -> Any:
        return build_graph(self.arrays(), size[0], size[1], self.size)

    def depth(self, rgb: np.ndarray) -> np.ndarray:
        """The network's depth (HxW float32) of an RGB uint8 image whose sides are multiples of 32."""
        h, w = rgb.shape[:2]
        if h % 32 or w % 32:
            raise InputError(f"sdrt.pipelines.midasdepth: the image is {w}x{h}; DPT-Hybrid reads sides that are "
                             "multiples of 32", where="image", fix="pad it (maps() pads to 64 as the extension does)")
        x = rgb.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
        x = np.ascontiguousarray(x.transpose(2, 0, 1)[None])
        return np.asarray(self.session(h, w).run({"image": x})["depth"][0, 0], np.float32)

    def maps(self, rgb: np.ndarray, bg_th: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
        """``apply_midas``' ``(depth map HxW, normal map HxWx3)`` of an RGB uint8 image; one whose sides are not
        multiples of 64 is padded with its edges first and the maps cropped back (the extension's
        ``resize_image_with_pad`` at the image's own size)."""
        h, w = rgb.shape[:2]
        padded = np.pad(rgb, [(0, -h % 64), (0, -w % 64), (0, 0)], mode="edge")
        d = self.depth(padded)
        return depth_image(d)[:h, :w].copy(), normal_image(d, bg_th)[:h, :w].copy()
