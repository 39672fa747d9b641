"""Chroma: T5 alone, with its attention mask; Flux's packed latents and ids, no pooled text and no guidance input.

diffusers' ``ChromaPipeline``: the T5 tokenizer's mask goes to the T5 encoder's ``attention_mask``; widened to
keep the first padding token (``chroma_text_mask``) and followed by ones for every image token (Flux's hook), it
goes to the transformer's boolean ``attention_mask`` (``[batch, text + image tokens]``, true = attend; see
docs/flow-families.md for the export). Each is fed when the graph declares the input (the tiny test folder's
export and sdrt's shipped graphs do; a graph without it attends to every padding token). True classifier-free guidance with a negative prompt (``cfg``, 5 by
default, diffusers' ``guidance_scale``); the schedule is Flux's (``linspace(1, 1 / steps, steps)``, ``mu``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..flowparts import chroma_text_mask
from ..prompts import Conditioning
from ..textcond import FlowConditioning
from .base import Encoder, Family
from .flux import Flux


class Chroma(Flux):
    name = "chroma"
    reference_images = False  # no Kontext training: refused rather than run
    label = "Chroma"
    class_names = ("ChromaPipeline", "ORTChromaPipeline", "ChromaImg2ImgPipeline", "ORTChromaImg2ImgPipeline")
    parts = {"text_encoder": "text", "transformer": "denoiser", "vae_decoder": "vae_decoder",
             "vae_encoder": "vae_encoder"}
    encoders = (Encoder("text_encoder", "tokenizer", kind="t5", mask="tokenizer"),)
    model_inputs = {"hidden_states": 3, "timestep": 1, "encoder_hidden_states": 3, "txt_ids": 2, "img_ids": 2}
    default_cfg = 5.0
    max_sequence_length = 512

    @classmethod
    def matches(cls, parts: set[str], configs: Mapping[str, Mapping[str, Any]], tokenizers: Path) -> bool:
        return {"transformer", "text_encoder"} <= parts and not parts & {"text_encoder_2", "text_encoder_3"}

    @property
    def default_max_length(self) -> int:
        return self.max_sequence_length

    def join_text(self, clip: Conditioning | None, t5: np.ndarray, mask: np.ndarray) -> FlowConditioning:
        return FlowConditioning(t5.astype(np.float32), None, t5=t5, tokenizer_mask=mask,
                                text_mask=chroma_text_mask(mask))

    def negative_pass(self, cfg: float, negative_prompt: str) -> bool:
        return Family.negative_pass(self, cfg, negative_prompt)

    def cond_feeds(self, cond: Any, rows: int) -> dict[str, np.ndarray]:
        # the text half of the attention mask; Flux's hook adds the image tokens (cond and uncond rows differ)
        return {self.text_input: np.repeat(cond.hidden, rows, axis=0),
                "attention_mask": np.repeat(cond.text_mask, rows, axis=0)}

    def infotext(self, settings: Any) -> dict[str, object]:
        return {} if settings.shift is None else {"Shift": Flux.infotext(self, settings)["Shift"]}
