"""Write tiny SD 2.x inpainting models in the two forms people download, beside the ONNX folder tiny-sd2-inpaint.

    PYTHONPATH=scripts:core/src /work/refvenv/bin/python scripts/gen_sd2_inpaint_files.py

The model is ``gen_pipeline_refs.build("sd2-inpaint")``: the same random weights as ``tests/data/pipelines/
tiny-sd2-inpaint`` (9-channel UNet with SD 2.x's linear ``proj_in``/``proj_out`` and per-level head counts, an
OpenCLIP-style text encoder with gelu that pads with '!', a 4-channel VAE), every weight a float16 value, so the
fp16 files below hold them exactly and the folder's diffusers references (``refs.npz``) are every form's.

``tests/data/ckpt/sd2-inpaint/``:

- ``512-inpainting-tiny.safetensors``: the layout of Stability's ``512-inpainting-ema.safetensors`` (and of civitai
  finetunes of it): ``model.diffusion_model.*`` (LDM UNet names, ``input_blocks.0.0.weight`` 9 channels wide),
  ``cond_stage_model.model.*`` (OpenCLIP's text tower: ``transformer.resblocks.N`` with a fused ``attn.in_proj``,
  ``positional_embedding``, ``ln_final``, ``text_projection``, ``logit_scale``; one layer more than the diffusers
  text encoder, as the real file holds 24 and SD 2.x stops at the penultimate), ``first_stage_model.*`` (LDM VAE
  names, 1x1 conv attention) and LatentDiffusion's schedule buffers (``betas``, ``alphas_cumprod``...), fp16 (the
  buffers fp32). The names are written here from diffusers' module layout, not by sdrt; diffusers' own converter
  reads the file back (``StableDiffusionInpaintPipeline.from_single_file(..., config=<the folder below>)``): every
  tensor must come back equal, the image the model's own bit for bit, and ``infer_diffusers_model_type`` must call it an inpainting model (``inpainting_v2``
  needs the 1024-wide context of a full-size file; at these widths it says ``inpainting``).
  ``v2-inpainting-inference-tiny.yaml`` is Stability's ``v2-inpainting-inference.yaml`` at these widths; diffusers'
  ``create_unet_diffusers_config_from_ldm`` must make the UNet's config of it (in_channels 9, linear projection,
  heads per level, context width), except ``norm_num_groups``, which that function does not read.
- ``diffusers/``: the layout of the hub's ``stabilityai/stable-diffusion-2-inpainting`` with only the fp16
  variant (``unet/diffusion_pytorch_model.fp16.safetensors``, ``text_encoder/model.fp16.safetensors`` in
  transformers 4's ``text_model.*`` names, ``vae/...``, configs, ``tokenizer/``, ``scheduler/``,
  ``model_index.json`` naming ``StableDiffusionInpaintPipeline``). diffusers' ``from_pretrained(variant="fp16")``
  must give the model's own image bit for bit.

``scripts/sd2_inpaint_files_report.json`` records those checks.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gen_pipeline_refs import OUT, RELEASE_SCHEDULERS, build, cases_for, init_image, mask_image, run_case  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "tests" / "data" / "ckpt" / "sd2-inpaint"
FOLDER = OUT / "tiny-sd2-inpaint"
REPORT = ROOT / "scripts" / "sd2_inpaint_files_report.json"
STEM = "512-inpainting-tiny"


# -- diffusers -> LDM names (Stability's layout) -----------------------------------------------------
_RESNET = (("norm1.", "in_layers.0."), ("conv1.", "in_layers.2."), ("time_emb_proj.", "emb_layers.1."),
           ("norm2.", "out_layers.0."), ("conv2.", "out_layers.3."), ("conv_shortcut.", "skip_connection."))


def _resnet(rest: str) -> str:
    return next((new + rest[len(old):] for old, new in _RESNET if rest.startswith(old)), rest)


def unet_to_ldm(state: dict, layers: int, levels: int, attn_up: set[int]) -> dict:
    """A diffusers UNet2DConditionModel state dict in LDM's ``openaimodel.UNetModel`` names."""
    n = layers + 1  # input_blocks per level (resnets + the downsampler), output_blocks per level
    out = {}
    for k, v in state.items():
        if k.startswith("time_embedding.linear_1."):
            name = "time_embed.0." + k.split(".")[-1]
        elif k.startswith("time_embedding.linear_2."):
            name = "time_embed.2." + k.split(".")[-1]
        elif k.startswith("conv_in."):
            name = "input_blocks.0.0." + k.split(".")[-1]
        elif k.startswith("conv_norm_out."):
            name = "out.0." + k.split(".")[-1]
        elif k.startswith("conv_out."):
            name = "out.2." + k.split(".")[-1]
        elif m := re.match(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", k):
            i, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
            block = f"input_blocks.{n * i + j + 1}"
            name = f"{block}.0.{_resnet(rest)}" if kind == "resnets" else f"{block}.1.{rest}"
        elif m := re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", k):
            name = f"input_blocks.{n * (int(m[1]) + 1)}.0.op.{m[2]}"
        elif m := re.match(r"mid_block\.resnets\.(\d+)\.(.*)", k):
            name = f"middle_block.{2 * int(m[1])}.{_resnet(m[2])}"
        elif m := re.match(r"mid_block\.attentions\.0\.(.*)", k):
            name = f"middle_block.1.{m[1]}"
        elif m := re.match(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", k):
            i, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
            block = f"output_blocks.{n * i + j}"
            name = f"{block}.0.{_resnet(rest)}" if kind == "resnets" else f"{block}.1.{rest}"
        elif m := re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*)", k):
            i = int(m[1])
            name = f"output_blocks.{n * i + n - 1}.{2 if i in attn_up else 1}.conv.{m[2]}"
        else:
            raise KeyError(k)
        out["model.diffusion_model." + name] = v
    assert levels and len(out) == len(state)
    return out


def vae_to_ldm(state: dict, levels: int) -> dict:
    """A diffusers AutoencoderKL state dict in LDM's ``first_stage_model`` names (attention as 1x1 convs)."""
    attn = {"group_norm.": "norm.", "to_q.": "q.", "to_k.": "k.", "to_v.": "v.", "to_out.0.": "proj_out."}
    out = {}
    for k, v in state.items():
        name = k
        if m := re.match(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.*)", k):
            name = f"{m[1]}.mid.block_{int(m[2]) + 1}.{m[3]}"
        elif m := re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.*)", k):
            rest = m[2]
            rest = next(new + rest[len(old):] for old, new in attn.items() if rest.startswith(old))
            name = f"{m[1]}.mid.attn_1.{rest}"
            if v.ndim == 2:
                v = v[:, :, None, None]
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", k):
            name = f"encoder.down.{m[1]}.block.{m[2]}.{m[3]}"
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.*)", k):
            name = f"encoder.down.{m[1]}.downsample.{m[2]}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", k):
            name = f"decoder.up.{levels - 1 - int(m[1])}.block.{m[2]}.{m[3]}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)", k):
            name = f"decoder.up.{levels - 1 - int(m[1])}.upsample.{m[2]}"
        name = name.replace("conv_norm_out.", "norm_out.").replace("conv_shortcut.", "nin_shortcut.")
        out["first_stage_model." + name] = v
    assert len(out) == len(state)
    return out


