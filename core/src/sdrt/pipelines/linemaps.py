"""sd-webui-controlnet's procedural line maps, in numpy: ``lineart_standard`` and ``scribble_xdog``.

Both work on the image as the extension's ``resize_image_with_pad`` hands it over (the caller pads and crops:
:func:`sdrt.pipelines.controlmaps.processor_input`) and blur in float32 with OpenCV's Gaussian
(:mod:`sdrt.pipelines.gaussian`, which agrees with ``cv2.GaussianBlur`` to ~1e-4 there, so a value that lands
on a whole level can truncate one level apart: a few pixels in a thousand).

- ``lineart_standard(image)`` ("lineart_standard (from white bg & black line)"): dark lines on a light page
  become white lines: how much darker each pixel is than its surroundings (a sigma-6 blur minus the image, the
  smallest over the channels, clipped to 0..255), scaled so the median of the values above 8 maps to 127
  (at least 16 is the divisor), truncated to 0..255, as grey RGB;
- ``scribble_xdog(image, threshold)``: a difference of Gaussians (sigma 5 minus sigma 0.5, the smallest over
  the channels) as ``dog = uint8(clip(255 - d))``; white where ``2 * (255 - dog) > threshold``, else black.
  That product is the extension's uint8 arithmetic, which wraps past 255: where the difference passes 127 (the
  core of a thick dark stroke) it comes out black. sdrt keeps that, as the Scribble nets saw such maps.
"""

from __future__ import annotations

import numpy as np

from .controlmaps import checked_number, checked_rgb
from .gaussian import gaussian_blur

__all__ = ["lineart_standard", "scribble_xdog"]


def lineart_standard(image: np.ndarray) -> np.ndarray:
    """White lines on black from dark lines on a light image; ``(H, W, 3)`` uint8 grey."""
    x = checked_rgb(image, "sdrt.pipelines.linemaps.lineart_standard").astype(np.float32)
    intensity = np.min(gaussian_blur(x, 6.0) - x, axis=2).clip(0, 255)
    strong = intensity[intensity > 8]
    intensity /= max(16.0, float(np.median(strong))) if strong.size else 16.0
    intensity *= 127
    out = intensity.clip(0, 255).astype(np.uint8)
    return np.repeat(out[:, :, None], 3, axis=2)


def scribble_xdog(image: np.ndarray, threshold: float = 32) -> np.ndarray:
    """The extension's XDoG scribble: 255 where the difference of Gaussians passes ``threshold``; ``(H, W, 3)``."""
    where = "sdrt.pipelines.linemaps.scribble_xdog"
    a = checked_rgb(image, where)
    checked_number(threshold, "XDoG threshold", where, "pass a threshold such as 32 (the extension's slider: 1 to 64)")
    x = a.astype(np.float32)
    dog = (255 - np.min(gaussian_blur(x, 5.0) - gaussian_blur(x, 0.5), axis=2)).clip(0, 255).astype(np.uint8)
    out = np.zeros_like(a)
    out[(2 * (255 - dog.astype(np.int64))) % 256 > threshold] = 255  # the extension's uint8 product wraps
    return out
