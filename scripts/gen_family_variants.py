"""Tiny model variants the test folders do not cover, built with diffusers, for checking sdrt's families.

Run with the reference venv (torch, diffusers, transformers):

    /work/refvenv/bin/python scripts/gen_family_variants.py OUT [--only NAME ...]

Each variant is a real diffusers architecture with random weights and a configuration that differs from the
folders under ``tests/data/pipelines/`` (``gen_pipeline_refs.py``, ``gen_flow_refs.py``): other head dims and
head counts, layer and block counts, ``joint_attention_dim``, SD3 without q/k norm or dual attention and
SD3.5 with dual attention in every layer, Flux dev/schnell and Chroma with other widths, SDXL whose second
encoder projects to a width other than its own, SD 2.x v-prediction (also with zero terminal SNR and trailing
spacing), SD 1.x with three UNet blocks. For each
it writes under ``OUT/NAME/``:

- ``torch/``: the diffusers pipeline as ``save_pretrained`` writes it (what ``optimum-cli export onnx --model``
  reads; ``scripts/export_optimum.sh`` exports it);
- ``sdrt/``: the flow families exported part by part as ``gen_flow_refs.py`` exports them (torch.onnx);
- ``refs.json`` and ``refs.npz``: cases (non-square sizes such as 320x192, batch 2, empty negative prompt,
  img2img) and diffusers' images for them, ``torch.Generator("cpu").manual_seed(seed)``.

``scripts/check_family_variants.py`` (sdrt's venv) runs every case on every export and backend.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    ChromaPipeline,
    ChromaTransformer2DModel,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxInpaintPipeline,
    FluxPipeline,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3InpaintPipeline,
    StableDiffusion3Pipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
    StableDiffusionXLInpaintPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from PIL import Image  # noqa: E402
from transformers import (  # noqa: E402
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    T5Config,
    T5EncoderModel,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_flow_refs as flow  # noqa: E402
import gen_pipeline_refs as sd  # noqa: E402


def write_tokenizer(folder: Path, pad: str):
    """gen_pipeline_refs.write_tokenizer without open_clip: the same cut BPE, from the SD 1.x test folder."""
    import shutil

    src = sd.OUT / "tiny-sd15" / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(src / f, folder / f)
    return sd.write_tokenizer_configs(folder, pad)


def write_t5_tokenizer(folder: Path):
    """The T5 tokenizer of the flow test folders (gen_flow_refs.py trains it; sentencepiece versions differ)."""
    import shutil

    from transformers import T5TokenizerFast

    shutil.copytree(sd.OUT / "tiny-flux-dev" / "tokenizer_2", folder)
    return T5TokenizerFast.from_pretrained(folder)


sd.write_tokenizer = flow.write_tokenizer = write_tokenizer
flow.write_t5_tokenizer = write_t5_tokenizer


def clip(tok, hidden: int, act: str, proj: int | None = None, layers: int = 2, heads: int = 2, cls=CLIPTextModel):
    cfg = CLIPTextConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_attention_heads=heads, num_hidden_layers=layers, max_position_embeddings=77,
                         hidden_act=act, projection_dim=proj or hidden, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return cls(cfg).eval()


def t5(tok, width: int, seed: int, heads: int = 3, layers: int = 1) -> T5EncoderModel:
    cfg = T5Config(vocab_size=len(tok), d_model=width, d_kv=width // heads, d_ff=width + 16, num_layers=layers,
                   num_heads=heads, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                   feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_gated_act=True,
                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=False)
    model = T5EncoderModel(cfg).eval()
    sd.scale_weights(model, seed)
    return model


def _scaled(module, seed):
    sd.scale_weights(module, seed)
    return module


def build(name: str):
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp())
    if name in ("sd3-medium", "sd35-x"):
        tok = write_tokenizer(work / "tokenizer", "<|endoftext|>")
        tok2 = write_tokenizer(work / "tokenizer_2", "!")
        tok3 = flow.write_t5_tokenizer(work / "tokenizer_3")
        te = _scaled(clip(tok, 24, "quick_gelu", cls=CLIPTextModelWithProjection), 1)
        te2 = _scaled(clip(tok2, 40, "gelu", layers=3, cls=CLIPTextModelWithProjection), 2)
        te3 = t5(tok3, 80, 3, heads=5)  # T5 wider than CLIP-L + CLIP-G (24 + 40), as 4096 > 768 + 1280
        if name == "sd3-medium":  # SD3 medium: no q/k norm, no dual attention
            kw = dict(num_layers=3, attention_head_dim=16, num_attention_heads=2, caption_projection_dim=32)
        else:  # SD3.5 medium style: MMDiT-X dual attention in every layer, RMS q/k norm, 3 heads of 8
            kw = dict(num_layers=3, attention_head_dim=8, num_attention_heads=3, caption_projection_dim=24,
                      dual_attention_layers=(0, 1, 2), qk_norm="rms_norm")
        tr = _scaled(SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=16, joint_attention_dim=80,
                                           pooled_projection_dim=24 + 40, out_channels=16, pos_embed_max_size=32,
                                           **kw).eval(), 4)
        sched = FlowMatchEulerDiscreteScheduler.from_config(flow.RELEASE_SCHEDULERS["sd3"])
        pipe = StableDiffusion3Pipeline(transformer=tr, scheduler=sched, vae=flow.flow_vae(1.5305, 0.0609, 5),
                                        text_encoder=te, tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok2,
                                        text_encoder_3=te3, tokenizer_3=tok3)
        pipe.tokenizer_dirs = {n: work / n for n in ("tokenizer", "tokenizer_2", "tokenizer_3")}
        kind = "sd3"
    elif name.startswith("flux"):
        tok = write_tokenizer(work / "tokenizer", "<|endoftext|>")
        tok2 = flow.write_t5_tokenizer(work / "tokenizer_2")
        te = _scaled(clip(tok, 24, "quick_gelu", layers=3, heads=3), 1)
        te2 = t5(tok2, 48, 2, heads=2, layers=2)
        dev = name == "flux-dev-b"
        tr = _scaled(FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=3,
                                            attention_head_dim=24, num_attention_heads=3, joint_attention_dim=48,
                                            pooled_projection_dim=24, guidance_embeds=dev,
                                            axes_dims_rope=(8, 8, 8)).eval(), 4)
        kind = "flux-dev" if dev else "flux-schnell"
        sched = FlowMatchEulerDiscreteScheduler.from_config(flow.RELEASE_SCHEDULERS[kind])
        pipe = FluxPipeline(scheduler=sched, vae=flow.flow_vae(0.3611, 0.1159, 5), text_encoder=te, tokenizer=tok,
                            text_encoder_2=te2, tokenizer_2=tok2, transformer=tr)
        pipe.tokenizer_dirs = {n: work / n for n in ("tokenizer", "tokenizer_2")}
    elif name == "chroma-b":
        tok = flow.write_t5_tokenizer(work / "tokenizer")
        te = t5(tok, 48, 2, heads=4, layers=2)
        tr = _scaled(ChromaTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=1,
                                              attention_head_dim=24, num_attention_heads=2, joint_attention_dim=48,
                                              axes_dims_rope=(4, 10, 10), approximator_num_channels=16,
                                              approximator_hidden_dim=24, approximator_layers=3).eval(), 4)
        sched = FlowMatchEulerDiscreteScheduler.from_config(flow.RELEASE_SCHEDULERS["chroma"])
        pipe = ChromaPipeline(scheduler=sched, vae=flow.flow_vae(0.3611, 0.1159, 5), text_encoder=te, tokenizer=tok,
                              transformer=tr)
        pipe.tokenizer_dirs = {"tokenizer": work / "tokenizer"}
        kind = "chroma"
    elif name == "sdxl-b":  # text_encoder_2 projects 40 -> 20; three UNet levels; other head dims
        tok = write_tokenizer(work / "tokenizer", "<|endoftext|>")
        tok2 = write_tokenizer(work / "tokenizer_2", "!")
        te = _scaled(clip(tok, 24, "quick_gelu", layers=3, heads=3), 1)
        te2 = _scaled(clip(tok2, 40, "gelu", proj=20, layers=3, heads=5, cls=CLIPTextModelWithProjection), 2)
        unet = _scaled(UNet2DConditionModel(
            sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16, 24),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=64,
            norm_num_groups=8, attention_head_dim=(2, 4, 3), addition_embed_type="text_time",
            addition_time_embed_dim=4, projection_class_embeddings_input_dim=6 * 4 + 20, use_linear_projection=True,
            transformer_layers_per_block=(1, 1, 2)).eval(), 3)
        vae = _scaled(sd.tiny_vae(0.13025).eval(), 4)
        sched = EulerDiscreteScheduler.from_config(sd.RELEASE_SCHEDULERS["sdxl"])
        pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=te, text_encoder_2=te2, tokenizer=tok, tokenizer_2=tok2,
                                         unet=unet, scheduler=sched, force_zeros_for_empty_prompt=True)
        kind = "sdxl"
    elif name in ("sd2v-b", "sd2v-zsnr", "sd15-b", "sd15-inpaint-b"):
        v = name not in ("sd15-b", "sd15-inpaint-b")
        tok = write_tokenizer(work / "tokenizer", "!" if v else "<|endoftext|>")
        te = _scaled(clip(tok, 48, "gelu" if v else "quick_gelu", layers=4, heads=3), 1)
        unet = _scaled(UNet2DConditionModel(
            sample_size=8, in_channels=9 if name == "sd15-inpaint-b" else 4, out_channels=4, layers_per_block=2,
            block_out_channels=(16, 16, 24),
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=48,
            norm_num_groups=8, attention_head_dim=(4, 2, 3) if v else 4, use_linear_projection=v).eval(), 3)
        vae = _scaled(sd.tiny_vae(0.18215).eval(), 4)
        cfg = dict(sd.RELEASE_SCHEDULERS["sd2v" if v else "sd15"])
        if name == "sd2v-zsnr":  # zero terminal SNR, as its fine-tunes ship it (Lin et al. 2023)
            cfg.update(rescale_betas_zero_snr=True, timestep_spacing="trailing")
        sched = EulerDiscreteScheduler.from_config(cfg)
        cls = StableDiffusionInpaintPipeline if name == "sd15-inpaint-b" else StableDiffusionPipeline
        pipe = cls(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=sched, safety_checker=None,
                   feature_extractor=None, requires_safety_checker=False)
        kind = "sd2v" if v else "sd15-inpaint" if name == "sd15-inpaint-b" else "sd15"
    else:
        raise SystemExit(f"unknown variant {name}")
    pipe.set_progress_bar_config(disable=True)
    return pipe, kind


NAMES = ("sd3-medium", "sd35-x", "flux-dev-b", "flux-schnell-b", "chroma-b", "sdxl-b", "sd2v-b", "sd2v-zsnr",
         "sd15-b", "sd15-inpaint-b")
PROMPT = flow.PROMPT
NEG = flow.NEGATIVE


def cases_for(name: str, kind: str) -> list[dict]:
    base = dict(prompt=PROMPT, negative_prompt=None, steps=3, seed=7, width=64, height=64, batch=1,
                max_sequence_length=32, mode="txt2img")
    if kind == "sd3":
        return [dict(base, name="320x192/cfg 5/negative", width=320, height=192, cfg=5.0, negative_prompt=NEG),
                dict(base, name="64x96/batch 2/empty negative", height=96, cfg=4.0, negative_prompt="", batch=2,
                     steps=2, seed=8),
                dict(base, name="img2img/0.7", mode="img2img", cfg=3.0, negative_prompt=NEG, strength=0.7, steps=4,
                     seed=9),
                dict(base, name="inpaint/0.9", mode="inpaint", cfg=3.0, negative_prompt=NEG, strength=0.9, steps=4,
                     seed=12)]
    if kind.startswith("flux"):
        g = dict(guidance=4.0) if kind == "flux-dev" else {}
        return [dict(base, name="320x192", width=320, height=192, cfg=1.0, **g),
                dict(base, name="64x96/batch 2", height=96, cfg=1.0, batch=2, steps=2, seed=8, **g),
                dict(base, name="96x64/true cfg 3/negative", width=96, cfg=3.0, negative_prompt=NEG, seed=10, **g),
                dict(base, name="img2img/0.6", mode="img2img", cfg=1.0, strength=0.6, steps=4, seed=9, **g),
                dict(base, name="inpaint/0.85", mode="inpaint", cfg=1.0, strength=0.85, steps=4, seed=12, **g)]
    if kind == "chroma":
        return [dict(base, name="320x192/cfg 4/negative", width=320, height=192, cfg=4.0, negative_prompt=NEG),
                dict(base, name="64x96/cfg 3/empty negative", height=96, cfg=3.0, negative_prompt="", steps=2, seed=8),
                dict(base, name="96x64/batch 2/cfg 4/negative", width=96, cfg=4.0, negative_prompt=NEG, batch=2,
                     steps=2, seed=9)]
    base = dict(prompt=PROMPT, negative_prompt=NEG, steps=4, cfg=6.0, seed=7, width=64, height=64, batch=1,
                clip_skip=None, sampler="Euler", mode="txt2img")
    if kind == "sd15-inpaint":  # a 9-channel UNet (mask and masked-image latents as extra channels)
        return [dict(base, name=f"inpaint/{st}/{s}", mode="inpaint", strength=st, sampler=s, seed=13 + i)
                for i, (st, s) in enumerate(((1.0, "Euler a"), (0.75, "Euler"), (1.0, "DPM++ 2M Karras")))]
    return [dict(base, name="320x192/Euler", width=320, height=192),
            dict(base, name="64x96/batch 2/empty negative/Euler a", height=96, negative_prompt="", batch=2,
                 sampler="Euler a", seed=8, diffusers_negative=None),
            dict(base, name="96x64/no negative/DPM++ 2M Karras", width=96, negative_prompt=None,
                 sampler="DPM++ 2M Karras", seed=9),
            dict(base, name="img2img/0.6/DDIM", mode="img2img", strength=0.6, sampler="DDIM", seed=10),
            dict(base, name="inpaint/1.0/Euler a", mode="inpaint", strength=1.0, sampler="Euler a", seed=11),
            dict(base, name="inpaint/0.75/Euler", mode="inpaint", strength=0.75, sampler="Euler", seed=12)]


def sd_case(pipe, case: dict, init: np.ndarray) -> np.ndarray:
    """gen_pipeline_refs.run_case, with the case's size for img2img too (the init image is resized to it)."""
    images = {"init_image": init, "mask": sd.mask_image()}
    if "diffusers_negative" in case:  # sdrt reads an empty negative prompt as diffusers reads None (SDXL: zeros)
        case = dict(case, negative_prompt=case["diffusers_negative"])
    if case["mode"] == "inpaint" and isinstance(pipe, StableDiffusionXLPipeline):
        sched = sd.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
        p = StableDiffusionXLInpaintPipeline(**{**pipe.components, "scheduler": sched},
                                             requires_aesthetics_score=False, force_zeros_for_empty_prompt=True)
        p.set_progress_bar_config(disable=True)
        result = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=Image.fromarray(init),
                   mask_image=Image.fromarray(images["mask"]), strength=case["strength"],
                   num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=64, width=64,
                   generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
        return (result.images * 255).round().astype(np.uint8)
    return sd.run_case(pipe, case, images)


