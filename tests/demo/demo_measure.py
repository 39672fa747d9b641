"""Simple measurements of a demo image: background colour, shape colour, the shape's grid cell (numpy only).

The background is the per-channel median of the whole image (a shape covers at most ~15% of it). Shape
pixels are those far from that background colour; their colour is the median of the half that is farthest
(anti-aliased edges are blends), and their centroid names the cell of the 3x3 grid. Each colour is the
nearest entry of the palette in RGB.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: RGB distance from the background above which a pixel belongs to the shape
FOREGROUND = 60.0
#: fewest shape pixels for an image to count as showing a shape (a small ring has ~90)
MIN_PIXELS = 20


def nearest(rgb: np.ndarray, palette: dict[str, list[int]]) -> str:
    names = list(palette)
    d = np.linalg.norm(np.array([palette[n] for n in names], np.float32) - rgb[None, :], axis=1)
    return names[int(np.argmin(d))]


def measure(image: np.ndarray, palette: dict[str, list[int]]) -> dict[str, Any]:
    """{'background', 'colour', 'cell': (col, row), 'pixels'} of an HxWx3 uint8 image; colour None if no shape."""
    img = image.astype(np.float32)
    h, w = img.shape[:2]
    bg = np.median(img.reshape(-1, 3), axis=0)
    dist = np.linalg.norm(img - bg, axis=2)
    fg = dist > FOREGROUND
    out: dict[str, Any] = {"background": nearest(bg, palette), "colour": None, "cell": None,
                           "pixels": int(fg.sum())}
    if fg.sum() < MIN_PIXELS:
        return out
    core = fg & (dist >= np.median(dist[fg]))
    out["colour"] = nearest(np.median(img[core], axis=0), palette)
    ys, xs = np.nonzero(fg)
    cx, cy = xs.mean() + 0.5, ys.mean() + 0.5
    out["cell"] = (min(2, int(cx * 3 / w)), min(2, int(cy * 3 / h)))
    return out


def check_image(image: np.ndarray, case: dict[str, str], heldout: dict[str, Any], position: bool = True) -> str:
    """'' when the image shows what the case's prompt asks, else what differs (the cell only if position)."""
    m = measure(image, heldout["palette"])
    want_cell = tuple(heldout["cells"][case["position"]])
    problems = []
    if m["background"] != case["background"]:
        problems.append(f"background {m['background']} (want {case['background']})")
    if m["colour"] is None:
        problems.append(f"no shape found ({m['pixels']} pixels differ from the background)")
    else:
        if m["colour"] != case["colour"]:
            problems.append(f"shape {m['colour']} (want {case['colour']})")
        if position and m["cell"] != want_cell:
            problems.append(f"cell {m['cell']} (want {want_cell})")
    return "; ".join(problems)
