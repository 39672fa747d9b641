"""Stable Diffusion 1.x: one CLIP ViT-L text encoder, a 4-channel UNet, eps (or v) from the scheduler."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Encoder, Family


class SD1(Family):
    name = "sd1"
    label = "SD 1.x"
    class_names = ("StableDiffusionPipeline", "ORTStableDiffusionPipeline", "StableDiffusionImg2ImgPipeline",
                   "StableDiffusionInpaintPipeline", "ORTStableDiffusionImg2ImgPipeline",
                   "ORTStableDiffusionInpaintPipeline", "OnnxStableDiffusionPipeline",
                   "StableDiffusionInstructPix2PixPipeline", "ORTStableDiffusionInstructPix2PixPipeline")
    parts = {"text_encoder": "text", "unet": "denoiser", "vae_decoder": "vae_decoder", "vae_encoder": "vae_encoder"}
    encoders = (Encoder("text_encoder", "tokenizer"),)
    default_size = 512
    #: an 8-channel UNet is InstructPix2Pix: the input image's latent on the sample's channels
    edit_channels = 4

    @classmethod
    def matches(cls, parts: set[str], configs: Mapping[str, Mapping[str, Any]], tokenizers: Path) -> bool:
        # SD 2.x (registered later, so asked first) claims the folders whose text encoder is OpenCLIP's
        return {"text_encoder", "unet"} <= parts and "text_encoder_2" not in parts
