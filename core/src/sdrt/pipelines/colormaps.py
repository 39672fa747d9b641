"""sd-webui-controlnet's colour preprocessors, in numpy: the T2I-Adapter colour grid and the recolor maps.

- ``color_grid(image, resolution)``: "t2ia_color_grid" (module ``color``): the image's shorter side scaled to
  ``resolution`` by area averaging (``round`` of the longer side), shrunk with bicubic taps to one pixel per
  64x64 cell (sides ``// 64``), and blown back up with nearest neighbours: a grid of flat colour blocks.
- ``recolor_luminance(image, gamma)``: the L of OpenCV's 8-bit CIE Lab conversion (fixed point: sRGB
  gamma table in 3 fractional bits, Y in 12, the cube-root table in 15), raised to ``gamma``, as grey RGB. The
  extension hands its RGB image to OpenCV's ``COLOR_BGR2LAB``, so red is weighted as blue and blue as red
  (Y = 0.0722 R + 0.7152 G + 0.2126 B); sdrt does the same, since the recolor ControlNets were trained on it.
- ``recolor_intensity(image, gamma)``: HSV's V (the largest channel), raised to ``gamma``, as grey RGB.

Both recolor maps compute ``(v / 255) ** gamma * 255`` in float32 and truncate, as the extension does.
"""

from __future__ import annotations

import functools

import numpy as np

from .controlmaps import ControlImageError, checked_rgb, finite_number
from .cvresize import resample

__all__ = ["color_grid", "recolor_intensity", "recolor_luminance"]

#: CIE Y of linear sRGB (OpenCV's sRGB2XYZ_D65 row), in OpenCV's 12-bit fixed point
_Y = (0.212671, 0.715160, 0.072169)


@functools.lru_cache(maxsize=1)
def _lab_tables() -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    x = np.arange(256, dtype=np.float64) / 255.0
    lin = np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)
    gamma = np.rint(255.0 * 8 * lin).astype(np.int64)  # sRGBGammaTab_b: gamma_shift 3
    t = np.arange(256 * 3 // 2 * 8, dtype=np.float64) / (255.0 * 8)
    cbrt = np.rint((1 << 15) * np.where(t < 0.008856, t * 7.787 + 0.13793103448275862, np.cbrt(t))).astype(np.int64)
    r, g, b = (int(np.rint(c * 4096)) for c in _Y)
    return gamma, cbrt, (b, g, r)  # BGR2LAB on an RGB image: channel 0 gets blue's weight


def _lab_lightness(rgb: np.ndarray) -> np.ndarray:
    """OpenCV's 8-bit ``cvtColor(rgb, COLOR_BGR2LAB)[:, :, 0]`` (L scaled to 0..255)."""
    gamma, cbrt, (c0, c1, c2) = _lab_tables()
    lin = gamma[rgb]
    y = (lin[:, :, 0] * c0 + lin[:, :, 1] * c1 + lin[:, :, 2] * c2 + (1 << 11)) >> 12
    fy = cbrt[y]
    lscale = (116 * 255 + 50) // 100
    lshift = -((16 * 255 * (1 << 15) + 50) // 100)
    return np.clip((lscale * fy + lshift + (1 << 14)) >> 15, 0, 255).astype(np.uint8)


#: the largest recolor gamma taken: the extension's is a plain power of any value (webuiapi's controlnet_detect
#: sends 64 to every module), its slider going to 2; above this every grey level but 255 is 0 already
MAX_GAMMA = 256


def _gamma(value: float, where: str) -> float:
    if not finite_number(value) or not 0 <= value <= MAX_GAMMA:
        raise ControlImageError(f"gamma {value!r} is not a number from 0 to {MAX_GAMMA}", where=where,
                                fix="pass a gamma correction such as 1.0 (the extension's slider: 0.1 to 2)")
    return float(value)


def _curve(v: np.ndarray, gamma: float) -> np.ndarray:
    x = v.astype(np.float32) / np.float32(255.0)
    y = (x ** np.float32(gamma) * np.float32(255.0)).clip(0, 255).astype(np.uint8)
    return np.repeat(y[:, :, None], 3, axis=2)


def recolor_luminance(image: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """The extension's ``recolor_luminance``: Lab lightness to the power ``gamma``, ``(H, W, 3)`` grey."""
    where = "sdrt.pipelines.colormaps.recolor_luminance"
    g = _gamma(gamma, where)
    return _curve(_lab_lightness(checked_rgb(image, where)), g)


def recolor_intensity(image: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """The extension's ``recolor_intensity``: HSV value (max of R, G, B) to the power ``gamma``, grey RGB."""
    where = "sdrt.pipelines.colormaps.recolor_intensity"
    g = _gamma(gamma, where)
    return _curve(checked_rgb(image, where).max(axis=2), g)


def color_grid(image: np.ndarray, resolution: int | None = None) -> np.ndarray:
    """The extension's ``color`` (t2ia_color_grid) at ``resolution`` (the shorter side; None: the image's own)."""
    where = "sdrt.pipelines.colormaps.color_grid"
    a = checked_rgb(image, where)
    h, w = a.shape[:2]
    size = min(h, w) if resolution is None else int(resolution)
    if size < 64:
        err = ControlImageError(f"the colour grid of a {w}x{h} image at {size} pixels has no 64-pixel cell",
                                where=where, fix="pass a processor resolution of 64 or more (the extension's "
                                                 "default is 512)")
        if resolution is not None:  # the unit's resolution was wrong, not its image: a unit's error names it
            err.threshold = "processor_res"  # type: ignore[attr-defined]
        raise err
    from .controlmaps import scaled_side

    try:
        scaled_side(h, w, size / min(h, w), where, f"the control image at processor resolution {size}",
                    "crop the control image to nearer a square, or pass a smaller processor resolution")
    except ControlImageError as exc:
        exc.threshold = "processor_res"  # type: ignore[attr-defined]
        raise
    if h < w:
        nh, nw = size, int(round(w / h * size))
    else:
        nh, nw = int(round(h / w * size)), size
    if (nh, nw) != (h, w):
        a = resample(a, nw, nh, "area")  # the extension's INTER_AREA, enlarging too
    cells = resample(a, nw // 64, nh // 64, "cubic")
    return resample(cells, nw, nh, "nearest")
