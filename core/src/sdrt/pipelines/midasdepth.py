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

from ..errors import InputError, ModelError

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
#: where the extension (its downloads folder, and its older place beside the module) and ComfyUI keep the file
LAYOUTS = ("extensions/sd-webui-controlnet/annotator/downloads/midas", "annotator/downloads/midas",
           "extensions/sd-webui-controlnet/annotator/midas", "custom_nodes/comfyui_controlnet_aux/ckpts/lllyasviel/Annotators",
           "ckpts/lllyasviel/Annotators", "lllyasviel/Annotators", "midas")


# ------------------------------------------------------------------------------------------ files
def find_file(where: str | Path | Sequence[str | Path], *, what: str = "preprocessor_models") -> Path:
    """``dpt_hybrid-midas-501f0c75.pt``: ``where`` is the file, a folder holding it, or a models folder with the
    extension's (``annotator/downloads/midas``) or ComfyUI's (``ckpts/lllyasviel/Annotators``) layout under it."""
    if not isinstance(where, (str, Path)):
        files = [Path(p) for p in where]
        hits = [f for f in files if f.name == MIDAS_FILE] or [f for f in files if f.suffix in (".pt", ".pth")]
        if len(hits) != 1:
            raise InputError(f"{what}: depth_midas needs one {MIDAS_FILE}; given {', '.join(map(str, files)) or 'none'}",
                             where=what, fix=f"pass {MIDAS_FILE} or the folder holding it")
        where = hits[0]
    base = Path(where)
    if base.is_file():
        return base
    looked = [base, *(base / s for s in LAYOUTS)]
    for folder in looked:
        if (folder / MIDAS_FILE).is_file():
            return folder / MIDAS_FILE
    raise InputError(f"{what}: no {MIDAS_FILE} in {base} (looked in {', '.join(str(p) for p in looked[:4])} and "
                     f"{len(looked) - 4} more)", where=what,
                     fix=f"download {MIDAS_FILE} (lllyasviel/Annotators) into one of those folders, or pass the file")


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


