"""Stand-ins for DWPose's two ONNX files, with their exact signatures and outputs that a test steers.

- ``detector(path)``: ``images`` (1, 3, 640, 640) -> ``output`` (1, 8400, 85), YOLOX's raw layout: zeros except
  a few anchors of stride 32 that hold boxes (two people, a weaker duplicate of the first that NMS removes, a
  person scored 0.25 that is dropped after NMS, a box of class 5); the first person's centre moves with the mean
  of the input (so the letterbox is part of what is compared).
- ``pose_model(path)``: ``input`` (batch, 3, 384, 288) -> ``simcc_x`` (batch, 133, 576), ``simcc_y`` (batch, 133,
  768): per keypoint a Gaussian bump placing a made-up whole-body pose in the crop, plus the crop's red channel
  averaged over rows (columns), upsampled x2, times 0.05, so the argmax moves with what the affine crop holds;
  some keypoints scored below 0.3 (left out of the map), some below 0 (placed at -1).
Only numpy and onnx; used by ``scripts/gen_dwpose_refs.py`` and the tests.
"""

from __future__ import annotations

import math

import numpy as np


def _anchor(gx: int, gy: int) -> int:
    return 80 * 80 + 40 * 40 + gy * 20 + gx


BOXES = [  # (gx, gy, x_off, y_off, w, h, obj, cls, cls score)
    (6, 9, 0.25, 0.375, 160, 400, 0.95, 0, 0.9),
    (7, 9, -0.7, 0.4, 150, 390, 0.9, 0, 0.85),  # overlaps the first: removed by NMS
    (13, 10, 0.4, 0.0, 150, 380, 0.9, 0, 0.8),
    (17, 3, 0.5, 0.5, 60, 120, 0.5, 0, 0.5),  # 0.25: kept by NMS (> 0.1), dropped (< 0.3)
    (3, 15, 0.5, 0.5, 100, 80, 0.9, 5, 0.9),  # a bus
]


def detector_arrays(boxes=BOXES) -> tuple[np.ndarray, np.ndarray]:
    base = np.zeros((1, 8400, 85), np.float32)
    mask = np.zeros((1, 8400, 85), np.float32)
    for gx, gy, xo, yo, w, h, obj, cls, cs in boxes:
        a = _anchor(gx, gy)
        base[0, a, :4] = [xo, yo, math.log(w / 32), math.log(h / 32)]
        base[0, a, 4] = obj
        base[0, a, 5 + cls] = cs
    mask[0, _anchor(6, 9), 0] = 0.5
    return base, mask


