"""OpenPose (hands): sd-webui-controlnet's hand estimation, lllyasviel's ``hand_pose_model.pth`` run through sdrt.

The file (CMU's hand network as PyTorch weights: the VGG-like trunk to ``conv5_3_CPM``, a first stage and 5
refinement stages of 22 heatmaps) is read with sdrt's safe torch-file reader and built as an ONNX graph in memory
(:func:`build_graph`, which the face network shares: same trunk, other widths). Around it, numpy follows the
extension's ``annotator/openpose/hand.py`` and ``util.handDetect`` step for step:

- the boxes (``hand_boxes``): from each arm whose shoulder, elbow and wrist were found, centred a third of
  the forearm past the wrist, 1.5 times the longer of the forearm and 0.9 of the upper arm wide, clipped to the
  image and kept from 20 pixels; the left arm first;
- per box (the BGR crop, ``HandNet.peaks``): ``cv2.GaussianBlur(crop, (0, 0), 0.8)``; at each of the 4 scales
  ``368 * (0.5, 1, 1.5, 2)`` the crop resized square with ``smart_resize`` (INTER_AREA shrinking, Lanczos-4
  growing), read as ``x / 256 - 0.5``; the 22 heatmaps resized x8 (Lanczos-4) and to 128 x 128 (INTER_AREA),
  averaged over the scales (float64);
- each of the 21 keypoints: the map smoothed as ``scipy.ndimage.gaussian_filter(sigma=3)``, thresholded above
  0.05, its 8-connected regions (skimage's ``label``) and the one with the largest sum of the unsmoothed map
  kept; the keypoint is the first maximum of the unsmoothed map with the other regions zeroed, scaled from 128
  to the crop; a keypoint with nothing above the threshold is (0, 0), which the caller reads as missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet

__all__ = ["HAND_FILE", "CpmNet", "HandNet", "build_graph", "cpm_shapes", "hand_boxes", "label8", "peaks_of"]

HAND_FILE = "hand_pose_model.pth"
SCALES = (0.5, 1.0, 1.5, 2.0)
BOXSIZE, STRIDE = 368, 8
WSIZE = 128
THRESHOLD = 0.05
PARTS = 21


# ------------------------------------------------------------------------------------------ the network
def _trunk() -> list[tuple[str, int, int, int]]:
    """The hand and face networks' shared trunk: (name, in, out, kernel); "pool" entries are 2x2 max pools."""
    return [("conv1_1", 3, 64, 3), ("conv1_2", 64, 64, 3), ("pool", 0, 0, 0), ("conv2_1", 64, 128, 3),
            ("conv2_2", 128, 128, 3), ("pool", 0, 0, 0), ("conv3_1", 128, 256, 3), ("conv3_2", 256, 256, 3),
            ("conv3_3", 256, 256, 3), ("conv3_4", 256, 256, 3), ("pool", 0, 0, 0), ("conv4_1", 256, 512, 3),
            ("conv4_2", 512, 512, 3), ("conv4_3", 512, 512, 3), ("conv4_4", 512, 512, 3), ("conv5_1", 512, 512, 3),
            ("conv5_2", 512, 512, 3), ("conv5_3_CPM", 512, 128, 3)]


def _stage(stage: int, out: int) -> list[tuple[str, int, int, int]]:
    if stage == 1:
        return [("conv6_1_CPM", 128, 512, 1), ("conv6_2_CPM", 512, out, 1)]
    return ([(f"Mconv1_stage{stage}", 128 + out, 128, 7)]
            + [(f"Mconv{i}_stage{stage}", 128, 128, 7) for i in range(2, 6)]
            + [(f"Mconv6_stage{stage}", 128, 128, 1), (f"Mconv7_stage{stage}", 128, out, 1)])


