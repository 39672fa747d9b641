"""DWPose: whole-body keypoints from the two ONNX files sd-webui-controlnet and ComfyUI's controlnet_aux run.

``yolox_l.onnx`` finds people and ``dw-ll_ucoco_384.onnx`` (RTMPose, 133 COCO-WholeBody keypoints, SimCC outputs)
places their keypoints. Both graphs run through sdrt's backends like any ONNX graph (``sdrt.load``); everything
around them is numpy and follows the extension's ``annotator/openpose`` (``cv_ox_det``, ``cv_ox_pose``,
``wholebody``), step for step and dtype for dtype:

- the detector's input: the image (RGB, as the extension passes it) scaled by ``r = min(640 / h, 640 / w)`` with
  OpenCV's 8-bit bilinear resize, sides ``int(side * r)``, on a 640x640 canvas of 114, float32 CHW, no
  normalisation;
- its output ``(1, 8400, 85)``: YOLOX's grid decode (strides 8, 16, 32; centres ``(out + grid) * stride``, sizes
  ``exp(out) * stride``), scores ``objectness * class``, class-aware NMS (IoU 0.45, scores above 0.1) and the
  people kept above 0.3;
- each person's box: centre and scale (padding 1.25, aspect 288:384), the affine crop to 288x384 (OpenCV 5's
  float bilinear ``warpAffine``, zero outside), normalised with ImageNet's mean and std;
- the pose output: SimCC argmax on ``simcc_x`` (576 bins) and ``simcc_y`` (768), the lower of the two maxima as
  the score (-1 positions where it is not above 0), bins halved and mapped back through the box;
- the 133 keypoints to OpenPose's order: a neck between the shoulders (visible when both are above 0.3) inserted
  at 17, then COCO's body reordered into OpenPose's 18 (134 points: body 0-17, feet 18-23, face 24-91, left hand
  92-112, right hand 113-133).

A detector that finds nobody gives no people (a black map); a detector whose boxes are all another class (the
extension's ``det_result`` is then empty, not ``None``) runs the pose model on the whole image, as the extension
does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cvresize import resample

__all__ = ["DET_FILE", "POSE_FILE", "DWPose", "find_files", "letterbox", "warp_affine"]

DET_FILE = "yolox_l.onnx"
POSE_FILE = "dw-ll_ucoco_384.onnx"
DET_SIZE = (640, 640)
POSE_SIZE = (288, 384)  # (w, h)
_MEAN = np.array([123.675, 116.28, 103.53])
_STD = np.array([58.395, 57.12, 57.375])


# ------------------------------------------------------------------------------------------ files
def find_files(where: str | Path | Sequence[str | Path], *, what: str = "dwpose") -> tuple[Path, Path]:
    """``(yolox_l.onnx, dw-ll_ucoco_384.onnx)``: ``where`` is a folder holding both (or one of the extension's /
    ComfyUI's layouts under it), or the two files; an ``InputError`` naming every place looked in otherwise."""
    from .annotators import find

    det, pose = find("dw_openpose_full", where, what)
    return det, pose


# ------------------------------------------------------------------------------------------ OpenCV's resamplers
def warp_affine(a: np.ndarray, m: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.warpAffine(a, m, (width, height), flags=cv2.INTER_LINEAR)`` as OpenCV 5 computes it: ``m`` inverted
    in doubles, source positions and bilinear weights in float32, zero outside, rounded half to even."""
    m = np.asarray(m, np.float64)
    d = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    d = 1.0 / d if d != 0 else 0.0
    a11, a22, a12, a21 = m[1, 1] * d, m[0, 0] * d, -m[0, 1] * d, -m[1, 0] * d
    b1 = -a11 * m[0, 2] - a12 * m[1, 2]
    b2 = -a21 * m[0, 2] - a22 * m[1, 2]
    inv = np.array([[a11, a12, b1], [a21, a22, b2]]).astype(np.float32)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    sx = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]
    sy = inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
    x0, y0 = np.floor(sx), np.floor(sy)
    fx, fy = (sx - x0)[..., None], (sy - y0)[..., None]
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    h, w = a.shape[:2]

    def tap(yy: np.ndarray, xx: np.ndarray) -> np.ndarray:  # gathered, then float32 (not the whole photo a crop)
        ok = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        v = a[np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)].astype(np.float32)
        return np.where(ok[..., None], v, np.float32(0))

    one = np.float32(1)
    v = (tap(y0, x0) * (one - fx) + tap(y0, x0 + 1) * fx) * (one - fy) \
        + (tap(y0 + 1, x0) * (one - fx) + tap(y0 + 1, x0 + 1) * fx) * fy
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)


def _affine_from_points(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``cv2.getAffineTransform``: the 2x3 matrix taking three float32 points to three others (6x6 solve)."""
    a = np.zeros((6, 6))
    b = np.zeros(6)
    for i in range(3):
        a[2 * i, 0:3] = [src[i, 0], src[i, 1], 1]
        a[2 * i + 1, 3:6] = [src[i, 0], src[i, 1], 1]
        b[2 * i], b[2 * i + 1] = dst[i, 0], dst[i, 1]
    return np.linalg.solve(a, b).reshape(2, 3)


# ------------------------------------------------------------------------------------------ the detector
def letterbox(rgb: np.ndarray) -> tuple[np.ndarray, float]:
    """``(1x3x640x640 float32, ratio)``: the detector's input as the extension's ``cv_ox_det.preprocess`` makes it."""
    h, w = rgb.shape[:2]
    r = min(DET_SIZE[0] / h, DET_SIZE[1] / w)
    canvas = np.full((DET_SIZE[0], DET_SIZE[1], 3), 114, np.uint8)
    nh, nw = int(h * r), int(w * r)
    canvas[:nh, :nw] = resample(rgb, nw, nh, "linear")  # cv2.resize, INTER_LINEAR
    return np.ascontiguousarray(canvas.transpose(2, 0, 1), dtype=np.float32)[None], r


def _grid_decode(out: np.ndarray) -> np.ndarray:
    grids, strides = [], []
    for stride in (8, 16, 32):
        hs, ws = DET_SIZE[0] // stride, DET_SIZE[1] // stride
        xv, yv = np.meshgrid(np.arange(ws), np.arange(hs))
        grids.append(np.stack((xv, yv), 2).reshape(1, -1, 2))
        strides.append(np.full((1, hs * ws, 1), stride))
    grid = np.concatenate(grids, 1)
    stride_all = np.concatenate(strides, 1)
    out = out.copy()
    out[..., :2] = (out[..., :2] + grid) * stride_all
    out[..., 2:4] = np.exp(out[..., 2:4]) * stride_all
    return out


def _nms(boxes: np.ndarray, scores: np.ndarray, thr: float) -> list[int]:
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(int(i))
        xx1 = np.maximum(x1[i], x1[order[1:]])
        yy1 = np.maximum(y1[i], y1[order[1:]])
        xx2 = np.minimum(x2[i], x2[order[1:]])
        yy2 = np.minimum(y2[i], y2[order[1:]])
        inter = np.maximum(0.0, xx2 - xx1 + 1) * np.maximum(0.0, yy2 - yy1 + 1)
        ovr = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[np.where(ovr <= thr)[0] + 1]
    return keep


def people(output: np.ndarray, ratio: float, classes: Sequence[int] = (0,)) -> np.ndarray | None:
    """The people's boxes ``(n, 4)`` x0 y0 x1 y1 in image pixels from the detector's ``(1, 8400, 85)`` output;
    None when no box of any class is above 0.1 (the extension's ``det_result is None``). ``classes``: the COCO
    classes kept (the animal pose's 14 to 23), class by class in that order, as the extension's ``np.isin``."""
    pred = _grid_decode(np.asarray(output, np.float32))[0]
    boxes = pred[:, :4]
    scores = pred[:, 4:5] * pred[:, 5:]
    xyxy = np.ones_like(boxes)
    xyxy[:, 0] = boxes[:, 0] - boxes[:, 2] / 2.0
    xyxy[:, 1] = boxes[:, 1] - boxes[:, 3] / 2.0
    xyxy[:, 2] = boxes[:, 0] + boxes[:, 2] / 2.0
    xyxy[:, 3] = boxes[:, 1] + boxes[:, 3] / 2.0
    xyxy /= ratio
    found = False
    kept = [np.zeros((0, 4))]
    for cls in range(scores.shape[1]):  # class-aware NMS; only the people are kept after it
        s = scores[:, cls]
        mask = s > 0.1
        if not mask.any():
            continue
        vb, vs = xyxy[mask], s[mask]
        keep = _nms(vb, vs, 0.45)
        if keep:
            found = True
            if cls in classes:
                kb = vb[keep].astype(np.float64)
                kept.append(kb[vs[keep] > 0.3])
    return np.concatenate(kept) if found else None


# ------------------------------------------------------------------------------------------ the pose model
def _center_scale(box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x1, y1, x2, y2 = (np.array([v]) for v in box)
    center = np.hstack([x1 + x2, y1 + y2]) * 0.5
    scale = np.hstack([x2 - x1, y2 - y1]) * 1.25
    return center, scale


def crop(rgb: np.ndarray, box: np.ndarray, size: tuple[int, int] = POSE_SIZE
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(384x288x3 float64 normalised crop, center, scale)`` of one box, as ``cv_ox_pose.preprocess``; ``size``:
    the model's ``(w, h)`` (the animal pose's 256x256)."""
    w, h = size
    center, scale = _center_scale(np.asarray(box, np.float64))
    sw, sh = scale[0], scale[1]
    aspect = w / h
    scale = np.array([sw, sw / aspect]) if sw > sh * aspect else np.array([sh * aspect, sh])
    src = np.zeros((3, 2), np.float32)
    src[0] = center
    src[1] = center + np.array([0.0, scale[0] * -0.5])
    d = src[0] - src[1]
    src[2] = src[1] + np.r_[-d[1], d[0]]
    dst = np.zeros((3, 2), np.float32)
    dst[0] = [w * 0.5, h * 0.5]
    dst[1] = np.array([w * 0.5, h * 0.5]) + np.array([0.0, w * -0.5])
    d = dst[0] - dst[1]
    dst[2] = dst[1] + np.r_[-d[1], d[0]]
    m = _affine_from_points(src, dst)
    img = warp_affine(rgb, m, w, h)
    return (img - _MEAN) / _STD, center, scale


def simcc_decode(simcc_x: np.ndarray, simcc_y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(keypoints (n, k, 2) in input pixels, scores (n, k))`` from SimCC logits: argmax on each axis, the lower
    maximum as the score, -1 where it is not above 0, bins halved (split ratio 2)."""
    n, k, _ = simcc_x.shape
    x = simcc_x.reshape(n * k, -1)
    y = simcc_y.reshape(n * k, -1)
    locs = np.stack((np.argmax(x, axis=1), np.argmax(y, axis=1)), axis=-1).astype(np.float32)
    vx, vy = np.amax(x, axis=1), np.amax(y, axis=1)
    vals = np.where(vx > vy, vy, vx)
    locs[vals <= 0.0] = -1
    return locs.reshape(n, k, 2) / 2.0, vals.reshape(n, k)


def to_openpose(keypoints: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``(n, 134, 3)`` x, y, score in OpenPose's order from ``(n, 133, 2)`` and ``(n, 133)``: the neck (mean of the
    shoulders; score 1 when both are above 0.3, else 0) inserted at 17, the body moved to OpenPose's 18."""
    info = np.concatenate((keypoints, scores[..., None]), axis=-1)
    neck = np.mean(info[:, [5, 6]], axis=1)
    neck[:, 2:4] = np.logical_and(info[:, 5, 2:4] > 0.3, info[:, 6, 2:4] > 0.3).astype(int)
    out = np.insert(info, 17, neck, axis=1)
    mm = [17, 6, 8, 10, 7, 9, 12, 14, 16, 13, 15, 2, 1, 4, 3]
    op = [1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17]
    out[:, op] = out[:, mm]
    return out


class DWPose:
    """The two DWPose graphs compiled on one backend; ``dw(rgb)`` -> ``(n, 134, 3)`` keypoints in OpenPose's order
    (pixels of ``rgb``), or None when nobody is found."""

    def __init__(self, det: str | Path, pose: str | Path, *, backend: str = "auto", device: Any = None) -> None:
        from ..runtime import load

        self.files = (Path(det), Path(pose))
        from .netgraph import fp32_options

        fp32 = fp32_options(backend, device)  # as the extension runs them: keypoints move at bf16
        self.det = load(str(det), backend=backend, device=device, shapes=_static(det, DET_FILE), **fp32)
        self.pose = load(str(pose), backend=backend, device=device, shapes=_static(pose, POSE_FILE), **fp32)
        self._check()

    @classmethod
    def from_files(cls, where: str | Path | Sequence[str | Path], *, backend: str = "auto", device: Any = None,
                   what: str = "dwpose") -> DWPose:
        det, pose = find_files(where, what=what)
        return cls(det, pose, backend=backend, device=device)

    def _check(self) -> None:
        from ..errors import ModelError

        d_out = self.det.outputs[0].shape
        if len(self.det.inputs) != 1 or len(d_out) != 3 or d_out[-1] != 85:
            raise ModelError(f"{self.files[0]} is not a YOLOX COCO detector (outputs {d_out}, want (1, 8400, 85))",
                             where=str(self.files[0]), fix=f"pass DWPose's {DET_FILE}")
        outs = [o.shape for o in self.pose.outputs]
        if len(self.pose.inputs) != 1 or len(outs) != 2 or outs[0][-1] != 576 or outs[1][-1] != 768:
            raise ModelError(f"{self.files[1]} is not DWPose's 384x288 SimCC model (outputs {outs})",
                             where=str(self.files[1]), fix=f"pass DWPose's {POSE_FILE}")

    def close(self) -> None:
        for s in (self.det, self.pose):
            s.close()

    def __enter__(self) -> DWPose:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def detect(self, rgb: np.ndarray) -> np.ndarray | None:
        h, w = rgb.shape[:2]
        r = min(DET_SIZE[0] / h, DET_SIZE[1] / w)
        if int(h * r) == 0 or int(w * r) == 0:  # over 640:1, a side shrinks to nothing: nobody to see
            return None
        x, ratio = letterbox(rgb)
        out = self.det.run({self.det.inputs[0].name: x})
        return people(out[self.det.outputs[0].name], ratio)

    def keypoints(self, rgb: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h, w = rgb.shape[:2]
        if len(boxes) == 0:
            boxes = np.array([[0, 0, w, h]], np.float64)
        keys, scores = [], []
        name = self.pose.inputs[0].name
        for box in boxes:
            img, center, scale = crop(rgb, box)
            x = np.stack([img], axis=0).transpose(0, 3, 1, 2).astype(np.float32)
            out = self.pose.run({name: x})
            sx, sy = (out[o.name] for o in self.pose.outputs)
            k, s = simcc_decode(sx, sy)
            k = k / POSE_SIZE * scale + center - scale / 2
            keys.append(k[0])
            scores.append(s[0])
        return np.array(keys), np.array(scores)

    def __call__(self, rgb: np.ndarray) -> np.ndarray | None:
        boxes = self.detect(rgb)
        if boxes is None:
            return None
        keys, scores = self.keypoints(rgb, boxes)
        return to_openpose(keys, scores)


def _static(path: str | Path, kind: str, fix: str | None = None) -> dict[str, int] | None:
    """Batch dims pinned to 1 (the files are exported with a symbolic batch, or none); ``fix``: what to download
    when the file cannot be read (default: DWPose's ``kind`` again)."""
    import onnx

    try:
        m = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and the like: a cut-short or other file
        from ..errors import ModelError

        raise ModelError(f"{path} could not be read as an ONNX graph ({type(exc).__name__}: {str(exc):.80})",
                         where=str(path), fix=fix or f"download DWPose's {kind} again (yzd-v/DWPose)") from None
    dims = {}
    for inp in m.graph.input:
        for d in inp.type.tensor_type.shape.dim:
            if d.dim_param:
                dims[d.dim_param] = 1
    return dims or None
