"""OpenCV's ``cv2.resize`` of uint8 images in numpy, as sd-webui-controlnet's preprocessors and resize modes call it.

- ``"nearest"``: ``floor(x * (1 / fx))`` in doubles, as OpenCV picks the source pixel; exact;
- ``"area"`` shrinking: OpenCV's area table (``computeResizeAreaTab``), summed in float32 (rows first) and rounded
  half to even, or its integer-factor path (``(sum + 2) >> 2`` for 2x, ``sum * (1 / area)`` otherwise); exact;
- ``"area"`` enlarging a side: OpenCV's linear mode for INTER_AREA (two taps, positions in OpenCV's doubles,
  11-bit weights, its vector code's rounding); exact against OpenCV 5.0;
- ``"linear"``: OpenCV's INTER_LINEAR (positions ``(dx + 0.5) * scale - 0.5`` cast to float32 before the floor,
  11-bit weights, the same vector rounding); exact;
- ``"cubic"``: OpenCV's pip wheels hand INTER_CUBIC of a source at least 4 x 4 to Intel IPP (its resize HAL), whose
  own float arithmetic is not published: bicubic taps (a = -0.75, edges replicated) with float32 weights, the
  vertical pass first and its output kept in float32, rounded half to even; 1 level from IPP on under a value in a thousand
  (0.07 % measured over 1.2 M values at scales 0.6 to 3; IPP's weights differ from these in their last float32
  bits). A source under 4 pixels on a side, which IPP refuses, takes OpenCV's own fixed-point code, reproduced
  bit for bit (:func:`_cubic_fixed`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["resample"]


def _taps_area(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """Area averaging as taps, OpenCV's table (``computeResizeAreaTab``): (dst, k) source indices and float32
    weights; each output covers src/dst inputs, a sliver under 1e-3 of a pixel at either end left out."""
    scale = src / dst
    rows = []
    for i in range(dst):
        f1 = i * scale
        f2 = f1 + scale
        cell = min(scale, src - f1)
        s2 = min(int(np.floor(f2)), src - 1)
        s1 = min(int(np.ceil(f1)), s2)
        idx, w = [], []
        if s1 - f1 > 1e-3:
            idx.append(s1 - 1)
            w.append((s1 - f1) / cell)
        idx += list(range(s1, s2))
        w += [1.0 / cell] * (s2 - s1)
        if f2 - s2 > 1e-3:
            idx.append(s2)
            w.append(min(min(f2 - s2, 1.0), cell) / cell)
        rows.append((np.array(idx, int), np.array(w, np.float32)))
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
    w = np.zeros((len(rows), k), rows[0][1].dtype)
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


def resample(a: np.ndarray, width: int, height: int, kind: str) -> np.ndarray:
    """``cv2.resize(a, (width, height), interpolation=...)`` of a uint8 image: ``kind`` "nearest", "area", "linear"
    or "cubic"."""
    h, w = a.shape[:2]
    if kind == "linear":
        if (h, w) == (height, width):
            return a.copy()
        return _two_taps(a, *_linear_axis(w, width), *_linear_axis(h, height, rows=True))
    if kind == "nearest":
        # OpenCV: floor(x * (1 / fx)) with fx = dst / src, in doubles
        ys = np.minimum(np.floor(np.arange(height) * (1.0 / (height / h))).astype(int), h - 1)
        xs = np.minimum(np.floor(np.arange(width) * (1.0 / (width / w))).astype(int), w - 1)
        return a[ys][:, xs]
    if kind == "area" and (height > h or width > w):  # OpenCV's INTER_AREA enlarging either side: its linear mode
        return _area_linear(a, width, height)
    if kind == "area" and (w / width).is_integer() and (h / height).is_integer():  # OpenCV's resizeAreaFast
        fx, fy = w // width, h // height
        s = a.astype(np.int64).reshape(height, fy, width, fx, *a.shape[2:]).sum(axis=(1, 3))
        if fx == fy == 2:
            return ((s + 2) >> 2).astype(np.uint8)
        return np.clip(np.rint(s.astype(np.float32) * np.float32(1.0 / (fx * fy))), 0, 255).astype(np.uint8)
    if kind == "area":  # OpenCV's sums in float32, rows first, rounded half to even
        out = _apply_taps(a.astype(np.float32), *_taps_area(w, width), axis=1)
        out = _apply_taps(out, *_taps_area(h, height), axis=0)
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    if (h, w) == (height, width):
        return a.copy()
    if h < 4 or w < 4:  # IPP refuses a source this small: OpenCV's own code
        return _cubic_fixed(a, width, height)
    return _cubic_ipp(a, width, height)


#: values per strip of output rows in :func:`_cubic_ipp`
_STRIP = 1 << 20


def _cubic_ipp(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """INTER_CUBIC as IPP's resize runs it, as near as its unpublished arithmetic allows: float32 weights, the
    vertical pass first (its output kept in float32), the horizontal one summed in float64, rounded half to
    even."""
    h, w = a.shape[:2]
    iy, wy = _taps_cubic(h, height)
    ix, wx = _taps_cubic(w, width)
    wy = wy.astype(np.float32).astype(np.float64)
    wx = wx.astype(np.float32).astype(np.float64)
    out = np.empty((height, width, *a.shape[2:]), np.uint8)
    # in strips of output rows (each row is its own sums): float64 copies of a strip, not of the whole image
    step = max(1, _STRIP // max(1, width * int(np.prod(a.shape[2:], dtype=np.int64))))
    for r in range(0, height, step):
        rows = iy[r:r + step]
        lo = int(rows.min())
        src = a[lo:int(rows.max()) + 1].astype(np.float64)
        part = _apply_taps(src, rows - lo, wy[r:r + step], axis=0).astype(np.float32)
        part = _apply_taps(part.astype(np.float64), ix, wx, axis=1)
        out[r:r + step] = np.clip(np.rint(part), 0, 255).astype(np.uint8)
    return out


def _cubic_fixed_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's own INTER_CUBIC taps on one side: the position ``(d + 0.5) * scale - 0.5`` in doubles (``scale``
    the reciprocal of ``dst / src``) cast to float32, its floor less one the first of four taps (clamped to the
    edges), the weights of Keys' cubic (a = -0.75) in float32 (the last one minus the others) times 2048 rounded
    to int16."""
    f = ((np.arange(dst) + 0.5) * (1.0 / (dst / src)) - 0.5).astype(np.float32)
    s = np.floor(f)
    t = (f - s).astype(np.float32)
    A = np.float32(-0.75)
    one = np.float32(1)
    x1 = t + one
    c0 = ((A * x1 - np.float32(5) * A) * x1 + np.float32(8) * A) * x1 - np.float32(4) * A
    c1 = (((A + np.float32(2)) * t - (A + np.float32(3))) * t) * t + one
    u = one - t
    c2 = (((A + np.float32(2)) * u - (A + np.float32(3))) * u) * u + one
    c3 = ((one - c0) - c1) - c2
    w = np.rint(np.stack([c0, c1, c2, c3], axis=1).astype(np.float32) * np.float32(2048)).astype(np.int64)
    idx = np.clip(s.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :], 0, src - 1)
    return idx, w


