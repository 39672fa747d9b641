"""Flux.1 (dev and schnell): CLIP-L's pooled output and T5's sequence, latents packed in 2x2 patches.

diffusers' ``FluxPipeline``: CLIP-L gives ``pooled_projections`` (its ``pooler_output``), T5 gives
``encoder_hidden_states``; ``txt_ids`` are zeros and ``img_ids`` (0, row, column) per packed token. The
latents stay ``[B, 16, 2 (H // 16), 2 (W // 16)]`` in the loop (the seeded noise is drawn in that shape, as
diffusers draws it); ``session`` packs them into tokens for the transformer and unpacks its output, which
changes no value (the Euler step is elementwise). The transformer takes sigma (``timestep / 1000``).

Guidance: dev is guidance-distilled: ``guidance`` (3.5 by default) is a model input and a step is one pass.
Schnell has no ``guidance`` input. ``cfg`` is diffusers' ``true_cfg_scale``: 1 by default; above 1 *and* with
a negative prompt it adds the negative pass. The schedule is ``FlowMatchEulerDiscreteScheduler`` on
``linspace(1, 1 / steps, steps)`` with the image-size shift ``mu`` where the config asks for it (dev).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..flowparts import WrappedPart, latent_image_ids, pack_latents, text_ids, unpack_latents
from ..prompts import Conditioning
from ..textcond import FlowConditioning
from .base import Encoder, Family, Hook, ModelCall


class _Packed(WrappedPart):
    """The transformer part seen with unpacked latents: packs ``hidden_states``, unpacks ``out_hidden_states``;
    drops ``attention_mask`` when the graph has no such input (an Optimum Flux export, an older Chroma one)."""

    def __init__(self, part: Any, sample: str, output: str) -> None:
        super().__init__(part, sample, output)
        self.masked = "attention_mask" in part.inputs

    def run(self, feeds: Mapping[str, np.ndarray], outputs: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        x = feeds[self.sample]
        h, w = x.shape[2], x.shape[3]
        feeds = {k: v for k, v in feeds.items() if self.masked or k != "attention_mask"}
        out = dict(self.part.run({**feeds, self.sample: pack_latents(x)}, outputs))
        name = self.output_name(out)
        out[name] = unpack_latents(np.asarray(out[name], np.float32), h * 8, w * 8)
        return out


class Flux(Family):
    name = "flux"
    label = "Flux.1"
    class_names = ("FluxPipeline", "ORTFluxPipeline", "FluxImg2ImgPipeline", "ORTFluxImg2ImgPipeline",
                   # FLUX.1 Tools and Kontext folders: Flux dev transformers (Fill / Canny, Depth read from its width)
                   "FluxFillPipeline", "ORTFluxFillPipeline", "FluxControlPipeline", "ORTFluxControlPipeline",
                   "FluxInpaintPipeline", "ORTFluxInpaintPipeline", "FluxKontextPipeline", "FluxKontextInpaintPipeline")
    parts = {"text_encoder": "text", "text_encoder_2": "text", "transformer": "denoiser",
             "vae_decoder": "vae_decoder", "vae_encoder": "vae_encoder"}
    encoders = (Encoder("text_encoder", "tokenizer", pooled="pooler_output"),
                Encoder("text_encoder_2", "tokenizer_2", kind="t5"))
    clip_skip = False  # CLIP's pooled output only, which clip skip does not change (Chroma: no CLIP at all)
    latent_channels = 16
    vae_scale = 0.3611
    vae_shift = 0.1159
    default_size = 1024
    sample_input = "hidden_states"
    output = "out_hidden_states"
    model_inputs = {"hidden_states": 3, "timestep": 1, "encoder_hidden_states": 3, "pooled_projections": 2,
                    "txt_ids": 2, "img_ids": 2}
    #: ``[batch, text + image tokens]``, true = attend: fed when the graph declares it (Chroma's export)
    optional_inputs = {"attention_mask": 2}
    packed = True
    batched_cfg = False  # diffusers' Flux (true CFG) and Chroma pipelines call the transformer once per prompt
    flow = True
    timestep_scale = 0.001
    default_cfg = 1.0
    default_sampler = "Euler"
    max_sequence_length = 512
    reference_images = True  # FLUX.1 Kontext: the same weights and graph; sdrt.pipelines.reference

    @classmethod
    def matches(cls, parts: set[str], configs: Mapping[str, Mapping[str, Any]], tokenizers: Path) -> bool:
        from .sd3 import is_sd3_transformer

        return {"transformer", "text_encoder_2"} <= parts and "text_encoder_3" not in parts \
            and not is_sd3_transformer(configs)

    @property
    def default_max_length(self) -> int:
        # diffusers: 512 for dev; schnell (no guidance embeddings) was trained with 256
        return 512 if self.folder.configs.get("transformer", {}).get("guidance_embeds", True) else 256

    def join_text(self, clip: Conditioning | None, t5: np.ndarray, mask: np.ndarray) -> FlowConditioning:
        assert clip is not None and clip.pooled is not None
        return FlowConditioning(t5.astype(np.float32), clip.pooled, clip=clip, t5=t5, tokenizer_mask=mask)

    def negative_pass(self, cfg: float, negative_prompt: str) -> bool:
        return cfg != 1.0 and bool(negative_prompt)  # diffusers: true_cfg_scale > 1 and a negative prompt

    def cond_feeds(self, cond: Any, rows: int) -> dict[str, np.ndarray]:
        feeds = super().cond_feeds(cond, rows)
        feeds["pooled_projections"] = np.repeat(cond.pooled, rows, axis=0)
        return feeds

    def flow_timesteps(self, steps: int, width: int, height: int, shift: float | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        from ...samplers.flowmatch import FlowMatchSchedule, flux_sigmas

        schedule = FlowMatchSchedule.from_config(self.scheduler_config(shift), where=str(self.folder.path / "scheduler"))
        mu = schedule.mu_for((height // 16) * (width // 16))
        return schedule.timesteps(steps, sigmas=flux_sigmas(steps), mu=mu)

    def size_error(self, shape: tuple[Any, ...], width: int, height: int) -> tuple[int, int] | None:
        tokens = shape[1] if len(shape) == 3 else None
        if isinstance(tokens, int) and tokens > 0 and tokens != (height // 16) * (width // 16):
            from ...errors import InputError

            raise InputError(f"this model's transformer is exported for {tokens} image tokens and {width}x{height} "
                             f"makes {(height // 16) * (width // 16)}", where="width",
                             fix="pass the width and height it was exported for (tokens = width/16 x height/16)")
        return None

    def session(self, part: Any) -> Any:
        return _Packed(part, self.sample_input, self.output)

    def hooks(self, call: ModelCall) -> list[Hook]:
        img = latent_image_ids(call.height, call.width)
        guidance = call.guidance

        tokens = img.shape[0]

        def ids(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            rows, text = feeds[self.sample_input].shape[0], feeds[self.text_input].shape[1]
            more = {"img_ids": img, "txt_ids": text_ids(text)}
            if guidance is not None:
                more["guidance"] = np.full((rows,), guidance, np.float32)
            # the attention mask: the conditioning's text mask (Chroma's; else every text token), then every
            # image token; ``session`` drops it for a graph without the input
            mask = feeds.get("attention_mask")
            mask = np.ones((rows, text), bool) if mask is None else np.asarray(mask).astype(bool)
            more["attention_mask"] = np.concatenate([mask, np.ones((rows, tokens), bool)], axis=1)
            return more

        return [*super().hooks(call), ids]

    def infotext(self, settings: Any) -> dict[str, object]:
        info: dict[str, object] = {}
        if settings.guidance is not None:
            info["Distilled CFG Scale"] = _num(settings.guidance)
        if settings.shift is not None:
            info["Shift"] = _num(settings.shift)
        return info


def _num(value: float) -> object:
    return int(value) if float(value).is_integer() else round(float(value), 4)
