"""OpenCV's drawing of filled shapes on uint8 images, in Python integers, as the pose maps call it.

The OpenPose renderer of sd-webui-controlnet and controlnet_aux draws with four OpenCV calls, whose integer
algorithms (``modules/imgproc/src/drawing.cpp``) this module follows step for step, so a map matches OpenCV's
pixel for pixel:

- ``ellipse2poly(center, axes, angle, start, end, delta)``: ``cv2.ellipse2Poly`` (its 1-degree sine table of
  7-digit floats, points rounded, repeats dropped);
- ``fill_convex_poly(img, points, color)``: ``cv2.fillConvexPoly`` with 8-connected outline and the scan of its
  two edges in 16.16 fixed point (``shift`` 0, or 16 for the thick line's quadrilateral);
- ``circle(img, center, radius, color)``: a filled ``cv2.circle`` (the midpoint algorithm's spans);
- ``line(img, p1, p2, color, thickness)``: ``cv2.line``, 8-connected; a thickness above 1 is OpenCV's thick line
  (the segment clipped to the image grown by the thickness, as OpenCV 5 does, then a quadrilateral plus a round cap
  of radius ``thickness / 2`` at each end).

Colours are given as OpenCV receives them (a sequence of numbers, rounded to uint8 as ``saturate_cast`` does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["circle", "ellipse2poly", "fill_convex_poly", "line", "sin_table"]

XY_SHIFT = 16
XY_ONE = 1 << XY_SHIFT


def _sin_table() -> np.ndarray:
    # OpenCV's table: sin of each degree from 0 to 450 as a float literal of 7 decimals
    vals = [float(f"{math.sin(math.radians(d)):.7f}") for d in range(451)]
    return np.array(vals, dtype=np.float32).astype(np.float64)


_SIN = _sin_table()


def sin_table() -> np.ndarray:
    """The 451 sines OpenCV's ellipses are made of (float32 values, as doubles)."""
    return _SIN.copy()


def _round(v: float) -> int:
    """``cvRound``: to nearest, halves to even."""
    return int(np.rint(v))


