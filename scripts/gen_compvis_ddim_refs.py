"""diffusers' images of A1111's DDIM img2img on tiny-sd15 (tests/data/pipelines/tiny-sd15/compvis_ddim_refs.*).

Needs torch and diffusers (/work/refvenv):

    /work/refvenv/bin/python scripts/gen_compvis_ddim_refs.py

A1111's DDIM img2img (modules/sd_samplers_timesteps.py, its cut checked against A1111's own code by
scripts/gen_a1111_timestep_refs.py) with diffusers' parts: tiny-sd15 rebuilt by scripts/gen_pipeline_refs.py (checked
against one of the folder's references first), ``DDIMScheduler.from_config`` of its scheduler, and
``torch.Generator("cpu").manual_seed(seed)`` drawn as diffusers' img2img pipeline draws it (the VAE's sample, then
the noise). A1111's timesteps are ``range(0, 1000, 1000 // length) + 1``; ``t_enc`` is ``int(strength * steps)``
(``steps - 1`` with ``img2img_fix_steps``, over the stretched ``length``); the latent is noised to
``timesteps[t_enc]`` by ``DDIMScheduler.add_noise``, then ``DDIMScheduler.step`` (eta 0) runs at
``timesteps[t_enc - 1]`` down to ``timesteps[1]``, each step landing ``1000 // length`` lower (diffusers' own
``prev_timestep``: A1111's next timestep), with the UNet under CFG; the VAE decodes the latent where it ends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pipeline_refs as g  # noqa: E402  (hides torchvision, as that script does)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import DDIMScheduler  # noqa: E402
from diffusers.utils.torch_utils import randn_tensor  # noqa: E402

FOLDER = g.OUT / "tiny-sd15"


def cases() -> list[dict]:
    base = dict(prompt=g.PROMPT, negative_prompt=g.NEGATIVE, cfg=7.0, sampler="DDIM")
    return [
        dict(base, name="a1111/20/0.5", steps=20, strength=0.5, rule="a1111", seed=91),
        dict(base, name="a1111-fix-steps/10/0.75", steps=10, strength=0.75, rule="a1111-fix-steps", seed=92),
        dict(base, name="a1111/7/1.0", steps=7, strength=1.0, rule="a1111", seed=93),
    ]


def run_case(pipe, case: dict, init: np.ndarray) -> np.ndarray:
    steps, strength = case["steps"], case["strength"]
    if case["rule"] == "a1111-fix-steps":
        length, t_enc = int(steps / min(strength, 0.999)), steps - 1
    else:
        length, t_enc = steps, int(min(strength, 0.999) * steps)
    ts = np.clip(np.arange(0, 1000, 1000 // length) + 1, 0, 999)
    sched = DDIMScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(length)
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    with torch.no_grad():
        image = pipe.image_processor.preprocess(g.Image.fromarray(init))
        latents = pipe.vae.encode(image).latent_dist.sample(gen) * pipe.vae.config.scaling_factor
        noise = randn_tensor(latents.shape, generator=gen, dtype=latents.dtype)
        x = sched.add_noise(latents, noise, torch.tensor([int(ts[t_enc])]))
        cond, uncond = pipe.encode_prompt(case["prompt"], "cpu", 1, True, case["negative_prompt"])
        embeds = torch.cat([uncond, cond])
        for index in range(t_enc - 1, 0, -1):
            t = int(ts[index])
            out = pipe.unet(torch.cat([x, x]), t, encoder_hidden_states=embeds).sample
            u, c = out.chunk(2)
            eps = u + case["cfg"] * (c - u)
            x = sched.step(eps, t, x).prev_sample
        pixels = pipe.vae.decode(x / pipe.vae.config.scaling_factor).sample
    pixels = (pixels / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    return (pixels * 255).round().astype(np.uint8)


def main() -> None:
    torch.set_num_threads(1)
    pipe = g.build("sd15")
    pipe.scheduler = type(pipe.scheduler).from_config(g.RELEASE_SCHEDULERS["sd15"])
    check = json.loads((FOLDER / "refs.json").read_text())[0]
    images = {"init_image": g.init_image(), "mask": g.mask_image()}
    got = g.run_case(pipe, check, images)
    want = np.load(FOLDER / "refs.npz")[check["name"]]
    assert np.array_equal(got, want), f"the rebuilt tiny-sd15 differs: max diff {np.abs(got - want).max()}"
    out = {"init_image": images["init_image"]}
    all_cases = cases()
    for case in all_cases:
        out[case["name"]] = run_case(pipe, case, images["init_image"])
        print(case["name"], out[case["name"]].shape, float(out[case["name"]].std()))
    (FOLDER / "compvis_ddim_refs.json").write_text(json.dumps(all_cases, indent=1) + "\n")
    np.savez_compressed(FOLDER / "compvis_ddim_refs.npz", **out)


if __name__ == "__main__":
    main()
