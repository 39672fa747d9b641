"""``mask_blur``: A1111's img2img "Mask blur" (``mask_blur_x``, ``mask_blur_y``), a Gaussian blur of the mask at its
own size, before it is fitted to the run's size.

A1111's img2img init (modules/processing.py) runs ``cv2.GaussianBlur`` along x with a kernel of
``2 * int(2.5 * bx + 0.5) + 1`` taps and sigma ``bx``, then along y the same way with ``by``, each only when it is
above 0. This is OpenCV's 8-bit path written in numpy: its Gaussian taps (``getGaussianKernelBitExact``: ``exp(-d^2
/ (2 sigma^2))`` normalised), made 8-bit fixed point by error diffusion (``getGaussianKernelFixedPoint_ED``: the
taps sum to exactly 256), each output the integer sum of taps times pixels, rounded half up to 8 bits; borders
reflected without repeating the edge pixel (``BORDER_REFLECT_101``, OpenCV's default, folded again where the kernel
is wider than the mask): :mod:`sdrt.pipelines.gaussian`'s kernel and convolution, with A1111's kernel size.
tests/pipelines/test_mask_blur.py checks it against OpenCV's own output."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from .gaussian import convolve_along, fixed_kernel

#: the largest blur radius taken (A1111's UI slider goes to 64)
MAX_BLUR = 256


def check(value: Any) -> tuple[int, int]:
    """``mask_blur``: an integer (both directions) or ``(x, y)``, each from 0 to :data:`MAX_BLUR` pixels."""
    items = list(value) if isinstance(value, (tuple, list)) else [value, value]
    if len(items) == 2 and all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                               and 0 <= v <= MAX_BLUR for v in items):
        return int(items[0]), int(items[1])
    raise InputError(f"{{@mask_blur}} must be an integer from 0 to {MAX_BLUR} (pixels) or an (x, y) pair of them, got "
                     f"{value!r:.40}", where="mask_blur", fix="use e.g. {@mask_blur=}4 (A1111's default)")


def kernel_size(sigma: int) -> int:
    """A1111's taps for a blur of ``sigma`` pixels: ``2 * int(2.5 * sigma + 0.5) + 1``."""
    return 2 * int(2.5 * sigma + 0.5) + 1


def _blur_along(gray: np.ndarray, sigma: int, axis: int) -> np.ndarray:
    """``cv2.GaussianBlur`` of an HxW uint8 array with ``kernel_size(sigma)`` taps along ``axis`` only (1: x, the
    kernel ``(size, 1)``; 0: y), rounded to 8 bits as OpenCV's 8-bit path rounds."""
    taps = fixed_kernel(kernel_size(sigma), float(sigma))
    total = convolve_along(gray.astype(np.int64), taps, axis, np.int64)
    return np.clip((total + 128) >> 8, 0, 255).astype(np.uint8)


def blur(gray: np.ndarray, x: int, y: int) -> np.ndarray:
    """An HxW uint8 mask blurred as A1111 blurs it: along x by ``x`` pixels, then along y by ``y`` (0: not)."""
    out = np.ascontiguousarray(gray, dtype=np.uint8)
    if x > 0:
        out = _blur_along(out, x, 1)
    if y > 0:
        out = _blur_along(out, y, 0)
    return out


def infotext(x: int, y: int) -> dict[str, object]:
    """A1111's field: ``Mask blur: N`` when either blurs and both are N (A1111 writes none when they differ)."""
    return {"Mask blur": x} if (x > 0 or y > 0) and x == y else {}


__all__ = ["MAX_BLUR", "blur", "check", "fixed_kernel", "infotext", "kernel_size"]