def _cdiv(a: int, b: int) -> int:
    """C's integer division (toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _color(img: np.ndarray, color: Sequence[float]) -> np.ndarray:
    c = [min(max(_round(float(v)), 0), 255) for v in list(color)[: img.shape[2]]]
    c += [0] * (img.shape[2] - len(c))
    return np.array(c, dtype=np.uint8)


def ellipse2poly(center: tuple[int, int], axes: tuple[int, int], angle: int, arc_start: int, arc_end: int,
                 delta: int) -> list[tuple[int, int]]:
    """``cv2.ellipse2Poly``: the polygon of an elliptic arc, integer points, repeats removed."""
    angle = int(angle)
    while angle < 0:
        angle += 360
    while angle > 360:
        angle -= 360
    if arc_start > arc_end:
        arc_start, arc_end = arc_end, arc_start
    while arc_start < 0:
        arc_start += 360
        arc_end += 360
    while arc_end > 360:
        arc_end -= 360
        arc_start -= 360
    if arc_end - arc_start > 360:
        arc_start, arc_end = 0, 360
    a = angle + (360 if angle < 0 else 0)
    alpha, beta = _SIN[450 - a], _SIN[a]  # float32 in OpenCV, promoted to double in the products
    cx, cy = float(center[0]), float(center[1])
    w, h = float(axes[0]), float(axes[1])
    pts: list[tuple[int, int]] = []
    for i in range(arc_start, arc_end + delta, delta):
        ang = min(i, arc_end)
        if ang < 0:
            ang += 360
        x = w * _SIN[450 - ang]
        y = h * _SIN[ang]
        p = (_round(cx + x * alpha - y * beta), _round(cy + x * beta + y * alpha))
        if not pts or p != pts[-1]:
            pts.append(p)
    if len(pts) == 1:
        pts = [(int(center[0]), int(center[1]))] * 2
    return pts


def _clip_line(w: int, h: int, x1: int, y1: int, x2: int, y2: int) -> tuple[bool, int, int, int, int]:
    right, bottom = w - 1, h - 1
    if w <= 0 or h <= 0:
        return False, x1, y1, x2, y2

    def code(x: int, y: int) -> int:
        return (x < 0) + (x > right) * 2 + (y < 0) * 4 + (y > bottom) * 8

    c1, c2 = code(x1, y1), code(x2, y2)
    if (c1 & c2) == 0 and (c1 | c2) != 0:
        if c1 & 12:
            a = 0 if c1 < 8 else bottom
            x1 += int((a - y1) * (x2 - x1) / (y2 - y1))
            y1 = a
            c1 = (x1 < 0) + (x1 > right) * 2
        if c2 & 12:
            a = 0 if c2 < 8 else bottom
            x2 += int((a - y2) * (x2 - x1) / (y2 - y1))
            y2 = a
            c2 = (x2 < 0) + (x2 > right) * 2
        if (c1 & c2) == 0 and (c1 | c2) != 0:
            if c1:
                a = 0 if c1 == 1 else right
                y1 += int((a - x1) * (y2 - y1) / (x2 - x1))
                x1 = a
                c1 = 0
            if c2:
                a = 0 if c2 == 1 else right
                y2 += int((a - x2) * (y2 - y1) / (x2 - x1))
                x2 = a
                c2 = 0
    return (c1 | c2) == 0, x1, y1, x2, y2


def _line8(img: np.ndarray, p1: tuple[int, int], p2: tuple[int, int], c: np.ndarray) -> None:
    """OpenCV's ``Line`` (``LineIterator``, 8-connected, left to right) of one-pixel width."""
    h, w = img.shape[:2]
    (x1, y1), (x2, y2) = p1, p2
    if not (0 <= x1 < w and 0 <= x2 < w and 0 <= y1 < h and 0 <= y2 < h):
        ok, x1, y1, x2, y2 = _clip_line(w, h, x1, y1, x2, y2)
        if not ok:
            return
    dx, dy = x2 - x1, y2 - y1
    sx = sy = 1
    if dx < 0:
        dx, dy = -dx, -dy
        x1, y1 = x2, y2
    if dy < 0:
        dy, sy = -dy, -1
    vert = dy > dx
    if vert:
        dx, dy = dy, dx
        sx, sy = sy, sx
    err = dx - (dy + dy)
    plus_delta, minus_delta = dx + dx, -(dy + dy)
    # (x, y) steps: always along the major axis (minus), plus a minor step when err < 0
    if vert:
        major, minor = (0, sx), (sy, 0)
    else:
        major, minor = (sx, 0), (0, sy)
    x, y = x1, y1
    for _ in range(dx + 1):
        img[y, x] = c
        neg = err < 0
        err += minus_delta + (plus_delta if neg else 0)
        x += major[0] + (minor[0] if neg else 0)
        y += major[1] + (minor[1] if neg else 0)


