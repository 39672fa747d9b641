"""Stand-ins for the animal pose's two ONNX files, with their signatures and outputs that a test steers.

- ``detector(path)``: DWPose's YOLOX stand-in (:mod:`dwpose_graphs`) with animal boxes: a dog (class 16), a weaker
  duplicate NMS removes, a cat (15) beside a person (0, not an animal), a bird (14) scored 0.25 (kept by NMS,
  dropped below 0.3), a giraffe (23) and a bus (5); the dog's centre moves with the input's mean. ``boxes=NONE``:
  a person and a bus only (no animal).
- ``pose_model(path)``: ``input`` (batch, 3, 256, 256) -> ``simcc_x``, ``simcc_y`` (batch, 17, 512): per AP10K
  keypoint a Gaussian bump placing a made-up quadruped in the crop, plus the crop's red channel averaged over rows
  (columns), upsampled x2, times 0.05, so the argmax moves with what the affine crop holds; scores above 1
  (clipped), between 0 and 1, and below 0 (positions -1).
Only numpy and onnx; used by ``scripts/ref_animal_openpose.py`` and the tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from dwpose_graphs import detector as _detector

BOXES = [  # (gx, gy, x_off, y_off, w, h, obj, cls, cls score) on the 640x640 canvas's stride-32 grid
    (6, 9, 0.25, 0.375, 220, 160, 0.95, 16, 0.9),  # a dog (its anchor's centre moves with the input)
    (7, 9, -0.7, 0.4, 210, 150, 0.9, 16, 0.85),  # the same dog, weaker: removed by NMS
    (13, 5, 0.4, 0.0, 150, 200, 0.9, 15, 0.8),  # a cat
    (12, 5, 0.5, 0.5, 140, 190, 0.9, 0, 0.9),  # a person where the cat is: not an animal
    (17, 3, 0.5, 0.5, 60, 60, 0.5, 14, 0.5),  # a bird at 0.25: kept by NMS, dropped below 0.3
    (3, 10, 0.5, 0.5, 90, 170, 0.9, 23, 0.7),  # a giraffe
    (15, 11, 0.5, 0.5, 100, 80, 0.9, 5, 0.9),  # a bus
]
NONE = [b for b in BOXES if b[7] in (0, 5)]


def detector(path, boxes=BOXES) -> None:
    _detector(path, boxes)


def quadruped(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(17, 2) crop pixels (0..256) of a made-up animal in AP10K's order, and their bump heights."""
    rng = np.random.default_rng(seed)
    pts = np.array([[60, 70], [74, 66], [52, 84], [92, 96], [196, 100], [100, 120], [96, 160], [94, 200],
                    [116, 122], [120, 162], [122, 204], [180, 124], [176, 166], [172, 206], [196, 126],
                    [200, 168], [204, 210]], float)
    pts += rng.uniform(-2, 2, pts.shape)
    heights = np.linspace(0.35, 0.95, 17)
    heights[[2, 9]] = 1.4  # scores above 1: clipped
    heights[[6, 15]] = -0.5  # below 0: positions -1 (drawn all the same)
    return pts, heights


def pose_model(path, seed: int = 0, gain: float = 0.05, batch="batch", sigma: float = 10.0) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    pts, heights = quadruped(seed)
    j = np.arange(512)
    bx = (heights[:, None] * np.exp(-0.5 * ((j[None] - 2 * pts[:, :1]) / sigma) ** 2)).astype(np.float32)
    by = (heights[:, None] * np.exp(-0.5 * ((j[None] - 2 * pts[:, 1:]) / sigma) ** 2)).astype(np.float32)
    up = np.zeros((256, 512), np.float32)
    up[np.arange(256), 2 * np.arange(256)] = 1
    up[np.arange(256), 2 * np.arange(256) + 1] = 1
    nodes = [
        helper.make_node("Slice", ["input", "s0", "s1", "s_ax"], ["red"]),
        helper.make_node("ReduceMean", ["red"], ["cols"], axes=[1, 2], keepdims=0),  # (N, 256)
        helper.make_node("ReduceMean", ["red"], ["rows"], axes=[1, 3], keepdims=0),
        helper.make_node("MatMul", ["cols", "up"], ["px"]),
        helper.make_node("MatMul", ["rows", "up"], ["py"]),
        helper.make_node("Mul", ["px", "gain"], ["gx"]),
        helper.make_node("Mul", ["py", "gain"], ["gy"]),
        helper.make_node("Unsqueeze", ["gx", "ax1"], ["gx3"]),
        helper.make_node("Unsqueeze", ["gy", "ax1"], ["gy3"]),
        helper.make_node("Add", ["bx", "gx3"], ["simcc_x"]),
        helper.make_node("Add", ["by", "gy3"], ["simcc_y"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "s0": np.array([0], np.int64), "s1": np.array([1], np.int64), "s_ax": np.array([1], np.int64),
        "up": up, "gain": np.array(gain, np.float32), "ax1": np.array([1], np.int64), "bx": bx, "by": by}.items()]
    g = helper.make_graph(nodes, "ap10k_standin",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 256, 256])],
                          [helper.make_tensor_value_info("simcc_x", TensorProto.FLOAT, [batch, 17, 512]),
                           helper.make_tensor_value_info("simcc_y", TensorProto.FLOAT, [batch, 17, 512])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def write(folder, pose_folder=None, boxes=BOXES, pose_name: str | None = None) -> tuple[Path, Path]:
    """Both stand-ins under the extension's file names (the pose model in ``pose_folder`` if given, as ComfyUI
    keeps it apart; ``pose_name``: another name for it)."""
    from sdrt.pipelines.animalpose import ANIMAL_FILE

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pose_dir = Path(pose_folder) if pose_folder is not None else folder
    pose_dir.mkdir(parents=True, exist_ok=True)
    det, pose = folder / "yolox_l.onnx", pose_dir / (pose_name or ANIMAL_FILE)
    detector(det, boxes)
    pose_model(pose)
    return det, pose
