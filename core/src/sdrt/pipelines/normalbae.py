"""Bae et al.'s surface normals: sd-webui-controlnet's ``normal_bae`` module, ``scannet.pt`` run through sdrt.

The file is a training checkpoint whose ``model`` entry is the state dict of ``NNET`` (the extension's
``annotator/normalbae``): an EfficientNet-B5 encoder (``tf_efficientnet_b5_ap`` from the gen-efficientnet code the
extension ships: TensorFlow's "same" padding, BatchNorm eps 1e-3, SiLU, squeeze-excitation) and the ``BN`` decoder
(four upsampling stages and three per-pixel refinement heads). sdrt reads it with its safe torch-file reader and
builds the network as an ONNX graph in memory (:mod:`sdrt.pipelines.netgraph`), which runs on any backend. The
blocks, channels and kernels are read from the file's shapes (``scannet.pt`` is B5's 39 blocks; a narrower file
of the same layout runs as well); the strides are EfficientNet's (1, 2, 2, 2, 1, 2, 1 per stage).

Around the network, numpy follows the extension (``normal_bae`` in its processor, ``NormalBaeDetector.__call__``):

- the image (RGB, at the processor resolution and padded with its edges to multiples of 64 by
  ``resize_image_with_pad``; sdrt pads an image given at its own size the same way) goes in at its own size as
  ``(x / 255 - mean) / std`` with ImageNet's mean and std, in float32;
- of the decoder's outputs the last (full resolution) is used, its first three channels (the unit normal x, y, z;
  the fourth, the confidence, is not), with no sign flip and no reordering;
- each becomes ``((n + 1) * 0.5)`` clipped to 0..1, then ``(v * 255)`` clipped and truncated to uint8, as RGB;
- the map is cropped back to the resized image's size.

Inside the encoder the stride-2 convolutions pad as TensorFlow does ("same": the extra row and column go to the
bottom and right), which the graph writes as asymmetric pads for the input size it is built for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet, Net

__all__ = ["B5", "NORMALBAE_FILE", "NormalBae", "build_graph", "config_of", "expected_shapes", "normal_map",
           "prepare", "to_map"]

NORMALBAE_FILE = "scannet.pt"
ENC = "encoder.original_model."
#: EfficientNet's stage strides (every variant)
STRIDES = (1, 2, 2, 2, 1, 2, 1)
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
#: the decoder's widths after up2, up3, up4 (its forward reads them as constants)
FIXED = (512, 256, 128)
_ENC_EPS = 1e-3
_DEC_EPS = 1e-5


@dataclass(frozen=True)
class Block:
    """One encoder block: "ds" (depthwise separable, stage 0) or "ir" (inverted residual)."""

    kind: str
    cin: int
    hidden: int
    cout: int
    kernel: int
    se: int
    stride: int


@dataclass(frozen=True)
class Config:
    stem: int
    stages: tuple[tuple[Block, ...], ...]
    head: int
    up1: int


def _b5() -> Config:
    """scannet.pt's encoder: tf_efficientnet_b5_ap (channel multiplier 1.6, depth 2.2)."""
    chans, repeats = (24, 40, 64, 128, 176, 304, 512), (3, 5, 5, 7, 7, 9, 3)
    kernels, expand = (3, 3, 5, 3, 5, 5, 3), (1, 6, 6, 6, 6, 6, 6)
    stages, cin = [], 48
    for s in range(7):
        blocks = []
        for i in range(repeats[s]):
            hidden = cin * expand[s]
            blocks.append(Block("ds" if s == 0 else "ir", cin, hidden, chans[s], kernels[s], max(1, int(cin * 0.25)),
                                STRIDES[s] if i == 0 else 1))
            cin = chans[s]
        stages.append(tuple(blocks))
    return Config(48, tuple(stages), 2048, 1024)


B5 = _b5()


def _bn(out: dict[str, tuple[int, ...]], name: str, c: int) -> None:
    for p in ("weight", "bias", "running_mean", "running_var"):
        out[f"{name}.{p}"] = (c,)


