"""OpenPose maps: the people DWPose found (or an OpenPose JSON) drawn as sd-webui-controlnet draws them.

- ``people_from_keypoints(info)``: the extension's ``Wholebody.format_result``: each person's 134 OpenPose-ordered
  keypoints split into body (18), left hand (21), right hand (21) and face (68, plus the two eyes of the body as
  OpenPose's 69th and 70th); a keypoint scored below 0.3 is missing, and a part with none left is absent.
- ``draw(people, height, width, body=True, hands=True, face=True)``: the extension's ``draw_poses`` on a black
  canvas: each of the 17 limbs an ellipse (``cv2.ellipse2Poly`` of half the limb's length by 4, at the limb's
  angle in whole degrees, filled with its colour times 0.6), the body's keypoints as circles of radius 4, the hand's
  20 edges as lines 2 wide in HSV colours around the wheel and its keypoints as red circles of 4, the face's
  keypoints as white circles of 3. Coordinates are pixels, or fractions of the canvas when every keypoint of a part
  lies in [0, 1] (the extension's ``is_normalized``); hand and face points at 0.01 or less are left out. The
  shapes are OpenCV's own (:mod:`sdrt.pipelines.cvdraw`).
- ``to_json`` / ``from_json``: the extension's OpenPose JSON (``people`` with ``pose_keypoints_2d``,
  ``face_keypoints_2d``, ``hand_left_keypoints_2d``, ``hand_right_keypoints_2d`` as flat x, y, c lists;
  ``canvas_width``/``canvas_height``); a keypoint with c below 1 is missing when read back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from . import cvdraw

__all__ = ["Person", "draw", "from_json", "people_from_keypoints", "to_json"]

Point = tuple[float, float] | None

LIMBS = [(2, 3), (2, 6), (3, 4), (4, 5), (6, 7), (7, 8), (2, 9), (9, 10), (10, 11), (2, 12), (12, 13), (13, 14),
         (2, 1), (1, 15), (15, 17), (1, 16), (16, 18)]
COLORS = [(255, 0, 0), (255, 85, 0), (255, 170, 0), (255, 255, 0), (170, 255, 0), (85, 255, 0), (0, 255, 0),
          (0, 255, 85), (0, 255, 170), (0, 255, 255), (0, 170, 255), (0, 85, 255), (0, 0, 255), (85, 0, 255),
          (170, 0, 255), (255, 0, 255), (255, 0, 170), (255, 0, 85)]
HAND_EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 5), (5, 6), (6, 7), (7, 8), (0, 9), (9, 10), (10, 11), (11, 12),
              (0, 13), (13, 14), (14, 15), (15, 16), (0, 17), (17, 18), (18, 19), (19, 20)]
EPS = 0.01
#: the largest keypoint coordinate or confidence the JSON reader takes (pixels; far outside any canvas)
COORD_LIMIT = 1e6


@dataclass
class Person:
    body: list[Point]
    left_hand: list[Point] | None = None
    right_hand: list[Point] | None = None
    face: list[Point] | None = None


def _part(rows: np.ndarray) -> list[Point] | None:
    pts: list[Point] = [(float(x), float(y)) if s >= 0.3 else None for x, y, s in rows]
    return None if all(p is None for p in pts) else pts


def people_from_keypoints(info: np.ndarray | None) -> list[Person]:
    """The people of DWPose's ``(n, 134, 3)`` result, as the extension's ``format_result``."""
    if info is None:
        return []
    out = []
    for inst in np.asarray(info, np.float64):
        body = _part(inst[:18]) or [None] * 18
        face = _part(inst[24:92])
        if face is not None:
            face = face + [body[14], body[15]]
        out.append(Person(body, _part(inst[92:113]), _part(inst[113:134]), face))
    return out


def _normalized(points: Sequence[Point]) -> bool:
    flags = [0 <= abs(p[0]) <= 1 and 0 <= abs(p[1]) <= 1 for p in points if p is not None]
    return bool(flags) and all(flags)


def _hsv_color(h: float) -> tuple[float, float, float]:
    """matplotlib's ``hsv_to_rgb([h, 1, 1]) * 255``."""
    i = int(h * 6.0)
    f = h * 6.0 - i
    q, t = 1.0 * (1.0 - f), 1.0 * (1.0 - (1.0 - f))
    r, g, b = [(1.0, t, 0.0), (q, 1.0, 0.0), (0.0, 1.0, t), (0.0, q, 1.0), (t, 0.0, 1.0), (1.0, 0.0, q)][i % 6]
    return r * 255, g * 255, b * 255


