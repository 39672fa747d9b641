"""diffusers' images with ``guidance_rescale`` (CFG rescale), for tests/pipelines/test_pipelines_schedule.py.

The tiny folders' pipelines are rebuilt (seeded) as ``gen_pipeline_refs.build`` made them: tiny-sdxl under the
zero-terminal-SNR v-prediction schedule of scripts/make_ztsnr_refs.py (where a rescale is meant to be used) with
Euler, DPM++ 2M Karras and DDIM, and tiny-sd15 (epsilon) with Euler and Euler a; 8 steps, CFG 7, seed 1234, 64x64,
``guidance_rescale=0.7`` -> ``tests/data/pipelines/rescale_refs.npz``.

    PYTHONPATH=scripts /work/refvenv/bin/python scripts/make_rescale_refs.py
"""

from __future__ import annotations

from pathlib import Path

import gen_pipeline_refs as g
import numpy as np
from diffusers import EulerDiscreteScheduler
from gen_pipeline_refs import NEGATIVE, PROMPT, SIZE, build, init_image, mask_image, run_case
from make_ztsnr_refs import ZTSNR
from transformers import CLIPTokenizer

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "pipelines"
OUT = DATA / "rescale_refs.npz"
RESCALE = 0.7


def main() -> None:
    refs = {}
    images = {"init_image": init_image(), "mask": mask_image()}
    for kind, samplers in (("sdxl", ("Euler", "DPM++ 2M Karras", "DDIM")), ("sd15", ("Euler", "Euler a"))):
        folder = DATA / f"tiny-{kind}"
        # the tokenizers the folder holds (gen_pipeline_refs writes them from open_clip's vocabulary)
        g.write_tokenizer = lambda path, pad, f=folder: CLIPTokenizer.from_pretrained(
            str(f / ("tokenizer_2" if pad == "!" else "tokenizer")))
        pipe = build(kind)
        if kind == "sdxl":
            config = {k: v for k, v in pipe.scheduler.config.items() if k != "_use_default_values"}
            pipe.scheduler = EulerDiscreteScheduler.from_config({**config, **ZTSNR})
        for sampler in samplers:
            case = dict(prompt=PROMPT, negative_prompt=NEGATIVE, steps=8, cfg=7.0, seed=1234, width=SIZE, height=SIZE,
                        batch=1, clip_skip=None, mode="txt2img", sampler=sampler, guidance_rescale=RESCALE)
            name = f"{kind}/{sampler}"
            refs[name] = run_case(pipe, case, images)
            plain = run_case(pipe, {**case, "guidance_rescale": 0.0}, images)
            print(name, refs[name].shape, "levels moved by the rescale:",
                  int(np.abs(refs[name].astype(int) - plain).max()))
    np.savez_compressed(OUT, **refs)


if __name__ == "__main__":
    main()
