"""LaMa generator files from a fixed seed, written with numpy and pickle only (no torch).

``ControlNetLama.pth``'s tensor names (LaMa's ``FFCResNetGenerator``: ``model.<i>...``, batch norms with their
running statistics and ``num_batches_tracked``) for a small generator (ngf 8, 2 FFC blocks: the published file has
ngf 64 and 18, the same names otherwise); He-scaled convs, batch norms near identity, the last conv scaled so the
sigmoid's output spreads over its range. ``scripts/ref_lama.py`` loads the same arrays into the extension's
``FFCResNetGenerator`` and runs the extension's code around it.
"""

from __future__ import annotations

import numpy as np
from openpose_helpers import write_pth  # noqa: F401 - re-exported: torch.save's layout without torch

SEED = 20261203
NGF, BLOCKS = 8, 2


def make_lama(ngf: int = NGF, blocks: int = BLOCKS, seed: int = SEED) -> dict[str, np.ndarray]:
    from sdrt.pipelines.lamafill import expected_shapes

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    shapes = expected_shapes(ngf, blocks)
    last = max(n for n in shapes if n.endswith(".weight") and len(shapes[n]) == 4 and shapes[n][0] == 3)
    for name, shape in shapes.items():
        kind = name.rsplit(".", 1)[1]
        if len(shape) == 4:
            transposed = shape[1] == shape[0] // 2 and name not in (last,) and ".ffc." not in name
            fan_in = (shape[0] if transposed else shape[1]) * shape[2] * shape[3]
            out[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        elif kind in ("running_var", "weight"):
            out[name] = rng.uniform(0.8, 1.2, shape).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    out[last] *= np.float32(0.5)
    for name in [n for n in shapes if n.endswith(".running_var")]:
        out[name.replace("running_var", "num_batches_tracked")] = np.array(1000, np.int64)
    return dict(sorted(out.items()))


def lama_rgba(h: int = 72, w: int = 100) -> np.ndarray:
    """An RGB picture with gradients and blobs, and a mask (white = repaint) of a soft-edged box and a stroke."""
    rng = np.random.default_rng(SEED + 7)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // (w - 1), yy * 255 // (h - 1), ((xx + yy) * 3) % 256], -1).astype(np.float64)
    for _ in range(6):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(4, 12)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    mask = np.zeros((h, w), np.float64)
    mask[h // 4:h // 2 + 6, w // 3:w // 3 + 30] = 255
    mask[:, w - 12:w - 9] = 200
    mask[h - 10:, :20] = 90  # below 0.5: not repainted by the net, blended by a / 255
    return np.concatenate([img, mask[:, :, None]], axis=2).astype(np.uint8)