def _draw_body(canvas: np.ndarray, body: list[Point]) -> None:
    h, w = (canvas.shape[0], canvas.shape[1]) if _normalized(body) else (1.0, 1.0)
    for (a, b), color in zip(LIMBS, COLORS):
        p1, p2 = body[a - 1], body[b - 1]
        if p1 is None or p2 is None:
            continue
        ys = np.array([p1[0], p2[0]]) * float(w)
        xs = np.array([p1[1], p2[1]]) * float(h)
        mx, my = np.mean(xs), np.mean(ys)
        length = ((xs[0] - xs[1]) ** 2 + (ys[0] - ys[1]) ** 2) ** 0.5
        angle = math.degrees(math.atan2(xs[0] - xs[1], ys[0] - ys[1]))
        poly = cvdraw.ellipse2poly((int(my), int(mx)), (int(length / 2), 4), int(angle), 0, 360, 1)
        cvdraw.fill_convex_poly(canvas, poly, [int(float(c) * 0.6) for c in color])
    for p, color in zip(body, COLORS):
        if p is not None:
            cvdraw.circle(canvas, (int(p[0] * w), int(p[1] * h)), 4, color)


def _draw_hand(canvas: np.ndarray, hand: list[Point] | None) -> None:
    if not hand:
        return
    h, w = (canvas.shape[0], canvas.shape[1]) if _normalized(hand) else (1.0, 1.0)
    for ie, (e1, e2) in enumerate(HAND_EDGES):
        k1, k2 = hand[e1], hand[e2]
        if k1 is None or k2 is None:
            continue
        x1, y1, x2, y2 = int(k1[0] * w), int(k1[1] * h), int(k2[0] * w), int(k2[1] * h)
        if x1 > EPS and y1 > EPS and x2 > EPS and y2 > EPS:
            cvdraw.line(canvas, (x1, y1), (x2, y2), _hsv_color(ie / float(len(HAND_EDGES))), 2)
    for p in hand:
        if p is not None:
            x, y = int(p[0] * w), int(p[1] * h)
            if x > EPS and y > EPS:
                cvdraw.circle(canvas, (x, y), 4, (0, 0, 255))


def _draw_face(canvas: np.ndarray, face: list[Point] | None) -> None:
    if not face:
        return
    h, w = (canvas.shape[0], canvas.shape[1]) if _normalized(face) else (1.0, 1.0)
    for p in face:
        if p is not None:
            x, y = int(p[0] * w), int(p[1] * h)
            if x > EPS and y > EPS:
                cvdraw.circle(canvas, (x, y), 3, (255, 255, 255))


def draw(people: Sequence[Person], height: int, width: int, *, body: bool = True, hands: bool = True,
         face: bool = True) -> np.ndarray:
    """The pose map ``(height, width, 3)`` uint8 RGB of ``people``, as the extension's ``draw_poses``."""
    canvas = np.zeros((int(height), int(width), 3), np.uint8)
    for p in people:
        if body:
            _draw_body(canvas, p.body)
        if hands:
            _draw_hand(canvas, p.left_hand)
            _draw_hand(canvas, p.right_hand)
        if face:
            _draw_face(canvas, p.face)
    return canvas


