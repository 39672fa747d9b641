"""Faces as InsightFace finds and encodes them, from its own ONNX files, in numpy and sdrt's backends.

IP-Adapter FaceID reads the normed 512-d ArcFace embedding of a face, as ``insightface``'s ``FaceAnalysis``
(``buffalo_l``, ``det_size=(640, 640)``) gives it; FaceID Plus also reads a CLIP encoding of the face aligned to
224x224. sdrt runs InsightFace's files as any ONNX graph, on the pipeline's backend, and does the rest here:

- ``det_10g.onnx`` (SCRFD, input ``1x3xHxW``; nine outputs: scores, box distances and 5-point distances for
  strides 8, 16 and 32, two anchors a place): the BGR picture resized into the top-left of a 640x640 canvas
  (aspect kept, OpenCV's bilinear resize), ``(x - 127.5) / 128`` in RGB order; anchors at ``stride * (column,
  row)``, boxes by ``distance2bbox``, points by ``distance2kps``, scores from 0.5, NMS at IoU 0.4 (boxes ``+1``
  inclusive, as SCRFD's ``nms``), faces by score, best first (``faces[0]``, the face h94's examples and
  sd-webui-controlnet use);
- ``w600k_r50.onnx`` (ArcFace, ``1x3x112x112`` -> ``1x512``): the face aligned by ``norm_crop`` (the similarity
  transform of its 5 points onto ArcFace's template, least squares as scikit-image's ``SimilarityTransform``
  (Umeyama), then OpenCV's ``warpAffine``, bilinear, black outside, as OpenCV 5 computes it in float32), ``(x - 127.5) / 127.5`` in
  RGB order (a graph whose first nodes are named ``Sub`` and ``Mul`` normalizes itself: 0 and 1, as
  insightface's ``ArcFaceONNX`` decides); the output divided by its norm.

InstantID reads InsightFace's ``antelopev2`` pack instead (``scrfd_10g_bnkps.onnx``, the same SCRFD outputs, and
``glintr100.onnx``, an ArcFace of the same template): the ``embedding`` as it comes (not normed) of the largest face
(by box area, as InstantX's examples and sd-webui-controlnet pick it), and that face's 5 points for its ControlNet's
keypoint map (:func:`draw_kps`).

InsightFace reads BGR pictures (``cv2.imread``'s order; its graphs then swap to RGB): sdrt hands it the RGB
picture turned to BGR, as h94's examples do, and aligns the CLIP crop from the RGB picture.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelError
from .cvresize import resample

log = logging.getLogger("sdrt.pipelines.faces")

__all__ = ["Face", "FaceModels", "draw_kps", "find_face_models", "largest", "norm_crop", "similarity", "warp_affine"]

DETECTOR, RECOGNIZER = "det_10g.onnx", "w600k_r50.onnx"
#: InsightFace's model packs: (detector, recognizer) files
PACKS = {"buffalo_l": (DETECTOR, RECOGNIZER), "antelopev2": ("scrfd_10g_bnkps.onnx", "glintr100.onnx")}
DET_SIZE = 640
DET_THRESH, NMS_THRESH = 0.5, 0.4
STRIDES = (8, 16, 32)
#: ArcFace's 5-point template for a 112x112 crop (eyes, nose, mouth corners)
ARCFACE_DST = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655],
                        [70.7299, 92.2041]], np.float32)
#: where the tools keep buffalo_l, under a models folder (sd-webui-controlnet's, ComfyUI's, insightface's own)
LAYOUTS = ("annotator/downloads/insightface/models/buffalo_l", "insightface/models/buffalo_l", "models/buffalo_l",
           "buffalo_l")
FACE_FIX = ("InsightFace's buffalo_l folder (det_10g.onnx and w600k_r50.onnx, as sd-webui-controlnet keeps it in "
            "extensions/sd-webui-controlnet/annotator/downloads/insightface/models/buffalo_l and ComfyUI in "
            "models/insightface/models/buffalo_l)")


@dataclass
class Face:
    """A detected face: ``bbox`` (x1, y1, x2, y2 in the picture's pixels), its ``score`` and 5 points ``kps``."""

    bbox: np.ndarray
    score: float
    kps: np.ndarray


def face_fix(pack: str) -> str:
    """Where the tools keep InsightFace's ``pack`` (the fix of a missing one)."""
    if pack == "buffalo_l":
        return FACE_FIX
    det, rec = PACKS[pack]
    return (f"InsightFace's {pack} folder ({det} and {rec}, as sd-webui-controlnet keeps it in extensions/"
            f"sd-webui-controlnet/annotator/downloads/insightface/models/{pack} and ComfyUI in "
            f"models/insightface/models/{pack})")


def find_face_models(path: Any, where: str = "face_models", pack: str = "buffalo_l") -> Path:
    """The ``pack`` folder (InsightFace's buffalo_l, or antelopev2) ``path`` is or holds (in one of :data:`LAYOUTS`,
    the pack's name for buffalo_l's); InputError on ``where`` otherwise."""
    p = Path(path)
    det, rec = PACKS[pack]
    for cand in (p, *(p / sub.replace("buffalo_l", pack) for sub in LAYOUTS)):
        if (cand / det).is_file() and (cand / rec).is_file():
            return cand
    if p.is_file():
        raise InputError(f"{p} is a file, not InsightFace's {pack} folder", where=where,
                         fix="pass {@" + where + "} the folder that holds " + f"{det} and {rec} "
                             f"({p.parent}, if it holds both)")
    have = p.is_dir()
    missing = [n for n in (det, rec) if not (p / n).is_file()]
    raise InputError(f"{p} " + (f"holds no {' and no '.join(missing)}" if have else "does not exist"),
                     where=where, fix="pass {@" + where + "} " + face_fix(pack))


def similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 2x3 similarity transform (rotation, uniform scale, shift) taking ``src`` points nearest to ``dst`` in
    least squares (Umeyama 1991, as scikit-image's ``SimilarityTransform.estimate``), in float64."""
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    n, d = src.shape
    ms, md = src.mean(0), dst.mean(0)
    sc, dc = src - ms, dst - md
    a = dc.T @ sc / n
    sign = np.ones(d)
    if np.linalg.det(a) < 0:
        sign[d - 1] = -1
    u, s, vt = np.linalg.svd(a)
    r = u @ np.diag(sign) @ vt
    scale = (s * sign).sum() / sc.var(0).sum()
    m = np.zeros((2, 3))
    m[:, :2] = scale * r
    m[:, 2] = md - scale * r @ ms
    return m


def warp_affine(img: np.ndarray, m: np.ndarray, size: int) -> np.ndarray:
    """``cv2.warpAffine(img, m, (size, size), borderValue=0)`` of a uint8 HxWxC image as OpenCV 5 computes it: the
    inverse map (inverted in doubles) in float32, bilinear as two lerps in float32, zeros outside, rounded (a value
    in ten thousand 1 level off, float32 fused or not)."""
    m = np.asarray(m, np.float64)
    det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    det = 1.0 / det if det != 0 else 0.0
    inv = np.empty((2, 3))
    inv[0, 0], inv[1, 1] = m[1, 1] * det, m[0, 0] * det
    inv[0, 1], inv[1, 0] = -m[0, 1] * det, -m[1, 0] * det
    inv[0, 2] = -inv[0, 0] * m[0, 2] - inv[0, 1] * m[1, 2]
    inv[1, 2] = -inv[1, 0] * m[0, 2] - inv[1, 1] * m[1, 2]
    f = inv.astype(np.float32)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    sx = f[0, 0] * x + f[0, 1] * y + f[0, 2]
    sy = f[1, 0] * x + f[1, 1] * y + f[1, 2]
    ix, iy = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
    a, b = (sx - ix)[..., None], (sy - iy)[..., None]
    h, w = img.shape[:2]

    def px(yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        return img[np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)].astype(np.float32) * inside[..., None]

    p00, p01, p10, p11 = px(iy, ix), px(iy, ix + 1), px(iy + 1, ix), px(iy + 1, ix + 1)
    v0 = p00 + a * (p01 - p00)
    v1 = p10 + a * (p11 - p10)
    return np.clip(np.rint(v0 + b * (v1 - v0)), 0, 255).astype(np.uint8)


def norm_crop(img: np.ndarray, kps: np.ndarray, size: int = 112) -> np.ndarray:
    """insightface's ``face_align.norm_crop``: the face of 5 points ``kps`` aligned onto ArcFace's template scaled
    to ``size`` (a multiple of 112), ``size`` x ``size``."""
    return warp_affine(img, similarity(kps, ARCFACE_DST * (size / 112.0)), size)


def _blob(img: np.ndarray, mean: float, std: float) -> np.ndarray:
    """``cv2.dnn.blobFromImage(img, 1 / std, size, (mean,) * 3, swapRB=True)`` of a BGR uint8 image."""
    x = (img[..., ::-1].astype(np.float32) - np.float32(mean)) * np.float32(1.0 / std)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _nms(dets: np.ndarray, thresh: float = NMS_THRESH) -> list[int]:
    x1, y1, x2, y2, scores = dets[:, 0], dets[:, 1], dets[:, 2], dets[:, 3], dets[:, 4]
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(int(i))
        w = np.maximum(0.0, np.minimum(x2[i], x2[order[1:]]) - np.maximum(x1[i], x1[order[1:]]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[order[1:]]) - np.maximum(y1[i], y1[order[1:]]) + 1)
        inter = w * h
        ovr = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[np.where(ovr <= thresh)[0] + 1]
    return keep


def decode(outs: list[np.ndarray], size: tuple[int, int], scale: float, thresh: float = DET_THRESH) -> list[Face]:
    """SCRFD's post-processing of its nine outputs (scores, boxes, points by stride 8, 16, 32) for an input of
    ``size`` (height, width) made of the picture resized by ``scale``: the faces, best score first."""
    scores_l, boxes_l, kps_l = [], [], []
    for idx, stride in enumerate(STRIDES):
        sc = outs[idx][0] if outs[idx].ndim == 3 else outs[idx]
        bb = (outs[idx + 3][0] if outs[idx + 3].ndim == 3 else outs[idx + 3]) * stride
        kp = (outs[idx + 6][0] if outs[idx + 6].ndim == 3 else outs[idx + 6]) * stride
        h, w = size[0] // stride, size[1] // stride
        centers = (np.stack(np.mgrid[:h, :w][::-1], axis=-1).astype(np.float32) * stride).reshape(-1, 2)
        centers = np.stack([centers] * 2, axis=1).reshape(-1, 2)
        if sc.shape[0] != centers.shape[0] or bb.shape != (centers.shape[0], 4) or kp.shape != (centers.shape[0], 10):
            raise ModelError(f"the face detector's stride-{stride} outputs are {list(sc.shape)}, {list(bb.shape)} and "
                             f"{list(kp.shape)}, not SCRFD's [{centers.shape[0]}, 1 / 4 / 10] for a {size[1]}x{size[0]} "
                             "input", where=DETECTOR, fix="pass " + FACE_FIX)
        pos = np.where(sc.reshape(-1) >= thresh)[0]
        boxes = np.stack([centers[:, 0] - bb[:, 0], centers[:, 1] - bb[:, 1], centers[:, 0] + bb[:, 2],
                          centers[:, 1] + bb[:, 3]], axis=-1)
        pts = np.stack([centers[:, i % 2] + kp[:, i] for i in range(10)], axis=-1).reshape(-1, 5, 2)
        scores_l.append(sc.reshape(-1, 1)[pos])
        boxes_l.append(boxes[pos])
        kps_l.append(pts[pos])
    scores = np.vstack(scores_l)
    if scores.size == 0:
        return []
    order = np.argsort(-scores.ravel(), kind="stable")
    dets = np.hstack((np.vstack(boxes_l) / scale, scores)).astype(np.float32)[order]
    kps = (np.vstack(kps_l) / scale)[order]
    keep = _nms(dets)
    return [Face(dets[i, :4], float(dets[i, 4]), kps[i].astype(np.float32)) for i in keep]


class FaceModels:
    """InsightFace's ``buffalo_l`` folder (or ``pack`` ``antelopev2``), its detector and recognizer run as parts
    (compiled on first use). :meth:`detector_only`: the detector file alone (the keypoint map's)."""

    def __init__(self, folder: Any, *, backend: str = "auto", device: Any = None, options: Any = None,
                 where: str = "face_models", pack: str = "buffalo_l") -> None:
        from .parts import Part

        self.folder = find_face_models(folder, where, pack)
        self.where, self.pack = where, pack
        det, rec = PACKS[pack]
        self.detector = Part("face_detector", self.folder / det, backend=backend, device=device, options=options)
        self.recognizer: Any = Part("face_recognizer", self.folder / rec, backend=backend, device=device,
                                    options=options)
        self._std: float | None = None

    @classmethod
    def detector_only(cls, path: Path, *, backend: str = "auto", device: Any = None, options: Any = None
                      ) -> FaceModels:
        """The SCRFD detector ``path`` alone (``detect`` only)."""
        from .parts import Part

        self = cls.__new__(cls)
        self.folder, self.where, self.pack = Path(path).parent, "models", ""
        self.detector = Part("face_detector", Path(path), backend=backend, device=device, options=options)
        self.recognizer = None
        self._std = None
        return self

    def _input(self, part: Any) -> tuple[str, list[Any]]:
        name, info = next(iter(part.inputs.items()))
        shape = list(info.shape)
        if len(shape) != 4 or shape[1] not in (3, None) and not isinstance(shape[1], str):
            raise ModelError(f"{part.path.name} takes {shape}, not an NCHW picture", where=str(part.path),
                             fix="pass " + FACE_FIX)
        return name, shape

    def detect(self, rgb: np.ndarray) -> list[Face]:
        """The faces of an HxWx3 uint8 RGB picture, best first (empty: none)."""
        name, shape = self._input(self.detector)
        fixed = [int(d) if isinstance(d, int) else None for d in shape[2:]]
        ih, iw = (fixed[0] or DET_SIZE), (fixed[1] or DET_SIZE)
        bgr = np.ascontiguousarray(np.asarray(rgb, np.uint8)[..., ::-1])
        if bgr.shape[0] / bgr.shape[1] > ih / iw:
            nh = ih
            nw = int(nh / (bgr.shape[0] / bgr.shape[1]))
        else:
            nw = iw
            nh = int(nw * (bgr.shape[0] / bgr.shape[1]))
        if nh == 0 or nw == 0:  # over 640:1, a side shrinks to nothing: nothing to see (cv2.resize would raise)
            return []
        canvas = np.zeros((ih, iw, 3), np.uint8)
        canvas[:nh, :nw] = resample(bgr, nw, nh, "linear")  # cv2.resize, INTER_LINEAR
        out = self.detector.run({name: _blob(canvas, 127.5, 128.0)})
        outs = [np.asarray(out[k], np.float32) for k in self.detector.outputs]
        if len(outs) != 9:
            raise ModelError(f"{DETECTOR} has {len(outs)} outputs, not SCRFD's 9 (scores, boxes and points by "
                             "stride)", where=str(self.detector.path), fix="pass " + FACE_FIX)
        return decode(outs, (ih, iw), nh / bgr.shape[0])

    def embed(self, rgb: np.ndarray, face: Face, normed: bool = True) -> np.ndarray:
        """The normed ArcFace embedding ``[512]`` of ``face`` in the RGB picture (``normed`` False: as the recognizer
        gives it, insightface's ``face.embedding``, which InstantID reads)."""
        name, shape = self._input(self.recognizer)
        size = int(shape[2]) if isinstance(shape[2], int) else 112
        if self._std is None:  # insightface's ArcFaceONNX: a graph that begins Sub, Mul normalizes itself
            names = [n.name for n in self.recognizer.graph.model.graph.node[:8]]
            own = any(n.startswith(("Sub", "_minus")) for n in names) and any(n.startswith(("Mul", "_mul"))
                                                                               for n in names)
            self._std = 0.0 if own else 127.5
        bgr = np.ascontiguousarray(np.asarray(rgb, np.uint8)[..., ::-1])
        crop = norm_crop(bgr, face.kps, size)
        mean, std = (0.0, 1.0) if self._std == 0.0 else (127.5, 127.5)
        out = self.recognizer.run({name: _blob(crop, mean, std)})
        emb = np.asarray(next(iter(out.values())), np.float32).reshape(-1)
        if not normed:
            return emb
        norm = np.linalg.norm(emb)
        return emb / norm if norm > 0 else emb  # zero: a plan's dry run

    def close(self) -> None:
        self.detector.close()
        if self.recognizer is not None:
            self.recognizer.close()


def largest(faces: list[Face]) -> Face:
    """The face with the largest box (the last of the largest, as Python's ``sorted(...)[-1]`` picks it in
    InstantX's examples and sd-webui-controlnet's ``pick_largest_face``)."""
    areas = [float((f.bbox[2] - f.bbox[0]) * (f.bbox[3] - f.bbox[1])) for f in faces]
    best = max(areas)
    return faces[max(i for i, a in enumerate(areas) if a == best)]


def face_of(models: FaceModels, rgb: np.ndarray, where: str, *, pick_largest: bool = False, normed: bool = True
            ) -> tuple[Face, np.ndarray]:
    """The picture's first face (best score; ``pick_largest``: the largest) and its embedding (``normed``: divided
    by its norm); one InputError on ``where`` when it has none."""
    faces = models.detect(rgb)
    if not faces:
        raise InputError(f"InsightFace's detector finds no face in the picture ({rgb.shape[1]}x{rgb.shape[0]})",
                         where=where, fix="pass {@" + where + "} a picture with a face in it, large enough to see "
                                          "(a portrait or a photo of a person)")
    face = largest(faces) if pick_largest else faces[0]
    if len(faces) > 1:
        log.info("%d faces in the picture; the %s (score %.3f) is used", len(faces),
                 "largest" if pick_largest else "first", face.score)
    return face, models.embed(rgb, face, normed)


#: InstantID's keypoint colours (eyes, nose, mouth corners) and the limbs drawn from the nose
KPS_COLORS = ((255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255))
KPS_LIMBS = ((0, 2), (1, 2), (3, 2), (4, 2))


def draw_kps(height: int, width: int, kps: np.ndarray) -> np.ndarray:
    """InstantID's ``draw_kps`` (sd-webui-controlnet's ``instant_id_face_keypoints``): on black, each limb from an
    eye or a mouth corner to the nose an ellipse (``ellipse2Poly`` of half its length by 4, at its angle in whole
    degrees, filled in the colour of its outer point), all times 0.6, then each point a filled circle of radius 10
    in its colour. HxWx3 uint8, RGB."""
    import math

    from . import cvdraw

    kps = np.asarray(kps, np.float64)
    out = np.zeros((height, width, 3), np.uint8)  # the extension's float canvas times 0.6, then truncated: each pixel
    for a, b in KPS_LIMBS:  # is black or one limb's colour, so its colour times 0.6, truncated, is filled in directly
        x, y = kps[[a, b], 0], kps[[a, b], 1]
        length = float(np.hypot(x[0] - x[1], y[0] - y[1]))
        angle = math.degrees(math.atan2(y[0] - y[1], x[0] - x[1]))
        poly = cvdraw.ellipse2poly((int(np.mean(x)), int(np.mean(y))), (int(length / 2), 4), int(angle), 0, 360, 1)
        cvdraw.fill_convex_poly(out, poly, [int(float(c) * 0.6) for c in KPS_COLORS[a]])
    for (x, y), color in zip(kps, KPS_COLORS):
        cvdraw.circle(out, (int(x), int(y)), 10, color)
    return out
