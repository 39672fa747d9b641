"""Reference images for "only masked" inpainting (``inpaint_area="only masked"``) from diffusers' own pipelines.

    PYTHONPATH=scripts:core/src /work/refvenv/bin/python scripts/gen_onlymasked_refs.py

diffusers' ``StableDiffusionInpaintPipeline`` / ``StableDiffusionXLInpaintPipeline`` with ``padding_mask_crop=N``
(``VaeImageProcessor.get_crop_region``, the crop fitted with ``resize_mode="fill"``, the result put back by
``apply_overlay``) run on the tiny models of tests/data/pipelines (rebuilt here by gen_pipeline_refs.build, the
same seeded weights; each model is first checked against one of its committed references, so a rebuild that
drifted stops here rather than writing references of another model). Pictures larger than the 64x64 the tiny
UNets run at, with small masks: a padded box grown to a square, one moved back inside the picture at its border,
one a wide strip that no square fits (the crop fills with bars), a blurred mask (the overlay's grey edge), a batch
of two.

Writes tests/data/pipelines/only_masked.json (the cases) and only_masked.npz (``{case}/picture``, ``{case}/mask``,
``{case}/image``: the picture, the mask as given, diffusers' uint8 images at the picture's size).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from diffusers.image_processor import VaeImageProcessor
from gen_pipeline_refs import OUT, RELEASE_SCHEDULERS, SCHEDULERS, build, cases_for, run_case  # noqa: E402
from PIL import Image, ImageFilter

PROMPT = "a photo of a red cat sitting on a wooden table, sunset"
NEGATIVE = "blurry, low quality"


def picture(w: int, h: int, seed: int) -> np.ndarray:
    """A smooth gradient with two shapes and a little noise: a crop's position shows in every pixel."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([x / (w - 1), y / (h - 1), 1 - (x / w + y / h) / 2], axis=-1)
    img[h // 5: h // 2, w // 4: w // 2] = (0.9, 0.2, 0.1)
    img[(y - h * 0.7) ** 2 + (x - w * 0.7) ** 2 < (min(w, h) / 6) ** 2] = (0.1, 0.3, 0.9)
    img = img * 255 + rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).round().astype(np.uint8)


def box_mask(w: int, h: int, x1: int, y1: int, x2: int, y2: int, blur: float = 0) -> np.ndarray:
    m = Image.fromarray(np.zeros((h, w), np.uint8))
    arr = np.asarray(m).copy()
    arr[y1:y2, x1:x2] = 255
    m = Image.fromarray(arr)
    if blur:
        m = m.filter(ImageFilter.GaussianBlur(blur))
    return np.asarray(m, dtype=np.uint8)


#: (kind, name, picture (w, h, seed), mask box (x1, y1, x2, y2, blur), padding, sampler, strength, seed, batch)
CASES = [
    ("sd15", "sd15/blend/padded square", (96, 80, 1), (50, 20, 70, 36, 0), 8, "Euler", 1.0, 5, 1),
    ("sd15", "sd15/blend/wide strip, bars", (128, 48, 2), (10, 20, 118, 30, 0), 4, "Euler a", 0.75, 6, 1),
    ("sd15-inpaint", "sd15-inpaint/corner, moved inside", (120, 100, 3), (100, 4, 116, 20, 0), 32, "Euler a", 1.0,
     11, 1),
    ("sd15-inpaint", "sd15-inpaint/blurred mask", (96, 96, 4), (30, 40, 58, 60, 3), 6, "DDIM", 1.0, 12, 1),
    ("sdxl-inpaint", "sdxl-inpaint/tall box", (100, 90, 5), (20, 10, 36, 70, 0), 10, "Euler", 1.0, 17, 1),
    ("sdxl-inpaint", "sdxl-inpaint/batch2", (80, 100, 6), (30, 50, 60, 64, 2), 12, "DPM++ 2M Karras", 1.0, 18, 2),
]


def check_model(pipe, kind: str) -> None:
    """The rebuilt model against one of its committed references (gen_pipeline_refs' own case)."""
    folder = OUT / f"tiny-{kind}"
    refs = np.load(folder / "refs.npz")
    case = next(c for c in cases_for(kind) if c["mode"] == "inpaint")
    got = run_case(pipe, case, {"init_image": refs["init_image"], "mask": refs["mask"]})
    diff = np.abs(got.astype(int) - refs[case["name"]].astype(int)).max()
    if diff > 1:
        raise SystemExit(f"{kind}: the rebuilt model's {case['name']!r} is {diff} levels off the committed "
                         "reference: not the model in tests/data/pipelines")
    print(kind, "rebuilt model matches", case["name"], "(max diff", diff, ")")


def run(pipe, case: tuple, pic: np.ndarray, mask: np.ndarray) -> np.ndarray:
    kind, _name, _pic, _box, pad, sampler, strength, seed, batch = case
    sched = SCHEDULERS[sampler](pipe.scheduler.config)
    xl = kind.startswith("sdxl")
    from diffusers import StableDiffusionInpaintPipeline, StableDiffusionXLInpaintPipeline

    if xl:
        p = StableDiffusionXLInpaintPipeline(**{**pipe.components, "scheduler": sched},
                                             requires_aesthetics_score=False, force_zeros_for_empty_prompt=True)
    else:
        p = StableDiffusionInpaintPipeline(**{**pipe.components, "scheduler": sched})
    p.set_progress_bar_config(disable=True)
    out = p(prompt=PROMPT, negative_prompt=NEGATIVE, image=Image.fromarray(pic), mask_image=Image.fromarray(mask),
            strength=strength, height=64, width=64, num_inference_steps=8, guidance_scale=7.0,
            generator=torch.Generator("cpu").manual_seed(seed), num_images_per_prompt=batch,
            padding_mask_crop=pad, output_type="pil")
    return np.stack([np.asarray(im.convert("RGB"), dtype=np.uint8) for im in out.images])


def main() -> None:
    torch.set_num_threads(1)
    data: dict[str, np.ndarray] = {}
    listed = []
    pipes = {}
    for case in CASES:
        kind, name, (w, h, pseed), (x1, y1, x2, y2, blur), pad, sampler, strength, seed, batch = case
        if kind not in pipes:
            pipe = build(kind)
            pipe.scheduler = type(pipe.scheduler).from_config(RELEASE_SCHEDULERS[kind])  # as export() sets it
            check_model(pipe, kind)
            pipes[kind] = pipe
        pic, mask = picture(w, h, pseed), box_mask(w, h, x1, y1, x2, y2, blur)
        images = run(pipes[kind], case, pic, mask)
        crop = VaeImageProcessor.get_crop_region(Image.fromarray(mask), 64, 64, pad=pad)
        data[f"{name}/picture"], data[f"{name}/mask"], data[f"{name}/image"] = pic, mask, images
        listed.append(dict(folder=f"tiny-{kind}", name=name, padding=pad, sampler=sampler, strength=strength,
                           seed=seed, batch=batch, steps=8, cfg=7.0, width=64, height=64, prompt=PROMPT,
                           negative_prompt=NEGATIVE, crop=[int(c) for c in crop]))
        changed = float((np.abs(images.astype(int) - pic[None].astype(int)).sum(-1) > 0).mean())
        print(name, images.shape, "crop", crop, f"changed {changed:.1%}")
    (OUT / "only_masked.json").write_text(json.dumps(listed, indent=1) + "\n")
    np.savez_compressed(OUT / "only_masked.npz", **data)
    print("wrote", OUT / "only_masked.npz", (OUT / "only_masked.npz").stat().st_size, "bytes")


if __name__ == "__main__":
    sys.exit(main())
