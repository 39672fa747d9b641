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
  choice of resampling: nearest for maps of 3 to 199 colours, area averaging when shrinking, bicubic
  when enlarging, and a black/white map re-binarized with Otsu's threshold.
- ``control_tensor(image)``: the ``controlnet_cond`` input, float32 RGB in [0, 1], ``(1, 3, H, W)``.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .images import RESIZE_MODES as IMAGE_RESIZE_MODES

__all__ = [
    "RESIZE_MODES",
    "ControlImageError",
    "canny",
    "control_tensor",
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


def _image(image: np.ndarray, where: str) -> np.ndarray:
    a = np.asarray(image)
    if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (1, 3, 4)) \
            or min(a.shape[:2]) < 1:
        raise ControlImageError(f"control image of {a.dtype} {a.shape} is not an 8-bit image",
                                where=where, fix="pass a uint8 array of shape (H, W), (H, W, 3) or (H, W, 4)")
    return a


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
def _taps_area(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """Area averaging as taps: (dst, k) source indices and weights; each output covers src/dst inputs."""
    scale = src / dst
    rows = []
    for i in range(dst):
        a, b = i * scale, (i + 1) * scale
        j0, j1 = int(np.floor(a)), min(int(np.ceil(b)), src)
        idx = np.arange(j0, j1)
        w = np.minimum(b, idx + 1) - np.maximum(a, idx)
        rows.append((idx, w / w.sum()))
    return _pad_taps(rows)


def _taps_cubic(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """Bicubic taps (a = -0.75, pixel centres aligned, edges replicated), as cv2.INTER_CUBIC."""
    x = (np.arange(dst) + 0.5) * (src / dst) - 0.5
    x0 = np.floor(x).astype(int)
    t = x - x0
    idx = np.clip(x0[:, None] + np.arange(-1, 3)[None, :], 0, src - 1)
    w = _cubic(np.stack([1 + t, t, 1 - t, 2 - t], axis=1))
    return idx, w


def _pad_taps(rows: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    k = max(len(i) for i, _ in rows)
    idx = np.zeros((len(rows), k), int)
    w = np.zeros((len(rows), k))
    for r, (i, wt) in enumerate(rows):
        idx[r, : len(i)] = i
        w[r, : len(i)] = wt
    return idx, w


def _cubic(d: np.ndarray, a: float = -0.75) -> np.ndarray:
    d = np.abs(d)
    return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                    np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))


def _apply_taps(a: np.ndarray, idx: np.ndarray, w: np.ndarray, axis: int) -> np.ndarray:
    out = None
    for t in range(idx.shape[1]):
        shape = [1] * a.ndim
        shape[axis] = -1
        term = np.take(a, idx[:, t], axis=axis) * w[:, t].reshape(shape)
        out = term if out is None else out + term
    assert out is not None
    return out


def _resample(a: np.ndarray, width: int, height: int, kind: str) -> np.ndarray:
    h, w = a.shape[:2]
    if kind == "nearest":
        # OpenCV: floor(x * (1 / fx)) with fx = dst / src, in doubles
        ys = np.minimum(np.floor(np.arange(height) * (1.0 / (height / h))).astype(int), h - 1)
        xs = np.minimum(np.floor(np.arange(width) * (1.0 / (width / w))).astype(int), w - 1)
        return a[ys][:, xs]
    if kind == "area" and (height > h or width > w):  # OpenCV's INTER_AREA enlarging either side: its linear mode
        return _area_linear(a, width, height)
    make = _taps_area if kind == "area" else _taps_cubic
    out = _apply_taps(a.astype(np.float64), *make(h, height), axis=0)
    out = _apply_taps(out, *make(w, width), axis=1)
    return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)  # halves round up, as OpenCV's


