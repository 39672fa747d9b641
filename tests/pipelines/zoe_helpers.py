"""``ZoeD_M12_N.pt`` files from a fixed seed, written with numpy and pickle only (no torch).

The file is ZoeDepth N's checkpoint: ``{"model": state_dict}`` with BEiT's ``relative_position_index`` buffers and
timm's unused ``fc_norm`` and ``head`` and the log-binomial's
``k_idx``/``K_minus_1`` as the published file holds them. :func:`write_file` writes the full-size
one (BEiT-L/16-384, DPT features 256, 64 bins; 344.8 M values, 1.4 GB) or the narrow one: the same layout and
block count (24 blocks, hooks 5/11/17/23, a 24 x 24 pretraining grid, 64 bins, 16/8/4/1 attractors) at width 32 with
2 heads, reassemble widths 8/16/32/32, DPT features 16 and a bin embedding of 16, which the tests run because it
compiles in seconds. Weights are He-scaled normals, LayerScale ``gamma`` 0.3, norms near identity (in the
full-size file the fusion's residual units scaled by 0.2, so that its features stay near a trained network's).
``scripts/ref_zoe.py`` loads the same files with ``torch.load`` and runs controlnet_aux's ZoeDepth (the extension's
code) on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 20261205


def narrow():
    from sdrt.pipelines.zoedepth import Config

    return Config(32, 24, 2, 24, 64, (8, 16, 32, 32), 16, 8, 32, 64, 16, (16, 8, 4, 1), 256, 128, 128, 24)


def make_weights(tiny: bool = True, seed: int = SEED) -> dict[str, np.ndarray]:
    from sdrt.pipelines.zoedepth import PUBLISHED, expected_shapes, rel_pos_index

    cfg = narrow() if tiny else PUBLISHED
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith(("gamma_1", "gamma_2")):
            a = np.full(shape, 0.3)
        elif "norm" in name and name.endswith(".weight"):
            a = 1.0 + rng.standard_normal(shape) * 0.1
        elif name.endswith("relative_position_bias_table"):
            a = rng.standard_normal(shape) * 0.5
        elif name.endswith(("bias", "cls_token")) and len(shape) <= 3:
            a = rng.standard_normal(shape) * 0.05
        else:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
            if not tiny and ".resConfUnit" in name and name.endswith("conv2.weight"):
                a *= np.float32(0.2)  # the fusion's residual units small: its 256 channels otherwise grow the
                # features to hundreds, and the log-binomial head (temperature down to 0.0212) turns float32
                # rounding there into different bins
        out[name] = np.asarray(a, np.float32)
        if name.endswith("relative_position_bias_table"):
            out[name.replace("bias_table", "index")] = rel_pos_index(cfg.grid, cfg.grid)
    v = "core.core.pretrained.model."  # timm's unused pooled norm and classifier, as the file holds them
    out[v + "fc_norm.weight"], out[v + "fc_norm.bias"] = np.ones(cfg.embed, np.float32), np.zeros(cfg.embed, np.float32)
    out[v + "head.weight"] = np.zeros((1000, cfg.embed), np.float32)
    out[v + "head.bias"] = np.zeros(1000, np.float32)
    out["conditional_log_binomial.log_binomial_transform.k_idx"] = np.arange(cfg.bins, dtype=np.int64).reshape(
        1, -1, 1, 1)
    out["conditional_log_binomial.log_binomial_transform.K_minus_1"] = np.full((1, 1, 1, 1), cfg.bins - 1, np.float32)
    return out


def write_file(folder: Path, tiny: bool = True, name: str | None = None) -> Path:
    """``folder/ZoeD_M12_N.pt``: the narrow network, or the full-size one, under ``model``."""
    from openpose_helpers import write_pth

    from sdrt.pipelines.zoedepth import ZOE_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / (name or ZOE_FILE), make_weights(tiny), key="model")


def test_image(h: int = 90, w: int = 70) -> np.ndarray:
    """An RGB image with smooth shading and flat patches from the seed."""
    rng = np.random.default_rng(SEED + 1)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((3 * xx + yy) * 2) % 256], -1)
    img = img.astype(np.float64)
    for _ in range(6):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(5, 18)
        m = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        img[m] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)
