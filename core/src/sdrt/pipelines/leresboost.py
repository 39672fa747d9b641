"""LeReS with the boost merge: sd-webui-controlnet's ``depth_leres++``, ``res101.pth`` and ``latest_net_G.pth`` run
through sdrt.

The extension's ``depth_leres++`` runs LeReS (:mod:`sdrt.pipelines.leresdepth`) inside BoostingMonocularDepth's
merge (its ``annotator/leres/leres/depthmap.py``, ``estimateboost``): LeReS at two resolutions, merged by a pix2pix
generator (``latest_net_G.pth``: a U-Net of 10 down- and up-samplings, no normalisation, input 2 x 1024 x 1024), then,
when the image is large enough, on patches chosen by the image's gradients, each merged into the whole. The
generator is rebuilt as an ONNX graph in memory (:class:`Pix2PixMerge`); the rest is numpy that follows
``estimateboost`` step for step:

- R_x (``calculateprocessingres``): the image's grey gradients (OpenCV's 3x3 Sobel in float64), resized to a square of
  its shorter side (INTER_LINEAR: the code passes INTER_AREA where OpenCV reads the output array), thresholded at
  40 % of their range; for sizes 14, 21, ... (x 32 pixels) below ``min(1600, 3 * longer side) / 32`` the edges are
  max-pooled to that size, resized (INTER_LINEAR again), dilated by a 14 x 14 square, and the search stops where more
  than 20 % of the map has no edge within reach; the patch scale is the mean of the last one dilated by 3 x 3;
- the double estimate: LeReS at 448 x 448 and at R_x x R_x (the image resized bilinearly, as uint8), each prediction
  resized back to the image's size and to 1024 x 1024 (bicubic, float32), both min-max scaled to -1..1 and fed to the
  generator (448's first), its output ``(y + 1) / 2`` min-max scaled;
- when the image's longer side is below R_x, that estimate resized to the image (bicubic) is the depth; otherwise the
  image is resized (bicubic) to twice R_x over ``factor = clip(4 * patch scale * R_x / 1600, 0.2, 1)``, a grid of
  896-pixel patches (stride 336) with more gradient than the whole is grown while it stays so, and, biggest first,
  each patch's double estimate (448 and 896) is merged by the generator with the same region of the base estimate,
  fitted to it by a straight line (``np.polyfit``), and blended in through a Gaussian-edged mask;
- the result, resized (bicubic) to the image, goes through ``depth_leres``' 16-bit scaling, thresholds and inversion.

The extension fails (an unbound variable) on an image whose longer side is under 160 pixels, where the resolution
search has no size to try; sdrt refuses it in one line. OpenCV's float resizes, Sobel, dilation and Gaussian mask are
written in numpy (float64 sums where OpenCV sums in float32, so results agree to ~1e-6, not bit for bit); its uint8
bicubic resizes are :mod:`sdrt.pipelines.cvresize`'s.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from .netgraph import AnnotatorNet, Net

__all__ = ["MERGE_SIZE", "PIX2PIX_FILE", "Pix2PixMerge", "boost_depth", "build_generator", "generator_shapes",
           "processing_res"]

PIX2PIX_FILE = "latest_net_G.pth"
#: LeReS's receptive field (the double estimate's low size), the patches' high size, the merge network's size
RECEPTIVE = 448
PATCH_SIZE = 2 * RECEPTIVE
MERGE_SIZE = 1024
#: R_max: the largest R_x (the extension's default; its ``depthmap_script_boost_rmax`` option is the depthmap
#: script's, not its own)
WHOLE_MAX = 1600
#: the generator's down-samplings (unet_1024)
DOWNS = 10
#: the smallest longer side the resolution search runs on (``int(3 * side / 32) > 14``)
MIN_SIDE = 160


# ------------------------------------------------------------------------------------------ the merge network
def _prefixes(downs: int = DOWNS) -> list[str]:
    """The generator's blocks' name prefixes, outermost first: ``model.model.``, then ``1.model.``, then ``3.model.``
    for each block further in."""
    out = ["model.model.", "model.model.1.model."]
    while len(out) < downs:
        out.append(out[-1] + "3.model.")
    return out


def _widths(ngf: int, downs: int = DOWNS) -> list[tuple[int, int]]:
    """Each block's (outer, inner) channels, outermost first (input 2, output 1)."""
    mids = [(ngf, 2 * ngf), (2 * ngf, 4 * ngf), (4 * ngf, 8 * ngf)] + [(8 * ngf, 8 * ngf)] * (downs - 4)
    return [(1, ngf), *mids]


