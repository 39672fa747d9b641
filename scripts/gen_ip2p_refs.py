"""A tiny InstructPix2Pix model (SD 1.x with an 8-channel UNet) in the three forms people hold it, and diffusers'
``StableDiffusionInstructPix2PixPipeline`` images for sdrt to match.

    PYTHONPATH=scripts:scripts/_tvblock:core/src /work/refvenv/bin/python scripts/gen_ip2p_refs.py [--cosxl]

The model is ``gen_pipeline_refs.build("sd15")``'s text encoder and VAE with ``tiny_unet(in_channels=8)`` (random
weights, every one a float16 value so the fp16 single file holds them exactly) and timbrooks/instruct-pix2pix's
scheduler (``EulerAncestralDiscreteScheduler``, scaled_linear, epsilon).

- ``tests/data/pipelines/tiny-sd15-ip2p``: the ONNX folder (Optimum's layout: ``unet/model.onnx`` takes an
  8-channel ``sample``), with ``refs.json`` (the cases) and ``refs.npz`` (diffusers' images and the input image).
- ``tests/data/ckpt/sd1-ip2p/diffusers``: the diffusers folder (``model_index.json`` naming
  ``StableDiffusionInstructPix2PixPipeline``, safetensors weights).
- ``tests/data/ckpt/sd1-ip2p/instruct-pix2pix-tiny.safetensors``: the layout of
  ``instruct-pix2pix-00-22000.safetensors``: ``model.diffusion_model.*`` (``input_blocks.0.0.weight`` 8 channels
  wide), ``cond_stage_model.transformer.*``, ``first_stage_model.*``, fp16. diffusers' ``from_single_file`` reads
  the UNet and VAE back equal (checked here).

``--cosxl``: CosXL Edit, ``tests/data/pipelines/tiny-sdxl-ip2p``: ``gen_pipeline_refs.build("sdxl")``'s encoders and
VAE with ``tiny_unet(in_channels=8, xl=True)``, CosXL's EDM v-prediction scheduler (``EDMEulerScheduler``, sigma_data 1,
0.002..120: sdrt's release data for ``edm_vpred`` keys), run by ``StableDiffusionXLInstructPix2PixPipeline`` with
``is_cosxl_edit=True`` (the picture's latent scaled), starting from ``noise * sigma_max`` as make_edm_refs.py does.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_pipeline_refs as gp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    AutoencoderKL,
    EDMEulerScheduler,
    EulerAncestralDiscreteScheduler,
    StableDiffusionInstructPix2PixPipeline,
    StableDiffusionXLInstructPix2PixPipeline,
    UNet2DConditionModel,
)
from gen_checkpoint_data import assert_same, half, unet_to_ldm, vae_to_ldm  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FOLDER = gp.OUT / "tiny-sd15-ip2p"
FILES = ROOT / "tests" / "data" / "ckpt" / "sd1-ip2p"
LDM = FILES / "instruct-pix2pix-tiny.safetensors"
#: timbrooks/instruct-pix2pix scheduler/scheduler_config.json
SCHEDULER = {"_class_name": "EulerAncestralDiscreteScheduler", "_diffusers_version": "0.12.0.dev0",
             "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
             "num_train_timesteps": 1000, "prediction_type": "epsilon", "set_alpha_to_one": False,
             "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None}
PROMPT = "turn it into a watercolor painting"


def build() -> StableDiffusionInstructPix2PixPipeline:
    base = gp.build("sd15")
    torch.manual_seed(0)
    unet = gp.tiny_unet(in_channels=8).eval()
    gp.scale_weights(unet, 3)
    gp.fp16_exact(base.text_encoder, unet, base.vae)
    pipe = StableDiffusionInstructPix2PixPipeline(
        vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer, unet=unet,
        scheduler=EulerAncestralDiscreteScheduler.from_config(SCHEDULER), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    pipe.tokenizer_dir = base.tokenizer_dir
    return pipe


def cases() -> list[dict]:
    base = dict(prompt=PROMPT, negative_prompt="", steps=8, cfg=7.5, image_cfg=1.5, seed=1234, batch=1,
                sampler="Euler a")
    out = [dict(base, name="Euler a")]
    for s in ("Euler", "DDIM", "DPM++ 2M Karras"):
        out.append(dict(base, name=s, sampler=s, seed=7))
    out.append(dict(base, name="Euler a/image cfg 1", image_cfg=1.0, seed=21))
    out.append(dict(base, name="Euler/image cfg 2.5/negative", sampler="Euler", image_cfg=2.5,
                    negative_prompt="blurry, low quality", seed=22))
    out.append(dict(base, name="Euler/cfg 1", sampler="Euler", cfg=1.0, seed=23))  # no guidance at all
    out.append(dict(base, name="Euler a/batch2", batch=2, seed=42))
    return out


def run_case(pipe, case: dict, image: np.ndarray) -> np.ndarray:
    sched = gp.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
    p = StableDiffusionInstructPix2PixPipeline(**{**pipe.components, "scheduler": sched})
    p.set_progress_bar_config(disable=True)
    result = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"] or None, image=Image.fromarray(image),
               num_inference_steps=case["steps"], guidance_scale=case["cfg"],
               image_guidance_scale=case["image_cfg"], num_images_per_prompt=case["batch"],
               generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
    return (result.images * 255).round().astype(np.uint8)


def write_files(pipe) -> None:
    if FILES.exists():
        shutil.rmtree(FILES)
    FILES.mkdir(parents=True)
    pipe.save_pretrained(FILES / "diffusers", safe_serialization=True)
    (FILES / "diffusers" / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER, indent=2) + "\n")
    has_attn_up = ["CrossAttn" in t for t in pipe.unet.config.up_block_types]
    ck = {}
    ck.update(unet_to_ldm(pipe.unet.state_dict(), has_attn_up))
    ck.update(vae_to_ldm(pipe.vae.state_dict(), len(pipe.vae.config.up_block_types)))
    te = {("text_model." + k if not k.startswith("text_model.") else k): v
          for k, v in pipe.text_encoder.state_dict().items()}
    ck.update({"cond_stage_model.transformer." + k: v for k, v in te.items()})
    ck = half(ck)
    assert tuple(ck["model.diffusion_model.input_blocks.0.0.weight"].shape[:2]) == (8, 8)
    save_file(ck, str(LDM))
    with tempfile.TemporaryDirectory() as tmp:  # diffusers' own converter reads the file back
        pipe.unet.save_pretrained(f"{tmp}/unet")
        pipe.vae.save_pretrained(f"{tmp}/vae")
        unet_l = UNet2DConditionModel.from_single_file(str(LDM), config=tmp, subfolder="unet",
                                                       local_files_only=True).float().eval()
        vae_l = AutoencoderKL.from_single_file(str(LDM), config=tmp, subfolder="vae",
                                               local_files_only=True).float().eval()
    assert_same(unet_l.state_dict(), pipe.unet.state_dict(), "ip2p unet single-file")
    assert_same(vae_l.state_dict(), pipe.vae.state_dict(), "ip2p vae single-file")


XL_FOLDER = gp.OUT / "tiny-sdxl-ip2p"
RELEASE = json.loads((ROOT / "core" / "src" / "sdrt" / "data" / "release" / "families.json").read_text())
COSXL = {**RELEASE["sdxl"]["edm"]["edm_vpred.sigma_max"]["scheduler"]}


def build_cosxl() -> StableDiffusionXLInstructPix2PixPipeline:
    base = gp.build("sdxl")
    torch.manual_seed(0)
    unet = gp.tiny_unet(in_channels=8, xl=True, cross=64).eval()
    gp.scale_weights(unet, 5)
    gp.fp16_exact(base.text_encoder, base.text_encoder_2, unet, base.vae)
    pipe = StableDiffusionXLInstructPix2PixPipeline(
        vae=base.vae, text_encoder=base.text_encoder, text_encoder_2=base.text_encoder_2, tokenizer=base.tokenizer,
        tokenizer_2=base.tokenizer_2, unet=unet, scheduler=EDMEulerScheduler.from_config(COSXL),
        force_zeros_for_empty_prompt=True, is_cosxl_edit=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.tokenizer_dir = base.tokenizer_dir
    return pipe


def cosxl_cases() -> list[dict]:
    base = dict(prompt=PROMPT, negative_prompt="blurry, low quality", steps=8, cfg=5.0, image_cfg=1.5, seed=1234,
                batch=1, sampler="Euler Exponential", sigma_schedule="exponential")
    return [dict(base, name="cosxl/Euler Exponential"),
            dict(base, name="cosxl/Euler Karras/image cfg 2", sampler="Euler Karras", sigma_schedule="karras",
                 image_cfg=2.0, seed=5)]


def run_cosxl(pipe, case: dict, image: np.ndarray) -> np.ndarray:
    sched = EDMEulerScheduler.from_config({**COSXL, "sigma_schedule": case["sigma_schedule"]})
    p = StableDiffusionXLInstructPix2PixPipeline(**{**pipe.components, "scheduler": sched},
                                                 force_zeros_for_empty_prompt=True, is_cosxl_edit=True)
    p.set_progress_bar_config(disable=True)
    g = torch.Generator("cpu").manual_seed(case["seed"])
    f = gp.SIZE // 8
    noise = torch.randn((case["batch"], 4, f, f), generator=g, dtype=torch.float32)
    result = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=Image.fromarray(image),
               num_inference_steps=case["steps"], guidance_scale=case["cfg"], image_guidance_scale=case["image_cfg"],
               num_images_per_prompt=case["batch"], height=gp.SIZE, width=gp.SIZE, generator=g,
               latents=noise * (sched.config.sigma_max / sched.init_noise_sigma), output_type="np")
    return (result.images * 255).round().astype(np.uint8)


def main_cosxl() -> None:
    pipe = build_cosxl()
    saved = gp.RELEASE_SCHEDULERS["sdxl-inpaint"]
    gp.RELEASE_SCHEDULERS["sdxl-inpaint"] = {"_class_name": "EDMEulerScheduler", **COSXL}
    try:  # the SDXL export (float scalar timestep, text_embeds and time_ids), with CosXL's scheduler config
        gp.export(pipe, "sdxl-inpaint", XL_FOLDER)
    finally:
        gp.RELEASE_SCHEDULERS["sdxl-inpaint"] = saved
    image = gp.init_image()
    refs = {"init_image": image}
    cases = cosxl_cases()
    for case in cases:
        refs[case["name"]] = run_cosxl(pipe, case, image)
        print(case["name"], refs[case["name"]].shape, float(refs[case["name"]].std()))
    (XL_FOLDER / "refs.json").write_text(json.dumps(cases, indent=1) + "\n")
    np.savez_compressed(XL_FOLDER / "refs.npz", **refs)
    print(XL_FOLDER, sum(f.stat().st_size for f in XL_FOLDER.rglob("*") if f.is_file()))


def main() -> None:
    torch.set_num_threads(1)
    if "--cosxl" in sys.argv:
        main_cosxl()
        return
    gp.RELEASE_SCHEDULERS["sd15-ip2p"] = SCHEDULER
    pipe = build()
    write_files(pipe)
    gp.export(pipe, "sd15-ip2p", FOLDER)
    image = gp.init_image()
    refs = {"init_image": image}
    all_cases = cases()
    for case in all_cases:
        refs[case["name"]] = run_case(pipe, case, image)
        print(case["name"], refs[case["name"]].shape, float(refs[case["name"]].std()))
    (FOLDER / "refs.json").write_text(json.dumps(all_cases, indent=1) + "\n")
    np.savez_compressed(FOLDER / "refs.npz", **refs)
    for d in (FOLDER, FILES):
        print(d, sum(f.stat().st_size for f in d.rglob("*") if f.is_file()))


if __name__ == "__main__":
    main()
