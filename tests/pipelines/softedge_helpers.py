"""Full-size ``ControlNetHED.pth``, ``table5_pidinet.pth`` and TEED's ``7_model.pth`` from fixed seeds, written with numpy and pickle only.

The weights are He-scaled normals at the published names and shapes (PiDiNet's saved unconverted, under
``{"state_dict": {"module.<name>": ...}}`` as its training script saves it), scaled so the random networks draw
edges of every strength rather than a flat grey: HED's ``norm`` is a mid grey and its projections are scaled so
their mean spans the sigmoid; PiDiNet's classifier is scaled likewise. ``scripts/ref_softedge.py`` loads the same
files with ``torch.load`` and runs the extension's HED and PiDiNet on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from openpose_helpers import write_pth

HED_SEED, PIDI_SEED, TEED_SEED = 20261202, 20261203, 20261204


def _he(rng: np.random.Generator, shape: tuple[int, ...], gain: float = 1.0) -> np.ndarray:
    fan_in = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) * gain * np.sqrt(2.0 / fan_in)).astype(np.float32)


def hed_weights(seed: int = HED_SEED) -> dict[str, np.ndarray]:
    from sdrt.pipelines.hedmaps import expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes().items():
        if name == "norm":
            out[name] = np.array([118.0, 112.0, 104.0], np.float32).reshape(shape)
        elif "projection.bias" in name:
            out[name] = np.full(shape, -3.5, np.float32)  # mostly dark, as a photo's edge map is
        elif name.endswith(".bias"):
            out[name] = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        elif name == "block1.convs.0.weight":
            out[name] = _he(rng, shape, 1.0 / 64.0)  # the input is 0..255 minus the grey
        elif "projection" in name:
            out[name] = _he(rng, shape, 5.0)
        else:
            out[name] = _he(rng, shape)
    return out


def pidi_weights(seed: int = PIDI_SEED) -> dict[str, np.ndarray]:
    """By the file's names (``module.`` prefixed)."""
    from sdrt.pipelines.pidimaps import expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes().items():
        if name == "classifier.bias":
            out[name] = np.full(shape, 1.0, np.float32)
        elif name.endswith(".bias"):
            out[name] = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        elif name == "classifier.weight":
            out[name] = (1.5 + rng.standard_normal(shape) * 0.3).astype(np.float32)
        elif name.startswith("block") and name.endswith("conv2.weight"):
            out[name] = _he(rng, shape, 0.35)  # the residual stream grows slowly, as a trained one does
        else:
            out[name] = _he(rng, shape)
    return {f"module.{k}": v for k, v in out.items()}


def teed_weights(seed: int = TEED_SEED) -> dict[str, np.ndarray]:
    from sdrt.pipelines.teedmaps import expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes().items():
        if name.endswith(".bias"):
            out[name] = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        elif name == "block_1.conv1.weight":
            out[name] = _he(rng, shape, 1.0 / 20.0)  # the input is 0..255
        elif name in ("up_block_1.features.2.weight", "up_block_2.features.2.weight", "up_block_3.features.5.weight",
                      "block_cat.DWconv2.weight"):
            out[name] = _he(rng, shape, 12.0)  # the outputs span the sigmoid
        else:
            out[name] = _he(rng, shape)
    return out


def write_teed(folder: Path) -> Path:
    from sdrt.pipelines.teedmaps import TEED_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / TEED_FILE, teed_weights())


def write_hed(folder: Path) -> Path:
    from sdrt.pipelines.hedmaps import HED_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / HED_FILE, hed_weights())


def write_pidi(folder: Path) -> Path:
    from sdrt.pipelines.pidimaps import PIDI_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / PIDI_FILE, pidi_weights(), key="state_dict")


def test_image(h: int = 100, w: int = 72, seed: int = 5) -> np.ndarray:
    """An RGB image with edges of every kind: gradients, discs and bars of random colours, a little noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([xx * 200 / w + 20, yy * 180 / h + 40, 128 + 60 * np.sin(xx / 6.0 + yy / 9.0)], -1)
    for _ in range(7):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(5, 16)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    for _ in range(3):
        y0, x0 = int(rng.integers(0, h - 8)), int(rng.integers(0, w - 20))
        img[y0:y0 + 3, x0:x0 + 20] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)
