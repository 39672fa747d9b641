"""M-LSD straight lines: sd-webui-controlnet's ``mlsd`` module, ``mlsd_large_512_fp32.pth`` run through sdrt.

The file (M-LSD's ``MobileV2_MLSD_Large``: a MobileNetV2 trunk cut after its 96-channel blocks, four
upsampling/fusion stages and a dilated head) is read with sdrt's safe torch-file reader and built as an ONNX graph
in memory (:mod:`sdrt.pipelines.netgraph`), which runs on any backend. Around it, numpy follows the extension's
``annotator/mlsd`` (``apply_mlsd``, ``pred_lines``, ``deccode_output_score_and_ptss``) step for step:

- the image (RGB, at the processor resolution and padded with its edges to multiples of 64, as the extension's
  ``resize_image_with_pad``; sdrt pads an image given at its own size the same way) goes in at its own size, with a
  fourth channel of ones, read as ``x / 127.5 - 1`` (the extension's INTER_AREA resize to the same size copies);
- the network's 16 output channels at half the size, of which channel 7 is the line centres and 8-11 the
  displacements to the two ends (x, y, x, y);
- the centres through a sigmoid, kept where they equal their 3x3 maximum (``max_pool2d``, padded with -inf), the
  200 highest (ties by position, first first);
- a centre makes a line when its score is above the value threshold and its two ends are further apart than the
  distance threshold (both compared in float32, as NumPy 2 compares a float32 with a Python float); the ends
  ``2 * (centre + displacement)``, truncated to integers;
- each line drawn white, one pixel wide, 8-connected, as ``cv2.line`` does (:func:`sdrt.pipelines.cvdraw.line`),
  on a black map of the padded size, cropped back. An end that OpenCV cannot take (NaN, or beyond 32 bits) stops
  the drawing there, as the extension's ``try``/``except`` around its loop does.

The map is single-channel in the extension; :func:`line_map` returns it as HxWx3, the three channels equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet, Net

__all__ = ["MLSD", "MLSD_FILE", "TOPK", "decode", "draw_lines", "expected_shapes", "line_map", "prepare", "top_centres"]

MLSD_FILE = "mlsd_large_512_fp32.pth"
TOPK = 200
#: MobileNetV2's inverted residual settings as M-LSD cuts them: expansion, channels, repeats, first stride
_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1)]
#: the trunk's features the decoder reads (c1..c5)
_FPN = (1, 3, 6, 10, 13)
#: the fusion stages: (A block, B block, the trunk feature's channels, upsampled)
_STAGES = [(15, 16, 64, False), (17, 18, 32, True), (19, 20, 24, True), (21, 22, 16, True)]
_INT32 = 2 ** 31


# ------------------------------------------------------------------------------------------ the file
def _blocks() -> list[tuple[int, int, int, int]]:
    """(input channels, output channels, stride, expansion) of the inverted residual blocks, features 1..13."""
    out, cin = [], 32
    for t, c, n, s in _SETTINGS:
        for i in range(n):
            out.append((cin, c, s if i == 0 else 1, t))
            cin = c
    return out


def _bn(out: dict[str, tuple[int, ...]], name: str, c: int) -> None:
    for p in ("weight", "bias", "running_mean", "running_var"):
        out[f"{name}.{p}"] = (c,)


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """The float tensors of ``mlsd_large_512_fp32.pth`` and their shapes (its BatchNorms' ``num_batches_tracked``
    are not read)."""
    out: dict[str, tuple[int, ...]] = {"backbone.features.0.0.weight": (32, 4, 3, 3)}
    _bn(out, "backbone.features.0.1", 32)
    for i, (cin, cout, _, t) in enumerate(_blocks(), start=1):
        p = f"backbone.features.{i}.conv"
        hidden = int(round(cin * t))
        k = 0
        if t != 1:
            out[f"{p}.0.0.weight"] = (hidden, cin, 1, 1)
            _bn(out, f"{p}.0.1", hidden)
            k = 1
        out[f"{p}.{k}.0.weight"] = (hidden, 1, 3, 3)
        _bn(out, f"{p}.{k}.1", hidden)
        out[f"{p}.{k + 1}.weight"] = (cout, hidden, 1, 1)
        _bn(out, f"{p}.{k + 2}", cout)
    for a, b, c_low, _ in _STAGES:
        c_in2 = 96 if a == 15 else 64
        for conv, cin in (("conv1", c_in2), ("conv2", c_low)):
            out[f"block{a}.{conv}.0.weight"] = (64, cin, 1, 1)
            out[f"block{a}.{conv}.0.bias"] = (64,)
            _bn(out, f"block{a}.{conv}.1", 64)
        for conv, cout in (("conv1", 128), ("conv2", 64)):
            out[f"block{b}.{conv}.0.weight"] = (cout, 128, 3, 3)
            out[f"block{b}.{conv}.0.bias"] = (cout,)
            _bn(out, f"block{b}.{conv}.1", cout)
    for conv in ("conv1", "conv2"):
        out[f"block23.{conv}.0.weight"] = (64, 64, 3, 3)
        out[f"block23.{conv}.0.bias"] = (64,)
        _bn(out, f"block23.{conv}.1", 64)
    out["block23.conv3.weight"] = (16, 64, 1, 1)
    out["block23.conv3.bias"] = (16,)
    return out


# ------------------------------------------------------------------------------------------ the network
def _conv_bn(net: Net, x: str, conv: str, bn: str, *, act: str | None, stride: int = 1, groups: int = 1,
             dilation: int = 1) -> str:
    """Conv + BatchNorm (+ ReLU6 or ReLU); a stride-2 conv pads right and down by one and no more (TFLite's way)."""
    if stride == 2:
        y = net.conv(x, conv, stride=2, pad=[0, 0, 1, 1], groups=groups)
    else:
        y = net.conv(x, conv, groups=groups, dilation=dilation)
    y = net.batch_norm(y, bn)
    if act == "relu6":
        return net.node("Clip", [y, net.const_f("zero", 0.0), net.const_f("six", 6.0)])
    return net.relu(y) if act == "relu" else y


def build_graph(arrays: Mapping[str, np.ndarray], height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of ``MobileV2_MLSD_Large`` for one ``(1, 4, height, width)`` input ``image``
    (``height`` and ``width`` multiples of 16) -> ``lines`` ``(1, 16, height / 2, width / 2)``: the head's 16
    channels, of which M-LSD reads 7 (centres) and 8-11 (displacements)."""
    net = _MlsdNet(arrays)
    x = _conv_bn(net, "image", "backbone.features.0.0", "backbone.features.0.1", act="relu6", stride=2)
    feats = []
    for i, (cin, cout, stride, t) in enumerate(_blocks(), start=1):
        p = f"backbone.features.{i}.conv"
        y, k = x, 0
        if t != 1:
            y = _conv_bn(net, y, f"{p}.0.0", f"{p}.0.1", act="relu6")
            k = 1
        hidden = int(round(cin * t))
        y = _conv_bn(net, y, f"{p}.{k}.0", f"{p}.{k}.1", act="relu6", stride=stride, groups=hidden)
        y = _conv_bn(net, y, f"{p}.{k + 1}", f"{p}.{k + 2}", act=None)
        x = net.add(x, y) if stride == 1 and cin == cout else y
        if i in _FPN:
            feats.append(x)
    c1, c2, c3, c4, c5 = feats
    x = c5
    for (a, b, _, up), low in zip(_STAGES, (c4, c3, c2, c1)):
        top = _conv_bn(net, x, f"block{a}.conv1.0", f"block{a}.conv1.1", act="relu")
        side = _conv_bn(net, low, f"block{a}.conv2.0", f"block{a}.conv2.1", act="relu")
        if up:
            top = net.resize(top, scale=2.0, mode="linear", align_corners=True)
        x = net.concat([side, top])
        x = net.add(_conv_bn(net, x, f"block{b}.conv1.0", f"block{b}.conv1.1", act="relu"), x)
        x = _conv_bn(net, x, f"block{b}.conv2.0", f"block{b}.conv2.1", act="relu")
    x = _conv_bn(net, x, "block23.conv1.0", "block23.conv1.1", act="relu", dilation=5)
    x = _conv_bn(net, x, "block23.conv2.0", "block23.conv2.1", act="relu")
    x = net.conv(x, "block23.conv3")
    return net.model("sdrt_mlsd_large", {"image": (1, 4, height, width)}, {x: "lines"})


class _MlsdNet(Net):
    def const_f(self, name: str, value: float) -> str:
        """A named float32 scalar, written once."""
        return name if name in self._have else self.const(name, np.array(value, np.float32))


# ------------------------------------------------------------------------------------------ around it
def prepare(rgb: np.ndarray) -> np.ndarray:
    """The network's ``(1, 4, H, W)`` float32 input of an RGB uint8 image: a channel of ones added, ``x / 127.5 -
    1`` in float32."""
    h, w = rgb.shape[:2]
    x = np.concatenate([rgb.astype(np.float32), np.ones((h, w, 1), np.float32)], axis=-1)
    x = x.transpose(2, 0, 1)[None] / np.float32(127.5) - np.float32(1.0)
    return np.ascontiguousarray(x, np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def top_centres(center: np.ndarray, topk: int = TOPK) -> tuple[np.ndarray, np.ndarray]:
    """``deccode_output_score_and_ptss``'s centres: ``(flat indices, scores)`` of the ``topk`` highest sigmoids of
    the ``(h, w)`` centre map that equal their 3x3 maximum, highest first (equal scores by position)."""
    heat = _sigmoid(center)
    h, w = heat.shape
    padded = np.pad(heat, 1, constant_values=-np.inf)
    hmax = np.max(np.stack([padded[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)]), axis=0)
    flat = (heat * (hmax == heat).astype(np.float32)).reshape(-1)
    order = np.argsort(-flat, kind="stable")[:topk]
    return order, flat[order]


def decode(out: np.ndarray, value_threshold: float = 0.1, distance_threshold: float = 0.1,
           topk: int = TOPK) -> np.ndarray:
    """``(n, 4)`` float64 line ends ``x0, y0, x1, y1`` in the image's pixels (twice the map's) from the network's
    ``(16, h, w)`` output, as ``pred_lines`` finds them; empty when the map has fewer than ``topk`` places (the
    extension's ``topk`` fails there and its map stays black)."""
    out = np.asarray(out, np.float32)
    center, disp = out[7], out[8:12].transpose(1, 2, 0)
    h, w = center.shape
    if h * w < topk:
        return np.zeros((0, 4))
    order, scores = top_centres(center, topk)
    start, end = disp[:, :, :2], disp[:, :, 2:]
    dist = np.sqrt(np.sum((start - end) ** 2, axis=-1))
    ys, xs = order // w, order % w
    with np.errstate(over="ignore"):  # a threshold beyond float32 (1e308) is infinite there, no line: no warning
        v, d = np.float32(value_threshold), np.float32(distance_threshold)
    ok = (scores > v) & (dist[ys, xs] > d)
    ys, xs = ys[ok], xs[ok]
    seg = disp[ys, xs].astype(np.float64)
    seg[:, 0::2] += xs[:, None]
    seg[:, 1::2] += ys[:, None]
    return 2 * seg


def draw_lines(lines: np.ndarray, height: int, width: int) -> np.ndarray:
    """The ``(height, width)`` uint8 map of the lines: each end truncated to an integer and drawn as
    ``cv2.line(..., (255, 255, 255), 1)``; an end OpenCV would refuse (NaN, infinite, or outside 32 bits) stops the
    drawing there, as the extension's ``try``/``except`` does."""
    from .cvdraw import line

    canvas = np.zeros((height, width, 1), np.uint8)
    for row in np.asarray(lines, np.float64).reshape(-1, 4):
        if not np.all(np.isfinite(row)):
            break
        ends = [int(v) for v in row]
        if any(not -_INT32 <= v < _INT32 for v in ends):
            break
        line(canvas, (ends[0], ends[1]), (ends[2], ends[3]), (255,))
    return canvas[:, :, 0]


# ------------------------------------------------------------------------------------------ the detector
class MLSD(AnnotatorNet):
    """``mlsd_large_512_fp32.pth`` compiled on one backend, one session per padded input size."""

    WHAT = "M-LSD's large model"
    FIX = f"pass lllyasviel's {MLSD_FILE} (lllyasviel/Annotators or lllyasviel/ControlNet annotator/ckpts)"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return expected_shapes()

    def build(self, height: int, width: int) -> Any:
        return build_graph(self.arrays(), height, width)

    def output(self, rgb: np.ndarray) -> np.ndarray:
        """The network's ``(16, H/2, W/2)`` output for an RGB uint8 image whose sides are multiples of 16."""
        h, w = rgb.shape[:2]
        return self.session(h, w).run({"image": prepare(rgb)})["lines"][0]

    def lines(self, rgb: np.ndarray, value_threshold: float = 0.1, distance_threshold: float = 0.1) -> np.ndarray:
        """``pred_lines``: the ``(n, 4)`` line ends of an RGB uint8 image, in its pixels; the image is padded with
        its edges to multiples of 64 first (the extension's processor pads every image so)."""
        h, w = rgb.shape[:2]
        padded = np.pad(rgb, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")
        return decode(self.output(padded), value_threshold, distance_threshold)

    def __call__(self, rgb: np.ndarray, value_threshold: float = 0.1, distance_threshold: float = 0.1) -> np.ndarray:
        """The ``(H, W)`` uint8 line map of an RGB uint8 image (padded to 64 and cropped back)."""
        h, w = rgb.shape[:2]
        lines = self.lines(rgb, value_threshold, distance_threshold)
        return draw_lines(lines, h + (-h % 64), w + (-w % 64))[:h, :w]


def line_map(rgb: np.ndarray, detector: MLSD, value_threshold: float = 0.1,
             distance_threshold: float = 0.1) -> np.ndarray:
    """The ``mlsd`` map (HxWx3 uint8) of an RGB uint8 image."""
    m = detector(rgb, value_threshold, distance_threshold)
    return np.ascontiguousarray(np.repeat(m[:, :, None], 3, axis=2))

