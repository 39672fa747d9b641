"""Model upscalers (the ESRGAN family) as ONNX graphs built from their weights, no torch.

A ``.safetensors`` file (``.pth`` once ``Weights.open`` reads PyTorch files) is recognised from its
tensor names and shapes the way spandrel recognises it:

- **RRDBNet** (ESRGAN): the old layout (``model.0.weight``, ``model.1.sub.N.RDBk.convj.0.weight``, as
  4x-UltraSharp and most community models ship), the new one (Real-ESRGAN's ``conv_first``,
  ``body.N.rdbk.convj``, ``conv_body``, ``conv_up1``...) and BSRGAN's (``RRDB_trunk``, ``trunk_conv``,
  ``upconv1``, ``HRconv``). Features, blocks and growth channels come from the shapes; the scale from the
  count of upsampling convs; input channels 4 or 16 times the output's mean a pixel unshuffle first
  (RealESRGAN_x2plus: scale 2 = unshuffle 2 then x4).
- **SRVGGNetCompact** (realesr-general-x4v3, realesr-animevideov3): ``body.0``, PReLU slopes, a last
  conv to ``3 * scale**2`` channels, pixel shuffle, plus the input resized by nearest.

The graph uses only Conv, LeakyRelu, Relu, Neg, Mul, Add, Sub, Concat, Resize (nearest), Reshape and
Transpose of at most 4 dims (pixel (un)shuffle is split into 4-d steps; PReLU is ``relu(x) - a * relu(-x)``),
so every backend that runs a UNet runs it. The image goes through in tiles of ``tile`` pixels overlapping
by ``overlap`` (A1111's ESRGAN defaults, 192 and 8), all of one shape so one session serves every tile;
overlaps are blended by linear ramps. Input and output are RGB in [0, 1] (as spandrel and Real-ESRGAN;
A1111 feeds BGR);
the result is clamped and rounded to uint8 as A1111 does.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelError

log = logging.getLogger("sdrt.pipelines.upscaler")

__all__ = ["EXTENSIONS", "Arch", "ModelUpscaler", "build_graph", "detect", "find_models", "is_model_file"]

#: the files a model upscaler comes in
EXTENSIONS = (".safetensors", ".pth", ".pt", ".ckpt")
TILE = 192
OVERLAP = 8
_PREFIXES = ("params_ema.", "params.", "state_dict.", "model_state_dict.", "module.")


def is_model_file(value: object) -> bool:
    return isinstance(value, (str, Path)) and str(value).lower().endswith(EXTENSIONS) and Path(value).is_file()


def find_models(*folders: str | Path) -> dict[str, Path]:
    """``{name: path}`` of the model upscaler files directly in ``folders`` (name: the file's stem; of two
    files with one stem, the ``.safetensors``)."""
    out: dict[str, Path] = {}
    for folder in folders:
        p = Path(folder)
        if p.is_dir():
            files = [f for f in p.iterdir() if f.is_file() and f.name.lower().endswith(EXTENSIONS)]
            for f in sorted(files, key=lambda f: (f.stem, EXTENSIONS.index(f.suffix.lower()))):
                out.setdefault(f.stem, f)
    return out


@dataclass
class Arch:
    """What a state dict holds. ``keys`` maps canonical names to the file's tensor names."""

    kind: str  # "RRDBNet" | "SRVGGNetCompact"
    scale: int
    in_nc: int
    out_nc: int
    nf: int
    blocks: int  # RRDB blocks, or Compact body convs
    shuffle: int = 0  # RRDBNet: pixel unshuffle factor (0: none)
    ups: int = 0  # RRDBNet: nearest x2 + conv steps
    keys: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        extra = f", pixel unshuffle {self.shuffle}" if self.shuffle else ""
        what = "blocks" if self.kind == "RRDBNet" else "convs"
        return f"{self.kind} x{self.scale} ({self.nf} features, {self.blocks} {what}{extra})"


