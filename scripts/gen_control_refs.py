"""OpenCV reference outputs for sdrt.pipelines.controlmaps (canny and the resamplers).

    /work/refvenv/bin/python scripts/gen_control_refs.py    # tests/data/control/control_refs.npz

Needs opencv-python-headless (installed into /work/refvenv for this script only; sdrt never imports
OpenCV). The test images are made here from a fixed seed: shapes and gradients with noise, and a smooth
"photo-like" field, in colour and in grey, at sizes that are not multiples of 8.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "control" / "control_refs.npz"
CANNY = [(100, 200), (50, 150), (20, 60), (200, 100)]


def images() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(36)
    yy, xx = np.mgrid[0:96, 0:124].astype(np.float64)
    img = np.stack([xx * 2, yy * 2.5, 255 - xx - yy], axis=-1)
    img[20:60, 30:80] = (220, 40, 30)
    img[((yy - 70) ** 2 + (xx - 40) ** 2) < 300] = (30, 80, 230)
    img[10:90, 95:100] = (250, 250, 250)
    img += rng.normal(0, 6, img.shape)
    shapes = np.clip(img, 0, 255).astype(np.uint8)
    yy, xx = np.mgrid[0:117, 0:90].astype(np.float64)
    field = 128 + 60 * np.sin(xx / 7.0) * np.cos(yy / 11.0) + 40 * np.sin((xx + 2 * yy) / 13.0)
    photo = np.stack([field, field * 0.8 + 20, 255 - field], axis=-1) + rng.normal(0, 3, (117, 90, 3))
    photo = np.clip(photo, 0, 255).astype(np.uint8)
    return {"shapes": shapes, "photo": photo, "shapes_gray": cv2.cvtColor(shapes, cv2.COLOR_RGB2GRAY),
            "photo_gray": cv2.cvtColor(photo, cv2.COLOR_RGB2GRAY)}


def main() -> None:
    out: dict[str, np.ndarray] = {}
    for name, img in images().items():
        out[f"image/{name}"] = img
        for lo, hi in CANNY:
            for l2 in (False, True):
                out[f"canny/{name}/{lo}/{hi}/{int(l2)}"] = cv2.Canny(img, lo, hi, L2gradient=l2)
        if img.ndim == 3:
            out[f"resize/{name}/area/40x30"] = cv2.resize(img, (40, 30), interpolation=cv2.INTER_AREA)
            out[f"resize/{name}/area/62x48"] = cv2.resize(img, (62, 48), interpolation=cv2.INTER_AREA)
            out[f"resize/{name}/cubic/200x150"] = cv2.resize(img, (200, 150), interpolation=cv2.INTER_CUBIC)
            out[f"resize/{name}/nearest/77x51"] = cv2.resize(img, (77, 51), interpolation=cv2.INTER_NEAREST)
            out[f"resize/{name}/nearest/150x130"] = cv2.resize(img, (150, 130), interpolation=cv2.INTER_NEAREST)
    # a thick black-and-white map resized as sd-webui-controlnet does for binary maps: cv2.resize, the mean of
    # the channels, then OpenCV's Otsu threshold (binary maps whose edges are one pixel wide also get thinned
    # there, which sdrt does not do: this map is thick on purpose)
    shapes = images()["shapes"]
    binary = np.where(shapes.min(axis=2) > 100, 255, 0).astype(np.uint8)
    binary = np.repeat(binary[:, :, None], 3, axis=2)
    out["image/binary"] = binary
    for (w, h), interp in (((50, 38), cv2.INTER_AREA), ((200, 155), cv2.INTER_CUBIC)):
        y = cv2.resize(binary, (w, h), interpolation=interp)
        gray = np.mean(y.astype(np.float32), axis=2).clip(0, 255).astype(np.uint8)
        _, y = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
        out[f"binary/{w}x{h}"] = np.stack([y] * 3, axis=2)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(OUT, OUT.stat().st_size, "bytes,", len(out), "arrays; OpenCV", cv2.__version__)


if __name__ == "__main__":
    main()
