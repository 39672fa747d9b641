"""T2I-Adapters (TencentARC's control adapters) for SD 1.x / 2.x and SDXL: the adapter network and its unit.

A T2I-Adapter turns the control map into four feature maps, once per image, which the UNet adds inside its down
blocks (diffusers' ``down_intrablock_additional_residuals``; the graph edit is :mod:`sdrt.checkpoint.adapterresiduals`).
It is given as a ControlNet unit's net: ``ControlNet("t2iadapter_canny_sd14v1.pth", image, preprocessor="canny")``.

The files, recognized by their keys and shapes (:class:`AdapterNet`):

- TencentARC's original ``.pth`` (``t2iadapter_canny_sd14v1.pth``, ``t2iadapter_sketch_sd15v2.pth``, ...): the
  ``Adapter`` of the T2I-Adapter repository (``conv_in``, ``body.N.{in_conv,block1,block2}``, two resnets per level),
  SD 1.x's at 1/8 (``conv_in`` reads 64 or 192 channels: a 1-channel or RGB map), an SDXL one at 1/16 (256 / 768);
  the light one (``t2iadapter_color_sd14v1.pth``: ``body.N.{in_conv,body.M,out_conv}``);
- diffusers' ``T2IAdapter`` (``adapter.conv_in``, ``adapter.body.N.resnets.M``; ``FullAdapter``, ``FullAdapterXL``,
  ``LightAdapter``), a folder holding ``config.json`` and ``diffusion_pytorch_model.safetensors`` or that file alone
  (``t2i-adapter_diffusers_xl_canny.safetensors``).

The style adapter (``t2iadapter_style_sd14v1.pth``) is another kind of model (CLIP vision tokens): it runs with the
preprocessor ``t2ia_style_clipvision`` (:mod:`sdrt.pipelines.styleadapter`), and is refused here with any other.

The rules (diffusers' ``StableDiffusionAdapterPipeline`` / ``StableDiffusionXLAdapterPipeline``):

- the control map in [0, 1] at the output size; a 1-channel adapter reads its first channel (the extension's
  ``hint[:, 0:1]``; diffusers reads a grayscale picture, the same for the gray maps these adapters take);
- the features times the unit's weight (diffusers' ``adapter_conditioning_scale``), on every row (uncond and cond);
- they apply at step ``i`` while the unit's window is on (diffusers' ``adapter_conditioning_factor`` ``f`` is the window
  ``0..f``: on while ``i < int(n f)``), and nothing is added otherwise;
- sd-webui-controlnet's rules (its ``window="a1111"`` and control modes, which serve uses): a control mode other
  than Balanced (and a canny / mlsd unit in the hires fix's second pass) scales the four features by
  ``weight * (0.25, 0.62, 0.825, 1.0)``; "ControlNet is more important" also gives the uncond rows nothing. The
  positions are the same as diffusers'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelError
from .netgraph import AnnotatorNet

__all__ = ["AdapterNet", "SOFT", "adapter_file", "feature_scales", "feature_shapes", "is_adapter", "open_adapter"]

#: the extension's soft injection of a T2I-Adapter's four features
SOFT = (0.25, 0.62, 0.825, 1.0)
#: the adapter's feature inputs on the edited UNet (sdrt.checkpoint.adapterresiduals)
FEATURE = "t2i_adapter_residual_"
_LEVELS = 4
_NAMES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors",
          "diffusion_pytorch_model.bin")
_FIX = ("pass a T2I-Adapter file as downloaded (TencentARC's t2iadapter_*.pth, or diffusers' T2IAdapter "
        "diffusion_pytorch_model.safetensors or its folder)")


def adapter_file(net: Any, where: str = "controlnets") -> Path | None:
    """The weights file of ``net`` when it names a T2I-Adapter (a file, or a diffusers folder holding one), else None.
    Only the tensor names are read (a safetensors header; a ``.pth``'s pickle, not its tensors' bytes); a weights
    file that cannot be read at all (truncated) is a ``ModelError`` naming it and ``where``."""
    if not isinstance(net, (str, Path)) or not str(net):
        return None
    p = Path(str(net))
    if p.is_dir():
        if (p / "model.onnx").is_file():
            return None
        p = next((p / n for n in _NAMES if (p / n).is_file()), p)
    if not p.is_file() or p.suffix.lower() not in (".safetensors", ".pth", ".pt", ".bin", ".ckpt"):
        return None
    return p if is_adapter(_keys(p, where)) else None


def _keys(path: Path, where: str) -> list[str]:
    from ..errors import SdrtError
    from ..weights import Weights

    try:
        return list(Weights.open(path).shapes())
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one line naming it
        said = exc.what if isinstance(exc, SdrtError) else f"{type(exc).__name__}: {exc}"
        raise ModelError(f"{path} could not be read as a PyTorch or safetensors file ({said})",
                         where=f"{where} ({path})",
                         fix="download the ControlNet or T2I-Adapter file again (it may be truncated)") from None


def is_adapter(keys: Sequence[str]) -> bool:
    """Whether the tensor names are a T2I-Adapter's (full, XL or light; original or diffusers names), the style
    adapter included (which :class:`AdapterNet` refuses)."""
    ks = set(keys)
    return any(k in ks for k in ("adapter.conv_in.weight", "adapter.body.0.in_conv.weight", "conv_in.weight",
                                 "body.0.in_conv.weight", "style_embedding")) and (
        any(k.startswith(("adapter.body.", "body.")) for k in ks) or "style_embedding" in ks) and not any(
        k.startswith(("input_blocks.", "down_blocks.", "control_model.", "controlnet_")) for k in ks)


@dataclass(frozen=True)
class Layout:
    """What a T2I-Adapter file is: ``kind`` ("full", "full_xl", "light"), its map's channels, the unshuffle factor,
    resnets per level, the widths of its four features."""

    kind: str
    in_channels: int
    factor: int
    resnets: int
    channels: tuple[int, ...]

    @property
    def base(self) -> str:
        return "sdxl" if self.kind == "full_xl" else "sd1"

    @property
    def label(self) -> str:
        return {"full": "an SD 1.x T2I-Adapter", "full_xl": "an SDXL T2I-Adapter",
                "light": "an SD 1.x light T2I-Adapter (the colour one)"}[self.kind]

    def down(self, level: int) -> bool:
        """Whether the level starts by halving the map (an average pool)."""
        return level == 2 if self.kind == "full_xl" else level > 0


class AdapterNet(AnnotatorNet):
    """A T2I-Adapter file compiled as an ONNX graph (per map size), its tensors under one canonical naming:
    full: ``conv_in``, ``body.{level * resnets + j}.{in_conv,block1,block2,skep,down_opt.op}`` (the original's);
    light: ``body.{level}.{in_conv,out_conv}``, ``body.{level}.resnets.{j}.{block1,block2}`` (diffusers')."""

    WHAT = "a T2I-Adapter"
    FIX = _FIX
    KEEP = 2

    def __init__(self, path: str | Path, *, backend: str = "auto", device: Any = None) -> None:
        self._rb = 2
        self.layout: Layout | None = None
        super().__init__(path, backend=backend, device=device)

    @classmethod
    def layout_of(cls, shapes: Mapping[str, Sequence[int]], where: str = "the file") -> Layout:
        """The layout of a file with these tensor shapes, every tensor checked as opening it checks them (no file
        read); ``ModelError`` as :class:`AdapterNet` raises it."""
        from .netgraph import check_shapes

        probe = cls.__new__(cls)
        probe.path, probe._rb, probe.layout = Path(where), 2, None
        check_shapes(shapes, probe.expected(shapes), where, cls.WHAT, cls.FIX, probe.strip)
        assert probe.layout is not None
        return probe.layout

    # ------------------------------------------------------------------ names
    def strip(self, name: str) -> str:
        n = name[len("adapter."):] if name.startswith("adapter.") else name
        m = re.fullmatch(r"body\.(\d+)\.resnets\.(\d+)\.(.*)", n)
        if m and (self.layout is None or self.layout.kind != "light"):  # diffusers' full -> the original's numbering
            return f"body.{int(m[1]) * self._rb + int(m[2])}.{m[3]}"
        m = re.fullmatch(r"body\.(\d+)\.(in_conv|out_conv)\.(weight|bias)", n)
        if m and self.layout is not None and self.layout.kind != "light" and name.startswith("adapter."):
            return f"body.{int(m[1]) * self._rb}.{m[2]}.{m[3]}"
        m = re.fullmatch(r"body\.(\d+)\.body\.(\d+)\.(.*)", n)  # the original light's
        if m:
            return f"body.{m[1]}.resnets.{m[2]}.{m[3]}"
        return n

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        where = str(self.path)
        if "style_embedding" in shapes:
            raise ModelError(f"{where} is the style T2I-Adapter (t2iadapter_style, CLIP vision tokens), which runs with "
                             "the preprocessor t2ia_style_clipvision only", where=where,
                             fix="pass preprocessor='t2ia_style_clipvision' (and the CLIP ViT-L/14 vision encoder as "
                                 "preprocessor_models), or a control T2I-Adapter (canny, depth, sketch, ...)")
        bare = {(k[len("adapter."):] if k.startswith("adapter.") else k): tuple(int(d) for d in v)
                for k, v in shapes.items()}
        diffusers = any(k.startswith("adapter.") for k in shapes)
        if "conv_in.weight" in bare:
            cin = bare["conv_in.weight"]
            if len(cin) != 4:
                raise ModelError(f"{where}: conv_in.weight is {cin}, not a T2I-Adapter's convolution", where=where,
                                 fix=_FIX)
            if diffusers:
                self._rb = len({k.split(".")[3] for k in bare if re.fullmatch(r"body\.0\.resnets\.\d+\..*", k)}) or 2
            else:
                n = len({int(k.split(".")[1]) for k in bare if re.fullmatch(r"body\.\d+\..*", k)})
                self._rb = max(n // _LEVELS, 1)
            factor = 16 if cin[1] in (256, 768) else 8
            if cin[1] % (factor * factor):
                raise ModelError(f"{where}: conv_in reads {cin[1]} channels, which is no T2I-Adapter's (64 or 192 for "
                                 "SD 1.x, 256 or 768 for SDXL)", where=where, fix=_FIX)
            c0 = cin[0]
            self.layout = Layout("full_xl" if factor == 16 else "full", cin[1] // (factor * factor), factor, self._rb,
                                 (c0, 2 * c0, 4 * c0, 4 * c0))
            k2 = bare.get("body.0.resnets.0.block2.weight" if diffusers else "body.0.block2.weight", (c0, c0, 1, 1))
            ks = k2[2] if len(k2) == 4 else 1
            want: dict[str, tuple[int, ...]] = {"conv_in.weight": cin, "conv_in.bias": (c0,)}
            prev = c0
            present = {self.strip(k) for k in shapes}
            for level, c in enumerate(self.layout.channels):
                for j in range(self._rb):
                    b = f"body.{level * self._rb + j}"
                    cin_j = prev if j == 0 else c
                    want[f"{b}.block1.weight"], want[f"{b}.block1.bias"] = (c, c, 3, 3), (c,)
                    want[f"{b}.block2.weight"], want[f"{b}.block2.bias"] = (c, c, ks, ks), (c,)
                    if cin_j != c or f"{b}.in_conv.weight" in present:
                        want[f"{b}.in_conv.weight"], want[f"{b}.in_conv.bias"] = (c, cin_j, ks, ks), (c,)
                    if f"{b}.skep.weight" in present:
                        want[f"{b}.skep.weight"], want[f"{b}.skep.bias"] = (c, cin_j, ks, ks), (c,)
                    if j == 0 and self.layout.down(level) and f"{b}.down_opt.op.weight" in present:
                        want[f"{b}.down_opt.op.weight"] = (cin_j, cin_j, 3, 3)
                        want[f"{b}.down_opt.op.bias"] = (cin_j,)
                prev = c
            return want
        first = bare.get("body.0.in_conv.weight")
        if first is None or len(first) != 4 or "body.0.out_conv.weight" not in bare:
            raise ModelError(f"{where} is not a T2I-Adapter (no conv_in, nor a light adapter's body.0.in_conv / out_conv)",
                             where=where, fix=_FIX)
        rb = len({k.split(".")[3] for k in bare if re.fullmatch(r"body\.0\.(?:body|resnets)\.\d+\..*", k)})
        c0 = bare["body.0.out_conv.weight"][0]
        self.layout = Layout("light", first[1] // 64, 8, rb, (c0, 2 * c0, 4 * c0, 4 * c0))
        want = {}
        prev = first[1]
        for level, c in enumerate(self.layout.channels):
            m = c // 4
            b = f"body.{level}"
            want[f"{b}.in_conv.weight"], want[f"{b}.in_conv.bias"] = (m, prev, 1, 1), (m,)
            want[f"{b}.out_conv.weight"], want[f"{b}.out_conv.bias"] = (c, m, 1, 1), (c,)
            for j in range(rb):
                r = f"{b}.resnets.{j}"
                want[f"{r}.block1.weight"], want[f"{r}.block1.bias"] = (m, m, 3, 3), (m,)
                want[f"{r}.block2.weight"], want[f"{r}.block2.bias"] = (m, m, 3, 3), (m,)
            prev = c
        return want

    # ------------------------------------------------------------------ the graph
    def build(self, h: int, w: int) -> Any:
        """The graph for an unshuffled map ``[1, in_channels * factor**2, h, w]`` -> ``feature_0..3``."""
        from .netgraph import Net

        lay = self.layout
        assert lay is not None
        net = Net(self.arrays())
        x, size = "image", (h, w)
        outs = {}
        if lay.kind == "light":
            for level in range(_LEVELS):
                b = f"body.{level}"
                if lay.down(level):
                    x, h, w = _pool(net, x, h, w)
                x = net.conv(x, f"{b}.in_conv", pad=0)
                for j in range(lay.resnets):
                    r = f"{b}.resnets.{j}"
                    y = net.conv(net.relu(net.conv(x, f"{r}.block1", pad=1)), f"{r}.block2", pad=1)
                    x = net.add(y, x)
                x = net.conv(x, f"{b}.out_conv", pad=0)
                outs[x] = f"feature_{level}"
        else:
            x = net.conv(x, "conv_in", pad=1)
            for level in range(_LEVELS):
                for j in range(lay.resnets):
                    b = f"body.{level * lay.resnets + j}"
                    if j == 0 and lay.down(level):
                        if f"{b}.down_opt.op.weight" in net.arrays:
                            x = net.conv(x, f"{b}.down_opt.op", stride=2, pad=1)
                            h, w = (h + 1) // 2, (w + 1) // 2
                        else:
                            x, h, w = _pool(net, x, h, w)
                    if f"{b}.in_conv.weight" in net.arrays:
                        x = net.conv(x, f"{b}.in_conv")
                    y = net.conv(net.relu(net.conv(x, f"{b}.block1", pad=1)), f"{b}.block2")
                    x = net.add(y, net.conv(x, f"{b}.skep") if f"{b}.skep.weight" in net.arrays else x)
                outs[x] = f"feature_{level}"
        cin = lay.in_channels * lay.factor ** 2
        return net.model("sdrt_t2i_adapter", {"image": (1, cin, *size)}, outs)

    def features(self, control: np.ndarray) -> list[np.ndarray]:
        """The four feature maps of a control tensor ``[1, 3, H, W]`` in [0, 1] (float32)."""
        lay = self.layout
        assert lay is not None
        x = np.asarray(control, np.float32)[:, : lay.in_channels]
        n, c, hh, ww = x.shape
        r = lay.factor
        if hh % r or ww % r:
            raise InputError(f"the output size {ww}x{hh} is no multiple of {r}, which {lay.label} needs", where="width",
                             fix=f"pass a width and height that are multiples of {r}")
        # PixelUnshuffle in numpy (a 6-D rearrangement, which not every backend takes): channel c*r*r + i*r + j
        x = x.reshape(n, c, hh // r, r, ww // r, r).transpose(0, 1, 3, 5, 2, 4).reshape(n, c * r * r, hh // r, ww // r)
        sess = self.session(hh // r, ww // r)
        out = sess.run({"image": np.ascontiguousarray(x)})
        return [np.asarray(out[f"feature_{k}"], np.float32) for k in range(_LEVELS)]


def _pool(net: Any, x: str, h: int, w: int) -> tuple[str, int, int]:
    """PyTorch's ``AvgPool2d(2, 2, ceil_mode=True)``: at an odd side the last window holds the pixels inside only, and
    is their mean. Written without ``ceil_mode`` (which not every backend takes): zeros padded to an even side, the
    2x2 mean, times 4 / (the pixels inside) where a window hangs over."""
    h2, w2 = (h + 1) // 2, (w + 1) // 2
    if not (h % 2 or w % 2):
        return net.avg_pool(x, 2), h2, w2
    x = net.node("Pad", [x, net.ints(0, 0, 0, 0, 0, 0, h % 2, w % 2)], None, mode="constant")
    y = net.avg_pool(x, 2)
    rows = np.full(h2, 2.0, np.float32)
    cols = np.full(w2, 2.0, np.float32)
    rows[-1], cols[-1] = 2 - h % 2, 2 - w % 2
    fix = (np.float32(4.0) / np.outer(rows, cols)).astype(np.float32)[None, None]
    name = f"pool_fix_{h}x{w}"
    return net.mul(y, name if name in net._have else net.const(name, fix)), h2, w2


def open_adapter(path: str | Path, *, backend: str = "auto", device: Any = None) -> AdapterNet:
    """A T2I-Adapter file (or a diffusers folder holding one), checked; ``ModelError`` in one line otherwise."""
    p = Path(path)
    if p.is_dir():
        found = next((p / n for n in _NAMES if (p / n).is_file()), None)
        if found is None:
            raise ModelError(f"{p} holds no diffusion_pytorch_model.safetensors", where=str(p), fix=_FIX)
        p = found
    return AdapterNet(p, backend=backend, device=device)


def feature_shapes(layout: Layout, height: int, width: int) -> list[tuple[int, int, int]]:
    """The four features' (channels, h, w) for a ``width x height`` output."""
    h, w = height // layout.factor, width // layout.factor
    out = []
    for level, c in enumerate(layout.channels):
        if layout.down(level):
            h, w = (h + 1) // 2, (w + 1) // 2
        out.append((c, h, w))
    return out


def feature_scales(unit: Any, *, hires: bool = False) -> list[float]:
    """What each of the four features is multiplied by: the weight (diffusers' conditioning scale), or the
    extension's soft injection ``weight * (0.25, 0.62, 0.825, 1.0)`` with a control mode other than Balanced and for
    a canny / mlsd unit in the hires fix's second pass."""
    from .controlnet import CONTROL_MODES

    soft = unit.control_mode != CONTROL_MODES[0] or (hires and unit.preprocessor in ("canny", "mlsd"))
    return [float(unit.scale) * (s if soft else 1.0) for s in SOFT]
