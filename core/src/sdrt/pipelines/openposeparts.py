"""OpenPose with hands and face: the extension's ``OpenposeDetector.detect_poses`` over sdrt's three networks.

The body network (:mod:`sdrt.pipelines.openposebody`) finds the people; for each, with ``hands``, the hand boxes
(:func:`sdrt.pipelines.openposehand.hand_boxes`) are cropped from the image (BGR) and their 21 keypoints found
by the hand network; with ``face``, the face box (:func:`sdrt.pipelines.openposeface.face_box`) and its
keypoints by the face network. Keypoints come back as fractions of the image, as the extension's: a hand or face
keypoint at 0 in its crop is -1 pixel (drawn nowhere, written to the JSON as it is), and hand and face values are
float32 (``(x + box) / width`` in float32), so ``posemaps.draw`` scales them back in float32 as the extension's
``draw_handpose`` / ``draw_facepose`` do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DRAWN", "OpenPoseParts", "detect"]

#: what each module draws (body, hands, face); the body model runs for all (it finds the hands and faces)
DRAWN = {"openpose_hand": (True, True, False), "openpose_face": (True, False, True),
         "openpose_faceonly": (False, False, True), "openpose_full": (True, True, True)}


def _fractions(peaks: np.ndarray, x: int, y: int, height: int, width: int) -> list[tuple[Any, Any]]:
    p = np.asarray(peaks, np.float32)
    px = np.where(p[:, 0] < 1e-6, np.float32(-1), p[:, 0] + np.float32(x)) / np.float32(width)
    py = np.where(p[:, 1] < 1e-6, np.float32(-1), p[:, 1] + np.float32(y)) / np.float32(height)
    return [(np.float32(a), np.float32(b)) for a, b in zip(px.astype(np.float32), py.astype(np.float32))]


def detect(rgb: np.ndarray, body: Any, hand: Any = None, face: Any = None) -> list[Any]:
    """The people of an RGB uint8 image as :class:`sdrt.pipelines.posemaps.Person`: ``body`` an
    :class:`~sdrt.pipelines.openposebody.OpenPoseBody`, ``hand`` a :class:`~sdrt.pipelines.openposehand.HandNet`
    (None: no hands), ``face`` a :class:`~sdrt.pipelines.openposeface.FaceNet` (None: no face)."""
    from .openposeface import face_box
    from .openposehand import hand_boxes
    from .posemaps import Person

    candidate, subset = body.body(rgb)
    h, w = rgb.shape[:2]
    bgr = np.ascontiguousarray(rgb[:, :, ::-1])
    out = []
    for person in subset:
        pixels = [None if i == -1 else (float(candidate[i][0]), float(candidate[i][1]))
                  for i in person[:18].astype(int)]
        left = right = face_points = None
        if hand is not None:
            for x, y, side, is_left in hand_boxes(pixels, h, w):
                found = _fractions(hand.peaks(bgr[y:y + side, x:x + side]), x, y, h, w)
                if is_left:
                    left = found
                else:
                    right = found
        if face is not None:
            box = face_box(pixels, h, w)
            if box is not None:
                x, y, side = box
                peaks = face.peaks(bgr[y:y + side, x:x + side])
                if peaks.ndim == 2 and peaks.shape[1] == 2:
                    face_points = _fractions(peaks, x, y, h, w)
        body_points = [None if p is None else (p[0] / float(w), p[1] / float(h)) for p in pixels]
        out.append(Person(body_points, left, right, face_points))
    return out


class OpenPoseParts:
    """One of the extension's ``openpose_hand`` / ``openpose_face`` / ``openpose_faceonly`` / ``openpose_full``
    over already compiled networks: ``people(rgb)`` finds what the module detects, ``drawn`` says what its map
    shows (body, hands, face)."""

    def __init__(self, name: str, body: Any, hand: Any = None, face: Any = None) -> None:
        self.name, self.body, self.hand, self.face = name, body, hand, face
        self.drawn = DRAWN[name]

    def people(self, rgb: np.ndarray) -> list[Any]:
        return detect(rgb, self.body, self.hand, self.face)