def openclip_ldm(text: torch.nn.Module, extra_layer_seed: int = 7) -> dict:
    """A transformers CLIPTextModel (SD 2.x's diffusers text encoder: the layers up to the penultimate) as
    ``cond_stage_model.model.*`` of an LDM file: OpenCLIP's names, q/k/v fused into ``in_proj``, and one more
    resblock (random: SD 2.x never runs it; diffusers' converter skips it), ``text_projection`` and ``logit_scale``
    as the real file holds them."""
    sd = {k.removeprefix("text_model."): v for k, v in text.state_dict().items() if "position_ids" not in k}
    p = "cond_stage_model.model."
    width = sd["embeddings.token_embedding.weight"].shape[1]
    out = {p + "token_embedding.weight": sd["embeddings.token_embedding.weight"],
           p + "positional_embedding": sd["embeddings.position_embedding.weight"],
           p + "ln_final.weight": sd["final_layer_norm.weight"], p + "ln_final.bias": sd["final_layer_norm.bias"]}
    layers = text.config.num_hidden_layers
    g = torch.Generator().manual_seed(extra_layer_seed)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).half().float()

    for i in range(layers + 1):
        src = f"encoder.layers.{i}."
        dst = f"{p}transformer.resblocks.{i}."

        def get(name, shape, src=src, own=i < layers):
            return sd[src + name] if own else rnd(*shape)

        d, ff = width, text.config.intermediate_size
        for kind, shape in (("weight", (d, d)), ("bias", (d,))):
            out[dst + f"attn.in_proj_{kind}"] = torch.cat([get(f"self_attn.{q}_proj.{kind}", shape)
                                                           for q in ("q", "k", "v")])
            out[dst + f"attn.out_proj.{kind}"] = get(f"self_attn.out_proj.{kind}", shape)
        for old, new in (("layer_norm1", "ln_1"), ("layer_norm2", "ln_2")):
            out[dst + f"{new}.weight"] = get(f"{old}.weight", (d,))
            out[dst + f"{new}.bias"] = get(f"{old}.bias", (d,))
        out[dst + "mlp.c_fc.weight"] = get("mlp.fc1.weight", (ff, d))
        out[dst + "mlp.c_fc.bias"] = get("mlp.fc1.bias", (ff,))
        out[dst + "mlp.c_proj.weight"] = get("mlp.fc2.weight", (d, ff))
        out[dst + "mlp.c_proj.bias"] = get("mlp.fc2.bias", (d,))
    out[p + "text_projection"] = rnd(width, width)  # x @ P, unused by SD 2.x (it takes the hidden states)
    out[p + "logit_scale"] = torch.tensor(4.6052)
    return out