def _strip_prefix(names: list[str]) -> dict[str, str]:
    for p in _PREFIXES:
        if names and all(n.startswith(p) for n in names):
            return {n[len(p):]: n for n in names}
    return {n: n for n in names}


def _looks_like(names: set[str]) -> str:
    """A short guess at what a file that is no supported upscaler holds, for the error."""
    hints = [("model.diffusion_model.", "a Stable Diffusion checkpoint"), ("lora_", "a LoRA"),
             ("encoder.down.", "a VAE"), ("first_stage_model.", "a Stable Diffusion checkpoint"),
             ("layers.0.residual_group", "a SwinIR model"), ("conv_first.", "an RRDBNet-like model"),
             ("stylegan_decoder.", "a GFPGAN face restorer"), ("generator.", "a CodeFormer face restorer"),
             ("layers.0.blocks.0.attn", "a transformer upscaler (SwinIR/HAT/DAT)"), ("body.0.", "a conv upscaler")]
    for prefix, what in hints:
        if any(n.startswith(prefix) or prefix in n for n in names):
            return what
    sample = ", ".join(sorted(names)[:3])
    return f"{len(names)} tensors ({sample}{', ...' if len(names) > 3 else ''})"


def _seq(names: set[str], prefix: str) -> list[int]:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    return sorted({int(m.group(1)) for n in names if (m := pat.match(n))})


