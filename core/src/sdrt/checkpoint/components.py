"""Key maps for text encoders and VAEs, in single files and as the separate files people download.

- CLIP text towers: transformers' names (``text_model.encoder.layers.N...``; ComfyUI's
  ``clip_l.safetensors``/``clip_g.safetensors``, SD 3.x's ``text_encoders.clip_{l,g}.transformer.*``)
  or OpenCLIP's (``transformer.resblocks.N...``, fused ``in_proj``);
- T5 encoders: transformers' names (``encoder.block.N.layer.M...``, ``shared.weight``;
  ComfyUI's ``t5xxl_fp16.safetensors``, SD 3.x's ``text_encoders.t5xxl.transformer.*``; a GGUF in llama.cpp's
  names reads in these, ``sdrt.weights.gguf``);
- VAEs: LDM names (``decoder.up.N.block.M``; BFL's ``ae.safetensors``, A1111's VAE files) or
  diffusers names (``decoder.up_blocks.N.resnets.M``, with old or new attention names).

Canonical names are those ``onnxmap.param_map`` reads from the shipped graphs (transformers'
names without ``text_model.``; diffusers' ``AutoencoderKL`` names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .ldm import Source, convert_hf_clip, convert_openclip, convert_vae

Shapes = Mapping[str, tuple[int, ...]]


def convert_clip(keys: Iterable[str], prefix: str = "") -> tuple[dict[str, Source], list[str]]:
    """A CLIP text tower under ``prefix``, in transformers' or OpenCLIP's layout."""
    keys = [k for k in keys if k.startswith(prefix)]
    if any(k[len(prefix):].startswith("transformer.resblocks.") for k in keys):
        conv, unknown = convert_openclip(keys, prefix)
    else:
        conv, unknown = convert_hf_clip(keys, prefix)
        # position_ids: a buffer transformers < 4.31 saved (A1111's SD 1.5 files, diffusers folders): graphs keep their
        # own
        conv = {c: src for c, src in conv.items() if not c.endswith("position_ids")}
    # logit_scale: CLIP's contrastive temperature, in every OpenCLIP tower of an SD 2.x/SDXL file; no text encoder uses it
    return conv, [k for k in unknown if not k.endswith(("logit_scale", "position_ids"))]


def convert_t5(keys: Iterable[str], prefix: str = "") -> tuple[dict[str, Source], list[str]]:
    """A T5 encoder under ``prefix`` -> transformers' ``T5EncoderModel`` names (``shared.weight``,
    ``encoder.block.N...``); ``encoder.embed_tokens.weight`` is the same table as ``shared.weight``."""
    out: dict[str, Source] = {}
    unknown: list[str] = []
    for full in keys:
        if not full.startswith(prefix):
            continue
        k = full[len(prefix):]
        if k == "encoder.embed_tokens.weight":
            out.setdefault("shared.weight", Source(full))
        elif k == "shared.weight":
            out["shared.weight"] = Source(full)
        elif re.match(r"encoder\.(block\.\d+\.|final_layer_norm\.)", k):
            out[k] = Source(full)
        elif k in ("spiece_model", "logit_scale") or k.startswith("decoder."):
            continue  # a tokenizer blob some files carry, and decoder weights an encoder never uses
        else:
            unknown.append(full)
    return out, unknown


_DIFFUSERS_VAE_ATTN = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def convert_vae_any(shapes: Shapes, prefix: str = "") -> tuple[dict[str, Source], list[str]]:
    """A VAE under ``prefix`` in LDM or diffusers names -> diffusers' ``AutoencoderKL`` names."""
    rel = {k[len(prefix):]: k for k in shapes if k.startswith(prefix)}
    if any(k.startswith(("decoder.up.", "encoder.down.")) for k in rel):
        return convert_vae(rel.values(), prefix)
    out: dict[str, Source] = {}
    unknown: list[str] = []
    for k, full in rel.items():
        m = re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\.(\w+)\.(weight|bias)$", k)
        if m and m[2] in _DIFFUSERS_VAE_ATTN:  # diffusers' old attention names
            new = f"{m[1]}.mid_block.attentions.0.{_DIFFUSERS_VAE_ATTN[m[2]]}.{m[3]}"
            shape = shapes[full]
            out[new] = Source(full, "squeeze" if len(shape) == 4 else "copy")
        elif m and m[2] in ("to_q", "to_k", "to_v") or re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\."
                                                                 r"to_out\.0\.", k):
            out[k] = Source(full, "squeeze" if len(shapes[full]) == 4 else "copy")
        elif re.match(r"(encoder|decoder)\.(conv_in|conv_out|conv_norm_out|down_blocks|up_blocks|mid_block)\.|"
                      r"(quant_conv|post_quant_conv)\.", k):
            out[k] = Source(full)
        else:
            unknown.append(full)
    return out, unknown


def vae_latent_channels(shapes: Shapes, prefix: str = "") -> int | None:
    """A VAE's latent channels: the decoder's ``conv_in`` input (the same key in both layouts)."""
    s = shapes.get(prefix + "decoder.conv_in.weight")
    return int(s[1]) if s is not None and len(s) == 4 else None
