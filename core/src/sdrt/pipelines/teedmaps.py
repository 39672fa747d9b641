"""TEED soft edges: sd-webui-controlnet's ``softedge_teed``.

``7_model.pth`` (TEED, "Tiny and Efficient Edge Detector", 58,910 parameters: two double-conv blocks, one dense
layer, three upsampling branches of 1x1 convs and transposed convs, a depthwise "double fusion"; Smish activations
``x * tanh(log(1 + sigmoid(x)))``) is read with sdrt's safe torch-file reader and built as an ONNX graph
(:mod:`sdrt.pipelines.netgraph`). Around it, numpy follows the extension's ``annotator/teed`` and
``scripts/preprocessor/teed.py``: the image as ``resize_image_with_pad`` gives it (RGB 0..255 as float32, no
normalisation), the four outputs (already at the image's size) averaged in float32, a sigmoid in float64, the
extension's ``safe_step`` with the "Safe Steps" slider (default 2; 0: none), ``(edge * 255).clip(0, 255)``
truncated to uint8, cropped back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .hedmaps import linear_float, pad64, safe_step
from .netgraph import AnnotatorNet, Net

__all__ = ["TEED", "TEED_FILE", "detect", "expected_shapes"]

TEED_FILE = "7_model.pth"
#: the up-sampling branches: (name, input channels, steps); each step a 1x1 conv (16 channels, 1 at the last), a
#: Smish and a transposed conv of stride 2 (kernel 2 and padding 0 for one step, kernel 4 and padding 1 for two)
UP = (("up_block_1", 16, 1), ("up_block_2", 32, 1), ("up_block_3", 48, 2))


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """The tensors of ``7_model.pth`` and their shapes."""
    convs = {"block_1.conv1": (16, 3, 3, 3), "block_1.conv2": (16, 16, 3, 3), "block_2.conv1": (32, 16, 3, 3),
             "block_2.conv2": (32, 32, 3, 3), "dblock_3.denselayer1.conv1": (48, 32, 3, 3),
             "dblock_3.denselayer1.conv2": (48, 48, 3, 3), "side_1.conv": (32, 16, 1, 1),
             "pre_dense_3.conv": (48, 32, 1, 1)}
    for name, cin, steps in UP:
        k = 2 ** steps
        for i in range(steps):
            cout = 1 if i == steps - 1 else 16
            convs[f"{name}.features.{3 * i}"] = (cout, cin, 1, 1)
            convs[f"{name}.features.{3 * i + 2}"] = (cout, cout, k, k)
            cin = cout
    convs["block_cat.DWconv1"] = (24, 1, 3, 3)
    convs["block_cat.DWconv2"] = (24, 1, 3, 3)
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in convs.items():
        out[f"{name}.weight"] = shape
        out[f"{name}.bias"] = (shape[0],)
    return out


class TEED(AnnotatorNet):
    """``7_model.pth`` compiled on one backend per input size; ``edge(rgb)`` is the soft edge map."""

    WHAT = "TEED's 7_model.pth"
    FIX = f"download {TEED_FILE} (bdsqlsz/qinglong_controlnet-lllite, Annotators; the extension's annotator/downloads/TEED) and pass it"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return expected_shapes()

    def build(self, height: int, width: int) -> Any:
        """``image`` (1, 3, height, width) RGB in 0..255 -> ``e1`` .. ``e4``, TEED's four outputs."""
        net = Net(self.arrays())

        def smish(x: str) -> str:
            soft = net.node("Log", [net.add(net.sigmoid(x), net.scalar(1.0))])
            return net.mul(x, net.node("Tanh", [soft]))

        b1 = smish(net.conv(smish(net.conv("image", "block_1.conv1", stride=2, pad=1)), "block_1.conv2", pad=1))
        side = net.conv(b1, "side_1.conv", stride=2, pad=0)
        b2 = net.conv(smish(net.conv(b1, "block_2.conv1", pad=1)), "block_2.conv2", pad=1)
        down = net.max_pool(b2, 3, stride=2, pad=1)
        added = net.add(down, side)
        pre = net.conv(down, "pre_dense_3.conv", pad=0)
        d = net.conv(smish(net.conv(smish(added), "dblock_3.denselayer1.conv1", pad=2)),
                     "dblock_3.denselayer1.conv2", pad=0)
        b3 = net.mul(net.add(d, pre), net.scalar(0.5))
        outs = []
        for (name, _, steps), x in zip(UP, (b1, b2, b3)):
            for i in range(steps):
                x = smish(net.conv(x, f"{name}.features.{3 * i}", pad=0))
                x = net.conv_transpose(x, f"{name}.features.{3 * i + 2}", stride=2, pad=0 if steps == 1 else 1)
            outs.append(x)
        cat = net.concat(outs)
        attn = net.conv(smish(cat), "block_cat.DWconv1", pad=1, groups=3)
        attn2 = net.conv(smish(attn), "block_cat.DWconv2", pad=1, groups=24)
        fused = smish(net.node("ReduceSum", [net.add(attn2, attn), net.ints(1)], keepdims=1))
        return net.model("sdrt_teed", {"image": (1, 3, height, width)},
                         {t: f"e{i}" for i, t in enumerate([*outs, fused], 1)})

    def edge(self, rgb: np.ndarray) -> np.ndarray:
        """The soft edge (float64 in 0..1) of an RGB uint8 image whose sides are multiples of 8."""
        h, w = rgb.shape[:2]
        x = np.ascontiguousarray(rgb.astype(np.float32).transpose(2, 0, 1)[None])
        out = self.session(h, w).run({"image": x})
        edges = [linear_float(np.asarray(out[f"e{i}"], np.float32)[0, 0], w, h) for i in range(1, 5)]
        mean = np.mean(np.stack(edges, axis=2), axis=2)
        return 1 / (1 + np.exp(-mean.astype(np.float64)))

    def map(self, rgb: np.ndarray, safe_steps: int = 2) -> np.ndarray:
        """The extension's ``TEEDDetector``: the ``(H, W)`` uint8 map; ``safe_steps`` 0 leaves the edge as it is."""
        edge = self.edge(rgb)
        if safe_steps != 0:
            edge = safe_step(edge, safe_steps)
        return (edge * edge.dtype.type(255.0)).clip(0, 255).astype(np.uint8)


def detect(rgb: np.ndarray, net: TEED, safe_steps: int = 2, size: tuple[int, int] | None = None) -> np.ndarray:
    """``softedge_teed``'s map of an RGB uint8 image: padded to 64 here unless the caller did (``size``: the
    unpadded ``(h, w)``), cropped back; ``(h, w, 3)`` uint8."""
    if size is None:
        rgb, size = pad64(rgb)
    else:
        rgb = pad64(rgb)[0]
    m = net.map(rgb, safe_steps)[:size[0], :size[1]]
    return np.repeat(m[:, :, None], 3, axis=2)
