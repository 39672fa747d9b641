"""diffusers' images of the tiny SDXL pipeline (tests/data/pipelines/tiny-sdxl) trained-as-EDM: Playground v2.5 and CosXL.

``gen_pipeline_refs.build("sdxl")`` rebuilds the seeded pipeline tiny-sdxl was exported from. Two EDM set-ups:

- ``playground``: the Playground v2.5 release's ``EDMDPMSolverMultistepScheduler`` config (sdrt's release data,
  ``families.json`` ``sdxl.edm.edm_mean``: sigma 0.002..80, sigma_data 0.5, epsilon) and a VAE config with
  ``scaling_factor`` 0.5 and ``latents_mean`` / ``latents_std`` (values for the tiny VAE, not the release's: its random
  decoder saturates on Playground's spread). Cases: txt2img with ``EDMDPMSolverMultistepScheduler`` (sdrt's
  "DPM++ 2M Karras") and ``EDMEulerScheduler`` (karras sigmas: "Euler Karras"), and img2img at strength 0.6 with the
  DPM-Solver (``StableDiffusionXLImg2ImgPipeline``: the encoder's latents normalized by the stats).
- ``cosxl``: ``EDMEulerScheduler`` with v-prediction, sigma_data 1.0, sigma 0.002..120, exponential sigmas (CosXL's
  ``edm_vpred`` keys as ComfyUI reads them): "Euler Exponential"; the tiny VAE's own scaling.

8 steps, CFG 5, seed 1234, 64x64, the prompts of gen_pipeline_refs. txt2img starts from ``noise * sigma_max``, as
k-diffusion, ComfyUI and A1111 start (the pipeline's own ``randn`` draw, passed as ``latents`` divided by
``init_noise_sigma``, which diffusers' EDM schedulers set to ``sqrt(sigma_max^2 + 1)``; sdrt follows ComfyUI). Writes ``tests/data/pipelines/edm_refs.npz`` (the
images) and ``edm_refs.json`` (the scheduler and VAE configs and the cases, which the tests apply to a copy of
tiny-sdxl; diffusers' EDM preconditioning at a few sigmas, and its schedulers' sigmas and timesteps).

    PYTHONPATH=scripts /work/refvenv/bin/python scripts/make_edm_refs.py
"""

from __future__ import annotations

import json
from pathlib import Path

import gen_pipeline_refs as g
import numpy as np
import torch
from diffusers import EDMDPMSolverMultistepScheduler, EDMEulerScheduler, StableDiffusionXLImg2ImgPipeline
from gen_pipeline_refs import NEGATIVE, PROMPT, SIZE, build, init_image
from PIL import Image
from transformers import CLIPTokenizer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "pipelines" / "edm_refs.npz"
FOLDER = OUT.parent / "tiny-sdxl"
RELEASE = json.loads((ROOT / "core" / "src" / "sdrt" / "data" / "release" / "families.json").read_text())

PLAYGROUND = RELEASE["sdxl"]["edm"]["edm_mean"]["scheduler"]
#: the tiny VAE's latent stats (Playground's own: mean -1.66..2.52, std 5.2..8.5, spread a random decoder to 0 / 255)
PLAYGROUND_VAE = {"scaling_factor": 0.5, "latents_mean": [0.3, -0.2, 0.15, -0.4], "latents_std": [1.6, 0.7, 1.2, 2.1]}
COSXL = {**RELEASE["sdxl"]["edm"]["edm_vpred.sigma_max"]["scheduler"], "sigma_schedule": "exponential"}

CASES = [
    {"model": "playground", "mode": "txt2img", "sampler": "DPM++ 2M Karras"},
    {"model": "playground", "mode": "txt2img", "sampler": "Euler Karras"},
    {"model": "playground", "mode": "img2img", "sampler": "DPM++ 2M Karras", "strength": 0.6},
    {"model": "cosxl", "mode": "txt2img", "sampler": "Euler Exponential"},
]
COMMON = {"steps": 8, "cfg": 5.0, "seed": 1234, "width": SIZE, "height": SIZE}


def _folder_tokenizer(path: Path, pad: str) -> CLIPTokenizer:
    """The tokenizers the tiny-sdxl folder holds (as scripts/make_ztsnr_refs.py reads them)."""
    return CLIPTokenizer.from_pretrained(str(FOLDER / ("tokenizer_2" if pad == "!" else "tokenizer")))


def scheduler(case: dict):
    if case["model"] == "cosxl":
        return EDMEulerScheduler.from_config(COSXL)
    if case["sampler"] == "Euler Karras":
        return EDMEulerScheduler(sigma_min=PLAYGROUND["sigma_min"], sigma_max=PLAYGROUND["sigma_max"],
                                 sigma_data=PLAYGROUND["sigma_data"], prediction_type="epsilon", sigma_schedule="karras")
    return EDMDPMSolverMultistepScheduler.from_config(PLAYGROUND)