def cpm_shapes(out: int) -> dict[str, tuple[int, ...]]:
    """The tensors of a hand (``out`` 22) or face (71) network file and their shapes."""
    convs = [c for c in _trunk() if c[0] != "pool"] + [c for s in range(1, 7) for c in _stage(s, out)]
    shapes: dict[str, tuple[int, ...]] = {}
    for name, cin, cout, k in convs:
        shapes[f"{name}.weight"] = (cout, cin, k, k)
        shapes[f"{name}.bias"] = (cout,)
    return shapes


def build_graph(arrays: Mapping[str, np.ndarray], height: int, width: int, out: int, name: str = "hand") -> Any:
    """The ``onnx.ModelProto`` of the hand (``out`` 22) or face (71) network for one ``(1, 3, height, width)``
    input ``image`` -> ``heatmaps`` (1, out, h/8, w/8): every conv but each stage's last through a ReLU, each stage
    after the first reading its predecessor's maps concatenated before the trunk's features."""
    from .netgraph import Net

    net = Net(arrays)
    t = "image"
    for cname, *_ in _trunk():
        t = net.max_pool(t, 2) if cname == "pool" else net.relu(net.conv(t, cname))
    trunk = x = t
    for stage in range(1, 7):
        layers = _stage(stage, out)
        for i, (cname, *_) in enumerate(layers):
            x = net.conv(x, cname)
            if i < len(layers) - 1:
                x = net.relu(x)
        if stage < 6:
            x = net.concat([x, trunk])
    return net.model(f"sdrt_openpose_{name}", {"image": (1, 3, height, width)}, {x: "heatmaps"})


class CpmNet(AnnotatorNet):
    """A hand or face network file compiled on one backend, one session per input size."""

    FILE = HAND_FILE
    OUT = 22
    PART = "hand"
    WHAT = "OpenPose's hand model"
    FIX = f"pass lllyasviel's {HAND_FILE}"

    def strip(self, name: str) -> str:
        """A ``model1_0.``-style (the extension's module names) or ``module.`` prefix is allowed."""
        return ".".join(name.split(".")[-2:])

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return cpm_shapes(self.OUT)

    def build(self, *size: int) -> Any:
        return build_graph(self.arrays(), size[0], size[1], self.OUT, self.PART)

    def run(self, x: np.ndarray) -> np.ndarray:
        """The network's ``(out, h/8, w/8)`` float32 heatmaps of a ``(1, 3, h, w)`` float32 input."""
        out = self.session(*x.shape[2:]).run({"image": np.ascontiguousarray(x, np.float32)})
        return np.asarray(out["heatmaps"][0], np.float32)


# ------------------------------------------------------------------------------------------ the boxes
def hand_boxes(keypoints: Sequence[tuple[float, float] | None], height: int, width: int
               ) -> list[tuple[int, int, int, bool]]:
    """The extension's ``handDetect``: ``(x, y, side, is_left)`` of each hand of one person whose 18 body
    keypoints (pixels, None where missing) have the shoulder, elbow and wrist of that arm; left first."""
    arms = []
    for (s, e, w), left in (((5, 6, 7), True), ((2, 3, 4), False)):
        if all(keypoints[i] is not None for i in (s, e, w)):
            arms.append((keypoints[s], keypoints[e], keypoints[w], left))
    out = []
    for (x1, y1), (x2, y2), (x3, y3), left in arms:
        x = x3 + 0.33 * (x3 - x2)
        y = y3 + 0.33 * (y3 - y2)
        wrist_elbow = math.sqrt((x3 - x2) ** 2 + (y3 - y2) ** 2)
        elbow_shoulder = math.sqrt((x2 - x1) ** 2 + (y2 - y1) ** 2)
        side = 1.5 * max(wrist_elbow, 0.9 * elbow_shoulder)
        x -= side / 2
        y -= side / 2
        x, y = max(x, 0), max(y, 0)
        side1 = width - x if x + side > width else side
        side2 = height - y if y + side > height else side
        side = min(side1, side2)
        if side >= 20:
            out.append((int(x), int(y), int(side), left))
    return out


