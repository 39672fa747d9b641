"""Depth Anything (V1 and V2): sd-webui-controlnet's ``depth_anything`` and ``depth_anything_v2`` run through sdrt.

The file (``depth_anything_vitl14.pth`` from LiheYoung/Depth-Anything; ``depth_anything_v2_vitl.safetensors`` /
``.pth`` from Depth-Anything-V2) is a DINOv2 ViT/14 (``pretrained.*``: patch embedding, a class token, position
embeddings for a 37x37 grid, blocks with fused qkv and layer scale, a final norm) and a DPT head
(``depth_head.*``: four projections and resize layers, ``scratch`` convolutions, four refinement blocks and the
output convolutions). It is read with sdrt's safe file readers and built as an ONNX graph in memory, one per
input size, which runs on any backend (``sdrt.load``). The width, depth and head sizes come from the file, so the
ViT-S/B/L files (``vits14``/``vitb14``/``vitl14``, ``v2_vits``/``v2_vitb``/``v2_vitl``) all run. V1 and V2 files
have the same names and shapes; they differ in which blocks feed the head: V1 takes the last four, V2 the blocks
``2, 5, 8, 11`` (12 blocks), ``4, 11, 17, 23`` (24) or ``9, 19, 29, 39`` (40).

Around the network, numpy follows the extension's ``annotator/depth_anything*.py`` step for step:

- ``cv2.cvtColor(image, COLOR_BGR2RGB) / 255``: the extension hands its RGB image to a call written for OpenCV's
  BGR, so the network reads the channels as B, G, R (kept: the maps are the extension's);
- the image resized (OpenCV's INTER_CUBIC on float64) so that both sides are at least 518 and multiples of 14
  (``keep_aspect_ratio``, ``lower_bound``, rounded to the nearest multiple, up when that falls under 518);
- ImageNet's mean and std, then float32;
- the network; DINOv2's position embeddings resized to the patch grid with torch's bicubic at the scale factor
  ``(grid + 0.1) / 37`` (DINOv2's ``interpolate_offset``; kept as is for a 37x37 grid);
- the prediction resized to the image (torch's bilinear, ``align_corners=False``), scaled by its minimum and
  maximum to 0..255 and truncated to uint8 (a flat prediction gives a black map).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelError
from .netgraph import AnnotatorNet

__all__ = ["Config", "DepthAnything", "bilinear", "build_graph", "cubic", "depth_map", "expected_shapes", "input_size",
           "pos_embed", "prepare", "read_config"]

#: Depth-Anything-V2's ``intermediate_layer_idx`` by the number of blocks
V2_LAYERS = {12: (2, 5, 8, 11), 24: (4, 11, 17, 23), 40: (9, 19, 29, 39)}
PATCH, SIZE, HEAD_DIM, EPS = 14, 518, 64, 1e-6
#: the most patches an image may make: a 4:1 image at 518 on its shorter side (the attention's memory grows with
#: the square of it: 16 heads of 5476^2 float32 scores are 1.9 GB for ViT-L)
MAX_PATCHES = 4 * 37 * 37
MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])
_WHAT = {1: ("depth_anything", "depth_anything_vitl14.pth (LiheYoung/Depth-Anything, checkpoints/)"),
         2: ("depth_anything_v2", "depth_anything_v2_vitl.safetensors (MackinationsAi/Depth-Anything-V2_Safetensors)"
                                  " or depth_anything_v2_vitl.pth (depth-anything/Depth-Anything-V2-Large)")}


# ------------------------------------------------------------------------------------------ the file's layout
@dataclass(frozen=True)
class Config:
    """What the file says: the ViT's width, blocks, MLP width and position grid; the head's widths."""

    dim: int
    depth: int
    mlp: int
    grid: int
    features: int
    out_channels: tuple[int, int, int, int]

    @property
    def heads(self) -> int:
        return self.dim // HEAD_DIM


def _strip(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    """Bare names (``pretrained.`` / ``depth_head.`` onwards) -> the file's names (a ``module.`` prefix allowed)."""
    out = {}
    for n in shapes:
        for root in ("pretrained.", "depth_head."):
            i = n.find(root)
            if i == 0 or (i > 0 and n[i - 1] == "."):
                out[n[i:]] = n
                break
    return out


