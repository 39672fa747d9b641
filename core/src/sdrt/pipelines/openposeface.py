"""OpenPose (face): sd-webui-controlnet's face estimation, lllyasviel's ``facenet.pth`` run through sdrt.

The file (the face network as PyTorch weights: the hand network's trunk, a first stage and 5 refinement stages of
71 heatmaps) is built as an ONNX graph with :func:`sdrt.pipelines.openposehand.build_graph`. Around it, numpy
follows the extension's ``annotator/openpose/face.py`` and ``util.faceDetect``:

- the box (``face_box``): around the nose, as wide as the largest of 3 times the nose-to-eye and 1.5 times the
  nose-to-ear distance (the larger of x and y) on each side, clipped to the image, kept from 20 pixels;
- the BGR crop resized to 384 x 384 with ``smart_resize`` (INTER_AREA shrinking, Lanczos-4 growing), read as
  ``x / 256 - 0.5``; the last stage's 71 heatmaps (48 x 48) resized to the crop as torch's
  ``F.interpolate(mode="bilinear", align_corners=True)`` does in float32 (:func:`bilinear_corners`);
- the keypoints: each map whose largest value is above 0.05 gives its first largest pixel (x, y); the others are
  left out, so a face has from 0 to 71 keypoints, in map order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .openposehand import CpmNet

__all__ = ["FACE_FILE", "FaceNet", "bilinear_corners", "face_box", "peaks_of"]

FACE_FILE = "facenet.pth"
SIZE = 384
THRESHOLD = 0.05


def face_box(keypoints: Sequence[tuple[float, float] | None], height: int, width: int
             ) -> tuple[int, int, int] | None:
    """The extension's ``faceDetect``: ``(x, y, side)`` of one person's face from its 18 body keypoints (pixels,
    None where missing), or None without the nose or all of eyes and ears, or under 20 pixels."""
    head = keypoints[0]
    if head is None or all(keypoints[i] is None for i in (14, 15, 16, 17)):
        return None
    side = 0.0
    x0, y0 = head
    for i, ratio in ((14, 3.0), (15, 3.0), (16, 1.5), (17, 1.5)):
        if keypoints[i] is not None:
            x1, y1 = keypoints[i]
            side = max(side, max(abs(x0 - x1), abs(y0 - y1)) * ratio)
    x, y = x0 - side, y0 - side
    x, y = max(x, 0), max(y, 0)
    side1 = width - x if x + side > width else side * 2
    side2 = height - y if y + side > height else side * 2
    side = min(side1, side2)
    return (int(x), int(y), int(side)) if side >= 20 else None


def _corners_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """torch's align_corners=True linear indices and weights (float32: scale ``(src-1)/(dst-1)``, source
    ``scale * i``, ``lambda1 = source - floor``)."""
    f32 = np.float32
    scale = f32(src - 1) / f32(dst - 1) if dst > 1 else f32(0)
    real = scale * np.arange(dst, dtype=np.float32)
    i0 = real.astype(np.int64)
    i1 = np.minimum(i0 + 1, src - 1)
    l1 = np.clip(real - i0.astype(np.float32), f32(0), f32(1)).astype(np.float32)
    l0 = (f32(1) - l1).astype(np.float32)
    return i0, i1, l0, l1


def bilinear_corners(maps: np.ndarray, height: int, width: int) -> np.ndarray:
    """``F.interpolate(maps[None], (height, width), mode="bilinear", align_corners=True)[0]`` of float32 planes
    ``(C, h, w)``: per output pixel ``h0l * (w0l * a + w1l * b) + h1l * (w0l * c + w1l * d)`` in float32."""
    a = np.asarray(maps, np.float32)
    y0, y1, hl0, hl1 = _corners_axis(a.shape[1], height)
    x0, x1, wl0, wl1 = _corners_axis(a.shape[2], width)
    top = a[:, y0]
    bottom = a[:, y1]
    t = top[:, :, x0] * wl0 + top[:, :, x1] * wl1
    b = bottom[:, :, x0] * wl0 + bottom[:, :, x1] * wl1
    return (t * hl0[:, None] + b * hl1[:, None]).astype(np.float32)


def peaks_of(heatmaps: np.ndarray) -> np.ndarray:
    """face.py's ``compute_peaks_from_heatmaps``: ``(n, 2)`` (x, y) of the maps whose largest value is above 0.05
    (the first such pixel in raster order), in map order; ``(0,)`` when none is."""
    out = []
    for m in heatmaps:
        flat = int(np.argmax(m))
        if m.flat[flat] > THRESHOLD:
            out.append([flat % m.shape[1], flat // m.shape[1]])
    return np.array(out)


class FaceNet(CpmNet):
    """``facenet.pth`` compiled on one backend; ``peaks(bgr)`` -> the keypoints of a face crop."""

    FILE = FACE_FILE
    OUT = 71
    PART = "face"
    WHAT = "OpenPose's face model"
    FIX = f"pass lllyasviel's {FACE_FILE}"

    def heatmaps(self, bgr: np.ndarray) -> np.ndarray:
        """The ``(71, H, W)`` float32 heatmaps of a BGR uint8 crop, at its size."""
        from .openposebody import _smart_resize

        h, w = bgr.shape[:2]
        x = _smart_resize(bgr, SIZE, SIZE, float(SIZE + SIZE) / float(h + w))
        inp = x.transpose(2, 0, 1)[None].astype(np.float32) / np.float32(256) - np.float32(0.5)
        return bilinear_corners(self.run(inp), h, w)

    def peaks(self, bgr: np.ndarray) -> np.ndarray:
        return peaks_of(self.heatmaps(bgr))