def detect(shapes: Mapping[str, tuple[int, ...]], where: str = "upscaler") -> Arch:
    """The architecture of a state dict from its names and shapes (as spandrel's ESRGAN and Compact)."""
    keys = _strip_prefix(list(shapes))
    names = set(keys)

    def shape(k: str) -> tuple[int, ...]:
        return tuple(shapes[keys[k]])

    if any(".conv1x1." in n for n in names):
        raise ModelError("the file is an ESRGAN+ model (RRDB blocks with 1x1 convs), which sdrt does not run",
                         where=where, fix="use an RRDBNet (ESRGAN, Real-ESRGAN) or SRVGGNetCompact model")
    canon: dict[str, str] = {}
    if "model.0.weight" in names and "model.1.sub.0.RDB1.conv1.0.weight" in names:  # old ESRGAN layout
        nb = len(_seq(names, "model.1.sub.")) - 1
        seq = _seq(names, "model.")
        last = seq[-1]
        canon["first"] = "model.0"
        canon["body_conv"] = f"model.1.sub.{nb}"
        for i in range(nb):
            for r in (1, 2, 3):
                for c in range(1, 6):
                    canon[f"b{i}.r{r}.c{c}"] = f"model.1.sub.{i}.RDB{r}.conv{c}.0"
        ups = [i for i in seq if 1 < i < last - 2]
        for j, i in enumerate(ups):
            canon[f"up{j + 1}"] = f"model.{i}"
        canon["hr"], canon["last"] = f"model.{last - 2}", f"model.{last}"
    elif "conv_first.weight" in names and ("body.0.rdb1.conv1.weight" in names
                                            or "RRDB_trunk.0.RDB1.conv1.weight" in names):
        new = "body.0.rdb1.conv1.weight" in names
        trunk, rdb = ("body.", "rdb") if new else ("RRDB_trunk.", "RDB")
        nb = len(_seq(names, trunk))
        canon["first"] = "conv_first"
        canon["body_conv"] = "conv_body" if new else "trunk_conv"
        for i in range(nb):
            for r in (1, 2, 3):
                for c in range(1, 6):
                    canon[f"b{i}.r{r}.c{c}"] = f"{trunk}{i}.{rdb}{r}.conv{c}"
        up = "conv_up" if new else "upconv"
        j = 1
        while f"{up}{j}.weight" in names:
            canon[f"up{j}"] = f"{up}{j}"
            j += 1
        canon["hr"] = "conv_hr" if new else "HRconv"
        canon["last"] = "conv_last"
    elif "body.0.weight" in names and "body.1.weight" in names:  # SRVGGNetCompact
        seq = _seq(names, "body.")
        last = seq[-1]
        w0 = shape("body.0.weight")
        in_nc, nf = w0[1], w0[0]
        out_ch = shape(f"body.{last}.weight")[0]
        scale = 1
        for s in (1, 2, 3, 4, 8):
            if out_ch == in_nc * s * s:
                scale = s
        if out_ch != in_nc * scale * scale or len(w0) != 4:
            raise ModelError(f"the file looks like a compact upscaler but its last conv has {out_ch} channels, "
                             f"not 3 x scale^2", where=where, fix="use an SRVGGNetCompact or RRDBNet model")
        convs = [i for i in seq if len(shape(f"body.{i}.weight")) == 4]
        acts = [i for i in seq if len(shape(f"body.{i}.weight")) == 1]
        if len(acts) != len(convs) - 1:
            raise ModelError("the file looks like an SRVGGNetCompact model but its activations are not PReLU "
                             "(one slope per feature after every conv but the last)", where=where,
                             fix="use a Real-ESRGAN compact model (realesr-general-x4v3, realesr-animevideov3)")
        keys_out = {f"c{j}": keys[f"body.{i}.weight"][:-len("weight")] for j, i in enumerate(convs)}
        keys_out.update({f"a{j}": keys[f"body.{i}.weight"][:-len("weight")] for j, i in enumerate(acts)})
        return Arch("SRVGGNetCompact", scale, in_nc, in_nc, nf, len(convs) - 2, keys=keys_out)
    else:
        raise ModelError(f"the file is no upscaler sdrt runs: it looks like {_looks_like(names)}", where=where,
                         fix="use an ESRGAN/Real-ESRGAN (RRDBNet) or SRVGGNetCompact model (.safetensors or .pth)")
    for v in canon.values():
        if v + ".weight" not in names or v + ".bias" not in names:
            raise ModelError(f"the RRDBNet file lacks {v}.weight or {v}.bias", where=where,
                             fix="the file is damaged or of a variant sdrt does not run")
    first = shape(canon["first"] + ".weight")
    in_nc, nf = first[1], first[0]
    out_nc = shape(canon["last"] + ".weight")[0]
    ups = sum(1 for k in canon if k.startswith("up"))
    shuffle = 0
    if in_nc in (out_nc * 4, out_nc * 16):
        shuffle = int(math.isqrt(in_nc // out_nc))
    scale = 2 ** ups
    if shuffle:
        scale //= shuffle
    if scale < 1 or 2 ** ups % max(shuffle, 1):
        raise ModelError(f"the RRDBNet file upsamples x{2 ** ups} after a pixel unshuffle of {shuffle}",
                         where=where, fix="use a model with an integer overall scale")
    return Arch("RRDBNet", scale, in_nc // max(shuffle, 1) ** 2, out_nc, nf, nb, shuffle, ups,
                {k: keys[v + ".weight"][:-len("weight")] for k, v in canon.items()})


# ------------------------------------------------------------------ the graph
class _Builder:
    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        from onnx import helper, numpy_helper

        self.h, self.nh = helper, numpy_helper
        self.arrays = arrays
        self.nodes: list[Any] = []
        self.inits: dict[str, Any] = {}
        self.n = 0

    def _name(self, op: str) -> str:
        self.n += 1
        return f"{op.lower()}_{self.n}"

    def const(self, name: str, value: np.ndarray) -> str:
        if name not in self.inits:
            self.inits[name] = self.nh.from_array(np.ascontiguousarray(value), name)
        return name

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self._name(op)
        self.nodes.append(self.h.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, prefix: str) -> str:
        w = self.const(prefix + "weight", np.asarray(self.arrays[prefix + "weight"], np.float32))
        b = self.const(prefix + "bias", np.asarray(self.arrays[prefix + "bias"], np.float32))
        k = int(self.arrays[prefix + "weight"].shape[-1])
        return self.node("Conv", [x, w, b], pads=[k // 2] * 4, kernel_shape=[k, k])

    def lrelu(self, x: str, alpha: float = 0.2) -> str:
        return self.node("LeakyRelu", [x], alpha=alpha)

    def prelu(self, x: str, prefix: str) -> str:
        a = np.asarray(self.arrays[prefix + "weight"], np.float32).reshape(1, -1, 1, 1)
        slope = self.const(prefix + "weight", a)
        pos = self.node("Relu", [x])
        neg = self.node("Relu", [self.node("Neg", [x])])
        return self.node("Sub", [pos, self.node("Mul", [neg, slope])])

    def scaled(self, x: str, k: float) -> str:
        return self.node("Mul", [x, self.const(f"const_{k:g}", np.array(k, np.float32))])

    def reshape(self, x: str, shape: tuple[int, ...]) -> str:
        name = "shape_" + "x".join(map(str, shape))
        return self.node("Reshape", [x, self.const(name, np.array(shape, np.int64))])

    def nearest(self, x: str, s: int) -> str:
        scales = self.const(f"scales_{s}", np.array([1, 1, s, s], np.float32))
        return self.node("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                         nearest_mode="floor")

    def unshuffle(self, x: str, c: int, h: int, w: int, r: int) -> str:
        """torch's pixel_unshuffle in <= 4-d steps: out[c*r*r + i*r + j, y, x] = in[c, y*r + i, x*r + j]."""
        t = self.reshape(x, (c, h // r, r, w))
        t = self.node("Transpose", [t], perm=[0, 2, 1, 3])  # (c, i, y, x*r+j)
        t = self.reshape(t, (c * r, h // r, w // r, r))
        t = self.node("Transpose", [t], perm=[0, 3, 1, 2])  # (c*r+i, j, y, x)
        return self.reshape(t, (1, c * r * r, h // r, w // r))

    def shuffle(self, x: str, c: int, h: int, w: int, r: int) -> str:
        """torch's pixel_shuffle (``c`` output channels): out[c, y*r + i, x*r + j] = in[c*r*r + i*r + j, y, x]."""
        t = self.reshape(x, (c * r, r, h, w))
        t = self.node("Transpose", [t], perm=[0, 2, 3, 1])  # (c*r+i, y, x, j)
        t = self.reshape(t, (c, r, h, w * r))
        t = self.node("Transpose", [t], perm=[0, 2, 1, 3])  # (c, y, i, x*r+j)
        return self.reshape(t, (1, c, h * r, w * r))


def build_graph(arch: Arch, arrays: Mapping[str, np.ndarray], height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of ``arch`` for one (1, C, height, width) input ``image`` -> ``upscaled``;
    ``arrays`` maps the file's tensor names to their data (inlined as initializers of those names)."""
    import onnx
    from onnx import TensorProto, helper

    b = _Builder(arrays)
    k = arch.keys
    c = arch.in_nc
    if arch.kind == "RRDBNet":
        x = "image"
        if arch.shuffle:
            x = b.unshuffle(x, c, height, width, arch.shuffle)
        fea = b.conv(x, k["first"])
        t = fea
        for i in range(arch.blocks):
            block_in = t
            for r in (1, 2, 3):
                rdb_in = t
                feats = [t]
                for j in range(1, 6):
                    inp = feats[0] if len(feats) == 1 else b.node("Concat", feats, axis=1)
                    y = b.conv(inp, k[f"b{i}.r{r}.c{j}"])
                    if j < 5:
                        feats.append(b.lrelu(y))
                t = b.node("Add", [b.scaled(y, 0.2), rdb_in])
            t = b.node("Add", [b.scaled(t, 0.2), block_in])
        t = b.node("Add", [fea, b.conv(t, k["body_conv"])])
        for j in range(1, arch.ups + 1):
            t = b.lrelu(b.conv(b.nearest(t, 2), k[f"up{j}"]))
        b.conv(b.lrelu(b.conv(t, k["hr"])), k["last"])
    else:
        t = "image"
        for j in range(arch.blocks + 1):
            t = b.prelu(b.conv(t, k[f"c{j}"]), k[f"a{j}"])
        t = b.conv(t, k[f"c{arch.blocks + 1}"])
        if arch.scale > 1:
            t = b.shuffle(t, arch.out_nc, height, width, arch.scale)
            b.node("Add", [t, b.nearest("image", arch.scale)])
        else:
            b.node("Add", [t, "image"])
    b.nodes[-1].output[0] = "upscaled"  # the last node made is the output
    graph = helper.make_graph(
        b.nodes, f"sdrt_{arch.kind}",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, c, height, width])],
        [helper.make_tensor_value_info("upscaled", TensorProto.FLOAT,
                                       [1, arch.out_nc, height * arch.scale, width * arch.scale])],
        list(b.inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="sdrt-upscaler",
                              ir_version=8)
    onnx.checker.check_model(model)
    return model


# ------------------------------------------------------------------ running it
def _positions(size: int, tile: int, overlap: int, align: int) -> list[int]:
    """A1111's ``split_grid`` along one axis: tiles of ``tile`` spread evenly, overlapping by at least
    ``overlap``; starts rounded down to multiples of ``align`` (a pixel unshuffle's factor)."""
    if size <= tile:
        return [0]
    n = math.ceil((size - overlap) / (tile - overlap))
    step = (size - tile) / (n - 1)
    starts = [min(int(i * step) // align * align, size - tile) for i in range(n)]
    starts[-1] = size - tile
    return sorted(set(starts))


def _ramp(n: int, lo_edge: bool, hi_edge: bool, width: int) -> np.ndarray:
    """A tile's blend weights along one axis: rising linearly over ``width`` from an inner edge."""
    w = np.ones(n, np.float32)
    ramp = (np.arange(n, dtype=np.float32) + 0.5) / max(width, 1)
    if lo_edge:
        w = np.minimum(w, ramp)
    if hi_edge:
        w = np.minimum(w, ramp[::-1])
    return w


class ModelUpscaler:
    """An upscaler model file, compiled per tile shape on ``backend``/``device``.

    ``upscale(rgb)``: an HxWx3 uint8 image -> (H*scale)x(W*scale)x3 uint8, in tiles.
    """

    def __init__(self, path: str | Path, *, backend: str = "auto", device: Any = None, name: str | None = None,
                 tile: int = TILE, overlap: int = OVERLAP, options: Mapping[str, Any] | None = None) -> None:
        from ..weights import Weights

        self.path = Path(path)
        self.name = name or self.path.stem
        where = str(self.path)
        if not self.path.is_file():
            raise InputError(f"no upscaler model file {self.path}", where="upscaler",
                             fix="give the path of a .safetensors or .pth ESRGAN-family model")
        self.weights = Weights.open(self.path)
        self.arch = detect(self.weights.shapes(), where)
        self.scale = self.arch.scale
        self.backend, self.device = backend, device
        #: the backend's compile options (``precision=``, ``cache=``...), as ``sdrt.load`` takes them
        self.options = dict(options or {})
        if tile < 16 or not 0 <= overlap <= tile // 2:
            raise InputError(f"upscaler tile {tile} with overlap {overlap}: the tile must be at least 16 and the "
                             "overlap at most half of it", where="tile", fix="use tile 192, overlap 8 (A1111's)")
        self.tile, self.overlap = tile, overlap
        self._arrays: dict[str, np.ndarray] | None = None
        self._sessions: dict[tuple[int, int], Any] = {}
        log.info("%s: %s", self.name, self.arch.describe())

    def __repr__(self) -> str:
        return f"ModelUpscaler({self.name!r}, {self.arch.describe()})"

    def _session(self, h: int, w: int) -> Any:
        sess = self._sessions.get((h, w))
        if sess is None:
            from ..runtime import load

            if self._arrays is None:
                self._arrays = {n: np.asarray(self.weights[n], np.float32) for n in self.weights}
            model = build_graph(self.arch, self._arrays, h, w)
            log.info("compiling %s for a %dx%d tile", self.name, w, h)
            sess = load(model, backend=self.backend, device=self.device, **self.options)
            self._sessions[(h, w)] = sess
        return sess

    def close(self) -> None:
        """Close the compiled tile sessions and drop the float32 copy of the weights (the file stays mapped); the
        next ``run`` compiles again. Low-memory mode calls it after the hires fix's upscale."""
        for sess in self._sessions.values():
            sess.close()
        self._sessions.clear()
        self._arrays = None
        from .lowmem import give_back

        give_back()

    @property
    def loaded(self) -> bool:
        """Whether compiled sessions or the float32 weights are held (``close`` drops both)."""
        return bool(self._sessions) or self._arrays is not None

    def run(self, x: np.ndarray) -> np.ndarray:
        """The model on one (1, 3, h, w) float32 array in [0, 1], untiled (h, w multiples of the unshuffle)."""
        x = np.ascontiguousarray(x, np.float32)
        return self._session(x.shape[2], x.shape[3]).run({"image": x})["upscaled"]

    def upscale_float(self, x: np.ndarray, tile: int | None = None) -> np.ndarray:
        """(1, 3, H, W) float32 -> (1, 3, H*scale, W*scale) float32 (unclamped), in blended tiles."""
        tile = self.tile if tile is None else tile
        o, s = self.overlap, self.scale
        r = max(self.arch.shuffle, 1)
        _, c, h0, w0 = x.shape
        ph, pw = -h0 % r, -w0 % r
        if ph or pw:  # spandrel pads to the unshuffle's multiple by reflection and crops the result
            x = np.pad(x, ((0, 0), (0, 0), (0, ph), (0, pw)), mode="reflect")
        _, _, h, w = x.shape
        tile = max(tile // r * r, r)
        th, tw = min(tile, h), min(tile, w)
        ys, xs = _positions(h, th, o, r), _positions(w, tw, o, r)
        if len(ys) == 1 and len(xs) == 1:
            return self.run(x)[:, :, : h0 * s, : w0 * s]
        out = np.zeros((1, self.arch.out_nc, h * s, w * s), np.float32)
        weight = np.zeros((h * s, w * s), np.float32)
        for y in ys:
            wy = _ramp(th * s, y > 0, y + th < h, o * s)
            for x0 in xs:
                wx = _ramp(tw * s, x0 > 0, x0 + tw < w, o * s)
                part = self.run(x[:, :, y:y + th, x0:x0 + tw])
                m = np.outer(wy, wx)
                out[:, :, y * s:(y + th) * s, x0 * s:(x0 + tw) * s] += part * m
                weight[y * s:(y + th) * s, x0 * s:(x0 + tw) * s] += m
        out /= weight
        return out[:, :, : h0 * s, : w0 * s]

    def upscale(self, image: np.ndarray, tile: int | None = None) -> np.ndarray:
        """An HxWx3 uint8 RGB image -> (H*scale)x(W*scale)x3 uint8."""
        rgb = np.asarray(image)
        if rgb.ndim != 3 or rgb.shape[2] != 3:
            raise InputError(f"the upscaler takes an HxWx3 RGB image, got shape {rgb.shape}", where="image",
                             fix="convert the image to RGB")
        x = (rgb.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]
        y = self.upscale_float(x, tile)
        return np.clip(np.rint(y[0].transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8)

    def upscale_to(self, image: np.ndarray, width: int, height: int) -> np.ndarray:
        """A1111's model upscale to a size: by the model's factor, then a Lanczos resize to ``width x height``
        (the model runs again while the image is still smaller than the target, as A1111's ``Upscaler.upscale``)."""
        from PIL import Image

        img = np.asarray(image)
        for _ in range(3):  # A1111 runs at most 3 passes, and stops when a pass leaves the size as it was
            if img.shape[1] >= width and img.shape[0] >= height:
                break
            img = self.upscale(img)
            if self.scale == 1:
                break
        if img.shape[:2] != (height, width):
            img = np.asarray(Image.fromarray(img).resize((width, height), resample=Image.Resampling.LANCZOS))
        return np.asarray(img, dtype=np.uint8)