# ------------------------------------------------------------------------------------------ JSON
def _flat(points: list[Point] | None) -> list[float] | None:
    if not points:
        return None
    return [v for p in points for v in ([float(p[0]), float(p[1]), 1.0] if p is not None else [0.0, 0.0, 0.0])]


def to_json(people: Sequence[Person], height: int, width: int) -> dict[str, Any]:
    """The extension's OpenPose JSON (``encode_poses_as_json``) of ``people`` on a ``width x height`` canvas."""
    return {"people": [{"pose_keypoints_2d": _flat(p.body), "face_keypoints_2d": _flat(p.face),
                        "hand_left_keypoints_2d": _flat(p.left_hand),
                        "hand_right_keypoints_2d": _flat(p.right_hand)} for p in people],
            "animals": [], "canvas_height": int(height), "canvas_width": int(width)}


def _unflat(values: Any, where: str) -> list[Point] | None:
    if not values:
        return None
    if not isinstance(values, (list, tuple)) or len(values) % 3 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise InputError(f"{where} is not a flat list of x, y, confidence numbers", where=where,
                         fix="give 3 numbers per keypoint, as OpenPose's JSON does")
    # compared as given (a 400-digit integer is no float); NaN fails it; beyond, a limb's length overflows
    if not all(abs(v) <= COORD_LIMIT for v in values):
        raise InputError(f"{where} holds a number that is not finite or beyond +-{COORD_LIMIT:.0e}", where=where,
                         fix="give keypoints in pixels of the canvas (or fractions of it), confidences from 0 to 1")
    return [(float(values[i]), float(values[i + 1])) if values[i + 2] >= 1.0 else None
            for i in range(0, len(values), 3)]


def from_json(pose: Mapping[str, Any], where: str = "pose") -> tuple[list[Person], int, int]:
    """``(people, height, width)`` from the extension's OpenPose JSON (``decode_json_as_poses``); an
    ``InputError`` naming the field for anything it cannot read."""
    if not isinstance(pose, Mapping):
        raise InputError(f"{where} is not a JSON object", where=where,
                         fix="pass {'people': [...], 'canvas_width': W, 'canvas_height': H}")
    sizes = []
    for key in ("canvas_height", "canvas_width"):
        v = pose.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1 <= v <= 8192 or not float(v).is_integer():
            raise InputError(f"{where}.{key} is {v!r:.40}, not a size from 1 to 8192", where=f"{where}.{key}",
                             fix=f"give {key} in pixels")
        sizes.append(int(v))
    people = pose.get("people", [])
    if not isinstance(people, list):
        raise InputError(f"{where}.people is not a list", where=f"{where}.people", fix="give a list of people")
    out = []
    for i, p in enumerate(people):
        w = f"{where}.people[{i}]"
        if not isinstance(p, Mapping):
            raise InputError(f"{w} is not an object", where=w, fix="give each person's keypoint lists")
        body = _unflat(p.get("pose_keypoints_2d"), f"{w}.pose_keypoints_2d")
        if body is not None and len(body) != 18:
            raise InputError(f"{w}.pose_keypoints_2d has {len(body)} keypoints, not OpenPose's 18",
                             where=f"{w}.pose_keypoints_2d", fix="give 18 body keypoints (54 numbers)")
        hands = []
        for key in ("hand_left_keypoints_2d", "hand_right_keypoints_2d"):
            hand = _unflat(p.get(key), f"{w}.{key}")
            if hand is not None and len(hand) != 21:
                raise InputError(f"{w}.{key} has {len(hand)} keypoints, not 21", where=f"{w}.{key}",
                                 fix="give 21 hand keypoints (63 numbers)")
            hands.append(hand)
        out.append(Person(body if body is not None else [None] * 18, hands[0], hands[1],
                          _unflat(p.get("face_keypoints_2d"), f"{w}.face_keypoints_2d")))
    return out, sizes[0], sizes[1]
