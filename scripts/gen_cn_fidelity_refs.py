"""Reference control maps for two places where sd-webui-controlnet prepares a unit's map (tests/pipelines/
test_controlnet_fidelity.py, tests/serve/test_serve_controlnet.py, tests/flow/test_flux_controlnet_img2img.py):

1. an img2img "Inpaint area: Only masked" run (A1111's ``inpaint_full_res``): the extension's
   ``try_crop_image_with_a1111_mask`` cuts the unit's *input image* before its preprocessor: each channel, as a
   Pillow "L" image, is fitted to the mask's size with A1111's ``images.resize_image`` in the unit's resize mode,
   cut to A1111's crop region (``masking.get_crop_region`` with the padding, ``expand_crop_region`` to the run's
   aspect), and fitted to the run's size with ``resize_image`` mode 2 (Resize and Fill); then the preprocessor
   runs on that (here canny with pixel perfect: ``cv2.Canny`` at the cut-out's own size) and ``detectmap_proc``
   fits its map to the run's size;
2. the hires fix: ``get_control`` runs the preprocessor once (pixel perfect: for the first pass's size) and
   ``detectmap_proc`` resizes that one detected map to the first pass's size and, again, to the hires size
   (``hr_y``, ``hr_x``) in the unit's resize mode; here blur_gaussian (``resize_image_with_pad``, then
   ``cv2.GaussianBlur``) on a 64x64 image, and canny (whose map is black and white: see 3.);
3. ``detectmap_proc``'s ``high_quality_resize`` of a black/white map (``resize/``): a canny map made at processor
   resolution 512 fitted to 768x640 and to 384x384 in each resize mode. Its two colours (below 16 and above 240)
   make it "binary": the 3x3 opening test for one-pixel edges, OpenCV's area (shrinking) or cubic (enlarging)
   resize, the channels' mean, ``nake_nms``, Otsu's threshold and Lvmin Zhang's thinning (``lvmin_thin``, its
   prunings when enlarging), all written here from reading scripts/controlnet.py and scripts/lvminthin.py. The
   cubic resize's own output is kept too (``.../resampled``, one channel): OpenCV runs INTER_CUBIC of 8-bit
   images through Intel IPP where the wheel has it (this one: ``cv2.ipp.useIPP()``), whose rounding is its own and
   its CPU's, so the test checks the steps after the resize on OpenCV's resized map exactly.

The operations are written here from reading the extension (scripts/controlnet.py, scripts/preprocessor/legacy/
processor.py, internal_controlnet/external_code.py) and A1111 (modules/images.py, modules/masking.py): Pillow and
OpenCV calls made as they make them; nothing of sdrt is imported.

    /work/refvenv/bin/python scripts/gen_cn_fidelity_refs.py    # tests/data/control/cn_fidelity_refs.npz
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from PIL import Image

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "control" / "cn_fidelity_refs.npz"
MODES = ("Just Resize", "Crop and Resize", "Resize and Fill")  # the extension's ResizeMode, int_value 0, 1, 2
RUN = (64, 64)  # the run's width, height (the tiny ControlNet folders are exported for 64x64)
PADDING = 8
CANNY = (50, 150)
SIGMA = 3.0


# ------------------------------------------------------------------ inputs
def picture() -> np.ndarray:
    """The init image, 96 wide and 80 high: a gradient with a disc and a bar."""
    h, w = 80, 96
    y, x = np.mgrid[0:h, 0:w]
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 0] = (x * 255 // w).astype(np.uint8)
    img[..., 1] = (y * 255 // h).astype(np.uint8)
    img[(y - h / 2) ** 2 + (x - w / 3) ** 2 < (h / 4) ** 2] = (250, 240, 230)
    img[h // 5: h // 5 + 6, w // 2: w - 8] = (10, 10, 10)
    return img


def mask() -> np.ndarray:
    m = np.zeros((80, 96), np.uint8)
    m[22:38, 52:70] = 255
    return m


def control_image() -> np.ndarray:
    """The unit's image, 128 wide and 84 high (another size and shape than the picture): rectangles, a ring and a
    diagonal on a gradient, edges everywhere."""
    h, w = 84, 128
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([120 + x, 40 + y * 1.5, 200 - (x + y) / 2], axis=-1)
    img[10:45, 15:60] = (230, 30, 40)
    img[((y - 60) ** 2 + (x - 80) ** 2 < 500) & ((y - 60) ** 2 + (x - 80) ** 2 > 150)] = (20, 90, 240)
    img[np.abs(x - y - 10) < 2] = (250, 250, 250)
    img[70:90, 20:45] = (30, 200, 60)
    return np.clip(img, 0, 255).astype(np.uint8)


def hires_image() -> np.ndarray:
    """A 64x64 image for the hires fix: smooth colour fields and two shapes (many colours, so that the extension's
    resize of the blurred map is its cubic / area one)."""
    y, x = np.mgrid[0:64, 0:64].astype(np.float64)
    f = 128 + 70 * np.sin(x / 6.0) * np.cos(y / 9.0)
    img = np.stack([f, 255 - f * 0.7, 60 + x * 2.5], axis=-1)
    img[12:30, 8:28] = (240, 20, 30)
    img[(y - 44) ** 2 + (x - 44) ** 2 < 120] = (10, 40, 220)
    return np.clip(img, 0, 255).astype(np.uint8)


def edge_image() -> np.ndarray:
    """A 512x512 picture for canny: discs, bars, a ring and a diagonal on a soft gradient, edges of every slope."""
    y, x = np.mgrid[0:512, 0:512].astype(np.float64)
    img = np.stack([60 + x / 4, 80 + y / 5, 140 + 30 * np.sin(x / 40)], axis=-1)
    img[(y - 150) ** 2 + (x - 160) ** 2 < 90 ** 2] = (230, 200, 40)
    img[(y - 360) ** 2 + (x - 330) ** 2 < 110 ** 2] = (30, 60, 200)
    img[(y - 360) ** 2 + (x - 330) ** 2 < 50 ** 2] = (200, 60, 60)
    img[60:90, 280:480] = (20, 20, 20)
    img[300:480, 40:70] = (240, 240, 240)
    img[np.abs(x - 0.6 * y - 200) < 3] = (250, 250, 250)
    return np.clip(img, 0, 255).astype(np.uint8)


# ------------------------------------------------------------------ A1111 (modules/images.py, modules/masking.py)
def a1111_resize(mode: int, im: Image.Image, width: int, height: int) -> Image.Image:
    """``images.resize_image(mode, im, width, height)`` for an "L" image (A1111 resizes those with Lanczos, no
    upscaler); modes 1 and 2 build an RGB canvas, as A1111's does."""
    def resize(i: Image.Image, w: int, h: int) -> Image.Image:
        return i.resize((w, h), resample=Image.Resampling.LANCZOS)

    if mode == 0:
        return resize(im, width, height)
    ratio, src_ratio = width / height, im.width / im.height
    if mode == 1:
        sw = width if ratio > src_ratio else im.width * height // im.height
        sh = height if ratio <= src_ratio else im.height * width // im.width
        out = Image.new("RGB", (width, height))
        out.paste(resize(im, sw, sh), box=(width // 2 - sw // 2, height // 2 - sh // 2))
        return out
    sw = width if ratio < src_ratio else im.width * height // im.height
    sh = height if ratio >= src_ratio else im.height * width // im.width
    small = resize(im, sw, sh)
    out = Image.new("RGB", (width, height))
    out.paste(small, box=(width // 2 - sw // 2, height // 2 - sh // 2))
    if ratio < src_ratio:
        bar = height // 2 - sh // 2
        out.paste(small.resize((width, bar), box=(0, 0, width, 0)), box=(0, 0))
        out.paste(small.resize((width, bar), box=(0, small.height, width, small.height)), box=(0, bar + sh))
    elif ratio > src_ratio:
        bar = width // 2 - sw // 2
        out.paste(small.resize((bar, height), box=(0, 0, 0, height)), box=(0, 0))
        out.paste(small.resize((bar, height), box=(small.width, 0, small.width, height)), box=(bar + sw, 0))
    return out


def crop_region(m: np.ndarray, pad: int) -> tuple[int, int, int, int]:
    """``masking.get_crop_region``: the box of the non-zero columns and rows, ``pad`` wider, inside the mask."""
    h, w = m.shape
    cols = [i for i in range(w) if m[:, i].any()]
    rows = [i for i in range(h) if m[i].any()]
    return max(cols[0] - pad, 0), max(rows[0] - pad, 0), min(cols[-1] + 1 + pad, w), min(rows[-1] + 1 + pad, h)


def expand(region: tuple[int, int, int, int], pw: int, ph: int, iw: int, ih: int) -> tuple[int, int, int, int]:
    """``masking.expand_crop_region``: grown on its short side to the run's ``pw:ph``, kept inside the image."""
    x1, y1, x2, y2 = region
    if (x2 - x1) / (y2 - y1) > pw / ph:
        diff = int((x2 - x1) / (pw / ph) - (y2 - y1))
        y1, y2 = y1 - diff // 2, y2 + diff - diff // 2
        if y2 >= ih:
            y1, y2 = y1 - (y2 - ih), ih
        if y1 < 0:
            y1, y2 = 0, y2 - y1
        y2 = min(y2, ih)
    else:
        diff = int((y2 - y1) * (pw / ph) - (x2 - x1))
        x1, x2 = x1 - diff // 2, x2 + diff - diff // 2
        if x2 >= iw:
            x1, x2 = x1 - (x2 - iw), iw
        if x1 < 0:
            x1, x2 = 0, x2 - x1
        x2 = min(x2, iw)
    return x1, y1, x2, y2


# ------------------------------------------------------------------ the extension
def cut_input(image: np.ndarray, m: np.ndarray, mode: int) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """``try_crop_image_with_a1111_mask``: every channel fitted to the mask's size (the unit's mode), cut to the
    crop region, fitted to the run's size with mode 2; channel 0 of each result, stacked."""
    ih, iw = m.shape
    box = expand(crop_region(m, PADDING), RUN[0], RUN[1], iw, ih)
    planes = []
    for c in range(image.shape[2]):
        plane = a1111_resize(mode, Image.fromarray(np.ascontiguousarray(image[:, :, c])), iw, ih).crop(box)
        planes.append(np.asarray(a1111_resize(2, plane, RUN[0], RUN[1]))[:, :, 0])
    return np.stack(planes, axis=2), box


def pixel_perfect(image: np.ndarray, h: int, w: int, mode: int) -> int:
    """``external_code.pixel_perfect_resolution``."""
    k0, k1 = h / image.shape[0], w / image.shape[1]
    k = min(k0, k1) if mode == 2 else max(k0, k1)
    return int(np.round(k * min(image.shape[:2])))


def with_pad(image: np.ndarray, res: int) -> tuple[np.ndarray, int, int]:
    """``resize_image_with_pad``: the shorter side to ``res`` (cubic when growing, area otherwise), the sides padded
    with their edge to multiples of 64; and the size to cut the map back to."""
    h, w = image.shape[:2]
    k = res / min(h, w)
    th, tw = int(np.round(h * k)), int(np.round(w * k))
    out = cv2.resize(image, (tw, th), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    ph, pw = int(np.ceil(th / 64) * 64 - th), int(np.ceil(tw / 64) * 64 - tw)
    return np.pad(out, [[0, ph], [0, pw], [0, 0]], mode="edge"), th, tw


def canny(image: np.ndarray, res: int) -> np.ndarray:
    padded, th, tw = with_pad(image, res)
    return cv2.Canny(padded, *CANNY)[:th, :tw]


def blur_gaussian(image: np.ndarray, res: int) -> np.ndarray:
    padded, th, tw = with_pad(image, res)
    return cv2.GaussianBlur(np.ascontiguousarray(padded[:th, :tw]), (0, 0), SIGMA)


def hwc3(x: np.ndarray) -> np.ndarray:
    return np.repeat(x[:, :, None], 3, axis=2) if x.ndim == 2 else x


# ------------------------------------------------------------------ high_quality_resize (scripts/lvminthin.py)
def _rot4(kernels: list[list[list[int]]]) -> list[np.ndarray]:
    return [np.rot90(np.array(k, np.int32), r) for r in range(4) for k in kernels]


THIN = _rot4([[[-1, -1, -1], [0, 1, 0], [1, 1, 1]], [[0, -1, -1], [1, 1, -1], [0, 1, 0]]])
PRUNE = _rot4([[[-1, -1, -1], [-1, 1, -1], [0, 0, -1]], [[-1, -1, -1], [-1, 1, -1], [-1, 0, 0]]])


def thin_round(x: np.ndarray, kernels: list[np.ndarray]) -> bool:
    """Each pattern's hit-or-miss hits set to 0 in place, in turn; whether any pattern hit."""
    done = True
    for k in kernels:
        hits = np.where(cv2.morphologyEx(x, cv2.MORPH_HITMISS, k) > 127)
        x[hits] = 0
        done = done and hits[0].shape[0] == 0
    return not done


def thin(x: np.ndarray, prunings: bool) -> np.ndarray:
    for _ in range(32):
        if not thin_round(x, THIN):
            break
    if prunings:
        thin_round(x, PRUNE)
    return x


def nms(x: np.ndarray) -> np.ndarray:
    lines = [np.array(k, np.uint8) for k in ([[0, 0, 0], [1, 1, 1], [0, 0, 0]], [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
                                             [[1, 0, 0], [0, 1, 0], [0, 0, 1]], [[0, 0, 1], [0, 1, 0], [1, 0, 0]])]
    y = np.zeros_like(x)
    for k in lines:
        np.putmask(y, cv2.dilate(x, kernel=k) == x, x)
    return y


RESAMPLED: dict[tuple[int, int], np.ndarray] = {}  # a binary map's cv2.resize output, by (w, h), before the steps


def map_resize(x: np.ndarray, w: int, h: int) -> np.ndarray:
    """``high_quality_resize(x, (w, h))`` of an (H, W, 3) uint8 map: nearest for 3..199 colours, area when it shrinks,
    cubic otherwise; a two-colour map darker than 16 and lighter than 240 made black and white again."""
    if x.shape[:2] == (h, w):
        return x
    colours = len(np.unique(x.reshape(-1, x.shape[2]), axis=0))
    binary = colours == 2 and x.min() < 16 and x.max() > 240
    one_pixel = False
    if binary:
        square = np.ones((3, 3), np.uint8)
        opened = cv2.dilate(cv2.erode(x, square, iterations=1), square, iterations=1)
        one_pixel = np.where(opened < x)[0].shape[0] * 2 > np.where(x > 127)[0].shape[0]
    area = w * h < x.shape[0] * x.shape[1]
    bigger = w * h > x.shape[0] * x.shape[1]
    inter = cv2.INTER_NEAREST if 2 < colours < 200 else cv2.INTER_AREA if area else cv2.INTER_CUBIC
    y = cv2.resize(x, (w, h), interpolation=inter)
    if binary:
        RESAMPLED[(w, h)] = y[:, :, 0].copy()
        y = np.mean(y.astype(np.float32), axis=2).clip(0, 255).astype(np.uint8)
        if one_pixel:
            y = nms(y)
        _, y = cv2.threshold(y, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
        if one_pixel:
            y = thin(y, bigger)
        y = np.stack([y] * 3, axis=2)
    return y


def detectmap(x: np.ndarray, mode: int, h: int, w: int) -> np.ndarray:
    """``detectmap_proc`` for an image map (not an inpaint one)."""
    x = hwc3(x)
    if mode == 0:
        return map_resize(x, w, h)
    oh, ow = x.shape[:2]
    k0, k1 = h / oh, w / ow
    if mode == 2:
        k = min(k0, k1)
        borders = np.concatenate([x[0, :, :], x[-1, :, :], x[:, 0, :], x[:, -1, :]], axis=0)
        out = np.tile(np.median(borders, axis=0).astype(x.dtype)[None, None], [h, w, 1])
        small = map_resize(x, int(np.round(ow * k)), int(np.round(oh * k)))
        nh, nw = small.shape[:2]
        ph, pw = max(0, (h - nh) // 2), max(0, (w - nw) // 2)
        out[ph:ph + nh, pw:pw + nw] = small
        return out
    k = max(k0, k1)
    big = map_resize(x, int(np.round(ow * k)), int(np.round(oh * k)))
    nh, nw = big.shape[:2]
    ph, pw = max(0, (nh - h) // 2), max(0, (nw - w) // 2)
    return np.ascontiguousarray(big[ph:ph + h, pw:pw + w])


def main() -> None:
    out: dict[str, np.ndarray] = {"picture": picture(), "mask": mask(), "control": control_image(),
                                  "hires_image": hires_image()}
    for mode, name in enumerate(MODES):
        cut, box = cut_input(out["control"], out["mask"], mode)
        res = pixel_perfect(cut, RUN[1], RUN[0], mode)
        made = detectmap(hwc3(canny(cut, res)), mode, RUN[1], RUN[0])
        out[f"crop/{name}/input"], out[f"crop/{name}/map"] = cut, made
        out["crop/box"] = np.asarray(box)
        print(name, "box", box, "resolution", res, "edges", int((made[:, :, 0] > 0).sum()))
    image = out["hires_image"]
    for mode, name in enumerate(MODES):
        res = pixel_perfect(image, 64, 64, mode)  # the first pass's size
        detected = hwc3(blur_gaussian(image, res))
        out[f"hires/{name}/detected"] = detected
        out[f"hires/{name}/64x64"] = detectmap(detected, mode, 64, 64)
        for w, h in ((128, 96), (96, 96)):
            out[f"hires/{name}/{w}x{h}"] = detectmap(detected, mode, h, w)
        print(name, "resolution", res, "detected", detected.shape)
    for mode, name in enumerate(MODES):  # the hires fix with a canny unit: its map is black and white
        res = pixel_perfect(image, 64, 64, mode)
        detected = hwc3(canny(image, res))
        out[f"hires_canny/{name}/64x64"] = detectmap(detected, mode, 64, 64)
        for w, h in ((128, 96), (96, 96)):
            out[f"hires_canny/{name}/{w}x{h}"] = detectmap(detected, mode, h, w)
    big = edge_image()
    out["resize/image"] = big
    detected = hwc3(canny(big, 512))  # processor resolution 512, pixel perfect off
    out["resize/detected"] = detected[:, :, 0]
    for mode, name in enumerate(MODES):
        for w, h in ((768, 640), (384, 384)):
            RESAMPLED.clear()
            out[f"resize/{name}/{w}x{h}"] = detectmap(detected, mode, h, w)[:, :, 0]
            for (rw, rh), y in RESAMPLED.items():
                if rw * rh > 512 * 512:  # enlarged: OpenCV's (IPP's) cubic; the area resize is sdrt's exactly
                    out[f"resize/{name}/{w}x{h}/resampled"] = y
        print(name, "edges", {k: int((out[k] > 0).sum()) for k in out if k.startswith(f"resize/{name}/")})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(OUT, OUT.stat().st_size, "bytes; OpenCV", cv2.__version__, "Pillow", Image.__version__)


if __name__ == "__main__":
    main()