def generator_shapes(ngf: int = 64) -> dict[str, tuple[int, ...]]:
    """The tensors of pix2pix's ``UnetGenerator(2, 1, 10, ngf)`` with no normalisation (convolutions without bias but
    the last), by name."""
    out: dict[str, tuple[int, ...]] = {}
    for level, (p, (outer, inner)) in enumerate(zip(_prefixes(), _widths(ngf))):
        if level == 0:
            out[p + "0.weight"] = (inner, 2, 4, 4)
            out[p + "3.weight"] = (2 * inner, outer, 4, 4)
            out[p + "3.bias"] = (outer,)
        elif level == DOWNS - 1:
            out[p + "1.weight"] = (inner, outer, 4, 4)
            out[p + "3.weight"] = (inner, outer, 4, 4)
        else:
            out[p + "1.weight"] = (inner, outer, 4, 4)
            out[p + "5.weight"] = (2 * inner, outer, 4, 4)
    return out


def build_generator(arrays: Mapping[str, np.ndarray], size: int = MERGE_SIZE) -> Any:
    """The ``onnx.ModelProto`` of the generator for one ``(1, 2, size, size)`` input ``pair`` -> ``fake``
    ``(1, 1, size, size)``. Each inner block's LeakyReLU(0.2) is in place on its input, so its skip connection
    carries the activated input, as in the extension's torch."""
    net = Net(arrays)
    prefixes = _prefixes()

    def block(x: str, level: int) -> str:
        p = prefixes[level]
        if level == 0:
            y = block(net.conv(x, p + "0", stride=2, pad=1), 1)
            return net.node("Tanh", [net.conv_transpose(net.relu(y), p + "3", stride=2, pad=1)])
        low = net.node("LeakyRelu", [x], alpha=0.2)
        y = net.conv(low, p + "1", stride=2, pad=1)
        if level < DOWNS - 1:
            y = block(y, level + 1)
        up = net.conv_transpose(net.relu(y), p + ("3" if level == DOWNS - 1 else "5"), stride=2, pad=1)
        return net.concat([low, up])

    return net.model("sdrt_leres_pix2pix", {"pair": (1, 2, size, size)}, {block("pair", 0): "fake"})


