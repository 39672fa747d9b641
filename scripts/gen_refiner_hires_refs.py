"""diffusers' images of tiny-sdxl + tiny-sdxl-refiner with the hires fix, composed as A1111 1.7+ runs them.

Needs torch and diffusers (/work/refvenv); the tests read only what this writes:

    /work/refvenv/bin/python scripts/gen_refiner_hires_refs.py   # tests/data/pipelines/tiny-sdxl-refiner/hires_refs.*

The refiner is rebuilt as scripts/gen_refiner_refs.py builds it, and the base is tiny-sdxl-dyn (the hires pass
needs a UNet of dynamic size; tiny-sdxl's weights but for its first text encoder's activation), rebuilt by
scripts/gen_pipeline_refs.py; each is checked against one of its folder's references first, and no folder is
written again. Each case is A1111's txt2img with ``enable_hr``
and a ``refiner_checkpoint``, written with diffusers' pipelines, ``torch.Generator("cpu").manual_seed(seed)``:

1. the first pass at 64x64: ``StableDiffusionXLPipeline`` (``output_type="latent"``); with
   ``hires_fix_refiner_pass`` "first pass" it is the ensemble of experts (``denoising_end=switch``, then the
   refiner's img2img with ``denoising_start=switch``), one generator for both;
2. the upscale: ``Latent``: ``torch.nn.functional.interpolate(latents, mode="bilinear")`` to the target's latent
   size; ``Lanczos``: decoded by the VAE of the model that ran last (rounded to uint8 as sdrt's images are), resized
   with Pillow's Lanczos, then encoded again by the img2img pipeline of the model that runs next;
3. the hires pass on a fresh generator of the same seed (A1111 makes a new ImageRNG): img2img at the target size
   over ``int(hires_steps / denoise)`` steps, running the last ``hires_steps`` (``strength`` picks that tail):
   the base's ``StableDiffusionXLImg2ImgPipeline`` with ``denoising_end=switch`` and the refiner's with
   ``denoising_start=switch`` on its latents ("second pass": the refiner takes over at the switch's timestep in
   this pass), or the refiner's alone (it took over in the first pass and stays, or the pass starts past the
   switch); the refiner's VAE decodes whenever it ran last.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pipeline_refs as g  # noqa: E402  (hides torchvision, as that script does)
import gen_refiner_refs as r  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline  # noqa: E402
from PIL import Image  # noqa: E402

OUT = r.OUT


def cases() -> list[dict]:
    base = dict(prompt=g.PROMPT, negative_prompt=g.NEGATIVE, steps=10, cfg=7.0, batch=1, width=g.SIZE,
                height=g.SIZE, hires_scale=2, hires_steps=5, hires_denoise=0.5, hires_refiner_pass="second pass")
    return [
        dict(base, name="hires/Latent/Euler/0.8", sampler="Euler", upscaler="Latent", switch_at=0.8, seed=71),
        dict(base, name="hires/Lanczos/Euler/0.8", sampler="Euler", upscaler="Lanczos", switch_at=0.8, seed=72),
        dict(base, name="hires/Latent/Euler a/0.7", sampler="Euler a", upscaler="Latent", switch_at=0.7, seed=73),
        # denoise 0.125: the pass runs timesteps 83, 42, 1 of 24 steps, all past 0.8: the refiner runs all of it
        dict(base, name="hires/Latent/Euler/0.8/denoise 0.125", sampler="Euler", upscaler="Latent", switch_at=0.8,
             seed=74, hires_steps=3, hires_denoise=0.125),
        dict(base, name="hires/first pass/Lanczos/Euler/0.8", sampler="Euler", upscaler="Lanczos", switch_at=0.8,
             seed=75, hires_refiner_pass="first pass"),
    ]


def _pipes(base, refiner, sampler: str):
    sched = g.SCHEDULERS[sampler]
    txt = StableDiffusionXLPipeline(**{**base.components, "scheduler": sched(base.scheduler.config)},
                                    force_zeros_for_empty_prompt=True)
    b_i2i = StableDiffusionXLImg2ImgPipeline(**{**base.components, "scheduler": sched(base.scheduler.config)},
                                             requires_aesthetics_score=False, force_zeros_for_empty_prompt=True)
    r_i2i = StableDiffusionXLImg2ImgPipeline(**{**refiner.components, "scheduler": sched(refiner.scheduler.config)},
                                             requires_aesthetics_score=True, force_zeros_for_empty_prompt=False)
    for p in (txt, b_i2i, r_i2i):
        p.set_progress_bar_config(disable=True)
    return txt, b_i2i, r_i2i


def _decode(pipe, latents: torch.Tensor) -> Image.Image:
    with torch.no_grad():
        x = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    x = (x / 2 + 0.5).clamp(0, 1)[0].permute(1, 2, 0).numpy()
    return Image.fromarray((x * 255).round().astype(np.uint8))


def run_case(base, refiner, case: dict) -> np.ndarray:
    txt, b_i2i, r_i2i = _pipes(base, refiner, case["sampler"])
    common = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], guidance_scale=case["cfg"],
                  num_images_per_prompt=case["batch"])
    switch, steps = case["switch_at"], case["steps"]
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    first = dict(common, num_inference_steps=steps, generator=gen, output_type="latent")
    on_refiner = case["hires_refiner_pass"] in ("first pass", "both passes")
    if on_refiner:  # it takes over in the first pass (t < 200 comes in a 10-step txt2img) and stays
        lat = txt(height=case["height"], width=case["width"], denoising_end=switch, **first).images
        lat = r_i2i(image=lat, denoising_start=switch, **first).images
    else:
        lat = txt(height=case["height"], width=case["width"], **first).images
    tw, th = int(case["width"] * case["hires_scale"]) // 8 * 8, int(case["height"] * case["hires_scale"]) // 8 * 8
    if case["upscaler"] == "Latent":
        image = F.interpolate(lat, size=(th // 8, tw // 8), mode="bilinear", antialias=False)
    else:
        image = _decode(r_i2i if on_refiner else b_i2i, lat).resize((tw, th), resample=Image.Resampling.LANCZOS)
    run = case["hires_steps"] or steps
    total = int(run / min(case["hires_denoise"], 0.999))
    strength = (run + 0.5) / total  # diffusers' int(total * strength) = run: the last `run` steps
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    second = dict(common, num_inference_steps=total, generator=gen, strength=strength)
    # the pass's first timestep (diffusers' own schedule), against A1111's switch rule
    b_i2i.scheduler.set_timesteps(total)
    t0 = int(b_i2i.scheduler.timesteps[total - run])
    if on_refiner or (999 - t0) / 1000 >= switch:
        out = r_i2i(image=image, output_type="np", **second).images
    else:
        lat = b_i2i(image=image, denoising_end=switch, output_type="latent", **second).images
        out = r_i2i(image=lat, denoising_start=switch, output_type="np", **second).images
    return (out * 255).round().astype(np.uint8)


def main() -> None:
    torch.set_num_threads(1)
    if importlib.util.find_spec("open_clip") is None:
        g.write_tokenizer = r._tokenizer_from_tiny_sdxl
    xl = g.build("sdxl")
    xl.scheduler = type(xl.scheduler).from_config(g.RELEASE_SCHEDULERS["sdxl"])
    refiner = r.build_refiner(xl)
    # the rebuilt refiner must be the committed one: one of gen_refiner_refs.py's references, again
    check = next(c for c in json.loads((OUT / "refs.json").read_text()) if c["name"] == "refiner/Euler/0.8")
    got = r.run_case(xl, refiner, check, g.init_image())
    want = np.load(OUT / "refs.npz")[check["name"]]
    assert np.array_equal(got, want), f"the rebuilt base + refiner differ: max diff {np.abs(got - want).max()}"
    base = g.build("sdxl-dyn")
    base.scheduler = type(base.scheduler).from_config(g.RELEASE_SCHEDULERS["sdxl-dyn"])
    dyn = g.OUT / "tiny-sdxl-dyn"
    check = json.loads((dyn / "refs.json").read_text())[0]
    got = g.run_case(base, check, {"init_image": g.init_image(), "mask": g.mask_image()})
    want = np.load(dyn / "refs.npz")[check["name"]]
    assert np.array_equal(got, want), f"the rebuilt tiny-sdxl-dyn differs: max diff {np.abs(got - want).max()}"
    out = {}
    all_cases = cases()
    for case in all_cases:
        out[case["name"]] = run_case(base, refiner, case)
        print(case["name"], out[case["name"]].shape, float(out[case["name"]].std()))
    (OUT / "hires_refs.json").write_text(json.dumps(all_cases, indent=1) + "\n")
    np.savez_compressed(OUT / "hires_refs.npz", **out)


if __name__ == "__main__":
    main()
