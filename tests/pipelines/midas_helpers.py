"""Seeded DPT-Hybrid weights for the ``depth_midas`` / ``normal_midas`` tests, written with numpy and pickle only.

``SMALL`` is the network at reduced widths (ResNet stem 32, stages of 1, 1 and 2 blocks at 128/256/512 channels,
ViT width 128 with 12 blocks, DPT features 64, a 6x6 position grid): the same tensor names and code paths as the
published file, small enough to run in seconds on every backend. ``make_weights()`` with no sizes is the published
file's layout (``tests/data/midas/layout.json``, written by scripts/ref_midas.py from controlnet_aux's own
``DPTDepthModel``), every tensor filled. ``scripts/ref_midas.py`` loads the same files with ``torch.load`` into
controlnet_aux's model class.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SEED = 20261202
SMALL = dict(embed=128, depth=12, stem=32, channels=(128, 256, 512), layers=(1, 1, 2), features=64, grid=6, mlp=256)
DATA = Path(__file__).resolve().parents[1] / "data" / "midas"


def full_layout() -> dict[str, tuple[int, ...]]:
    """Every tensor of controlnet_aux's / the extension's ``DPTDepthModel(backbone="vitb_rn50_384")`` state dict."""
    return {k: tuple(v) for k, v in json.loads((DATA / "layout.json").read_text())["tensors"].items()}


def make_weights(size: dict | None = None, seed: int = SEED) -> dict[str, np.ndarray]:
    """Seeded weights: ``size`` (e.g. ``SMALL``) builds sdrt's expected layout at those sizes; None, the published
    file's full layout (timm's unused head and norm included)."""
    from sdrt.pipelines.midasdepth import expected_shapes

    shapes = expected_shapes(**size) if size is not None else full_layout()
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        if name.endswith("cls_token") or name.endswith("pos_embed"):
            a = rng.standard_normal(n) * 0.5
        elif len(shape) == 1 and ("norm" in name and "conv" not in name):
            a = (1.0 + 0.2 * rng.standard_normal(n)) if name.endswith("weight") else 0.1 * rng.standard_normal(n)
        elif len(shape) == 1:
            a = 0.05 * rng.standard_normal(n)
        else:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(n) * np.sqrt(1.0 / fan_in)
        out[name] = a.astype(np.float32).reshape(shape)
    out["scratch.output_conv.4.bias"][:] = np.float32(0.3)
    out["scratch.output_conv.4.weight"] *= np.float32(3.0)
    return out


def sample_image(h: int = 96, w: int = 64) -> np.ndarray:
    """An RGB image with gradients and blobs from the seed."""
    rng = np.random.default_rng(SEED + 1)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((xx + yy) * 3) % 256], -1)
    img = img.astype(np.float64)
    for _ in range(8):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(4, 14)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)
