"""The SDXL refiner: OpenCLIP ViT-bigG alone (penultimate layer, pooled), time ids with an aesthetic score.

stabilityai/stable-diffusion-xl-refiner-1.0 and its finetunes: a UNet of 4 levels (384 channels x [1, 2, 4, 4])
with a 1280-wide context, and ``time_ids`` of 5 values, not SDXL base's 6: (original height, original width,
crop top, crop left, aesthetic score), as diffusers' ``StableDiffusionXLImg2ImgPipeline`` builds them when the
folder's ``model_index.json`` says ``requires_aesthetics_score``: 6.0 for the prompt and 2.5 for the negative
prompt (its ``aesthetic_score`` and ``negative_aesthetic_score`` defaults; A1111's "SDXL low/high aesthetic
score" options hold the same values). The release's ``force_zeros_for_empty_prompt`` is false: an empty negative
prompt is encoded, not zeroed. The refiner was trained on the low-noise end of the schedule: it is run as
img2img at a low strength, or after a base model (``refiner=``, docs/pipelines.md "SDXL refiner").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .base import Encoder, Family, Hook, ModelCall
from .sdxl import SDXL


class SDXLRefiner(SDXL):
    name = "sdxl-refiner"
    label = "SDXL refiner"
    class_names = ("StableDiffusionXLImg2ImgPipeline", "ORTStableDiffusionXLImg2ImgPipeline")
    parts = {"text_encoder_2": "text", "unet": "denoiser", "vae_decoder": "vae_decoder", "vae_encoder": "vae_encoder"}
    encoders = (Encoder("text_encoder_2", "tokenizer_2", penultimate=True, pooled="text_embeds",
                        embedding_key="clip_g"),)
    zeros_for_empty_negative = False
    txt2img = False  # diffusers runs the refiner only as img2img (or after a base: denoising_start)
    #: diffusers' StableDiffusionXLImg2ImgPipeline defaults (aesthetic_score, negative_aesthetic_score)
    aesthetic_score = 6.0
    negative_aesthetic_score = 2.5

    @classmethod
    def matches(cls, parts: set[str], configs: Mapping[str, Mapping[str, Any]], tokenizers: Path) -> bool:
        # CLIP-G alone beside the UNet: the refiner's layout (SDXL base has text_encoder too)
        return {"text_encoder_2", "unet"} <= parts and "text_encoder" not in parts

    def time_ids(self, call: ModelCall, score: float) -> np.ndarray:
        """(original height, width, crop top, left, aesthetic score) for each of the call's images."""
        ids = np.array([call.height, call.width, 0, 0, score], dtype=np.float32)
        return np.tile(ids, (call.batch, 1))

    def hooks(self, call: ModelCall) -> list[Hook]:
        return Family.hooks(self, call)  # not SDXL base's 6 time ids: they come with each conditioning

    def denoiser(self, part: Any, model_sampling: Any, call: ModelCall) -> Any:
        guided = super().denoiser(part, model_sampling, call)
        guided.cond = {**guided.cond, "time_ids": self.time_ids(call, self.aesthetic_score)}
        if guided.uncond is not None:
            guided.uncond = {**guided.uncond, "time_ids": self.time_ids(call, self.negative_aesthetic_score)}
        return guided
