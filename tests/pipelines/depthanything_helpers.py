"""Depth Anything files from a fixed seed, at the original repos' state-dict names and shapes, numpy only.

``TINY`` is a narrow file of the same layout (12 blocks of width 128, two heads, a 37x37 position grid, a DPT head
of width 32) for quick runs; ``VITL`` is the published ``depth_anything_vitl14.pth`` / ``depth_anything_v2_vitl``
shape (ViT-L/14: 24 blocks of width 1024, 16 heads; head 256, projections 256/512/1024/1024). The names and
shapes are written out here from the published files' layout (DINOv2's ``pretrained.*``, the DPT head's
``depth_head.*``), not taken from sdrt. ``scripts/ref_depth_anything.py`` loads the same files with
``torch.load`` and runs transformers' ``DepthAnythingForDepthEstimation`` on them.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

SEED = 20261202
#: (dim, blocks, mlp, grid, features, out_channels)
TINY = (128, 12, 512, 37, 32, (16, 32, 64, 64))
VITL = (1024, 24, 4096, 37, 256, (256, 512, 1024, 1024))


def layout(cfg: tuple) -> OrderedDict[str, tuple[int, ...]]:
    """The tensors of a Depth Anything file, in the order the original modules register them."""
    d, depth, mlp, grid, f, oc = cfg
    out: OrderedDict[str, tuple[int, ...]] = OrderedDict()
    out["pretrained.cls_token"] = (1, 1, d)
    out["pretrained.pos_embed"] = (1, grid * grid + 1, d)
    out["pretrained.mask_token"] = (1, d)
    out["pretrained.patch_embed.proj.weight"] = (d, 3, 14, 14)
    out["pretrained.patch_embed.proj.bias"] = (d,)
    for i in range(depth):
        p = f"pretrained.blocks.{i}."
        for n, s in (("norm1.weight", (d,)), ("norm1.bias", (d,)), ("attn.qkv.weight", (3 * d, d)),
                     ("attn.qkv.bias", (3 * d,)), ("attn.proj.weight", (d, d)), ("attn.proj.bias", (d,)),
                     ("ls1.gamma", (d,)), ("norm2.weight", (d,)), ("norm2.bias", (d,)),
                     ("mlp.fc1.weight", (mlp, d)), ("mlp.fc1.bias", (mlp,)), ("mlp.fc2.weight", (d, mlp)),
                     ("mlp.fc2.bias", (d,)), ("ls2.gamma", (d,))):
            out[p + n] = s
    out["pretrained.norm.weight"] = (d,)
    out["pretrained.norm.bias"] = (d,)
    h = "depth_head."
    for i, c in enumerate(oc):
        out[f"{h}projects.{i}.weight"] = (c, d, 1, 1)
        out[f"{h}projects.{i}.bias"] = (c,)
    for i, k in ((0, 4), (1, 2), (3, 3)):
        out[f"{h}resize_layers.{i}.weight"] = (oc[i], oc[i], k, k)
        out[f"{h}resize_layers.{i}.bias"] = (oc[i],)
    for i, c in enumerate(oc):
        out[f"{h}scratch.layer{i + 1}_rn.weight"] = (f, c, 3, 3)
    for r in (1, 2, 3, 4):
        p = f"{h}scratch.refinenet{r}."
        out[p + "out_conv.weight"] = (f, f, 1, 1)
        out[p + "out_conv.bias"] = (f,)
        for u in (1, 2):
            for c in (1, 2):
                out[f"{p}resConfUnit{u}.conv{c}.weight"] = (f, f, 3, 3)
                out[f"{p}resConfUnit{u}.conv{c}.bias"] = (f,)
    out[f"{h}scratch.output_conv1.weight"] = (f // 2, f, 3, 3)
    out[f"{h}scratch.output_conv1.bias"] = (f // 2,)
    out[f"{h}scratch.output_conv2.0.weight"] = (32, f // 2, 3, 3)
    out[f"{h}scratch.output_conv2.0.bias"] = (32,)
    out[f"{h}scratch.output_conv2.2.weight"] = (1, 32, 1, 1)
    out[f"{h}scratch.output_conv2.2.bias"] = (1,)
    return out


def make_weights(cfg: tuple = TINY, seed: int = SEED) -> OrderedDict[str, np.ndarray]:
    """Random weights scaled so that activations stay near unit size through the blocks and the head, and the
    final ReLU passes most of the map (its bias is positive)."""
    rng = np.random.default_rng(seed)
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    for name, shape in layout(cfg).items():
        if name.endswith("gamma"):
            a = rng.uniform(0.05, 0.3, shape)
        elif name.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias") or name.endswith("mask_token"):
            a = 0.05 * rng.standard_normal(shape)
        elif name.endswith(("cls_token", "pos_embed")):
            a = 0.5 * rng.standard_normal(shape)
        elif "resize_layers.0" in name or "resize_layers.1" in name:  # ConvTranspose (in, out, k, k)
            a = rng.standard_normal(shape) * np.sqrt(1.0 / shape[0])
        else:
            fan_in = int(np.prod(shape[1:]))
            gain = 1.0
            a = rng.standard_normal(shape) * np.sqrt(gain / fan_in)
        out[name] = a.astype(np.float32)
    out["depth_head.scratch.output_conv2.2.bias"][:] = np.float32(0.5)
    return out


def test_image(h: int = 64, w: int = 80, seed: int = SEED + 1) -> np.ndarray:
    """An RGB image with gradients and blobs."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), ((xx + yy) * 3) % 256], -1)
    img = img.astype(np.float64)
    for _ in range(6):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(4, 14)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)