def read_config(shapes: Mapping[str, tuple[int, ...]], where: str, version: int = 1) -> Config:
    """The :class:`Config` of a file's tensor shapes; a ``ModelError`` for a file that is not Depth Anything."""
    bare = {b: tuple(shapes[n]) for b, n in _strip(shapes).items()}
    module, download = _WHAT[version]
    need = ("pretrained.pos_embed", "pretrained.blocks.0.mlp.fc1.weight", "depth_head.scratch.layer1_rn.weight")
    for n in need:
        if n not in bare:
            if "pretrained.blocks.0.mlp.w12.weight" in bare:
                raise ModelError(f"{where} is a ViT-G Depth Anything file (SwiGLU blocks); sdrt runs the ViT-S/B/L "
                                 "files", where=where, fix=f"pass {download}")
            raise ModelError(f"{where} is not a Depth Anything file ({n} missing)", where=where,
                             fix=f"pass {download}")
    pos = bare["pretrained.pos_embed"]
    depth = 0
    while f"pretrained.blocks.{depth}.norm1.weight" in bare:
        depth += 1
    grid = int(round(math.sqrt(pos[1] - 1))) if len(pos) == 3 else 0
    cfg = Config(dim=pos[-1], depth=depth, mlp=bare["pretrained.blocks.0.mlp.fc1.weight"][0], grid=grid,
                 features=bare["depth_head.scratch.layer1_rn.weight"][0],
                 out_channels=tuple(bare.get(f"depth_head.projects.{i}.weight", (0,))[0] for i in range(4)))
    if len(pos) != 3 or grid * grid + 1 != pos[1] or cfg.dim % HEAD_DIM or depth < 4:
        raise ModelError(f"{where}: pretrained.pos_embed is {pos} with {depth} blocks, not a DINOv2 ViT/14's",
                         where=where, fix=f"pass {download}")
    if version == 2 and depth not in V2_LAYERS:
        raise ModelError(f"{where} has {depth} blocks; Depth Anything V2's files have 12, 24 or 40", where=where,
                         fix=f"pass {download}")
    want = expected_shapes(cfg)
    missing = [n for n in want if n not in bare]
    if missing:
        raise ModelError(f"{where} is not a Depth Anything file ({len(missing)} of its {len(want)} tensors missing, "
                         f"e.g. {missing[0]})", where=where, fix=f"pass {download}")
    for n, shape in want.items():
        if bare[n] != shape:
            raise ModelError(f"{where}: {n} is {bare[n]}, not {shape} as the rest of the file says", where=where,
                             fix=f"pass an unchanged {download}")
    extra = [n for n in bare if n not in want]
    if extra:
        raise ModelError(f"{where} has tensors Depth Anything's network does not have (e.g. {extra[0]})",
                         where=where, fix=f"pass {download}")
    return cfg


def expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Depth Anything file of ``cfg`` and its shape (the original repos' state-dict names)."""
    d, f, oc = cfg.dim, cfg.features, cfg.out_channels
    out: dict[str, tuple[int, ...]] = {
        "pretrained.cls_token": (1, 1, d), "pretrained.pos_embed": (1, cfg.grid * cfg.grid + 1, d),
        "pretrained.mask_token": (1, d), "pretrained.patch_embed.proj.weight": (d, 3, PATCH, PATCH),
        "pretrained.patch_embed.proj.bias": (d,), "pretrained.norm.weight": (d,), "pretrained.norm.bias": (d,)}
    for i in range(cfg.depth):
        b = f"pretrained.blocks.{i}."
        out.update({b + "norm1.weight": (d,), b + "norm1.bias": (d,), b + "attn.qkv.weight": (3 * d, d),
                    b + "attn.qkv.bias": (3 * d,), b + "attn.proj.weight": (d, d), b + "attn.proj.bias": (d,),
                    b + "ls1.gamma": (d,), b + "norm2.weight": (d,), b + "norm2.bias": (d,),
                    b + "mlp.fc1.weight": (cfg.mlp, d), b + "mlp.fc1.bias": (cfg.mlp,),
                    b + "mlp.fc2.weight": (d, cfg.mlp), b + "mlp.fc2.bias": (d,), b + "ls2.gamma": (d,)})
    h = "depth_head."
    for i, c in enumerate(oc):
        out[f"{h}projects.{i}.weight"] = (c, d, 1, 1)
        out[f"{h}projects.{i}.bias"] = (c,)
        out[f"{h}scratch.layer{i + 1}_rn.weight"] = (f, c, 3, 3)
    for i, k in ((0, 4), (1, 2)):
        out[f"{h}resize_layers.{i}.weight"] = (oc[i], oc[i], k, k)
        out[f"{h}resize_layers.{i}.bias"] = (oc[i],)
    out[f"{h}resize_layers.3.weight"] = (oc[3], oc[3], 3, 3)
    out[f"{h}resize_layers.3.bias"] = (oc[3],)
    for r in range(1, 5):
        p = f"{h}scratch.refinenet{r}."
        out[p + "out_conv.weight"] = (f, f, 1, 1)
        out[p + "out_conv.bias"] = (f,)
        for u in (1, 2):
            for c in (1, 2):
                out[f"{p}resConfUnit{u}.conv{c}.weight"] = (f, f, 3, 3)
                out[f"{p}resConfUnit{u}.conv{c}.bias"] = (f,)
    out.update({f"{h}scratch.output_conv1.weight": (f // 2, f, 3, 3), f"{h}scratch.output_conv1.bias": (f // 2,),
                f"{h}scratch.output_conv2.0.weight": (32, f // 2, 3, 3), f"{h}scratch.output_conv2.0.bias": (32,),
                f"{h}scratch.output_conv2.2.weight": (1, 32, 1, 1), f"{h}scratch.output_conv2.2.bias": (1,)})
    return out


def layers(version: int, depth: int) -> tuple[int, ...]:
    """The blocks whose outputs feed the head: V1's last four, V2's ``intermediate_layer_idx``."""
    return tuple(range(depth - 4, depth)) if version == 1 else V2_LAYERS[depth]


# ------------------------------------------------------------------------------------------ position embeddings
def _torch_cubic(t: np.ndarray) -> np.ndarray:
    """torch's cubic convolution weights (A = -0.75) for the fractions ``t``: (n, 4)."""
    a = -0.75
    x1, x2 = t + 1, 1 - t

    def near(x: np.ndarray) -> np.ndarray:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(x1), near(t), near(x2), far(2 - t)], axis=1)


def _bicubic_axis(src: int, dst: int, inv_scale: float) -> np.ndarray:
    """(dst, src) matrix of torch's bicubic (``align_corners=False``, edges clamped) at source step ``inv_scale``."""
    real = (np.arange(dst) + 0.5) * inv_scale - 0.5
    i0 = np.floor(real).astype(int)
    w = _torch_cubic(real - i0)
    m = np.zeros((dst, src))
    for k in range(4):
        np.add.at(m, (np.arange(dst), np.clip(i0 + k - 1, 0, src - 1)), w[:, k])
    return m


def pos_embed(pos: np.ndarray, gh: int, gw: int, offset: float = 0.1) -> np.ndarray:
    """DINOv2's ``interpolate_pos_encoding``: the (1, 1 + M*M, D) position embeddings for a ``gh`` x ``gw`` patch
    grid, the patch part resized by torch's bicubic at scale factor ``(g + offset) / M`` (offset 0: the output size,
    as DINOv2 with registers and transformers do); unchanged for an M x M grid."""
    pos = np.asarray(pos, np.float32)
    m = int(round(math.sqrt(pos.shape[1] - 1)))
    if (gh, gw) == (m, m):
        return pos
    grid = pos[0, 1:].reshape(m, m, -1).astype(np.float64)
    if offset:
        ry, rx = _bicubic_axis(m, gh, 1.0 / ((gh + offset) / m)), _bicubic_axis(m, gw, 1.0 / ((gw + offset) / m))
    else:
        ry, rx = _bicubic_axis(m, gh, m / gh), _bicubic_axis(m, gw, m / gw)
    out = np.einsum("hm,mnd,wn->hwd", ry, grid, rx).astype(np.float32)
    return np.concatenate([pos[:, :1], out.reshape(1, gh * gw, -1)], axis=1)


# ------------------------------------------------------------------------------------------ the network
def build_graph(arrays: Mapping[str, np.ndarray], cfg: Config, blocks: Sequence[int], height: int, width: int,
                offset: float = 0.1) -> Any:
    """The ``onnx.ModelProto`` for one ``(1, 3, height, width)`` input ``image`` (sides multiples of 14) ->
    ``depth`` (1, 1, height, width): the ViT, its ``blocks`` through the final norm into the DPT head.
    ``arrays`` by the bare names (``pretrained.*``, ``depth_head.*``)."""
    from .netgraph import Net

    f32 = np.float32
    gh, gw = height // PATCH, width // PATCH
    n, d, heads = gh * gw, cfg.dim, cfg.heads
    own = dict(arrays)
    pos = pos_embed(own["pretrained.pos_embed"], gh, gw, offset)
    scale = f32(HEAD_DIM ** -0.5)  # a power of two for 64-wide heads: folded into q's weights exactly
    for i in range(max(blocks) + 1):
        p = f"pretrained.blocks.{i}.attn."
        qkv_w, qkv_b = np.asarray(own[p + "qkv.weight"], f32), np.asarray(own[p + "qkv.bias"], f32)
        for j, part in enumerate("qkv"):
            own[f"{p}{part}.weight"] = qkv_w[j * d:(j + 1) * d] * (scale if part == "q" else f32(1))
            own[f"{p}{part}.bias"] = qkv_b[j * d:(j + 1) * d] * (scale if part == "q" else f32(1))
    net = Net(own)
    # patches, class token, position embeddings
    x = net.conv("image", "pretrained.patch_embed.proj", stride=PATCH, pad=0)
    x = net.node("Transpose", [net.node("Reshape", [x, net.ints(1, d, n)])], perm=[0, 2, 1])
    x = net.add(x, net.const("patch_pos", pos[:, 1:]))
    x = net.concat([net.const("cls_pos", np.asarray(own["pretrained.cls_token"], f32) + pos[:, :1]), x], axis=1)
    split, merge = net.ints(1, n + 1, heads, HEAD_DIM), net.ints(1, n + 1, d)
    feats: list[str] = []
    for i in range(max(blocks) + 1):
        p = f"pretrained.blocks.{i}."
        h = net.layer_norm(x, p + "norm1", EPS)
        q, k, v = (net.node("Reshape", [net.linear(h, p + "attn." + part), split]) for part in "qkv")
        q = net.node("Transpose", [q], perm=[0, 2, 1, 3])
        k = net.node("Transpose", [k], perm=[0, 2, 3, 1])
        v = net.node("Transpose", [v], perm=[0, 2, 1, 3])
        att = net.node("Softmax", [net.node("MatMul", [q, k])], axis=-1)
        o = net.node("Transpose", [net.node("MatMul", [att, v])], perm=[0, 2, 1, 3])
        o = net.linear(net.node("Reshape", [o, merge]), p + "attn.proj")
        x = net.add(x, net.mul(o, net.weight(p + "ls1.gamma")))
        h = net.linear(net.layer_norm(x, p + "norm2", EPS), p + "mlp.fc1")
        erf = net.node("Erf", [net.node("Div", [h, net.scalar(math.sqrt(2.0))])])
        h = net.mul(net.mul(h, net.add(erf, net.scalar(1.0))), net.scalar(0.5))  # GELU (erf), as torch's
        h = net.linear(h, p + "mlp.fc2")
        x = net.add(x, net.mul(h, net.weight(p + "ls2.gamma")))
        if i in blocks:
            feats.append(x)
    # the head: each fed block's tokens (final norm, class token dropped) as a (1, D, gh, gw) map
    maps = []
    for j, t in enumerate(feats):
        t = net.node("Slice", [net.layer_norm(t, "pretrained.norm", EPS), net.ints(1), net.ints(n + 1), net.ints(1)])
        t = net.node("Reshape", [net.node("Transpose", [t], perm=[0, 2, 1]), net.ints(1, d, gh, gw)])
        t = net.conv(t, f"depth_head.projects.{j}", pad=0)
        if j in (0, 1):
            t = net.conv_transpose(t, f"depth_head.resize_layers.{j}", stride=4 if j == 0 else 2)
        elif j == 3:
            t = net.conv(t, "depth_head.resize_layers.3", stride=2, pad=1)
        maps.append(net.conv(t, f"depth_head.scratch.layer{j + 1}_rn", pad=1, bias=False))
    sizes = [(4 * gh, 4 * gw), (2 * gh, 2 * gw), (gh, gw)]

    def unit(t: str, name: str) -> str:
        y = net.conv(net.relu(t), name + ".conv1", pad=1)
        return net.add(net.conv(net.relu(y), name + ".conv2", pad=1), t)

    path = None
    for r in (4, 3, 2, 1):  # refinenet4 first, each fused block resized to the next map's size (x2 for the last)
        p = f"depth_head.scratch.refinenet{r}"
        t = maps[r - 1] if path is None else net.add(path, unit(maps[r - 1], p + ".resConfUnit1"))
        t = unit(t, p + ".resConfUnit2")
        hw = sizes[r - 2] if r > 1 else (8 * gh, 8 * gw)
        path = net.conv(net.resize(t, size=hw, align_corners=True), p + ".out_conv", pad=0)
    assert path is not None
    y = net.conv(path, "depth_head.scratch.output_conv1", pad=1)
    y = net.resize(y, size=(gh * PATCH, gw * PATCH), align_corners=True)
    y = net.relu(net.conv(y, "depth_head.scratch.output_conv2.0", pad=1))
    y = net.relu(net.conv(y, "depth_head.scratch.output_conv2.2", pad=0))
    return net.model("sdrt_depth_anything", {"image": (1, 3, height, width)}, {y: "depth"})


# ------------------------------------------------------------------------------------------ around the network
def input_size(height: int, width: int, size: int = SIZE) -> tuple[int, int]:
    """The extension's ``Resize(size, size, keep_aspect_ratio=True, ensure_multiple_of=14, resize_method=
    "lower_bound")``: ``(height, width)`` of the network's input."""
    sh, sw = size / height, size / width
    s = sw if sw > sh else sh

    def fit(x: float) -> int:
        y = int(np.round(x / PATCH) * PATCH)
        return int(np.ceil(x / PATCH) * PATCH) if y < size else y

    return fit(s * height), fit(s * width)


def _cv_cubic_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's INTER_CUBIC taps: positions ``(d + 0.5) * scale - 0.5`` in doubles cast to float32, weights
    (A = -0.75) in float32 as its ``interpolateCubic``, indices clamped at the edges."""
    scale = 1.0 / (dst / src)
    fx = ((np.arange(dst) + 0.5) * scale - 0.5).astype(np.float32)
    sx = np.floor(fx).astype(np.int64)
    x = (fx - sx.astype(np.float32)).astype(np.float32)
    a = np.float32(-0.75)
    x1 = x + np.float32(1)
    c0 = ((a * x1 - np.float32(5) * a) * x1 + np.float32(8) * a) * x1 - np.float32(4) * a
    c1 = ((a + np.float32(2)) * x - (a + np.float32(3))) * x * x + np.float32(1)
    y = np.float32(1) - x
    c2 = ((a + np.float32(2)) * y - (a + np.float32(3))) * y * y + np.float32(1)
    c3 = np.float32(1) - c0 - c1 - c2
    idx = np.clip(sx[:, None] + np.arange(-1, 3)[None, :], 0, src - 1)
    return idx, np.stack([c0, c1, c2, c3], axis=1).astype(np.float64)


def cubic(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(a, (width, height), interpolation=cv2.INTER_CUBIC)`` of a float64 HxWxC image: each row
    (left to right sums of four taps), then the columns, in doubles."""
    a = np.asarray(a, np.float64)
    h, w = a.shape[:2]
    ix, wx = _cv_cubic_axis(w, width)
    iy, wy = _cv_cubic_axis(h, height)
    rows = a[:, ix[:, 0]] * wx[:, 0, None]
    for k in range(1, 4):
        rows = rows + a[:, ix[:, k]] * wx[:, k, None]
    out = rows[iy[:, 0]] * wy[:, 0, None, None]
    for k in range(1, 4):
        out = out + rows[iy[:, k]] * wy[:, k, None, None]
    return out


def prepare(rgb: np.ndarray, size: int = SIZE) -> np.ndarray:
    """The network's ``(1, 3, h, w)`` float32 input of an RGB uint8 image, as the extension makes it."""
    nh, nw = input_size(rgb.shape[0], rgb.shape[1], size)
    if (nh // PATCH) * (nw // PATCH) > MAX_PATCHES * (size / SIZE) ** 2:
        where = "sdrt.pipelines.depthanything"
        raise InputError(f"a {rgb.shape[0]}x{rgb.shape[1]} control image is {nh}x{nw} for Depth Anything (its "
                         f"shorter side at {size}), {(nh // PATCH) * (nw // PATCH)} patches: more than the "
                         f"{MAX_PATCHES} of a 4:1 image", where=where,
                         fix="crop the control image to nearer a square (at most 4:1)")
    img = np.ascontiguousarray(rgb[:, :, ::-1]) / 255.0  # cvtColor(BGR2RGB) of the extension's RGB image
    img = cubic(img, nw, nh) if (nh, nw) != rgb.shape[:2] else img
    img = (img - MEAN) / STD
    return np.ascontiguousarray(img.transpose(2, 0, 1)).astype(np.float32)[None]


def _bilinear_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    f32 = np.float32
    scale = f32(src) / f32(dst)
    real = np.maximum(scale * (np.arange(dst, dtype=f32) + f32(0.5)) - f32(0.5), f32(0))
    i0 = real.astype(np.int64)
    l1 = (real - i0.astype(f32)).astype(f32)
    i1 = np.minimum(i0 + 1, src - 1)
    return i0, i1, (f32(1) - l1).astype(f32), l1


def bilinear(a: np.ndarray, height: int, width: int) -> np.ndarray:
    """``F.interpolate(a[None, None], (height, width), mode="bilinear", align_corners=False)`` of a float32 2-D
    map, in float32: ``h0 * (w0 * a + w1 * b) + h1 * (w0 * c + w1 * d)``."""
    a = np.asarray(a, np.float32)
    y0, y1, h0, h1 = _bilinear_axis(a.shape[0], height)
    x0, x1, w0, w1 = _bilinear_axis(a.shape[1], width)
    top = a[y0][:, x0] * w0 + a[y0][:, x1] * w1
    bot = a[y1][:, x0] * w0 + a[y1][:, x1] * w1
    return (top * h0[:, None] + bot * h1[:, None]).astype(np.float32)


def depth_map(depth: np.ndarray) -> np.ndarray:
    """The extension's ``(d - min) / (max - min) * 255`` truncated to uint8 (float32 arithmetic); a flat
    prediction (where the extension divides 0 by 0) is black."""
    d = np.asarray(depth, np.float32)
    lo, hi = d.min(), d.max()
    if not hi > lo:
        return np.zeros(d.shape, np.uint8)
    return ((d - lo) / (hi - lo) * np.float32(255.0)).astype(np.uint8)


# ------------------------------------------------------------------------------------------ the detector
class DepthAnything(AnnotatorNet):
    """A Depth Anything file (``version`` 1: ``depth_anything``, 2: ``depth_anything_v2``) compiled on one backend
    per input size; ``map(rgb)`` -> the extension's HxW uint8 depth map of an RGB uint8 image. ``size`` is the
    lower bound the image is resized to (518 as the extension; smaller sizes for quick checks); ``offset``:
    DINOv2's ``interpolate_offset`` (0.1; 0 resizes the position embeddings as transformers does)."""

    WHAT = "a Depth Anything file"
    #: the compiled input sizes kept (each holds its own copy of the weights: 1.3 GB for ViT-L); the oldest is
    #: closed when another size comes
    KEEP = 2

    def __init__(self, path: str | Path, version: int = 1, *, backend: str = "auto", device: Any = None,
                 size: int = SIZE, offset: float = 0.1) -> None:
        if version not in (1, 2):
            raise InputError(f"Depth Anything version {version!r}", where="version", fix="pass 1 or 2")
        self.version, self.size, self.offset = version, int(size), float(offset)
        self.FIX = f"pass {_WHAT[version][1]}"
        self.path = Path(path)
        self._lock = threading.Lock()
        super().__init__(path, backend=backend, device=device)
        self.blocks = layers(version, self.config.depth)

    def strip(self, name: str) -> str:
        for root in ("pretrained.", "depth_head."):
            i = name.find(root)
            if i == 0 or (i > 0 and name[i - 1] == "."):
                return name[i:]
        return name

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        self.config = read_config(shapes, str(self.path), self.version)
        return expected_shapes(self.config)

    def build(self, *size: int) -> Any:
        model = build_graph(self.arrays(), self.config, self.blocks, size[0], size[1], self.offset)
        self._arrays = None  # the session holds its own copy (1.3 GB for ViT-L); another size reads the file again
        return model

    def predict(self, rgb: np.ndarray) -> np.ndarray:
        """The network's ``(h, w)`` float32 relative depth (inverse depth: near is large) at its input size."""
        x = prepare(rgb, self.size)
        key = (x.shape[2], x.shape[3])
        with self._lock:  # one run at a time: a job and serve's detect may share this detector
            if key in self._sessions:
                self._sessions[key] = self._sessions.pop(key)  # the most recent last
            while key not in self._sessions and len(self._sessions) >= self.KEEP:
                self._sessions.pop(next(iter(self._sessions))).close()
            return self.session(*key).run({"image": x})["depth"][0, 0]

    def depth(self, rgb: np.ndarray) -> np.ndarray:
        """The prediction resized to the image (float32, HxW)."""
        return bilinear(self.predict(rgb), rgb.shape[0], rgb.shape[1])

    def map(self, rgb: np.ndarray) -> np.ndarray:
        """The extension's HxW uint8 depth map (``colored=False``)."""
        return depth_map(self.depth(rgb))
