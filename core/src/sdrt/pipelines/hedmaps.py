"""HED soft edges: sd-webui-controlnet's ``softedge_hed``, ``softedge_hedsafe`` and ``scribble_hed``.

lllyasviel's ``ControlNetHED.pth`` (``ControlNetHED_Apache2``: five VGG-like blocks of 3x3 convolutions with
ReLUs, 2x2 max pools between them, each block's output projected to one channel by a 1x1 convolution; the input
RGB in 0..255 minus a learned ``norm``) is read with sdrt's safe torch-file reader and built as an ONNX graph
(:mod:`sdrt.pipelines.netgraph`), which runs on any backend. Around it, numpy follows the extension's
``annotator/hed`` and ``scripts/processor.py`` step for step:

- the image as ``resize_image_with_pad`` hands it over (shorter side to the resolution, edges repeated to
  multiples of 64: the caller, :func:`sdrt.pipelines.preprocessors.preprocess`), RGB as float32;
- the five projections (full, 1/2, ... 1/16 size) each resized to the image with OpenCV's float ``INTER_LINEAR``
  (:func:`linear_float`), their mean (float32) through a sigmoid in float64;
- ``softedge_hedsafe``: the extension's ``safe_step`` (``int(x * 3) / 2`` in float32: 0, 0.5, 1, 1.5);
- ``(edge * 255).clip(0, 255)`` truncated to uint8; cropped back to the unpadded size;
- ``scribble_hed``: that map (cropped) through :func:`scribble`: the extension's ``nms(x, 127, 3.0)`` (a float
  Gaussian of sigma 3, values kept where they are the largest along one of four lines, 255 above 127), an 8-bit
  Gaussian of sigma 3, 255 where above 4, else 0.

The same post-processing serves :mod:`sdrt.pipelines.pidimaps` (PiDiNet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet, Net

__all__ = ["HED", "HED_FILE", "detect", "edge_to_uint8", "expected_shapes", "linear_float", "pad64", "safe_step", "scribble"]

HED_FILE = "ControlNetHED.pth"
#: (in, out, convs) of the five blocks
BLOCKS = ((3, 64, 2), (64, 128, 2), (128, 256, 3), (256, 512, 3), (512, 512, 3))


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """The tensors of ``ControlNetHED.pth`` and their shapes."""
    out: dict[str, tuple[int, ...]] = {"norm": (1, 3, 1, 1)}
    for b, (cin, cout, n) in enumerate(BLOCKS, 1):
        for i in range(n):
            out[f"block{b}.convs.{i}.weight"] = (cout, cin if i == 0 else cout, 3, 3)
            out[f"block{b}.convs.{i}.bias"] = (cout,)
        out[f"block{b}.projection.weight"] = (1, cout, 1, 1)
        out[f"block{b}.projection.bias"] = (1,)
    return out


class HED(AnnotatorNet):
    """``ControlNetHED.pth`` compiled on one backend per input size; ``edge(rgb)`` is the soft edge map."""

    WHAT = "lllyasviel's ControlNetHED (ControlNetHED_Apache2)"
    FIX = f"download {HED_FILE} (lllyasviel/Annotators; the extension's annotator/downloads/hed) and pass it"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return expected_shapes()

    def build(self, height: int, width: int) -> Any:
        """``image`` (1, 3, height, width) RGB in 0..255 -> ``p1`` .. ``p5``, the five projections."""
        net = Net(self.arrays())
        h = net.node("Sub", ["image", net.weight("norm")])
        outs = {}
        for b, (_, _, n) in enumerate(BLOCKS, 1):
            if b > 1:
                h = net.max_pool(h, 2)
            for i in range(n):
                h = net.relu(net.conv(h, f"block{b}.convs.{i}", pad=1))
            outs[net.conv(h, f"block{b}.projection", pad=0)] = f"p{b}"
        return net.model("sdrt_hed", {"image": (1, 3, height, width)}, outs)

    def edge(self, rgb: np.ndarray) -> np.ndarray:
        """The soft edge (float64 in 0..1, the sigmoid of the projections' mean) of an RGB uint8 image whose sides
        are multiples of 16 (the extension's are of 64)."""
        h, w = rgb.shape[:2]
        x = np.ascontiguousarray(rgb.astype(np.float32).transpose(2, 0, 1)[None])
        out = self.session(h, w).run({"image": x})
        edges = [linear_float(np.asarray(out[f"p{b}"], np.float32)[0, 0], w, h) for b in range(1, 6)]
        mean = np.mean(np.stack(edges, axis=2), axis=2)
        return 1 / (1 + np.exp(-mean.astype(np.float64)))

    def map(self, rgb: np.ndarray, safe: bool = False) -> np.ndarray:
        """The extension's ``apply_hed``: the ``(H, W)`` uint8 soft-edge map (``safe``: ``softedge_hedsafe``)."""
        return edge_to_uint8(self.edge(rgb), safe)


# ------------------------------------------------------------------------------------------ numpy around the net
def detect(rgb: np.ndarray, net: Any, kind: str = "soft", size: tuple[int, int] | None = None) -> np.ndarray:
    """The extension's map of an RGB uint8 image by ``net`` (:class:`HED` or :class:`sdrt.pipelines.pidimaps.PiDiNet`):
    ``kind`` "soft", "safe" or "scribble"; ``size``: the unpadded ``(h, w)`` of an image the caller padded to 64
    (None: the image is padded here, and cropped back). The network reads the padded image; the map is cropped
    before the scribble post-processing, as the extension crops (``remove_pad``) before it; ``(h, w, 3)`` uint8."""
    if size is None:
        rgb, size = pad64(rgb)
    else:
        rgb = pad64(rgb)[0]
    if kind == "sketch":  # t2ia_sketch_pidi: the extension's apply_pidinet(apply_fliter=True), the edge above 0.5
        m = np.ascontiguousarray(np.where(net.edge(rgb) > 0.5, 255, 0).astype(np.uint8)[:size[0], :size[1]])
    else:
        m = np.ascontiguousarray(net.map(rgb, safe=kind == "safe")[:size[0], :size[1]])
    if kind == "scribble":
        m = scribble(m)
    return np.repeat(m[:, :, None], 3, axis=2)


def pad64(rgb: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """``(image with its bottom and right edges repeated to multiples of 64, (h, w))``: the networks see what
    ``resize_image_with_pad`` gives (a no-op where the caller padded already, as at a processor resolution)."""
    h, w = rgb.shape[:2]
    return np.pad(rgb, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge"), (h, w)


def safe_step(x: np.ndarray, step: int = 2) -> np.ndarray:
    """The extension's ``safe_step``: ``int(x * (step + 1)) / step`` in float32."""
    y = x.astype(np.float32) * np.float32(step + 1)
    return y.astype(np.int32).astype(np.float32) / np.float32(step)


def edge_to_uint8(edge: np.ndarray, safe: bool) -> np.ndarray:
    """``(edge * 255).clip(0, 255)`` truncated to uint8, after ``safe_step`` for the safe variants (dtypes kept:
    float64 stays float64, float32 float32)."""
    if safe:
        edge = safe_step(edge)
    return (edge * edge.dtype.type(255.0)).clip(0, 255).astype(np.uint8)


def _linear_taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's INTER_LINEAR taps for float images: ``(dx + 0.5) * scale - 0.5`` in doubles cast to float32, its
    floor the first tap, float32 weights ``1 - f`` and ``f``; clamped at the edges (the whole weight on the edge
    pixel)."""
    f = ((np.arange(dst) + 0.5) * (1.0 / (dst / src)) - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = (f - s.astype(np.float32)).astype(np.float32)
    f = np.where(s < 0, np.float32(0), f)
    s = np.maximum(s, 0)
    last = s >= src - 1
    f = np.where(last, np.float32(0), f).astype(np.float32)
    s = np.where(last, src - 1, s)
    idx = np.stack([s, np.minimum(s + 1, src - 1)], axis=1)
    return idx, np.stack([np.float32(1) - f, f], axis=1).astype(np.float32)


def linear_float(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(a, (width, height), interpolation=cv2.INTER_LINEAR)`` of a float32 ``(H, W)`` plane: rows
    then columns, two taps each, float32 products and sums (OpenCV's vector code may fuse a multiply-add: ~1e-7
    apart)."""
    a = np.asarray(a, np.float32)
    h, w = a.shape
    if (h, w) == (height, width):
        return a.copy()
    ix, wx = _linear_taps(w, width)
    iy, wy = _linear_taps(h, height)
    rows = a[:, ix[:, 0]] * wx[:, 0] + a[:, ix[:, 1]] * wx[:, 1]
    return (rows[iy[:, 0]] * wy[:, 0][:, None] + rows[iy[:, 1]] * wy[:, 1][:, None]).astype(np.float32)


def scribble(gray: np.ndarray) -> np.ndarray:
    """The extension's scribble post-processing of a ``(H, W)`` uint8 soft-edge map: ``nms(x, 127, 3.0)``, an
    8-bit Gaussian of sigma 3, 255 above 4 and 0 elsewhere."""
    from .edgethin import nake_nms
    from .gaussian import gaussian_blur

    blurred = gaussian_blur(gray.astype(np.float32), 3.0)
    thin = np.zeros(gray.shape, np.uint8)
    thin[nake_nms(blurred) > 127] = 255
    out = gaussian_blur(thin, 3.0)
    out[out > 4] = 255
    out[out < 255] = 0
    return out
