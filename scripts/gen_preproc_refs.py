"""OpenCV reference maps for sdrt's model-free ControlNet preprocessors beyond canny (sdrt.pipelines.preprocessors).

    /work/refvenv/bin/python scripts/gen_preproc_refs.py    # tests/data/control/preproc_refs.npz

Needs opencv-python-headless and controlnet_aux (``pip install --no-deps controlnet_aux``; its util module needs
torch) in /work/refvenv; sdrt never imports either. Each map is made as sd-webui-controlnet makes it (its
``scripts/processor.py``, 1.1.4xx: the same OpenCV calls, in the same order, with the same numpy dtypes), the
lineart_standard core by controlnet_aux's ``LineartStandardDetector`` and the shuffle noise by controlnet_aux's
``make_noise_disk``. For each case the file holds the image the map function itself read (``input/...``, after
the extension's ``resize_image_with_pad``) and the map (``map/...``), so tests can check the map alone (same
input) and the whole chain (sdrt's own resize).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import cv2
import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "control" / "preproc_refs.npz"
AUX = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / "controlnet_aux"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def aux():
    """controlnet_aux's util and lineart_standard modules, without its package __init__ (which loads every
    detector and their dependencies)."""
    import types

    pkg = types.ModuleType("controlnet_aux")
    pkg.__path__ = [str(AUX)]
    sys.modules["controlnet_aux"] = pkg
    util = _load("controlnet_aux.util", AUX / "util.py")
    lineart = _load("controlnet_aux.lineart_standard", AUX / "lineart_standard" / "__init__.py")
    return util, lineart


def images() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(53)
    yy, xx = np.mgrid[0:120, 0:160].astype(np.float64)
    page = np.full((120, 160, 3), 236.0)
    ring = (yy - 56) ** 2 + (xx - 76) ** 2
    page[(ring < 44 ** 2) & (ring > 40 ** 2)] = 25  # a thin ring
    page[24:27, 8:152] = (70, 40, 30)  # a thin coloured line
    page[72:112, 120:136] = 15  # a thick stroke: the XDoG difference passes 127 in its core
    page[80:112, 16:56] = np.stack([xx[80:112, 16:56] * 2, yy[80:112, 16:56] * 1.5, 90 + 0 * xx[80:112, 16:56]], -1)
    lines = np.clip(page + rng.normal(0, 4, page.shape), 0, 255).astype(np.uint8)
    yy, xx = np.mgrid[0:117, 0:90].astype(np.float64)
    field = 128 + 60 * np.sin(xx / 7.0) * np.cos(yy / 11.0) + 40 * np.sin((xx + 2 * yy) / 13.0)
    photo = np.stack([field, field * 0.8 + 20, 255 - field], axis=-1) + rng.normal(0, 3, (117, 90, 3))
    photo = np.clip(photo, 0, 255).astype(np.uint8)
    v = np.arange(0, 256, 15)
    colours = np.stack(np.meshgrid(v, v, v, indexing="ij"), -1).reshape(18 * 18, 18, 3).astype(np.uint8)
    return {"lines": lines, "photo": photo, "colours": colours}


def resize_image_with_pad(img: np.ndarray, resolution: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The extension's: shorter side to ``resolution`` (cubic up, area down), edges repeated to multiples of 64."""
    h_raw, w_raw = img.shape[:2]
    k = float(resolution) / float(min(h_raw, w_raw))
    h, w = int(np.round(float(h_raw) * k)), int(np.round(float(w_raw) * k))
    img = cv2.resize(img, (w, h), interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)
    ph, pw = int(np.ceil(h / 64.0) * 64 - h), int(np.ceil(w / 64.0) * 64 - w)
    return np.pad(img, [[0, ph], [0, pw], [0, 0]], mode="edge"), (h, w)


def xdog(img: np.ndarray, thr: float) -> np.ndarray:
    g1 = cv2.GaussianBlur(img.astype(np.float32), (0, 0), 0.5)
    g2 = cv2.GaussianBlur(img.astype(np.float32), (0, 0), 5.0)
    dog = (255 - np.min(g2 - g1, axis=2)).clip(0, 255).astype(np.uint8)
    result = np.zeros_like(img, dtype=np.uint8)
    result[2 * (255 - dog) > thr] = 255  # uint8 arithmetic, as in the extension
    return result


