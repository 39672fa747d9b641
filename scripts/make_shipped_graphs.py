"""Export sdrt's shipped weight-free graphs (issue 33) from the releases' published configurations.

Every architecture a civitai-style single file can hold is exported once from its release's
``config.json`` values (written out below, each with the repository path it comes from),
**without materializing weights**: the model is built and exported inside torch's
``FakeTensorMode`` (the full Flux transformer is 12B parameters; nothing is allocated) with
the dynamo exporter, then written as a weight-free graph:

- every initializer is kept as a typed, shaped reference to external data in a file that
  is never shipped (``sdrt.stripped_weights`` metadata, as ``sdrt strip`` writes), so the
  graph loads in sdrt with ``weights=`` naming every initializer, and nowhere else;
- initializer names are the diffusers/transformers state-dict names (the dynamo exporter
  keeps them), so ``sdrt.checkpoint``'s key maps bind single files onto them directly;
- batch, spatial size and sequence length are dynamic axes;
- node metadata and doc strings are dropped, and the file is compressed with lzma
  (``<name>.onnx.xz``); ``sdrt.checkpoint.graphs`` unpacks one into sdrt's cache on first use.

Checks (``check`` step), each against the torch module the graph came from:

- structure at full depth: the graph's initializers are exactly the module's parameters
  (names, shapes, dtypes), and ``sdrt.checkpoint.param_map`` names each one;
- numbers at reduced depth (same widths and heads, fewer blocks; full depth where the
  model fits this machine: CLIP-L, the VAEs): the same export of the module with random
  weights, its weights bound through ``param_map`` by their diffusers names, run by
  onnxruntime at two input sizes, against the module's own outputs. Graphs with an ``attention_mask``
  (``t5xxl``: int64, ``chroma_transformer``: bool ``[batch, text + image]``, as the tiny Chroma folder's
  export takes them) run with padding masked, and the report says how far the module's output moves
  without the mask.

Run with the torch venv (its torchvision does not match its torch: ``tvblock`` hides it):

    PYTHONPATH=scripts/_tvblock:core/src /work/refvenv/bin/python scripts/make_shipped_graphs.py export [NAME...]
    PYTHONPATH=scripts/_tvblock:core/src /work/refvenv/bin/python scripts/make_shipped_graphs.py check [NAME...]
    PYTHONPATH=scripts/_tvblock:core/src:SHIM /work/refvenv/bin/python scripts/make_shipped_graphs.py check-derived

(SHIM: a folder holding a link to pluggy, which sdrt imports and the torch venv lacks.)
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import lzma
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import tvblock  # noqa: F401  (must come before diffusers/transformers are used)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "core" / "src" / "sdrt" / "data" / "graphs"
REPORT = Path(os.environ.get("SDRT_GRAPHS_REPORT", ROOT / "scripts" / "shipped_graphs_report.json"))
OPSET = 18
STRIPPED_KEY = "sdrt.stripped_weights"
B = torch.export.Dim("batch", min=1, max=64)


# -- published configurations ---------------------------------------------------------------
# runwayml/stable-diffusion-v1-5 unet/config.json (the same in CompVis/stable-diffusion-v1-4)
SD1_UNET = dict(act_fn="silu", attention_head_dim=8, block_out_channels=[320, 640, 1280, 1280],
                center_input_sample=False, cross_attention_dim=768,
                down_block_types=["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"], downsample_padding=1,
                flip_sin_to_cos=True, freq_shift=0, in_channels=4, layers_per_block=2, mid_block_scale_factor=1,
                norm_eps=1e-5, norm_num_groups=32, out_channels=4, sample_size=64,
                up_block_types=["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3)
# runwayml/stable-diffusion-inpainting unet/config.json: SD 1.x with 9 input channels
SD1_INPAINT_UNET = {**SD1_UNET, "in_channels": 9}
# timbrooks/instruct-pix2pix unet/config.json: SD 1.x with 8 input channels (noise + the input image's latent)
SD1_IP2P_UNET = {**SD1_UNET, "in_channels": 8}
# stabilityai/stable-diffusion-2-1 unet/config.json (2-base: sample_size 64, otherwise equal)
SD2_UNET = {**SD1_UNET, "attention_head_dim": [5, 10, 20, 20], "cross_attention_dim": 1024,
            "use_linear_projection": True, "sample_size": 96}
# stabilityai/stable-diffusion-2-inpainting unet/config.json: SD 2.x (512, from 2-base) with 9 input channels
SD2_INPAINT_UNET = {**SD2_UNET, "in_channels": 9, "sample_size": 64}
# stabilityai/stable-diffusion-xl-base-1.0 unet/config.json
SDXL_UNET = dict(act_fn="silu", addition_embed_type="text_time", addition_time_embed_dim=256,
                 attention_head_dim=[5, 10, 20], block_out_channels=[320, 640, 1280], center_input_sample=False,
                 cross_attention_dim=2048, down_block_types=["DownBlock2D", "CrossAttnDownBlock2D",
                                                             "CrossAttnDownBlock2D"],
                 downsample_padding=1, flip_sin_to_cos=True, freq_shift=0, in_channels=4, layers_per_block=2,
                 mid_block_scale_factor=1, norm_eps=1e-5, norm_num_groups=32, out_channels=4,
                 projection_class_embeddings_input_dim=2816, sample_size=128,
                 transformer_layers_per_block=[1, 2, 10], up_block_types=["CrossAttnUpBlock2D",
                                                                          "CrossAttnUpBlock2D", "UpBlock2D"],
                 use_linear_projection=True)
# diffusers/stable-diffusion-xl-1.0-inpainting-0.1 unet/config.json: SDXL with 9 input channels
SDXL_INPAINT_UNET = {**SDXL_UNET, "in_channels": 9}
# stabilityai/cosxl cosxl_edit.safetensors (diffusers' from_single_file(num_in_channels=8)): SDXL with 8 input channels
SDXL_IP2P_UNET = {**SDXL_UNET, "in_channels": 8}
# stabilityai/stable-diffusion-xl-refiner-1.0 unet/config.json: what diffusers 0.42.1's
# create_unet_diffusers_config_from_ldm makes of Stability's configs/inference/sd_xl_refiner.yaml (4 levels of
# 384 channels x [1, 2, 4, 4], 4 transformer layers at levels 1-2, context 1280 (CLIP-G only), time ids with the
# aesthetic score: 5 x 256 + 1280 pooled = 2560)
SDXL_REFINER_UNET = dict(SDXL_UNET, attention_head_dim=[6, 12, 24, 24], block_out_channels=[384, 768, 1536, 1536],
                         cross_attention_dim=1280, down_block_types=["DownBlock2D", "CrossAttnDownBlock2D",
                                                                     "CrossAttnDownBlock2D", "DownBlock2D"],
                         projection_class_embeddings_input_dim=2560, transformer_layers_per_block=4,
                         up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"])
# stabilityai/stable-diffusion-3-medium-diffusers transformer/config.json (SD 3 Medium, June 2024: no q/k norm, no
# dual attention; pos_embed 192x192, as diffusers' single-file loader tells it from SD 3.5 Medium's 384x384)
SD3M = dict(attention_head_dim=64, caption_projection_dim=1536, in_channels=16, joint_attention_dim=4096,
            num_attention_heads=24, num_layers=24, out_channels=16, patch_size=2, pooled_projection_dim=2048,
            pos_embed_max_size=192, sample_size=128)
# stabilityai/stable-diffusion-3.5-medium transformer/config.json
SD35M = dict(attention_head_dim=64, caption_projection_dim=1536, in_channels=16, joint_attention_dim=4096,
             num_attention_heads=24, num_layers=24, out_channels=16, patch_size=2, pooled_projection_dim=2048,
             pos_embed_max_size=384, qk_norm="rms_norm", sample_size=128,
             dual_attention_layers=list(range(13)))
# stabilityai/stable-diffusion-3.5-large transformer/config.json
SD35L = dict(attention_head_dim=64, caption_projection_dim=2432, in_channels=16, joint_attention_dim=4096,
             num_attention_heads=38, num_layers=38, out_channels=16, patch_size=2, pooled_projection_dim=2048,
             pos_embed_max_size=192, qk_norm="rms_norm", sample_size=128, dual_attention_layers=[])
# black-forest-labs/FLUX.1-dev transformer/config.json (FLUX.1-schnell: guidance_embeds false)
FLUX_DEV = dict(attention_head_dim=128, axes_dims_rope=[16, 56, 56], guidance_embeds=True, in_channels=64,
                joint_attention_dim=4096, num_attention_heads=24, num_layers=19, num_single_layers=38,
                patch_size=1, pooled_projection_dim=768)
FLUX_SCHNELL = {**FLUX_DEV, "guidance_embeds": False}
# lodestones/Chroma1-HD transformer/config.json (diffusers ChromaTransformer2DModel)
CHROMA = dict(attention_head_dim=128, axes_dims_rope=[16, 56, 56], in_channels=64, joint_attention_dim=4096,
              num_attention_heads=24, num_layers=19, num_single_layers=38, patch_size=1,
              approximator_num_channels=64, approximator_hidden_dim=5120, approximator_layers=5)
# runwayml/stable-diffusion-v1-5 text_encoder/config.json (openai/clip-vit-large-patch14's text tower)
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
              projection_dim=768, bos_token_id=0, eos_token_id=2, pad_token_id=1)
# stabilityai/stable-diffusion-2-1 text_encoder/config.json (OpenCLIP ViT-H/14's text tower, 23 of 24 layers)
OPENCLIP_H = dict(vocab_size=49408, hidden_size=1024, intermediate_size=4096, num_hidden_layers=23,
                  num_attention_heads=16, max_position_embeddings=77, hidden_act="gelu", layer_norm_eps=1e-5,
                  projection_dim=512, bos_token_id=0, eos_token_id=2, pad_token_id=1)
# stabilityai/stable-diffusion-xl-base-1.0 text_encoder_2/config.json (OpenCLIP ViT-bigG/14's text tower)
CLIP_G = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
              num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu", layer_norm_eps=1e-5,
              projection_dim=1280, bos_token_id=0, eos_token_id=2, pad_token_id=1)
# stabilityai/stable-diffusion-3.5-large text_encoder_3/config.json (google/t5-v1_1-xxl's encoder)
T5XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
             relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.1,
             layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)
# runwayml/stable-diffusion-v1-5 vae/config.json (SD 2.x and stabilityai/sdxl-vae: the same architecture)
VAE4 = dict(act_fn="silu", block_out_channels=[128, 256, 512, 512],
            down_block_types=["DownEncoderBlock2D"] * 4, in_channels=3, latent_channels=4, layers_per_block=2,
            norm_num_groups=32, out_channels=3, sample_size=512, up_block_types=["UpDecoderBlock2D"] * 4)
# stabilityai/stable-diffusion-3.5-large vae/config.json; black-forest-labs/FLUX.1-dev vae/config.json is the
# same architecture (they differ in scaling_factor/shift_factor only, which the pipeline applies)
VAE16 = {**VAE4, "latent_channels": 16, "use_quant_conv": False, "use_post_quant_conv": False}


# -- builders ---------------------------------------------------------------------------------
@dataclass
class Spec:
    """One shipped graph: how to build its module, its inputs, names and dynamic axes."""

    name: str
    build: Callable[[dict], torch.nn.Module]
    config: dict
    inputs: Callable[[dict, int], dict]          # (config, size scale) -> {input name: tensor}
    outputs: Callable[[dict], list[str]]
    dynamic: Callable[[dict], dict]
    reduce: dict = field(default_factory=dict)   # config overrides for the numeric check (same widths)
    source: str = ""
    tol: float = 1e-4


def _with_forward(model: torch.nn.Module, forward: Callable) -> torch.nn.Module:
    """``model`` with its class's forward replaced: parameter names stay the module's own (a wrapper
    module would prefix them all)."""
    model.__class__ = type("Export" + type(model).__name__, (type(model),), {"forward": forward})
    return model


def _base(self):
    return type(self).__mro__[1]


# UNets -----------------------------------------------------------------------------------
def build_unet(cfg: dict) -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    xl = cfg.get("addition_embed_type") == "text_time"

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        extra = {"added_cond_kwargs": {"text_embeds": text_embeds, "time_ids": time_ids}} if xl else {}
        return _base(self).forward(self, sample, timestep, encoder_hidden_states, return_dict=False, **extra)[0]

    return _with_forward(UNet2DConditionModel(**cfg).eval(), forward)


def unet_inputs(cfg: dict, s: int) -> dict:
    """The export's example (``s`` 1) has an odd latent, 33x41: diffusers' UNet then gives each upsampler its skip
    connection's size (``forward_upsample_size``), so the graph computes every size from the input's and runs at
    any latent size, as the folders' UNets do after ``sdrt.graph.upsample``; the check's second size is 64x80."""
    g = torch.Generator().manual_seed(s)
    n, hw = 2, ((33, 41) if s == 1 else (32 * s, 40 * s))
    x = {"sample": torch.randn(n, cfg["in_channels"], *hw, generator=g),
         "timestep": torch.tensor([981.0, 17.5])[:n],
         "encoder_hidden_states": torch.randn(n, 77 * s, cfg["cross_attention_dim"], generator=g) * 0.5}
    if cfg.get("addition_embed_type") == "text_time":
        x["text_embeds"] = torch.randn(n, 1280, generator=g) * 0.5
        ids = [1024.0, 1024, 0, 0, 1024, 1024]  # the refiner: (original size, crop, aesthetic score)
        n_ids = (cfg["projection_class_embeddings_input_dim"] - 1280) // cfg["addition_time_embed_dim"]
        x["time_ids"] = torch.tensor([ids if n_ids == 6 else [1024.0, 1024, 0, 0, 6.0]] * n)
    return x


#: the latent sides: free (torch.export would add a guard ``h % 8 != 0`` for the example's odd size, which the ONNX
#: graph does not keep: at sides that halve evenly the skip's size is the scale's own); named after export (_rename)
LATENT = torch.export.Dim.DYNAMIC


def unet_dynamic(cfg: dict) -> dict:
    """Batch, latent sides and text length, all free (a named batch of at most 64 met a guard ``batch <= 63`` with free
    latent sides); ``_name_latent`` names them after export."""
    d = {"sample": {0: LATENT, 2: LATENT, 3: LATENT}, "timestep": {0: LATENT},
         "encoder_hidden_states": {0: LATENT, 1: LATENT}}
    if cfg.get("addition_embed_type") == "text_time":
        d.update(text_embeds={0: LATENT}, time_ids={0: LATENT})
    return d


UNET_REDUCE_SD = dict(layers_per_block=1)
UNET_REDUCE_XL = dict(layers_per_block=1, transformer_layers_per_block=[1, 1, 1])
UNET_REDUCE_XL_REFINER = dict(layers_per_block=1, transformer_layers_per_block=1)


# SD3 / Flux / Chroma transformers --------------------------------------------------------
def build_sd3(cfg: dict) -> torch.nn.Module:
    from diffusers import SD3Transformer2DModel

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep):
        return _base(self).forward(self, hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                                   pooled_projections=pooled_projections, timestep=timestep, return_dict=False)[0]

    return _with_forward(SD3Transformer2DModel(**cfg).eval(), forward)


def sd3_inputs(cfg: dict, s: int) -> dict:
    g = torch.Generator().manual_seed(s)
    n = 2
    return {"hidden_states": torch.randn(n, 16, 4 * s, 4 * s + 2, generator=g),
            "encoder_hidden_states": torch.randn(n, 9 * s, 4096, generator=g),
            "pooled_projections": torch.randn(n, 2048, generator=g),
            "timestep": torch.tensor([981.0, 17.5])}


def sd3_dynamic(cfg: dict) -> dict:
    h, w = torch.export.Dim("h", min=1, max=cfg["pos_embed_max_size"] // 2), torch.export.Dim(
        "w", min=1, max=cfg["pos_embed_max_size"] // 2)
    return {"hidden_states": {0: B, 2: 2 * h, 3: 2 * w}, "encoder_hidden_states": {0: B, 1: torch.export.Dim(
        "text", min=2, max=4096)}, "pooled_projections": {0: B}, "timestep": {0: B}}


def build_flux(cfg: dict) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    guided = cfg["guidance_embeds"]

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids,
                guidance=None):
        return _base(self).forward(self, hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                                   pooled_projections=pooled_projections, timestep=timestep, img_ids=img_ids,
                                   txt_ids=txt_ids, guidance=guidance if guided else None, return_dict=False)[0]

    return _with_forward(FluxTransformer2DModel(**cfg).eval(), forward)


def _ids(h: int, w: int) -> torch.Tensor:
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def flux_inputs(cfg: dict, s: int) -> dict:
    g = torch.Generator().manual_seed(s)
    n, h, w, t = 2, 2 * s, 2 * s + 1, 7 * s
    x = {"hidden_states": torch.randn(n, h * w, 64, generator=g),
         "encoder_hidden_states": torch.randn(n, t, 4096, generator=g),
         "pooled_projections": torch.randn(n, 768, generator=g),
         "timestep": torch.tensor([0.98, 0.25]), "img_ids": _ids(h, w), "txt_ids": torch.zeros(t, 3)}
    if cfg.get("guidance_embeds"):
        x["guidance"] = torch.tensor([3.5, 1.0])
    return x


def flux_dynamic(cfg: dict) -> dict:
    img, txt = torch.export.Dim("image", min=2, max=16384), torch.export.Dim("text", min=2, max=4096)
    d = {"hidden_states": {0: B, 1: img}, "encoder_hidden_states": {0: B, 1: txt}, "pooled_projections": {0: B},
         "timestep": {0: B}, "img_ids": {0: img}, "txt_ids": {0: txt}}
    if cfg.get("guidance_embeds"):
        d["guidance"] = {0: B}
    return d


def _chroma_embed_forward(self, timestep):
    """diffusers' ``ChromaCombinedTimestepTextProjEmbeddings.forward`` with its guidance input made as
    ``zeros_like(timestep)`` instead of ``torch.tensor([0] * batch)`` (a Python list the exporter would
    freeze at the example's batch size); the values are the same."""
    n = self.mod_proj.shape[0]
    t = self.time_proj(timestep).to(dtype=timestep.dtype)
    g = self.guidance_proj(torch.zeros_like(timestep)).to(dtype=timestep.dtype)
    mod = self.mod_proj.to(dtype=t.dtype).unsqueeze(0).expand(timestep.shape[0], -1, -1)
    tg = torch.cat([t, g], dim=1).unsqueeze(1).expand(-1, n, -1)
    return torch.cat([tg, mod], dim=-1).to(timestep.dtype)


def _masked_attention(query, key, value, attn_mask=None, **kwargs):
    """The attention of Flux's processor (``[batch, tokens, heads, dim]``) with a boolean ``attn_mask``
    (``[batch, 1, tokens, tokens]``, true = attend) written out for the export: masked scores get the
    dtype's minimum, the softmax runs, then masked weights are set to zero. A row with some key left equals
    torch's boolean-mask ``scaled_dot_product_attention``; a row with none (a dropped padding token) comes
    out as zeros, as torch gives, never NaN (tests/data/pipelines/tiny-chroma is exported the same way)."""
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    keep = attn_mask.bool()
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    weights = scores.softmax(-1).masked_fill(~keep, 0.0)
    return (weights @ v).transpose(1, 2)


class _ExportAttention:
    """While exporting: diffusers' Flux attention processor calls ``_masked_attention`` instead of its
    attention dispatcher (torch's SDPA). Outside it, the module is diffusers' own: the numeric check's
    reference runs torch's boolean-mask SDPA."""

    def __enter__(self):
        from diffusers.models.transformers import transformer_flux

        self.old = transformer_flux.dispatch_attention_fn
        transformer_flux.dispatch_attention_fn = _masked_attention

    def __exit__(self, *exc):
        from diffusers.models.transformers import transformer_flux

        transformer_flux.dispatch_attention_fn = self.old


def build_chroma(cfg: dict) -> torch.nn.Module:
    from diffusers import ChromaTransformer2DModel
    from diffusers.models.transformers import transformer_chroma

    transformer_chroma.ChromaCombinedTimestepTextProjEmbeddings.forward = _chroma_embed_forward

    def forward(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, attention_mask):
        return _base(self).forward(self, hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                                   timestep=timestep, img_ids=img_ids, txt_ids=txt_ids,
                                   attention_mask=attention_mask, return_dict=False)[0]

    m = _with_forward(ChromaTransformer2DModel(**cfg).eval(), forward)
    m._sdrt_export_context = _ExportAttention
    return m


def chroma_inputs(cfg: dict, s: int) -> dict:
    """Flux's inputs less ``pooled_projections``, plus ChromaPipeline's boolean mask ``[batch, text + image]``:
    row 0 keeps 3 real tokens and the first padding token and drops the rest of the text (their rows have no
    key left), row 1 keeps all its text; every image token is kept."""
    x = flux_inputs({}, s)
    del x["pooled_projections"]
    n, t = x["encoder_hidden_states"].shape[:2]
    mask = torch.ones(n, t + x["hidden_states"].shape[1], dtype=torch.bool)
    mask[0, 4:t] = False
    x["attention_mask"] = mask
    return x


def chroma_dynamic(cfg: dict) -> dict:
    d = flux_dynamic({})
    del d["pooled_projections"]
    d["attention_mask"] = {0: B, 1: torch.export.Dim.AUTO}  # text + image tokens: a sum torch.export derives
    return d


# text encoders --------------------------------------------------------------------------
def build_clip(cfg: dict, projection: bool) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cls = CLIPTextModelWithProjection if projection else CLIPTextModel

    def forward(self, input_ids):
        o = _base(self).forward(self, input_ids=input_ids, output_hidden_states=True, return_dict=True)
        first = (o.text_embeds, o.last_hidden_state) if projection else (o.last_hidden_state, o.pooler_output)
        return (*first, *o.hidden_states)

    m = cls(CLIPTextConfig(**cfg, attn_implementation="eager")).eval()
    return _with_forward(m, forward)


def clip_inputs(cfg: dict, s: int) -> dict:
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(3, cfg["vocab_size"] - 1, (2, 77 if s == 1 else 20), generator=g)
    ids[:, 0] = 49406
    ids[0, 9:] = 49407
    ids[1, -1] = 49407
    return {"input_ids": ids}


def clip_outputs(cfg: dict, projection: bool) -> list[str]:
    first = ["text_embeds", "last_hidden_state"] if projection else ["last_hidden_state", "pooler_output"]
    return first + [f"hidden_states.{i}" for i in range(cfg["num_hidden_layers"] + 1)]


def text_dynamic(cfg: dict) -> dict:
    return {"input_ids": {0: B, 1: torch.export.Dim("sequence", min=2, max=77)}}


def build_t5(cfg: dict) -> torch.nn.Module:
    from transformers import T5Config, T5EncoderModel

    def forward(self, input_ids, attention_mask):
        return _base(self).forward(self, input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    m = T5EncoderModel(T5Config(**cfg, attn_implementation="eager")).eval()
    return _with_forward(m, forward)


def t5_inputs(cfg: dict, s: int) -> dict:
    """Token ids and the tokenizer's int64 mask (as Optimum's T5 encoder and the tiny Chroma folder take
    them): row 0 is 5 tokens, ``</s>`` and padding (masked), row 1 is all tokens (mask all ones)."""
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(2, cfg["vocab_size"] - 100, (2, 16 * s + 3), generator=g)
    ids[0, 5] = 1
    ids[0, 6:] = 0
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def t5_dynamic(cfg: dict) -> dict:
    seq = torch.export.Dim("sequence", min=2, max=4096)
    return {"input_ids": {0: B, 1: seq}, "attention_mask": {0: B, 1: seq}}


# VAEs ----------------------------------------------------------------------------------
def build_vae(cfg: dict, part: str) -> torch.nn.Module:
    from diffusers import AutoencoderKL

    def dec(self, latent_sample):
        return self.decode(latent_sample, return_dict=False)[0]

    def enc(self, sample):
        return self.encode(sample).latent_dist.parameters

    m = _with_forward(AutoencoderKL(**cfg).eval(), dec if part == "decoder" else enc)
    m._sdrt_unused = ("encoder.", "quant_conv.") if part == "decoder" else ("decoder.", "post_quant_conv.")
    return m


def vae_inputs(cfg: dict, s: int, part: str) -> dict:
    g = torch.Generator().manual_seed(s)
    h, w = 4 * s, 4 * s + 2
    if part == "decoder":
        return {"latent_sample": torch.randn(2, cfg["latent_channels"], h, w, generator=g)}
    return {"sample": torch.rand(2, 3, 8 * h, 8 * w, generator=g) * 2 - 1}


def vae_dynamic(cfg: dict, part: str) -> dict:
    h, w = torch.export.Dim("h", min=1, max=512), torch.export.Dim("w", min=1, max=512)
    if part == "decoder":
        return {"latent_sample": {0: B, 2: h, 3: w}}
    return {"sample": {0: B, 2: 8 * h, 3: 8 * w}}


def _unet_spec(name, cfg, reduce, source):
    return Spec(name, build_unet, cfg, unet_inputs, lambda c: ["out_sample"], unet_dynamic, reduce, source)


SPECS: dict[str, Spec] = {s.name: s for s in [
    _unet_spec("sd1_unet", SD1_UNET, UNET_REDUCE_SD, "runwayml/stable-diffusion-v1-5 unet/config.json"),
    _unet_spec("sd1_inpaint_unet", SD1_INPAINT_UNET, UNET_REDUCE_SD,
               "runwayml/stable-diffusion-inpainting unet/config.json"),
    _unet_spec("sd1_ip2p_unet", SD1_IP2P_UNET, UNET_REDUCE_SD, "timbrooks/instruct-pix2pix unet/config.json"),
    _unet_spec("sd2_unet", SD2_UNET, UNET_REDUCE_SD, "stabilityai/stable-diffusion-2-1 unet/config.json"),
    _unet_spec("sd2_inpaint_unet", SD2_INPAINT_UNET, UNET_REDUCE_SD,
               "stabilityai/stable-diffusion-2-inpainting unet/config.json"),
    _unet_spec("sdxl_unet", SDXL_UNET, UNET_REDUCE_XL, "stabilityai/stable-diffusion-xl-base-1.0 unet/config.json"),
    _unet_spec("sdxl_inpaint_unet", SDXL_INPAINT_UNET, UNET_REDUCE_XL,
               "diffusers/stable-diffusion-xl-1.0-inpainting-0.1 unet/config.json"),
    _unet_spec("sdxl_ip2p_unet", SDXL_IP2P_UNET, UNET_REDUCE_XL,
               "stabilityai/cosxl cosxl_edit.safetensors (SDXL base's unet/config.json, in_channels 8)"),
    _unet_spec("sdxl_refiner_unet", SDXL_REFINER_UNET, UNET_REDUCE_XL_REFINER,
               "stabilityai/stable-diffusion-xl-refiner-1.0 unet/config.json (Stability's sd_xl_refiner.yaml)"),
    Spec("sd3_medium_transformer", build_sd3, SD3M, sd3_inputs, lambda c: ["out_hidden_states"], sd3_dynamic,
         dict(num_layers=2), "stabilityai/stable-diffusion-3-medium-diffusers transformer/config.json", 2e-4),
    Spec("sd35_medium_transformer", build_sd3, SD35M, sd3_inputs, lambda c: ["out_hidden_states"], sd3_dynamic,
         dict(num_layers=2, dual_attention_layers=[0]), "stabilityai/stable-diffusion-3.5-medium "
         "transformer/config.json", 2e-4),
    Spec("sd35_large_transformer", build_sd3, SD35L, sd3_inputs, lambda c: ["out_hidden_states"], sd3_dynamic,
         dict(num_layers=2), "stabilityai/stable-diffusion-3.5-large transformer/config.json", 2e-4),
    Spec("flux_dev_transformer", build_flux, FLUX_DEV, flux_inputs, lambda c: ["out_hidden_states"], flux_dynamic,
         dict(num_layers=1, num_single_layers=1), "black-forest-labs/FLUX.1-dev transformer/config.json", 2e-4),
    Spec("flux_schnell_transformer", build_flux, FLUX_SCHNELL, flux_inputs, lambda c: ["out_hidden_states"],
         flux_dynamic, dict(num_layers=1, num_single_layers=1),
         "black-forest-labs/FLUX.1-schnell transformer/config.json", 2e-4),
    Spec("chroma_transformer", build_chroma, CHROMA, chroma_inputs, lambda c: ["out_hidden_states"],
         chroma_dynamic, dict(num_layers=1, num_single_layers=1), "lodestones/Chroma1-HD transformer/config.json",
         2e-4),
    Spec("clip_l", lambda c: build_clip(c, False), CLIP_L, clip_inputs, lambda c: clip_outputs(c, False),
         text_dynamic, {}, "runwayml/stable-diffusion-v1-5 text_encoder/config.json"),
    Spec("clip_l_proj", lambda c: build_clip(c, True), CLIP_L, clip_inputs, lambda c: clip_outputs(c, True),
         text_dynamic, {}, "stabilityai/stable-diffusion-3.5-large text_encoder/config.json"),
    Spec("openclip_h", lambda c: build_clip(c, False), OPENCLIP_H, clip_inputs, lambda c: clip_outputs(c, False),
         text_dynamic, dict(num_hidden_layers=3), "stabilityai/stable-diffusion-2-1 text_encoder/config.json"),
    Spec("clip_g", lambda c: build_clip(c, True), CLIP_G, clip_inputs, lambda c: clip_outputs(c, True),
         text_dynamic, dict(num_hidden_layers=3), "stabilityai/stable-diffusion-xl-base-1.0 "
         "text_encoder_2/config.json"),
    Spec("t5xxl", build_t5, T5XXL, t5_inputs, lambda c: ["last_hidden_state"], t5_dynamic, dict(num_layers=1),
         "stabilityai/stable-diffusion-3.5-large text_encoder_3/config.json (google/t5-v1_1-xxl)", 2e-4),
    Spec("vae4_decoder", lambda c: build_vae(c, "decoder"), VAE4, lambda c, s: vae_inputs(c, s, "decoder"),
         lambda c: ["sample"], lambda c: vae_dynamic(c, "decoder"), {}, "runwayml/stable-diffusion-v1-5 "
         "vae/config.json"),
    Spec("vae4_encoder", lambda c: build_vae(c, "encoder"), VAE4, lambda c, s: vae_inputs(c, s, "encoder"),
         lambda c: ["latent_parameters"], lambda c: vae_dynamic(c, "encoder"), {},
         "runwayml/stable-diffusion-v1-5 vae/config.json"),
    Spec("vae16_decoder", lambda c: build_vae(c, "decoder"), VAE16, lambda c, s: vae_inputs(c, s, "decoder"),
         lambda c: ["sample"], lambda c: vae_dynamic(c, "decoder"), {}, "stabilityai/stable-diffusion-3.5-large "
         "vae/config.json"),
    Spec("vae16_encoder", lambda c: build_vae(c, "encoder"), VAE16, lambda c, s: vae_inputs(c, s, "encoder"),
         lambda c: ["latent_parameters"], lambda c: vae_dynamic(c, "encoder"), {},
         "stabilityai/stable-diffusion-3.5-large vae/config.json"),
]}


# IP-Adapter's image encoder ----------------------------------------------------------------
# h94/IP-Adapter models/image_encoder/config.json (laion/CLIP-ViT-H-14-laion2B-s32B-b79K's vision tower)
CLIP_VISION_H = dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=16, num_hidden_layers=32,
                     image_size=224, patch_size=14, projection_dim=1024, hidden_act="gelu", layer_norm_eps=1e-5,
                     num_channels=3)


def build_clip_vision(cfg: dict) -> torch.nn.Module:
    """transformers' CLIPVisionModelWithProjection as ``pixel_values -> image_embeds`` (what the base IP-Adapter
    reads) and ``penultimate_hidden_states`` (``hidden_states[-2]``, all tokens: what IP-Adapter Plus reads)."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    def forward(self, pixel_values):
        out = _base(self).forward(self, pixel_values=pixel_values, output_hidden_states=True, return_dict=True)
        return out.image_embeds, out.hidden_states[-2]

    m = CLIPVisionModelWithProjection(CLIPVisionConfig(**cfg, attn_implementation="eager")).eval()
    return _with_forward(m, forward)


def clip_vision_inputs(cfg: dict, s: int) -> dict:
    g = torch.Generator().manual_seed(s)
    return {"pixel_values": torch.randn(2 if s == 1 else 1, 3, cfg["image_size"], cfg["image_size"], generator=g)}


SPECS["clip_vision_h"] = Spec("clip_vision_h", build_clip_vision, CLIP_VISION_H, clip_vision_inputs,
                              lambda c: ["image_embeds", "penultimate_hidden_states"],
                              lambda c: {"pixel_values": {0: B}},
                              dict(num_hidden_layers=2), "h94/IP-Adapter models/image_encoder/config.json")
# h94/IP-Adapter sdxl_models/image_encoder/config.json (laion/CLIP-ViT-bigG-14-laion2B-39B-b160k's vision tower; the
# same as ComfyUI's comfy/clip_vision_config_g.json): what ip-adapter_sdxl and ip-adapter_sd15_vit-G read
CLIP_VISION_G = dict(hidden_size=1664, intermediate_size=8192, num_attention_heads=16, num_hidden_layers=48,
                     image_size=224, patch_size=14, projection_dim=1280, hidden_act="gelu", layer_norm_eps=1e-5,
                     num_channels=3)
SPECS["clip_vision_g"] = Spec("clip_vision_g", build_clip_vision, CLIP_VISION_G, clip_vision_inputs,
                              lambda c: ["image_embeds", "penultimate_hidden_states"],
                              lambda c: {"pixel_values": {0: B}},
                              dict(num_hidden_layers=2), "h94/IP-Adapter sdxl_models/image_encoder/config.json")

# openai/clip-vit-large-patch14 config.json's vision_config (sd-webui-controlnet's config_clip_vitl): the encoder of
# TencentARC's T2I-Adapter style adapter (t2iadapter_style_sd14v1), which reads its last_hidden_state (all tokens,
# before post_layernorm)
CLIP_VISION_L = dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24,
                     image_size=224, patch_size=14, projection_dim=768, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                     num_channels=3)


def build_clip_vision_last(cfg: dict) -> torch.nn.Module:
    """transformers' CLIPVisionModelWithProjection as ``pixel_values -> image_embeds, last_hidden_state``."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    def forward(self, pixel_values):
        out = _base(self).forward(self, pixel_values=pixel_values, return_dict=True)
        return out.image_embeds, out.last_hidden_state

    m = CLIPVisionModelWithProjection(CLIPVisionConfig(**cfg, attn_implementation="eager")).eval()
    return _with_forward(m, forward)


SPECS["clip_vision_l"] = Spec("clip_vision_l", build_clip_vision_last, CLIP_VISION_L, clip_vision_inputs,
                              lambda c: ["image_embeds", "last_hidden_state"],
                              lambda c: {"pixel_values": {0: B}},
                              dict(num_hidden_layers=2), "openai/clip-vit-large-patch14/config.json vision_config")


# ControlNets (issue 36: a ControlNet .safetensors bound onto a shipped graph) ------------------
# lllyasviel/control_v11p_sd15_canny config.json: the SD 1.5 UNet's encoder, a 3-channel hint
SD1_CONTROLNET = dict(act_fn="silu", attention_head_dim=8, block_out_channels=[320, 640, 1280, 1280],
                      conditioning_channels=3, conditioning_embedding_out_channels=[16, 32, 96, 256],
                      controlnet_conditioning_channel_order="rgb", cross_attention_dim=768,
                      down_block_types=["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"], downsample_padding=1,
                      flip_sin_to_cos=True, freq_shift=0, in_channels=4, layers_per_block=2, mid_block_scale_factor=1,
                      norm_eps=1e-5, norm_num_groups=32, only_cross_attention=False, upcast_attention=False,
                      use_linear_projection=False)
# diffusers/controlnet-canny-sdxl-1.0 config.json: the SDXL base UNet's encoder
SDXL_CONTROLNET = dict(act_fn="silu", addition_embed_type="text_time", addition_time_embed_dim=256,
                       attention_head_dim=[5, 10, 20], block_out_channels=[320, 640, 1280], conditioning_channels=3,
                       conditioning_embedding_out_channels=[16, 32, 96, 256],
                       controlnet_conditioning_channel_order="rgb", cross_attention_dim=2048,
                       down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                       downsample_padding=1, flip_sin_to_cos=True, freq_shift=0, in_channels=4, layers_per_block=2,
                       mid_block_scale_factor=1, norm_eps=1e-5, norm_num_groups=32,
                       projection_class_embeddings_input_dim=2816, transformer_layers_per_block=[1, 2, 10],
                       use_linear_projection=True)


def build_controlnet(cfg: dict) -> torch.nn.Module:
    """diffusers' ``ControlNetModel`` with the inputs and outputs of the ControlNet ONNX folders sdrt runs
    (``scripts/gen_controlnet_refs.py``): the residuals come out already multiplied by ``conditioning_scale``."""
    from diffusers import ControlNetModel

    xl = cfg.get("addition_embed_type") == "text_time"

    def forward(self, sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale, text_embeds=None,
                time_ids=None):
        added = {"text_embeds": text_embeds, "time_ids": time_ids} if xl else None
        down, mid = _base(self).forward(self, sample, timestep, encoder_hidden_states, controlnet_cond,
                                        conditioning_scale, added_cond_kwargs=added, guess_mode=False,
                                        return_dict=False)
        return (*down, mid)

    return _with_forward(ControlNetModel(**cfg).eval(), forward)


def controlnet_inputs(cfg: dict, s: int) -> dict:
    x = unet_inputs({**cfg, "in_channels": 4}, s)
    g = torch.Generator().manual_seed(10 + s)
    n, (h, w) = x["sample"].shape[0], x["sample"].shape[2:]
    x["controlnet_cond"] = torch.rand(n, cfg["conditioning_channels"], 8 * h, 8 * w, generator=g)
    x["conditioning_scale"] = torch.tensor(0.8)
    # the ONNX folders' order: the control inputs before SDXL's text_embeds/time_ids
    order = ["sample", "timestep", "encoder_hidden_states", "controlnet_cond", "conditioning_scale", "text_embeds",
             "time_ids"]
    return {k: x[k] for k in order if k in x}


def controlnet_outputs(cfg: dict) -> list[str]:
    nb, lpb = len(cfg["block_out_channels"]), cfg["layers_per_block"]
    n = 1 + nb * lpb + (nb - 1)
    return [f"down_block_res_samples_{i}" for i in range(n)] + ["mid_block_res_sample"]


def controlnet_dynamic(cfg: dict) -> dict:
    """The UNet's axes (batch, any latent size, text length); the control image is 8x the latent."""
    h, w, s = torch.export.Dim("h", min=1, max=4096), torch.export.Dim("w", min=1, max=4096), torch.export.Dim(
        "text", min=1, max=77 * 32)
    d = {"sample": {0: B, 2: h, 3: w}, "timestep": {0: B}, "encoder_hidden_states": {0: B, 1: s},
         "controlnet_cond": {0: B, 2: 8 * h, 3: 8 * w}, "conditioning_scale": None}
    if cfg.get("addition_embed_type") == "text_time":
        d.update(text_embeds={0: B}, time_ids={0: B})
    return d


def _controlnet_spec(name, cfg, reduce, source):
    return Spec(name, build_controlnet, cfg, controlnet_inputs, controlnet_outputs, controlnet_dynamic, reduce, source)


# the UNets a ControlNet feeds: the shipped UNets with diffusers' residual inputs, as the ControlNet ONNX
# folders' unet/ takes them (down_block_additional_residual_0..N, mid_block_additional_residual)
def _residual_levels(cfg: dict) -> list[tuple[int, int]]:
    """(channels, downsampling level) of each down residual, then the mid one."""
    boc, lpb = cfg["block_out_channels"], cfg["layers_per_block"]
    out = [(boc[0], 0)]
    for b, ch in enumerate(boc):
        out += [(ch, b)] * lpb
        if b < len(boc) - 1:
            out.append((ch, b + 1))
    return out + [(boc[-1], len(boc) - 1)]


def _residual_names(cfg: dict) -> list[str]:
    n = len(_residual_levels(cfg)) - 1
    return [f"down_block_additional_residual_{i}" for i in range(n)] + ["mid_block_additional_residual"]


def build_unet_controlnet(cfg: dict) -> torch.nn.Module:
    import inspect

    from diffusers import UNet2DConditionModel

    xl = cfg.get("addition_embed_type") == "text_time"
    names = _residual_names(cfg)

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None, **residuals):
        extra = {"added_cond_kwargs": {"text_embeds": text_embeds, "time_ids": time_ids}} if xl else {}
        down = tuple(residuals[n] for n in names[:-1])
        return _base(self).forward(self, sample, timestep, encoder_hidden_states, return_dict=False,
                                   down_block_additional_residuals=down,
                                   mid_block_additional_residual=residuals[names[-1]], **extra)[0]

    # the exporter binds inputs by the signature: name every residual (they arrive in **residuals)
    P = inspect.Parameter
    first = ["sample", "timestep", "encoder_hidden_states"] + (["text_embeds", "time_ids"] if xl else [])
    forward.__signature__ = inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in ["self", *first, *names]])
    return _with_forward(UNet2DConditionModel(**cfg).eval(), forward)