class Pix2PixMerge(AnnotatorNet):
    """``latest_net_G.pth`` compiled on one backend; ``merge(outer, inner)`` -> the generator's raw output."""

    WHAT = "BoostingMonocularDepth's merge network (pix2pix, latest_net_G.pth)"
    FIX = f"pass the boost's {PIX2PIX_FILE} (lllyasviel/Annotators)"

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        first = shapes.get("model.model.0.weight")
        self.ngf = int(first[0]) if first is not None and len(first) == 4 and int(first[0]) > 0 else 64
        return generator_shapes(self.ngf)

    def build(self, size: int) -> Any:
        return build_generator(self.arrays(), size)

    def merge(self, outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
        """``Pix2Pix4DepthModel.set_input(outer, inner)`` and ``test()``: each estimate (``MERGE_SIZE`` square,
        float32) min-max scaled to -1..1, ``outer`` first; the generator's ``fake_B`` (HxW float32)."""
        planes = []
        for e in (outer, inner):
            e = np.asarray(e, np.float32)
            with np.errstate(invalid="ignore", divide="ignore"):
                e = (e - e.min()) / (e.max() - e.min())
            planes.append(e * np.float32(2) - np.float32(1))
        pair = np.ascontiguousarray(np.stack(planes)[None], np.float32)
        size = pair.shape[-1]
        return np.asarray(self.session(size).run({"pair": pair})["fake"][0, 0], np.float32)


# ------------------------------------------------------------------------------------------ OpenCV's float steps
def _axis_taps(src: int, dst: int, kind: str, exact32: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's resize taps on one side for float images: the position ``(d + 0.5) * scale - 0.5`` and its floor;
    linear: two taps (clamped to the edge, where the weight goes whole to it); cubic: Keys' four (a = -0.75),
    indices replicated at the edges. OpenCV 5.0 keeps the positions in doubles for float images (within 5e-7 of
    its float32 output, measured; its float64 cubic exactly) except a float64 cubic, whose weights it computes from
    a float32 position (``exact32``: bit for bit then)."""
    f = (np.arange(dst) + 0.5) * (1.0 / (dst / src)) - 0.5
    if exact32:
        f = f.astype(np.float32)
    s = np.floor(f).astype(np.int64)
    x = f - s
    if kind == "linear":
        x = np.where(s < 0, 0.0, x)
        s = np.where(s < 0, 0, s)
        last = s >= src - 1
        x = np.where(last, 0.0, x)
        s = np.where(last, src - 1, s)
        return np.stack([s, np.minimum(s + 1, src - 1)], 1), np.stack([1 - x, x], 1).astype(np.float64)
    dt = np.float32 if exact32 else np.float64
    x = np.asarray(x, dt)
    a, one = dt(-0.75), dt(1)
    x1, y = x + one, one - x
    c0 = ((a * x1 - dt(5) * a) * x1 + dt(8) * a) * x1 - dt(4) * a
    c1 = ((a + dt(2)) * x - (a + dt(3))) * x * x + one
    c2 = ((a + dt(2)) * y - (a + dt(3))) * y * y + one
    c3 = one - c0 - c1 - c2
    idx = np.clip(s[:, None] + np.arange(-1, 3)[None, :], 0, src - 1)
    return idx, np.stack([c0, c1, c2, c3], 1).astype(np.float64)


def resize_float(a: np.ndarray, width: int, height: int, kind: str = "cubic") -> np.ndarray:
    """``cv2.resize(a, (width, height), interpolation=INTER_LINEAR / INTER_CUBIC)`` of a float32 or float64 plane
    (rows first, then columns; summed in float64, returned in ``a``'s type). The same size is a copy, as in OpenCV."""
    a = np.asarray(a)
    h, w = a.shape[:2]
    if (h, w) == (height, width):
        return a.copy()
    out = a.astype(np.float64)
    for axis, (src, dst) in ((1, (w, width)), (0, (h, height))):
        idx, wt = _axis_taps(src, dst, kind, exact32=kind == "cubic" and a.dtype == np.float64)
        acc = None
        for t in range(idx.shape[1]):
            shape = [1] * out.ndim
            shape[axis] = -1
            term = np.take(out, idx[:, t], axis=axis) * wt[:, t].reshape(shape)
            acc = term if acc is None else acc + term
        out = acc
    return out.astype(a.dtype)


def _sobel_sum(gray: np.ndarray) -> np.ndarray:
    """``|Sobel_y| + |Sobel_x|`` (3x3, float64, reflect-101 edges) of a grey float64 image."""
    g = np.asarray(gray, np.float64)
    if min(g.shape) > 1:
        p = np.pad(g, 1, mode="reflect")
    else:
        p = np.pad(g, 1, mode="edge")
    dx = p[:, 2:] - p[:, :-2]
    dx = (dx[:-2] + dx[2:]) + dx[1:-1] * 2.0
    sy = (p[:, :-2] + p[:, 2:]) + p[:, 1:-1] * 2.0
    dy = sy[2:] - sy[:-2]
    return np.abs(dy) + np.abs(dx)


def _gray(rgb: np.ndarray) -> np.ndarray:
    """BoostingMonocularDepth's ``rgb2gray``: ``rgb . [0.2989, 0.5870, 0.1140]`` in float64."""
    return np.dot(rgb[..., :3], [0.2989, 0.5870, 0.1140])


def _dilate(a: np.ndarray, k: int) -> np.ndarray:
    """``cv2.dilate`` by a ``k`` x ``k`` square (anchor at its centre, ``k // 2``), the border ignored."""
    before, after = k // 2, k - 1 - k // 2
    p = np.pad(np.asarray(a, np.float64), ((before, after), (before, after)), constant_values=-np.inf)
    from numpy.lib.stride_tricks import sliding_window_view

    p = sliding_window_view(p, k, axis=0).max(-1)
    return sliding_window_view(p, k, axis=1).max(-1)


def _pool_max(a: np.ndarray, size: int) -> np.ndarray:
    """``resizewithpool``: skimage's ``block_reduce(a, (n, n), np.max)`` with ``n = floor(side / size)`` (padded with
    zeros at the end to whole blocks)."""
    n = int(np.floor(a.shape[0] / size))
    h, w = -(-a.shape[0] // n) * n, -(-a.shape[1] // n) * n
    p = np.zeros((h, w), a.dtype)
    p[: a.shape[0], : a.shape[1]] = a
    return p.reshape(h // n, n, w // n, n).max(axis=(1, 3))


def processing_res(rgb: np.ndarray, base: int = RECEPTIVE, confidence: float = 0.2, scale_threshold: float = 3,
                   whole_max: int = WHOLE_MAX) -> tuple[int, float]:
    """``calculateprocessingres``: ``(R_x, patch scale)`` of an RGB uint8 image."""
    speed = 32
    dim = int(min(rgb.shape[:2]))
    grad = resize_float(_sobel_sum(_gray(rgb)), dim, dim, "linear")
    lo, hi = grad.min(), grad.max()
    middle = lo + (0.4 * (hi - lo))
    grad = np.where(grad < middle, 0.0, 1.0)
    kernel, kernel2 = int(base / speed), int(base / (4 * speed))
    threshold = min(whole_max, scale_threshold * max(rgb.shape[:2]))
    size = base / speed
    sizes = range(int(base / speed), int(threshold / speed), int(base / (2 * speed)))
    if not len(sizes):
        h, w = rgb.shape[:2]
        raise InputError(f"sdrt.pipelines.leresboost: depth_leres++ needs a control image at least {MIN_SIDE} pixels "
                         f"on its longer side (at the processor resolution where one is given, padded to 64: its "
                         f"resolution search has no size to try below, and the extension fails there); this one is "
                         f"{w}x{h} (padded)", where="sdrt.pipelines.preprocessors.processor_res",
                         fix="pass a larger image or processor resolution, or use depth_leres")
    pooled = grad
    for p_size in sizes:
        pooled = resize_float(_pool_max(grad, p_size), p_size, p_size, "linear")
        pooled = np.where(pooled >= 0.5, 1.0, 0.0)
        if (1 - _dilate(pooled, kernel)).mean() > confidence:
            break
        size = p_size
    return int(size * speed), float(_dilate(pooled, kernel2).mean())


def gaussian_mask(size: int = 3000) -> np.ndarray:
    """``generatemask((size, size))``: 1 inside a 15 % margin, ``GaussianBlur`` by ``int(size / 16)`` (a kernel of
    ``2 * ceil(2 * sigma) + 1`` taps, reflect-101 edges: separable, so the outer product of one blurred profile),
    min-max scaled, float32."""
    from .gaussian import reflect101

    sigma = int(size / 16)
    k = int(2 * np.ceil(2 * int(size / 16)) + 1)
    x = np.arange(k, dtype=np.float64) - (k - 1) / 2
    kern = np.exp(-(x * x) / (2 * sigma * sigma))
    kern = (kern / kern.sum()).astype(np.float32).astype(np.float64)
    line = np.zeros(size, np.float64)
    m = int(0.15 * size)
    line[m: size - m] = 1
    padded = line[reflect101(size, k // 2, k // 2)]
    profile = np.convolve(padded, kern[::-1], mode="valid").astype(np.float32)
    mask = np.outer(profile, profile).astype(np.float32)
    return ((mask - mask.min()) / (mask.max() - mask.min())).astype(np.float32)


# ------------------------------------------------------------------------------------------ the merge
def _single(rgb: np.ndarray, size: int, leres: Any) -> np.ndarray:
    """``estimateleres(img, model, size, size)``: LeReS at ``size`` square (the image resized bilinearly), its
    prediction resized back to the image's size (bicubic, float32)."""
    from .cvresize import resample

    pred = leres.depth(resample(np.ascontiguousarray(rgb), size, size, "linear"))
    return resize_float(pred, rgb.shape[1], rgb.shape[0], "cubic")


def _double(rgb: np.ndarray, size1: int, size2: int, leres: Any, merge: Pix2PixMerge) -> np.ndarray:
    """``doubleestimate``: the low and high estimates at the merge size, merged, ``(y + 1) / 2`` min-max scaled."""
    low = resize_float(_single(rgb, size1, leres), MERGE_SIZE, MERGE_SIZE, "cubic")
    high = resize_float(_single(rgb, size2, leres), MERGE_SIZE, MERGE_SIZE, "cubic")
    y = (merge.merge(low, high) + np.float32(1)) / np.float32(2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return ((y - y.min()) / (y.max() - y.min())).astype(np.float32)


def _grid(height: int, width: int, half: int, stride: int) -> list[list[int]]:
    """``applyGridpatch``: ``[x, y, w, h]`` of the square patches of side ``2 * half`` whose centres step by
    ``stride`` from ``half`` while a whole patch and a margin of ``half`` fit, columns outermost."""
    return [[k - half, j - half, 2 * half, 2 * half] for k in range(half, width - half, stride)
            for j in range(half, height - half, stride)]


def _integral(a: np.ndarray) -> np.ndarray:
    """``cv2.integral`` of a float64 image: (h + 1, w + 1), each row's running sum added to the row above's."""
    out = np.zeros((a.shape[0] + 1, a.shape[1] + 1), np.float64)
    out[1:, 1:] = np.cumsum(np.cumsum(a, axis=1), axis=0)
    return out


def _density(integral: np.ndarray, rect: Sequence[int]) -> float:
    x, y, w, h = rect
    return float(integral[y + h, x + w] - integral[y, x + w] - integral[y + h, x] + integral[y, x]) / (w * h)


def patches(rgb: np.ndarray, factor: float, base: int = PATCH_SIZE) -> list[list[int]]:
    """``generatepatchs`` and ``adaptiveselection``: the patches (``[x, y, w, h]``) of the resized image whose
    gradient density is at least the whole image's, each grown by ``int(32 / factor)`` while it stays so and inside
    the image, biggest first (a stable sort, as Python's)."""
    grad = _sobel_sum(_gray(rgb))
    with np.errstate(invalid="ignore"):  # a flat image: no gradient, its mean NaN, nothing zeroed (as numpy does)
        threshold = grad[grad > 0].mean() if (grad > 0).any() else np.nan
        grad[grad < threshold] = 0
    gf = grad.sum() / grad.size
    integral = _integral(grad)
    height, width = integral.shape
    half = int(round(base / 2))
    step = int(32 / factor)
    chosen = []
    for rect in _grid(rgb.shape[0], rgb.shape[1], half, int(round(half * 0.75))):
        if _density(integral, rect) < gf:
            continue
        test = list(rect)
        while True:
            test[0] -= int(step / 2)
            test[1] -= int(step / 2)
            test[2] += step
            test[3] += step
            if test[0] < 0 or test[1] < 0 or test[1] + test[3] >= height or test[0] + test[2] >= width:
                break
            if _density(integral, test) < gf:
                break
            rect = list(test)
        chosen.append(rect)
    return sorted(chosen, key=lambda r: r[2], reverse=True)


def boost_depth(rgb: np.ndarray, leres: Any, merge: Pix2PixMerge, max_res: int | None = None) -> np.ndarray:
    """``estimateboost(img, model, 0, pix2pixmodel, max_res)`` of an RGB uint8 image (``max_res``: its longer side,
    as the extension passes it): the merged depth (HxW float32), LeReS's orientation (far is large)."""
    from .cvresize import resample

    h, w = rgb.shape[:2]
    max_res = max(h, w) if max_res is None else max_res
    whole_size, patch_scale = processing_res(rgb)
    whole = _double(rgb, RECEPTIVE, whole_size, leres, merge)
    factor = max(min(1, 4 * patch_scale * whole_size / WHOLE_MAX), 0.2)
    if max_res < whole_size:
        return resize_float(whole, w, h, "cubic")
    if h > w:
        a, b = 2 * whole_size, round(2 * whole_size * w / h)
    else:
        a, b = round(2 * whole_size * h / w), 2 * whole_size
    b, a = int(round(b / factor)), int(round(a / factor))
    big = resample(rgb, b, a, "cubic")
    chosen = patches(big, factor)
    scale = h / big.shape[0]
    out_w, out_h = round(big.shape[1] * scale), round(big.shape[0] * scale)
    small = resample(big, out_w, out_h, "cubic")
    base = resize_float(whole, out_w, out_h, "cubic")
    updated = base.copy()
    mask_org = gaussian_mask()
    mask = mask_org
    for rect in chosen:
        x, y, pw, ph = (int(v) for v in np.round(np.array(rect) * scale).astype(int))
        patch_rgb = small[y: y + ph, x: x + pw]
        patch_base = base[y: y + ph, x: x + pw]
        size = patch_base.shape
        estimate = resize_float(_double(patch_rgb, RECEPTIVE, PATCH_SIZE, leres, merge), MERGE_SIZE, MERGE_SIZE)
        patch_base = resize_float(patch_base, MERGE_SIZE, MERGE_SIZE, "cubic")
        mapped = (merge.merge(patch_base, estimate) + np.float32(1)) / np.float32(2)
        with warnings.catch_warnings():  # a flat merge output: numpy warns, the fit is the extension's all the same
            warnings.simplefilter("ignore", getattr(np, "exceptions", np).RankWarning)
            coef = np.polyfit(mapped.reshape(-1), patch_base.reshape(-1), deg=1)
        merged = np.polyval(coef, mapped.reshape(-1)).reshape(mapped.shape)
        merged = resize_float(merged, size[1], size[0], "cubic")
        if mask.shape != size:
            mask = resize_float(mask_org, size[1], size[0], "linear")
        region = updated[y: y + ph, x: x + pw]
        updated[y: y + ph, x: x + pw] = region * (1 - mask) + merged * mask
    return resize_float(updated, w, h, "cubic")


class LeresBoost:
    """``depth_leres++``: LeReS (:class:`sdrt.pipelines.leresdepth.LeresDepth`) and the merge network
    (:class:`Pix2PixMerge`); ``__call__(rgb, near, background)`` -> the extension's map."""

    def __init__(self, leres: Any, merge: Pix2PixMerge) -> None:
        self.leres, self.merge = leres, merge

    def depth(self, rgb: np.ndarray) -> np.ndarray:
        """The merged depth (HxW float32) of an RGB uint8 image as the extension's ``apply_leres`` reads it."""
        return boost_depth(rgb, self.leres, self.merge, max(rgb.shape[:2]))

    def __call__(self, rgb: np.ndarray, near: float = 0.0, background: float = 0.0) -> np.ndarray:
        """The ``depth_leres++`` map (HxW uint8): padded with its edges to multiples of 64 (the extension's processor
        pads every image so), merged, scaled as ``depth_leres``' map, cropped back."""
        from .leresdepth import depth_map

        h, w = rgb.shape[:2]
        padded = np.pad(rgb, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")
        return np.ascontiguousarray(depth_map(self.depth(padded), near, background)[:h, :w])
