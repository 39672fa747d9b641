"""LaMa's fill of an inpaint map: sd-webui-controlnet's ``inpaint_only+lama`` preprocessor.

``ControlNetLama.pth`` (lllyasviel/Annotators; big-lama: LaMa's ``FFCResNetGenerator``, ngf 64, three stride-2
downsampling convs, 18 fast-Fourier-convolution residual blocks at 512 channels (3/4 of them "global": a 1x1 conv
in the frequency domain of a 2-D real FFT), three transposed convs and a 7x7 conv with a sigmoid; reflect-padded
convs, batch norms; 51 M parameters) is read with sdrt's safe torch-file reader and built as an ONNX graph
(:mod:`sdrt.pipelines.netgraph`). The FFT is written as matmuls with DFT matrices (cos / sin over each axis, the
``"ortho"`` norm torch.fft uses), so every backend runs it: ggml has no DFT op. The widths and the block count are
read from the file (the published one has ngf 64 and 18 blocks).

Around it, numpy follows the extension (``scripts/preprocessor/lama_inpaint.py``, ``annotator/lama``) step for
step: the RGBA map (the picture and its mask) resized with ``resize_image_with_pad`` to 256 on its shorter side
(bicubic up, area down, the four channels alike) and padded with its edges to multiples of 64; the mask ``> 0.5``,
the picture zeroed under it; the generator's output kept under the mask and the input elsewhere, ``* 255``
clipped and truncated to uint8; the padding cropped off, resized back with ``cv2.resize`` (bilinear); blended with
the picture by the unthresholded mask ``a / 255``, clipped and truncated; the mask kept as the alpha.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet, Net

__all__ = ["LAMA_FILE", "LAMA_RES", "Lama", "check_size", "expected_shapes", "fill"]

LAMA_FILE = "ControlNetLama.pth"
#: the extension's resolution for LaMa ("Always use 256 since lama is trained on 256")
LAMA_RES = 256
#: the FFC blocks' global share of the channels (big-lama's ``ratio_gin`` / ``ratio_gout``)
RATIO_G = 0.75
_DOWN = 3


def _layout(ngf: int, blocks: int) -> dict[str, Any]:
    """The generator's module indices (``model.<i>``) for ``ngf`` and ``blocks``."""
    first_block = 2 + _DOWN
    up = first_block + blocks + 1  # ConcatTupleLayer between
    return {"blocks": list(range(first_block, first_block + blocks)), "ups": [up + 3 * i for i in range(_DOWN)],
            "out": up + 3 * _DOWN + 1}


