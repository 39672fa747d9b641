"""Two tiny SD 1.x folders with dynamic sizes, and diffusers' images of the hires fix run across them (A1111's
``hr_checkpoint_name``): the first pass on one model, the second on the other.

Needs torch and diffusers (/work/refvenv); the tests read only what this writes:

    /work/refvenv/bin/python scripts/gen_hires_checkpoint_refs.py
    # tests/data/pipelines/tiny-sd15-dyn/, tiny-sd15-dyn-b/, tiny-sd15-dyn-b/hires_refs.{json,npz}

``tiny-sd15-dyn`` is tiny-sd15's model (scripts/gen_pipeline_refs.py's ``build("sd15")``, the same weights) exported
with dynamic height and width on the UNet and the VAE; ``tiny-sd15-dyn-b`` is the same architecture with its text
encoder, UNet and VAE drawn again from other seeds, so a picture shows which model's text encoder, UNet and VAE ran.
Each case is A1111's txt2img with ``enable_hr`` and ``hr_checkpoint_name`` = the B model, written with diffusers'
pipelines and ``torch.Generator("cpu").manual_seed(seed)``, composed as scripts/gen_refiner_hires_refs.py composes
its hires cases:

1. the first pass at 64x64 on A: ``StableDiffusionPipeline(output_type="latent")``;
2. the upscale: ``Latent``: ``torch.nn.functional.interpolate(latents, mode="bilinear")`` to the target's latent
   size; ``Lanczos``: decoded by A's VAE (A1111 decodes before it reloads; rounded to uint8 as sdrt's images are),
   resized with Pillow's Lanczos, then encoded by B's img2img pipeline;
3. the hires pass on B with a fresh generator of the same seed (A1111 makes a new ImageRNG):
   ``StableDiffusionImg2ImgPipeline`` of B at the target size over ``int(hires_steps / denoise)`` steps, running the
   last ``hires_steps`` (``strength`` picks that tail), the (hires) prompts encoded by B's text encoder, B's VAE
   decoding.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pipeline_refs as g  # noqa: E402  (hides torchvision, as that script does)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionPipeline  # noqa: E402
from PIL import Image  # noqa: E402

A_DIR = g.OUT / "tiny-sd15-dyn"
B_DIR = g.OUT / "tiny-sd15-dyn-b"


def cases() -> list[dict]:
    base = dict(prompt=g.PROMPT, negative_prompt=g.NEGATIVE, steps=8, cfg=7.0, batch=1, width=64, height=64,
                hires_scale=2, hires_steps=4, hires_denoise=0.5, hires_prompt=None, hires_negative_prompt=None)
    return [
        dict(base, name="Latent/Euler", sampler="Euler", upscaler="Latent", seed=81),
        dict(base, name="Lanczos/Euler", sampler="Euler", upscaler="Lanczos", seed=82),
        dict(base, name="Lanczos/Euler/hires prompt", sampler="Euler", upscaler="Lanczos", seed=83,
             hires_prompt="a watercolour of a dog in the snow", hires_negative_prompt="ugly", width=64, height=96,
             hires_denoise=0.6, hires_steps=3),
    ]


def build_b():
    pipe = g.build("sd15")
    g.scale_weights(pipe.text_encoder, 21)
    g.scale_weights(pipe.unet, 23)
    g.scale_weights(pipe.vae, 24)
    return pipe


def export_dyn(pipe, out: Path) -> None:
    """gen_pipeline_refs.export for SD 1.x, with dynamic height and width axes on the UNet and the VAE."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    pipe.save_pretrained(out / "_torch", safe_serialization=True)
    tmp = out / "_torch"
    (out / "scheduler").mkdir()
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(g.RELEASE_SCHEDULERS["sd15"], indent=2) + "\n")
    pipe.scheduler = type(pipe.scheduler).from_pretrained(out / "scheduler")
    shutil.copytree(pipe.tokenizer_dir["tokenizer"], out / "tokenizer")
    batch = {0: "batch"}
    ids = torch.zeros((1, 77), dtype=torch.int32)
    hidden = [f"hidden_states.{i}" for i in range(pipe.text_encoder.config.num_hidden_layers + 1)]
    g._export(g._Text(pipe.text_encoder, False), (ids,), out / "text_encoder" / "model.onnx", ["input_ids"],
              ["last_hidden_state", "pooler_output", *hidden],
              {n: batch for n in ["input_ids", "last_hidden_state", "pooler_output", *hidden]})
    shutil.copy(tmp / "text_encoder" / "config.json", out / "text_encoder" / "config.json")
    lat = g.SIZE // 8
    image_axes = {0: "batch_size", 2: "height", 3: "width"}
    latent_axes = {0: "batch_size", 2: "height_latent", 3: "width_latent"}
    sample = torch.randn(2, 4, lat, lat + 4)  # traced non-square, so no height is taken for a width
    cond = torch.randn(2, 77, pipe.unet.config.cross_attention_dim)
    ts = torch.tensor([999, 999], dtype=torch.float32)
    g._export(g._Unet(pipe.unet, False), (sample, ts, cond), out / "unet" / "model.onnx",
              ["sample", "timestep", "encoder_hidden_states"], ["out_sample"],
              {"sample": image_axes, "timestep": batch, "encoder_hidden_states": {0: "batch", 1: "sequence"},
               "out_sample": image_axes}, external=True)
    shutil.copy(tmp / "unet" / "config.json", out / "unet" / "config.json")
    g._export(g._VaeEncoder(pipe.vae), (torch.randn(1, 3, lat * 8, (lat + 4) * 8),), out / "vae_encoder" / "model.onnx",
              ["sample"], ["latent_parameters"], {"sample": image_axes, "latent_parameters": latent_axes})
    g._export(g._VaeDecoder(pipe.vae), (torch.randn(1, 4, lat, lat + 4),), out / "vae_decoder" / "model.onnx",
              ["latent_sample"], ["sample"], {"latent_sample": latent_axes, "sample": image_axes})
    for part in ("vae_encoder", "vae_decoder"):
        shutil.copy(tmp / "vae" / "config.json", out / part / "config.json")
    index = g.optimum_model_index(json.loads((tmp / "model_index.json").read_text()))
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.rmtree(tmp)


