"""Lineart (model-backed): sd-webui-controlnet's ``lineart_realistic``, ``lineart_coarse``, ``lineart_anime`` and
``lineart_anime_denoise`` modules, their PyTorch files run through sdrt.

- ``lineart_realistic`` / ``lineart_coarse``: informative-drawings' ``Generator(3, 1, 3)`` (``sk_model.pth`` /
  ``sk_model2.pth``): reflection-padded 7x7 conv, two stride-2 convs, three residual blocks, two transposed convs,
  a 7x7 conv and a sigmoid, every norm an ``InstanceNorm2d`` (no affine, eps 1e-5). The extension feeds the RGB
  image as ``x / 255`` and keeps ``(y * 255).clip(0, 255).astype(uint8)``, inverted (``255 - line``: the
  ControlNet lineart models want white lines on black).
- ``lineart_anime``: pix2pix's ``UnetGenerator(3, 1, 8, 64)`` with ``InstanceNorm2d`` (``netG.pth``, its tensors
  under ``module.``): 8 stride-2 4x4 convs down (LeakyReLU 0.2 before each but the first), transposed convs up
  (ReLU before each), skips concatenated and a tanh at the end (the extension's in-place LeakyReLU rewrites the
  tensor a skip keeps, which the ReLU after the concatenation makes no difference to). Around it: the image
  resized (OpenCV's INTER_CUBIC) to multiples of 256, fed as ``x / 127.5 - 1``, the output ``y * 127.5 + 127.5``
  resized back (INTER_CUBIC, float32), clipped, truncated to uint8 and inverted.
- ``lineart_anime_denoise``: MangaLineExtraction's ``res_skip`` (``erika.pth``): a residual U-Net of
  BatchNorm -> LeakyReLU 0.2 -> conv blocks (eps 1e-3, the file's running statistics), stride-2 convs down, nearest
  x2 up, skips added. The extension feeds OpenCV's grey levels as 0-255 and keeps ``255 - y`` clipped to uint8
  (the network's own inversion; the processor adds none).

All maps are made on the image padded as the extension's ``resize_image_with_pad`` leaves it (multiples of 64,
edges repeated) and cropped back by the caller; the graphs are built in ONNX in memory and run on any backend
(``sdrt.load``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet, Net

__all__ = ["ANIME_FILE", "DETECTORS", "FILES", "MANGA_FILE", "Lineart", "LineartAnime", "MangaLine", "anime_shapes",
           "build_anime", "build_generator", "build_manga", "cubic", "find_file", "generator_shapes", "manga_shapes"]

#: the file each preprocessor reads (lllyasviel/Annotators)
FILES = {"lineart_realistic": "sk_model.pth", "lineart_coarse": "sk_model2.pth", "lineart_anime": "netG.pth",
         "lineart_anime_denoise": "erika.pth"}
ANIME_FILE = FILES["lineart_anime"]
MANGA_FILE = FILES["lineart_anime_denoise"]
#: the extension's annotator/downloads sub-folder of each preprocessor's file (sdrt.pipelines.annotators' rows)
FOLDERS = {"lineart_realistic": "lineart", "lineart_coarse": "lineart", "lineart_anime": "lineart_anime",
           "lineart_anime_denoise": "manga_line"}


# ------------------------------------------------------------------------------------------ files
def find_file(name: str, where: str | Path | Sequence[str | Path], *, what: str = "models") -> Path:
    """The file of preprocessor ``name``: ``where`` is the file, a folder holding it, or a folder with the
    extension's (``annotator/downloads/<folder>``) or ComfyUI's (``ckpts/lllyasviel/Annotators``) layout under it
    (:func:`sdrt.pipelines.annotators.find`); an ``InputError`` naming ``what`` and the places looked in otherwise."""
    from .annotators import find

    return find(name, where, what)[0]


# ------------------------------------------------------------------------------------------ shapes
def generator_shapes() -> dict[str, tuple[int, ...]]:
    """The tensors of ``sk_model.pth`` / ``sk_model2.pth`` and their shapes."""
    out: dict[str, tuple[int, ...]] = {"model0.1.weight": (64, 3, 7, 7), "model0.1.bias": (64,),
                                       "model1.0.weight": (128, 64, 3, 3), "model1.0.bias": (128,),
                                       "model1.3.weight": (256, 128, 3, 3), "model1.3.bias": (256,)}
    for b in range(3):
        for c in (1, 5):
            out[f"model2.{b}.conv_block.{c}.weight"] = (256, 256, 3, 3)
            out[f"model2.{b}.conv_block.{c}.bias"] = (256,)
    out.update({"model3.0.weight": (256, 128, 3, 3), "model3.0.bias": (128,),
                "model3.3.weight": (128, 64, 3, 3), "model3.3.bias": (64,),
                "model4.1.weight": (1, 64, 7, 7), "model4.1.bias": (1,)})
    return out


#: the U-Net's levels, outermost first: (outer channels, inner channels)
_UNET = [(3, 64), (64, 128), (128, 256), (256, 512), (512, 512), (512, 512), (512, 512), (512, 512)]


def _unet_prefix(level: int) -> str:
    return "model." + "model.1." * min(level, 1) + "model.3." * max(level - 1, 0)


def anime_shapes() -> dict[str, tuple[int, ...]]:
    """The tensors of ``netG.pth`` (without its ``module.`` prefix) and their shapes."""
    out: dict[str, tuple[int, ...]] = {}
    last = len(_UNET) - 1
    for level, (outer, inner) in enumerate(_UNET):
        p = _unet_prefix(level)
        down = "model.0" if level == 0 else "model.1"
        out[f"{p}{down}.weight"] = (inner, outer, 4, 4)
        out[f"{p}{down}.bias"] = (inner,)
        up = "model.3" if level == 0 else ("model.3" if level == last else "model.5")
        up_out = 1 if level == 0 else outer
        out[f"{p}{up}.weight"] = (inner if level == last else inner * 2, up_out, 4, 4)
        out[f"{p}{up}.bias"] = (up_out,)
    return dict(sorted(out.items(), key=lambda kv: kv[0].count(".")))


#: the manga network's encoder (in, out, repetitions) and decoder stages; every stage but the first and the
#: last halves (the last repetition's stride 2) or doubles (nearest upsampling) the size
_MANGA_DOWN = [(1, 24, 2), (24, 48, 3), (48, 96, 5), (96, 192, 7), (192, 384, 12)]
_MANGA_UP = [(384, 192, 7), (192, 96, 5), (96, 48, 3), (48, 24, 2)]


def _manga_blocks() -> list[tuple[str, int, int, int, bool]]:
    """(name, in, out, stride, upsampling) of every basic block in order, block9 (24 -> 16, 2) last."""
    out = []
    for b, (cin, cout, reps) in enumerate(_MANGA_DOWN):
        for i in range(reps):
            stride = 2 if i == reps - 1 and b > 0 else 1
            out.append((f"block{b}.model.{i}", cin if i == 0 else cout, cout, stride, False))
    for b, (cin, cout, reps) in enumerate(_MANGA_UP, start=5):
        for i in range(reps):
            out.append((f"block{b}.model.{i}", cin if i == 0 else cout, cout, 1, i == 0))
    out += [("block9.model.0", 24, 16, 1, False), ("block9.model.1", 16, 16, 1, False)]
    return out


def manga_shapes() -> dict[str, tuple[int, ...]]:
    """The tensors of ``erika.pth`` (without ``module.``; ``num_batches_tracked`` is not read) and their shapes."""
    out: dict[str, tuple[int, ...]] = {}

    def bn_conv(p: str, cin: int, cout: int, k: int) -> None:
        for t in ("weight", "bias", "running_mean", "running_var"):
            out[f"{p}.model.0.{t}"] = (cin,)
        out[f"{p}.model.2.weight"] = (cout, cin, k, k)
        out[f"{p}.model.2.bias"] = (cout,)

    for name, cin, cout, stride, _up in _manga_blocks():
        bn_conv(f"{name}.conv1", cin, cout, 3)
        bn_conv(f"{name}.residual", cout, cout, 3)
        if cin != cout or stride != 1:
            out[f"{name}.shortcut.model.0.weight"] = (cout, cin, 1, 1)
            out[f"{name}.shortcut.model.0.bias"] = (cout,)
    bn_conv("conv15", 16, 1, 1)
    return out


# ------------------------------------------------------------------------------------------ the graphs
class _Builder(Net):
    """:class:`sdrt.pipelines.netgraph.Net` with the layers these networks add."""

    def reflect(self, x: str, p: int) -> str:
        """``ReflectionPad2d(p)``: the last axis padded, the two last swapped, padded, swapped back (a reflect Pad of
        the last axis only is what every backend runs, ggml's included)."""
        pads = self.ints(0, 0, 0, p, 0, 0, 0, p)
        t = self.node("Transpose", [self.node("Pad", [x, pads], mode="reflect")], perm=[0, 1, 3, 2])
        return self.node("Transpose", [self.node("Pad", [t, pads], mode="reflect")], perm=[0, 1, 3, 2])

    def inorm(self, x: str, c: int) -> str:
        """``InstanceNorm2d(c)``: no affine, eps 1e-5."""
        ones, zeros = f"in_ones_{c}", f"in_zeros_{c}"
        if ones not in self._have:
            self.const(ones, np.ones(c, np.float32))
            self.const(zeros, np.zeros(c, np.float32))
        return self.node("InstanceNormalization", [x, ones, zeros], epsilon=1e-5)

    def deconv(self, x: str, name: str, *, pad: int, out_pad: int) -> str:
        return self.conv_transpose(x, name, stride=2, pad=pad, output_padding=out_pad)

    def up2(self, x: str) -> str:
        """``Upsample(scale_factor=2, mode='nearest')``."""
        return self.resize(x, scale=2.0, mode="nearest")

    def bn(self, x: str, name: str, eps: float) -> str:
        return self.batch_norm(x, name, eps)

    def done(self, y: str, name: str, height: int, width: int, channels: int = 3) -> Any:
        return self.model(name, {"image": (1, channels, height, width)}, {y: "line"})


def build_generator(arrays: Mapping[str, np.ndarray], height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of informative-drawings' ``Generator(3, 1, 3)`` for one ``(1, 3, height, width)``
    input ``image`` (multiples of 4) -> ``line`` (1, 1, height, width) in [0, 1]; ``arrays`` by the file's names."""
    g = _Builder(arrays)
    t = g.node("Relu", [g.inorm(g.conv(g.reflect("image", 3), "model0.1", pad=0), 64)])
    t = g.node("Relu", [g.inorm(g.conv(t, "model1.0", stride=2, pad=1), 128)])
    t = g.node("Relu", [g.inorm(g.conv(t, "model1.3", stride=2, pad=1), 256)])
    for b in range(3):
        r = g.node("Relu", [g.inorm(g.conv(g.reflect(t, 1), f"model2.{b}.conv_block.1", pad=0), 256)])
        r = g.inorm(g.conv(g.reflect(r, 1), f"model2.{b}.conv_block.5", pad=0), 256)
        t = g.node("Add", [t, r])
    t = g.node("Relu", [g.inorm(g.deconv(t, "model3.0", pad=1, out_pad=1), 128)])
    t = g.node("Relu", [g.inorm(g.deconv(t, "model3.3", pad=1, out_pad=1), 64)])
    t = g.node("Sigmoid", [g.conv(g.reflect(t, 3), "model4.1", pad=0)])
    return g.done(t, "sdrt_lineart", height, width)


def build_anime(arrays: Mapping[str, np.ndarray], height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of pix2pix's ``UnetGenerator(3, 1, 8, 64)`` (InstanceNorm) for one
    ``(1, 3, height, width)`` input ``image`` (multiples of 256) -> ``line`` (1, 1, height, width) in [-1, 1];
    ``arrays`` by the file's names without ``module.``."""
    g = _Builder(arrays)
    last = len(_UNET) - 1

    def level(x: str, i: int) -> str:
        outer, inner = _UNET[i]
        p = _unet_prefix(i)
        if i == 0:
            d = g.conv(x, f"{p}model.0", stride=2, pad=1)
            u = g.node("Relu", [level(d, 1)])
            return g.node("Tanh", [g.deconv(u, f"{p}model.3", pad=1, out_pad=0)])
        # in place in the extension: the skip keeps leaky_relu(x), the same as x once the parent's ReLU reads it
        x = g.node("LeakyRelu", [x], alpha=0.2)
        d = g.conv(x, f"{p}model.1", stride=2, pad=1)
        if i == last:
            u = g.inorm(g.deconv(g.node("Relu", [d]), f"{p}model.3", pad=1, out_pad=0), outer)
        else:
            d = g.inorm(d, inner)
            u = g.inorm(g.deconv(g.node("Relu", [level(d, i + 1)]), f"{p}model.5", pad=1, out_pad=0), outer)
        return g.node("Concat", [x, u], axis=1)

    return g.done(level("image", 0), "sdrt_lineart_anime", height, width)


def build_manga(arrays: Mapping[str, np.ndarray], height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of MangaLineExtraction's ``res_skip`` for one ``(1, 1, height, width)`` input
    ``image`` (grey levels 0-255, sides multiples of 16) -> ``line`` (1, 1, height, width); ``arrays`` by the file's
    names without ``module.``. Every conv is BatchNorm (eps 1e-3, running statistics) -> LeakyReLU 0.2 -> conv."""
    g = _Builder(arrays)

    def brc(x: str, p: str, stride: int = 1) -> str:
        k = int(arrays[f"{p}.model.2.weight"].shape[-1])
        y = g.node("LeakyRelu", [g.bn(x, f"{p}.model.0", 1e-3)], alpha=0.2)
        return g.conv(y, f"{p}.model.2", stride=stride, pad=k // 2)

    blocks = {b[0]: b for b in _manga_blocks()}

    def stage(x: str, b: int) -> str:
        for name, cin, cout, stride, up in (v for k, v in blocks.items() if k.startswith(f"block{b}.")):
            y = brc(x, f"{name}.conv1", stride)
            y = brc(g.up2(y) if up else y, f"{name}.residual")
            if cin != cout or stride != 1:
                s = g.conv(x, f"{name}.shortcut.model.0", stride=stride, pad=0)
                x = g.up2(s) if up else s
            x = g.node("Add", [x, y])
        return x

    skips = []
    t = "image"
    for b in range(5):
        t = stage(t, b)
        skips.append(t)
    for b in range(5, 9):
        t = g.node("Add", [skips[8 - b], stage(t, b)])
    t = brc(stage(t, 9), "conv15")
    return g.done(t, "sdrt_manga_line", height, width, channels=1)


# ------------------------------------------------------------------------------------------ OpenCV's INTER_CUBIC
def cubic(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(a, (width, height), interpolation=cv2.INTER_CUBIC)`` of a uint8 ``(H, W, C)`` image or a float32
    ``(H, W)`` plane as OpenCV's pip wheels run it (through Intel IPP): bicubic taps (a = -0.75, edges repeated)
    summed in float64, rows first; uint8 as :func:`sdrt.pipelines.cvresize.resample` rounds it (1 level apart on
    a few values in a million), float32 within a few float32 steps of IPP's."""
    from .cvresize import _apply_taps, _taps_cubic, resample

    h, w = a.shape[:2]
    if (h, w) == (height, width):
        return a.copy()
    if a.dtype == np.uint8:
        return resample(a, width, height, "cubic")
    out = _apply_taps(np.asarray(a, np.float64), *_taps_cubic(h, height), axis=0)
    return _apply_taps(out, *_taps_cubic(w, width), axis=1).astype(np.float32)


# ------------------------------------------------------------------------------------------ the detectors
def _padded(rgb: np.ndarray, multiple: int) -> np.ndarray:
    h, w = rgb.shape[:2]
    return np.pad(rgb, ((0, -h % multiple), (0, -w % multiple), (0, 0)), mode="edge")


class _Lineart(AnnotatorNet):
    """A lineart file compiled on one backend per input size; ``__call__(rgb)`` -> the map (H, W) uint8 of an RGB
    uint8 image, made on it padded with its edges to multiples of 64 (the extension's inputs already are: its
    ``resize_image_with_pad``) and cropped back."""

    def _line(self, x: np.ndarray) -> np.ndarray:
        """The network's ``line`` (H, W) float32 for one ``(1, C, H, W)`` float32 input."""
        out = self.session(*x.shape[1:]).run({"image": np.ascontiguousarray(x, np.float32)})
        return out["line"][0, 0]

    def map(self, rgb: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        h, w = rgb.shape[:2]
        return np.ascontiguousarray(self.map(_padded(rgb, 64))[:h, :w])


class Lineart(_Lineart):
    """``sk_model.pth`` / ``sk_model2.pth`` (lineart_realistic / lineart_coarse): the inverted line map."""

    WHAT = "informative-drawings' lineart Generator"
    FIX = "pass lllyasviel's sk_model.pth (lineart_realistic) or sk_model2.pth (lineart_coarse)"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return generator_shapes()

    def build(self, c: int, h: int, w: int) -> Any:
        return build_generator(self.arrays(), h, w)

    def map(self, rgb: np.ndarray) -> np.ndarray:
        x = rgb.astype(np.float32) / np.float32(255.0)
        line = self._line(x.transpose(2, 0, 1)[None])
        return 255 - (line * np.float32(255.0)).clip(0, 255).astype(np.uint8)


class LineartAnime(_Lineart):
    """``netG.pth`` (lineart_anime): the inverted line map, made at the next multiples of 256 (INTER_CUBIC there
    and back) as the extension does."""

    WHAT = "the anime lineart U-Net"
    FIX = f"pass lllyasviel's {ANIME_FILE}"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return anime_shapes()

    def build(self, c: int, h: int, w: int) -> Any:
        return build_anime(self.arrays(), h, w)

    def map(self, rgb: np.ndarray) -> np.ndarray:
        h, w = rgb.shape[:2]
        hn, wn = 256 * math.ceil(h / 256), 256 * math.ceil(w / 256)
        img = cubic(np.ascontiguousarray(rgb), wn, hn)
        x = img.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
        line = self._line(x.transpose(2, 0, 1)[None]) * np.float32(127.5) + np.float32(127.5)
        line = cubic(line.astype(np.float32), w, h)
        return 255 - line.clip(0, 255).astype(np.uint8)


def gray(rgb: np.ndarray) -> np.ndarray:
    """``cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)`` of a uint8 image as OpenCV 5 makes it: 16-bit weights (19596,
    38470, 7470), rounded (14-bit weights, 4899, 9617 and 1868, would give 1 level more or less on
    about 0.3% of colours)."""
    x = rgb.astype(np.int64)
    return ((x[..., 0] * 19596 + x[..., 1] * 38470 + x[..., 2] * 7470 + (1 << 15)) >> 16).astype(np.uint8)


class MangaLine(_Lineart):
    """``erika.pth`` (lineart_anime_denoise): the line map of the image's grey levels (as OpenCV makes them, fed as
    0-255; ``255 - y`` clipped and truncated)."""

    WHAT = "MangaLineExtraction's res_skip network"
    FIX = f"pass lllyasviel's {MANGA_FILE}"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return manga_shapes()

    def build(self, c: int, h: int, w: int) -> Any:
        return build_manga(self.arrays(), h, w)

    def map(self, rgb: np.ndarray) -> np.ndarray:
        line = self._line(gray(rgb).astype(np.float32)[None, None])
        return (np.float32(255.0) - line).clip(0, 255).astype(np.uint8)


#: each preprocessor's detector class
DETECTORS = {"lineart_realistic": Lineart, "lineart_coarse": Lineart, "lineart_anime": LineartAnime,
             "lineart_anime_denoise": MangaLine}