def chroma_batch_case(pipe, case: dict) -> np.ndarray:
    """ChromaPipeline at batch > 1: given prompt_embeds and their mask, it repeats the embeddings for
    num_images_per_prompt but not the mask (a size mismatch), so pass both repeated, one image per prompt:
    the same batch, the same noise drawn in one call."""
    enc = flow.encode(pipe, "chroma", case, case["name"], {})
    b = case["batch"]

    def rep(t):
        return t.repeat(b, *[1] * (t.ndim - 1))

    (pe, pm), (ne, nm) = enc["prompt"], enc["negative"]
    kw = dict(prompt_embeds=rep(pe), prompt_attention_mask=rep(pm), guidance_scale=case["cfg"],
              num_inference_steps=case["steps"], generator=torch.Generator("cpu").manual_seed(case["seed"]),
              output_type="np", max_sequence_length=case["max_sequence_length"], height=case["height"],
              width=case["width"])
    if case["cfg"] > 1:
        kw.update(negative_prompt_embeds=rep(ne), negative_prompt_attention_mask=rep(nm))
    with torch.no_grad():
        result = pipe(**kw)
    return (result.images * 255).round().astype(np.uint8)


def flow_inpaint_case(pipe, kind: str, case: dict, init: np.ndarray) -> np.ndarray:
    """diffusers' FluxInpaintPipeline / StableDiffusion3InpaintPipeline (an ordinary transformer: the known part
    is blended back after every step)."""
    cls = StableDiffusion3InpaintPipeline if kind == "sd3" else FluxInpaintPipeline
    p = cls(**pipe.components)
    p.set_progress_bar_config(disable=True)
    kw = dict(guidance_scale=case["cfg"]) if kind == "sd3" else dict(true_cfg_scale=case["cfg"],
                                                                       guidance_scale=case.get("guidance", 3.5))
    # SD3's inpaint pipeline decodes latents / scaling_factor without + shift_factor (diffusers issue #13611,
    # pull request #14671), unlike its own encoder and every other SD3 pipeline: decode its latents as they do
    out = "latent" if kind == "sd3" else "np"
    result = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=Image.fromarray(init),
               mask_image=Image.fromarray(sd.mask_image()), strength=case["strength"], height=64, width=64,
               num_inference_steps=case["steps"], generator=torch.Generator("cpu").manual_seed(case["seed"]),
               max_sequence_length=case["max_sequence_length"], output_type=out, **kw)
    images = result.images
    if kind == "sd3":
        with torch.no_grad():
            lat = images / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
            images = p.image_processor.postprocess(pipe.vae.decode(lat, return_dict=False)[0], output_type="np")
    return (images * 255).round().astype(np.uint8)