def schedule_buffers() -> dict:
    """LatentDiffusion's registered buffers (linear_start 0.00085, linear_end 0.012, 1000 steps), fp32."""
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    alphas = torch.cumprod(1 - betas, 0)
    prev = torch.cat([torch.ones(1, dtype=torch.float64), alphas[:-1]])
    post = betas * (1 - prev) / (1 - alphas)
    bufs = {"betas": betas, "alphas_cumprod": alphas, "alphas_cumprod_prev": prev,
            "sqrt_alphas_cumprod": alphas.sqrt(), "sqrt_one_minus_alphas_cumprod": (1 - alphas).sqrt(),
            "log_one_minus_alphas_cumprod": (1 - alphas).log(), "sqrt_recip_alphas_cumprod": (1 / alphas).sqrt(),
            "sqrt_recipm1_alphas_cumprod": (1 / alphas - 1).sqrt(), "posterior_variance": post,
            "posterior_log_variance_clipped": torch.cat([post[1:2], post[1:]]).log(),
            "posterior_mean_coef1": betas * prev.sqrt() / (1 - alphas),
            "posterior_mean_coef2": (1 - prev) * (1 - betas).sqrt() / (1 - alphas)}
    return {k: v.float() for k, v in bufs.items()}


def tiny_yaml(unet_cfg: dict, text_width: int) -> str:
    """Stability's v2-inpainting-inference.yaml, its UNet at the tiny model's widths (num_head_channels: the
    heads diffusers counts per level come from channels / num_head_channels)."""
    ch = unet_cfg["block_out_channels"]
    head_ch = ch[0] // unet_cfg["attention_head_dim"][0]
    attn_res = [2 ** i for i, t in enumerate(unet_cfg["down_block_types"]) if t.startswith("CrossAttn")]
    return f"""model:
  base_learning_rate: 5.0e-05
  target: ldm.models.diffusion.ddpm.LatentInpaintDiffusion
  params:
    linear_start: 0.00085
    linear_end: 0.0120
    num_timesteps_cond: 1
    log_every_t: 200
    timesteps: 1000
    first_stage_key: "jpg"
    cond_stage_key: "txt"
    image_size: 64
    channels: 4
    cond_stage_trainable: false
    conditioning_key: hybrid
    scale_factor: 0.18215
    monitor: val/loss_simple_ema
    finetune_keys: null
    use_ema: False

    unet_config:
      target: ldm.modules.diffusionmodules.openaimodel.UNetModel
      params:
        use_checkpoint: True
        image_size: 32 # unused
        in_channels: {unet_cfg["in_channels"]}
        out_channels: {unet_cfg["out_channels"]}
        model_channels: {ch[0]}
        attention_resolutions: {attn_res}
        num_res_blocks: {unet_cfg["layers_per_block"]}
        channel_mult: {[c // ch[0] for c in ch]}
        num_head_channels: {head_ch}
        use_linear_in_transformer: True
        transformer_depth: 1
        context_dim: {unet_cfg["cross_attention_dim"]}
        legacy: False

    first_stage_config:
      target: ldm.models.autoencoder.AutoencoderKL
      params:
        embed_dim: 4
        monitor: val/rec_loss
        ddconfig:
          double_z: true
          z_channels: 4
          resolution: 256
          in_channels: 3
          out_ch: 3
          ch: 8
          ch_mult: [1, 2, 2, 2]
          num_res_blocks: 1
          attn_resolutions: []
          dropout: 0.0
        lossconfig:
          target: torch.nn.Identity

    cond_stage_config:
      target: ldm.modules.encoders.modules.FrozenOpenCLIPEmbedder
      params:
        freeze: True
        layer: "penultimate"
"""


