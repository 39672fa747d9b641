"""Full-size lineart files from a fixed seed, written with numpy and pickle only (no torch).

``sk_model.pth`` / ``sk_model2.pth`` (informative-drawings' Generator) and ``netG.pth`` (the anime U-Net, its
tensors under ``module.`` as the published file has them) at their published names and shapes, He-scaled normals
(the generator's last conv scaled so the sigmoid's output spreads over its range). ``scripts/ref_lineart.py``
loads the same files with ``torch.load`` and runs controlnet_aux's networks with the extension's code around them.
"""

from __future__ import annotations

import numpy as np
from openpose_helpers import write_pth  # noqa: F401 - re-exported: torch.save's layout without torch

SEED = 20261202
#: sk_model2.pth's seed (lineart_coarse: the same network, another file)
COARSE_SEED = SEED + 5


def _he(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]], transposed: set[str]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        if name.endswith(".bias"):
            out[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        else:
            fan_in = (shape[0] if name in transposed else shape[1]) * shape[2] * shape[3]
            out[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return out


def make_generator(seed: int = SEED) -> dict[str, np.ndarray]:
    from sdrt.pipelines.lineartnets import generator_shapes

    rng = np.random.default_rng(seed)
    out = _he(rng, generator_shapes(), {"model3.0.weight", "model3.3.weight"})
    out["model4.1.weight"] *= np.float32(0.5)
    return out


def make_anime(seed: int = SEED + 1) -> dict[str, np.ndarray]:
    from sdrt.pipelines.lineartnets import anime_shapes

    rng = np.random.default_rng(seed)
    shapes = anime_shapes()
    ups = {n for n in shapes if n.endswith(("model.3.weight", "model.5.weight"))}
    return {"module." + k: v for k, v in _he(rng, shapes, ups).items()}


def test_image(h: int = 72, w: int = 100) -> np.ndarray:
    """An RGB image with gradients, blobs and a few hard lines."""
    rng = np.random.default_rng(SEED + 7)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // (w - 1), yy * 255 // (h - 1), ((xx + yy) * 3) % 256], -1).astype(np.float64)
    for _ in range(8):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(4, 14)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    img[h // 3, :] = 0
    img[:, w // 2] = 255
    return img.astype(np.uint8)


def make_manga(seed: int = SEED + 2, out_scale: float = 10.0) -> dict[str, np.ndarray]:
    """``erika.pth``: convs He-scaled, batch norms near identity with small random statistics; the first one
    standardises 0-255 grey levels and the last conv maps to around the middle of 0-255."""
    from sdrt.pipelines.lineartnets import manga_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in manga_shapes().items():
        kind = name.rsplit(".", 1)[1]
        if len(shape) == 4:
            fan_in = shape[1] * shape[2] * shape[3]
            out[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        elif kind == "running_var":
            out[name] = rng.uniform(0.8, 1.2, shape).astype(np.float32)
        elif kind == "weight":
            out[name] = rng.uniform(0.8, 1.2, shape).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    first = "block0.model.0.conv1.model.0"
    out[f"{first}.running_mean"][:] = 128.0
    out[f"{first}.running_var"][:] = 5000.0
    for name in out:  # residual branches and shortcuts damped, so that 45 blocks of sums stay near unit scale
        if name.endswith("residual.model.2.weight"):
            out[name] *= np.float32(0.3)
        elif name.endswith("shortcut.model.0.weight"):
            out[name] *= np.float32(0.7)
    out["block0.model.0.shortcut.model.0.weight"] *= np.float32(1.0 / 70.0)
    out["conv15.model.2.weight"] *= np.float32(out_scale)
    out["conv15.model.2.bias"][:] = 128.0
    return out