def readable_by_transformers_4(folder: Path) -> None:
    """transformers 5 saves a tokenizer as tokenizer.json alone; Optimum (transformers 4.x) loads the slow
    CLIPTokenizer, which reads vocab.json and merges.txt, and T5's from spiece.model: put them back."""
    import shutil

    from safetensors.torch import load_file, save_file

    for enc in folder.glob("text_encoder*"):  # 5.x saves CLIPTextModel without its "text_model." prefix
        cfg = json.loads((enc / "config.json").read_text())
        path = enc / "model.safetensors"
        if cfg.get("architectures") == ["CLIPTextModel"] and path.exists():
            sd_ = load_file(path)
            if not any(k.startswith("text_model.") for k in sd_):
                save_file({f"text_model.{k}": v for k, v in sd_.items()}, path, metadata={"format": "pt"})
    for tok in folder.glob("tokenizer*"):
        cfg = json.loads((tok / "tokenizer_config.json").read_text())
        if "T5" in cfg.get("tokenizer_class", ""):  # the folder it was copied from (its 5.x config lists
            shutil.rmtree(tok)                       # extra_special_tokens, which 4.x cannot read)
            shutil.copytree(sd.OUT / "tiny-flux-dev" / "tokenizer_2", tok)
            continue
        for f in ("vocab.json", "merges.txt"):
            if not (tok / f).exists():
                shutil.copy(sd.OUT / "tiny-sd15" / "tokenizer" / f, tok / f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*", default=list(NAMES))
    ap.add_argument("--controlnet", action="store_true", help="only OUT/sdxl-b-cn (after the Optimum export)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.controlnet:
        controlnet_variant(args.out)
        return
    for name in args.only:
        pipe, kind = build(name)
        root = args.out / name
        root.mkdir(parents=True, exist_ok=True)
        pipe.save_pretrained(root / "torch", safe_serialization=True)
        readable_by_transformers_4(root / "torch")
        # the references use the scheduler as the saved folder gives it: a key the release config left out is
        # written out by save_pretrained (Euler's timestep_spacing "linspace"), and DDIM made from_config of the
        # in-memory config would take its own default ("leading") where one made from the folder takes linspace
        pipe.scheduler = type(pipe.scheduler).from_pretrained(root / "torch" / "scheduler")
        if kind in ("sd3", "flux-dev", "flux-schnell", "chroma"):
            flow.export(pipe, kind, root / "sdrt")
        cases = cases_for(name, kind)
        refs: dict[str, np.ndarray] = {"init_image": sd.init_image(), "mask": sd.mask_image()}
        for case in cases:
            if kind == "chroma" and case["batch"] > 1:
                refs[f"{case['name']}/image"] = chroma_batch_case(pipe, case)
            elif case["mode"] == "inpaint" and kind in ("sd3", "flux-dev", "flux-schnell"):
                refs[f"{case['name']}/image"] = flow_inpaint_case(pipe, kind, case, refs["init_image"])
            elif kind in ("sd3", "flux-dev", "flux-schnell", "chroma"):
                flow.run_case(pipe, kind, case, refs)
                for k in [k for k in refs if k.startswith(case["name"] + "/") and not k.endswith("/image")]:
                    del refs[k]
            else:
                refs[f"{case['name']}/image"] = sd_case(pipe, case, refs["init_image"])
            print(name, case["name"], refs[f"{case['name']}/image"].shape)
        (root / "refs.json").write_text(json.dumps(dict(kind=kind, cases=cases), indent=1) + "\n")
        np.savez_compressed(root / "refs.npz", **refs)



# ---------------------------------------------------------------- SDXL ControlNet on the sdxl-b variant
def controlnet_variant(root: Path) -> None:
    """``OUT/sdxl-b-cn``: Optimum's sdxl-b folder with its UNet swapped for one that takes ControlNet residuals
    (dynamic batch, height and width) and a ``controlnet/`` (``ControlNetModel.from_unet``), in the community
    layout gen_controlnet_refs.py writes; diffusers' StableDiffusionXLControlNetPipeline images at 96x64 and
    64x96. Run after ``export_optimum.py`` has written ``OUT/sdxl-b/optimum``."""
    import shutil

    import gen_controlnet_refs as cn
    from diffusers import StableDiffusionXLControlNetPipeline

    pipe, _ = build("sdxl-b")
    pipe.scheduler = type(pipe.scheduler).from_pretrained(root / "sdxl-b" / "torch" / "scheduler")
    net = cn.make_controlnet(pipe.unet, 40)
    out = root / "sdxl-b-cn" / "optimum"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(root / "sdxl-b" / "optimum", out)
    g = torch.Generator().manual_seed(7)
    hw = {0: "batch", 2: "height", 3: "width"}
    feeds = {"sample": torch.randn(2, 4, 8, 12, generator=g), "timestep": torch.tensor(601.0),
             "encoder_hidden_states": torch.randn(2, 77, pipe.unet.config.cross_attention_dim, generator=g),
             "text_embeds": torch.randn(2, pipe.text_encoder_2.config.projection_dim, generator=g),
             "time_ids": torch.tensor([[64.0, 96.0, 0.0, 0.0, 64.0, 96.0]] * 2)}
    cond = torch.rand(2, 3, 64, 96, generator=g)
    wrapper = cn._ControlNet(net, True)
    args = (feeds["sample"], feeds["timestep"], feeds["encoder_hidden_states"], cond, torch.tensor(0.8),
            feeds["text_embeds"], feeds["time_ids"])
    with torch.no_grad():
        res = wrapper(*args)
    n_down = len(res) - 1
    outs = [f"down_block_res_samples_{i}" for i in range(n_down)] + ["mid_block_res_sample"]
    res_axes = {n: {0: "batch", 2: f"h{i}", 3: f"w{i}"} for i, n in enumerate(outs)}
    sd._export(wrapper, args, out / "controlnet" / "model.onnx",
               ["sample", "timestep", "encoder_hidden_states", "controlnet_cond", "conditioning_scale",
                "text_embeds", "time_ids"], outs,
               {"sample": hw, "encoder_hidden_states": {0: "batch", 1: "sequence"},
                "controlnet_cond": {0: "batch", 2: "image_height", 3: "image_width"}, "text_embeds": {0: "batch"},
                "time_ids": {0: "batch"}, **res_axes}, external=True)
    net.save_config(out / "controlnet")
    ins = [f"down_block_additional_residual_{i}" for i in range(n_down)] + ["mid_block_additional_residual"]
    unet = cn._UnetWithResiduals(pipe.unet, True, n_down)
    for f in (out / "unet").glob("model.onnx*"):
        f.unlink()
    sd._export(unet, (*args[:3], feeds["text_embeds"], feeds["time_ids"], *res), out / "unet" / "model.onnx",
               ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids", *ins], ["out_sample"],
               {"sample": hw, "encoder_hidden_states": {0: "batch", 1: "sequence"}, "text_embeds": {0: "batch"},
                "time_ids": {0: "batch"}, "out_sample": hw,
                **{n: res_axes[o] for n, o in zip(ins, outs)}}, external=True)
    index = json.loads((out / "model_index.json").read_text())
    index["controlnet"] = ["diffusers", "ControlNetModel"]
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")

    edges = np.zeros((64, 96, 3), np.uint8)
    edges[10:14, 8:88] = 255
    edges[20:56, 40:44] = 255
    yy, xx = np.mgrid[0:64, 0:96]
    edges[np.abs(np.hypot(yy - 40, xx - 70) - 14) < 2] = 255
    cases = [dict(prompt=PROMPT, negative_prompt=NEG, steps=4, cfg=6.0, seed=21, width=96, height=64, batch=1,
                  sampler="Euler", mode="txt2img", name="controlnet/96x64/scale 0.8", scale=0.8, start=0.0, end=1.0),
             dict(prompt=PROMPT, negative_prompt=NEG, steps=4, cfg=6.0, seed=22, width=64, height=96, batch=1,
                  sampler="Euler", mode="txt2img", name="controlnet/64x96/window 0.25-0.75", scale=1.0, start=0.25,
                  end=0.75, transpose=True)]
    refs: dict[str, np.ndarray] = {"init_image": sd.init_image(), "control": edges}
    for case in cases:
        image = edges.transpose(1, 0, 2).copy() if case.get("transpose") else edges
        p = StableDiffusionXLControlNetPipeline(**{k: v for k, v in pipe.components.items()}, controlnet=net)
        p.set_progress_bar_config(disable=True)
        result = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=Image.fromarray(image),
                   num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=case["height"],
                   width=case["width"], generator=torch.Generator("cpu").manual_seed(case["seed"]),
                   controlnet_conditioning_scale=case["scale"], control_guidance_start=case["start"],
                   control_guidance_end=case["end"], output_type="np")
        refs[f"{case['name']}/image"] = (result.images * 255).round().astype(np.uint8)
        print("sdxl-b-cn", case["name"], refs[f"{case['name']}/image"].shape)
    (root / "sdxl-b-cn" / "refs.json").write_text(json.dumps(dict(kind="sdxl", cases=cases), indent=1) + "\n")
    np.savez_compressed(root / "sdxl-b-cn" / "refs.npz", **refs)


if __name__ == "__main__":
    main()
