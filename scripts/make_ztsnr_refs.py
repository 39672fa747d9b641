"""diffusers' images of the tiny SDXL pipeline (tests/data/pipelines/tiny-sdxl) under a zero-terminal-SNR schedule.

``gen_pipeline_refs.build("sdxl")`` rebuilds the pipeline the tiny-sdxl folder was exported from (seeded); its
scheduler config gets ``rescale_betas_zero_snr: true``, ``prediction_type: v_prediction`` and ``trailing`` spacing (the
first step at t = 999, sigma = 4096 after diffusers' 2**-24), and ``run_case`` makes the txt2img images (8 steps,
CFG 7, seed 1234, 64x64) for Euler, DPM++ 2M Karras and DDIM into ``tests/data/pipelines/ztsnr_refs.npz``.

    PYTHONPATH=scripts /work/refvenv/bin/python scripts/make_ztsnr_refs.py
"""

from __future__ import annotations

from pathlib import Path

import gen_pipeline_refs as g
import numpy as np
from diffusers import EulerDiscreteScheduler
from gen_pipeline_refs import NEGATIVE, PROMPT, SIZE, build, init_image, mask_image, run_case
from transformers import CLIPTokenizer

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "pipelines" / "ztsnr_refs.npz"
FOLDER = OUT.parent / "tiny-sdxl"


def _folder_tokenizer(path: Path, pad: str) -> CLIPTokenizer:
    """The tokenizers the tiny-sdxl folder already holds (gen_pipeline_refs writes them from open_clip's vocabulary,
    which this venv lacks): tokenizer pads with <|endoftext|>, tokenizer_2 with '!'."""
    return CLIPTokenizer.from_pretrained(str(FOLDER / ("tokenizer_2" if pad == "!" else "tokenizer")))
ZTSNR = {"rescale_betas_zero_snr": True, "prediction_type": "v_prediction", "timestep_spacing": "trailing"}


def main() -> None:
    g.write_tokenizer = _folder_tokenizer
    pipe = build("sdxl")
    # the built config lists prediction_type, timestep_spacing... under _use_default_values, and from_config would
    # then keep their defaults whatever is passed: drop that list first
    config = {k: v for k, v in pipe.scheduler.config.items() if k != "_use_default_values"}
    pipe.scheduler = EulerDiscreteScheduler.from_config({**config, **ZTSNR})
    assert all(pipe.scheduler.config[k] == v for k, v in ZTSNR.items()), pipe.scheduler.config
    images = {"init_image": init_image(), "mask": mask_image()}
    refs = {}
    for sampler in ("Euler", "DPM++ 2M Karras", "DDIM"):
        case = dict(prompt=PROMPT, negative_prompt=NEGATIVE, steps=8, cfg=7.0, seed=1234, width=SIZE, height=SIZE,
                    batch=1, clip_skip=None, mode="txt2img", sampler=sampler, name=f"txt2img/{sampler}")
        refs[case["name"]] = run_case(pipe, case, images)  # run_case: the sampler's scheduler from_config of this one
        print(sampler, refs[case["name"]].shape, float(refs[case["name"]].std()))
    np.savez_compressed(OUT, **refs)


if __name__ == "__main__":
    main()
