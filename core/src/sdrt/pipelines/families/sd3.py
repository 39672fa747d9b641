"""Stable Diffusion 3 / 3.5: CLIP-L and CLIP-G (penultimate layers, pooled text_embeds) and T5, an MMDiT transformer.

The text: CLIP-L's and CLIP-G's states side by side, zero-padded to T5's width, then T5's tokens after them
along the sequence; ``pooled_projections`` is the two ``text_embeds`` side by side (diffusers'
``StableDiffusion3Pipeline.encode_prompt``). The transformer takes 16-channel latents ``[B, 16, H/8, W/8]`` and the
scheduler's timestep as it is (0..1000); the schedule is diffusers' ``FlowMatchEulerDiscreteScheduler`` with the
folder's shift (3.0 for the releases). True classifier-free guidance with a negative prompt (``cfg``, 7 by default).

Without T5 (a folder without ``text_encoder_3``, as diffusers runs ``text_encoder_3=None``): T5's states are zeros
``[1, max_sequence_length, joint_attention_dim]`` for the prompt and the negative prompt (``ZeroT5``); the image
is worse than with T5-XXL, and one warning says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..prompts import Conditioning
from ..textcond import FlowConditioning
from .base import Encoder, Family


class SD3(Family):
    name = "sd3"
    label = "SD3"
    class_names = ("StableDiffusion3Pipeline", "ORTStableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline",
                   "ORTStableDiffusion3Img2ImgPipeline")
    parts = {"text_encoder": "text", "text_encoder_2": "text", "text_encoder_3": "text", "transformer": "denoiser",
             "vae_decoder": "vae_decoder", "vae_encoder": "vae_encoder"}
    encoders = (Encoder("text_encoder", "tokenizer", penultimate=True, pooled="text_embeds"),
                Encoder("text_encoder_2", "tokenizer_2", penultimate=True, pooled="text_embeds", embedding_key="clip_g"),
                Encoder("text_encoder_3", "tokenizer_3", kind="t5"))
    latent_channels = 16
    vae_scale = 1.5305
    vae_shift = 0.0609
    default_size = 1024
    sample_input = "hidden_states"
    output = "out_hidden_states"
    model_inputs = {"hidden_states": 4, "timestep": 1, "encoder_hidden_states": 3, "pooled_projections": 2}
    flow = True
    timestep_scale = 1.0
    default_cfg = 7.0
    default_sampler = "Euler"
    max_sequence_length = 256
    optional = ("vae_encoder", "text_encoder_3")  # no T5: diffusers' text_encoder_3=None (zeros in its place)

    @classmethod
    def matches(cls, parts: set[str], configs: Mapping[str, Mapping[str, Any]], tokenizers: Path) -> bool:
        # without T5 (no text_encoder_3/): the transformer's config says SD3 (Flux's has no caption projection)
        return {"transformer", "text_encoder_3"} <= parts or ({"transformer", "text_encoder_2"} <= parts
                                                               and is_sd3_transformer(configs))

    def missing_t5(self, parts: Mapping[str, Any]) -> Any:
        from ..textcond import ZeroT5

        width = self.folder.configs.get("transformer", {}).get("joint_attention_dim")
        if not isinstance(width, int) or isinstance(width, bool) or width <= 0:
            shape = parts["transformer"].input("encoder_hidden_states").shape
            width = shape[-1] if shape and isinstance(shape[-1], int) else None
        if width is None:
            from ...errors import ModelError

            raise ModelError("SD3 without T5 needs the transformer's text width, and neither its config.json "
                             "(joint_attention_dim) nor its graph says it", where=str(self.folder.path / "transformer"),
                             fix="add joint_attention_dim to transformer/config.json, or add the T5 encoder")
        return ZeroT5(width)

    def join_text(self, clip: Conditioning | None, t5: np.ndarray, mask: np.ndarray) -> FlowConditioning:
        assert clip is not None and clip.pooled is not None
        width = t5.shape[-1]
        if clip.hidden.shape[-1] > width:
            from ...errors import ModelError

            raise ModelError(f"the CLIP states are {clip.hidden.shape[-1]} wide and T5's {width}: they do not join",
                             where=str(self.folder.path / "text_encoder_3"),
                             fix="use the text encoders that belong to this model")
        padded = np.pad(clip.hidden, ((0, 0), (0, 0), (0, width - clip.hidden.shape[-1])))
        hidden = np.concatenate([padded, t5], axis=1).astype(np.float32)
        return FlowConditioning(hidden, clip.pooled, clip=clip, t5=t5, tokenizer_mask=mask)

    def cond_feeds(self, cond: Any, rows: int) -> dict[str, np.ndarray]:
        feeds = super().cond_feeds(cond, rows)
        feeds["pooled_projections"] = np.repeat(cond.pooled, rows, axis=0)
        return feeds

    def infotext(self, settings: Any) -> dict[str, object]:
        # Forge writes the flow shift as "Shift" for the models it shifts (SD3, Chroma), when it is set
        return {} if settings.shift is None else {"Shift": _num(settings.shift)}


def is_sd3_transformer(configs: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether the folder's ``transformer/config.json`` is an ``SD3Transformer2DModel``'s."""
    cfg = configs.get("transformer", {})
    return cfg.get("_class_name") == "SD3Transformer2DModel" or "caption_projection_dim" in cfg


def _num(value: float) -> object:
    return int(value) if float(value).is_integer() else round(float(value), 4)
