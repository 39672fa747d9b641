"""OpenPose (body): sd-webui-controlnet's ``openpose`` module, lllyasviel's ``body_pose_model.pth`` run through sdrt.

The file (CMU's body network as PyTorch weights: a VGG-like trunk, 6 stages of PAF (38) and heatmap (19)
branches) is read with sdrt's safe torch-file reader and built as an ONNX graph in memory, which runs on any
backend (``sdrt.load``). Around it, numpy follows the extension's ``annotator/openpose/body.py`` step for step:

- one scale, ``368 * 0.5 / height``: the image (BGR, as the extension turns it) resized with its ``smart_resize_k``
  (OpenCV's INTER_AREA when it shrinks, INTER_LANCZOS4 when it grows), padded right and down to multiples of 8
  with 128, read as ``x / 256 - 0.5``;
- the network's last stage: the heatmaps go through a ReLU (the extension's layer list names ``Mconv7_stage6_L1``
  twice and leaves ``Mconv7_stage6_L2`` with its ReLU), the PAFs do not;
- both maps resized per channel x8 (Lanczos-4 in float32), cropped to the unpadded size, resized to the image
  (Lanczos-4, or INTER_AREA when smaller);
- each of 18 heatmaps smoothed as ``scipy.ndimage.gaussian_filter(sigma=3)`` (25 taps, 'reflect' edges, its
  symmetric summation order), peaks where a pixel is >= its 4 neighbours and above 0.1;
- each of the 19 limbs scored on its PAF at 10 points (``linspace``, rounded half to even) with the distance
  prior, kept when 8 or more points are above 0.05 and the score is above 0, greedily matched;
- people assembled (merging disjoint ones), dropped with fewer than 4 parts or a mean score under 0.4.

The people come back as :class:`sdrt.pipelines.posemaps.Person` with keypoints as fractions of the image (the
extension's ``detect_poses``), drawn by :func:`sdrt.pipelines.posemaps.draw`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .netgraph import AnnotatorNet

__all__ = ["BODY_FILE", "OpenPoseBody", "build_graph", "estimate", "find_file", "gaussian3", "lanczos4"]

BODY_FILE = "body_pose_model.pth"
BOXSIZE, STRIDE, PAD_VALUE = 368, 8, 128
THRE1, THRE2 = 0.1, 0.05
LIMBS = [(2, 3), (2, 6), (3, 4), (4, 5), (6, 7), (7, 8), (2, 9), (9, 10), (10, 11), (2, 12), (12, 13), (13, 14),
         (2, 1), (1, 15), (15, 17), (1, 16), (16, 18), (3, 17), (6, 18)]
PAF_CHANNELS = [(12, 13), (20, 21), (14, 15), (16, 17), (22, 23), (24, 25), (0, 1), (2, 3), (4, 5), (6, 7), (8, 9),
                (10, 11), (28, 29), (30, 31), (34, 35), (32, 33), (36, 37), (18, 19), (26, 27)]


# ------------------------------------------------------------------------------------------ files
def find_file(where: str | Path | Sequence[str | Path], *, what: str = "pose_models") -> Path:
    """``body_pose_model.pth``: ``where`` is the file, a folder holding it, or a folder with one of the
    extension's / ComfyUI's layouts under it; an ``InputError`` naming the places looked in otherwise."""
    from .annotators import find

    return find("openpose", where, what)[0]


# ------------------------------------------------------------------------------------------ the network
def _layers() -> list[tuple[str, int, int, int]]:
    """(name, in, out, kernel) of every conv in order; "pool" entries are 2x2 max pools."""
    trunk = [("conv1_1", 3, 64, 3), ("conv1_2", 64, 64, 3), ("pool", 0, 0, 0), ("conv2_1", 64, 128, 3),
             ("conv2_2", 128, 128, 3), ("pool", 0, 0, 0), ("conv3_1", 128, 256, 3), ("conv3_2", 256, 256, 3),
             ("conv3_3", 256, 256, 3), ("conv3_4", 256, 256, 3), ("pool", 0, 0, 0), ("conv4_1", 256, 512, 3),
             ("conv4_2", 512, 512, 3), ("conv4_3_CPM", 512, 256, 3), ("conv4_4_CPM", 256, 128, 3)]
    return trunk


def _branch(stage: int, limb: int) -> list[tuple[str, int, int, int]]:
    out = 38 if limb == 1 else 19
    if stage == 1:
        return [(f"conv5_1_CPM_L{limb}", 128, 128, 3), (f"conv5_2_CPM_L{limb}", 128, 128, 3),
                (f"conv5_3_CPM_L{limb}", 128, 128, 3), (f"conv5_4_CPM_L{limb}", 128, 512, 1),
                (f"conv5_5_CPM_L{limb}", 512, out, 1)]
    return ([(f"Mconv1_stage{stage}_L{limb}", 185, 128, 7)]
            + [(f"Mconv{i}_stage{stage}_L{limb}", 128, 128, 7) for i in range(2, 6)]
            + [(f"Mconv6_stage{stage}_L{limb}", 128, 128, 1), (f"Mconv7_stage{stage}_L{limb}", 128, out, 1)])


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """The tensors of ``body_pose_model.pth`` and their shapes."""
    convs = [c for c in _layers() if c[0] != "pool"]
    convs += [c for s in range(1, 7) for limb in (1, 2) for c in _branch(s, limb)]
    out: dict[str, tuple[int, ...]] = {}
    for name, cin, cout, k in convs:
        out[f"{name}.weight"] = (cout, cin, k, k)
        out[f"{name}.bias"] = (cout,)
    return out


def _bare(name: str) -> str:
    """A file's tensor by its bare name (a ``model0.``-style or ``module.`` prefix is allowed)."""
    return ".".join(name.split(".")[-2:])


