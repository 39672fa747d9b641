"""Build tiny Stable Diffusion model folders with diffusers, export them to ONNX, save reference images.

Needs torch, diffusers, transformers, onnx, pillow and open_clip_torch (for CLIP's BPE file), i.e.
/work/venv-torch (or /work/refvenv). The tests need none of these: they read what this script writes.

    /work/venv-torch/bin/python scripts/gen_pipeline_refs.py              # tests/data/pipelines/*
    /work/venv-torch/bin/python scripts/gen_pipeline_refs.py --only sdxl-dyn   # one folder, nothing else
    /work/venv-torch/bin/python scripts/gen_pipeline_refs.py --demo DIR   # only the tiny demo folder

``tiny-sdxl-dyn`` is the SDXL architecture exported as Optimum exports it, with dynamic batch, height and
width axes on the UNet and the VAE, and its references are non-square (64 wide x 96 high and 96 x 64):
SDXL's ``time_ids`` hold (height, width) twice, so only a non-square image shows them swapped.

Each folder is a real diffusers architecture with random weights and small widths, exported part by
part in Optimum's ONNX layout (``text_encoder/model.onnx``, ``unet/model.onnx`` + ``model.onnx_data``,
``vae_encoder``, ``vae_decoder``, ``scheduler/``, ``tokenizer/``, ``model_index.json``, a
``config.json`` per part). The vocabulary is CLIP's own BPE (open_clip's ``bpe_simple_vocab_16e6``)
cut to its first ``MERGES`` merges: a real BPE tokenizer, only with fewer whole-word tokens, which keeps
the embedding table (and each folder) small.

Reference images come from diffusers' own torch pipelines (``StableDiffusionPipeline``,
``...Img2ImgPipeline``, ``...InpaintPipeline``, ``StableDiffusionXLPipeline``) with
``torch.Generator("cpu").manual_seed(seed)``, for Euler, Euler a, DPM++ 2M Karras and DDIM, each
scheduler made with ``from_config(pipe.scheduler.config)`` as users do. ``refs.json`` lists the cases,
``refs.npz`` holds the uint8 images, the init image and the mask. ``schedules.json`` holds the
timesteps and sigmas diffusers' schedulers give for several configs, to test the discretization alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# The torch venv's torchvision does not load against its torch ("operator torchvision::nms does not
# exist"); nothing here needs it, so make it look absent to transformers and diffusers.
sys.modules["torchvision"] = None  # type: ignore[assignment]

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    AutoencoderKL,
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
    StableDiffusionXLImg2ImgPipeline,
    StableDiffusionXLInpaintPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from PIL import Image  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "pipelines"
MERGES = 1000
OPSET = 17
SIZE = 64


# ---------------------------------------------------------------- tokenizer
def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_tokenizer(folder: Path, pad: str) -> CLIPTokenizer:
    import importlib.util

    spec = importlib.util.find_spec("open_clip")  # not imported: it needs torchvision
    if spec is None or not spec.origin:  # the cut merges as the committed folders hold them (the same lines)
        merged = (OUT / "tiny-sd15" / "tokenizer" / "merges.txt").read_text(encoding="utf-8").split("\n")[1:]
        lines = [line for line in merged if line][:MERGES]
    else:
        bpe = Path(spec.origin).parent / "bpe_simple_vocab_16e6.txt.gz"
        lines = gzip.open(bpe).read().decode("utf-8").split("\n")[1 : 1 + MERGES]
    merges = [tuple(line.split()) for line in lines]
    vocab = list(_bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return write_tokenizer_configs(folder, pad)


def write_tokenizer_configs(folder: Path, pad: str) -> CLIPTokenizer:
    """The special-token and tokenizer configs beside ``folder``'s vocab.json and merges.txt; the tokenizer."""
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": pad,
               "unk_token": "<|endoftext|>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    config = dict(special, model_max_length=77, do_lower_case=True, tokenizer_class="CLIPTokenizer")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), pad_token=pad, model_max_length=77)


# ---------------------------------------------------------------- models
def text_config(tok: CLIPTokenizer, act: str, with_projection: bool = False) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=3,
        max_position_embeddings=77, hidden_act=act, projection_dim=32, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )


