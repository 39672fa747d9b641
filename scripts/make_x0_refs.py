"""diffusers' images of an x0-prediction SDXL UNet, for tests/checkpoint/test_x0_prediction.py.

SDXL-Lightning's 1-step UNet (``sdxl_lightning_1step_unet_x0.safetensors``) predicts the denoised sample; ByteDance's
model card runs it with ``EulerDiscreteScheduler.from_config(pipe.scheduler.config, timestep_spacing="trailing",
prediction_type="sample")``, one step, ``guidance_scale=0``. The same on tiny-sdxl's architecture (rebuilt, seeded, as
``gen_pipeline_refs.build`` made it; its random UNet stands in for the distilled one: the arithmetic is the test):
one step without CFG as the card does, and 4 steps with CFG 5 for Euler, DPM++ 2M Karras and DDIM made from
that scheduler's config (``from_config``, as users switch schedulers; diffusers' Euler a has no "sample"), prompt ``PROMPT``, negative "blurry", seed 7,
64x64 -> ``tests/data/pipelines/x0_refs.npz`` (``<sampler>/<steps>``: uint8 images).

    PYTHONPATH=scripts /work/refvenv/bin/python scripts/make_x0_refs.py
"""

from __future__ import annotations

from pathlib import Path

import gen_pipeline_refs as g
import numpy as np
from diffusers import EulerDiscreteScheduler
from gen_pipeline_refs import build, init_image, mask_image, run_case
from transformers import CLIPTokenizer

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "pipelines"
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"
CASES = [("Euler", 1, 1.0), ("Euler", 4, 5.0), ("DPM++ 2M Karras", 4, 5.0), ("DDIM", 4, 5.0)]


def main() -> None:
    folder = DATA / "tiny-sdxl"
    g.write_tokenizer = lambda path, pad: CLIPTokenizer.from_pretrained(
        str(folder / ("tokenizer_2" if pad == "!" else "tokenizer")))
    pipe = build("sdxl")
    pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config, timestep_spacing="trailing",
                                                        prediction_type="sample")
    images = {"init_image": init_image(), "mask": mask_image()}
    refs = {}
    for sampler, steps, cfg in CASES:
        case = dict(prompt=PROMPT, negative_prompt="blurry" if cfg > 1 else None, steps=steps, cfg=cfg, seed=7,
                    width=64, height=64, batch=1, clip_skip=None, mode="txt2img", sampler=sampler)
        refs[f"{sampler}/{steps}"] = run_case(pipe, case, images)
        print(sampler, steps, refs[f"{sampler}/{steps}"].shape)
    np.savez_compressed(DATA / "x0_refs.npz", **refs)


if __name__ == "__main__":
    main()