def build_graph(arrays: Mapping[str, np.ndarray], height: int, width: int) -> Any:
    """The ``onnx.ModelProto`` of the body network for one ``(1, 3, height, width)`` input ``image`` ->
    ``pafs`` (1, 38, h/8, w/8) and ``heatmaps`` (1, 19, h/8, w/8), ``arrays`` by the bare tensor names."""
    from .netgraph import Net

    net = Net(arrays)

    def conv(x: str, name: str, relu: bool) -> str:
        y = net.conv(x, name)
        return net.relu(y) if relu else y

    t = "image"
    for name, *_ in _layers():
        t = net.max_pool(t, 2) if name == "pool" else conv(t, name, True)
    trunk = x = t
    outs: list[str] = []
    for stage in range(1, 7):
        outs = []
        for limb in (1, 2):
            y = x
            layers = _branch(stage, limb)
            for i, (name, *_) in enumerate(layers):
                # the extension's no-ReLU list misses Mconv7_stage6_L2: the heatmaps come out through a ReLU
                y = conv(y, name, i < len(layers) - 1 or (stage == 6 and limb == 2))
            outs.append(y)
        if stage < 6:
            x = net.concat([outs[0], outs[1], trunk])
    return net.model("sdrt_openpose_body", {"image": (1, 3, height, width)},
                     {outs[0]: "pafs", outs[1]: "heatmaps"})


# ------------------------------------------------------------------------------------------ OpenCV's resizes
_S45 = 0.70710678118654752440084436210485
_CS = [(1, 0), (-_S45, -_S45), (0, 1), (_S45, -_S45), (-1, 0), (_S45, _S45), (0, -1), (-_S45, _S45)]


def _lanczos_coeffs(x: np.float32) -> np.ndarray:
    """OpenCV's ``interpolateLanczos4``: sines in doubles, the 8 weights rounded to float32 and normalised in
    float32."""
    f32 = np.float32
    x3 = f32(x + f32(3))
    y0 = -float(x3) * math.pi * 0.25
    s0, c0 = math.sin(y0), math.cos(y0)
    coeffs = np.zeros(8, np.float32)
    total = f32(0)
    for i in range(8):
        d = f32(x3 - f32(i))
        if abs(d) >= f32(1e-6):
            y = -float(d) * math.pi * 0.25
            coeffs[i] = f32((_CS[i][0] * s0 + _CS[i][1] * c0) / (y * y))
        else:
            coeffs[i] = f32(1e30)
        total = f32(total + coeffs[i])
    return coeffs * (f32(1) / total)


def _lanczos_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    scale = 1.0 / (dst / src)
    idx = np.zeros((dst, 8), np.int64)
    w = np.zeros((dst, 8), np.float32)
    for d in range(dst):
        f = np.float32((d + 0.5) * scale - 0.5)
        s = int(np.floor(f))
        w[d] = _lanczos_coeffs(np.float32(f - np.float32(s)))
        idx[d] = np.clip(np.arange(s - 3, s + 5), 0, src - 1)
    return idx, w


