"""sd-webui-controlnet's ``shuffle`` (the Content Shuffle ControlNet's map) in numpy, seeded.

The map is the image warped by a smooth random flow: two "noise disks" (a grid of uniform noise, one value per
256 pixels plus a margin, enlarged with OpenCV's bicubic resize, cropped, stretched to 0..1) give each output
pixel the x and y it reads, and the image is sampled there bilinearly (``cv2.remap``, ``INTER_LINEAR``).

Randomness: the extension draws the noise from numpy's global legacy generator, which it seeds before every
preprocessor with ``(seed + subseed) & 0xFFFFFFFF`` of the A1111 run (``set_numpy_seed``; a run without a
variation seed has subseed -1, which A1111 reads as the seed itself). sdrt draws from
``numpy.random.RandomState(seed)`` with the seed passed in, the same Mersenne Twister stream, so the same
numpy seed gives the extension's map; the pipeline passes that run-derived seed (:func:`numpy_seed`).

Arithmetic as OpenCV 5's: the resize's cubic weights in float32, its sums in double; the remap bilinear in
float32 at the exact coordinates. OpenCV 4.x quantises the remap's coordinates to 1/32 pixel with 15-bit
fixed-point weights instead: against OpenCV 4.10 the map is up to 5 levels apart on 10 % of values.
"""

from __future__ import annotations

import numpy as np

from .controlmaps import checked_rgb

__all__ = ["content_shuffle", "noise_disk", "numpy_seed"]

#: the extension's noise cell: one random value per 256 pixels
CELL = 256


def numpy_seed(seed: int, subseed: int | None = None) -> int:
    """The extension's ``set_numpy_seed``: ``(seed + subseed) & 0xFFFFFFFF``, the subseed being the seed when
    the run has none (A1111's -1)."""
    return (int(seed) + int(seed if subseed is None or subseed == -1 else subseed)) & 0xFFFFFFFF


def _cubic_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's bicubic taps along one axis: positions and weights in float32, indices clamped to the edge."""
    scale = 1.0 / (dst / src)
    fx = ((np.arange(dst) + 0.5) * scale - 0.5).astype(np.float32)
    sx = np.floor(fx).astype(np.int64)
    t = (fx - sx.astype(np.float32)).astype(np.float32)
    a = np.float32(-0.75)
    one = np.float32(1.0)
    w0 = ((a * (t + one) - np.float32(5) * a) * (t + one) + np.float32(8) * a) * (t + one) - np.float32(4) * a
    w1 = ((a + np.float32(2)) * t - (a + np.float32(3))) * t * t + one
    u = one - t
    w2 = ((a + np.float32(2)) * u - (a + np.float32(3))) * u * u + one
    w3 = one - w0 - w1 - w2
    idx = np.clip(sx[:, None] + np.arange(-1, 3)[None, :], 0, src - 1)
    return idx, np.stack([w0, w1, w2, w3], axis=1).astype(np.float32)


def _cubic_resize(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(a, (width, height), interpolation=cv2.INTER_CUBIC)`` of a float64 ``(H, W)`` array."""
    ix, wx = _cubic_axis(a.shape[1], width)
    rows = sum(a[:, ix[:, k]] * wx[:, k].astype(np.float64)[None, :] for k in range(4))
    iy, wy = _cubic_axis(a.shape[0], height)
    return sum(rows[iy[:, k], :] * wy[:, k].astype(np.float64)[:, None] for k in range(4))


def noise_disk(height: int, width: int, rng: np.random.RandomState, cell: int = CELL) -> np.ndarray:
    """The extension's ``make_noise_disk(H, W, 1, F)``: smooth noise in [0, 1], ``(height, width)`` float64."""
    noise = rng.uniform(low=0, high=1, size=(height // cell + 2, width // cell + 2))
    noise = _cubic_resize(noise, width + 2 * cell, height + 2 * cell)[cell:cell + height, cell:cell + width]
    noise = noise - noise.min()
    peak = noise.max()
    return noise / peak if peak > 0 else noise  # one pixel: the extension's 0 / 0 (NaN) read as no shift


def _remap_linear(img: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``cv2.remap(img, map_xy_float32, None, cv2.INTER_LINEAR)`` (constant 0 border) of a uint8 HxWxC image, as
    OpenCV 5 computes it: bilinear weights from the float32 coordinates, the sum in float32, rounded."""
    h, w = img.shape[:2]
    x = x.astype(np.float32)
    y = y.astype(np.float32)
    x0 = np.floor(x).astype(np.int64)
    y0 = np.floor(y).astype(np.int64)
    fx = (x - x0.astype(np.float32))[..., None]
    fy = (y - y0.astype(np.float32))[..., None]
    one = np.float32(1.0)

    def at(yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
        inside = ((yy >= 0) & (yy < h) & (xx >= 0) & (xx < w))[..., None]
        return img[np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)].astype(np.float32) * inside

    out = (at(y0, x0) * (one - fx) * (one - fy) + at(y0, x0 + 1) * fx * (one - fy)
           + at(y0 + 1, x0) * (one - fx) * fy + at(y0 + 1, x0 + 1) * fx * fy)
    return np.rint(out).clip(0, 255).astype(np.uint8)


def content_shuffle(image: np.ndarray, seed: int) -> np.ndarray:
    """The extension's ``shuffle`` of an image (already at its processor resolution): ``(H, W, 3)`` uint8, the
    noise drawn from ``numpy.random.RandomState(seed)`` (x's disk first, then y's)."""
    a = checked_rgb(image, "sdrt.pipelines.shufflemap.content_shuffle")
    h, w = a.shape[:2]
    rng = np.random.RandomState(int(seed) & 0xFFFFFFFF)
    x = noise_disk(h, w, rng) * float(w - 1)
    y = noise_disk(h, w, rng) * float(h - 1)
    return _remap_linear(a, x, y)
