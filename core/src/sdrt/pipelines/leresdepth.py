"""LeReS depth: sd-webui-controlnet's ``depth_leres`` module, ``res101.pth`` run through sdrt.

The file is AdelaiDepth's LeReS checkpoint: a dict whose ``depth_model`` entry is the state dict of its
``RelDepthModel(backbone='resnext101')`` (names with DataParallel's ``module.`` prefix, which the extension strips):
a ResNeXt-101 32x8d encoder (torchvision's layout without its classifier: ``conv1``/``bn1``, ``layer1``-``layer4``
of 3, 4, 23 and 3 bottlenecks, grouped 3x3 convolutions of 32 groups) under ``depth_model.encoder_modules.encoder.``
and the LeReS decoder (``FTB`` blocks, three ``FFM`` fusions and the ``AO`` output head, bilinear upsampling with
aligned corners) under ``depth_model.decoder_modules.``. sdrt reads it with its safe torch-file reader and builds the
network as an ONNX graph in memory (:mod:`sdrt.pipelines.netgraph`), which runs on any backend, in float32. Blocks,
widths and groups are read from the file's shapes (the published file is the one above; a narrower file of the same
layout runs too).

Around the network, numpy follows the extension step for step (its processor's ``leres``, ``apply_leres`` and
``estimateleres``):

- the image (RGB, at the processor resolution, padded with its edges to multiples of 64 by
  ``resize_image_with_pad``; sdrt pads an image given at its own size the same way) goes in whole, its channels
  reversed (BGR), as float32 ``(x - mean) / std`` with ImageNet's mean and std and **no** ``/ 255`` (torchvision's
  ``ToTensor`` leaves a float32 array's values as they are, so the network reads 0..255 values so normalised);
- the depth, over the whole padded image: ``65535 * (d - min) / (max - min)`` in float32 (all 0 when ``max - min``
  is not above float64's epsilon), truncated to uint16, then OpenCV's ``convertScaleAbs`` by ``255 / 65535``
  (rounded to nearest, ties to even);
- "Remove Near %" (``threshold_a``, default 0): when not 0, values not above ``floor(a / 100 * 255)`` become 0
  (OpenCV's ``THRESH_TOZERO`` on uint8); then the map is inverted (``255 - v``); "Remove Background %"
  (``threshold_b``, default 0) does the same to the inverted map;
- the map is cropped back to the resized image's size.

The extension's ``depth_leres++`` runs the same network inside the BoostingMonocularDepth merge (several resolutions
and patches, merged by a pix2pix generator, ``latest_net_G.pth``): :mod:`sdrt.pipelines.leresboost`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .netgraph import AnnotatorNet, Net

__all__ = ["LERES_FILE", "PUBLISHED", "Config", "LeresDepth", "build_graph", "config_of", "depth_map",
           "expected_shapes", "prepare", "to_uint8"]

LERES_FILE = "res101.pth"
ENC = "depth_model.encoder_modules.encoder."
DEC = "depth_model.decoder_modules."
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
_EPS = 1e-5


@dataclass(frozen=True)
class Config:
    """The network's sizes: the stem's channels; per encoder stage its bottlenecks, inner (grouped) width and output
    channels; the 3x3 convolutions' groups; the decoder's widths (``FFM`` 0, 1, 2 and the top ``FTB``)."""

    stem: int
    layers: tuple[int, int, int, int]
    widths: tuple[int, int, int, int]
    outs: tuple[int, int, int, int]
    groups: int
    mids: tuple[int, int, int, int]


#: res101.pth: ResNeXt-101 32x8d and the LeReS decoder (115.6 M float32 values)
PUBLISHED = Config(64, (3, 4, 23, 3), (256, 512, 1024, 2048), (256, 512, 1024, 2048), 32, (256, 256, 256, 512))


def _bn(out: dict[str, tuple[int, ...]], name: str, c: int) -> None:
    for p in ("weight", "bias", "running_mean", "running_var"):
        out[f"{name}.{p}"] = (c,)


def config_of(shapes: Mapping[str, Sequence[int]]) -> Config:
    """The network a file holds, from its tensors' bare names and shapes; the published one where the file does not
    say (so that a file missing tensors is named by what it lacks)."""
    try:
        stem = int(shapes[ENC + "conv1.weight"][0])
        layers, widths, outs = [], [], []
        for s in range(1, 5):
            n = 0
            while f"{ENC}layer{s}.{n}.conv1.weight" in shapes:
                n += 1
            if not n:
                return PUBLISHED
            layers.append(n)
            widths.append(int(shapes[f"{ENC}layer{s}.0.conv1.weight"][0]))
            outs.append(int(shapes[f"{ENC}layer{s}.0.conv3.weight"][0]))
        per_group = int(shapes[f"{ENC}layer1.0.conv2.weight"][1])
        if per_group < 1 or any(w % per_group for w in widths):
            return PUBLISHED
        mids = tuple(int(shapes[f"{DEC}ffm{k}.ftb1.conv1.weight"][0]) for k in range(3))
        top = int(shapes[DEC + "conv.conv1.weight"][0])
        cfg = Config(stem, tuple(layers), tuple(widths), tuple(outs), widths[0] // per_group, (*mids, top))
    except (KeyError, IndexError, TypeError, ValueError):
        return PUBLISHED
    if any(w % cfg.groups for w in cfg.widths) or cfg.mids[0] % 2:
        return PUBLISHED
    return cfg


def expected_shapes(cfg: Config = PUBLISHED) -> dict[str, tuple[int, ...]]:
    """The float tensors of a ``RelDepthModel`` state dict of the configuration and their shapes, by bare name
    (BatchNorms' ``num_batches_tracked`` are not read)."""
    out: dict[str, tuple[int, ...]] = {ENC + "conv1.weight": (cfg.stem, 3, 7, 7)}
    _bn(out, ENC + "bn1", cfg.stem)
    cin = cfg.stem
    for s in range(4):
        width, cout = cfg.widths[s], cfg.outs[s]
        for b in range(cfg.layers[s]):
            p = f"{ENC}layer{s + 1}.{b}."
            out[p + "conv1.weight"] = (width, cin if b == 0 else cout, 1, 1)
            _bn(out, p + "bn1", width)
            out[p + "conv2.weight"] = (width, width // cfg.groups, 3, 3)
            _bn(out, p + "bn2", width)
            out[p + "conv3.weight"] = (cout, width, 1, 1)
            _bn(out, p + "bn3", cout)
            if b == 0:
                out[p + "downsample.0.weight"] = (cout, cin, 1, 1)
                _bn(out, p + "downsample.1", cout)
        cin = cout

    def ftb(p: str, cin: int, mid: int) -> None:
        out[p + "conv1.weight"] = (mid, cin, 3, 3)
        out[p + "conv1.bias"] = (mid,)
        out[p + "conv_branch.1.weight"] = (mid, mid, 3, 3)
        out[p + "conv_branch.1.bias"] = (mid,)
        _bn(out, p + "conv_branch.2", mid)
        out[p + "conv_branch.4.weight"] = (mid, mid, 3, 3)
        out[p + "conv_branch.4.bias"] = (mid,)

    m0, m1, m2, m3 = cfg.mids
    ftb(DEC + "conv.", cfg.outs[3], m3)
    out[DEC + "conv1.weight"] = (m2, m3, 3, 3)
    out[DEC + "conv1.bias"] = (m2,)
    for k, m in ((2, m2), (1, m1), (0, m0)):
        ftb(f"{DEC}ffm{k}.ftb1.", cfg.outs[k], m)
        ftb(f"{DEC}ffm{k}.ftb2.", m, m)
    out[DEC + "outconv.adapt_conv.0.weight"] = (m0 // 2, m0, 3, 3)
    out[DEC + "outconv.adapt_conv.0.bias"] = (m0 // 2,)
    _bn(out, DEC + "outconv.adapt_conv.1", m0 // 2)
    out[DEC + "outconv.adapt_conv.3.weight"] = (1, m0 // 2, 3, 3)
    out[DEC + "outconv.adapt_conv.3.bias"] = (1,)
    return out


# ------------------------------------------------------------------------------------------ the network
def build_graph(arrays: Mapping[str, np.ndarray], cfg: Config, height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of LeReS's depth model for one ``(1, 3, height, width)`` normalised ``image`` (sides
    multiples of 32) -> ``depth`` ``(1, 1, height, width)``."""
    net = Net(arrays)

    def cbr(x: str, conv: str, bn: str, relu: bool = True, **kw: Any) -> str:
        y = net.batch_norm(net.conv(x, conv, **kw), bn, _EPS)
        return net.relu(y) if relu else y

    x = cbr("image", ENC + "conv1", ENC + "bn1", stride=2, pad=3)
    x = net.max_pool(x, 3, 2, pad=1)
    feats = []
    for s in range(4):
        for b in range(cfg.layers[s]):
            p = f"{ENC}layer{s + 1}.{b}."
            stride = 2 if s > 0 and b == 0 else 1
            y = cbr(x, p + "conv1", p + "bn1", pad=0)
            y = cbr(y, p + "conv2", p + "bn2", stride=stride, pad=1, groups=cfg.groups)
            y = cbr(y, p + "conv3", p + "bn3", relu=False, pad=0)
            short = cbr(x, p + "downsample.0", p + "downsample.1", relu=False, stride=stride, pad=0) if b == 0 else x
            x = net.relu(net.add(y, short))
        feats.append(x)

    def ftb(x: str, p: str) -> str:
        # the branch's first ReLU is in place: it turns conv1's output itself to relu(.) before the sum reads it
        y = net.relu(net.conv(x, p + "conv1", pad=1))
        z = net.relu(net.batch_norm(net.conv(y, p + "conv_branch.1", pad=1), p + "conv_branch.2", _EPS))
        return net.relu(net.add(y, net.conv(z, p + "conv_branch.4", pad=1)))

    def up(x: str) -> str:
        return net.resize(x, scale=2.0, mode="linear", align_corners=True)

    x = up(net.conv(ftb(feats[3], DEC + "conv."), DEC + "conv1", pad=1))
    for k in (2, 1, 0):
        x = up(ftb(net.add(ftb(feats[k], f"{DEC}ffm{k}.ftb1."), x), f"{DEC}ffm{k}.ftb2."))
    y = net.relu(net.batch_norm(net.conv(x, DEC + "outconv.adapt_conv.0", pad=1), DEC + "outconv.adapt_conv.1", _EPS))
    y = up(net.conv(y, DEC + "outconv.adapt_conv.3", pad=1))
    return net.model("sdrt_leres", {"image": (1, 3, height, width)}, {y: "depth"})


# ------------------------------------------------------------------------------------------ around it
def prepare(rgb: np.ndarray) -> np.ndarray:
    """The network's ``(1, 3, H, W)`` float32 input of an RGB uint8 image as ``estimateleres`` makes it: channels
    reversed (BGR), the values as they are (0..255: ``ToTensor`` of a float32 array does not scale), then ImageNet's
    ``Normalize`` (subtract, divide, in float32)."""
    x = rgb[:, :, ::-1].astype(np.float32)
    x = (x - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], np.float32)


def to_uint8(depth: np.ndarray) -> np.ndarray:
    """``apply_leres``' 8-bit depth of the network's raw depth (HxW): min-max to 0..65535 in float32, truncated to
    uint16, then ``convertScaleAbs(alpha=255 / 65535)`` (float32 product, rounded half to even)."""
    d = np.asarray(depth, np.float32)
    lo, hi = d.min(), d.max()
    if float(hi - lo) > np.finfo(float).eps:
        out = (np.float32(65535) * (d - lo)) / (hi - lo)
        u16 = out.astype(np.uint16)
    else:
        u16 = np.zeros(d.shape, np.uint16)
    v = np.rint(u16.astype(np.float32) * np.float32(255.0 / 65535.0))
    return np.clip(v, 0, 255).astype(np.uint8)


def _to_zero(a: np.ndarray, percent: float) -> np.ndarray:
    """OpenCV's ``threshold(a, percent / 100 * 255, 255, THRESH_TOZERO)`` of a uint8 map (the level floored)."""
    level = np.floor((percent / 100) * 255)
    return np.where(a > level, a, np.uint8(0)).astype(np.uint8)


def depth_map(depth: np.ndarray, near: float = 0.0, background: float = 0.0) -> np.ndarray:
    """The ``depth_leres`` map (HxW uint8) of the network's raw depth: :func:`to_uint8`, "Remove Near %" (``near``),
    inverted, "Remove Background %" (``background``), each threshold skipped at 0 as the extension skips it."""
    m = to_uint8(depth)
    if near != 0:
        m = _to_zero(m, near)
    m = (255 - m).astype(np.uint8)
    if background != 0:
        m = _to_zero(m, background)
    return m


# ------------------------------------------------------------------------------------------ the detector
def _strip(name: str) -> str:
    """A file's tensor name as ``RelDepthModel`` names it: without the checkpoint's ``depth_model`` entry and
    DataParallel's ``module.``."""
    for prefix in ("depth_model.module.", "module."):
        if name.startswith(prefix):
            return name[len(prefix):]
    if name.startswith("depth_model.depth_model."):
        return name[len("depth_model."):]
    return name


class LeresDepth(AnnotatorNet):
    """``res101.pth`` compiled on one backend, one session per padded input size; ``depth(rgb)`` -> the raw depth,
    ``__call__(rgb, near, background)`` -> the extension's ``depth_leres`` map."""

    WHAT = "LeReS's depth model (res101.pth)"
    FIX = f"pass LeReS's {LERES_FILE} (lllyasviel/Annotators)"

    strip = staticmethod(_strip)
    ARCH = (config_of, expected_shapes, build_graph)

    def depth(self, rgb: np.ndarray) -> np.ndarray:
        """The network's depth (HxW float32) of an RGB uint8 image whose sides are multiples of 32."""
        h, w = rgb.shape[:2]
        if h % 32 or w % 32:
            raise InputError(f"sdrt.pipelines.leresdepth: the image is {w}x{h}; LeReS reads sides that are "
                             "multiples of 32", where="image", fix="pad it (calling the detector pads to 64 as the "
                                                                   "extension does)")
        return np.asarray(self.session(h, w).run({"image": prepare(rgb)})["depth"][0, 0], np.float32)

    def __call__(self, rgb: np.ndarray, near: float = 0.0, background: float = 0.0) -> np.ndarray:
        """The ``depth_leres`` map (HxW uint8) of an RGB uint8 image: padded with its edges to multiples of 64 (the
        extension's processor pads every image so), scaled over the padded depth, cropped back."""
        h, w = rgb.shape[:2]
        padded = np.pad(rgb, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")
        return np.ascontiguousarray(depth_map(self.depth(padded), near, background)[:h, :w])