def lanczos4(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(a, (width, height), interpolation=cv2.INTER_LANCZOS4)`` of a float32 ``(C, H, W)`` stack of
    planes (each row, then the columns; sums in float32 in OpenCV's orders, its 4-lane SIMD included) or of a uint8 ``(H, W, C)`` image (11-bit
    weights, integer sums, ``(v + 2**21) >> 22``)."""
    if a.dtype == np.uint8:
        h, w = a.shape[:2]
        if (h, w) == (height, width):
            return a.copy()
        ix, wx = _lanczos_axis(w, width)
        iy, wy = _lanczos_axis(h, height)
        wx = np.rint(wx * np.float32(2048)).astype(np.int64)
        wy = np.rint(wy * np.float32(2048)).astype(np.int64)
        x = a.astype(np.int64)
        rows = sum(x[:, ix[:, k]] * wx[:, k][None, :, None] for k in range(8))
        out = sum(rows[iy[:, k]] * wy[:, k][:, None, None] for k in range(8))
        return np.clip((out + (1 << 21)) >> 22, 0, 255).astype(np.uint8)
    a = np.asarray(a, np.float32)
    h, w = a.shape[1:]
    if (h, w) == (height, width):
        return a.copy()
    ix, wx = _lanczos_axis(w, width)
    iy, wy = _lanczos_axis(h, height)
    rows = a[:, :, ix[:, 0]] * wx[:, 0]
    for k in range(1, 8):
        rows = rows + a[:, :, ix[:, k]] * wx[:, k]
    # the columns pass: OpenCV's 4-lane loop sums the taps last to first; the columns past the last multiple of 4
    # go through its scalar loop, first to last
    taps = [(rows[:, iy[:, k], :], wy[:, k][:, None]) for k in range(8)]
    out = taps[0][0] * taps[0][1]
    for s, b in taps[1:]:
        out = out + s * b
    n = width - width % 4
    rev = taps[7][0][:, :, :n] * taps[7][1]
    for s, b in taps[6::-1]:
        rev = rev + s[:, :, :n] * b
    out[:, :, :n] = rev
    return out


def _area_float(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """INTER_AREA shrinking float32 planes ``(C, H, W)``: OpenCV's area table, float32 sums, rows first."""
    from .cvresize import _apply_taps, _taps_area

    out = _apply_taps(np.asarray(a, np.float32), *_taps_area(a.shape[2], width), axis=2)
    return _apply_taps(out, *_taps_area(a.shape[1], height), axis=1).astype(np.float32)


def _smart_resize(a: np.ndarray, width: int, height: int, k: float) -> np.ndarray:
    """The extension's ``smart_resize``: INTER_AREA when ``k`` (target over source, sides summed) is below 1, else
    INTER_LANCZOS4; ``a`` a uint8 HxWx3 image or float32 (C, H, W) planes."""
    if k >= 1:
        return lanczos4(a, width, height)
    if a.dtype == np.uint8:
        from .cvresize import resample

        return resample(a, width, height, "area")
    return _area_float(a, width, height)


# ------------------------------------------------------------------------------------------ scipy's gaussian
def gaussian3(a: np.ndarray) -> np.ndarray:
    """``scipy.ndimage.gaussian_filter(a, sigma=3)`` of float64 planes ``(C, H, W)`` (each plane on its own): 25
    taps, 'reflect' edges, axis 0 then 1, each output ``x[0] * w[0] + sum over j = 12..1 of (x[-j] + x[j]) *
    w[j]`` as scipy sums a symmetric kernel."""
    x = np.arange(-12, 13)
    phi = np.exp(-0.5 / 9.0 * x ** 2)
    phi /= phi.sum()
    w = phi[12:]
    out = np.asarray(a, np.float64)
    for axis in (1, 2):
        n = out.shape[axis]
        pad = [(0, 0)] * 3
        pad[axis] = (12, 12)
        p = np.pad(out, pad, mode="symmetric")

        def sl(off: int, p: np.ndarray = p, n: int = n, axis: int = axis) -> np.ndarray:
            idx = [slice(None)] * 3
            idx[axis] = slice(12 + off, 12 + off + n)
            return p[tuple(idx)]

        acc = sl(0) * w[0]
        for j in range(12, 0, -1):
            acc = acc + (sl(-j) + sl(j)) * w[j]
        out = acc
    return out


# ------------------------------------------------------------------------------------------ the estimation
def prepare(bgr: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """``(1x3xHpxWp float32 input, (h, w) unpadded)``: the image scaled to the box size and padded, as body.py."""
    h0, w0 = bgr.shape[:2]
    scale = 0.5 * BOXSIZE / h0
    ht, wt = h0 * scale, w0 * scale
    return padded_input(_smart_resize(bgr, int(wt), int(ht), float(ht + wt) / float(h0 + w0)))


def padded_input(img: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """``(1x3xHpxWp float32 input, (h, w) unpadded)`` of a scaled BGR uint8 image: padded right and down to
    multiples of the stride with 128, read as ``x / 256 - 0.5`` (body.py's and hand.py's ``padRightDownCorner``)."""
    h, w = img.shape[:2]
    ph = 0 if h % STRIDE == 0 else STRIDE - h % STRIDE
    pw = 0 if w % STRIDE == 0 else STRIDE - w % STRIDE
    padded = np.full((h + ph, w + pw, 3), PAD_VALUE, np.uint8)
    padded[:h, :w] = img
    x = np.ascontiguousarray(padded.transpose(2, 0, 1)[None].astype(np.float32) / np.float32(256) - np.float32(0.5))
    return x, (h, w)


def upsample(maps: np.ndarray, unpadded: tuple[int, int], height: int, width: int) -> np.ndarray:
    """The network's ``(C, h/8, w/8)`` maps back to the image: x8, cropped, resized; ``(H, W, C)`` float64."""
    c, hs, ws = maps.shape
    m = _smart_resize(np.asarray(maps, np.float32), ws * STRIDE, hs * STRIDE, 8.0)
    m = m[:, :unpadded[0], :unpadded[1]]
    k = float(height + width) / float(m.shape[1] + m.shape[2])
    m = _smart_resize(np.ascontiguousarray(m), width, height, k)
    return m.transpose(1, 2, 0).astype(np.float64)


def _peaks(heatmaps: np.ndarray) -> list[list[tuple[int, int, float, int]]]:
    smooth = gaussian3(heatmaps[:, :, :18].transpose(2, 0, 1))
    all_peaks = []
    counter = 0
    for part in range(18):
        g = smooth[part]
        ok = g > THRE1
        ok[1:, :] &= g[1:, :] >= g[:-1, :]
        ok[:-1, :] &= g[:-1, :] >= g[1:, :]
        ok[:, 1:] &= g[:, 1:] >= g[:, :-1]
        ok[:, :-1] &= g[:, :-1] >= g[:, 1:]
        ys, xs = np.nonzero(ok)
        peaks = [(int(x), int(y), float(heatmaps[y, x, part]), counter + i) for i, (x, y) in enumerate(zip(xs, ys))]
        all_peaks.append(peaks)
        counter += len(peaks)
    return all_peaks


def _connections(all_peaks: list, pafs: np.ndarray, height: int) -> tuple[list[np.ndarray | None], list[int]]:
    out: list[np.ndarray | None] = []
    missing: list[int] = []
    for k, ((a, b), (cx, cy)) in enumerate(zip(LIMBS, PAF_CHANNELS)):
        cand_a, cand_b = all_peaks[a - 1], all_peaks[b - 1]
        if not cand_a or not cand_b:
            missing.append(k)
            out.append(None)
            continue
        found = []
        for i, pa in enumerate(cand_a):
            for j, pb in enumerate(cand_b):
                vx, vy = pb[0] - pa[0], pb[1] - pa[1]
                norm = max(0.001, math.sqrt(vx * vx + vy * vy))
                ux, uy = vx / norm, vy / norm
                xs = np.rint(np.linspace(pa[0], pb[0], num=10)).astype(np.int64)
                ys = np.rint(np.linspace(pa[1], pb[1], num=10)).astype(np.int64)
                mid = pafs[ys, xs, cx] * ux + pafs[ys, xs, cy] * uy
                score = sum(mid.tolist()) / len(mid) + min(0.5 * height / norm - 1, 0)
                if np.count_nonzero(mid > THRE2) > 0.8 * len(mid) and score > 0:
                    found.append((i, j, score))
        found.sort(key=lambda c: c[2], reverse=True)
        rows: list[list[float]] = []
        used_a: set[int] = set()
        used_b: set[int] = set()
        for i, j, s in found:
            if i not in used_a and j not in used_b:
                rows.append([cand_a[i][3], cand_b[j][3], s, i, j])
                used_a.add(i)
                used_b.add(j)
                if len(rows) >= min(len(cand_a), len(cand_b)):
                    break
        out.append(np.array(rows, np.float64).reshape(-1, 5))
    return out, missing


def estimate(heatmaps: np.ndarray, pafs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(candidate (n, 4): x, y, score, id; subset (m, 20): 18 candidate ids or -1, total score, part count)``
    from the image-sized ``(H, W, 19)`` heatmaps and ``(H, W, 38)`` PAFs, as body.py assembles people."""
    all_peaks = _peaks(heatmaps)
    conns, missing = _connections(all_peaks, pafs, heatmaps.shape[0])
    candidate = np.array([p for peaks in all_peaks for p in peaks], np.float64).reshape(-1, 4)
    subset = np.zeros((0, 20))
    for k, conn in enumerate(conns):
        if k in missing or conn is None:
            continue
        ia, ib = LIMBS[k][0] - 1, LIMBS[k][1] - 1
        for row in conn:
            part_a, part_b, s = row[0], row[1], row[2]
            hits = [j for j in range(len(subset)) if subset[j][ia] == part_a or subset[j][ib] == part_b][:2]
            if len(hits) == 1 or (len(hits) == 2 and np.any((subset[hits[0]][:-2] >= 0)
                                                             & (subset[hits[1]][:-2] >= 0))):
                j = hits[0]
                if len(hits) == 2 or subset[j][ib] != part_b:
                    subset[j][ib] = part_b
                    subset[j][-1] += 1
                    subset[j][-2] += candidate[int(part_b), 2] + s
            elif len(hits) == 2:  # two disjoint people: merged
                j1, j2 = hits
                subset[j1][:-2] += subset[j2][:-2] + 1
                subset[j1][-2:] += subset[j2][-2:]
                subset[j1][-2] += s
                subset = np.delete(subset, j2, 0)
            elif k < 17:
                new = -1 * np.ones(20)
                new[ia], new[ib] = part_a, part_b
                new[-1] = 2
                new[-2] = sum(candidate[row[:2].astype(int), 2]) + s
                subset = np.vstack([subset, new])
    keep = [i for i in range(len(subset)) if not (subset[i][-1] < 4 or subset[i][-2] / subset[i][-1] < 0.4)]
    return candidate, subset[keep]


# ------------------------------------------------------------------------------------------ the detector
class OpenPoseBody(AnnotatorNet):
    """``body_pose_model.pth`` compiled on one backend per input size; ``people(rgb)`` -> the people found, as
    :class:`sdrt.pipelines.posemaps.Person` with keypoints as fractions of the image (the extension's
    ``detect_poses`` with hands and face off)."""

    WHAT = "OpenPose's body model"
    FIX = f"pass lllyasviel's {BODY_FILE}"

    def strip(self, name: str) -> str:
        return _bare(name)

    def expected(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return expected_shapes()

    def build(self, *size: int) -> Any:
        return build_graph(self.arrays(), *size)

    def maps(self, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(heatmaps (H, W, 19), pafs (H, W, 38))`` float64 of an RGB uint8 image, at its size."""
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])
        x, unpadded = prepare(bgr)
        out = self.session(x.shape[2], x.shape[3]).run({"image": x})
        h, w = rgb.shape[:2]
        return (upsample(out["heatmaps"][0], unpadded, h, w), upsample(out["pafs"][0], unpadded, h, w))

    def body(self, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """body.py's ``(candidate, subset)`` of an RGB uint8 image; an image so narrow that its scaled width is
        under a pixel (OpenCV refuses to resize to it, and the extension stops there) finds nobody."""
        h, w = rgb.shape[:2]
        if int(w * (0.5 * BOXSIZE / h)) < 1:
            return np.zeros((0, 4)), np.zeros((0, 20))
        return estimate(*self.maps(rgb))

    def people(self, rgb: np.ndarray) -> list[Any]:
        from .posemaps import Person

        candidate, subset = self.body(rgb)
        h, w = rgb.shape[:2]
        out = []
        for person in subset:
            body = [None if i == -1 else (candidate[i][0] / float(w), candidate[i][1] / float(h))
                    for i in person[:18].astype(int)]
            out.append(Person(body))
        return out
