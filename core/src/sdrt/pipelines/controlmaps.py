"""Control images for ControlNet without a model, in numpy: canny, threshold/scribble, resize to the output.

- ``canny(image, low, high)`` follows OpenCV's ``cv2.Canny`` (3x3 Sobel with replicated borders, L1 or
  L2 magnitude, OpenCV's fixed-point direction test for non-maximum suppression, hysteresis over 8
  neighbours). A colour image is handled as OpenCV does: at each pixel the channel with the largest
  gradient gives the gradient. Returns a ``(H, W)`` uint8 map of 0 and 255.
- ``threshold(image, value)``: A1111's ControlNet "threshold" (white where every channel is above
  ``value``); ``scribble(image, value)``: dark strokes on a light page become white strokes on black;
  ``invert(image)``: the extension's "invert (from white bg & black line)", ``255 - image``.
- ``processor_input(image, resolution)``: the image a preprocessor reads at a processor resolution, as
  the extension's ``resize_image_with_pad`` makes it (shorter side scaled to ``resolution``, area
  averaging when shrinking and bicubic when enlarging, sides padded with their edge to multiples of 64),
  and the size to crop its map back to.
- ``resize_control(image, width, height, mode)``: the geometry of sd-webui-controlnet's resize modes,
  ``"Just Resize"``, ``"Crop and Resize"`` and ``"Resize and Fill"`` (scale with ``k = max`` or ``min`` of
  the two ratios, sizes rounded, centred crop, or centred paste on the median border colour), with its
  choice of resampling (OpenCV's, :mod:`sdrt.pipelines.cvresize`): nearest for maps of 3 to 199 colours, area
  averaging when shrinking, bicubic when enlarging, and a black/white map made black and white again
  (:mod:`sdrt.pipelines.edgethin`: Otsu's level, and for one-pixel edges the extension's non-maximum suppression
  and thinning first and after, so that a one-pixel edge stays one pixel wide).
- ``control_tensor(image)``: the ``controlnet_cond`` input, float32 RGB in [0, 1], ``(1, 3, H, W)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..errors import InputError
from .cvresize import resample as _resample
from .images import RESIZE_MODES as IMAGE_RESIZE_MODES

__all__ = [
    "RESIZE_MODES",
    "ControlImageError",
    "canny",
    "control_tensor",
    "fit",
    "invert",
    "processor_input",
    "resize_control",
    "scribble",
    "threshold",
    "to_rgb",
]

#: sd-webui-controlnet's resize modes: the init image's first three (``sdrt.pipelines.images.RESIZE_MODES``)
RESIZE_MODES = IMAGE_RESIZE_MODES[:3]
_TG22 = int(0.4142135623730950488016887242097 * (1 << 15) + 0.5)


class ControlImageError(InputError):
    """A control image or preprocessor argument that cannot be used."""


def finite_number(value: object) -> bool:
    """Whether ``value`` is a finite real number (a Python or numpy int or float, not a bool): the check every
    preprocessor and ControlNet argument makes before its own range (a number too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def checked_number(value: float, what: str, where: str, fix: str) -> float:
    """``value`` as a float; a :class:`ControlImageError` "``what`` ``value`` is not a number" for a value that is no
    finite number (:func:`finite_number`)."""
    if not finite_number(value):
        raise ControlImageError(f"{what} {value!r} is not a number", where=where, fix=fix)
    return float(value)


def _image(image: np.ndarray, where: str) -> np.ndarray:
    a = np.asarray(image)
    if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (1, 3, 4)) \
            or min(a.shape[:2]) < 1:
        raise ControlImageError(f"control image of {a.dtype} {a.shape} is not an 8-bit image",
                                where=where, fix="pass a uint8 array of shape (H, W), (H, W, 3) or (H, W, 4)")
    return a


def checked_rgb(image: np.ndarray, where: str) -> np.ndarray:
    """A control image as ``(H, W, 3)`` uint8 (:func:`to_rgb`), checked first: a ``ControlImageError`` naming
    ``where`` (the map's function) for anything but an 8-bit image. What every preprocessor's module starts with."""
    return to_rgb(_image(image, where))