def _line2(img: np.ndarray, p1: tuple[int, int], p2: tuple[int, int], c: np.ndarray) -> None:
    """OpenCV's ``Line2``, which ``FillConvexPoly`` outlines a fixed-point polygon with: 8-connected steps from
    16.16 ends, the first end's fraction kept on the minor axis, the second end rounded and set too."""
    h, w = img.shape[:2]
    ok, x1, y1, x2, y2 = _clip_line(w << XY_SHIFT, h << XY_SHIFT, p1[0], p1[1], p2[0], p2[1])
    if not ok:
        return
    dx, dy = x2 - x1, y2 - y1
    ax, ay = abs(dx), abs(dy)

    def put(x: int, y: int) -> None:
        if 0 <= x < w and 0 <= y < h:
            img[y, x] = c

    if ax > ay:
        if dx < 0:
            dy = -dy
            x1, x2, y1, y2 = x2, x1, y2, y1
        y_step = _cdiv(dy * XY_ONE, ax | 1)
        ecount = (x2 - x1) >> XY_SHIFT
    else:
        if dy < 0:
            dx = -dx
            x1, x2, y1, y2 = x2, x1, y2, y1
        x_step = _cdiv(dx * XY_ONE, ay | 1)
        ecount = (y2 - y1) >> XY_SHIFT
    x1 += XY_ONE >> 1
    y1 += XY_ONE >> 1
    put((x2 + (XY_ONE >> 1)) >> XY_SHIFT, (y2 + (XY_ONE >> 1)) >> XY_SHIFT)
    if ax > ay:
        x1 >>= XY_SHIFT
        while ecount >= 0:
            put(x1, y1 >> XY_SHIFT)
            x1 += 1
            y1 += y_step
            ecount -= 1
    else:
        y1 >>= XY_SHIFT
        while ecount >= 0:
            put(x1 >> XY_SHIFT, y1)
            x1 += x_step
            y1 += 1
            ecount -= 1


def _fill_convex(img: np.ndarray, v: list[tuple[int, int]], c: np.ndarray, shift: int) -> None:
    """OpenCV's ``FillConvexPoly`` (8-connected, not anti-aliased) of points in ``shift`` fractional bits."""
    npts = len(v)
    if npts == 0:
        return
    h, w = img.shape[:2]
    delta = (1 << shift) >> 1
    delta1 = delta2 = XY_ONE >> 1
    p0 = (v[-1][0] << (XY_SHIFT - shift), v[-1][1] << (XY_SHIFT - shift))
    xmin = xmax = v[0][0]
    ymin = ymax = v[0][1]
    imin = 0
    for i, (px, py) in enumerate(v):
        if py < ymin:
            ymin, imin = py, i
        ymax, xmax, xmin = max(ymax, py), max(xmax, px), min(xmin, px)
        p = (px << (XY_SHIFT - shift), py << (XY_SHIFT - shift))
        if shift == 0:
            _line8(img, (p0[0] >> XY_SHIFT, p0[1] >> XY_SHIFT), (p[0] >> XY_SHIFT, p[1] >> XY_SHIFT), c)
        else:
            _line2(img, p0, p, c)
        p0 = p
    xmin, xmax = (xmin + delta) >> shift, (xmax + delta) >> shift
    ymin, ymax = (ymin + delta) >> shift, (ymax + delta) >> shift
    if npts < 3 or xmax < 0 or ymax < 0 or xmin >= w or ymin >= h:
        return
    ymax = min(ymax, h - 1)
    idx_ = [imin, imin]
    di = [1, npts - 1]
    ex = [-XY_ONE, -XY_ONE]
    edx = [0, 0]
    y = ymin
    ye = [y, y]
    edges = npts
    while True:
        for i in range(2):
            if y >= ye[i]:
                idx0 = idx_[i]
                idx = idx0 + di[i]
                if idx >= npts:
                    idx -= npts
                while True:
                    edges -= 1
                    if edges < 0:
                        break
                    ty = (v[idx][1] + delta) >> shift
                    if ty > y:
                        xs, xe = v[idx0][0], v[idx][0]
                        if shift != XY_SHIFT:
                            xs <<= XY_SHIFT - shift
                            xe <<= XY_SHIFT - shift
                        ye[i] = ty
                        edx[i] = _cdiv((xe - xs) * 2 + (ty - y), 2 * (ty - y))
                        ex[i] = xs
                        idx_[i] = idx
                        break
                    idx0 = idx
                    idx += di[i]
                    if idx >= npts:
                        idx -= npts
        if edges < 0:
            break
        if y >= 0:
            left, right = (1, 0) if ex[0] > ex[1] else (0, 1)
            xx1 = (ex[left] + delta1) >> XY_SHIFT
            xx2 = (ex[right] + delta2) >> XY_SHIFT
            if xx2 >= 0 and xx1 < w:
                img[y, max(xx1, 0):min(xx2, w - 1) + 1] = c
        ex[0] += edx[0]
        ex[1] += edx[1]
        y += 1
        if y > ymax:
            break


