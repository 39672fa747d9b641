"""Write tests/pipelines/data/mask_blur.npz: OpenCV's own ``cv2.GaussianBlur`` of 8-bit masks, run as A1111's
img2img init (modules/processing.py, StableDiffusionProcessingImg2Img.init) runs it for ``mask_blur_x`` and
``mask_blur_y``: along x with ``ksize=(2 * int(2.5 * bx + 0.5) + 1, 1)`` and sigma ``bx``, then along y with
``(1, 2 * int(2.5 * by + 0.5) + 1)`` and sigma ``by``, each only when above 0 (OpenCV's default border,
BORDER_REFLECT_101). Run with the reference venv (opencv-python-headless)::

    /work/refvenv/bin/python scripts/gen_mask_blur_refs.py --out tests/pipelines/data/mask_blur.npz

Keys: ``{case}/mask`` (HxW uint8), ``{case}/blur`` (x, y) and ``{case}/blurred`` (OpenCV's result). The tests
never import cv2: they compare sdrt.pipelines.maskblur with these arrays."""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np


def a1111_blur(mask: np.ndarray, bx: int, by: int) -> np.ndarray:
    if bx > 0:
        mask = cv2.GaussianBlur(mask, (2 * int(2.5 * bx + 0.5) + 1, 1), bx)
    if by > 0:
        mask = cv2.GaussianBlur(mask, (1, 2 * int(2.5 * by + 0.5) + 1), by)
    return mask


def _cases() -> dict[str, tuple[np.ndarray, tuple[int, int]]]:
    rng = np.random.default_rng(5)
    cases = {}
    box = np.zeros((48, 64), np.uint8)
    box[13:31, 20:45] = 255
    for b in (1, 2, 4, 7, 16):  # A1111's default 4; a kernel wider than the mask (16: 81 taps on 64)
        cases[f"box_{b}"] = (box, (b, b))
    cases["box_x6_y0"] = (box, (6, 0))
    cases["box_x0_y3"] = (box, (0, 3))
    cases["box_x2_y9"] = (box, (2, 9))
    border = np.zeros((40, 24), np.uint8)  # masked up to the edges: the reflected border matters
    border[:12, :] = 255
    border[25:, 17:] = 255
    cases["border_5"] = (border, (5, 5))
    cases["noise_3"] = (rng.integers(0, 256, (33, 29)).astype(np.uint8), (3, 3))  # grey levels, odd sizes
    cases["dots_11_5"] = (((rng.random((20, 37)) > 0.9) * 255).astype(np.uint8), (11, 5))
    cases["thin_64"] = (np.tile(np.uint8([0, 255, 255, 0, 0, 0, 255]), (3, 1)), (64, 64))  # folded many times
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    data = {}
    for name, (mask, (bx, by)) in _cases().items():
        data[f"{name}/mask"] = mask
        data[f"{name}/blur"] = np.array([bx, by], np.int32)
        data[f"{name}/blurred"] = a1111_blur(mask.copy(), bx, by)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    print(f"wrote {args.out} ({len(data) // 3} cases, OpenCV {cv2.__version__})")


if __name__ == "__main__":
    main()
