"""UniFormer + UperNet on ADE20K: sd-webui-controlnet's ``seg_ufade20k`` module (``upernet_global_small.pth``) in sdrt.

The file is an mmsegmentation checkpoint (``state_dict`` beside ``meta``) of an ``EncoderDecoder``: the UniFormer-S
backbone (``backbone.*``: four patch embeddings, 3 + 4 convolution blocks (``CBlock``: depthwise position conv,
BatchNorm, a 5x5 depthwise "attention", a 1x1 MLP), 8 + 3 global self-attention blocks (``SABlock``, 64-wide
heads), a LayerNorm on each stage's output) and the UperNet head (``decode_head.*``: a pyramid pooling module on
the last stage (adaptive average pools of 1, 2, 3 and 6), lateral 1x1 and FPN 3x3 convolutions, all Conv + BN +
ReLU, the fused 3x3 bottleneck, the 150-class 1x1 ``conv_seg``). The auxiliary FCN head is not run (mmseg's
inference does not). sdrt reads it with its safe torch-file reader and builds the network as an ONNX graph in
memory (:mod:`sdrt.pipelines.netgraph`), which runs on any backend; the widths, block counts and head width are
read from the file's shapes (the published one: 64/128/320/512, 3/4/8/3, 512), the heads are 64 wide.

Around the network, numpy follows the extension (``uniformer`` in its processor, ``apply_uniformer``, mmseg's
``inference_segmentor`` with the ADE20K test pipeline, ``show_result`` at opacity 1):

- the image (RGB, at the processor resolution, padded with its edges to multiples of 64) is rescaled keeping its
  ratio to fit 2048 x 512 (``mmcv.imrescale``: factor ``min(2048 / long, 512 / short)``, sides ``int(s * f + 0.5)``,
  OpenCV's INTER_LINEAR of the uint8 image), so the network reads it with its shorter side at 512 whatever the
  processor resolution;
- mmseg's ``Normalize`` with ``to_rgb=True`` swaps the channels of the RGB image it is handed (it expects BGR), then
  subtracts ImageNet's mean ``(123.675, 116.28, 103.53)`` and multiplies by ``1 / (58.395, 57.12, 57.375)``:
  the network reads the image as B, G, R, as in the extension;
- the logits (a quarter of the input's size) are resized bilinearly (``align_corners=False``) to the rescaled
  image's size and then to the padded image's: both linear maps, composed here into one of at most four taps per
  axis and applied in float32 in bands of rows (the same interpolation, summed in one pass, never holding the
  150 full-size channels), then the class is the argmax (mmseg takes it after a softmax, which keeps the order;
  a tie between two classes may break the other way);
- each class is painted with ADE20K's palette (:mod:`sdrt.pipelines.segpalette`), and the map cropped back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet, Net

__all__ = ["CLASSES", "MIN_SIDE", "SMALL", "UNIFORMER_FILE", "UniformerSeg", "bilinear_matrix", "build_graph",
           "check_size", "config_of",
           "expected_shapes", "logits_to_labels", "net_size", "pool_matrix", "prepare", "seg_map"]

UNIFORMER_FILE = "upernet_global_small.pth"
#: ADE20K's classes (the decode head's ``conv_seg`` outputs)
CLASSES = 150
HEAD_DIM = 64
POOL_SCALES = (1, 2, 3, 6)
#: the ADE20K test pipeline's ``img_scale``: the image fits 2048 x 512 (long x short), its ratio kept
SCALE = (2048, 512)
MEAN = np.array([123.675, 116.28, 103.53], np.float64)
STD = np.array([58.395, 57.12, 57.375], np.float64)
_BN_EPS = 1e-5
_LN_EPS = 1e-6  # the blocks' and stage outputs' LayerNorms (the patch embeddings' are torch's default 1e-5)


@dataclass(frozen=True)
class Config:
    dims: tuple[int, int, int, int]
    layers: tuple[int, int, int, int]
    channels: int


#: upernet_global_small.pth: UniFormer-S, UperNet with 512 channels
SMALL = Config((64, 128, 320, 512), (3, 4, 8, 3), 512)


def config_of(shapes: Mapping[str, Sequence[int]]) -> Config:
    """The network a file holds, read from its tensors' bare names and shapes; UniFormer-S's where the file does
    not say (so that a file missing tensors is named by what it lacks)."""
    try:
        dims = tuple(int(shapes[f"backbone.patch_embed{i}.proj.weight"][0]) for i in range(1, 5))
        layers = []
        for i in range(1, 5):
            n = 0
            while f"backbone.blocks{i}.{n}.pos_embed.weight" in shapes:
                n += 1
            layers.append(n)
        if min(layers) < 1:
            return SMALL
        return Config(dims, tuple(layers), int(shapes["decode_head.bottleneck.conv.weight"][0]))  # type: ignore[arg-type]
    except (KeyError, IndexError, TypeError):
        return SMALL


def _bn(out: dict[str, tuple[int, ...]], name: str, c: int) -> None:
    for p in ("weight", "bias", "running_mean", "running_var"):
        out[f"{name}.{p}"] = (c,)


def expected_shapes(cfg: Config = SMALL) -> dict[str, tuple[int, ...]]:
    """The float tensors of the segmentor's backbone and decode head and their shapes, by bare name (BatchNorms'
    ``num_batches_tracked`` and the auxiliary head, which inference never runs, are not read)."""
    out: dict[str, tuple[int, ...]] = {}
    cin = 3
    for i, (d, n) in enumerate(zip(cfg.dims, cfg.layers), start=1):
        p = f"backbone.patch_embed{i}."
        k = 4 if i == 1 else 2
        out[p + "proj.weight"], out[p + "proj.bias"] = (d, cin, k, k), (d,)
        out[p + "norm.weight"], out[p + "norm.bias"] = (d,), (d,)
        for j in range(n):
            b = f"backbone.blocks{i}.{j}."
            out[b + "pos_embed.weight"], out[b + "pos_embed.bias"] = (d, 1, 3, 3), (d,)
            if i <= 2:
                _bn(out, b + "norm1", d)
                for c in ("conv1", "conv2"):
                    out[f"{b}{c}.weight"], out[f"{b}{c}.bias"] = (d, d, 1, 1), (d,)
                out[b + "attn.weight"], out[b + "attn.bias"] = (d, 1, 5, 5), (d,)
                _bn(out, b + "norm2", d)
                out[b + "mlp.fc1.weight"], out[b + "mlp.fc1.bias"] = (4 * d, d, 1, 1), (4 * d,)
                out[b + "mlp.fc2.weight"], out[b + "mlp.fc2.bias"] = (d, 4 * d, 1, 1), (d,)
            else:
                out[b + "norm1.weight"], out[b + "norm1.bias"] = (d,), (d,)
                out[b + "attn.qkv.weight"], out[b + "attn.qkv.bias"] = (3 * d, d), (3 * d,)
                out[b + "attn.proj.weight"], out[b + "attn.proj.bias"] = (d, d), (d,)
                out[b + "norm2.weight"], out[b + "norm2.bias"] = (d,), (d,)
                out[b + "mlp.fc1.weight"], out[b + "mlp.fc1.bias"] = (4 * d, d), (4 * d,)
                out[b + "mlp.fc2.weight"], out[b + "mlp.fc2.bias"] = (d, 4 * d), (d,)
        out[f"backbone.norm{i}.weight"], out[f"backbone.norm{i}.bias"] = (d,), (d,)
        cin = d
    c, last = cfg.channels, cfg.dims[-1]

    def module(name: str, cout: int, cin: int, k: int) -> None:  # mmcv's ConvModule: conv without bias, BN, ReLU
        out[f"decode_head.{name}.conv.weight"] = (cout, cin, k, k)
        _bn(out, f"decode_head.{name}.bn", cout)

    for s in range(len(POOL_SCALES)):
        module(f"psp_modules.{s}.1", c, last, 1)
    module("bottleneck", c, last + len(POOL_SCALES) * c, 3)
    for i in range(3):
        module(f"lateral_convs.{i}", c, cfg.dims[i], 1)
    for i in range(3):
        module(f"fpn_convs.{i}", c, c, 3)
    module("fpn_bottleneck", c, 4 * c, 3)
    out["decode_head.conv_seg.weight"], out["decode_head.conv_seg.bias"] = (CLASSES, c, 1, 1), (CLASSES,)
    return out


# ------------------------------------------------------------------------------------------ sizes and matrices
def net_size(h: int, w: int) -> tuple[int, int]:
    """``(height, width)`` the network reads an ``h x w`` image at: ``mmcv.imrescale`` to fit 2048 x 512."""
    f = min(max(SCALE) / max(h, w), min(SCALE) / min(h, w))
    return int(h * float(f) + 0.5), int(w * float(f) + 0.5)


#: the shortest side the network can read: its four stages divide it by 4, 2, 2 and 2
MIN_SIDE = 32


def check_size(height: int, width: int, resolution: int | None = None) -> None:
    """A ``ControlImageError`` when an ``height x width`` image (padded to 64; at processor resolution
    ``resolution``, None: its own size) is read (fitting 2048 x 512) below :data:`MIN_SIDE` on a side: an image more
    than about 64 times as long as it is wide, on which no stage of the network has a row left."""
    nh, nw = net_size(height, width)
    if min(nh, nw) < MIN_SIDE:
        from .controlmaps import ControlImageError

        at = "at its own size" if resolution is None else f"at processor resolution {resolution}"
        raise ControlImageError(f"seg_ufade20k reads the control image ({at} {width}x{height}) at {nw}x{nh}, to fit "
                                f"2048x512, and its network needs at least {MIN_SIDE} pixels on each side",
                                where="sdrt.pipelines.uniformerseg",
                                fix="crop the image nearer to a square (at most about 64 times as long as it is "
                                    "wide)")


def _bilinear_rows(src: int, dst: int) -> list[dict[int, float]]:
    """Each output row of :func:`bilinear_matrix` as ``{source index: weight}`` (zero weights left out)."""
    rows = []
    scale = np.float32(src) / np.float32(dst)
    for i in range(dst):
        x = max(float(np.float32((i + 0.5) * scale - 0.5)), 0.0)
        x0 = min(int(math.floor(x)), src - 1)
        x1 = min(x0 + 1, src - 1)
        lam = x - x0
        row: dict[int, float] = {}
        for j, v in ((x0, 1.0 - lam), (x1, lam)):
            row[j] = row.get(j, 0.0) + v
        rows.append({j: v for j, v in row.items() if v != 0.0})
    return rows


def bilinear_matrix(src: int, dst: int) -> np.ndarray:
    """``(dst, src)`` float64: PyTorch's bilinear interpolation of one axis, ``align_corners=False`` (source
    ``(i + 0.5) * src / dst - 0.5``, clamped at 0, two taps, the second clamped at the edge)."""
    m = np.zeros((dst, src), np.float64)
    for i, row in enumerate(_bilinear_rows(src, dst)):
        for j, v in row.items():
            m[i, j] = v
    return m


def pool_matrix(src: int, dst: int) -> np.ndarray:
    """``(dst, src)``: adaptive average pooling of one axis (bin ``i``: ``floor(i * src / dst)`` to
    ``ceil((i + 1) * src / dst)``)."""
    m = np.zeros((dst, src), np.float64)
    for i in range(dst):
        a, b = (i * src) // dst, -(-((i + 1) * src) // dst)
        m[i, a:b] = 1.0 / (b - a)
    return m


# ------------------------------------------------------------------------------------------ the network
class _Builder:
    def __init__(self, arrays: Mapping[str, np.ndarray], cfg: Config) -> None:
        own = dict(arrays)
        f32 = np.float32
        for i in (3, 4):  # q, k, v as three linears; q scaled by head_dim ** -0.5 (1/8: exact)
            d = cfg.dims[i - 1]
            for j in range(cfg.layers[i - 1]):
                p = f"backbone.blocks{i}.{j}.attn."
                w, b = np.asarray(own[p + "qkv.weight"], f32), np.asarray(own[p + "qkv.bias"], f32)
                for k, part in enumerate("qkv"):
                    s = f32(HEAD_DIM ** -0.5) if part == "q" else f32(1)
                    own[f"{p}{part}.weight"] = w[k * d:(k + 1) * d] * s
                    own[f"{p}{part}.bias"] = b[k * d:(k + 1) * d] * s
        self.net = Net(own)
        self.cfg = cfg

    def gelu(self, x: str) -> str:
        net = self.net
        e = net.node("Erf", [net.node("Div", [x, net.scalar(math.sqrt(2.0))])])
        return net.mul(net.mul(x, net.add(e, net.scalar(1.0))), net.scalar(0.5))

    def channel_norm(self, x: str, name: str, eps: float) -> str:
        """LayerNorm over the channels of an NCHW map."""
        net = self.net
        t = net.node("Transpose", [x], perm=[0, 2, 3, 1])
        return net.node("Transpose", [net.layer_norm(t, name, eps)], perm=[0, 3, 1, 2])

    def cblock(self, x: str, p: str, d: int) -> str:
        net = self.net
        x = net.add(x, net.conv(x, p + "pos_embed", pad=1, groups=d))
        y = net.conv(net.batch_norm(x, p + "norm1", _BN_EPS), p + "conv1", pad=0)
        y = net.conv(net.conv(y, p + "attn", pad=2, groups=d), p + "conv2", pad=0)
        x = net.add(x, y)
        y = self.gelu(net.conv(net.batch_norm(x, p + "norm2", _BN_EPS), p + "mlp.fc1", pad=0))
        return net.add(x, net.conv(y, p + "mlp.fc2", pad=0))

    def sablock(self, x: str, p: str, d: int, h: int, w: int) -> str:
        net = self.net
        n, heads = h * w, d // HEAD_DIM
        x = net.add(x, net.conv(x, p + "pos_embed", pad=1, groups=d))
        t = net.node("Transpose", [net.node("Reshape", [x, net.ints(1, d, n)])], perm=[0, 2, 1])
        a = net.layer_norm(t, p + "norm1", _LN_EPS)
        split = net.ints(1, n, heads, HEAD_DIM)
        q, k, v = (net.node("Reshape", [net.linear(a, p + "attn." + part), split]) for part in "qkv")
        q = net.node("Transpose", [q], perm=[0, 2, 1, 3])
        k = net.node("Transpose", [k], perm=[0, 2, 3, 1])
        v = net.node("Transpose", [v], perm=[0, 2, 1, 3])
        att = net.node("Softmax", [net.node("MatMul", [q, k])], axis=-1)
        o = net.node("Transpose", [net.node("MatMul", [att, v])], perm=[0, 2, 1, 3])
        t = net.add(t, net.linear(net.node("Reshape", [o, net.ints(1, n, d)]), p + "attn.proj"))
        m = self.gelu(net.linear(net.layer_norm(t, p + "norm2", _LN_EPS), p + "mlp.fc1"))
        t = net.add(t, net.linear(m, p + "mlp.fc2"))
        return net.node("Reshape", [net.node("Transpose", [t], perm=[0, 2, 1]), net.ints(1, d, h, w)])

    def conv_module(self, x: str, name: str, pad: int) -> str:
        net = self.net
        y = net.conv(x, f"decode_head.{name}.conv", pad=pad, bias=False)
        return net.relu(net.batch_norm(y, f"decode_head.{name}.bn", _BN_EPS))

    def pool(self, x: str, size: tuple[int, int], s: int) -> str:
        """Adaptive average pooling to ``s x s`` as two products with constant matrices."""
        net = self.net
        tag = f"{size[0]}x{size[1]}to{s}"
        pw = net.const(f"pool_w_{tag}", pool_matrix(size[1], s).T, np.float32)  # (W, s)
        ph = net.const(f"pool_h_{tag}", pool_matrix(size[0], s).T, np.float32)  # (H, s)
        y = net.node("MatMul", [x, pw])  # (1, C, H, s)
        y = net.node("MatMul", [net.node("Transpose", [y], perm=[0, 1, 3, 2]), ph])  # (1, C, s, s): (w, h)
        return net.node("Transpose", [y], perm=[0, 1, 3, 2])


def build_graph(arrays: Mapping[str, np.ndarray], cfg: Config, height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` for one ``(1, 3, height, width)`` normalised ``image`` -> ``logits``
    ``(1, 150, height // 4, width // 4)`` (the decode head's, before any resize)."""
    bld = _Builder(arrays, cfg)
    net = bld.net
    x, h, w = "image", height, width
    feats, sizes = [], []
    for i, (d, n) in enumerate(zip(cfg.dims, cfg.layers), start=1):
        k = 4 if i == 1 else 2
        x = net.conv(x, f"backbone.patch_embed{i}.proj", stride=k, pad=0)
        h, w = h // k, w // k
        x = bld.channel_norm(x, f"backbone.patch_embed{i}.norm", 1e-5)
        for j in range(n):
            p = f"backbone.blocks{i}.{j}."
            x = bld.cblock(x, p, d) if i <= 2 else bld.sablock(x, p, d, h, w)
        feats.append(bld.channel_norm(x, f"backbone.norm{i}", _LN_EPS))
        sizes.append((h, w))
    # UperNet: the pyramid pooling module on the last stage
    last = feats[3]
    psp = [last]
    for s_i, s in enumerate(POOL_SCALES):
        y = bld.conv_module(bld.pool(last, sizes[3], s), f"psp_modules.{s_i}.1", 0)
        psp.append(net.resize(y, size=sizes[3], mode="linear"))
    lat = [bld.conv_module(feats[i], f"lateral_convs.{i}", 0) for i in range(3)]
    lat.append(bld.conv_module(net.concat(psp), "bottleneck", 1))
    for i in range(3, 0, -1):
        lat[i - 1] = net.add(lat[i - 1], net.resize(lat[i], size=sizes[i - 1], mode="linear"))
    outs = [bld.conv_module(lat[i], f"fpn_convs.{i}", 1) for i in range(3)] + [lat[3]]
    outs = [outs[0]] + [net.resize(o, size=sizes[0], mode="linear") for o in outs[1:]]
    y = bld.conv_module(net.concat(outs), "fpn_bottleneck", 1)
    logits = net.conv(y, "decode_head.conv_seg", pad=0)
    return net.model("sdrt_uniformer", {"image": (1, 3, height, width)}, {logits: "logits"})


