"""The anime face segmentation UNet: sd-webui-controlnet's ``seg_anime_face`` module (``UNet.pth``) in sdrt.

The file is the state dict of the extension's ``annotator/anime_face_segment`` ``UNet`` (names with or without
DataParallel's ``module.``): a MobileNetV2 encoder (torchvision's ``features[0..16]`` as ``en_block0`` to
``en_block4``: Conv-BN-ReLU6 stem, inverted residual blocks) and a decoder of five stages (nearest 2x upsampling,
3x3 conv, InstanceNorm without affine, LeakyReLU 0.1; each resized bilinearly with ``align_corners=True`` to the
skip's size and concatenated with it), the last a 7-class conv and a softmax. sdrt reads it with its safe
torch-file reader and builds the network as an ONNX graph in memory (:mod:`sdrt.pipelines.netgraph`).

Around the network, numpy (and Pillow's resize) follows the extension (``anime_face_segment`` in its processor,
``AnimeFaceSegment.__call__``):

- the image (RGB, at the processor resolution, padded with its edges to multiples of 64) is resized by
  torchvision's ``Resize(512, BICUBIC)`` on a PIL image: its shorter side to 512, the longer ``int(512 * long /
  short)``, Pillow's bicubic (an image already 512 on its shorter side is not resampled);
- ``ToTensor``: ``x / 255``, no normalisation;
- each pixel's class is the argmax of the 7 outputs (the softmax keeps the order), painted with the module's
  colours (background yellow, hair blue, eye red, mouth white, face green, skin cyan, clothes magenta);
- the extension's crop then takes the top-left ``h x w`` of that map (``h x w``: the image at the processor
  resolution before its padding), whatever size the map has: at a resolution other than 512 the map is at 512, so
  the crop is a corner of it (or all of it, smaller than ``h x w``, above 512), as in the extension.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet, Net

__all__ = ["ANIME_FACE_FILE", "PALETTE", "AnimeFaceSeg", "build_graph", "check_size", "expected_shapes", "face_map",
           "net_size"]

ANIME_FACE_FILE = "UNet.pth"
#: background, hair, eye, mouth, face, skin, clothes (the module's COLOR_* in its PALETTE order)
PALETTE = np.array([(255, 255, 0), (0, 0, 255), (255, 0, 0), (255, 255, 255), (0, 255, 0), (0, 255, 255),
                    (255, 0, 255)], np.uint8)
#: the largest image the network reads, as the other networks' (``preprocessors.MAX_NET_PIXELS``; not imported from
#: there: preprocessors imports this module)
MAX_NET_PIXELS = 2048 * 8192
#: MobileNetV2's inverted residual settings (expansion, channels, repeats, first stride) for features[1..16]
_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2))
#: the features each encoder block holds (en_block0: 0 and 1, ...)
_BLOCKS = ((0, 1), (2, 3), (4, 5, 6), (7, 8, 9, 10, 11, 12, 13), (14, 15, 16))
#: the decoder: (block, out channels, in channels)
_DECODER = (("de_block4", 96, 160), ("de_block3", 32, 192), ("de_block2", 24, 64), ("de_block1", 16, 48),
            ("de_block0", 7, 32))


def _features() -> list[tuple[int, int, int, int]]:
    """``(expansion, in, out, stride)`` of features[1..16]."""
    out, cin = [], 32
    for t, c, n, s in _SETTINGS:
        for i in range(n):
            out.append((t, cin, c, s if i == 0 else 1))
            cin = c
    return out


def _name(f: int) -> str:
    """The UNet's name of torchvision's ``features[f]``."""
    b = next(i for i, fs in enumerate(_BLOCKS) if f in fs)
    return f"en_block{b}.{_BLOCKS[b].index(f)}"


def _bn(out: dict[str, tuple[int, ...]], name: str, c: int) -> None:
    for p in ("weight", "bias", "running_mean", "running_var"):
        out[f"{name}.{p}"] = (c,)


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """The UNet's float tensors and their shapes (BatchNorms' ``num_batches_tracked`` are not read)."""
    out: dict[str, tuple[int, ...]] = {f"{_name(0)}.0.weight": (32, 3, 3, 3)}
    _bn(out, f"{_name(0)}.1", 32)
    for f, (t, cin, cout, _s) in enumerate(_features(), start=1):
        p = f"{_name(f)}.conv."
        hidden = cin * t
        j = 0
        if t != 1:
            out[f"{p}0.0.weight"] = (hidden, cin, 1, 1)
            _bn(out, f"{p}0.1", hidden)
            j = 1
        out[f"{p}{j}.0.weight"] = (hidden, 1, 3, 3)
        _bn(out, f"{p}{j}.1", hidden)
        out[f"{p}{j + 1}.weight"] = (cout, hidden, 1, 1)
        _bn(out, f"{p}{j + 2}", cout)
    for name, cout, cin in _DECODER:
        out[f"{name}.1.weight"], out[f"{name}.1.bias"] = (cout, cin, 3, 3), (cout,)
    return out


def build_graph(arrays: Mapping[str, np.ndarray], height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` for one ``(1, 3, height, width)`` ``image`` (``x / 255``) -> ``scores`` (1, 7, H2,
    W2): the decoder's last conv (before the softmax, which keeps the argmax)."""
    net = Net(arrays)

    def cbr(x: str, name: str, stride: int = 1, groups: int = 1) -> str:
        y = net.batch_norm(net.conv(x, f"{name}.0", stride=stride, groups=groups, bias=False), f"{name}.1")
        return net.node("Clip", [y, net.scalar(0.0), net.scalar(6.0)])  # ReLU6

    x = cbr("image", _name(0), stride=2)
    h, w = -(-height // 2), -(-width // 2)
    skips = []
    for f, (t, cin, cout, s) in enumerate(_features(), start=1):
        p = f"{_name(f)}.conv."
        hidden = cin * t
        y, j = x, 0
        if t != 1:
            y, j = cbr(y, p + "0"), 1
        y = cbr(y, f"{p}{j}", stride=s, groups=hidden)
        y = net.batch_norm(net.conv(y, f"{p}{j + 1}", pad=0, bias=False), f"{p}{j + 2}")
        x = net.add(x, y) if s == 1 and cin == cout else y
        if s == 2:
            h, w = -(-h // 2), -(-w // 2)
        if f in (1, 3, 6, 13, 16):  # the ends of en_block0..4
            skips.append((x, (h, w)))
    y = skips[4][0]
    for k, (name, cout, _cin) in enumerate(_DECODER):
        y = net.resize(y, scale=2.0, mode="nearest")
        y = net.conv(y, f"{name}.1", pad=1)
        if name == "de_block0":
            break
        y = net.group_norm(y, None, cout, cout, eps=1e-5)
        y = net.node("LeakyRelu", [y], alpha=0.1)
        skip, size = skips[3 - k]
        y = net.concat([net.resize(y, size=size, mode="linear", align_corners=True), skip])
    return net.model("sdrt_anime_face", {"image": (1, 3, height, width)}, {y: "scores"})


def net_size(h: int, w: int) -> tuple[int, int]:
    """torchvision's ``Resize(512)``: the shorter side to 512, the longer ``int(512 * long / short)``."""
    if h <= w:
        return 512, int(512 * w / h)
    return int(512 * h / w), 512


def check_size(height: int, width: int, resolution: int | None = None) -> None:
    """A ``ControlImageError`` when the network would read an ``height x width`` image (padded to 64; at processor
    resolution ``resolution``, None: its own size) above ``MAX_NET_PIXELS``, as the other networks' images are
    bounded: it reads it at 512 on its shorter side whatever its size, so a long thin image is read far larger."""
    nh, nw = net_size(height, width)
    if nh * nw > MAX_NET_PIXELS:
        from .controlmaps import ControlImageError

        at = "at its own size" if resolution is None else f"at processor resolution {resolution}"
        raise ControlImageError(f"seg_anime_face reads the control image ({at} {width}x{height}) at {nw}x{nh}, 512 "
                                f"on its shorter side, above {MAX_NET_PIXELS} pixels (2048x8192)",
                                where="sdrt.pipelines.animeface",
                                fix="crop the image nearer to a square (at most 64 times as long as it is wide)")


def _resized(rgb: np.ndarray) -> np.ndarray:
    check_size(*rgb.shape[:2])
    nh, nw = net_size(*rgb.shape[:2])
    if (nh, nw) == rgb.shape[:2]:
        return rgb
    try:
        from PIL import Image
    except ImportError:
        from ..errors import InputError
        from .images import PILLOW_HINT

        raise InputError("seg_anime_face resizes the image with Pillow's bicubic, as the extension does, and Pillow "
                         "is not installed", where="sdrt.pipelines.animeface", fix=PILLOW_HINT) from None
    return np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.Resampling.BICUBIC))


