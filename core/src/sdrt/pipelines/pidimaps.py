"""PiDiNet soft edges: sd-webui-controlnet's ``softedge_pidinet``, ``softedge_pidisafe`` and ``scribble_pidinet``.

``table5_pidinet.pth`` (PiDiNet, the paper's table 5 model: config ``carv4``, 60 channels, CDCM dilation modules
of 24 channels and CSAM attention) holds ``{"state_dict": {"module.<name>": ...}}``. Its pixel-difference
convolutions are folded into ordinary ones as PiDiNet's own ``convert_pidinet`` does before the graph is built:

- ``cd`` (central difference, 3x3): the kernel's sum taken off its centre tap;
- ``ad`` (angular difference, 3x3): the kernel minus itself rotated one step clockwise
  (``w - w[[3, 0, 1, 6, 4, 2, 7, 8, 5]]``);
- ``rd`` (radial difference): a 5x5 kernel, the eight outer taps of the 3x3 on the 5x5's rim and their negatives
  on its inner ring, the centre 0 (padding 2);
- ``cv``: as it is.

``carv4`` runs the sixteen layers (the first convolution, then the depthwise convolutions of blocks 1_1 .. 4_4) as
``cd, ad, rd, cv`` four times. The graph (:mod:`sdrt.pipelines.netgraph`) then runs on any backend. Around it,
numpy follows the extension's ``annotator/pidinet``: the image (padded to 64 by the caller) turned BGR and
divided by 255; the last output (the sigmoid of the classifier over the four upsampled side maps); ``safe_step``
for ``softedge_pidisafe``; ``(edge * 255).clip(0, 255)`` truncated to uint8 (float32); ``scribble_pidinet``
post-processes the cropped map as ``scribble_hed`` does (:func:`sdrt.pipelines.hedmaps.scribble`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .hedmaps import edge_to_uint8
from .netgraph import AnnotatorNet, Net

__all__ = ["PIDI_FILE", "PiDiNet", "convert", "expected_shapes", "fold"]

PIDI_FILE = "table5_pidinet.pth"
#: carv4: the pixel-difference kind of layers 0 (init_block) to 15 (block4_4)
CARV4 = ("cd", "ad", "rd", "cv") * 4
INPLANE, DIL = 60, 24
#: the blocks in order with (in, out, stride)
BLOCKS = (
    [("block1_1", 60, 60, 1), ("block1_2", 60, 60, 1), ("block1_3", 60, 60, 1)]
    + [("block2_1", 60, 120, 2)] + [(f"block2_{i}", 120, 120, 1) for i in (2, 3, 4)]
    + [("block3_1", 120, 240, 2)] + [(f"block3_{i}", 240, 240, 1) for i in (2, 3, 4)]
    + [("block4_1", 240, 240, 2)] + [(f"block4_{i}", 240, 240, 1) for i in (2, 3, 4)]
)
#: the channels of the four stages' outputs (after block1_3, 2_4, 3_4, 4_4)
FUSE = (60, 120, 240, 240)
STAGE_ENDS = ("block1_3", "block2_4", "block3_4", "block4_4")


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """The tensors of ``table5_pidinet.pth`` (without ``module.``) and their shapes, as saved (unconverted)."""
    out: dict[str, tuple[int, ...]] = {"init_block.weight": (INPLANE, 3, 3, 3)}
    for name, cin, cout, stride in BLOCKS:
        if stride > 1:
            out[f"{name}.shortcut.weight"] = (cout, cin, 1, 1)
            out[f"{name}.shortcut.bias"] = (cout,)
        out[f"{name}.conv1.weight"] = (cin, 1, 3, 3)
        out[f"{name}.conv2.weight"] = (cout, cin, 1, 1)
    for i, c in enumerate(FUSE):
        out[f"dilations.{i}.conv1.weight"] = (DIL, c, 1, 1)
        out[f"dilations.{i}.conv1.bias"] = (DIL,)
        for j in (1, 2, 3, 4):
            out[f"dilations.{i}.conv2_{j}.weight"] = (DIL, DIL, 3, 3)
        out[f"attentions.{i}.conv1.weight"] = (4, DIL, 1, 1)
        out[f"attentions.{i}.conv1.bias"] = (4,)
        out[f"attentions.{i}.conv2.weight"] = (1, 4, 3, 3)
        out[f"conv_reduces.{i}.conv.weight"] = (1, DIL, 1, 1)
        out[f"conv_reduces.{i}.conv.bias"] = (1,)
    out["classifier.weight"] = (1, 4, 1, 1)
    out["classifier.bias"] = (1,)
    return out


def fold(kind: str, w: np.ndarray) -> np.ndarray:
    """A pixel-difference kernel ``(out, in, 3, 3)`` as the ordinary kernel that computes the same: PiDiNet's
    ``convert_pdc`` (3x3 for ``cv``, ``cd``, ``ad``; 5x5 for ``rd``)."""
    w = np.asarray(w, np.float32)
    o, i = w.shape[:2]
    flat = w.reshape(o, i, 9)
    if kind == "cv":
        return w.copy()
    if kind == "cd":
        out = flat.copy()
        out[:, :, 4] = out[:, :, 4] - flat.sum(axis=2)
        return out.reshape(o, i, 3, 3)
    if kind == "ad":
        return (flat - flat[:, :, [3, 0, 1, 6, 4, 2, 7, 8, 5]]).reshape(o, i, 3, 3)
    if kind == "rd":
        buf = np.zeros((o, i, 25), np.float32)
        buf[:, :, [0, 2, 4, 10, 14, 20, 22, 24]] = flat[:, :, 1:]
        buf[:, :, [6, 7, 8, 11, 13, 16, 17, 18]] = -flat[:, :, 1:]
        return buf.reshape(o, i, 5, 5)
    raise ValueError(f"unknown pixel-difference kind {kind!r}")


def convert(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The saved (unconverted) tensors with the sixteen pixel-difference kernels folded (``convert_pidinet``)."""
    out = dict(arrays)
    layers = ["init_block"] + [f"{b[0]}.conv1" for b in BLOCKS]
    for kind, name in zip(CARV4, layers):
        out[f"{name}.weight"] = fold(kind, arrays[f"{name}.weight"])
    return out