def _area_linear_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's INTER_AREA taps where the image is enlarged: two taps, the second weighted by the share of the
    output pixel past the source pixel's edge, the positions in OpenCV's doubles (``floor(dx * scale)`` may land
    one pixel early where ``dx * scale`` is whole), weights in 11-bit fixed point."""
    inv = dst / src
    scale = 1.0 / inv
    dx = np.arange(dst)
    sx = np.floor(dx * scale).astype(np.int64)
    fx = ((dx + 1) - (sx + 1) * inv).astype(np.float32)
    fx = np.where(fx <= 0, np.float32(0), fx - np.floor(fx)).astype(np.float32)
    last = sx >= src - 1
    fx = np.where(last, np.float32(0), fx)
    sx = np.minimum(sx, src - 1)
    idx = np.stack([sx, np.minimum(sx + 1, src - 1)], axis=1)
    w = np.rint(np.stack([np.float32(1) - fx, fx], axis=1) * np.float32(2048)).astype(np.int64)
    return idx, w


def _area_linear(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(a, (width, height), interpolation=cv2.INTER_AREA)`` of a uint8 image enlarged on a side
    (bit-exact against OpenCV 5.0's vector code)."""
    ix, wx = _area_linear_axis(a.shape[1], width)
    iy, wy = _area_linear_axis(a.shape[0], height)
    x = a.astype(np.int64)
    rows = x[:, ix[:, 0]] * wx[:, 0].reshape(1, -1, *([1] * (a.ndim - 2))) \
        + x[:, ix[:, 1]] * wx[:, 1].reshape(1, -1, *([1] * (a.ndim - 2)))
    shape = (-1, 1, *([1] * (a.ndim - 2)))
    # OpenCV's vector path: rows in 7 fractional bits, each product's high 16 bits, then rounded from 2 bits
    out = ((rows[iy[:, 0]] >> 4) * wy[:, 0].reshape(shape) >> 16) + ((rows[iy[:, 1]] >> 4) * wy[:, 1].reshape(shape) >> 16)
    return np.clip((out + 2) >> 2, 0, 255).astype(np.uint8)


def _otsu(gray: np.ndarray) -> int:
    hist = np.bincount(gray.reshape(-1), minlength=256).astype(np.float64)
    total = hist.sum()
    levels = np.arange(256)
    w0 = np.cumsum(hist)
    m0 = np.cumsum(hist * levels)
    w1 = total - w0
    mean_all = m0[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        between = (mean_all * w0 / total - m0) ** 2 / (w0 * w1 / total)
    between = np.nan_to_num(between, nan=-1.0, posinf=-1.0)
    return int(np.argmax(between))


def _hq_resize(a: np.ndarray, width: int, height: int) -> np.ndarray:
    h, w = a.shape[:2]
    if (h, w) == (height, width):
        return a
    packed = a[:, :, 0].astype(np.uint32) << 16 | a[:, :, 1].astype(np.uint32) << 8 | a[:, :, 2]
    ordered = np.sort(packed, axis=None)  # a sort: numpy's hashing np.unique is ~30x slower on photos
    colors = int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1
    binary = colors == 2 and int(a.min()) < 16 and int(a.max()) > 240
    if 2 < colors < 200:
        kind = "nearest"
    elif width * height < w * h:
        kind = "area"
    else:
        kind = "cubic"
    y = _resample(a, width, height, kind)
    if binary:
        gray = y.astype(np.float32).mean(axis=2).clip(0, 255).astype(np.uint8)
        y = np.repeat(np.where(gray > _otsu(gray), 255, 0).astype(np.uint8)[:, :, None], 3, axis=2)
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
    w, h = int(width), int(height)
    if key == "Just Resize":
        return _hq_resize(a, w, h)
    old_h, old_w = a.shape[:2]
    k0, k1 = h / old_h, w / old_w
    if key == "Resize and Fill":
        k = min(k0, k1)
        borders = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]], axis=0)
        fill = np.median(borders, axis=0).astype(np.uint8)
        out = np.tile(fill[None, None], (h, w, 1))
        small = _hq_resize(a, int(np.round(old_w * k)), int(np.round(old_h * k)))
        nh, nw = small.shape[:2]
        ph, pw = max(0, (h - nh) // 2), max(0, (w - nw) // 2)
        out[ph:ph + nh, pw:pw + nw] = small[: h - ph, : w - pw]
        return out
    k = max(k0, k1)
    scaled_side(old_h, old_w, k, where, "a control image this narrow, cropped and resized")
    big = _hq_resize(a, int(np.round(old_w * k)), int(np.round(old_h * k)))
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
    scaled_side(h, w, k, where, f"the control image at processor resolution {resolution}",
                "crop the control image to nearer a square, or pass a smaller processor resolution")
    th, tw = max(int(np.round(h * k)), 1), max(int(np.round(w * k)), 1)
    if (th, tw) != (h, w):
        a = _resample(a, tw, th, "cubic" if k > 1 else "area")
    ph, pw = -th % 64, -tw % 64
    return np.pad(a, ((0, ph), (0, pw), (0, 0)), mode="edge"), (th, tw)


def control_tensor(image: np.ndarray) -> np.ndarray:
    """``controlnet_cond`` for one image: float32 RGB in [0, 1], shape ``(1, 3, H, W)``."""
    a = to_rgb(_image(image, "sdrt.pipelines.controlmaps.control_tensor"))
    return (a.astype(np.float32) / np.float32(255.0)).transpose(2, 0, 1)[None].copy()