def tiny_vae(scaling: float) -> AutoencoderKL:
    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        norm_num_groups=8, sample_size=SIZE, scaling_factor=scaling,
    )


def tiny_unet(in_channels: int = 4, xl: bool = False, cross: int = 32, linear: bool = False) -> UNet2DConditionModel:
    kw: dict = {"use_linear_projection": True} if linear else {}
    if xl:
        kw = dict(addition_embed_type="text_time", addition_time_embed_dim=8,
                  projection_class_embeddings_input_dim=6 * 8 + 32, use_linear_projection=True,
                  transformer_layers_per_block=(1, 2))
    return UNet2DConditionModel(
        sample_size=SIZE // 8, in_channels=in_channels, out_channels=4, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=cross, norm_num_groups=8,
        attention_head_dim=(2, 4), **kw,
    )


def scale_weights(module: torch.nn.Module, seed: int) -> None:
    """Re-draw every weight at a scale that keeps activations O(1), so images show structure, not blur."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


SD_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                    set_alpha_to_one=False, skip_prk_steps=True, steps_offset=1, clip_sample=False)

#: scheduler_config.json as the real releases ship it. SD 1.5's and SD 2.1's leave timestep_spacing out, so
#: a scheduler made from them with from_config uses its own default (Euler: linspace, DDIM: leading);
#: SDXL's sets "leading" explicitly.
RELEASE_SCHEDULERS = {
    "sd15": {"_class_name": "PNDMScheduler", "_diffusers_version": "0.6.0", "beta_end": 0.012,
             "beta_schedule": "scaled_linear", "beta_start": 0.00085, "num_train_timesteps": 1000,
             "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None,
             "clip_sample": False},
    "sd2v": {"_class_name": "DDIMScheduler", "_diffusers_version": "0.8.0", "beta_end": 0.012,
             "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
             "num_train_timesteps": 1000, "prediction_type": "v_prediction", "set_alpha_to_one": False,
             "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None},
    "sdxl": {"_class_name": "EulerDiscreteScheduler", "_diffusers_version": "0.19.0.dev0", "beta_end": 0.012,
             "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
             "interpolation_type": "linear", "num_train_timesteps": 1000, "prediction_type": "epsilon",
             "sample_max_value": 1.0, "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
             "timestep_spacing": "leading", "trained_betas": None, "use_karras_sigmas": False},
}
RELEASE_SCHEDULERS["sd15-inpaint"] = dict(RELEASE_SCHEDULERS["sd15"], timestep_spacing="leading")
RELEASE_SCHEDULERS["sdxl-dyn"] = RELEASE_SCHEDULERS["sdxl"]
#: stabilityai/stable-diffusion-2-inpainting: PNDM, epsilon, no timestep_spacing (sdrt's release defaults for a single
#: file, so the folder, the diffusers folder and the LDM file of gen_sd2_inpaint_files.py all run one schedule)
RELEASE_SCHEDULERS["sd2-inpaint"] = {**RELEASE_SCHEDULERS["sd15"], "_diffusers_version": "0.8.0",
                                     "prediction_type": "epsilon"}
#: diffusers/stable-diffusion-xl-1.0-inpainting-0.1: SDXL's Euler, leading
RELEASE_SCHEDULERS["sdxl-inpaint"] = RELEASE_SCHEDULERS["sdxl"]
#: the SDXL architecture (two text encoders, time ids): exported and run as SDXL
XL_KINDS = ("sdxl", "sdxl-dyn", "sdxl-inpaint")
#: 9-channel UNets (mask and masked-image latents), run by diffusers' inpainting pipelines
INPAINT_KINDS = ("sd15-inpaint", "sd2-inpaint", "sdxl-inpaint")


def fp16_exact(*modules: torch.nn.Module) -> None:
    """Round every weight to a float16 value (kept in float32): files stored as fp16 hold them exactly."""
    with torch.no_grad():
        for m in modules:
            for p in m.parameters():
                p.copy_(p.half().float())
#: kinds exported with dynamic height and width axes (Optimum's names), the others with fixed 64x64 shapes
DYNAMIC_HW = {"sdxl-dyn"}


def build(kind: str):
    """kind: sd15 (SD 1.x eps), sd2v (SD 2.x v-prediction, pads with '!'), sd15-inpaint (9 channels), sdxl;
    sd2-inpaint (SD 2.x's structure: linear proj_in/proj_out, OpenCLIP's gelu, pads with '!'; 9 channels, eps) and
    sdxl-inpaint (SDXL with 9 channels), their weights float16 values (gen_sd2_inpaint_files.py stores fp16 files)."""
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp())
    pad = "!" if kind in ("sd2v", "sd2-inpaint") else "<|endoftext|>"
    tok = write_tokenizer(work / "tokenizer", pad)
    # tiny-sdxl-dyn was built before SDXL's first encoder took gelu here and is committed with quick_gelu: keep it
    act = "gelu" if kind in ("sd2v", "sd2-inpaint", "sdxl", "sdxl-inpaint") else "quick_gelu"
    text = CLIPTextModel(text_config(tok, act)).eval()
    scale_weights(text, 1)
    nine = kind in INPAINT_KINDS
    if kind in XL_KINDS:
        tok2 = write_tokenizer(work / "tokenizer_2", "!")
        text2 = CLIPTextModelWithProjection(text_config(tok2, "gelu")).eval()
        scale_weights(text2, 2)
        unet = tiny_unet(in_channels=9 if nine else 4, xl=True, cross=64).eval()
        scale_weights(unet, 3)
        vae = tiny_vae(0.13025).eval()
        scale_weights(vae, 4)
        if kind == "sdxl-inpaint":
            fp16_exact(text, text2, unet, vae)
        sched = EulerDiscreteScheduler.from_config(dict(SD_SCHEDULER, interpolation_type="linear",
                                                        timestep_spacing="leading"))
        xl_cls = StableDiffusionXLInpaintPipeline if nine else StableDiffusionXLPipeline
        pipe = xl_cls(vae=vae, text_encoder=text, text_encoder_2=text2, tokenizer=tok,
                      tokenizer_2=tok2, unet=unet, scheduler=sched, force_zeros_for_empty_prompt=True,
                      **({"requires_aesthetics_score": False} if nine else {}))
    else:
        unet = tiny_unet(in_channels=9 if nine else 4, linear=kind == "sd2-inpaint").eval()
        scale_weights(unet, 3)
        vae = tiny_vae(0.18215).eval()
        scale_weights(vae, 4)
        if kind == "sd2-inpaint":
            fp16_exact(text, unet, vae)
        cfg = dict(SD_SCHEDULER)
        if kind == "sd2v":
            cfg["prediction_type"] = "v_prediction"
        sched = PNDMScheduler.from_config(cfg)
        cls = StableDiffusionInpaintPipeline if nine else StableDiffusionPipeline
        pipe = cls(vae=vae, text_encoder=text, tokenizer=tok, unet=unet, scheduler=sched, safety_checker=None,
                   feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    pipe.tokenizer_dir = {"tokenizer": work / "tokenizer", "tokenizer_2": work / "tokenizer_2"}
    return pipe


# ---------------------------------------------------------------- ONNX export (Optimum's layout and names)
class _Text(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, projection: bool) -> None:
        super().__init__()
        self.model, self.projection = model, projection

    def forward(self, input_ids):
        out = self.model(input_ids=input_ids, output_hidden_states=True)
        first = out.text_embeds if self.projection else out.pooler_output
        return (first, out.last_hidden_state, *out.hidden_states) if self.projection else \
            (out.last_hidden_state, first, *out.hidden_states)


class _Unet(torch.nn.Module):
    def __init__(self, unet: torch.nn.Module, xl: bool) -> None:
        super().__init__()
        self.unet, self.xl = unet, xl

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        added = {"text_embeds": text_embeds, "time_ids": time_ids} if self.xl else None
        return self.unet(sample, timestep, encoder_hidden_states, added_cond_kwargs=added, return_dict=False)[0]


class _VaeEncoder(torch.nn.Module):
    def __init__(self, vae: torch.nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, sample):
        return self.vae.encode(sample).latent_dist.parameters


class _VaeDecoder(torch.nn.Module):
    def __init__(self, vae: torch.nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample):
        return self.vae.decode(latent_sample, return_dict=False)[0]


def _export(module, args, path: Path, inputs, outputs, dynamic, external: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic, opset_version=OPSET, dynamo=False, do_constant_folding=True)
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx_data", size_threshold=1024)


def export(pipe, kind: str, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    pipe.save_pretrained(out / "_torch", safe_serialization=True)
    tmp = out / "_torch"
    (out / "scheduler").mkdir()
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(RELEASE_SCHEDULERS[kind], indent=2) + "\n")
    # the references use the scheduler as a user gets it from this folder
    pipe.scheduler = type(pipe.scheduler).from_pretrained(out / "scheduler")
    xl = kind in XL_KINDS
    dyn_hw = kind in DYNAMIC_HW
    for name in ("tokenizer", "tokenizer_2") if xl else ("tokenizer",):  # the slow-tokenizer files, as written
        shutil.copytree(pipe.tokenizer_dir[name], out / name)
    batch = {0: "batch"}
    # text encoders: input_ids int32 for SD 1.x/2.x (as diffusers' ONNX export), int64 for SDXL (as Optimum)
    ids_dtype = torch.int64 if xl else torch.int32
    ids = torch.zeros((1, 77), dtype=ids_dtype)
    layers = pipe.text_encoder.config.num_hidden_layers
    hidden = [f"hidden_states.{i}" for i in range(layers + 1)]
    _export(_Text(pipe.text_encoder, False), (ids,), out / "text_encoder" / "model.onnx", ["input_ids"],
            ["last_hidden_state", "pooler_output", *hidden], {n: batch for n in ["input_ids", "last_hidden_state",
                                                                                    "pooler_output", *hidden]})
    shutil.copy(tmp / "text_encoder" / "config.json", out / "text_encoder" / "config.json")
    if xl:
        _export(_Text(pipe.text_encoder_2, True), (ids,), out / "text_encoder_2" / "model.onnx", ["input_ids"],
                ["text_embeds", "last_hidden_state", *hidden],
                {n: batch for n in ["input_ids", "text_embeds", "last_hidden_state", *hidden]})
        shutil.copy(tmp / "text_encoder_2" / "config.json", out / "text_encoder_2" / "config.json")
    # UNet timestep: int64 [batch] for the inpainting UNet (as Optimum exports it), float32 [batch] for SD 1.x/2.x
    # (diffusers' old export script), a float scalar for SDXL. The int64 one gets a config with integer timesteps
    # (timestep_spacing "leading"), so that torch's float timesteps and the graph's int64 ones agree.
    seq = {0: "batch", 1: "sequence"}  # prompts past 75 tokens make 77 * chunks tokens, as in Optimum's export
    cin = pipe.unet.config.in_channels
    lat = SIZE // 8
    lat_w = lat + 4 if dyn_hw else lat  # traced at a non-square size, so no height is taken for a width
    sample = torch.randn(2, cin, lat, lat_w)
    cond = torch.randn(2, 77, pipe.unet.config.cross_attention_dim)
    image_axes = {0: "batch_size", 2: "height", 3: "width"} if dyn_hw else batch
    latent_axes = {0: "batch_size", 2: "height_latent", 3: "width_latent"} if dyn_hw else batch
    if dyn_hw:
        ts = torch.tensor(999.0)
        args = (sample, ts, cond, torch.randn(2, 32), torch.randn(2, 6))
        names = ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"]
        dyn = {"sample": image_axes, "encoder_hidden_states": {0: "batch_size", 1: "sequence_length"},
               "text_embeds": {0: "batch_size"}, "time_ids": {0: "batch_size"}, "out_sample": image_axes}
    elif kind in ("sdxl", "sdxl-inpaint"):
        ts = torch.tensor(999.0)
        args = (sample, ts, cond, torch.randn(2, 32), torch.randn(2, 6))
        names = ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"]
        dyn = {"sample": batch, "encoder_hidden_states": seq, "text_embeds": batch, "time_ids": batch,
               "out_sample": batch}
    else:
        ts = torch.tensor([999, 999], dtype=torch.int64 if kind == "sd15-inpaint" else torch.float32)
        args = (sample, ts, cond)
        names = ["sample", "timestep", "encoder_hidden_states"]
        dyn = {"sample": batch, "timestep": batch, "encoder_hidden_states": seq, "out_sample": batch}
    _export(_Unet(pipe.unet, xl), args, out / "unet" / "model.onnx", names, ["out_sample"], dyn, external=True)
    shutil.copy(tmp / "unet" / "config.json", out / "unet" / "config.json")
    _export(_VaeEncoder(pipe.vae), (torch.randn(1, 3, lat * 8, lat_w * 8),), out / "vae_encoder" / "model.onnx",
            ["sample"], ["latent_parameters"], {"sample": image_axes, "latent_parameters": latent_axes})
    _export(_VaeDecoder(pipe.vae), (torch.randn(1, 4, lat, lat_w),), out / "vae_decoder" / "model.onnx",
            ["latent_sample"], ["sample"], {"latent_sample": latent_axes, "sample": image_axes})
    for part in ("vae_encoder", "vae_decoder"):
        shutil.copy(tmp / "vae" / "config.json", out / part / "config.json")
    index = optimum_model_index(json.loads((tmp / "model_index.json").read_text()))
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.rmtree(tmp)


def optimum_model_index(index: dict) -> dict:
    """A diffusers ``model_index.json`` as Optimum's ONNX export writes it: the ORT pipeline class, the VAE split into
    ``vae_encoder``/``vae_decoder`` ORT models, and no safety checker, feature extractor or image encoder."""
    out = {k: v for k, v in index.items() if k not in ("vae", "safety_checker", "feature_extractor", "image_encoder")}
    out["_class_name"] = "ORT" + index["_class_name"]
    for part in ("vae_encoder", "vae_decoder"):
        out[part] = ["optimum", "ORTModel"]
    return out


# ---------------------------------------------------------------- references
SCHEDULERS = {
    "Euler": lambda c: EulerDiscreteScheduler.from_config(c),
    "Euler a": lambda c: EulerAncestralDiscreteScheduler.from_config(c),
    "DPM++ 2M Karras": lambda c: DPMSolverMultistepScheduler.from_config(c, use_karras_sigmas=True),
    "DDIM": lambda c: DDIMScheduler.from_config(c),
}


def init_image() -> np.ndarray:
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / (SIZE - 1)
    img = np.stack([x, y, 1 - (x + y) / 2], axis=-1)
    img[16:40, 20:44] = (0.9, 0.2, 0.1)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    img[(yy - 44) ** 2 + (xx - 18) ** 2 < 100] = (0.1, 0.3, 0.9)
    return (img * 255).round().astype(np.uint8)


def mask_image() -> np.ndarray:
    m = np.zeros((SIZE, SIZE), np.uint8)
    m[12:44, 16:52] = 255
    return m


PROMPT = "a photo of a red cat sitting on a wooden table, sunset"
NEGATIVE = "blurry, low quality"


def cases_for(kind: str) -> list[dict]:
    out: list[dict] = []
    base = dict(prompt=PROMPT, negative_prompt=NEGATIVE, steps=8, cfg=7.0, seed=1234, width=SIZE, height=SIZE,
                batch=1, clip_skip=None)
    if kind == "sd15":
        for s in SCHEDULERS:
            out.append(dict(base, name=f"txt2img/{s}", mode="txt2img", sampler=s))
            out.append(dict(base, name=f"img2img/{s}", mode="img2img", sampler=s, strength=0.6, seed=77))
        for s in ("Euler", "Euler a"):
            out.append(dict(base, name=f"inpaint-blend/{s}", mode="inpaint", sampler=s, strength=1.0, seed=5))
        out.append(dict(base, name="txt2img/Euler a/batch2", mode="txt2img", sampler="Euler a", batch=2, seed=42))
        out.append(dict(base, name="txt2img/Euler/cfg1", mode="txt2img", sampler="Euler", cfg=1.0, seed=9))
        out.append(dict(base, name="txt2img/DPM++ 2M Karras/20 steps/clip skip 2", mode="txt2img",
                        sampler="DPM++ 2M Karras", steps=20, clip_skip=2, seed=3))
    elif kind in ("sd2-inpaint", "sdxl-inpaint"):  # diffusers' SDXL inpaint defaults to strength 0.9999: 1 given
        seed = 13 if kind == "sd2-inpaint" else 17
        for s in SCHEDULERS:
            out.append(dict(base, name=f"inpaint/{s}", mode="inpaint", sampler=s, strength=1.0, seed=seed))
        out.append(dict(base, name="inpaint/Euler a/strength 0.7", mode="inpaint", sampler="Euler a",
                        strength=0.7, seed=seed + 1))
        out.append(dict(base, name="inpaint/Euler/batch2", mode="inpaint", sampler="Euler", strength=1.0,
                        batch=2, seed=seed + 2))
    elif kind == "sd15-inpaint":
        for s in ("Euler", "Euler a", "DDIM"):
            out.append(dict(base, name=f"inpaint/{s}", mode="inpaint", sampler=s, strength=1.0, seed=11))
        out.append(dict(base, name="inpaint/Euler a/strength 0.7", mode="inpaint", sampler="Euler a",
                        strength=0.7, seed=12))
    elif kind == "sd2v":
        for s in SCHEDULERS:
            out.append(dict(base, name=f"txt2img/{s}", mode="txt2img", sampler=s, seed=21))
    elif kind == "sdxl-dyn":  # non-square both ways: (height, width) in time_ids must not be swapped
        for s, (w, h) in (("Euler", (64, 96)), ("Euler a", (96, 64)), ("DPM++ 2M Karras", (96, 64))):
            out.append(dict(base, name=f"txt2img/{s}/{w}x{h}", mode="txt2img", sampler=s, width=w, height=h,
                            seed=41))
    elif kind == "sdxl":
        for s in SCHEDULERS:
            out.append(dict(base, name=f"txt2img/{s}", mode="txt2img", sampler=s, negative_prompt=None, seed=31))
        out.append(dict(base, name="txt2img/Euler/negative", mode="txt2img", sampler="Euler", seed=32))
        for s in ("Euler a", "DPM++ 2M Karras"):
            out.append(dict(base, name=f"img2img/{s}", mode="img2img", sampler=s, strength=0.6, seed=33))
    return out


def _skip_embeds(pipe, text: str, clip_skip: int) -> torch.Tensor:
    ids = pipe.tokenizer(text, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
    with torch.no_grad():
        out = pipe.text_encoder(ids, output_hidden_states=True)
        norm = dict(pipe.text_encoder.named_modules())
        final = next(m for n, m in norm.items() if n.endswith("final_layer_norm"))
        return final(out.hidden_states[-(clip_skip + 1)])


def run_case(pipe, case: dict, images: dict[str, np.ndarray]) -> np.ndarray:
    sched = SCHEDULERS[case["sampler"]](pipe.scheduler.config)
    common = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"],
                  num_inference_steps=case["steps"], guidance_scale=case["cfg"],
                  generator=torch.Generator("cpu").manual_seed(case["seed"]), num_images_per_prompt=case["batch"],
                  output_type="np")
    if case.get("guidance_rescale"):
        common["guidance_rescale"] = case["guidance_rescale"]
    if case["clip_skip"]:
        # diffusers 0.42's clip_skip reaches for text_encoder.text_model, which transformers 5 no longer has;
        # do what it does (hidden_states[-(clip_skip + 1)], then the final layer norm) and pass the embeddings.
        common["prompt_embeds"] = _skip_embeds(pipe, case["prompt"], case["clip_skip"])
        common["negative_prompt_embeds"] = _skip_embeds(pipe, case["negative_prompt"] or "", case["clip_skip"])
        del common["prompt"], common["negative_prompt"]
    init = Image.fromarray(images["init_image"])
    mode = case["mode"]
    if mode == "txt2img":
        p = type(pipe)(**{**pipe.components, "scheduler": sched}) if not isinstance(
            pipe, (StableDiffusionInpaintPipeline, StableDiffusionXLInpaintPipeline)) else None
        result = p(height=case["height"], width=case["width"], **common)
    elif mode == "img2img" and isinstance(pipe, StableDiffusionXLPipeline):
        p = StableDiffusionXLImg2ImgPipeline(**{**pipe.components, "scheduler": sched},
                                             requires_aesthetics_score=False, force_zeros_for_empty_prompt=True)
        result = p(image=init, strength=case["strength"], **common)
    elif mode == "img2img":
        p = StableDiffusionImg2ImgPipeline(**{**pipe.components, "scheduler": sched})
        result = p(image=init, strength=case["strength"], **common)
    elif isinstance(pipe, (StableDiffusionXLPipeline, StableDiffusionXLInpaintPipeline)):
        p = StableDiffusionXLInpaintPipeline(**{**pipe.components, "scheduler": sched},
                                             requires_aesthetics_score=False, force_zeros_for_empty_prompt=True)
        result = p(image=init, mask_image=Image.fromarray(images["mask"]), strength=case["strength"],
                   height=case["height"], width=case["width"], **common)
    else:
        comps = {**pipe.components, "scheduler": sched}
        p = StableDiffusionInpaintPipeline(**comps)
        result = p(image=init, mask_image=Image.fromarray(images["mask"]), strength=case["strength"],
                   height=case["height"], width=case["width"], **common)
    p.set_progress_bar_config(disable=True)
    return (result.images * 255).round().astype(np.uint8)


def schedule_tables() -> list[dict]:
    """diffusers' timesteps, sigmas and init_noise_sigma for several configs, samplers and step counts."""
    rows = []
    configs = [dict(SD_SCHEDULER, timestep_spacing=spacing, steps_offset=offset)
               for spacing in ("leading", "linspace", "trailing") for offset in (0, 1)]
    configs += [RELEASE_SCHEDULERS["sd15"], dict(RELEASE_SCHEDULERS["sdxl"], interpolation_type="log_linear"),
                dict(RELEASE_SCHEDULERS["sd2v"], beta_schedule="linear", beta_start=0.0001, beta_end=0.02)]
    for cfg in configs:
        for label in SCHEDULERS:
            for steps in (1, 7, 20):
                rows.append(schedule_row(cfg, label, steps)[0])
    return rows


