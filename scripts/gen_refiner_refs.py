"""A tiny SDXL refiner folder and diffusers' images from it, alone (img2img) and after tiny-sdxl (base + refiner).

Needs torch and diffusers (/work/refvenv); the tests read only what this writes:

    /work/refvenv/bin/python scripts/gen_refiner_refs.py        # tests/data/pipelines/tiny-sdxl-refiner

The refiner is built as stabilityai/stable-diffusion-xl-refiner-1.0 is, at tiny widths: a UNet whose
``time_ids`` hold 5 values (original size, crop, aesthetic score: ``projection_class_embeddings_input_dim`` =
5 x 8 + 32 pooled), its context the CLIP-G encoder's penultimate layer alone (``cross_attention_dim`` 32, the
encoder's width), and tiny-sdxl's own second text encoder and VAE, as the release shares CLIP-G and the VAE
with the base. ``model_index.json`` says ``requires_aesthetics_score: true`` and ``force_zeros_for_empty_prompt:
false``, as the release's does. Exported in Optimum's layout (``text_encoder_2``, ``unet`` with dynamic batch,
height and width, ``vae_encoder``, ``vae_decoder``) by scripts/gen_pipeline_refs.py's exporter pieces.

References (``refs.json``, ``refs.npz``), ``torch.Generator("cpu").manual_seed(seed)``:

- ``img2img/...``: ``StableDiffusionXLImg2ImgPipeline`` with ``requires_aesthetics_score=True`` (aesthetic score
  6.0, negative 2.5) from the 64x64 init image of tiny-sdxl's references;
- ``refiner/...``: diffusers' ensemble of experts: ``StableDiffusionXLPipeline`` (tiny-sdxl, rebuilt here and
  checked against one of tiny-sdxl's own reference images first) with ``denoising_end=switch`` and
  ``output_type="latent"``, then the refiner's img2img pipeline with ``denoising_start=switch`` on those latents,
  one generator passed to both (so Euler a's ancestral noise continues one stream, as in one sampler run).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pipeline_refs as g  # noqa: E402  (hides torchvision, as that script does)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline, UNet2DConditionModel  # noqa: E402
from PIL import Image  # noqa: E402

OUT = g.OUT / "tiny-sdxl-refiner"
BASE = g.OUT / "tiny-sdxl"


def build_refiner(base: StableDiffusionXLPipeline) -> StableDiffusionXLImg2ImgPipeline:
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=g.SIZE // 8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, norm_num_groups=8, attention_head_dim=(2, 4), addition_embed_type="text_time",
        addition_time_embed_dim=8, projection_class_embeddings_input_dim=5 * 8 + 32, use_linear_projection=True,
        transformer_layers_per_block=(1, 2)).eval()
    g.scale_weights(unet, 5)
    pipe = StableDiffusionXLImg2ImgPipeline(vae=base.vae, text_encoder=None, text_encoder_2=base.text_encoder_2,
                                            tokenizer=None, tokenizer_2=base.tokenizer_2, unet=unet,
                                            scheduler=base.scheduler, requires_aesthetics_score=True,
                                            force_zeros_for_empty_prompt=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def export(pipe: StableDiffusionXLImg2ImgPipeline, tokenizer_2: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tmp = out / "_torch"
    pipe.save_pretrained(tmp, safe_serialization=True)
    (out / "scheduler").mkdir()
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(g.RELEASE_SCHEDULERS["sdxl"], indent=2)
                                                             + "\n")
    shutil.copytree(tokenizer_2, out / "tokenizer_2")
    batch = {0: "batch"}
    ids = torch.zeros((1, 77), dtype=torch.int64)
    hidden = [f"hidden_states.{i}" for i in range(pipe.text_encoder_2.config.num_hidden_layers + 1)]
    g._export(g._Text(pipe.text_encoder_2, True), (ids,), out / "text_encoder_2" / "model.onnx", ["input_ids"],
              ["text_embeds", "last_hidden_state", *hidden],
              {n: batch for n in ["input_ids", "text_embeds", "last_hidden_state", *hidden]})
    shutil.copy(tmp / "text_encoder_2" / "config.json", out / "text_encoder_2" / "config.json")
    lat = g.SIZE // 8
    image_axes = {0: "batch_size", 2: "height", 3: "width"}
    latent_axes = {0: "batch_size", 2: "height_latent", 3: "width_latent"}
    args = (torch.randn(2, 4, lat, lat + 4), torch.tensor(999.0), torch.randn(2, 77, 32), torch.randn(2, 32),
            torch.randn(2, 5))
    names = ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"]
    dyn = {"sample": image_axes, "encoder_hidden_states": {0: "batch_size", 1: "sequence_length"},
           "text_embeds": {0: "batch_size"}, "time_ids": {0: "batch_size"}, "out_sample": image_axes}
    g._export(g._Unet(pipe.unet, True), args, out / "unet" / "model.onnx", names, ["out_sample"], dyn, external=True)
    shutil.copy(tmp / "unet" / "config.json", out / "unet" / "config.json")
    g._export(g._VaeEncoder(pipe.vae), (torch.randn(1, 3, lat * 8, (lat + 4) * 8),), out / "vae_encoder" / "model.onnx",
              ["sample"], ["latent_parameters"], {"sample": image_axes, "latent_parameters": latent_axes})
    g._export(g._VaeDecoder(pipe.vae), (torch.randn(1, 4, lat, lat + 4),), out / "vae_decoder" / "model.onnx",
              ["latent_sample"], ["sample"], {"latent_sample": latent_axes, "sample": image_axes})
    for part in ("vae_encoder", "vae_decoder"):
        shutil.copy(tmp / "vae" / "config.json", out / part / "config.json")
    index = g.optimum_model_index(json.loads((tmp / "model_index.json").read_text()))
    assert index["requires_aesthetics_score"] is True and index["force_zeros_for_empty_prompt"] is False, index
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.rmtree(tmp)


def cases() -> list[dict]:
    base = dict(prompt=g.PROMPT, negative_prompt=g.NEGATIVE, steps=10, cfg=7.0, batch=1, clip_skip=None,
                width=g.SIZE, height=g.SIZE)
    return [
        dict(base, name="img2img/Euler", mode="img2img", sampler="Euler", strength=0.3, seed=51),
        dict(base, name="img2img/Euler a/empty negative", mode="img2img", sampler="Euler a", strength=0.5, seed=52,
             negative_prompt=None),
        dict(base, name="img2img/DPM++ 2M Karras", mode="img2img", sampler="DPM++ 2M Karras", strength=0.3, seed=53),
        dict(base, name="refiner/Euler/0.8", mode="refiner", sampler="Euler", switch_at=0.8, seed=61),
        dict(base, name="refiner/Euler a/0.7", mode="refiner", sampler="Euler a", switch_at=0.7, seed=62),
        dict(base, name="refiner/DDIM/0.8", mode="refiner", sampler="DDIM", switch_at=0.8, seed=63),
        dict(base, name="refiner/Euler a/0.8/batch 2", mode="refiner", sampler="Euler a", switch_at=0.8, seed=64,
             batch=2),
        dict(base, name="refiner/img2img/Euler/0.8", mode="refiner-img2img", sampler="Euler", switch_at=0.8,
             strength=0.6, seed=65),
    ]


def run_case(base: StableDiffusionXLPipeline, refiner: StableDiffusionXLImg2ImgPipeline, case: dict,
             init: np.ndarray) -> np.ndarray:
    sched = g.SCHEDULERS[case["sampler"]](refiner.scheduler.config)
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    common = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], num_inference_steps=case["steps"],
                  guidance_scale=case["cfg"], generator=gen, num_images_per_prompt=case["batch"])
    r = StableDiffusionXLImg2ImgPipeline(**{**refiner.components, "scheduler": sched},
                                         requires_aesthetics_score=True, force_zeros_for_empty_prompt=False)
    r.set_progress_bar_config(disable=True)
    if case["mode"] == "img2img":
        out = r(image=Image.fromarray(init), strength=case["strength"], output_type="np", **common)
    elif case["mode"] == "refiner":
        b = StableDiffusionXLPipeline(**{**base.components, "scheduler": g.SCHEDULERS[case["sampler"]](
            base.scheduler.config)}, force_zeros_for_empty_prompt=True)
        b.set_progress_bar_config(disable=True)
        latents = b(height=case["height"], width=case["width"], denoising_end=case["switch_at"], output_type="latent",
                    **common).images
        out = r(image=latents, denoising_start=case["switch_at"], output_type="np", **common)
    else:  # the base as img2img (its own time ids: requires_aesthetics_score False), then the refiner
        b = StableDiffusionXLImg2ImgPipeline(**{**base.components, "scheduler": g.SCHEDULERS[case["sampler"]](
            base.scheduler.config)}, requires_aesthetics_score=False, force_zeros_for_empty_prompt=True)
        b.set_progress_bar_config(disable=True)
        latents = b(image=Image.fromarray(init), strength=case["strength"], denoising_end=case["switch_at"],
                    output_type="latent", **common).images
        out = r(image=latents, denoising_start=case["switch_at"], output_type="np", **common)
    return (out.images * 255).round().astype(np.uint8)


def _tokenizer_from_tiny_sdxl(folder: Path, pad: str):
    """gen_pipeline_refs.write_tokenizer without open_clip: tiny-sdxl's own tokenizer files (the same vocabulary)."""
    shutil.copytree(BASE / folder.name, folder, dirs_exist_ok=True)
    return g.write_tokenizer_configs(folder, pad)