def _decode(pipe, latents: torch.Tensor) -> Image.Image:
    with torch.no_grad():
        x = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    x = (x / 2 + 0.5).clamp(0, 1)[0].permute(1, 2, 0).numpy()
    return Image.fromarray((x * 255).round().astype(np.uint8))


def run_case(a, b, case: dict) -> np.ndarray:
    sched = g.SCHEDULERS[case["sampler"]]
    txt = StableDiffusionPipeline(**{**a.components, "scheduler": sched(a.scheduler.config)})
    i2i = StableDiffusionImg2ImgPipeline(**{**b.components, "scheduler": sched(b.scheduler.config)})
    for p in (txt, i2i):
        p.set_progress_bar_config(disable=True)
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    lat = txt(prompt=case["prompt"], negative_prompt=case["negative_prompt"], guidance_scale=case["cfg"],
              num_inference_steps=case["steps"], generator=gen, height=case["height"], width=case["width"],
              output_type="latent").images
    tw, th = int(case["width"] * case["hires_scale"]) // 8 * 8, int(case["height"] * case["hires_scale"]) // 8 * 8
    if case["upscaler"] == "Latent":
        image = F.interpolate(lat, size=(th // 8, tw // 8), mode="bilinear", antialias=False)
    else:
        image = _decode(txt, lat).resize((tw, th), resample=Image.Resampling.LANCZOS)
    run = case["hires_steps"] or case["steps"]
    total = int(run / min(case["hires_denoise"], 0.999))
    strength = (run + 0.5) / total  # diffusers' int(total * strength) = run: the last `run` steps
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    out = i2i(image=image, prompt=case["hires_prompt"] or case["prompt"],
              negative_prompt=case["hires_negative_prompt"] or case["negative_prompt"], guidance_scale=case["cfg"],
              num_inference_steps=total, generator=gen, strength=strength, output_type="np").images
    return (out * 255).round().astype(np.uint8)


def main() -> None:
    torch.set_num_threads(1)
    a = g.build("sd15")
    export_dyn(a, A_DIR)
    b = build_b()
    export_dyn(b, B_DIR)
    out = {}
    all_cases = cases()
    for case in all_cases:
        out[case["name"]] = run_case(a, b, case)
        print(case["name"], out[case["name"]].shape, float(out[case["name"]].std()))
    (B_DIR / "hires_refs.json").write_text(json.dumps(all_cases, indent=1) + "\n")
    np.savez_compressed(B_DIR / "hires_refs.npz", **out)
    for d in (A_DIR, B_DIR):
        print(d.name, sum(f.stat().st_size for f in d.rglob("*") if f.is_file()))


if __name__ == "__main__":
    main()
