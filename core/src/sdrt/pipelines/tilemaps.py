"""sd-webui-controlnet's maps for the Tile ControlNet, in numpy: ``tile_resample`` and ``blur_gaussian``.

- ``tile_resample(image, rate)``: the image shrunk by its "Down Sampling Rate" (sides ``int(side / rate)``,
  OpenCV's ``INTER_AREA``, :mod:`sdrt.pipelines.cvresize`), or the image as it is for a rate below 1.1; it is
  then resized to the output as any control map is, so a rate of 2 to 8 softens detail the Tile ControlNet
  then re-invents;
- ``blur_gaussian(image, sigma)``: ``cv2.GaussianBlur(image, (0, 0), sigma)`` of the 8-bit image, bit-exact
  (:mod:`sdrt.pipelines.gaussian`), the caller having scaled it to the processor resolution without padding.
"""

from __future__ import annotations

import numpy as np

from .controlmaps import ControlImageError, checked_number, checked_rgb
from .cvresize import resample
from .gaussian import gaussian_blur

__all__ = ["blur_gaussian", "tile_resample"]


def tile_resample(image: np.ndarray, rate: float = 1.0) -> np.ndarray:
    """The extension's ``tile_resample``: ``(int(H / rate), int(W / rate), 3)`` by area averaging; as is below 1.1."""
    where = "sdrt.pipelines.tilemaps.tile_resample"
    a = checked_rgb(image, where)
    r = checked_number(rate, "down sampling rate", where, "pass a rate such as 2 (the extension's slider: 1 to 8)")
    if r < 1.1:
        return a
    h, w = int(a.shape[0] / r), int(a.shape[1] / r)
    if h < 1 or w < 1:
        err = ControlImageError(f"a down sampling rate of {r:g} leaves nothing of a {a.shape[1]}x{a.shape[0]} "
                                "image", where=where, fix="pass a smaller rate (the extension's slider: 1 to 8)")
        err.threshold = "low"  # the unit's threshold_a was wrong, not its image: a unit's error names it
        raise err
    return resample(a, w, h, "area")


def blur_gaussian(image: np.ndarray, sigma: float = 9.0) -> np.ndarray:
    """The extension's ``blur_gaussian``: OpenCV's Gaussian blur of the image with ``sigma``; ``(H, W, 3)``."""
    where = "sdrt.pipelines.tilemaps.blur_gaussian"
    a = checked_rgb(image, where)
    s = checked_number(sigma, "sigma", where, "pass a sigma such as 9 (the extension's slider: 0.01 to 64)")
    if not 0 < s <= 256:
        raise ControlImageError(f"sigma {s:g} is outside (0, 256]", where=where,
                                fix="pass a sigma such as 9 (the extension's slider: 0.01 to 64)")
    return gaussian_blur(a, s)