def unet_controlnet_inputs(cfg: dict, s: int) -> dict:
    x = unet_inputs(cfg, s)
    g = torch.Generator().manual_seed(20 + s)
    n, (h, w) = x["sample"].shape[0], x["sample"].shape[2:]
    for name, (ch, lvl) in zip(_residual_names(cfg), _residual_levels(cfg)):  # an odd side halves up (ceil)
        x[name] = torch.randn(n, ch, -(-h // 2 ** lvl), -(-w // 2 ** lvl), generator=g) * 0.5
    return x


def unet_controlnet_dynamic(cfg: dict) -> dict:
    """The UNet's axes; each residual's sides are free too (the latent's halved up per level: torch.export relates
    them to the latent's)."""
    d = unet_dynamic(cfg)
    for name in _residual_names(cfg):
        d[name] = {0: LATENT, 2: LATENT, 3: LATENT}
    return d


def _unet_controlnet_spec(name, cfg, reduce, source):
    return Spec(name, build_unet_controlnet, cfg, unet_controlnet_inputs, lambda c: ["out_sample"],
                unet_controlnet_dynamic, reduce, source)


# xinsir/controlnet-union-sdxl-1.0 config.json (diffusers' ControlNetUnionModel): SDXL's ControlNet encoder plus a
# task embedding per control type and a small transformer over the condition features. The promax file holds 8 control
# types (tile and inpaint added), the first release 6: exported at 8; sdrt.checkpoint.graphs derives the 6-type graph
SDXL_UNION_CONTROLNET = {**SDXL_CONTROLNET, "num_control_type": 8, "num_trans_channel": 320, "num_trans_head": 8,
                         "num_trans_layer": 1, "num_proj_channel": 320}


def build_union_controlnet(cfg: dict) -> torch.nn.Module:
    """diffusers' ``ControlNetUnionModel`` for one condition image of one control type (the common unit): inputs as the
    SDXL ControlNet graph's, plus ``control_type`` ``[batch, num_control_type]`` (1 at the types in use, as the union
    pipeline makes it) and ``control_type_idx`` ``[1]`` int64 (the type of the image); the residuals come out times
    ``conditioning_scale`` (diffusers' one-image path)."""
    from diffusers import ControlNetUnionModel

    def forward(self, sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale, text_embeds,
                time_ids, control_type, control_type_idx):
        down, mid = _base(self).forward(self, sample, timestep, encoder_hidden_states, [controlnet_cond],
                                        control_type, control_type_idx, [conditioning_scale],
                                        added_cond_kwargs={"text_embeds": text_embeds, "time_ids": time_ids},
                                        guess_mode=False, return_dict=False)
        return (*down, mid)

    return _with_forward(ControlNetUnionModel(**cfg).eval(), forward)


def union_controlnet_inputs(cfg: dict, s: int) -> dict:
    x = controlnet_inputs(cfg, s)
    n = x["sample"].shape[0]
    k = cfg["num_control_type"]
    x["control_type"] = torch.zeros(n, k).index_fill_(1, torch.tensor([s % k]), 1.0)
    x["control_type_idx"] = torch.tensor([s % k], dtype=torch.int64)
    return x


def union_controlnet_dynamic(cfg: dict) -> dict:
    return {**controlnet_dynamic(cfg), "control_type": {0: B}, "control_type_idx": None}


CONTROLNET_SPECS: dict[str, Spec] = {s.name: s for s in [
    _controlnet_spec("sd1_controlnet", SD1_CONTROLNET, UNET_REDUCE_SD,
                     "lllyasviel/control_v11p_sd15_canny config.json"),
    _controlnet_spec("sdxl_controlnet", SDXL_CONTROLNET, UNET_REDUCE_XL,
                     "diffusers/controlnet-canny-sdxl-1.0 config.json"),
    _unet_controlnet_spec("sd1_unet_controlnet", SD1_UNET, UNET_REDUCE_SD,
                          "runwayml/stable-diffusion-v1-5 unet/config.json, with ControlNet residual inputs"),
    _unet_controlnet_spec("sdxl_unet_controlnet", SDXL_UNET, UNET_REDUCE_XL,
                          "stabilityai/stable-diffusion-xl-base-1.0 unet/config.json, with ControlNet residual inputs"),
    Spec("sdxl_union_controlnet", build_union_controlnet, SDXL_UNION_CONTROLNET, union_controlnet_inputs,
         controlnet_outputs, union_controlnet_dynamic, UNET_REDUCE_XL,
         "xinsir/controlnet-union-sdxl-1.0 config.json (promax: num_control_type 8)"),
]}
SPECS.update(CONTROLNET_SPECS)


# -- export -------------------------------------------------------------------------------
def export_program(spec: Spec, cfg: dict, fake: bool):
    """torch.onnx's dynamo export of the spec's module; in FakeTensorMode nothing is allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def run():
        model = spec.build(cfg)
        x = spec.inputs(cfg, 1)
        dyn = {k: v for k, v in spec.dynamic(cfg).items() if k in x}
        with torch.no_grad(), getattr(model, "_sdrt_export_context", contextlib.nullcontext)():
            prog = torch.onnx.export(model, (), kwargs=x, dynamo=True, input_names=list(x),
                                     output_names=spec.outputs(cfg), dynamic_shapes=dyn, opset_version=OPSET,
                                     optimize=False, verbose=False)
        return model, prog

    if fake:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return run()
    return run()


def chroma_buffers(cfg: dict) -> dict:
    """Chroma's ``mod_proj``: a non-persistent buffer computed from its config (no checkpoint holds it)."""
    from diffusers.models.transformers.transformer_chroma import ChromaCombinedTimestepTextProjEmbeddings

    m = ChromaCombinedTimestepTextProjEmbeddings(cfg["approximator_num_channels"] // 4,
                                                 3 * cfg["num_single_layers"] + 2 * 6 * cfg["num_layers"] + 2)
    return {"time_text_embed.mod_proj": m.mod_proj.numpy()}


BUFFERS = {"chroma_transformer": chroma_buffers}
#: names for axes the exporter derives itself (``Dim.AUTO``), as the tiny Chroma folder's export names them
AXIS_NAMES = {"chroma_transformer": {"attention_mask": {1: "text + image"}}}


def weight_free(prog, name: str, source: str, buffers: dict | None = None):
    """The exported program as a weight-free ONNX model: initializers typed external references to a
    file that does not exist; folded with onnxscript's optimizer first (weights as unknown values)."""
    import onnx
    import onnx_ir as ir
    import onnxscript.optimizer

    logging.getLogger("onnx_ir").setLevel(logging.ERROR)

    model = prog.model
    infos = {}
    for k, v in model.graph.initializers.items():
        shape = tuple(int(d) for d in v.shape)
        if k.endswith("position_ids"):  # a buffer, not a weight: arange, kept in the graph
            v.const_value = ir.tensor(np.arange(shape[-1], dtype=np.int64).reshape(shape), name=k)
            continue
        if buffers and k in buffers:  # a buffer computed from the config: real values, kept in the graph
            v.const_value = ir.tensor(np.asarray(buffers[k]).astype(np.float32).reshape(shape), name=k)
            continue
        infos[k] = (shape, v.dtype)
        v.const_value = None  # unknown to the optimizer: nothing reads fake data
    onnxscript.optimizer.optimize_ir(model)
    live = [k for k in model.graph.initializers if k in infos]
    proto = ir.serde.serialize_model(model)
    used = set(live)
    location = f"{name}.weights.safetensors"
    for k in live:
        shape, dtype = infos[k]
        new = onnx.TensorProto(name=k, data_type=int(dtype), dims=shape)
        entry = new.external_data.add()
        entry.key, entry.value = "location", location
        new.data_location = onnx.TensorProto.EXTERNAL
        proto.graph.initializer.append(new)
    _clean(proto)
    for value in proto.graph.input:
        for axis, label in AXIS_NAMES.get(name, {}).get(value.name, {}).items():
            value.type.tensor_type.shape.dim[axis].dim_param = label
    _name_latent(proto)
    del proto.metadata_props[:]
    for k, v in ((STRIPPED_KEY, location), ("sdrt.weight_free", "1"), ("sdrt.architecture", name),
                 ("sdrt.config_source", source)):
        p = proto.metadata_props.add()
        p.key, p.value = k, v
    proto.producer_name, proto.doc_string = "sdrt scripts/make_shipped_graphs.py", ""
    return proto, used


def _name_latent(proto) -> None:
    """A UNet's free axes (``LATENT``: torch.export names them ``s37``...) named ``batch``, ``h``, ``w`` and ``text``
    wherever the graph's inputs and outputs carry them (the residuals of the first level, the output)."""
    sample = next((i for i in proto.graph.input if i.name == "sample"), None)
    dims = sample.type.tensor_type.shape.dim if sample is not None else []
    if len(dims) != 4 or any(not d.HasField("dim_param") for d in dims[2:]) or "*" in dims[2].dim_param:
        return
    names = {dims[2].dim_param: "h", dims[3].dim_param: "w"}
    if dims[0].HasField("dim_param"):
        names[dims[0].dim_param] = "batch"
    text = next((i for i in proto.graph.input if i.name == "encoder_hidden_states"), None)
    if text is not None and text.type.tensor_type.shape.dim[1].HasField("dim_param"):
        names.setdefault(text.type.tensor_type.shape.dim[1].dim_param, "text")
    for value in (*proto.graph.input, *proto.graph.output):
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in names:
                d.dim_param = names[d.dim_param]


def _clean(proto) -> None:
    """Drop what the exporter writes for debugging only (per-node metadata, doc strings)."""
    def walk(g):
        for n in g.node:
            del n.metadata_props[:]
            n.doc_string = ""
            for a in n.attribute:
                if a.g.node:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)
        for vi in (*g.value_info, *g.input, *g.output):
            del vi.metadata_props[:]
            vi.doc_string = ""
        for t in g.initializer:
            del t.metadata_props[:]
    walk(proto.graph)
    del proto.graph.value_info[:]


def save_xz(proto, path: Path) -> tuple[int, int]:
    raw = proto.SerializeToString()
    data = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return len(raw), len(data)


def do_export(names: list[str]) -> None:
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    for name in names:
        spec = SPECS[name]
        t0 = time.time()
        model, prog = export_program(spec, spec.config, fake=True)
        proto, _ = weight_free(prog, name, spec.source, BUFFERS[name](spec.config) if name in BUFFERS else None)
        raw, packed = save_xz(proto, OUT / f"{name}.onnx.xz")
        problems = structure_check(proto, model)
        params = sum(int(np.prod(p.shape)) for p in model.parameters())
        entry = report.setdefault(name, {})
        entry.update(source=spec.source, params=params, nodes=len(proto.graph.node),
                     initializers=len(proto.graph.initializer), onnx_bytes=raw, xz_bytes=packed,
                     structure=problems or "initializers == module parameters (names, shapes, dtypes); "
                     "param_map names each", export_s=round(time.time() - t0, 1))
        print(f"{name}: {params / 1e6:.0f}M params, {len(proto.graph.node)} nodes, {raw / 1e6:.1f} MB -> "
              f"{packed / 1e3:.0f} kB xz, {time.time() - t0:.0f}s; structure: {problems or 'ok'}", flush=True)
        REPORT.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        del model, prog, proto


def structure_check(proto, model) -> list[str]:
    """The graph's initializers against the module's parameters; param_map must name every one."""
    import onnx

    from sdrt.checkpoint.onnxmap import canonical, param_map
    from sdrt.graph import Graph

    state = model.state_dict()
    tensors = [*model.named_parameters(), *((k, b) for k, b in model.named_buffers() if k in state)]
    params = {k: (tuple(p.shape), str(p.dtype).removeprefix("torch.")) for k, p in tensors
              if not k.endswith("position_ids") and k in state}
    inits = {t.name: (tuple(t.dims), onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name)
             for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    problems = []
    unused = getattr(model, "_sdrt_unused", ())
    for k in sorted(set(params) - set(inits)):
        if not k.startswith(unused):  # the other half of a VAE
            problems.append(f"parameter {k} not in the graph")
    for k in sorted(set(inits) - set(params)):
        problems.append(f"initializer {k} is not a parameter")
    for k in sorted(set(params) & set(inits)):
        if params[k] != inits[k]:
            problems.append(f"{k}: {inits[k]} vs module {params[k]}")
    pmap = param_map(Graph(proto))
    named = {s.init for s in pmap.values()}
    for k in sorted(set(inits) - named):
        problems.append(f"param_map does not name {k}")
    for c, s in pmap.items():
        if s.init in inits and (c != canonical(s.init) or s.layout != "same"):
            problems.append(f"param_map: {c} -> {s.init} ({s.layout})")
    return problems[:20]


# -- numeric check --------------------------------------------------------------------------
def ort_session_bound(proto, state: dict):
    """(an onnxruntime session of the weight-free graph, unoptimized, and the feeds that bind its weights from
    ``state``: ``bind_as_inputs``)."""
    import onnxruntime as ort

    bound, feeds = bind_as_inputs(proto, state)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(bound.SerializeToString(), opts, providers=["CPUExecutionProvider"]), feeds


def bind_as_inputs(proto, state: dict):
    """The weight-free graph with its weight initializers turned into graph inputs, and the feeds that
    bind them from ``state`` through sdrt's ``param_map`` (views of the torch tensors: no copy, so a
    reduced Flux transformer of 2 GB runs without a second copy, and without protobuf's 2 GB limit)."""
    import onnx

    from sdrt.checkpoint.onnxmap import fit, param_map
    from sdrt.graph import Graph

    pmap = param_map(Graph(proto))
    out = copy.deepcopy(proto)
    weights = [t for t in out.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    feeds = {}
    for canon, slot in pmap.items():
        if slot.alias_of is not None or not any(t.name == slot.init for t in weights):
            continue
        key = canon if canon in state else next((p + canon for p in ("text_model.", "vision_model.")
                                                  if p + canon in state), canon)
        arr = fit(state[key], slot)
        assert arr is not None, canon
        feeds[slot.init] = arr
    missing = [t.name for t in weights if t.name not in feeds]
    assert not missing, missing[:5]
    keep = [t for t in out.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    for t in weights:
        out.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del out.metadata_props[:]
    return out, feeds


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Random values everywhere (diffusers zero-initialises conv_out, proj_out, adaLN modulations)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or name.endswith("ln.weight")):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)


def do_check(names: list[str]) -> None:

    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    for name in names:
        spec = SPECS[name]
        cfg = {**spec.config, **spec.reduce}
        t0 = time.time()
        torch.manual_seed(0)
        model, prog = export_program(spec, cfg, fake=False)
        _randomize(model, 1)
        state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        proto, _ = weight_free(prog, name, spec.source, BUFFERS[name](cfg) if name in BUFFERS else None)
        del prog
        sess, wfeeds = ort_session_bound(proto, state)
        results = []
        for s in (1, 2):
            x = spec.inputs(cfg, s)
            with torch.no_grad():
                ref = model(**x)
            ref = ref if isinstance(ref, tuple) else (ref,)
            feeds = {i.name: x[i.name].numpy() for i in sess.get_inputs() if i.name in x}
            feeds.update(wfeeds)
            got = sess.run(None, feeds)
            worst = 0.0
            for r, o in zip(ref, got):
                r = r.numpy()
                assert r.shape == o.shape, (name, r.shape, o.shape)
                err = float(np.abs(r - o).max() / max(1e-6, float(np.abs(r).max())))
                worst = max(worst, err)
            run = {"inputs": {k: list(v.shape) for k, v in x.items()}, "max_rel_err": worst}
            if "attention_mask" in x:  # the mask masks something: the module's output without it differs
                with torch.no_grad():
                    open_ = model(**{**x, "attention_mask": torch.ones_like(x["attention_mask"])})
                r0 = (open_ if isinstance(open_, tuple) else (open_,))[0].numpy()
                r = ref[0].numpy()
                run["masked_tokens"] = int((~x["attention_mask"].bool()).sum())
                run["unmasked_vs_masked_rel_diff"] = float(np.abs(r - r0).max() / max(1e-6, float(np.abs(r).max())))
            results.append(run)
        ok = all(r["max_rel_err"] <= spec.tol for r in results)
        entry = report.setdefault(name, {})
        entry["torch_check"] = {"config_overrides": spec.reduce or "none (full depth)",
                                "params_checked": sum(int(np.prod(p.shape)) for p in model.parameters()),
                                "runs": results, "tolerance": spec.tol, "ok": ok,
                                "how": "random weights bound through sdrt.checkpoint.param_map by diffusers "
                                       "names; onnxruntime CPU vs the torch module, max |diff| / max |ref|"
                                       + ("; with padding masked (attention_mask), the module's output with an "
                                          "all-ones mask differs by unmasked_vs_masked_rel_diff"
                                          if "attention_mask" in spec.inputs(cfg, 1) else "")}
        print(f"{name}: check {'OK' if ok else 'FAILED'} {[r['max_rel_err'] for r in results]} "
              f"({time.time() - t0:.0f}s)", flush=True)
        REPORT.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        del model, sess, proto, state


def do_check_derived(tiny: bool = False) -> None:
    """The graphs sdrt derives instead of shipping (``sdrt.checkpoint.graphs.DERIVED``: FLUX.1 Fill, 384 input
    channels, and Canny/Depth, 128), at full width and reduced depth: flux_dev_transformer's export widened by
    ``widen_flux_input`` exactly as sdrt widens the shipped graph, with the random weights of a diffusers
    ``FluxTransformer2DModel(in_channels=W, out_channels=64)`` bound, run by onnxruntime against that module."""
    import onnx

    from sdrt.checkpoint.graphs import DERIVED, widen_flux_input

    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    spec = SPECS["flux_dev_transformer"]
    cfg = {**spec.config, **spec.reduce}
    if tiny:  # the same export and widening at 2 heads of 16 (a quick check of the graph's structure)
        cfg.update(attention_head_dim=16, num_attention_heads=2, axes_dims_rope=[4, 6, 6])
    t0 = time.time()
    _, prog = export_program(spec, cfg, fake=True)  # the dev graph as shipped, at reduced depth
    dev, _ = weight_free(prog, "flux_dev_transformer", spec.source)
    del prog
    for name, (base, width) in DERIVED.items():
        assert base == "flux_dev_transformer", base
        proto = onnx.load_from_string(widen_flux_input(dev.SerializeToString(), name, width))
        torch.manual_seed(0)
        wide = {**cfg, "in_channels": width, "out_channels": 64}
        model = build_flux(wide)
        _randomize(model, 1)
        state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        sess, wfeeds = ort_session_bound(proto, state)
        results = []
        for k in (1, 2):
            x = flux_inputs(wide, k)
            g = torch.Generator().manual_seed(10 + k)
            x["hidden_states"] = torch.randn(*x["hidden_states"].shape[:2], width, generator=g)
            with torch.no_grad():
                ref = model(**x).numpy()
            got = sess.run(None, {**{i.name: x[i.name].numpy() for i in sess.get_inputs() if i.name in x},
                                  **wfeeds})[0]
            assert got.shape == ref.shape, (name, got.shape, ref.shape)
            results.append({"inputs": {n: list(v.shape) for n, v in x.items()},
                            "max_rel_err": float(np.abs(got - ref).max() / max(1e-6, float(np.abs(ref).max())))})
        ok = all(r["max_rel_err"] <= spec.tol for r in results)
        report.setdefault(name, {})["torch_check" + ("_tiny" if tiny else "")] = {
            "config_overrides": {k: v for k, v in wide.items() if spec.config.get(k) != v}, "runs": results,
            "params_checked": sum(int(np.prod(p.shape)) for p in model.parameters()), "tolerance": spec.tol, "ok": ok,
            "how": "flux_dev_transformer's reduced-depth export widened by sdrt.checkpoint.graphs.widen_flux_input; "
                   "random weights bound through param_map; onnxruntime CPU vs the torch module, max |diff| / max |ref|"}
        print(f"{name}: check {'OK' if ok else 'FAILED'} {[r['max_rel_err'] for r in results]} "
              f"({time.time() - t0:.0f}s)", flush=True)
        REPORT.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        del model, sess, proto, state


#: graphs checked through check_single_files.py (a publisher's file read by diffusers vs sdrt's binding)
SINGLE_FILE_CHECKS = {"sd1_unet": ("sd15_full_parts", "unet", "full size, diffusers from_single_file"),
                      "sd35_medium_transformer": ("sd35_medium", "transformer", "2 blocks, Stability keys"),
                      "flux_dev_transformer": ("flux_dev", "transformer", "1+1 blocks, BFL keys"),
                      "chroma_transformer": ("chroma", "transformer", "1+1 blocks, 1 approximator layer")}


def table() -> None:
    """The docs' table (docs/checkpoints.md) from the report."""
    report = json.loads(REPORT.read_text())
    print("| graph | params | nodes | .onnx | shipped (.xz) | structure (full depth) | outputs vs torch |")
    print("|---|---|---|---|---|---|---|")
    total = 0
    for name in SPECS:
        r = report.get(name, {})
        total += r.get("xz_bytes", 0)
        st = "ok" if isinstance(r.get("structure"), str) else f"{len(r.get('structure', []))} problems"
        tc = r.get("torch_check")
        if tc:
            red = tc["config_overrides"]
            red = "full depth" if isinstance(red, str) else ", ".join(f"{k}={v}" for k, v in red.items())
            chk = f"{max(x['max_rel_err'] for x in tc['runs']):.1e} ({red}){'' if tc['ok'] else ' FAILED'}"
        else:
            chk = SINGLE_FILE_CHECKS.get(name, "not run")
            sf = ROOT / "scripts" / "single_files_report.json"
            sfr = json.loads(sf.read_text()) if sf.exists() else {}
            key, part, how = chk if isinstance(chk, tuple) else (None, None, None)
            chk = (f"{sfr[key]['max_rel_err'][part]:.1e} ({how}; check_single_files.py {key})"
                   if key in sfr else "not run")
        if r.get("nodes") is None:
            print(f"| {name} | not exported yet | | | | | |")
            continue
        print(f"| {name} | {r.get('params', 0) / 1e6:.0f}M | {r.get('nodes', '?')} | "
              f"{r.get('onnx_bytes', 0) / 1e6:.1f} MB | {r.get('xz_bytes', 0) / 1e3:.0f} kB | {st} | {chk} |")
    print(f"\nall {len(report)} graphs: {total / 1e6:.2f} MB compressed")


def main(argv: list[str]) -> None:
    step, names = argv[0], argv[1:] or list(SPECS)
    if step == "export":
        do_export(names)
    elif step == "check":
        do_check(names)
    elif step == "check-derived":
        do_check_derived(tiny=names == ["tiny"])
    elif step == "table":
        table()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