def main() -> None:
    torch.set_num_threads(1)
    if importlib.util.find_spec("open_clip") is None:
        g.write_tokenizer = _tokenizer_from_tiny_sdxl
    base = g.build("sdxl")
    base.scheduler = type(base.scheduler).from_config(g.RELEASE_SCHEDULERS["sdxl"])
    # the rebuilt base must be tiny-sdxl's exported one: one of its reference images, again
    check = next(c for c in json.loads((BASE / "refs.json").read_text()) if c["name"] == "txt2img/Euler")
    want = np.load(BASE / "refs.npz")[check["name"]]
    got = g.run_case(base, check, {"init_image": g.init_image(), "mask": g.mask_image()})
    assert np.array_equal(got, want), f"the rebuilt base is not tiny-sdxl: max diff {np.abs(got - want).max()}"
    refiner = build_refiner(base)
    export(refiner, base.tokenizer_dir["tokenizer_2"], OUT)
    init = g.init_image()
    refs = {"init_image": init}
    all_cases = cases()
    for case in all_cases:
        refs[case["name"]] = run_case(base, refiner, case, init)
        print(case["name"], refs[case["name"]].shape, float(refs[case["name"]].std()))
    (OUT / "refs.json").write_text(json.dumps(all_cases, indent=1) + "\n")
    np.savez_compressed(OUT / "refs.npz", **refs)
    print("folder size", sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file()))


if __name__ == "__main__":
    main()