def _layout(shapes: Mapping[str, tuple[int, ...]], where: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The file's names for the tensors the network reads (a ``module.`` / ``model.`` prefix allowed) and its sizes,
    read from the file (the published file: ViT-B, 12 blocks, stages of 3, 4 and 9 blocks, 256 features)."""
    fix = f"pass MiDaS's {MIDAS_FILE} (lllyasviel/Annotators)"
    bare: dict[str, str] = {}
    for n in shapes:
        m = re.search(r"(pretrained\.|scratch\.)", n)
        if m:
            bare.setdefault(n[m.start():], n)
    key = _VIT + "cls_token"
    if key not in bare or _VIT + "pos_embed" not in bare or _RES + "stem.conv.weight" not in bare:
        raise ModelError(f"{where} is not MiDaS's DPT-Hybrid depth model (no {key})", where=where, fix=fix)
    embed = int(shapes[bare[key]][-1])
    depth = len({int(m.group(1)) for n in bare if (m := re.match(re.escape(_VIT) + r"blocks\.(\d+)\.", n))})
    layers = [len({int(m.group(1)) for n in bare
                   if (m := re.match(re.escape(_RES) + rf"stages\.{s}\.blocks\.(\d+)\.", n))}) for s in range(3)]
    try:
        size = dict(embed=embed, depth=depth, layers=layers, stem=int(shapes[bare[_RES + "stem.conv.weight"]][0]),
                    channels=[int(shapes[bare[f"{_RES}stages.{s}.blocks.0.conv3.weight"]][0]) for s in range(3)],
                    features=int(shapes[bare["scratch.layer1_rn.weight"]][0]),
                    grid=int(round(math.sqrt(int(shapes[bare[_VIT + "pos_embed"]][1]) - 1))),
                    mlp=int(shapes[bare[_VIT + "blocks.0.mlp.fc1.weight"]][0]))
    except (KeyError, IndexError):
        raise ModelError(f"{where} is not MiDaS's DPT-Hybrid depth model (its ResNet stages or DPT head are missing)",
                         where=where, fix=fix) from None
    if depth <= max(HOOKS) or embed % HEAD_DIM or any(c % (4 * GROUPS) for c in size["channels"]):
        raise ModelError(f"{where} is not MiDaS's DPT-Hybrid depth model ({depth} ViT blocks of width {embed})",
                         where=where, fix=fix)
    want = expected_shapes(**size)
    missing = [n for n in want if n not in bare]
    if missing:
        raise ModelError(f"{where} is not MiDaS's DPT-Hybrid depth model ({len(missing)} of its {len(want)} tensors "
                         f"missing, e.g. {missing[0]})", where=where, fix=fix)
    for n, shape in want.items():
        if tuple(shapes[bare[n]]) != shape:
            raise ModelError(f"{where}: {n} is {tuple(shapes[bare[n]])}, not DPT-Hybrid's {shape}", where=where,
                             fix=fix)
    return {n: bare[n] for n in want}, size


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


class _Builder:
    """A few ONNX node helpers over one node/initializer list."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0
        #: named intermediate tensors (the stages, hooked blocks, refinenets), for checking against a reference
        self.tags: dict[str, str] = {}

    def node(self, op: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        self.count += 1
        out = out or f"{op.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op.lower()}_{self.count}", **attrs))
        return out

    def const(self, a: np.ndarray, name: str | None = None) -> str:
        from onnx import numpy_helper

        self.count += 1
        name = name or f"c_{self.count}"
        arr = np.ascontiguousarray(a)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def conv(self, x: str, w: np.ndarray, b: np.ndarray | None, stride: int = 1,
             pads: tuple[int, int, int, int] | None = None) -> str:
        k = int(w.shape[-1])
        pads = pads or (k // 2,) * 4
        ins = [x, self.const(np.asarray(w, np.float32))]
        if b is not None:
            ins.append(self.const(np.asarray(b, np.float32)))
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=list(pads))

    def group_norm(self, x: str, c: int, hw: tuple[int, int], gamma: np.ndarray, beta: np.ndarray,
                   relu: bool) -> str:
        """GroupNorm(32, eps 1e-5) as torch exports it: instance norm over (C/G * H, W) per group, then the affine."""
        h, w = hw
        y = self.node("Reshape", [x, self.const(np.array([1, GROUPS, c // GROUPS * h, w], np.int64))])
        y = self.node("InstanceNormalization", [y, self.const(np.ones(GROUPS, np.float32)),
                                                self.const(np.zeros(GROUPS, np.float32))], epsilon=1e-5)
        y = self.node("Reshape", [y, self.const(np.array([1, c, h, w], np.int64))])
        y = self.node("Mul", [y, self.const(np.asarray(gamma, np.float32).reshape(1, c, 1, 1))])
        y = self.node("Add", [y, self.const(np.asarray(beta, np.float32).reshape(1, c, 1, 1))])
        return self.node("Relu", [y]) if relu else y

    def linear(self, x: str, w: np.ndarray, b: np.ndarray | None) -> str:
        y = self.node("MatMul", [x, self.const(np.ascontiguousarray(np.asarray(w, np.float32).T))])
        return self.node("Add", [y, self.const(np.asarray(b, np.float32))]) if b is not None else y

    def gelu(self, x: str) -> str:
        """Exact GELU as torch exports it: x * 0.5 * (1 + erf(x / sqrt 2))."""
        e = self.node("Erf", [self.node("Div", [x, self.const(np.array(math.sqrt(2.0), np.float32))])])
        e = self.node("Add", [e, self.const(np.array(1.0, np.float32))])
        return self.node("Mul", [self.node("Mul", [x, e]), self.const(np.array(0.5, np.float32))])

    def upsample2(self, x: str) -> str:
        """``interpolate(scale_factor=2, mode='bilinear', align_corners=True)``."""
        return self.node("Resize", [x, "", self.const(np.array([1, 1, 2, 2], np.float32))], mode="linear",
                         coordinate_transformation_mode="align_corners")


def build_graph(arrays: Mapping[str, np.ndarray], height: int, width: int, size: Mapping[str, Any],
                taps: Sequence[str] = ()) -> Any:
    """The ``onnx.ModelProto`` of DPT-Hybrid for one ``(1, 3, height, width)`` input ``image`` (sides multiples of
    32) -> ``depth`` (1, 1, height, width); ``arrays`` by the state dict's names, ``size`` as :func:`_layout`;
    ``taps``: intermediate tensors to output too (``stem``, ``stage0``-``2``, ``tokens``, ``blockN``,
    ``refinenetN``), as outputs of those names."""
    import onnx
    from onnx import TensorProto, helper

    g = _Builder()
    a = arrays

    def norm(x: str, prefix: str, c: int, hw: tuple[int, int], relu: bool) -> str:
        return g.group_norm(x, c, hw, a[prefix + ".weight"], a[prefix + ".bias"], relu)

    # ---- the BiT ResNetV2 stem: 7x7/2 'same' StdConv, GroupNorm + ReLU, 3x3/2 'same' max pool
    h, w = height, width
    pt, pb = _same_pads(h, 7, 2)
    pl, pr = _same_pads(w, 7, 2)
    x = g.conv("image", _std_weight(a[_RES + "stem.conv.weight"]), None, 2, (pt, pl, pb, pr))
    h, w = math.ceil(h / 2), math.ceil(w / 2)
    x = g.tags["stem"] = norm(x, _RES + "stem.norm", size["stem"], (h, w), True)
    pt, pb = _same_pads(h, 3, 2)
    pl, pr = _same_pads(w, 3, 2)
    # timm pads with -inf; after the ReLU every value is >= 0, so a zero pad picks the same maxima
    x = g.node("Pad", [x, g.const(np.array([0, 0, pt, pl, 0, 0, pb, pr], np.int64))])
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])
    h, w = (h + pt + pb - 3) // 2 + 1, (w + pl + pr - 3) // 2 + 1
    feats = []
    for s, (n, cout) in enumerate(zip(size["layers"], size["channels"])):
        mid, stride = cout // 4, (1 if s == 0 else 2)
        for b in range(n):
            p = f"{_RES}stages.{s}.blocks.{b}."
            st = stride if b == 0 else 1
            oh, ow = math.ceil(h / st), math.ceil(w / st)
            short = x
            if b == 0:
                short = g.conv(x, _std_weight(a[p + "downsample.conv.weight"]), None, st, (0, 0, 0, 0))
                short = norm(short, p + "downsample.norm", cout, (oh, ow), False)
            y = g.conv(x, _std_weight(a[p + "conv1.weight"]), None)
            y = norm(y, p + "norm1", mid, (h, w), True)
            if st == 1:
                y = g.conv(y, _std_weight(a[p + "conv2.weight"]), None)
            else:
                pt, pb = _same_pads(h, 3, st)
                pl, pr = _same_pads(w, 3, st)
                y = g.conv(y, _std_weight(a[p + "conv2.weight"]), None, st, (pt, pl, pb, pr))
            y = norm(y, p + "norm2", mid, (oh, ow), True)
            y = g.conv(y, _std_weight(a[p + "conv3.weight"]), None)
            y = norm(y, p + "norm3", cout, (oh, ow), False)
            x = g.node("Relu", [g.node("Add", [y, short])])
            h, w = oh, ow
        feats.append((x, cout, (h, w)))
        g.tags[f"stage{s}"] = x
    # ---- ViT-B/16 over the 1/16 features
    d = size["embed"]
    heads = d // HEAD_DIM
    gh, gw = h, w
    n_tok = 1 + gh * gw
    x = g.conv(x, a[_VIT + "patch_embed.proj.weight"], a[_VIT + "patch_embed.proj.bias"], 1, (0, 0, 0, 0))
    x = g.node("Transpose", [g.node("Reshape", [x, g.const(np.array([d, gh * gw], np.int64))])], perm=[1, 0])
    x = g.node("Concat", [g.const(np.asarray(a[_VIT + "cls_token"], np.float32).reshape(1, d)), x], axis=0)
    x = g.tags["tokens"] = g.node("Add", [x, g.const(resize_pos_embed(a[_VIT + "pos_embed"], gh, gw))])
    scale = np.array(HEAD_DIM ** -0.5, np.float32)
    hooked = {}
    for b in range(max(HOOKS) + 1):
        p = f"{_VIT}blocks.{b}."
        y = g.node("LayerNormalization", [x, g.const(np.asarray(a[p + "norm1.weight"], np.float32)),
                                          g.const(np.asarray(a[p + "norm1.bias"], np.float32))], axis=-1,
                   epsilon=1e-6)
        qkv = g.linear(y, a[p + "attn.qkv.weight"], a[p + "attn.qkv.bias"])
        qkv = g.node("Reshape", [qkv, g.const(np.array([n_tok, 3, heads, HEAD_DIM], np.int64))])
        qkv = g.node("Transpose", [qkv], perm=[1, 2, 0, 3])  # (3, heads, N, hd)
        q, k, v = (g.node("Slice", [qkv, g.const(np.array([i], np.int64)), g.const(np.array([i + 1], np.int64)),
                                    g.const(np.array([0], np.int64))]) for i in range(3))  # (1, heads, N, hd)
        q = g.node("Mul", [q, g.const(scale)])
        att = g.node("Softmax", [g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 1, 3, 2])])], axis=-1)
        o = g.node("Transpose", [g.node("MatMul", [att, v])], perm=[0, 2, 1, 3])
        o = g.node("Reshape", [o, g.const(np.array([n_tok, d], np.int64))])
        x = g.node("Add", [x, g.linear(o, a[p + "attn.proj.weight"], a[p + "attn.proj.bias"])])
        y = g.node("LayerNormalization", [x, g.const(np.asarray(a[p + "norm2.weight"], np.float32)),
                                          g.const(np.asarray(a[p + "norm2.bias"], np.float32))], axis=-1,
                   epsilon=1e-6)
        y = g.linear(g.gelu(g.linear(y, a[p + "mlp.fc1.weight"], a[p + "mlp.fc1.bias"])),
                     a[p + "mlp.fc2.weight"], a[p + "mlp.fc2.bias"])
        x = g.node("Add", [x, y])
        g.tags[f"block{b}"] = x
        if b in HOOKS:
            hooked[b] = x
    # ---- reassemble: the readout token projected in (Linear over [token, class token]) and GELU, to (D, gh, gw)
    layers = [feats[0][0], feats[1][0]]
    for k, b in ((3, HOOKS[0]), (4, HOOKS[1])):
        p = f"pretrained.act_postprocess{k}."
        wt = np.asarray(a[p + "0.project.0.weight"], np.float32)
        tok = g.node("Slice", [hooked[b], g.const(np.array([1], np.int64)), g.const(np.array([n_tok], np.int64)),
                               g.const(np.array([0], np.int64))])
        cls = g.node("Slice", [hooked[b], g.const(np.array([0], np.int64)), g.const(np.array([1], np.int64)),
                               g.const(np.array([0], np.int64))])
        y = g.node("Add", [g.linear(tok, wt[:, :d], None), g.linear(cls, wt[:, d:], a[p + "0.project.0.bias"])])
        y = g.gelu(y)
        y = g.node("Reshape", [g.node("Transpose", [y], perm=[1, 0]),
                               g.const(np.array([1, d, gh, gw], np.int64))])
        y = g.conv(y, a[p + "3.weight"], a[p + "3.bias"])
        if k == 4:
            y = g.conv(y, a[p + "4.weight"], a[p + "4.bias"], 2, (1, 1, 1, 1))
        layers.append(y)
    # ---- the DPT head
    rn = [g.conv(t, a[f"scratch.layer{i}_rn.weight"], None) for i, t in enumerate(layers, 1)]

    def unit(x: str, p: str) -> str:
        y = g.conv(g.node("Relu", [x]), a[p + "conv1.weight"], a[p + "conv1.bias"])
        y = g.conv(g.node("Relu", [y]), a[p + "conv2.weight"], a[p + "conv2.bias"])
        return g.node("Add", [y, x])

    path = None
    for i in (4, 3, 2, 1):
        p = f"scratch.refinenet{i}."
        out = rn[i - 1] if path is None else g.node("Add", [path, unit(rn[i - 1], p + "resConfUnit1.")])
        out = g.upsample2(unit(out, p + "resConfUnit2."))
        path = g.tags[f"refinenet{i}"] = g.conv(out, a[p + "out_conv.weight"], a[p + "out_conv.bias"])
    y = g.conv(path, a["scratch.output_conv.0.weight"], a["scratch.output_conv.0.bias"])
    y = g.upsample2(y)
    y = g.node("Relu", [g.conv(y, a["scratch.output_conv.2.weight"], a["scratch.output_conv.2.bias"])])
    y = g.conv(y, a["scratch.output_conv.4.weight"], a["scratch.output_conv.4.bias"])
    g.node("Relu", [y], "depth")
    for t in taps:
        g.node("Identity", [g.tags[t]], t)
    graph = helper.make_graph(
        g.nodes, "sdrt_midas_dpt_hybrid",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, height, width])],
        [helper.make_tensor_value_info("depth", TensorProto.FLOAT, [1, 1, height, width])]
        + [helper.make_tensor_value_info(t, TensorProto.FLOAT, []) for t in taps], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="sdrt-midas",
                              ir_version=8)
    onnx.checker.check_model(model)
    return model


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
class MidasDepth:
    """``dpt_hybrid-midas-501f0c75.pt`` compiled on one backend per input size; ``depth(rgb)`` -> the raw depth,
    ``maps(rgb, bg_th)`` -> the extension's ``(depth map, normal map)``."""

    def __init__(self, path: str | Path, *, backend: str = "auto", device: Any = None) -> None:
        from ..weights import Weights

        self.path = Path(path)
        where = str(self.path)
        try:
            self.weights = Weights.open(self.path)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one line naming it
            raise ModelError(f"{where} could not be read as a PyTorch file ({type(exc).__name__}: {exc})",
                             where=where, fix=f"pass MiDaS's {MIDAS_FILE}") from None
        self._names, self.size = _layout(self.weights.shapes(), where)
        self.backend, self.device = backend, device
        self._sessions: dict[tuple[int, int], Any] = {}
        self.files = (self.path,)

    def _session(self, h: int, w: int) -> Any:
        sess = self._sessions.get((h, w))
        if sess is None:
            from ..runtime import load

            arrays = {n: np.asarray(self.weights[f], np.float32) for n, f in self._names.items()}
            sess = self._sessions[(h, w)] = load(build_graph(arrays, h, w, self.size), backend=self.backend,
                                                 device=self.device)
        return sess

    def close(self) -> None:
        for s in self._sessions.values():
            s.close()
        self._sessions.clear()

    def __enter__(self) -> MidasDepth:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def depth(self, rgb: np.ndarray) -> np.ndarray:
        """The network's depth (HxW float32) of an RGB uint8 image whose sides are multiples of 32."""
        h, w = rgb.shape[:2]
        if h % 32 or w % 32:
            raise InputError(f"sdrt.pipelines.midasdepth: the image is {w}x{h}; DPT-Hybrid reads sides that are "
                             "multiples of 32", where="image", fix="pad it (maps() pads to 64 as the extension does)")
        x = rgb.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
        x = np.ascontiguousarray(x.transpose(2, 0, 1)[None])
        return np.asarray(self._session(h, w).run({"image": x})["depth"][0, 0], np.float32)

    def maps(self, rgb: np.ndarray, bg_th: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
        """``apply_midas``' ``(depth map HxW, normal map HxWx3)`` of an RGB uint8 image; one whose sides are not
        multiples of 64 is padded with its edges first and the maps cropped back (the extension's
        ``resize_image_with_pad`` at the image's own size)."""
        h, w = rgb.shape[:2]
        padded = np.pad(rgb, [(0, -h % 64), (0, -w % 64), (0, 0)], mode="edge")
        d = self.depth(padded)
        return depth_image(d)[:h, :w].copy(), normal_image(d, bg_th)[:h, :w].copy()