def fill_convex_poly(img: np.ndarray, points: Sequence[tuple[int, int]], color: Sequence[float]) -> np.ndarray:
    """``cv2.fillConvexPoly(img, points, color)`` (8-connected, shift 0), in place; returns ``img``."""
    _fill_convex(img, [(int(x), int(y)) for x, y in points], _color(img, color), 0)
    return img


def _circle(img: np.ndarray, cx: int, cy: int, radius: int, c: np.ndarray) -> None:
    h, w = img.shape[:2]
    err, dx, dy, plus, minus = 0, radius, 0, 1, (radius << 1) - 1
    while dx >= dy:
        for yy, x1, x2 in ((cy - dy, cx - dx, cx + dx), (cy + dy, cx - dx, cx + dx),
                           (cy - dx, cx - dy, cx + dy), (cy + dx, cx - dy, cx + dy)):
            if 0 <= yy < h and x1 < w and x2 >= 0:
                img[yy, max(x1, 0):min(x2, w - 1) + 1] = c
        dy += 1
        err += plus
        plus += 2
        mask = 0 if err <= 0 else -1
        err -= minus & mask
        dx += mask
        minus -= mask & 2


def circle(img: np.ndarray, center: tuple[int, int], radius: int, color: Sequence[float]) -> np.ndarray:
    """A filled ``cv2.circle(img, center, radius, color, thickness=-1)`` (8-connected), in place."""
    _circle(img, int(center[0]), int(center[1]), int(radius), _color(img, color))
    return img


def line(img: np.ndarray, p1: tuple[int, int], p2: tuple[int, int], color: Sequence[float],
         thickness: int = 1) -> np.ndarray:
    """``cv2.line(img, p1, p2, color, thickness)`` (8-connected, shift 0), in place."""
    c = _color(img, color)
    if thickness <= 1:
        _line8(img, (int(p1[0]), int(p1[1])), (int(p2[0]), int(p2[1])), c)
        return img
    # OpenCV 5 first clips a thick line to the image grown by its thickness on every side
    h, w = img.shape[:2]
    m = int(thickness)
    ok, ax, ay, bx, by = _clip_line(w + 2 * m, h + 2 * m, int(p1[0]) + m, int(p1[1]) + m, int(p2[0]) + m,
                                    int(p2[1]) + m)
    if not ok:
        return img
    x0, y0 = (ax - m) << XY_SHIFT, (ay - m) << XY_SHIFT
    x1, y1 = (bx - m) << XY_SHIFT, (by - m) << XY_SHIFT
    fdx, fdy = (x0 - x1) / XY_ONE, (y1 - y0) / XY_ONE
    r = fdx * fdx + fdy * fdy
    odd = thickness & 1
    t = thickness << (XY_SHIFT - 1)
    if abs(r) > np.finfo(np.float64).eps:
        r = (t + odd * XY_ONE * 0.5) / math.sqrt(r)
        dpx, dpy = _round(fdy * r), _round(fdx * r)
        quad = [(x0 + dpx, y0 + dpy), (x0 - dpx, y0 - dpy), (x1 - dpx, y1 - dpy), (x1 + dpx, y1 + dpy)]
        _fill_convex(img, quad, c, XY_SHIFT)
    rad = (t + (XY_ONE >> 1)) >> XY_SHIFT
    for px, py in ((x0, y0), (x1, y1)):
        _circle(img, (px + (XY_ONE >> 1)) >> XY_SHIFT, (py + (XY_ONE >> 1)) >> XY_SHIFT, rad, c)
    return img
