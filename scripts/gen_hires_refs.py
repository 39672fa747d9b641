"""Reference resamplings for the hires fix's latent upscalers: torch.nn.functional.interpolate (torch venv).

    /work/refvenv/bin/python scripts/gen_hires_refs.py

Writes tests/data/toolbox/interpolate.npz: a random (1, 4, 7, 9) latent and, for every mode A1111's
latent upscalers use (bilinear, bicubic, nearest, nearest-exact; bilinear and bicubic with antialias),
its resampling to several sizes (x2, x1.5, odd sizes, and a shrink for the antialiased modes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "toolbox" / "interpolate.npz"
MODES = [("bilinear", False), ("bilinear", True), ("bicubic", False), ("bicubic", True), ("nearest", False),
         ("nearest-exact", False)]
SIZES = [(14, 18), (10, 13), (21, 27), (5, 6)]


def main() -> None:
    x = torch.from_numpy(np.random.default_rng(36).standard_normal((1, 4, 7, 9)).astype(np.float32))
    out = {"latent": x.numpy()}
    for mode, aa in MODES:
        for h, w in SIZES:
            kw = {"antialias": aa} if mode in ("bilinear", "bicubic") else {}
            y = F.interpolate(x, size=(h, w), mode=mode, **kw) if mode.startswith("nearest") else \
                F.interpolate(x, size=(h, w), mode=mode, align_corners=False, **kw)
            out[f"{mode}/{int(aa)}/{h}x{w}"] = y.numpy()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(OUT, len(out) - 1, "cases")


if __name__ == "__main__":
    main()
