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

from ..errors import InputError, ModelError

__all__ = ["ANIME_FILE", "FILES", "MANGA_FILE", "Lineart", "LineartAnime", "MangaLine", "anime_shapes",
           "build_anime", "build_generator", "build_manga", "cubic", "find_file", "generator_shapes", "manga_shapes"]

#: the file each preprocessor reads (lllyasviel/Annotators)
FILES = {"lineart_realistic": "sk_model.pth", "lineart_coarse": "sk_model2.pth", "lineart_anime": "netG.pth",
         "lineart_anime_denoise": "erika.pth"}
ANIME_FILE = FILES["lineart_anime"]
MANGA_FILE = FILES["lineart_anime_denoise"]
#: the extension's annotator/downloads sub-folder of each preprocessor's file
FOLDERS = {"lineart_realistic": "lineart", "lineart_coarse": "lineart", "lineart_anime": "lineart_anime",
           "lineart_anime_denoise": "manga_line"}


# ------------------------------------------------------------------------------------------ files
def find_file(name: str, where: str | Path | Sequence[str | Path], *, what: str = "models") -> Path:
    """The file of preprocessor ``name``: ``where`` is the file, a folder holding it, or a folder with the
    extension's (``annotator/downloads/<folder>``) or ComfyUI's (``ckpts/lllyasviel/Annotators``) layout under it;
    an ``InputError`` naming the places looked in otherwise."""
    want = FILES[name]
    if not isinstance(where, (str, Path)):
        files = [Path(p) for p in where]
        hits = [f for f in files if f.name == want] or [f for f in files if f.suffix in (".pth", ".safetensors")]
        if len(hits) != 1:
            raise InputError(f"{what}: {name} needs one {want}; given {', '.join(map(str, files)) or 'none'}",
                             where=what, fix=f"pass {want} or the folder holding it")
        where = hits[0]
    base = Path(where)
    if base.is_file():
        return base
    looked = [base, base / "extensions/sd-webui-controlnet/annotator/downloads" / FOLDERS[name],
              base / "annotator/downloads" / FOLDERS[name],
              base / "custom_nodes/comfyui_controlnet_aux/ckpts/lllyasviel/Annotators",
              base / "ckpts/lllyasviel/Annotators", base / "lllyasviel/Annotators"]
    for folder in looked:
        if (folder / want).is_file():
            return folder / want
    raise InputError(f"{what}: no {want} in {base} (looked in {', '.join(str(p) for p in looked[:3])} and "
                     f"{len(looked) - 3} more)", where=what,
                     fix=f"download {want} (huggingface.co/lllyasviel/Annotators) into one of those folders, or "
                         "pass the file")


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


def _match(shapes: Mapping[str, tuple[int, ...]], want: Mapping[str, tuple[int, ...]], where: str, what: str,
           file: str) -> dict[str, str]:
    """The file's names for the expected tensors (a ``module.`` prefix, as DataParallel saves, is allowed)."""
    bare = {}
    for n in shapes:
        bare[n.replace("module.", "")] = n  # as the extension's loaders rename them
    missing = [n for n in want if n not in bare]
    if missing:
        raise ModelError(f"{where} is not {what} ({len(missing)} of its {len(want)} tensors missing, e.g. "
                         f"{missing[0]})", where=where, fix=f"pass lllyasviel's {file}")
    for n, shape in want.items():
        if tuple(shapes[bare[n]]) != shape:
            raise ModelError(f"{where}: {n} is {tuple(shapes[bare[n]])}, not {what}'s {shape}", where=where,
                             fix=f"pass lllyasviel's {file}")
    return {n: bare[n] for n in want}