def run(base, case: dict) -> np.ndarray:
    vae = base.vae
    if case["model"] == "playground":
        vae.register_to_config(**PLAYGROUND_VAE)
    comps = {**base.components, "scheduler": scheduler(case), "vae": vae}
    common = dict(prompt=PROMPT, negative_prompt=NEGATIVE, num_inference_steps=COMMON["steps"],
                  guidance_scale=COMMON["cfg"], generator=torch.Generator("cpu").manual_seed(COMMON["seed"]),
                  output_type="np")
    if case["mode"] == "img2img":
        p = StableDiffusionXLImg2ImgPipeline(**comps, requires_aesthetics_score=False, force_zeros_for_empty_prompt=True)
        p.set_progress_bar_config(disable=True)
        out = p(image=Image.fromarray(init_image()), strength=case["strength"], **common)
    else:
        p = type(base)(**comps)
        p.set_progress_bar_config(disable=True)
        # the start k-diffusion, ComfyUI and A1111 take, noise * sigma_max: diffusers' EDM schedulers multiply by
        # init_noise_sigma = sqrt(sigma_max^2 + 1) (80.006 for 80), which moves 0.5-0.7% of the values by one level
        sched = comps["scheduler"]
        f = SIZE // 8
        noise = torch.randn((1, 4, f, f), generator=common["generator"], dtype=torch.float32)
        common["latents"] = noise * (sched.config.sigma_max / sched.init_noise_sigma)
        out = p(height=COMMON["height"], width=COMMON["width"], **common)
    vae.register_to_config(scaling_factor=0.13025, latents_mean=None, latents_std=None)  # tiny-sdxl's own again
    return (out.images * 255).round().astype(np.uint8)


def preconditioning() -> list[dict]:
    """diffusers' EDM arithmetic at a few sigmas, for eps (sigma_data 0.5) and v (sigma_data 1.0): the scaled input
    (c_in x), the timestep (c_noise) and the denoised estimate (c_skip x + c_out F) of fixed x and F."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 2, 2)).astype(np.float32)
    f = rng.standard_normal((1, 4, 2, 2)).astype(np.float32)
    rows = []
    for pred, sd in (("epsilon", 0.5), ("v_prediction", 1.0)):
        sched = EDMEulerScheduler(sigma_data=sd, prediction_type=pred)
        for sigma in (0.002, 0.3, 2.5, 80.0, 120.0):
            s = torch.tensor(sigma, dtype=torch.float64)
            rows.append({"prediction_type": pred, "sigma_data": sd, "sigma": sigma, "x": x.tolist(), "output": f.tolist(),
                         "scaled": sched.precondition_inputs(torch.from_numpy(x).double(), s).numpy().tolist(),
                         "timestep": float(sched.precondition_noise(s)),
                         "denoised": sched.precondition_outputs(torch.from_numpy(x).double(), torch.from_numpy(f).double(),
                                                                s).numpy().tolist()})
    return rows


def schedules() -> list[dict]:
    """The sigmas and timesteps diffusers' EDM schedulers set for 8 and 20 steps."""
    rows = []
    for label, make in (("DPM++ 2M Karras", lambda: EDMDPMSolverMultistepScheduler.from_config(PLAYGROUND)),
                        ("Euler Karras", lambda: scheduler({"model": "playground", "sampler": "Euler Karras"})),
                        ("Euler Exponential", lambda: EDMEulerScheduler.from_config(COSXL))):
        for steps in (8, 20):
            sched = make()
            sched.set_timesteps(steps)
            rows.append({"sampler": label, "steps": steps,
                         "config": {**dict(sched.config), "_class_name": type(sched).__name__},
                         "sigmas": [float(v) for v in sched.sigmas], "timesteps": [float(v) for v in sched.timesteps]})
    return rows


def main() -> None:
    g.write_tokenizer = _folder_tokenizer
    base = build("sdxl")
    refs = {}
    for case in CASES:
        name = f"{case['model']}/{case['mode']}/{case['sampler']}"
        refs[name] = run(base, case)
        print(name, refs[name].shape, float(refs[name].std()), float(refs[name].mean()))
    np.savez_compressed(OUT, **refs)
    OUT.with_suffix(".json").write_text(json.dumps({
        "playground": {"scheduler": PLAYGROUND, "vae": PLAYGROUND_VAE}, "cosxl": {"scheduler": COSXL},
        "common": {**COMMON, "prompt": PROMPT, "negative_prompt": NEGATIVE}, "cases": CASES,
        "preconditioning": preconditioning(), "schedules": schedules()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
