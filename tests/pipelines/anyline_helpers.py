"""A full-size ``MTEED.pth`` (TEED's names and shapes, MistoLine's Anyline file name) from a fixed seed, written
with numpy and pickle only; the photo-like test images the Anyline references are made of.

``scripts/ref_anyline.py`` loads the same file with ``torch.load`` and runs the extension's Anyline steps on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from openpose_helpers import write_pth
from softedge_helpers import teed_weights

MTEED_SEED = 20261211


def write_mteed(folder: Path) -> Path:
    from sdrt.pipelines.anylinemaps import MTEED_FILE

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / MTEED_FILE, teed_weights(MTEED_SEED))


def line_image(h: int = 100, w: int = 72, seed: int = 7, slope: float = 8.0) -> np.ndarray:
    """A grey page shaded by a gentle gradient (``slope`` levels across it) with dark strokes of several strengths
    and widths and specks: lineart_standard's level 1 falls along the page's quantisation bands (long runs, kept)
    and on specks and stroke rims (short ones, removed)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    page = 215 + slope * (xx / w + 0.6 * yy / h) + 1.5 * np.sin(xx / 23.0 + yy / 31.0)
    img = np.repeat(page[..., None], 3, -1) + np.array([4.0, 2.0, 0.0])
    for _ in range(9):  # strokes: lines of a random direction, darkness and width
        x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
        t = rng.uniform(0, np.pi)
        d = np.abs((xx - x0) * np.sin(t) - (yy - y0) * np.cos(t))
        along = np.abs((xx - x0) * np.cos(t) + (yy - y0) * np.sin(t))
        on = (d < rng.uniform(0.6, 2.0)) & (along < rng.uniform(10, 40))
        img[on] -= rng.uniform(20, 120) * np.array([1.0, 0.9, 1.1])
    for _ in range(25):  # specks of a few pixels
        y, x = int(rng.integers(0, h - 3)), int(rng.integers(0, w - 3))
        img[y:y + int(rng.integers(1, 3)), x:x + int(rng.integers(1, 4))] -= rng.uniform(3, 40)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)