def expected_shapes(ngf: int = 64, blocks: int = 18) -> dict[str, tuple[int, ...]]:
    """The tensors of an ``FFCResNetGenerator`` (big-lama's: ``ngf=64``, 18 blocks) and their shapes."""
    out: dict[str, tuple[int, ...]] = {}

    def bn(name: str, c: int) -> None:
        for p in ("weight", "bias", "running_mean", "running_var"):
            out[f"{name}.{p}"] = (c,)

    out["model.1.ffc.convl2l.weight"] = (ngf, 4, 7, 7)
    bn("model.1.bn_l", ngf)
    for i in range(_DOWN):
        cin, cout = ngf * 2 ** i, ngf * 2 ** (i + 1)
        name = f"model.{2 + i}"
        if i < _DOWN - 1:
            out[f"{name}.ffc.convl2l.weight"] = (cout, cin, 3, 3)
            bn(f"{name}.bn_l", cout)
        else:  # the last one splits its output into local and global channels
            g = int(cout * RATIO_G)
            out[f"{name}.ffc.convl2l.weight"] = (cout - g, cin, 3, 3)
            out[f"{name}.ffc.convl2g.weight"] = (g, cin, 3, 3)
            bn(f"{name}.bn_l", cout - g)
            bn(f"{name}.bn_g", g)
    dim = ngf * 2 ** _DOWN
    g = int(dim * RATIO_G)
    loc = dim - g
    lay = _layout(ngf, blocks)
    for b in lay["blocks"]:
        for conv in ("conv1", "conv2"):
            name = f"model.{b}.{conv}"
            out[f"{name}.ffc.convl2l.weight"] = (loc, loc, 3, 3)
            out[f"{name}.ffc.convl2g.weight"] = (g, loc, 3, 3)
            out[f"{name}.ffc.convg2l.weight"] = (loc, g, 3, 3)
            st = f"{name}.ffc.convg2g"
            out[f"{st}.conv1.0.weight"] = (g // 2, g, 1, 1)
            bn(f"{st}.conv1.1", g // 2)
            out[f"{st}.fu.conv_layer.weight"] = (g, g, 1, 1)
            bn(f"{st}.fu.bn", g)
            out[f"{st}.conv2.weight"] = (g, g // 2, 1, 1)
            bn(f"{name}.bn_l", loc)
            bn(f"{name}.bn_g", g)
    c = dim
    for u in lay["ups"]:
        out[f"model.{u}.weight"] = (c, c // 2, 3, 3)
        out[f"model.{u}.bias"] = (c // 2,)
        bn(f"model.{u + 1}", c // 2)
        c //= 2
    out[f"model.{lay['out']}.weight"] = (3, ngf, 7, 7)
    out[f"model.{lay['out']}.bias"] = (3,)
    return out


def _strip(name: str) -> str:
    for prefix in ("module.", "generator."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def _dft(n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of ``2 pi j k / n`` (n x n), each over ``sqrt(n)`` (the ortho norm), from exact integer phases."""
    k = np.arange(n)
    phase = 2 * np.pi * ((k[:, None] * k[None, :]) % n) / n
    s = 1.0 / np.sqrt(n)
    return np.cos(phase) * s, np.sin(phase) * s


class _Builder(Net):
    def reflect(self, x: str, p: int) -> str:
        """``ReflectionPad2d(p)`` (torch's ``padding_mode="reflect"``): the last axis padded, the two last swapped,
        padded, swapped back (a reflect Pad of the last axis is what ggml runs)."""
        pads = self.ints(0, 0, 0, p, 0, 0, 0, p)
        t = self.node("Transpose", [self.node("Pad", [x, pads], mode="reflect")], perm=[0, 1, 3, 2])
        return self.node("Transpose", [self.node("Pad", [t, pads], mode="reflect")], perm=[0, 1, 3, 2])

    def rconv(self, x: str, name: str, pad: int, stride: int = 1) -> str:
        return self.conv(self.reflect(x, pad) if pad else x, name, stride=stride, pad=0)

    def bn_relu(self, x: str, name: str) -> str:
        return self.relu(self.batch_norm(x, name))

    def mat(self, name: str, a: np.ndarray) -> str:
        return name if name in self._have else self.const(name, np.asarray(a, np.float32))

    def fourier(self, x: str, name: str, h: int, w: int) -> str:
        """``FourierUnit``: ``rfft2`` (ortho) of ``x`` (N, C, h, w), the real and imaginary parts through a 1x1 conv
        (2C -> 2C, no bias; torch's channels interleave them, the weight's are reordered here), a batch norm and a
        ReLU, then ``irfft2`` back to (h, w). The transforms are matmuls: over the width on the right, over the
        height on the transposed tensor."""
        wf = w // 2 + 1
        cw, sw = _dft(w)
        ch, sh = _dft(h)
        fr = self.mat(f"rfft_cos_{w}", cw[:, :wf])  # x @ fr + i x @ fi: (w, wf)
        fi = self.mat(f"rfft_msin_{w}", -sw[:, :wf])
        hc = self.mat(f"fft_cos_{h}", ch)  # symmetric: X^T @ hc is (hc @ X)^T
        hs = self.mat(f"fft_sin_{h}", sh)
        scale = np.where((np.arange(wf) == 0) | ((w % 2 == 0) & (np.arange(wf) == w // 2)), 1.0, 2.0)[:, None]
        ir = self.mat(f"irfft_cos_{w}", scale * cw[:wf, :])  # (wf, w): the real part's taps
        ii = self.mat(f"irfft_msin_{w}", -scale * sw[:wf, :])  # the imaginary part's
        t = [0, 1, 3, 2]
        xr = self.node("Transpose", [self.node("MatMul", [x, fr])], perm=t)  # (N, C, wf, h)
        xi = self.node("Transpose", [self.node("MatMul", [x, fi])], perm=t)
        # forward over h: (C - iS)(Xr + iXi)
        yr = self.add(self.node("MatMul", [xr, hc]), self.node("MatMul", [xi, hs]))
        yi = self.sub(self.node("MatMul", [xi, hc]), self.node("MatMul", [xr, hs]))
        # the conv on [re..., im...] (channel-major), its output as [re..., im...]
        wgt = np.asarray(self.arrays[f"{name}.conv_layer.weight"], np.float32)
        c2 = wgt.shape[0]
        order = np.concatenate([np.arange(0, c2, 2), np.arange(1, c2, 2)])
        cname = f"{name}.conv_layer.weight.planar"
        self.const(cname, wgt[order][:, order])
        z = self.node("Conv", [self.concat([yr, yi]), cname], kernel_shape=[1, 1])
        bnp = [self.const(f"{name}.bn.{p}.planar", np.asarray(self.arrays[f"{name}.bn.{p}"], np.float32)[order])
               for p in ("weight", "bias", "running_mean", "running_var")]
        z = self.relu(self.node("BatchNormalization", [z, *bnp], epsilon=1e-5))
        zr, zi = self.nodes_out("Split", [z, self.ints(c2 // 2, c2 // 2)], 2, axis=1)
        # inverse over h: (C + iS)(Zr + iZi), still transposed (N, C, wf, h)
        ur = self.sub(self.node("MatMul", [zr, hc]), self.node("MatMul", [zi, hs]))
        ui = self.add(self.node("MatMul", [zi, hc]), self.node("MatMul", [zr, hs]))
        ur = self.node("Transpose", [ur], perm=t)  # (N, C, h, wf)
        ui = self.node("Transpose", [ui], perm=t)
        return self.add(self.node("MatMul", [ur, ir]), self.node("MatMul", [ui, ii]))

    def sub(self, a: str, b: str) -> str:
        return self.node("Sub", [a, b])

    def spectral(self, x: str, name: str, h: int, w: int) -> str:
        """``SpectralTransform`` (stride 1, no local Fourier unit)."""
        y = self.bn_relu(self.conv(x, f"{name}.conv1.0", pad=0), f"{name}.conv1.1")
        return self.conv(self.add(y, self.fourier(y, f"{name}.fu", h, w)), f"{name}.conv2", pad=0)

    def ffc_block(self, xl: str, xg: str, name: str, h: int, w: int) -> tuple[str, str]:
        """``FFC_BN_ACT`` at 3x3 with both halves: ``l = l2l(l) + g2l(g)``, ``g = l2g(l) + g2g(g)``, BN, ReLU."""
        pl, pg = self.reflect(xl, 1), self.reflect(xg, 1)
        ol = self.add(self.conv(pl, f"{name}.ffc.convl2l", pad=0), self.conv(pg, f"{name}.ffc.convg2l", pad=0))
        og = self.add(self.conv(pl, f"{name}.ffc.convl2g", pad=0), self.spectral(xg, f"{name}.ffc.convg2g", h, w))
        return self.bn_relu(ol, f"{name}.bn_l"), self.bn_relu(og, f"{name}.bn_g")


def _dims(shapes: Mapping[str, Sequence[int]]) -> tuple[int, int]:
    """(ngf, blocks) of a generator's file, from its first conv and its blocks' names (64, 18 when unreadable: the
    published file's, so a file that is not LaMa's is named by what it lacks)."""
    bare = {_strip(n): s for n, s in shapes.items()}
    first = bare.get("model.1.ffc.convl2l.weight")
    ngf = int(first[0]) if first is not None and len(first) == 4 and int(first[0]) > 0 else 64
    found = {int(m.group(1)) for n in bare if (m := re.fullmatch(r"model\.(\d+)\.conv1\.ffc\.convl2l\.weight", n))}
    blocks = len(found) if found and found == set(range(2 + _DOWN, 2 + _DOWN + len(found))) else 18
    return ngf, blocks


class Lama(AnnotatorNet):
    """``ControlNetLama.pth`` compiled on one backend per input size; ``predict(color, mask)`` is the generator's
    output."""

    WHAT = "LaMa's ControlNetLama.pth (big-lama)"
    FIX = (f"download {LAMA_FILE} (lllyasviel/Annotators; the extension's annotator/downloads/lama) and pass it "
           "or its folder")
    KEEP = 2

    def strip(self, name: str) -> str:
        return _strip(name)

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        self.ngf, self.blocks = _dims(shapes)
        return expected_shapes(self.ngf, self.blocks)

    def build(self, height: int, width: int) -> Any:
        """``image`` (1, 4, height, width): the picture (zeroed under the mask) and the mask, in 0..1 -> ``out``
        (1, 3, height, width), the generator's sigmoid."""
        net = _Builder(self.arrays())
        x = net.bn_relu(net.rconv("image", "model.1.ffc.convl2l", 3), "model.1.bn_l")
        for i in range(_DOWN - 1):
            x = net.bn_relu(net.rconv(x, f"model.{2 + i}.ffc.convl2l", 1, stride=2), f"model.{2 + i}.bn_l")
        last = f"model.{1 + _DOWN}"
        p = net.reflect(x, 1)
        xl = net.bn_relu(net.conv(p, f"{last}.ffc.convl2l", stride=2, pad=0), f"{last}.bn_l")
        xg = net.bn_relu(net.conv(p, f"{last}.ffc.convl2g", stride=2, pad=0), f"{last}.bn_g")
        h, w = height // 2 ** _DOWN, width // 2 ** _DOWN
        lay = _layout(self.ngf, self.blocks)
        for b in lay["blocks"]:
            yl, yg = net.ffc_block(xl, xg, f"model.{b}.conv1", h, w)
            yl, yg = net.ffc_block(yl, yg, f"model.{b}.conv2", h, w)
            xl, xg = net.add(xl, yl), net.add(xg, yg)
        x = net.concat([xl, xg])
        for u in lay["ups"]:
            x = net.bn_relu(net.conv_transpose(x, f"model.{u}", stride=2, pad=1, output_padding=1), f"model.{u + 1}")
        x = net.sigmoid(net.conv(net.reflect(x, 3), f"model.{lay['out']}", pad=0))
        return net.model("sdrt_lama", {"image": (1, 4, height, width)}, {x: "out"})

    def predict(self, feed: np.ndarray) -> np.ndarray:
        """The generator's output (3, H, W) float32 for ``feed`` (4, H, W) float32, H and W multiples of 8."""
        h, w = feed.shape[1:]
        out = self.session(h, w).run({"image": np.ascontiguousarray(feed[None], np.float32)})
        return np.asarray(out["out"], np.float32)[0]


def check_size(height: int, width: int, where: str = "sdrt.pipelines.lamafill.fill") -> None:
    """A one-line ``ControlImageError`` when LaMa's input, the ``width x height`` picture at :data:`LAMA_RES` on its
    shorter side whatever the processor resolution, would be longer than ``MAX_SIDE`` (a strip over 64:1): the
    network's activations and its DFT matrices grow with that side."""
    from .controlmaps import scaled_side

    scaled_side(height, width, LAMA_RES / min(height, width), where,
                f"LaMa's input (the picture at {LAMA_RES} pixels on its shorter side, whatever the processor "
                "resolution)", "crop the control image (and its mask) to nearer a square: at most 64:1")


def _resize_with_pad(a: np.ndarray, resolution: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The extension's ``resize_image_with_pad`` of an RGBA map (all four channels alike)."""
    from .controlmaps import processor_size
    from .cvresize import resample

    h, w = a.shape[:2]
    check_size(h, w)
    k = float(resolution) / float(min(h, w))
    th, tw = processor_size(h, w, resolution)
    if (th, tw) != (h, w):
        kind = "cubic" if k > 1 else "area"
        a = np.concatenate([resample(np.ascontiguousarray(a[:, :, :3]), tw, th, kind),
                            resample(np.ascontiguousarray(a[:, :, 3]), tw, th, kind)[:, :, None]], axis=2)
    return np.pad(a, ((0, -th % 64), (0, -tw % 64), (0, 0)), mode="edge"), (th, tw)


def fill(a: np.ndarray, net: Lama) -> np.ndarray:
    """``inpaint_only+lama``'s map of an RGBA map (HxWx4 uint8: the picture and its mask, white = repaint): the
    picture with LaMa's fill blended in under the mask, the mask as alpha (HxWx4 uint8)."""
    from .cvresize import resample

    H, W = a.shape[:2]
    raw_color, raw_mask = a[:, :, :3], a[:, :, 3:4]
    img, (th, tw) = _resize_with_pad(a, LAMA_RES)
    color = img[:, :, :3].astype(np.float32) / np.float32(255.0)
    mask = (img[:, :, 3:4].astype(np.float32) / np.float32(255.0) > 0.5).astype(np.float32)
    color = color * (1 - mask)
    feed = np.concatenate([color, mask], axis=2).transpose(2, 0, 1)
    result = net.predict(feed).transpose(1, 2, 0)
    result = result * mask + color * (1 - mask)
    result = result * np.float32(255.0)
    prd = result.clip(0, 255).astype(np.uint8)[:th, :tw]
    prd = resample(np.ascontiguousarray(prd), W, H, "linear")
    # the blend in float32 where the mask is grey; where it is 0 or 255 that arithmetic gives the picture or the
    # fill exactly, taken as they are (the whole picture in float32 was twice the fill's numpy peak)
    m = raw_mask[:, :, 0]
    fin = raw_color.copy()  # (never the caller's array)
    full = m == 255
    fin[full] = prd[full]
    grey = (m > 0) & ~full
    if grey.any():
        alpha = m[grey].astype(np.float32)[:, None] / np.float32(255.0)
        mixed = prd[grey].astype(np.float32) * alpha + raw_color[grey].astype(np.float32) * (1 - alpha)
        fin[grey] = mixed.clip(0, 255).astype(np.uint8)
    return np.ascontiguousarray(np.concatenate([fin, raw_mask], axis=2))