class PiDiNet(AnnotatorNet):
    """``table5_pidinet.pth`` compiled on one backend per input size; ``edge(rgb)`` is the soft edge map."""

    WHAT = "PiDiNet's table5_pidinet (carv4, 60 channels, CDCM 24 and CSAM)"
    FIX = f"download {PIDI_FILE} (lllyasviel/Annotators; the extension's annotator/downloads/pidinet) and pass it"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return expected_shapes()

    def build(self, height: int, width: int) -> Any:
        """``image`` (1, 3, height, width) BGR in 0..1 -> ``edge`` (1, 1, height, width), the last output."""
        net = Net(convert(self.arrays()))
        x = net.conv("image", "init_block")
        stages = []
        for name, _, _, stride in BLOCKS:
            if stride > 1:
                x = net.max_pool(x, 2)
            y = net.conv(x, f"{name}.conv1", groups=int(net.arrays[f"{name}.conv1.weight"].shape[0]))
            y = net.conv(net.relu(y), f"{name}.conv2")
            if stride > 1:
                x = net.conv(x, f"{name}.shortcut")
            x = net.add(y, x)
            if name in STAGE_ENDS:
                stages.append(x)
        sides = []
        for i, xi in enumerate(stages):
            d = net.conv(net.relu(xi), f"dilations.{i}.conv1")
            branches = [net.conv(d, f"dilations.{i}.conv2_{j}", dilation=d_) for j, d_ in zip((1, 2, 3, 4),
                                                                                             (5, 7, 9, 11))]
            s = net.add(net.add(net.add(branches[0], branches[1]), branches[2]), branches[3])
            a = net.conv(net.conv(net.relu(s), f"attentions.{i}.conv1"), f"attentions.{i}.conv2")
            s = net.mul(s, net.sigmoid(a))
            e = net.conv(s, f"conv_reduces.{i}.conv")
            sides.append(e if i == 0 else net.resize(e, size=(height, width), mode="linear"))
        edge = net.sigmoid(net.conv(net.concat(sides), "classifier"))
        return net.model("sdrt_pidinet", {"image": (1, 3, height, width)}, {edge: "edge"})

    def edge(self, rgb: np.ndarray) -> np.ndarray:
        """The soft edge (float32 in 0..1) of an RGB uint8 image whose sides are multiples of 8 (the extension's
        are of 64)."""
        h, w = rgb.shape[:2]
        x = np.ascontiguousarray(rgb[:, :, ::-1].astype(np.float32).transpose(2, 0, 1)[None]) / np.float32(255.0)
        return np.asarray(self.session(h, w).run({"image": x})["edge"], np.float32)[0, 0]

    def map(self, rgb: np.ndarray, safe: bool = False) -> np.ndarray:
        """The extension's ``apply_pidinet``: the ``(H, W)`` uint8 soft-edge map (``safe``: ``softedge_pidisafe``)."""
        return edge_to_uint8(self.edge(rgb), safe)
