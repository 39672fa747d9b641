"""The binary half of sd-webui-controlnet's ``high_quality_resize``, in numpy: how a resized black/white control map
(canny, scribble, threshold, a user's own edge map) is made black and white again, its one-pixel edges kept one
pixel wide.

- ``one_pixel_edges(x)``: the extension's test, on the map before its resize: a 3x3 opening (OpenCV's ``erode`` then
  ``dilate``, the image's outside ignored) removes more than half of the map's white values;
- ``otsu(gray)``: OpenCV's Otsu level (``THRESH_OTSU``: its histogram walk in doubles, bins with either class
  under ``FLT_EPSILON`` skipped, the first best level kept); white where a value is above it;
- ``nake_nms(gray)``: a value is kept where it is the largest along one of the four lines through it (OpenCV's
  ``dilate`` with a 1x3, 3x1 or diagonal kernel, the outside ignored), else 0;
- ``lvmin_thin(binary, prunings)``: Lvmin Zhang's thinning: up to 32 rounds of eight hit-or-miss patterns (OpenCV's
  ``MORPH_HITMISS``, each pattern removing its hits from the map the next one reads, the outside counted as both
  white and black), then one round of the eight pruning patterns when the map was enlarged;
- ``binarize(resized, one_pixel, enlarged)``: the channels' mean truncated to uint8, then ``nake_nms``, Otsu and the
  thinning for a map of one-pixel edges, or Otsu alone; ``(H, W, 3)`` of 0 and 255.

All integer or double arithmetic in the order the extension and OpenCV 5.0 do it: exact (tests/pipelines/
test_controlnet_fidelity.py against scripts/gen_cn_fidelity_refs.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["binarize", "lvmin_thin", "nake_nms", "one_pixel_edges", "otsu"]

_FLT_EPSILON = float(np.finfo(np.float32).eps)


def _shifted(p: np.ndarray, dy: int, dx: int, h: int, w: int) -> np.ndarray:
    """The window of a 1-pixel padded ``p`` shifted by ``(dy, dx)`` (each -1, 0 or 1)."""
    return p[1 + dy:1 + dy + h, 1 + dx:1 + dx + w]


def _morph(x: np.ndarray, offsets: list[tuple[int, int]], erode: bool) -> np.ndarray:
    """OpenCV's ``erode`` (min) or ``dilate`` (max) over ``offsets`` with its default border: the outside ignored."""
    h, w = x.shape[:2]
    pad = ((1, 1), (1, 1)) + ((0, 0),) * (x.ndim - 2)
    p = np.pad(x, pad, constant_values=255 if erode else 0)  # uint8: 255 never lowers a min, 0 never raises a max
    out = None
    for dy, dx in offsets:
        s = _shifted(p, dy, dx, h, w)
        out = s if out is None else (np.minimum(out, s) if erode else np.maximum(out, s))
    assert out is not None
    return out


_SQUARE = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]


def one_pixel_edges(x: np.ndarray) -> bool:
    """Whether a black/white uint8 map is of one-pixel edges: its 3x3 opening lowers more than half as many values
    as it has above 127 (counted over every channel, as the extension counts them)."""
    opened = _morph(_morph(x, _SQUARE, erode=True), _SQUARE, erode=False)
    return int(np.count_nonzero(opened < x)) * 2 > int(np.count_nonzero(x > 127))


def otsu(gray: np.ndarray) -> int:
    """OpenCV's Otsu level of a uint8 image (``cv2.threshold(..., THRESH_OTSU)``'s returned threshold)."""
    hist = np.bincount(gray.reshape(-1), minlength=256)
    scale = 1.0 / gray.size
    mu = 0.0
    for i in range(256):
        mu += i * float(hist[i])
    mu *= scale
    mu1 = q1 = 0.0
    max_sigma = 0.0
    max_val = 0
    for i in range(256):
        p_i = float(hist[i]) * scale
        mu1 *= q1
        q1 += p_i
        q2 = 1.0 - q1
        if min(q1, q2) < _FLT_EPSILON or max(q1, q2) > 1.0 - _FLT_EPSILON:
            continue
        mu1 = (mu1 + i * p_i) / q1
        mu2 = (mu - q1 * mu1) / q2
        sigma = q1 * q2 * (mu1 - mu2) * (mu1 - mu2)
        if sigma > max_sigma:
            max_sigma, max_val = sigma, i
    return max_val


