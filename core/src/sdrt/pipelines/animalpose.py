"""Animal poses: sd-webui-controlnet's ``animal_openpose`` (RTMPose-m trained on AP10K, 17 keypoints).

Two ONNX files, run through sdrt's backends like DWPose's (:mod:`sdrt.pipelines.posedetect`, whose steps these
share): DWPose's ``yolox_l.onnx`` finds the animals and ``rtmpose-m_simcc-ap10k_pt-aic-coco_210e-256x256-7a041aa1_
20230206.onnx`` (the extension's download, from bdsqlsz/qinglong_controlnet-lllite's ``Annotators``; ComfyUI's
``rtmpose-m_ap10k_256.onnx`` from hr16/UnJIT-DWPose is the same model) places their keypoints. Everything around
them follows the extension's ``annotator/openpose/animalpose.py`` with its ``cv_ox_det`` / ``cv_ox_pose``:

- the detector exactly as DWPose's (letterbox onto 640x640, YOLOX's grid decode, class-aware NMS at 0.45 over
  scores above 0.1), keeping the boxes above 0.3 of COCO's classes 14 to 23 (bird, cat, dog, horse, sheep, cow,
  elephant, bear, zebra, giraffe), class by class; no such box: no animals (unlike DWPose, no whole-image pose);
- each box cropped as DWPose's (padding 1.25, the model's 1:1 aspect, OpenCV's affine warp) to 256x256,
  ImageNet's mean and std; SimCC argmax on 512 bins per axis, the lower maximum as score (-1 positions where it
  is not above 0), bins halved and mapped back through the box;
- each animal's 17 keypoints with their scores clipped to 0..1, every one kept (the extension makes a
  ``Keypoint`` of each, whatever its score);
- drawing (``draw_animalposes``): on black, each of the AP10K skeleton's 17 limbs (in the extension's order and
  colours, as given: the map is RGB) as ``cv2.line`` of thickness 5 between the keypoints' positions truncated
  to integers, every limb of every animal;
- the OpenPose JSON (``encode_poses_as_json``): ``people`` empty, ``animals`` one flat ``[x, y, 1.0, ...]`` list
  per animal (the extension writes 1 for every keypoint), the canvas the padded image's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import posedetect as pd

__all__ = ["ANIMAL_CLASSES", "ANIMAL_FILE", "COMFY_FILE", "LIMBS", "COLORS", "AnimalPose", "draw", "to_json"]

ANIMAL_FILE = "rtmpose-m_simcc-ap10k_pt-aic-coco_210e-256x256-7a041aa1_20230206.onnx"
COMFY_FILE = "rtmpose-m_ap10k_256.onnx"
#: COCO's animal classes (bird .. giraffe), the ones the extension keeps
ANIMAL_CLASSES = tuple(range(14, 24))
POSE_SIZE = (256, 256)  # (w, h)
KEYPOINTS = 17
#: the AP10K skeleton as the extension draws it (1-based keypoints) and its limb colours
LIMBS = ((1, 2), (2, 3), (1, 3), (3, 4), (4, 9), (9, 10), (10, 11), (4, 6), (6, 7), (7, 8), (4, 5), (5, 15),
         (15, 16), (16, 17), (5, 12), (12, 13), (13, 14))
COLORS = ((255, 255, 255), (100, 255, 100), (150, 255, 255), (100, 50, 255), (50, 150, 200), (0, 255, 255),
          (0, 150, 0), (0, 0, 255), (0, 0, 150), (255, 50, 255), (255, 0, 255), (255, 0, 0), (150, 0, 0),
          (255, 255, 100), (0, 150, 0), (255, 255, 0), (150, 150, 150))


#: what to download for the pose model (a missing, cut-short or other file)
_FIX = (f"download {ANIMAL_FILE} (bdsqlsz/qinglong_controlnet-lllite, Annotators; or ComfyUI's {COMFY_FILE}, "
        "hr16/UnJIT-DWPose)")


class AnimalPose:
    """The detector and the AP10K pose graph compiled on one backend; ``ap(rgb)`` -> ``(n, 17, 3)`` x, y (pixels
    of ``rgb``) and score (0..1) per animal, ``n`` 0 when none is found."""

    def __init__(self, det: str | Path, pose: str | Path, *, backend: str = "auto", device: Any = None) -> None:
        from ..runtime import load
        from .netgraph import fp32_options

        self.files = (Path(det), Path(pose))
        fp32 = fp32_options(backend, device)  # as the extension runs them (keypoints move at bf16)
        self.det = load(str(det), backend=backend, device=device, shapes=pd._static(det, pd.DET_FILE), **fp32)
        try:
            self.pose = load(str(pose), backend=backend, device=device, shapes=pd._static(pose, ANIMAL_FILE, _FIX), **fp32)
        except BaseException:
            self.det.close()
            raise
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        from ..errors import ModelError

        d_out = self.det.outputs[0].shape
        if len(self.det.inputs) != 1 or len(d_out) != 3 or d_out[-1] != 85:
            raise ModelError(f"{self.files[0]} is not a YOLOX COCO detector (outputs {d_out}, want (1, 8400, 85))",
                             where=str(self.files[0]), fix=f"pass DWPose's {pd.DET_FILE} (yzd-v/DWPose)")
        ins = self.pose.inputs[0].shape if len(self.pose.inputs) == 1 else None
        outs = [tuple(o.shape) for o in self.pose.outputs]
        if (ins is None or tuple(ins[-2:]) != (POSE_SIZE[1], POSE_SIZE[0]) or len(outs) != 2
                or any(len(o) != 3 or o[1] != KEYPOINTS or o[2] != 2 * s for o, s in zip(outs, POSE_SIZE))):
            raise ModelError(f"{self.files[1]} is not the AP10K animal pose model (input {ins}, outputs {outs}; want "
                             f"a 256x256 input and SimCC outputs (1, {KEYPOINTS}, 512) twice)", where=str(self.files[1]),
                             fix=_FIX)

    def close(self) -> None:
        for s in (getattr(self, "det", None), getattr(self, "pose", None)):
            if s is not None:
                s.close()

    def __enter__(self) -> AnimalPose:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def detect(self, rgb: np.ndarray) -> np.ndarray:
        """The animals' boxes ``(n, 4)`` in pixels of ``rgb`` (``n`` 0: none)."""
        h, w = rgb.shape[:2]
        r = min(pd.DET_SIZE[0] / h, pd.DET_SIZE[1] / w)
        if int(h * r) == 0 or int(w * r) == 0:  # over 640:1, a side shrinks to nothing: nothing to see
            return np.zeros((0, 4))
        x, ratio = pd.letterbox(rgb)
        out = self.det.run({self.det.inputs[0].name: x})
        boxes = pd.people(out[self.det.outputs[0].name], ratio, ANIMAL_CLASSES)
        return np.zeros((0, 4)) if boxes is None else boxes

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        boxes = self.detect(rgb)
        out = np.zeros((len(boxes), KEYPOINTS, 3))
        name = self.pose.inputs[0].name
        for i, box in enumerate(boxes):
            img, center, scale = pd.crop(rgb, box, POSE_SIZE)
            x = img.transpose(2, 0, 1)[None].astype(np.float32)
            res = self.pose.run({name: x})
            sx, sy = (res[o.name] for o in self.pose.outputs)
            k, s = pd.simcc_decode(sx, sy)
            out[i, :, :2] = k[0] / POSE_SIZE * scale + center - scale / 2
            out[i, :, 2] = np.clip(s[0], 0.0, 1.0)
        return out


def draw(animals: np.ndarray | list, height: int, width: int) -> np.ndarray:
    """The extension's ``draw_animalposes``: ``(height, width, 3)`` uint8, every limb of every animal as a line of
    thickness 5 (``animals``: ``(n, 17, >=2)`` x, y in pixels)."""
    from .cvdraw import line

    canvas = np.zeros((height, width, 3), np.uint8)
    for pts in animals:
        for (i, j), color in zip(LIMBS, COLORS):
            p1, p2 = pts[i - 1], pts[j - 1]
            line(canvas, (int(p1[0]), int(p1[1])), (int(p2[0]), int(p2[1])), color, 5)
    return canvas


def to_json(animals: np.ndarray, height: int, width: int) -> dict[str, Any]:
    """The extension's OpenPose JSON of animal poses: no people; each animal's keypoints as ``x, y, 1.0``."""
    return {"people": [], "animals": [[v for p in a for v in (float(p[0]), float(p[1]), 1.0)] for a in animals],
            "canvas_height": int(height), "canvas_width": int(width)}