# ------------------------------------------------------------------------------------------ the peaks
def label8(binary: np.ndarray) -> tuple[np.ndarray, int]:
    """skimage's ``label(binary, connectivity=2)``: 8-connected regions numbered 1.. in the raster order of their
    first pixel, 0 the background."""
    h, w = binary.shape
    idx = np.arange(h * w).reshape(h, w)
    big = h * w
    lab = np.where(binary, idx, big)
    pad = np.full((h + 2, w + 2), big, np.int64)
    while True:
        pad[1:-1, 1:-1] = lab
        m = lab
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if dy or dx:
                    m = np.minimum(m, pad[1 + dy:h + 1 + dy, 1 + dx:w + 1 + dx])
        m = np.where(binary, m, big)
        flat = m.ravel()
        fg = flat < big
        flat[fg] = flat[flat[fg]]  # pointer jumping: a label is a pixel of the same region
        m = flat.reshape(h, w)
        if np.array_equal(m, lab):
            break
        lab = m
    roots = np.unique(lab[binary])
    out = np.zeros((h, w), np.int64)
    out[binary] = np.searchsorted(roots, lab[binary]) + 1
    return out, len(roots)


def peaks_of(heatmaps: np.ndarray, height: int, width: int) -> np.ndarray:
    """The ``(21, 2)`` int keypoints (x, y in a ``height x width`` crop; (0, 0) where none) of the averaged
    ``(128, 128, 22)`` float64 heatmaps, as hand.py finds them."""
    from .openposebody import gaussian3

    maps = np.array(heatmaps[:, :, :PARTS], np.float64)
    smooth = gaussian3(maps.transpose(2, 0, 1))
    out = []
    for part in range(PARTS):
        binary = smooth[part] > THRESHOLD
        if not binary.any():
            out.append([0, 0])
            continue
        one = maps[:, :, part]
        labels, n = label8(binary)
        best = int(np.argmax([np.sum(one[labels == i]) for i in range(1, n + 1)])) + 1
        one[labels != best] = 0
        i = int(one.max(1).argmax())
        j = int(one.argmax(1)[i])
        out.append([int(float(j) * float(width) / float(WSIZE)), int(float(i) * float(height) / float(WSIZE))])
    return np.array(out)


class HandNet(CpmNet):
    """``hand_pose_model.pth`` compiled on one backend; ``peaks(bgr)`` -> the 21 keypoints of a hand crop."""

    def heatmaps(self, bgr: np.ndarray) -> np.ndarray:
        """The ``(128, 128, 22)`` float64 heatmaps averaged over the 4 scales, of a BGR uint8 crop."""
        from .gaussian import gaussian_blur
        from .openposebody import _smart_resize, padded_input

        h0, w0 = bgr.shape[:2]
        img = gaussian_blur(bgr, 0.8)
        avg = np.zeros((WSIZE, WSIZE, self.OUT))
        for s in SCALES:
            side = s * BOXSIZE
            inp, (h, w) = padded_input(_smart_resize(img, int(side), int(side), float(side + side) / float(h0 + w0)))
            maps = self.run(inp)
            c, hs, ws = maps.shape
            maps = _smart_resize(maps, ws * STRIDE, hs * STRIDE, 8.0)[:, :h, :w]
            k = float(WSIZE + WSIZE) / float(h + w)
            maps = _smart_resize(np.ascontiguousarray(maps), WSIZE, WSIZE, k)
            avg += maps.transpose(1, 2, 0) / np.float32(len(SCALES))
        return avg

    def peaks(self, bgr: np.ndarray) -> np.ndarray:
        """hand.py's ``(21, 2)`` keypoints of a BGR uint8 crop (pixels of the crop; (0, 0) where none)."""
        return peaks_of(self.heatmaps(bgr), bgr.shape[0], bgr.shape[1])