def fp16(state: dict) -> dict:
    return {k: v.detach().to(torch.float16).contiguous() for k, v in state.items()}


def main() -> None:
    from diffusers import PNDMScheduler, StableDiffusionInpaintPipeline
    from diffusers.loaders.single_file_utils import create_unet_diffusers_config_from_ldm, infer_diffusers_model_type

    torch.set_num_threads(1)
    pipe = build("sd2-inpaint")
    pipe.scheduler = PNDMScheduler.from_pretrained(FOLDER / "scheduler")  # as the references were made
    for m in (pipe.unet, pipe.vae, pipe.text_encoder):
        assert all(torch.equal(p, p.half().float()) for p in m.parameters()), "weights are not fp16 values"
    if DEST.exists():
        shutil.rmtree(DEST)
    folder = DEST / "diffusers"
    folder.mkdir(parents=True)
    # -- the diffusers folder, fp16 variant only ---------------------------------------------------
    pipe.save_pretrained(DEST / "_tmp", safe_serialization=True)
    tmp = DEST / "_tmp"
    for sub, weights, state in (("unet", "diffusion_pytorch_model.fp16.safetensors", pipe.unet.state_dict()),
                                ("vae", "diffusion_pytorch_model.fp16.safetensors", pipe.vae.state_dict()),
                                ("text_encoder", "model.fp16.safetensors",
                                 {("" if k.startswith("text_model.") else "text_model.") + k: v
                                  for k, v in pipe.text_encoder.state_dict().items()})):
        (folder / sub).mkdir()
        shutil.copy(tmp / sub / "config.json", folder / sub / "config.json")
        save_file(fp16(state), str(folder / sub / weights), metadata={"format": "pt"})
    shutil.copytree(FOLDER / "tokenizer", folder / "tokenizer")
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text(
        json.dumps(RELEASE_SCHEDULERS["sd2-inpaint"], indent=2) + "\n")
    index = json.loads((tmp / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.rmtree(tmp)
    # -- the LDM single file -------------------------------------------------------------------------
    ucfg = dict(pipe.unet.config)
    levels = len(ucfg["block_out_channels"])
    attn_up = {i for i, t in enumerate(ucfg["up_block_types"]) if t.startswith("CrossAttn")}
    ldm = {**unet_to_ldm(pipe.unet.state_dict(), ucfg["layers_per_block"], levels, attn_up),
           **openclip_ldm(pipe.text_encoder),
           **vae_to_ldm(pipe.vae.state_dict(), len(pipe.vae.config.block_out_channels))}
    ldm = fp16(ldm)
    ldm.update(schedule_buffers())
    ckpt = DEST / f"{STEM}.safetensors"
    save_file(ldm, str(ckpt))
    yaml = DEST / "v2-inpainting-inference-tiny.yaml"
    yaml.write_text(tiny_yaml(ucfg, pipe.text_encoder.config.hidden_size))
    # -- checks with diffusers' own readers ----------------------------------------------------------
    report: dict = {}
    from safetensors.torch import load_file

    loaded = load_file(str(ckpt))
    # diffusers tells SD 2.x by a 1024-wide context at input_blocks.2.1 (a full-size width): at 32 wide it says
    # "inpainting" (9 channels); the full-size layout is sdrt's tests' (tests/checkpoint/test_sd2_inpaint.py)
    report["infer_diffusers_model_type"] = infer_diffusers_model_type(loaded)
    assert report["infer_diffusers_model_type"] in ("inpainting", "inpainting_v2"), report
    import yaml as pyyaml

    derived = create_unet_diffusers_config_from_ldm(pyyaml.safe_load(yaml.read_text()), loaded)
    compared = {k: (derived.get(k), ucfg[k]) for k in ("in_channels", "out_channels", "block_out_channels",
                                                        "layers_per_block", "cross_attention_dim",
                                                        "attention_head_dim", "use_linear_projection",
                                                        "down_block_types", "up_block_types")}
    norm = lambda v: list(v) if isinstance(v, (tuple, list)) else v  # noqa: E731
    bad = {k: v for k, v in compared.items() if norm(v[0]) != norm(v[1])}
    report["yaml_unet_config"] = {"compared": sorted(compared), "differs": bad}
    assert not bad, bad
    single = StableDiffusionInpaintPipeline.from_single_file(str(ckpt), config=str(folder), local_files_only=True,
                                                             safety_checker=None, requires_safety_checker=False)
    unequal = []
    for part in ("unet", "vae", "text_encoder"):
        a, b = getattr(pipe, part).state_dict(), getattr(single, part).state_dict()
        assert set(a) == set(b), (part, set(a) ^ set(b))
        unequal += [f"{part}.{k}" for k in a if not torch.equal(a[k].float(), b[k].float())]
    report["from_single_file_tensors_unequal"] = unequal
    assert not unequal, unequal[:5]
    hub = StableDiffusionInpaintPipeline.from_pretrained(str(folder), variant="fp16", torch_dtype=torch.float32,
                                                         safety_checker=None, requires_safety_checker=False)
    refs = np.load(FOLDER / "refs.npz")
    images = {"init_image": init_image(), "mask": mask_image()}
    assert all(np.array_equal(refs[k], v) for k, v in images.items())
    # the files' pipelines against the model they were written from: the same image bit for bit; that model's
    # image against refs.npz (made in another process, after the ONNX export): torch's float noise, within 1 level
    report["images"] = {}
    for case in cases_for("sd2-inpaint")[:2]:
        want = run_case(pipe, case, images)
        d = np.abs(want.astype(int) - refs[case["name"]])
        report["images"][f"the model vs refs.npz: {case['name']}"] = {"max": int(d.max()), "share": float((d > 0).mean())}
        assert d.max() <= 1 and (d > 0).mean() <= 0.005, (case["name"], int(d.max()))
        for name, p in (("from_single_file", single), ("from_pretrained fp16 folder", hub)):
            same = bool(np.array_equal(run_case(p, case, images), want))
            report["images"][f"{name} == the model: {case['name']}"] = same
            assert same, (name, case["name"])
    report["files"] = {str(p.relative_to(DEST)): p.stat().st_size for p in sorted(DEST.rglob("*")) if p.is_file()}
    report["ldm_keys"] = len(ldm)
    REPORT.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
