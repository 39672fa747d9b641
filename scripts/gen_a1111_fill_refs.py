"""Write tests/serve/data/a1111_fill.npz from AUTOMATIC1111's own ``masking.fill`` (img2img's inpainting_fill 0).

A1111's source is read, never copied: pass a stable-diffusion-webui checkout (read-only, never committed)::

    git clone --depth 1 https://github.com/AUTOMATIC1111/stable-diffusion-webui /tmp/a1111
    python scripts/gen_a1111_fill_refs.py --a1111 /tmp/a1111 --out tests/serve/data/a1111_fill.npz

``fill`` is taken out of ``modules/masking.py`` with ``ast`` and run on Pillow, as processing.py's
``StableDiffusionProcessingImg2Img.init`` calls it: ``masking.fill(image, latent_mask)``, the picture already fitted
to the size and the mask the blurred, fitted grey one (not the doubled ``mask_for_overlay``); its result replaces
the picture. Needs numpy and Pillow only. Keys: ``{case}/picture`` (HxWx3 uint8), ``{case}/mask`` (HxW uint8,
white = repaint) and ``{case}/filled`` (A1111's result, HxWx3 uint8).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter, ImageOps


def _fill(root: Path):
    tree = ast.parse((root / "modules" / "masking.py").read_text())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fill"), None)
    if fn is None:
        raise SystemExit("fill not found in modules/masking.py")
    env = {"Image": Image, "ImageFilter": ImageFilter, "ImageOps": ImageOps}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), "<a1111 masking>", "exec"), env)
    return env["fill"]


def _picture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([xx * 200 // w + 30, yy * 180 // h + 40, (xx + yy) * 90 // (w + h) + 100], axis=-1)
    return np.clip(smooth + rng.integers(-30, 30, smooth.shape), 0, 255).astype(np.uint8)


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    cases = {}
    # a wide picture, a hard-edged blob in the middle
    pic = _picture(rng, 24, 40)
    mask = np.zeros((24, 40), np.uint8)
    mask[6:17, 12:30] = 255
    cases["wide_blob"] = (pic, mask)
    # a tall picture, a blurred mask (grey edges keep the picture partly) touching the left and top borders
    pic = _picture(rng, 48, 32)
    hard = np.zeros((48, 32), np.uint8)
    hard[:20, :14] = 255
    hard[30:, 25:] = 255
    soft = np.asarray(Image.fromarray(hard).filter(ImageFilter.GaussianBlur(3)))
    cases["tall_soft_border"] = (pic, soft)
    # nothing masked: the picture comes back
    pic = _picture(rng, 16, 16)
    cases["all_kept"] = (pic, np.zeros((16, 16), np.uint8))
    # all but three pixels masked: their colours spread over the picture
    pic = _picture(rng, 32, 32)
    mask = np.full((32, 32), 255, np.uint8)
    mask[3, 4] = mask[20, 27] = 0
    mask[31, 0] = 40
    cases["almost_all"] = (pic, mask)
    # a picture wider than the widest blur (radius 256): each end of the masked span takes its side's colour
    pic = _picture(rng, 8, 600)
    mask = np.zeros((8, 600), np.uint8)
    mask[:, 250:560] = 255
    mask[2:5, 100:110] = 128
    cases["wider_than_radius"] = (pic, mask)
    # the size of the demo model's requests (tests/serve/test_serve_img2img_fill.py sends it): a disc with a
    # grey rim
    pic = _picture(rng, 64, 64)
    yy, xx = np.mgrid[0:64, 0:64]
    dist = np.hypot(yy - 30, xx - 36)
    cases["request_64"] = (pic, np.clip((14 - dist) * 64, 0, 255).astype(np.uint8))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a1111", type=Path, required=True, help="a stable-diffusion-webui checkout")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    fill = _fill(args.a1111)
    data = {}
    for name, (pic, mask) in _cases().items():
        got = fill(Image.fromarray(pic), Image.fromarray(mask))
        data[f"{name}/picture"], data[f"{name}/mask"] = pic, mask
        data[f"{name}/filled"] = np.asarray(got.convert("RGB"), dtype=np.uint8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    print(f"wrote {args.out}: {len(data) // 3} cases, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