# ------------------------------------------------------------------------------------------ the graphs
class _Builder:
    """ONNX nodes and initializers of one graph."""

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0
        self.norms: dict[int, tuple[str, str]] = {}
        self.consts: set[str] = set()

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        from onnx import helper

        self.count += 1
        out = f"{op.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, name: str, a: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(a), name))
        return name

    def conv(self, x: str, name: str, *, stride: int = 1, pad: int = 0) -> str:
        w = self.const(f"{name}.weight", np.asarray(self.arrays[f"{name}.weight"], np.float32))
        b = self.const(f"{name}.bias", np.asarray(self.arrays[f"{name}.bias"], np.float32))
        k = int(self.arrays[f"{name}.weight"].shape[-1])
        return self.node("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def deconv(self, x: str, name: str, *, pad: int, out_pad: int) -> str:
        w = self.const(f"{name}.weight", np.asarray(self.arrays[f"{name}.weight"], np.float32))
        b = self.const(f"{name}.bias", np.asarray(self.arrays[f"{name}.bias"], np.float32))
        k = int(self.arrays[f"{name}.weight"].shape[-1])
        return self.node("ConvTranspose", [x, w, b], kernel_shape=[k, k], strides=[2, 2], pads=[pad] * 4,
                         output_padding=[out_pad, out_pad])

    def reflect(self, x: str, p: int) -> str:
        """``ReflectionPad2d(p)``: the last axis padded, the two last swapped, padded, swapped back (a reflect Pad of
        the last axis only is what every backend runs, ggml's included)."""
        name = f"reflect_pads_{p}"
        if name not in self.consts:
            self.consts.add(self.const(name, np.array([0, 0, 0, p, 0, 0, 0, p], np.int64)))
        t = self.node("Transpose", [self.node("Pad", [x, name], mode="reflect")], perm=[0, 1, 3, 2])
        return self.node("Transpose", [self.node("Pad", [t, name], mode="reflect")], perm=[0, 1, 3, 2])

    def bn(self, x: str, name: str, eps: float) -> str:
        """``BatchNorm2d`` in eval mode: the file's weight, bias and running statistics."""
        ins = [self.const(f"{name}.{t}", np.asarray(self.arrays[f"{name}.{t}"], np.float32))
               for t in ("weight", "bias", "running_mean", "running_var")]
        return self.node("BatchNormalization", [x, *ins], epsilon=eps)

    def up2(self, x: str) -> str:
        """``Upsample(scale_factor=2, mode='nearest')``."""
        if "up2_scales" not in self.consts:
            self.consts.add(self.const("up2_scales", np.array([1, 1, 2, 2], np.float32)))
        return self.node("Resize", [x, "", "up2_scales"], mode="nearest", nearest_mode="floor",
                         coordinate_transformation_mode="asymmetric")

    def inorm(self, x: str, c: int) -> str:
        """``InstanceNorm2d(c)``: no affine, eps 1e-5."""
        if c not in self.norms:
            self.norms[c] = (self.const(f"ones_{c}", np.ones(c, np.float32)),
                             self.const(f"zeros_{c}", np.zeros(c, np.float32)))
        return self.node("InstanceNormalization", [x, *self.norms[c]], epsilon=1e-5)

    def model(self, x: str, y: str, name: str, height: int, width: int, out_hw: tuple[int, int],
              channels: int = 3) -> Any:
        import onnx
        from onnx import TensorProto, helper

        self.nodes.append(helper.make_node("Identity", [y], ["line"], name="line"))
        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, height, width])],
            [helper.make_tensor_value_info("line", TensorProto.FLOAT, [1, 1, *out_hw])], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="sdrt-lineart",
                              ir_version=8)
        onnx.checker.check_model(m)
        return m