def config_of(shapes: Mapping[str, Sequence[int]]) -> Config:
    """The network a file holds, read from its tensors' bare names and shapes (blocks per stage, channels,
    kernels); B5's where the file does not say (so that a file missing tensors is named by what it lacks)."""
    try:
        stem = int(shapes[ENC + "conv_stem.weight"][0])
        stages, cin = [], stem
        for s in range(7):
            blocks = []
            while f"{ENC}blocks.{s}.{len(blocks)}.conv_dw.weight" in shapes:
                p = f"{ENC}blocks.{s}.{len(blocks)}."
                dw = shapes[p + "conv_dw.weight"]
                if p + "conv_pwl.weight" in shapes:
                    kind, cout = "ir", int(shapes[p + "conv_pwl.weight"][0])
                else:
                    kind, cout = "ds", int(shapes[p + "conv_pw.weight"][0])
                blocks.append(Block(kind, cin, int(dw[0]), cout, int(dw[2]), int(shapes[p + "se.conv_reduce.weight"][0]),
                                    STRIDES[s] if not blocks else 1))
                cin = cout
            if not blocks:
                return B5
            stages.append(tuple(blocks))
        return Config(stem, tuple(stages), int(shapes[ENC + "conv_head.weight"][0]),
                      int(shapes["decoder.up1._net.0.weight"][0]))
    except (KeyError, IndexError, TypeError):
        return B5


def expected_shapes(cfg: Config = B5) -> dict[str, tuple[int, ...]]:
    """The float tensors of an ``NNET`` (BN decoder) state dict of the configuration and their shapes, by bare name
    (BatchNorms' ``num_batches_tracked`` are not read; the encoder's ``bn2`` after ``conv_head`` is checked, though
    the decoder never sees it; the classifier, which NNET drops, is not in the file)."""
    out: dict[str, tuple[int, ...]] = {ENC + "conv_stem.weight": (cfg.stem, 3, 3, 3)}
    _bn(out, ENC + "bn1", cfg.stem)
    for s, stage in enumerate(cfg.stages):
        for i, b in enumerate(stage):
            p = f"{ENC}blocks.{s}.{i}."
            if b.kind == "ir":
                out[p + "conv_pw.weight"] = (b.hidden, b.cin, 1, 1)
                _bn(out, p + "bn1", b.hidden)
            out[p + "conv_dw.weight"] = (b.hidden, 1, b.kernel, b.kernel)
            _bn(out, p + ("bn2" if b.kind == "ir" else "bn1"), b.hidden)
            out[p + "se.conv_reduce.weight"] = (b.se, b.hidden, 1, 1)
            out[p + "se.conv_reduce.bias"] = (b.se,)
            out[p + "se.conv_expand.weight"] = (b.hidden, b.se, 1, 1)
            out[p + "se.conv_expand.bias"] = (b.hidden,)
            if b.kind == "ir":
                out[p + "conv_pwl.weight"] = (b.cout, b.hidden, 1, 1)
                _bn(out, p + "bn3", b.cout)
            else:
                out[p + "conv_pw.weight"] = (b.cout, b.hidden, 1, 1)
                _bn(out, p + "bn2", b.cout)
    last = cfg.stages[-1][-1].cout
    out[ENC + "conv_head.weight"] = (cfg.head, last, 1, 1)
    _bn(out, ENC + "bn2", cfg.head)
    out["decoder.conv2.weight"] = (cfg.head, cfg.head, 1, 1)
    out["decoder.conv2.bias"] = (cfg.head,)
    skips = [cfg.stages[i][-1].cout for i in (4, 2, 1, 0)]
    widths = (cfg.up1, *FIXED)
    cin = cfg.head
    for k, (skip, width) in enumerate(zip(skips, widths), start=1):
        for j, c in ((0, cin + skip), (3, width)):
            out[f"decoder.up{k}._net.{j}.weight"] = (width, c, 3, 3)
            out[f"decoder.up{k}._net.{j}.bias"] = (width,)
            _bn(out, f"decoder.up{k}._net.{j + 1}", width)
        cin = width
    out["decoder.out_conv_res8.weight"] = (4, FIXED[0], 3, 3)
    out["decoder.out_conv_res8.bias"] = (4,)
    for name, c in (("res4", FIXED[0]), ("res2", FIXED[1]), ("res1", FIXED[2])):
        for j, (o, i) in zip((0, 2, 4, 6), ((128, c + 4), (128, 128), (128, 128), (4, 128))):
            out[f"decoder.out_conv_{name}.{j}.weight"] = (o, i, 1)
            out[f"decoder.out_conv_{name}.{j}.bias"] = (o,)
    return out