class AnimeFaceSeg(AnnotatorNet):
    """``UNet.pth`` compiled on one backend, one session per resized input size."""

    WHAT = "the anime face segmentation UNet (UNet.pth)"
    FIX = f"pass {ANIME_FACE_FILE} (bdsqlsz/qinglong_controlnet-lllite/Annotators)"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return expected_shapes()

    def build(self, height: int, width: int) -> Any:
        return build_graph(self.arrays(), height, width)

    def labels(self, rgb: np.ndarray) -> np.ndarray:
        """The class of each pixel of the network's output for an RGB uint8 image (at 512 on its shorter side)."""
        img = _resized(rgb)
        x = np.ascontiguousarray((img.astype(np.float32) / np.float32(255.0)).transpose(2, 0, 1)[None])
        return self.session(*img.shape[:2]).run({"image": x})["scores"][0].argmax(axis=0)

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        """The painted class map of an RGB uint8 image, padded with its edges to multiples of 64 (the extension's
        processor pads every image so), its top-left ``h x w`` kept (the extension's crop)."""
        h, w = rgb.shape[:2]
        padded = np.pad(rgb, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")
        return np.ascontiguousarray(PALETTE[self.labels(padded)][:h, :w])


def face_map(rgb: np.ndarray, detector: AnimeFaceSeg) -> np.ndarray:
    """The ``seg_anime_face`` map of an RGB uint8 image."""
    return detector(rgb)
