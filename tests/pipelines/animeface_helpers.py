"""``UNet.pth`` files from a fixed seed, written with numpy and pickle only (no torch): the anime face
segmentation UNet's state dict at its published size (MobileNetV2's features[0..16] and the decoder: 2.0 M values,
small enough for every test), BatchNorms with ``num_batches_tracked``. He-scaled normals, norms near identity, each
inverted residual's projection scaled by 0.3. ``scripts/ref_anime_face.py`` loads the same file with ``torch.load``
and runs the extension's UNet on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 20261211


def make_weights(seed: int = SEED, prefix: str = "") -> dict[str, np.ndarray]:
    from sdrt.pipelines.animeface import expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes().items():
        if name.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("running_mean"):
            a = rng.standard_normal(shape) * 0.1
        elif len(shape) == 1 and name.endswith(".weight"):
            a = 1.0 + rng.standard_normal(shape) * 0.1
        elif name.endswith(".bias"):
            a = rng.standard_normal(shape) * 0.05
        else:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        out[prefix + name] = np.asarray(a, np.float32)
        if name.endswith("running_var"):
            out[prefix + name[: -len("running_var")] + "num_batches_tracked"] = np.array(0, np.int64)
    return out


def write_file(folder: Path, prefix: str = "") -> Path:
    """``folder/UNet.pth`` (``prefix``: "module." as a DataParallel save names them)."""
    from openpose_helpers import write_pth

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / "UNet.pth", make_weights(prefix=prefix))


def test_image(h: int = 60, w: int = 44) -> np.ndarray:
    rng = np.random.default_rng(SEED + 1)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((3 * xx + yy) * 2) % 256], -1)
    img = img.astype(np.float64)
    for _ in range(5):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(5, 16)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)
