"""OpenCV's ``cv2.GaussianBlur(image, (0, 0), sigma)`` in numpy, for the ControlNet preprocessors that blur.

- the kernel: ``cvRound(sigma * k * 2 + 1) | 1`` taps (``k`` = 3 for 8-bit images, 4 for float), weights
  ``exp(-x^2 / (2 sigma^2))`` normalised to sum 1; a dimension of one pixel is not blurred along;
- borders: ``BORDER_REFLECT_101`` (``dcb|abcd|cba``), reflected again where the kernel is longer than the image;
- 8-bit images: OpenCV's bit-exact fixed-point path (the kernel in 8 fractional bits, rounded with error
  diffusion and the centre tap taking what the rest leave of 256; rows summed exactly, then columns, the result
  rounded half up from 16 fractional bits), so the output is OpenCV's to the level;
- float32 images: the separable sums in float32 (rows, then columns); OpenCV sums the taps in another order
  (symmetric pairs, SIMD lanes), so results agree to ~1e-5 of the values, not bit for bit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["convolve_along", "fixed_kernel", "gaussian_blur", "kernel_size", "reflect101"]


def kernel_size(sigma: float, eight_bit: bool) -> int:
    """OpenCV's kernel length for ``ksize=(0, 0)``: ``cvRound(sigma * (3 or 4) * 2 + 1) | 1``."""
    return int(np.rint(sigma * (3 if eight_bit else 4) * 2 + 1)) | 1


def _kernel(n: int, sigma: float) -> np.ndarray:
    """OpenCV's ``getGaussianKernelBitExact`` in float64: symmetric, normalised, centre tap ``1 / sum``."""
    half = (n - 1) // 2
    x = np.arange(1 - n, 1 - n + 2 * half, 2, dtype=np.float64)  # doubled offsets of the left taps
    side = np.exp(x * x * (-0.125 / (sigma * sigma)))
    total = 2.0 * side.sum() + 1.0 + (1.0 if n % 2 == 0 else 0.0)
    left = side * (1.0 / total)
    centre = [1.0 / total] * (1 if n % 2 else 2)
    return np.concatenate([left, centre, left[::-1]])


def fixed_kernel(n: int, sigma: float) -> np.ndarray:
    """The 8-bit path's kernel: 8 fractional bits, error diffusion from the outside in, the centre the rest
    (integers summing to 256)."""
    k = _kernel(n, sigma)
    out = np.zeros(n, np.int64)
    err = 0.0
    for i in range(n // 2):
        v = k[i] * 256.0 + err
        q = int(np.rint(v))
        err = v - q
        out[i] = out[n - 1 - i] = q
    out[n // 2] = 256 - 2 * int(out[: n // 2].sum())
    return out


def reflect101(length: int, before: int, after: int) -> np.ndarray:
    """Source indices of ``length`` samples padded by ``before``/``after`` with ``BORDER_REFLECT_101``."""
    idx = np.arange(-before, length + after)
    if length == 1:
        return np.zeros_like(idx)
    period = 2 * (length - 1)
    idx = np.mod(idx, period)
    return np.where(idx >= length, period - idx, idx)


def convolve_along(a: np.ndarray, taps: np.ndarray, axis: int, acc: type) -> np.ndarray:
    """``a`` convolved with ``taps`` along ``axis``, borders ``BORDER_REFLECT_101``, summed in ``acc``
    (``np.int64`` for fixed-point taps, exactly; ``np.float32``)."""
    n = taps.size
    half = n // 2
    length = a.shape[axis]
    src = np.take(a, reflect101(length, half, n - 1 - half), axis=axis).astype(acc, copy=False)
    out = np.zeros(a.shape, acc)
    for t in range(n):
        sl = [slice(None)] * a.ndim
        sl[axis] = slice(t, t + length)
        out += src[tuple(sl)] * acc(taps[t]) if acc is np.float32 else src[tuple(sl)] * int(taps[t])
    return out


def gaussian_blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """``cv2.GaussianBlur(image, (0, 0), sigma)`` of an ``(H, W)`` or ``(H, W, C)`` uint8 or float32 array."""
    a = np.asarray(image)
    eight_bit = a.dtype == np.uint8
    n = kernel_size(float(sigma), eight_bit)
    if eight_bit:
        taps = fixed_kernel(n, float(sigma))
        x = a.astype(np.int64)
        if a.shape[1] > 1:
            x = convolve_along(x, taps, 1, np.int64)  # 8 fractional bits
        else:
            x = x * 256
        if a.shape[0] > 1:
            x = convolve_along(x, taps, 0, np.int64)  # 16 fractional bits
        else:
            x = x * 256
        return np.clip((x + (1 << 15)) >> 16, 0, 255).astype(np.uint8)
    taps = _kernel(n, float(sigma)).astype(np.float32)
    x = a.astype(np.float32)
    if a.shape[1] > 1:
        x = convolve_along(x, taps, 1, np.float32)
    if a.shape[0] > 1:
        x = convolve_along(x, taps, 0, np.float32)
    return x