def detector(path, boxes=BOXES) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    base, mask = detector_arrays(boxes)
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["m"], keepdims=0),
        helper.make_node("Div", ["m", "k255"], ["m1"]),
        helper.make_node("Mul", ["mask", "m1"], ["d"]),
        helper.make_node("Add", ["base", "d"], ["output"]),
    ]
    inits = [numpy_helper.from_array(base, "base"), numpy_helper.from_array(mask, "mask"),
             numpy_helper.from_array(np.array(255.0, np.float32), "k255")]
    g = helper.make_graph(nodes, "yolox_standin",
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 640, 640])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8400, 85])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def whole_body_pose(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(133, 2) crop pixels (x in 0..288, y in 0..384) of a made-up person, and their bump heights."""
    rng = np.random.default_rng(seed)
    body = np.array([[144, 70], [136, 62], [152, 62], [126, 66], [162, 66], [110, 110], [178, 110], [96, 160],
                     [196, 165], [88, 205], [208, 210], [120, 215], [168, 215], [116, 280], [172, 282],
                     [112, 340], [178, 342]], float)
    feet = np.array([[104, 356], [98, 358], [114, 350], [186, 356], [192, 358], [176, 350]], float)
    t = np.linspace(0, 2 * np.pi, 68, endpoint=False)
    face = np.stack([144 + 18 * np.cos(t), 68 + 22 * np.sin(t)], 1)
    def hand(x, y, sgn):
        pts = [[x, y]]
        for f in range(5):
            ang = -np.pi / 2 + sgn * (f - 2) * 0.35
            for j in range(1, 5):
                pts.append([x + sgn * 4 * j * np.cos(ang) + 2 * f, y + 5 * j * np.sin(-ang) * -1 + 3])
        return np.array(pts)
    pts = np.concatenate([body, feet, face, hand(88, 212, 1), hand(208, 217, -1)])
    pts += rng.uniform(-1.5, 1.5, pts.shape)
    heights = np.ones(133)
    heights[[3, 20]] = 0.2  # a left ear and a foot scored below 0.3
    heights[24 + 60:24 + 64] = 0.25  # four face points
    heights[112:133] = -0.5  # the right hand: scores below 0, positions -1, left out
    return pts, heights


def pose_arrays(seed: int = 0, sigma: float = 12.0) -> tuple[np.ndarray, np.ndarray]:
    pts, heights = whole_body_pose(seed)
    jx, jy = np.arange(576), np.arange(768)
    bx = heights[:, None] * np.exp(-0.5 * ((jx[None] - 2 * pts[:, :1]) / sigma) ** 2)
    by = heights[:, None] * np.exp(-0.5 * ((jy[None] - 2 * pts[:, 1:]) / sigma) ** 2)
    return bx.astype(np.float32), by.astype(np.float32)


def pose_model(path, seed: int = 0, gain: float = 0.05, batch="batch") -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    bx, by = pose_arrays(seed)
    ux = np.zeros((288, 576), np.float32)
    ux[np.arange(288), 2 * np.arange(288)] = 1
    ux[np.arange(288), 2 * np.arange(288) + 1] = 1
    uy = np.zeros((384, 768), np.float32)
    uy[np.arange(384), 2 * np.arange(384)] = 1
    uy[np.arange(384), 2 * np.arange(384) + 1] = 1
    nodes = [
        helper.make_node("Slice", ["input", "s0", "s1", "s_ax"], ["red"]),
        helper.make_node("ReduceMean", ["red"], ["cols"], axes=[1, 2], keepdims=0),  # (N, 288)
        helper.make_node("ReduceMean", ["red"], ["rows"], axes=[1, 3], keepdims=0),  # (N, 384)
        helper.make_node("MatMul", ["cols", "ux"], ["px"]),
        helper.make_node("MatMul", ["rows", "uy"], ["py"]),
        helper.make_node("Mul", ["px", "gain"], ["gx"]),
        helper.make_node("Mul", ["py", "gain"], ["gy"]),
        helper.make_node("Unsqueeze", ["gx", "ax1"], ["gx3"]),
        helper.make_node("Unsqueeze", ["gy", "ax1"], ["gy3"]),
        helper.make_node("Add", ["bx", "gx3"], ["simcc_x"]),
        helper.make_node("Add", ["by", "gy3"], ["simcc_y"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "s0": np.array([0], np.int64), "s1": np.array([1], np.int64), "s_ax": np.array([1], np.int64),
        "ux": ux, "uy": uy, "gain": np.array(gain, np.float32), "ax1": np.array([1], np.int64),
        "bx": bx, "by": by}.items()]
    g = helper.make_graph(nodes, "dwpose_standin",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 384, 288])],
                          [helper.make_tensor_value_info("simcc_x", TensorProto.FLOAT, [batch, 133, 576]),
                           helper.make_tensor_value_info("simcc_y", TensorProto.FLOAT, [batch, 133, 768])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def write(folder, seed: int = 0) -> tuple[str, str]:
    """Both stand-ins in ``folder`` under DWPose's file names."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    detector(folder / "yolox_l.onnx")
    pose_model(folder / "dw-ll_ucoco_384.onnx", seed)
    return str(folder / "yolox_l.onnx"), str(folder / "dw-ll_ucoco_384.onnx")
