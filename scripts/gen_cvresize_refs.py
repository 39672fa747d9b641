"""OpenCV's uint8 ``cv2.resize`` INTER_CUBIC, INTER_AREA and INTER_LINEAR on seeded random images, for sdrt.pipelines.cvresize.

    /work/refvenv/bin/python scripts/gen_cvresize_refs.py    # tests/data/cvresize/cubic_refs.npz

OpenCV's pip wheels (opencv-python 5.0, Intel IPP inside) run INTER_CUBIC of a source at least 4 x 4 through IPP's
resize and a smaller source through OpenCV's own fixed-point code; ``cv2.ipp.setUseIPP(False)`` runs OpenCV's own
code at every size (as builds without IPP do). Stored, per case ``<kind>/<h>x<w>x<c>/<H>x<W>``:

- ``own/...``: INTER_CUBIC with IPP off: the SHA-256 of the output's bytes (``hash/``), a few outputs whole;
- ``ipp/...``: INTER_CUBIC as the wheel runs it (IPP on): hashes for sources under 4 on a side (OpenCV's own
  code), whole outputs for larger ones (IPP's arithmetic is not published: sdrt comes within a level of it);
- ``area/...``: INTER_AREA, hashes;
- ``linear/...``: INTER_LINEAR, hashes.

The source images are regenerated from the seed in the test (``image(h, w, c)``), so only outputs are stored.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import cv2
import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "cvresize" / "cubic_refs.npz"

#: (source h, w, channels; 0 = a 2-D image) and the output sizes (h, w) for each
SOURCES = [(7, 5, 3), (33, 17, 3), (100, 72, 3), (64, 64, 3), (1, 9, 3), (9, 1, 3), (3, 3, 1), (2, 40, 0),
           (3, 26, 4), (17, 3, 3), (64, 80, 3), (45, 31, 0), (20, 13, 4), (40, 52, 3)]


def outputs(h: int, w: int) -> list[tuple[int, int]]:
    """Sizes up and down, whole and fractional scales, 1-pixel sides."""
    sizes = {(h * 2, w * 2), (round(h * 1.5), round(w * 1.5)), (round(h * 2.37) + 1, round(w * 1.13) + 1),
             (max(1, h // 2), max(1, w // 2)), (max(1, round(h * 0.7)), max(1, round(w * 0.41))),
             (1, w + 3), (h + 5, 1), (1, 1), (round(h * 1.5), round(w * 1.5)), (h * 3 + 1, max(1, w - 1)), (96, 120), (126, 96)}
    return sorted(sizes)


def image(h: int, w: int, c: int) -> np.ndarray:
    """The seeded source (c = 0: 2-D): noise over a smooth field, so both ties and plain values occur."""
    rng = np.random.default_rng(h * 1000 + w * 10 + c)
    if (h, w) == (40, 52):  # flat 3x3 blocks of random colours: many values on a half (ties) at 1.5x
        return rng.integers(0, 256, (14, 18, c), dtype=np.uint8).repeat(3, 0).repeat(3, 1)[:h, :w]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    base = 127 + 100 * np.sin(xx / 3.1 + yy / 5.3)
    shape = (h, w) if c == 0 else (h, w, c)
    noise = rng.integers(-60, 61, shape)
    field = base if c == 0 else base[..., None]
    return np.clip(field + noise, 0, 255).astype(np.uint8)


def digest(a: np.ndarray) -> np.ndarray:
    return np.frombuffer(hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest(), np.uint8)


def main() -> None:
    out: dict[str, np.ndarray] = {}
    whole_own = {"7x5x3/14x10", "33x17x3/50x26", "3x26x4/96x120", "1x9x3/126x96"}
    for h, w, c in SOURCES:
        img = image(h, w, c)
        for oh, ow in outputs(h, w):
            key = f"{h}x{w}x{c}/{oh}x{ow}"
            cv2.ipp.setUseIPP(False)
            own = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_CUBIC)
            cv2.ipp.setUseIPP(True)
            wheel = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_CUBIC)
            area = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_AREA)
            linear = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_LINEAR)
            out[f"own/hash/{key}"] = digest(own)
            if key in whole_own:
                out[f"own/whole/{key}"] = own
            if min(h, w) < 4:
                out[f"ipp/hash/{key}"] = digest(wheel)
            elif (h, w) == (33, 17) or (h, w, oh, ow) in ((64, 80, 96, 120), (100, 72, 126, 96), (64, 80, 32, 40), (40, 52, 60, 78), (40, 52, 20, 26)):
                out[f"ipp/whole/{key}"] = wheel
            out[f"area/hash/{key}"] = digest(area)
            out[f"linear/hash/{key}"] = digest(linear)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(OUT, len(out), OUT.stat().st_size, "bytes;", cv2.__version__, cv2.ipp.getIppVersion())


if __name__ == "__main__":
    main()