def _cubic_fixed(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """OpenCV's own uint8 INTER_CUBIC (resize.cpp): int16 weights scaled by 2048, the rows summed exactly into
    int32, then down the columns as its 128-bit vector code does it, in float32 (each int32 times its weight over
    2^22, summed from the last tap up, rounded half to even), eight values a row at a time; the values past the
    last whole eight of a row (width times channels) in integers, ``(sum + 2^21) >> 22``; saturated to 0..255."""
    h, w = a.shape[:2]
    ix, wx = _cubic_fixed_axis(w, width)
    iy, wy = _cubic_fixed_axis(h, height)
    rows = _apply_taps(a.astype(np.int64), ix, wx, axis=1)  # (h, width, ...) exact
    shape = (-1, *([1] * (a.ndim - 1)))
    taps = [rows[iy[:, k]] for k in range(4)]
    scale = np.float32(1.0 / (2048 * 2048))
    acc = taps[3].astype(np.float32) * (wy[:, 3].astype(np.float32) * scale).reshape(shape)
    for k in (2, 1, 0):
        acc = taps[k].astype(np.float32) * (wy[:, k].astype(np.float32) * scale).reshape(shape) + acc
    vec = np.rint(acc)
    exact = sum(taps[k] * wy[:, k].reshape(shape) for k in range(4))
    scalar = (exact + (1 << 21)) >> 22
    flat_vec = vec.reshape(height, -1)
    flat_sc = scalar.reshape(height, -1)
    n = flat_vec.shape[1]
    out = flat_vec.copy()
    tail = n - n % 8
    out[:, tail:] = flat_sc[:, tail:]
    return np.clip(out, 0, 255).astype(np.uint8).reshape((height, width, *a.shape[2:]))


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
    return _two_taps(a, *_area_linear_axis(a.shape[1], width), *_area_linear_axis(a.shape[0], height))


def _linear_axis(src: int, dst: int, rows: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's INTER_LINEAR taps: ``(dx + 0.5) * scale - 0.5`` in doubles cast to float32, its floor the first
    tap, weights in 11-bit fixed point. Past the edges both taps read the edge pixel: across a row the weight goes
    whole to it, but down the columns (``rows``) OpenCV keeps the fractional split, which its vertical pass's
    truncated products can round a level differently."""
    f = ((np.arange(dst) + 0.5) * (src / dst) - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = f - s
    if rows:
        idx = np.clip(np.stack([s, s + 1], axis=1), 0, src - 1)
    else:
        f = np.where(s < 0, np.float32(0), f)
        s = np.where(s < 0, 0, s)
        last = s >= src - 1
        f = np.where(last, np.float32(0), f)
        s = np.where(last, src - 1, s)
        idx = np.stack([s, np.minimum(s + 1, src - 1)], axis=1)
    a1 = np.rint(f * np.float32(2048)).astype(np.int64)
    return idx, np.stack([2048 - a1, a1], axis=1)


def _two_taps(a: np.ndarray, ix: np.ndarray, wx: np.ndarray, iy: np.ndarray, wy: np.ndarray) -> np.ndarray:
    """A uint8 image resampled by two taps a side with 11-bit weights, as OpenCV 5.0's vector code sums them:
    rows in 7 fractional bits, each product's high 16 bits, then rounded from 2 bits. Only the source rows read are
    widened to int64 (a photo's whole int64 copy is 8 bytes a channel: 850 MB for 24 MP)."""
    need, at = np.unique(iy, return_inverse=True)
    at = at.reshape(iy.shape)
    x = a[need]
    cols = (1, -1, *([1] * (a.ndim - 2)))
    rows = x[:, ix[:, 0]].astype(np.int64) * wx[:, 0].reshape(cols) \
        + x[:, ix[:, 1]].astype(np.int64) * wx[:, 1].reshape(cols)
    shape = (-1, 1, *([1] * (a.ndim - 2)))
    out = np.empty((len(iy), *rows.shape[1:]), np.uint8)
    step = max(1, _STRIP // max(1, int(np.prod(rows.shape[1:]))))  # in strips of output rows: an enlargement's
    for r in range(0, len(iy), step):  # int64 rows were 8 bytes a value of the output (1.7 GB for 24 MP)
        sl = slice(r, r + step)
        y = ((rows[at[sl, 0]] >> 4) * wy[sl, 0].reshape(shape) >> 16) \
            + ((rows[at[sl, 1]] >> 4) * wy[sl, 1].reshape(shape) >> 16)
        out[sl] = np.clip((y + 2) >> 2, 0, 255)
    return out