def color(img: np.ndarray, res: int) -> np.ndarray:
    h, w = img.shape[:2]
    if h < w:
        nh, nw = res, int(round(w / h * res))
    else:
        nw, nh = res, int(round(h / w * res))
    img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA)
    h, w = img.shape[:2]
    grid = cv2.resize(img, (w // 64, h // 64), interpolation=cv2.INTER_CUBIC)
    return cv2.resize(grid, (w, h), interpolation=cv2.INTER_NEAREST)


def recolor(img: np.ndarray, gamma: float, code: int, channel: int) -> np.ndarray:
    result = cv2.cvtColor(img, code)[:, :, channel].astype(np.float32) / 255.0
    return (result ** gamma * 255.0).clip(0, 255).astype(np.uint8)


def main() -> None:
    util, lineart_mod = aux()
    detector = lineart_mod.LineartStandardDetector()
    imgs = images()
    out: dict[str, np.ndarray] = {f"image/{k}": v for k, v in imgs.items()}

    def put(key: str, given: np.ndarray, made: np.ndarray) -> None:
        out[f"input/{key}"] = given
        out[f"map/{key}"] = made[:, :, 0] if made.ndim == 3 and (made == made[:, :, :1]).all() else made

    for name in ("lines", "photo"):
        img = imgs[name]
        for rate in (1.5, 3.3):
            h, w = img.shape[:2]
            made = img if rate < 1.1 else cv2.resize(img, (int(w / rate), int(h / rate)), interpolation=cv2.INTER_AREA)
            put(f"tile_resample/{name}/own/{rate:g}", img, made)
        for res in (None, 96):
            given, crop = (img, img.shape[:2]) if res is None else resize_image_with_pad(img, res)
            tag = "own" if res is None else str(res)
            # lineart_standard: controlnet_aux's detector on the padded image (its own resize is then a no-op)
            made = detector(given, detect_resolution=min(given.shape[:2]), output_type="np")
            if res is None:  # controlnet_aux rounds sides to multiples of 64: the core by hand at the own size
                x = given.astype(np.float32)
                g = cv2.GaussianBlur(x, (0, 0), 6.0)
                intensity = np.min(g - x, axis=2).clip(0, 255)
                intensity /= max(16, np.median(intensity[intensity > 8]))
                made = (intensity * 127).clip(0, 255).astype(np.uint8)[:, :, None].repeat(3, axis=2)
            put(f"lineart_standard/{name}/{tag}", given, made[:crop[0], :crop[1]])
            for thr in (32, 8, 64):
                put(f"scribble_xdog/{name}/{tag}/{thr}", given, xdog(given, thr)[:crop[0], :crop[1]])
            unpadded = np.ascontiguousarray(given[:crop[0], :crop[1]])
            for sigma in ((9.0,) if name == "lines" else (2.5,)):
                put(f"blur_gaussian/{name}/{tag}/{sigma:g}", unpadded, cv2.GaussianBlur(unpadded, (0, 0), sigma))
            for seed in ((1234,) if name == "lines" else (84,)):
                np.random.seed(seed)
                h, w = unpadded.shape[:2]
                x = util.make_noise_disk(h, w, 1, 256) * float(w - 1)
                y = util.make_noise_disk(h, w, 1, 256) * float(h - 1)
                flow = np.concatenate([x, y], axis=2).astype(np.float32)
                put(f"shuffle/{name}/{tag}/{seed}", unpadded, cv2.remap(unpadded, flow, None, cv2.INTER_LINEAR))
        for res in (64, 96, 200):
            put(f"color/{name}/{res}", img, color(img, res))
    for name in ("photo", "colours"):
        for gamma in (1.0, 0.45, 1.8):
            put(f"recolor_luminance/{name}/own/{gamma:g}", imgs[name], recolor(imgs[name], gamma, cv2.COLOR_BGR2LAB, 0))
            put(f"recolor_intensity/{name}/own/{gamma:g}", imgs[name], recolor(imgs[name], gamma, cv2.COLOR_BGR2HSV, 2))
    # inputs repeat (the same image under several keys): keep one copy of each
    seen: dict[bytes, str] = {v.tobytes() + str(v.shape).encode(): f"image/{k}" for k, v in imgs.items()}
    for key in [k for k in out if k.startswith("input/")]:
        digest = out[key].tobytes() + str(out[key].shape).encode()
        if digest in seen:
            out[f"same/{key[6:]}"] = np.array(seen[digest])
            del out[key]
        else:
            seen[digest] = key
    out["versions"] = np.array(f"opencv {cv2.__version__}, numpy {np.__version__}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"{OUT}: {len(out)} arrays, {OUT.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