# ------------------------------------------------------------------------------------------ around it
def prepare(rgb: np.ndarray) -> np.ndarray:
    """The network's ``(1, 3, H, W)`` float32 input of the rescaled RGB uint8 image as mmseg's ``Normalize`` makes
    it: channels swapped (``to_rgb`` on an RGB image), ``(x - mean) * (1 / std)``."""
    x = rgb[..., ::-1].astype(np.float32)
    x = ((x - MEAN) * (1.0 / STD)).astype(np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], np.float32)


def _composed_taps(src: int, mid: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """The bilinear resize ``src -> mid`` followed by ``mid -> dst`` of one axis as one of taps: ``(dst, k)`` source
    indices and float32 weights (at most four a row; rows with fewer padded with weight 0), the product of the two
    matrices summed row by row from their nonzero weights, never held whole (``dst x mid`` float64 is 512 MiB for a
    32768-wide image)."""
    first, second = _bilinear_rows(src, mid), _bilinear_rows(mid, dst)
    rows = []
    for row in second:
        out: dict[int, float] = {}
        for j, a in row.items():
            for t, b in first[j].items():
                out[t] = out.get(t, 0.0) + a * b
        rows.append(sorted((t, v) for t, v in out.items() if v != 0.0))
    k = max(max((len(r) for r in rows), default=1), 1)
    idx = np.zeros((dst, k), np.intp)
    w = np.zeros((dst, k), np.float32)
    for i, r in enumerate(rows):
        for n, (t, v) in enumerate(r):
            idx[i, n], w[i, n] = t, v
    return idx, w


#: the output pixels :func:`logits_to_labels` resizes at once (x 150 classes x 4 bytes: 39 MiB a temporary)
BAND_PIXELS = 65536


def logits_to_labels(logits: np.ndarray, net_hw: tuple[int, int], out_hw: tuple[int, int],
                     rows: int | None = None) -> np.ndarray:
    """The ``(H, W)`` class map of the decode head's ``(C, h, w)`` logits: resized bilinearly to ``net_hw`` and
    then to ``out_hw`` (``align_corners=False`` both; the two resizes of an axis composed into one, at most four
    taps), argmax over the classes, in bands of ``rows`` output rows (default: :data:`BAND_PIXELS` pixels' worth;
    the full-size logits are never held)."""
    c, h, w = logits.shape
    ih, wh = _composed_taps(h, net_hw[0], out_hw[0])
    iw, ww = _composed_taps(w, net_hw[1], out_hw[1])
    rows = max(1, BAND_PIXELS // max(out_hw[1], 1)) if rows is None else rows
    x = np.ascontiguousarray(logits, np.float32)
    out = np.empty(out_hw, np.int64)
    for r in range(0, out_hw[0], rows):
        band = sum(x[:, ih[r:r + rows, k], :] * wh[r:r + rows, k, None] for k in range(ih.shape[1]))
        band = sum(band[:, :, iw[:, k]] * ww[:, k] for k in range(iw.shape[1]))
        out[r:r + rows] = band.argmax(axis=0)
    return out


class UniformerSeg(AnnotatorNet):
    """``upernet_global_small.pth`` compiled on one backend, one session per rescaled input size."""

    WHAT = "UniFormer's ADE20K segmentation model (UperNet, upernet_global_small.pth)"
    FIX = f"pass lllyasviel's {UNIFORMER_FILE} (lllyasviel/Annotators)"
    ARCH = (config_of, expected_shapes, build_graph)

    def logits(self, rgb: np.ndarray) -> np.ndarray:
        """The decode head's ``(150, h / 4, w / 4)`` logits of an RGB uint8 image (rescaled here as mmseg does)."""
        from .cvresize import resample

        check_size(*rgb.shape[:2])
        nh, nw = net_size(*rgb.shape[:2])
        img = rgb if (nh, nw) == rgb.shape[:2] else resample(rgb, nw, nh, "linear")
        return self.session(nh, nw).run({"image": prepare(img)})["logits"][0]

    def labels(self, rgb: np.ndarray) -> np.ndarray:
        """The ``(H, W)`` ADE20K class of each pixel of an RGB uint8 image."""
        h, w = rgb.shape[:2]
        return logits_to_labels(self.logits(rgb), net_size(h, w), (h, w))

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        """The ``(H, W, 3)`` uint8 segmentation map of an RGB uint8 image, padded with its edges to multiples of 64
        (the extension's processor pads every image so) and cropped back."""
        from .segpalette import paint

        h, w = rgb.shape[:2]
        padded = np.pad(rgb, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")
        return np.ascontiguousarray(paint(self.labels(padded))[:h, :w])


def seg_map(rgb: np.ndarray, detector: UniformerSeg) -> np.ndarray:
    """The ``seg_ufade20k`` map (HxWx3 uint8) of an RGB uint8 image."""
    return detector(rgb)