# ------------------------------------------------------------------------------------------ the network
def _same(size: int, k: int, stride: int) -> tuple[int, int, int]:
    """TensorFlow's "same" padding of one side: (before, after, output size)."""
    out = -(-size // stride)
    pad = max((out - 1) * stride + k - size, 0)
    return pad // 2, pad - pad // 2, out


class _Builder:
    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        flat = dict(arrays)
        for n, a in arrays.items():  # the heads' Conv1d(k=1) weights as 1x1 Conv2d
            if n.startswith("decoder.out_conv_res") and n.endswith(".weight") and np.ndim(a) == 3:
                flat[n] = np.asarray(a).reshape(*np.shape(a), 1)
        self.net = Net(flat)

    def silu(self, x: str) -> str:
        return self.net.mul(x, self.net.sigmoid(x))

    def conv_same(self, x: str, name: str, size: tuple[int, int], stride: int, groups: int = 1
                  ) -> tuple[str, tuple[int, int]]:
        k = int(np.shape(self.net.arrays[f"{name}.weight"])[2])
        t, b, h = _same(size[0], k, stride)
        left, right, w = _same(size[1], k, stride)
        return self.net.conv(x, name, stride=stride, pad=[t, left, b, right], groups=groups), (h, w)

    def se(self, x: str, p: str) -> str:
        net = self.net
        s = net.node("GlobalAveragePool", [x])
        s = self.silu(net.conv(s, p + "se.conv_reduce", pad=0))
        s = net.sigmoid(net.conv(s, p + "se.conv_expand", pad=0))
        return net.mul(x, s)

    def leaky(self, x: str) -> str:
        return self.net.node("LeakyRelu", [x], alpha=0.01)

    def up(self, x: str, skip: str, size: tuple[int, int], name: str) -> str:
        net = self.net
        y = net.concat([net.resize(x, size=size, mode="linear", align_corners=True), skip])
        y = self.leaky(net.batch_norm(net.conv(y, f"{name}._net.0", pad=1), f"{name}._net.1", _DEC_EPS))
        return self.leaky(net.batch_norm(net.conv(y, f"{name}._net.3", pad=1), f"{name}._net.4", _DEC_EPS))

    def normalize(self, x: str) -> str:
        """``norm_normalize``: x, y, z over their length (+ 1e-10), the confidence ``elu(k) + 1.01``."""
        net = self.net
        xyz = net.node("Slice", [x, net.ints(0), net.ints(3), net.ints(1)])
        kappa = net.node("Slice", [x, net.ints(3), net.ints(4), net.ints(1)])
        norm = net.node("ReduceSum", [net.mul(xyz, xyz), net.ints(1)], keepdims=1)
        norm = net.add(net.node("Sqrt", [norm]), net.scalar(1e-10))
        kappa = net.add(net.add(net.node("Elu", [kappa], alpha=1.0), net.scalar(1.0)), net.scalar(0.01))
        return net.concat([net.node("Div", [xyz, norm]), kappa])

    def head(self, feat: str, prev: str, name: str) -> str:
        net = self.net
        y = net.concat([net.resize(feat, scale=2.0, mode="linear", align_corners=True),
                        net.resize(prev, scale=2.0, mode="linear", align_corners=True)])
        for j in (0, 2, 4):
            y = net.relu(net.conv(y, f"{name}.{j}", pad=0))
        return self.normalize(net.conv(y, f"{name}.6", pad=0))


def build_graph(arrays: Mapping[str, np.ndarray], cfg: Config, height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of ``NNET`` for one ``(1, 3, height, width)`` normalised ``image`` (sides multiples
    of 32) -> ``normal`` ``(1, 3, height, width)``: the last output's unit normals."""
    bld = _Builder(arrays)
    net = bld.net
    x, size = bld.conv_same("image", ENC + "conv_stem", (height, width), 2)
    x = bld.silu(net.batch_norm(x, ENC + "bn1", _ENC_EPS))
    feats, sizes = [], []
    for s, stage in enumerate(cfg.stages):
        for i, b in enumerate(stage):
            p = f"{ENC}blocks.{s}.{i}."
            y = x
            if b.kind == "ir":
                y = bld.silu(net.batch_norm(net.conv(y, p + "conv_pw", pad=0), p + "bn1", _ENC_EPS))
            y, out_size = bld.conv_same(y, p + "conv_dw", size, b.stride, groups=b.hidden)
            y = bld.silu(net.batch_norm(y, p + ("bn2" if b.kind == "ir" else "bn1"), _ENC_EPS))
            y = bld.se(y, p)
            if b.kind == "ir":
                y = net.batch_norm(net.conv(y, p + "conv_pwl", pad=0), p + "bn3", _ENC_EPS)
            else:
                y = net.batch_norm(net.conv(y, p + "conv_pw", pad=0), p + "bn2", _ENC_EPS)
            x = net.add(x, y) if b.stride == 1 and b.cin == b.cout else y
            size = out_size
        feats.append(x)
        sizes.append(size)
    x = net.conv(x, ENC + "conv_head", pad=0)  # the decoder reads conv_head's output, before bn2 and its SiLU
    d0 = net.conv(x, "decoder.conv2", pad=0)
    d1 = bld.up(d0, feats[4], sizes[4], "decoder.up1")
    d2 = bld.up(d1, feats[2], sizes[2], "decoder.up2")
    d3 = bld.up(d2, feats[1], sizes[1], "decoder.up3")
    d4 = bld.up(d3, feats[0], sizes[0], "decoder.up4")
    out = bld.normalize(net.conv(d2, "decoder.out_conv_res8", pad=1))
    out = bld.head(d2, out, "decoder.out_conv_res4")
    out = bld.head(d3, out, "decoder.out_conv_res2")
    out = bld.head(d4, out, "decoder.out_conv_res1")
    normal = net.node("Slice", [out, net.ints(0), net.ints(3), net.ints(1)])
    return net.model("sdrt_normalbae", {"image": (1, 3, height, width)}, {normal: "normal"})


# ------------------------------------------------------------------------------------------ around it
def prepare(rgb: np.ndarray) -> np.ndarray:
    """The network's ``(1, 3, H, W)`` float32 input of an RGB uint8 image: ``x / 255``, then torchvision's
    ``Normalize`` with ImageNet's mean and std (subtract, divide, in float32)."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], np.float32)


def to_map(normal: np.ndarray) -> np.ndarray:
    """The ``(H, W, 3)`` uint8 map of the network's ``(3, H, W)`` normals: ``((n + 1) * 0.5)`` clipped to 0..1,
    times 255, clipped and truncated, channels x, y, z as R, G, B."""
    n = np.asarray(normal, np.float32)
    n = np.clip((n + np.float32(1)) * np.float32(0.5), 0, 1).transpose(1, 2, 0)
    return np.ascontiguousarray(np.clip(n * np.float32(255.0), 0, 255).astype(np.uint8))


# ------------------------------------------------------------------------------------------ the detector
def _strip(name: str) -> str:
    """A file's tensor name without the checkpoint's ``model.`` entry and DataParallel's ``module.``."""
    for prefix in ("model.", "module."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


class NormalBae(AnnotatorNet):
    """``scannet.pt`` compiled on one backend, one session per padded input size."""

    WHAT = "Bae et al.'s surface normal model (NNET, scannet.pt)"
    FIX = f"pass lllyasviel's {NORMALBAE_FILE} (lllyasviel/Annotators)"

    strip = staticmethod(_strip)
    ARCH = (config_of, expected_shapes, build_graph)

    def normals(self, rgb: np.ndarray) -> np.ndarray:
        """The network's ``(3, H, W)`` unit normals for an RGB uint8 image whose sides are multiples of 32."""
        h, w = rgb.shape[:2]
        return self.session(h, w).run({"image": prepare(rgb)})["normal"][0]

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        """The ``(H, W, 3)`` uint8 normal map of an RGB uint8 image, padded with its edges to multiples of 64 (the
        extension's processor pads every image so) and cropped back."""
        h, w = rgb.shape[:2]
        padded = np.pad(rgb, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")
        return np.ascontiguousarray(to_map(self.normals(padded))[:h, :w])


def normal_map(rgb: np.ndarray, detector: NormalBae) -> np.ndarray:
    """The ``normal_bae`` map (HxWx3 uint8) of an RGB uint8 image."""
    return detector(rgb)

