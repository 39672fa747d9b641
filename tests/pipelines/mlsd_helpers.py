"""A full-size ``mlsd_large_512_fp32.pth`` from a fixed seed, written with numpy and pickle only (no torch).

The tensors are those of M-LSD's ``MobileV2_MLSD_Large`` state dict (BatchNorms with ``num_batches_tracked``, as
``torch.save`` writes them): He-scaled normals, BatchNorms near identity, and the head's last layer steered so that
the random network finds lines: the centre channel (7) scaled to logits of about -1.5 +- 1.3 (no sigmoid saturates
to 1, where equal scores would leave torch's top-k order to chance) and the displacements (8-11) to a few pixels.
``scripts/ref_mlsd.py`` loads the same file with ``torch.load`` and runs the extension's M-LSD on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 20261202


def make_weights(seed: int = SEED) -> dict[str, np.ndarray]:
    from sdrt.pipelines.mlsdmaps import expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes().items():
        if name.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("running_mean"):
            a = rng.standard_normal(shape) * 0.1
        elif len(shape) == 1 and name.endswith(".weight"):  # a BatchNorm's scale
            a = 1.0 + rng.standard_normal(shape) * 0.1
        elif name.endswith(".bias"):
            a = rng.standard_normal(shape) * 0.05
        else:
            fan_in = shape[1] * shape[2] * shape[3]
            a = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        out[name] = a.astype(np.float32)
        if name.endswith("running_var"):  # torch.save's order: weight, bias, running_mean, running_var, count
            out[name[: -len("running_var")] + "num_batches_tracked"] = np.array(0, np.int64)
    w, b = out["block23.conv3.weight"], out["block23.conv3.bias"]
    w[7] *= np.float32(0.2)
    b[7] = np.float32(-1.0)
    w[8:12] *= np.float32(0.6)
    return out


def write_file(folder: Path) -> Path:
    from openpose_helpers import write_pth

    from sdrt.pipelines.mlsdmaps import MLSD_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / MLSD_FILE, make_weights())


def test_image(h: int = 100, w: int = 76) -> np.ndarray:
    """An RGB image with straight edges (rectangles and bars over a gradient) from the seed."""
    rng = np.random.default_rng(SEED + 1)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((xx + 2 * yy) * 3) % 256], -1)
    img = img.astype(np.float64)
    for _ in range(8):
        y0, x0 = rng.integers(0, h - 4), rng.integers(0, w - 4)
        y1, x1 = rng.integers(y0 + 3, h), rng.integers(x0 + 3, w)
        img[y0:y1, x0:x1] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)