_LINES = ([(0, -1), (0, 0), (0, 1)], [(-1, 0), (0, 0), (1, 0)], [(-1, -1), (0, 0), (1, 1)], [(-1, 1), (0, 0), (1, -1)])


def nake_nms(gray: np.ndarray) -> np.ndarray:
    """The extension's ``nake_nms``: each value where it is the largest of its line in one of four directions."""
    y = np.zeros_like(gray)
    for line in _LINES:
        keep = _morph(gray, line, erode=False) == gray
        y[keep] = gray[keep]
    return y


def _rotations(raw: list[list[list[int]]]) -> list[np.ndarray]:
    base = [np.array(k, np.int32) for k in raw]
    return [np.rot90(k, r) for r in range(4) for k in base]


#: the thinning's patterns (1 white, -1 black, 0 either) and the pruning's, each in its four rotations, in the
#: extension's order: both of the first rotation, then both of the next, ...
_THIN = _rotations([[[-1, -1, -1], [0, 1, 0], [1, 1, 1]], [[0, -1, -1], [1, 1, -1], [0, 1, 0]]])
_PRUNE = _rotations([[[-1, -1, -1], [-1, 1, -1], [0, 0, -1]], [[-1, -1, -1], [-1, 1, -1], [-1, 0, 0]]])


def _hits(white: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """OpenCV's hit-or-miss on a 0/255 map (as booleans): white under every 1 and black under every -1, the outside
    (its erosions' default border) counting as either."""
    h, w = white.shape
    pw = np.pad(white, 1, constant_values=True)
    pb = np.pad(~white, 1, constant_values=True)
    out = np.ones((h, w), bool)
    for i in range(3):
        for j in range(3):
            if kernel[i, j] == 1:
                out &= _shifted(pw, i - 1, j - 1, h, w)
            elif kernel[i, j] == -1:
                out &= _shifted(pb, i - 1, j - 1, h, w)
    return out


def _thin_once(white: np.ndarray, kernels: list[np.ndarray]) -> bool:
    """One round: each pattern's hits turned black before the next pattern looks; whether any was."""
    changed = False
    for k in kernels:
        hit = _hits(white, k)
        if hit.any():
            white &= ~hit
            changed = True
    return changed


def lvmin_thin(binary: np.ndarray, prunings: bool = True) -> np.ndarray:
    """The extension's ``lvmin_thin`` of a 0/255 uint8 map: thinned until a round changes nothing (at most 32),
    then pruned once (``prunings``)."""
    white = binary > 127
    for _ in range(32):
        if not _thin_once(white, _THIN):
            break
    if prunings:
        _thin_once(white, _PRUNE)
    return np.where(white, binary, np.uint8(0)).astype(np.uint8)


def binarize(resized: np.ndarray, one_pixel: bool, enlarged: bool) -> np.ndarray:
    """A black/white map after its resize made black and white again, as ``high_quality_resize`` does: the mean of
    its channels (float32, truncated to uint8), then for one-pixel edges ``nake_nms``, Otsu and ``lvmin_thin``
    (pruned when the map was ``enlarged``), else Otsu alone; ``(H, W, 3)`` uint8."""
    gray = np.mean(resized.astype(np.float32), axis=2).clip(0, 255).astype(np.uint8)
    if one_pixel:
        gray = nake_nms(gray)
    y = np.where(gray > otsu(gray), np.uint8(255), np.uint8(0)).astype(np.uint8)
    if one_pixel:
        y = lvmin_thin(y, prunings=enlarged)
    return np.repeat(y[:, :, None], 3, axis=2)