def to_rgb(image: np.ndarray) -> np.ndarray:
    """``(H, W)``, ``(H, W, 1)``, ``(H, W, 3)`` or ``(H, W, 4)`` uint8 -> ``(H, W, 3)`` (alpha over white, as A1111's HWC3)."""
    a = _image(image, "sdrt.pipelines.controlmaps.to_rgb")
    if a.ndim == 2:
        return np.repeat(a[:, :, None], 3, axis=2)
    if a.shape[2] == 1:
        return np.repeat(a, 3, axis=2)
    if a.shape[2] == 3:
        return a
    color = a[:, :, :3].astype(np.float32)
    alpha = a[:, :, 3:4].astype(np.float32) / 255.0
    return (color * alpha + 255.0 * (1.0 - alpha)).clip(0, 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------ canny
def _sobel(channel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.pad(channel.astype(np.int32), 1, mode="edge")
    dx = (p[:-2, 2:] + 2 * p[1:-1, 2:] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[1:-1, :-2] + p[2:, :-2])
    dy = (p[2:, :-2] + 2 * p[2:, 1:-1] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[:-2, 1:-1] + p[:-2, 2:])
    return dx, dy


def _hysteresis(strong: np.ndarray, weak: np.ndarray) -> np.ndarray:
    """Pixels of ``weak`` 8-connected (through ``weak``) to a pixel of ``strong``."""
    h, w = weak.shape
    on = np.zeros((h + 2, w + 2), bool)
    cand = np.zeros((h + 2, w + 2), bool)
    cand[1:-1, 1:-1] = weak
    flat_cand = cand.reshape(-1)
    flat_on = on.reshape(-1)
    front = np.flatnonzero(np.pad(strong, 1).reshape(-1))
    flat_on[front] = True
    stride = w + 2
    steps = np.array([-stride - 1, -stride, -stride + 1, -1, 1, stride - 1, stride, stride + 1])
    while front.size:
        nb = (front[:, None] + steps[None, :]).reshape(-1)
        nb = nb[flat_cand[nb] & ~flat_on[nb]]
        nb = np.unique(nb)
        flat_on[nb] = True
        front = nb
    return on[1:-1, 1:-1]


def canny(image: np.ndarray, low: float = 100, high: float = 200, *, l2_gradient: bool = False) -> np.ndarray:
    """Edges of a uint8 image as ``cv2.Canny(image, low, high, L2gradient=l2_gradient)`` finds them."""
    a = _image(image, "sdrt.pipelines.controlmaps.canny")
    if not (np.isfinite(low) and np.isfinite(high)) or low < 0 or high < 0:
        raise ControlImageError(f"canny thresholds {low}, {high}", where="sdrt.pipelines.controlmaps.canny",
                                fix="pass two non-negative thresholds, e.g. low=100, high=200")
    if low > high:
        low, high = high, low
    if l2_gradient:
        low, high = min(32767.0, low), min(32767.0, high)
        low, high = (low * low if low > 0 else low), (high * high if high > 0 else high)
    lo, hi = int(np.floor(low)), int(np.floor(high))
    chans = [a] if a.ndim == 2 else [a[:, :, c] for c in range(a.shape[2] if a.shape[2] != 4 else 3)]
    dx = dy = mag = None
    for ch in chans:
        cdx, cdy = _sobel(ch)
        cmag = cdx * cdx + cdy * cdy if l2_gradient else np.abs(cdx) + np.abs(cdy)
        if mag is None:
            dx, dy, mag = cdx, cdy, cmag
        else:
            better = cmag > mag  # the first channel wins a tie, as in OpenCV
            dx, dy, mag = np.where(better, cdx, dx), np.where(better, cdy, dy), np.where(better, cmag, mag)
    assert dx is not None and dy is not None and mag is not None
    h, w = mag.shape
    m = np.pad(mag.astype(np.int64), 1)  # zero magnitude outside the image
    c = m[1:-1, 1:-1]
    left, right = m[1:-1, :-2], m[1:-1, 2:]
    up, down = m[:-2, 1:-1], m[2:, 1:-1]
    ax = np.abs(dx).astype(np.int64)
    ay = np.abs(dy).astype(np.int64) << 15
    tg22x = ax * _TG22
    tg67x = tg22x + (ax << 16)
    horizontal = ay < tg22x
    vertical = ~horizontal & (ay > tg67x)
    s = np.where((dx ^ dy) < 0, -1, 1)
    rows = np.arange(h)[:, None] + 1
    cols = np.arange(w)[None, :] + 1
    diag_up = m[rows - 1, cols - s]
    diag_down = m[rows + 1, cols + s]
    keep = np.where(horizontal, (c > left) & (c >= right),
                    np.where(vertical, (c > up) & (c >= down), (c > diag_up) & (c > diag_down)))
    keep &= c > lo
    edges = _hysteresis(keep & (c > hi), keep)
    return (edges.astype(np.uint8) * 255)


# ------------------------------------------------------------------------------------------ thresholds
def threshold(image: np.ndarray, value: int = 127) -> np.ndarray:
    """A1111's ControlNet "threshold": 255 where every channel is above ``value``, else 0; ``(H, W, 3)``."""
    a = to_rgb(_image(image, "sdrt.pipelines.controlmaps.threshold"))
    if not 0 <= value <= 255:
        raise ControlImageError(f"threshold {value} is outside 0..255", where="sdrt.pipelines.controlmaps.threshold",
                                fix="pass a level from 0 to 255")
    out = np.zeros_like(a)
    out[a.min(axis=2) > value] = 255
    return out


def scribble(image: np.ndarray, value: int = 127) -> np.ndarray:
    """Dark strokes on a light page -> white strokes on black (A1111's invert, then ``threshold``)."""
    a = to_rgb(_image(image, "sdrt.pipelines.controlmaps.scribble"))
    return threshold(255 - a, value)


def invert(image: np.ndarray) -> np.ndarray:
    """The extension's "invert": ``255 - image`` (RGB, alpha over white first); ``(H, W, 3)``."""
    return 255 - to_rgb(_image(image, "sdrt.pipelines.controlmaps.invert"))


# ------------------------------------------------------------------------------------------ resizing
def _hq_resize(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """sd-webui-controlnet's ``high_quality_resize`` of an ``(H, W, 3)`` map: nearest for 3 to 199 colours, area
    averaging when it shrinks, bicubic otherwise; a map of two colours, one darker than 16 and one lighter than 240,
    made black and white again after (:func:`sdrt.pipelines.edgethin.binarize`: its one-pixel edges kept one pixel
    wide)."""
    from .edgethin import binarize, one_pixel_edges

    h, w = a.shape[:2]
    if (h, w) == (height, width):
        return a
    packed = a[:, :, 0].astype(np.uint32) << 16 | a[:, :, 1].astype(np.uint32) << 8 | a[:, :, 2]
    ordered = np.sort(packed, axis=None)  # a sort: numpy's hashing np.unique is ~30x slower on photos
    colors = int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1
    binary = colors == 2 and int(a.min()) < 16 and int(a.max()) > 240
    one_pixel = binary and one_pixel_edges(a)
    if 2 < colors < 200:
        kind = "nearest"
    elif width * height < w * h:
        kind = "area"
    else:
        kind = "cubic"
    y = _resample(a, width, height, kind)
    if binary:
        y = binarize(y, one_pixel, width * height > w * h)
    return y


def resize_control(image: np.ndarray, width: int, height: int, mode: str = "Crop and Resize") -> np.ndarray:
    """The control image at the output size, as sd-webui-controlnet resizes it; ``(height, width, 3)`` uint8."""
    where = "sdrt.pipelines.controlmaps.resize_control"
    a = to_rgb(_image(image, where))
    key = {m.lower(): m for m in RESIZE_MODES}.get(str(mode).lower())
    if key is None:
        raise ControlImageError(f"unknown resize mode {mode!r}", where=where,
                                fix=f"use one of {', '.join(repr(m) for m in RESIZE_MODES)}")
    if int(width) < 1 or int(height) < 1:
        raise ControlImageError(f"output size {width}x{height}", where=where, fix="pass a positive width and height")
    return fit(a, int(width), int(height), key, _hq_resize, where)


def fit(a: np.ndarray, w: int, h: int, key: str, resize: Callable[[np.ndarray, int, int], np.ndarray],
        where: str) -> np.ndarray:
    """``a`` (HxWxC uint8) brought to ``w x h`` by one of the resize modes ``key`` (canonical), as the extension's
    ``detectmap_proc`` does for every map: ``resize(a, w, h)`` resamples; "Resize and Fill" pads with the borders'
    median colour (an RGBA map's padding masked: alpha 255), "Crop and Resize" scales to cover and crops the
    centre."""
    if key == "Just Resize":
        return resize(a, w, h)
    old_h, old_w = a.shape[:2]
    k0, k1 = h / old_h, w / old_w
    if key == "Resize and Fill":
        k = min(k0, k1)
        borders = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]], axis=0)
        fill = np.median(borders, axis=0).astype(np.uint8)
        if fill.shape[0] == 4:
            fill[3] = 255
        out = np.tile(fill[None, None], (h, w, 1))
        # a 1x400 strip fitted in 64x64 is 0.16 pixels tall: one pixel (OpenCV would refuse a 0 size)
        small = resize(a, max(1, int(np.round(old_w * k))), max(1, int(np.round(old_h * k))))
        nh, nw = small.shape[:2]
        ph, pw = max(0, (h - nh) // 2), max(0, (w - nw) // 2)
        out[ph:ph + nh, pw:pw + nw] = small[: h - ph, : w - pw]
        return out
    k = max(k0, k1)
    scaled_side(old_h, old_w, k, where, "a control image this narrow, cropped and resized")
    big = resize(a, int(np.round(old_w * k)), int(np.round(old_h * k)))
    nh, nw = big.shape[:2]
    ph, pw = max(0, (nh - h) // 2), max(0, (nw - w) // 2)
    return np.ascontiguousarray(big[ph:ph + h, pw:pw + w])


def scaled_side(h: int, w: int, k: float, where: str, what: str,
                fix: str = "crop the control image to nearer the output's shape, or use Just Resize") -> int:
    """The longer side of an ``h x w`` image scaled by ``k``; a ``ControlImageError`` above ``MAX_SIDE`` (a 1x4000
    strip cropped and resized to 2048x2048 would be 8 million pixels long: gigabytes, for a 2048-pixel map)."""
    from .bounds import MAX_SIDE

    side = int(np.round(max(h, w) * k))
    if side > MAX_SIDE:
        raise ControlImageError(f"{what} would be {side} pixels long on the way (the image is {w}x{h}), above "
                                f"{MAX_SIDE}", where=where, fix=fix)
    return side


def processor_size(h: int, w: int, resolution: int, where: str = "sdrt.pipelines.controlmaps.processor_input"
                   ) -> tuple[int, int]:
    """``(height, width)`` of an ``h x w`` image with its shorter side scaled to ``resolution`` (before the padding to
    64), as :func:`processor_input` scales it; a ``ControlImageError`` about the resolution (its ``threshold``:
    ``"processor_res"``, so that a unit's error names it) when a side would pass ``MAX_SIDE``."""
    k = float(resolution) / float(min(h, w))
    try:
        scaled_side(h, w, k, where, f"the control image at processor resolution {resolution}",
                    "crop the control image to nearer a square, or pass a smaller processor resolution")
    except ControlImageError as exc:
        exc.threshold = "processor_res"  # type: ignore[attr-defined]
        raise
    return max(int(np.round(h * k)), 1), max(int(np.round(w * k)), 1)


def processor_input(image: np.ndarray, resolution: int) -> tuple[np.ndarray, tuple[int, int]]:
    """``(padded image, (height, width))``: the image at a preprocessor resolution, its shorter side scaled to
    ``resolution`` (bicubic when enlarging, area averaging otherwise) and its bottom and right edges repeated up
    to multiples of 64, as sd-webui-controlnet's ``resize_image_with_pad``; the map is cropped back to
    ``(height, width)``."""
    where = "sdrt.pipelines.controlmaps.processor_input"
    a = to_rgb(_image(image, where))
    if int(resolution) < 1:
        raise ControlImageError(f"processor resolution {resolution}", where=where, fix="pass a positive resolution")
    h, w = a.shape[:2]
    k = float(resolution) / float(min(h, w))
    th, tw = processor_size(h, w, resolution, where)
    if (th, tw) != (h, w):
        a = _resample(a, tw, th, "cubic" if k > 1 else "area")
    ph, pw = -th % 64, -tw % 64
    return np.pad(a, ((0, ph), (0, pw), (0, 0)), mode="edge"), (th, tw)


def control_tensor(image: np.ndarray) -> np.ndarray:
    """``controlnet_cond`` for one image: float32 RGB in [0, 1], shape ``(1, 3, H, W)``."""
    a = to_rgb(_image(image, "sdrt.pipelines.controlmaps.control_tensor"))
    return (a.astype(np.float32) / np.float32(255.0)).transpose(2, 0, 1)[None].copy()