def schedule_row(cfg: dict, label: str, steps: int) -> tuple[dict, Any]:
    """diffusers' ``label`` scheduler (``SCHEDULERS``) from ``cfg``, set to ``steps``: the row the schedule tables
    hold (timesteps, sigmas, init_noise_sigma), and the scheduler."""
    s = SCHEDULERS[label](cfg)
    s.set_timesteps(steps)
    return dict(config=cfg, sampler=label, steps=steps, timesteps=[float(t) for t in s.timesteps],
                sigmas=[float(x) for x in getattr(s, "sigmas", [])], init_noise_sigma=float(s.init_noise_sigma)), s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", type=Path, help="write only the tiny SD 1.x demo folder there (no references)")
    ap.add_argument("--only", nargs="*", help="build only these folders, and not schedules.json "
                    "(sd15, sd15-inpaint, sd2v, sdxl, sdxl-dyn, sd2-inpaint, sdxl-inpaint; default: all of them)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.demo:
        export(build("sd15"), "sd15", args.demo)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    images = {"init_image": init_image(), "mask": mask_image()}
    if args.only is None:
        (OUT / "schedules.json").write_text(json.dumps(schedule_tables()) + "\n")
    for kind in args.only or ["sd15", "sd15-inpaint", "sd2v", "sdxl", "sdxl-dyn", "sd2-inpaint", "sdxl-inpaint"]:
        pipe = build(kind)
        folder = OUT / f"tiny-{kind}"
        export(pipe, kind, folder)
        refs = dict(images)
        cases = cases_for(kind)
        for case in cases:
            refs[case["name"]] = run_case(pipe, case, images)
            print(kind, case["name"], refs[case["name"]].shape, float(refs[case["name"]].std()))
        (folder / "refs.json").write_text(json.dumps(cases, indent=1) + "\n")
        np.savez_compressed(folder / "refs.npz", **refs)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(kind, "folder size", size)


if __name__ == "__main__":
    main()