def build_generator(arrays: Mapping[str, np.ndarray], height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of informative-drawings' ``Generator(3, 1, 3)`` for one ``(1, 3, height, width)``
    input ``image`` (multiples of 4) -> ``line`` (1, 1, height, width) in [0, 1]; ``arrays`` by the file's names."""
    g = _Builder(arrays)
    t = g.node("Relu", [g.inorm(g.conv(g.reflect("image", 3), "model0.1"), 64)])
    t = g.node("Relu", [g.inorm(g.conv(t, "model1.0", stride=2, pad=1), 128)])
    t = g.node("Relu", [g.inorm(g.conv(t, "model1.3", stride=2, pad=1), 256)])
    for b in range(3):
        r = g.node("Relu", [g.inorm(g.conv(g.reflect(t, 1), f"model2.{b}.conv_block.1"), 256)])
        r = g.inorm(g.conv(g.reflect(r, 1), f"model2.{b}.conv_block.5"), 256)
        t = g.node("Add", [t, r])
    t = g.node("Relu", [g.inorm(g.deconv(t, "model3.0", pad=1, out_pad=1), 128)])
    t = g.node("Relu", [g.inorm(g.deconv(t, "model3.3", pad=1, out_pad=1), 64)])
    t = g.node("Sigmoid", [g.conv(g.reflect(t, 3), "model4.1")])
    return g.model("image", t, "sdrt_lineart", height, width, (height, width))


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

    return g.model("image", level("image", 0), "sdrt_lineart_anime", height, width, (height, width))


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
                s = g.conv(x, f"{name}.shortcut.model.0", stride=stride)
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
    return g.model("image", t, "sdrt_manga_line", height, width, (height, width), channels=1)


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
class _Net:
    """A lineart file compiled on one backend per input size."""

    what = ""
    file = ""

    def __init__(self, path: str | Path, *, backend: str = "auto", device: Any = None) -> None:
        from ..weights import Weights

        self.path = Path(path)
        where = str(self.path)
        try:
            self.weights = Weights.open(self.path)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one line naming it
            raise ModelError(f"{where} could not be read as a PyTorch file ({type(exc).__name__}: {exc})",
                             where=where, fix=f"pass lllyasviel's {self.file}") from None
        self._names = _match(self.weights.shapes(), self._shapes(), where, self.what, self.file)
        self.backend, self.device = backend, device
        self._sessions: dict[tuple[int, int], Any] = {}
        self.files = (self.path,)

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def _build(self, arrays: Mapping[str, np.ndarray], h: int, w: int) -> Any:
        raise NotImplementedError

    def run(self, x: np.ndarray) -> np.ndarray:
        """The network's ``line`` (H, W) float32 for one ``(1, 3, H, W)`` float32 input."""
        h, w = x.shape[2:]
        sess = self._sessions.get((h, w))
        if sess is None:
            from ..runtime import load

            arrays = {n: np.asarray(self.weights[f], np.float32) for n, f in self._names.items()}
            sess = self._sessions[(h, w)] = load(self._build(arrays, h, w), backend=self.backend, device=self.device)
        return sess.run({"image": np.ascontiguousarray(x, np.float32)})["line"][0, 0]

    def close(self) -> None:
        for s in self._sessions.values():
            s.close()
        self._sessions.clear()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _padded(rgb: np.ndarray, multiple: int) -> np.ndarray:
    h, w = rgb.shape[:2]
    return np.pad(rgb, ((0, -h % multiple), (0, -w % multiple), (0, 0)), mode="edge")


class Lineart(_Net):
    """``sk_model.pth`` / ``sk_model2.pth``; ``__call__(rgb)`` -> the inverted line map (H, W) uint8 of an RGB
    uint8 image whose sides are multiples of 4 (the extension's are of 64; others are padded with their edges
    and cropped back)."""

    what = "informative-drawings' lineart Generator"
    file = "sk_model.pth or sk_model2.pth"

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return generator_shapes()

    def _build(self, arrays: Mapping[str, np.ndarray], h: int, w: int) -> Any:
        return build_generator(arrays, h, w)

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        h, w = rgb.shape[:2]
        x = _padded(rgb, 4).astype(np.float32) / np.float32(255.0)
        line = self.run(x.transpose(2, 0, 1)[None])[:h, :w]
        return 255 - (line * np.float32(255.0)).clip(0, 255).astype(np.uint8)


class LineartAnime(_Net):
    """``netG.pth``; ``__call__(rgb)`` -> the inverted line map (H, W) uint8 of an RGB uint8 image, made at the
    next multiples of 256 (INTER_CUBIC there and back) as the extension does."""

    what = "the anime lineart U-Net"
    file = ANIME_FILE

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return anime_shapes()

    def _build(self, arrays: Mapping[str, np.ndarray], h: int, w: int) -> Any:
        return build_anime(arrays, h, w)

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        h, w = rgb.shape[:2]
        hn, wn = 256 * math.ceil(h / 256), 256 * math.ceil(w / 256)
        img = cubic(np.ascontiguousarray(rgb), wn, hn)
        x = img.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
        line = self.run(x.transpose(2, 0, 1)[None]) * np.float32(127.5) + np.float32(127.5)
        line = cubic(line.astype(np.float32), w, h)
        return 255 - line.clip(0, 255).astype(np.uint8)


def gray(rgb: np.ndarray) -> np.ndarray:
    """``cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)`` of a uint8 image as OpenCV 5 makes it: 16-bit weights (19596,
    38470, 7470), rounded (14-bit weights, 4899, 9617 and 1868, would give 1 level more or less on
    about 0.3% of colours)."""
    x = rgb.astype(np.int64)
    return ((x[..., 0] * 19596 + x[..., 1] * 38470 + x[..., 2] * 7470 + (1 << 15)) >> 16).astype(np.uint8)


class MangaLine(_Net):
    """``erika.pth``; ``__call__(rgb)`` -> the line map (H, W) uint8 of an RGB uint8 image (its grey levels, as
    OpenCV makes them, fed as 0-255; ``255 - y`` clipped and truncated), sides padded with their edges to multiples
    of 16 and cropped back (the extension's are multiples of 64)."""

    what = "MangaLineExtraction's res_skip network"
    file = MANGA_FILE

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return manga_shapes()

    def _build(self, arrays: Mapping[str, np.ndarray], h: int, w: int) -> Any:
        return build_manga(arrays, h, w)

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        h, w = rgb.shape[:2]
        x = gray(_padded(rgb, 16)).astype(np.float32)[None, None]
        line = self.run(x)[:h, :w]
        return (np.float32(255.0) - line).clip(0, 255).astype(np.uint8)
