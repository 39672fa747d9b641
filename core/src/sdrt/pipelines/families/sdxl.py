"""SDXL: CLIP ViT-L and OpenCLIP ViT-bigG side by side (penultimate layers), pooled text_embeds, time_ids."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .base import Encoder, Family, Hook, ModelCall


class SDXL(Family):
    name = "sdxl"
    label = "SDXL"
    class_names = ("StableDiffusionXLPipeline", "ORTStableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline",
                   "StableDiffusionXLInpaintPipeline", "ORTStableDiffusionXLImg2ImgPipeline",
                   "ORTStableDiffusionXLInpaintPipeline", "StableDiffusionXLInstructPix2PixPipeline",
                   "ORTStableDiffusionXLInstructPix2PixPipeline")
    parts = {"text_encoder": "text", "text_encoder_2": "text", "unet": "denoiser", "vae_decoder": "vae_decoder",
             "vae_encoder": "vae_encoder"}
    encoders = (Encoder("text_encoder", "tokenizer", penultimate=True),
                Encoder("text_encoder_2", "tokenizer_2", penultimate=True, pooled="text_embeds",
                        embedding_key="clip_g"))
    vae_scale = 0.13025
    default_size = 1024
    #: an 8-channel UNet is an InstructPix2Pix one (CosXL Edit): the input image's latent on the sample's channels
    edit_channels = 4
    zeros_for_empty_negative = True
    model_inputs = {**Family.model_inputs, "text_embeds": 2, "time_ids": 2}

    @classmethod
    def matches(cls, parts: set[str], configs: Mapping[str, Mapping[str, Any]], tokenizers: Path) -> bool:
        return {"text_encoder", "text_encoder_2", "unet"} <= parts

    def cond_feeds(self, cond: Any, rows: int) -> dict[str, np.ndarray]:
        feeds = super().cond_feeds(cond, rows)
        feeds["text_embeds"] = np.repeat(cond.pooled, rows, axis=0)
        return feeds

    def hooks(self, call: ModelCall) -> list[Hook]:
        # original size, crop top-left, target size: (height, width, 0, 0, height, width), as diffusers' default
        ids = np.array([call.height, call.width, 0, 0, call.height, call.width], dtype=np.float32)

        def time_ids(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"time_ids": np.tile(ids, (feeds[self.sample_input].shape[0], 1))}

        return [*super().hooks(call), time_ids]
