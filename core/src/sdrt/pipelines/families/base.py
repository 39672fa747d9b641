"""What a model family is: its parts and roles, text -> conditioning, latents, model sampling, the model call.

A family declares only what differs between Stable Diffusion 1.x, 2.x, SDXL (and later SD3, Flux, ...);
the generic pipeline (:mod:`sdrt.pipelines.pipeline`) owns the loop, validation, seeds, batching,
callbacks, the run plan and the PNG. A subclass sets the class attributes and overrides the few
methods whose default does not fit; see docs/pipelines.md, "Adding a family".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ...errors import ModelError

if TYPE_CHECKING:  # pragma: no cover
    from ..folder import ModelFolder
    from ..parts import Part
    from ..prompts import Conditioning

#: ``hook(feeds) -> more feeds``, run before every denoiser call (sdrt.samplers.Denoiser's ``hooks``)
Hook = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class Encoder:
    """One text encoder of a family: its part, tokenizer, kind (``clip``: A1111's 77-token chunks) and use."""

    part: str
    tokenizer: str
    kind: str = "clip"
    penultimate: bool = False  # read hidden_states[-2] without the final norm (SDXL)
    pooled: str | None = None  # the pooled output the family feeds the model (SDXL's text_embeds)
    embedding_key: str = "clip_l"  # the textual-inversion vectors for this encoder
    #: ``t5`` only: what the encoder's ``attention_mask`` input gets when its graph has one
    #: (``sdrt.pipelines.textcond.T5_MASKS``: ``ones`` as diffusers' SD3 and Flux, Chroma's ``tokenizer``)
    mask: str = "ones"


@dataclass
class ModelCall:
    """The generic per-run context a family builds its denoiser call from.

    ``extra``: channels concatenated to the sample (an inpainting UNet's mask and masked image);
    ``hooks``: more inputs per call, appended by add-ons (ControlNet residuals) after the family's own.
    """

    width: int
    height: int
    batch: int
    cfg: float
    cond: Conditioning
    uncond: Conditioning | None
    extra: np.ndarray | None = None
    hooks: list[Hook] = field(default_factory=list)
    #: ``after(feeds, output) -> output`` on the denoiser's raw output of every call (sdrt.samplers.Denoiser's ``after``)
    after: list[Any] = field(default_factory=list)
    #: the distilled guidance fed as a model input (Flux dev's ``guidance``), None elsewhere
    guidance: float | None = None
    #: diffusers' ``guidance_rescale`` of the guided output (``sdrt.samplers.CFGDenoiser``'s ``rescale``)
    guidance_rescale: float = 0.0
    #: an InstructPix2Pix model's input-image latent (the VAE's mean, unscaled), one row per image, None elsewhere;
    #: ``edit_guidance`` how it is guided (``sdrt.pipelines.edit.guidance``: "edit", "cfg" or "none"), ``image_cfg``
    #: the image guidance scale
    edit: np.ndarray | None = None
    edit_guidance: str = "none"
    image_cfg: float = 1.5


class Family:
    """The base every family extends. Class attributes are the declarations; methods have SD's defaults."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    #: ``model_index.json`` ``_class_name`` values that name this family
    class_names: ClassVar[tuple[str, ...]] = ()
    #: part folder -> role (``text``, ``denoiser``, ``vae_decoder``, ``vae_encoder``)
    parts: ClassVar[dict[str, str]] = {}
    optional: ClassVar[tuple[str, ...]] = ("vae_encoder",)
    encoders: ClassVar[tuple[Encoder, ...]] = ()
    latent_channels: ClassVar[int] = 4
    vae_factor: ClassVar[int] = 8
    vae_scale: ClassVar[float] = 0.18215
    vae_shift: ClassVar[float] = 0.0
    default_size: ClassVar[int] = 512
    #: ``cfg`` (a negative pass, guided) or ``distilled`` (one pass, the scale fed as a model input)
    guidance: ClassVar[str] = "cfg"
    #: the empty negative prompt is all zeros unless model_index.json says otherwise (SDXL)
    zeros_for_empty_negative: ClassVar[bool] = False
    #: the denoiser's latent input, text input and output (SD3/Flux exports: hidden_states, ..., out_hidden_states)
    sample_input: ClassVar[str] = "sample"
    text_input: ClassVar[str] = "encoder_hidden_states"
    output: ClassVar[str] = "out_sample"
    #: input name -> rank the denoiser must take; ``timestep`` may be a scalar or [batch]
    model_inputs: ClassVar[dict[str, int]] = {"sample": 4, "timestep": 1, "encoder_hidden_states": 3}
    #: input name -> rank of inputs fed only when the denoiser's graph declares them
    optional_inputs: ClassVar[dict[str, int]] = {}
    #: a sample input with this many channels more than the latent is an inpainting model (mask + masked image)
    inpaint_channels: ClassVar[int] = 5
    #: a sample input with this many channels more is an InstructPix2Pix editing model (the input image's latent);
    #: None where the family has no such model sdrt runs
    edit_channels: ClassVar[int | None] = None
    #: a flow-matching family (SD3, Flux, Chroma): diffusers' FlowMatchEulerDiscreteScheduler for Euler
    flow: ClassVar[bool] = False
    #: A1111's clip skip changes what the model reads: False where no CLIP hidden states reach it (Flux reads CLIP's
    #: pooled output only, Chroma has no CLIP encoder), so a clip skip there is refused rather than ignored
    clip_skip: ClassVar[bool] = True
    #: the denoiser takes packed latent tokens ``[B, tokens, 4 C]`` (Flux, Chroma; ``session`` packs them)
    packed: ClassVar[bool] = False
    #: CFG's two conditionings in one call (rows ``[uncond, cond]``); Flux and Chroma run two calls, as diffusers
    batched_cfg: ClassVar[bool] = True
    #: the transformer's ``timestep`` per scheduler timestep (SD3: 1, as is; Flux and Chroma: 1/1000, sigma)
    timestep_scale: ClassVar[float] = 1.0
    #: the CFG scale and sampler when the caller sets none (diffusers' pipeline defaults)
    default_cfg: ClassVar[float] = 7.0
    default_sampler: ClassVar[str] = "DPM++ 2M Karras"
    #: T5's ``max_sequence_length`` when the caller sets none (SD3: 256, Flux dev and Chroma: 512)
    max_sequence_length: ClassVar[int] = 256
    #: the denoiser reads reference images as more tokens (FLUX.1 Kontext; sdrt.pipelines.reference)
    reference_images: ClassVar[bool] = False
    #: False for a model that only continues from an image's latents (the SDXL refiner): txt2img is refused
    txt2img: ClassVar[bool] = True

    def __init__(self, folder: ModelFolder) -> None:
        self.folder = folder
        #: scheduler config entries a bound checkpoint decides over the folder's (its prediction type and zero
        #: terminal SNR, as A1111 reads them: ``WeightState.load_checkpoint``)
        self.scheduler_overrides: dict[str, Any] = {}

    # ------------------------------------------------------------------ detection
    @classmethod
    def matches(cls, parts: set[str], configs: Mapping[str, Mapping[str, Any]], tokenizers: Path) -> bool:
        """Whether a folder without (or with an unknown) ``_class_name`` is of this family, from its parts."""
        return False

    @property
    def denoiser_part(self) -> str:
        return next(p for p, role in self.parts.items() if role == "denoiser")

    @property
    def text_parts(self) -> list[str]:
        return [e.part for e in self.encoders]

    # ------------------------------------------------------------------ VAE
    @property
    def scaling(self) -> tuple[float, float]:
        """The VAE's (scale, shift): the folder's config when it sets them, else the family's."""
        found: dict[str, float] = {}
        for part in ("vae_decoder", "vae_encoder"):
            for key in ("scaling_factor", "shift_factor"):
                value = self.folder.configs.get(part, {}).get(key)
                if value is None:  # unset (diffusers writes shift_factor: null): the family's
                    continue
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                        or (key == "scaling_factor" and value == 0):  # "x" was the family's value, 0 a NaN image
                    where = self.folder.parts[part].parent / "config.json" if part in self.folder.parts else part
                    raise ModelError(f"the {part} config's {key} is {value!r}, not a finite number"
                                     + (" other than 0" if key == "scaling_factor" else ""), where=str(where),
                                     fix=f"fix {key} in that config.json, or remove it for the model family's "
                                         f"({self.vae_scale if key == 'scaling_factor' else self.vae_shift:g})")
                found.setdefault(key, float(value))
        return found.get("scaling_factor", self.vae_scale), found.get("shift_factor", self.vae_shift)

    @property
    def latent_stats(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The VAE config's ``latents_mean`` and ``latents_std`` (Playground v2.5's), each ``(1, C, 1, 1)`` float32, or
        None where the config sets neither: then the latents are scaled by ``scaling`` alone."""
        for part in ("vae_decoder", "vae_encoder"):
            cfg = self.folder.configs.get(part, {})
            mean, std = cfg.get("latents_mean"), cfg.get("latents_std")
            if mean is None and std is None:
                continue
            where = self.folder.parts[part].parent / "config.json" if part in self.folder.parts else part
            c = self.latent_channels
            got = []
            for key, value in (("latents_mean", mean), ("latents_std", std)):
                try:
                    arr = np.asarray(value, dtype=np.float64).reshape(-1)
                except (TypeError, ValueError):
                    arr = np.zeros(0)
                if arr.size != c or not np.all(np.isfinite(arr)) or (key == "latents_std" and np.any(arr <= 0)):
                    raise ModelError(f"the {part} config's {key} is {value!r:.80}, not {c} finite numbers"
                                     + (" above 0" if key == "latents_std" else ""), where=str(where),
                                     fix="fix latents_mean / latents_std in that config.json (one number per latent "
                                         "channel), or remove both for plain scaling_factor scaling")
                got.append(arr.astype(np.float32).reshape(1, c, 1, 1))
            return got[0], got[1]
        return None

    def to_model_latents(self, latent: np.ndarray) -> np.ndarray:
        """A VAE encoder's latent in the denoiser's space: ``(latent - shift) * scale``, or, with the VAE config's
        ``latents_mean`` / ``latents_std``, ``(latent - mean) * scale / std`` (diffusers' SDXL pipelines)."""
        scale, shift = self.scaling
        stats = self.latent_stats
        if stats is not None:
            return ((latent - stats[0]) * np.float32(scale) / stats[1]).astype(np.float32)
        if shift:
            latent = latent - np.float32(shift)
        return (latent * np.float32(scale)).astype(np.float32)

    def to_vae_latents(self, latents: np.ndarray) -> np.ndarray:
        """The denoiser's latents as the VAE decoder takes them: ``latents / scale + shift``, or, with
        ``latents_mean`` / ``latents_std``, ``latents * std / scale + mean``."""
        scale, shift = self.scaling
        stats = self.latent_stats
        if stats is not None:
            return (latents * stats[1] / np.float32(scale) + stats[0]).astype(np.float32)
        z = (latents / np.float32(scale)).astype(np.float32)
        return (z + np.float32(shift)).astype(np.float32) if shift else z

    def preview_latents(self, latent: np.ndarray) -> np.ndarray:
        """A ``(C, h, w)`` latent of the denoiser's space in the family's usual one (the VAE latent times
        ``vae_scale``), which the latent-to-RGB factors and TAESD decoders take: the same array unless the VAE config
        sets ``latents_mean`` / ``latents_std`` (Playground v2.5's latents are normalized per channel)."""
        if self.latent_stats is None:
            return latent
        return (self.to_vae_latents(np.asarray(latent, np.float32)[None])[0] * np.float32(self.vae_scale)).astype(
            np.float32)

    def latent_shape(self, batch: int, height: int, width: int) -> tuple[int, ...]:
        return (batch, self.latent_channels, height // self.vae_factor, width // self.vae_factor)

    # ------------------------------------------------------------------ text
    def conditioner(self, parts: Mapping[str, Part], tokenizers: Mapping[str, Any]) -> Any:
        """The shared conditioner for this family's encoders (CLIP: A1111's chunks; :mod:`..prompts`)."""
        from ..prompts import PromptEncoder, TextEncoder

        clips = [TextEncoder(tokenizers[e.tokenizer], parts[e.part], penultimate=e.penultimate,
                             pooled_output=e.pooled) for e in self.encoders if e.kind == "clip"]
        t5 = [e for e in self.encoders if e.kind == "t5"]
        unknown = [e.kind for e in self.encoders if e.kind not in ("clip", "t5")]
        if unknown or len(t5) > 1:
            raise NotImplementedError(f"{self.name}: encoder kinds {unknown or 'two t5'} have no conditioner")
        if not t5:
            return PromptEncoder(clips)
        from ..textcond import T5Encoder, TextConditioner

        enc = t5[0]
        encoder = (T5Encoder(tokenizers[enc.tokenizer], parts[enc.part], mask=enc.mask) if enc.part in parts
                   else self.missing_t5(parts))
        return TextConditioner(PromptEncoder(clips) if clips else None, encoder, self.join_text,
                               self.default_max_length)

    def missing_t5(self, parts: Mapping[str, Part]) -> Any:
        """What stands for the T5 encoder when the model has none (SD3: zeros); others cannot run without it."""
        raise NotImplementedError(f"{self.name} cannot run without its T5 encoder")

    @property
    def default_max_length(self) -> int:
        """T5's ``max_sequence_length`` unless the run sets one: the family's."""
        return self.max_sequence_length

    def join_text(self, clip: Conditioning | None, t5: np.ndarray, mask: np.ndarray) -> Conditioning:
        """A T5 family's conditioning from its CLIP conditioning (or None) and T5's states and tokenizer mask."""
        raise NotImplementedError(f"{self.name} declares a t5 encoder and no join_text")

    def negative_pass(self, cfg: float, negative_prompt: str) -> bool:
        """Whether a run makes a negative (unconditional) pass: CFG other than 1 (Flux: only with a negative)."""
        return cfg != 1.0 and self.guidance == "cfg"

    def cond_feeds(self, cond: Conditioning, rows: int) -> dict[str, np.ndarray]:
        """The model inputs one conditioning gives, repeated for ``rows`` images."""
        feeds = {self.text_input: np.repeat(cond.hidden, rows, axis=0)}
        feeds.update({k: np.repeat(v, rows, axis=0) for k, v in cond.extra.items()})  # e.g. an attention mask
        return feeds

    # ------------------------------------------------------------------ sampling
    def model_sampling(self, width: int, height: int, shift: float | None = None) -> Any:
        """eps / v from the scheduler config (by its ``_class_name``); flow families: the k-diffusion view, sigma
        times ``num_train_timesteps * timestep_scale`` fed as the timestep, ``shift`` (when given) fixed."""
        from ..scheduling import model_sampling

        config = self.scheduler_config(shift)
        extra = {"multiplier": float(config.get("num_train_timesteps", 1000)) * self.timestep_scale} if self.flow else {}
        return model_sampling(config, str(self.folder.path / "scheduler"), width=width, height=height, **extra)

    def flow_timesteps(self, steps: int, width: int, height: int, shift: float | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        """A flow family's (timesteps, sigmas) as its diffusers pipeline sets the scheduler (SD3: none passed)."""
        from ...samplers.flowmatch import FlowMatchSchedule

        return FlowMatchSchedule.from_config(self.scheduler_config(shift),
                                             where=str(self.folder.path / "scheduler")).timesteps(steps)

    @property
    def prediction(self) -> str:
        """``"eps"``, ``"v"`` or ``"flow"``: the folder's scheduler's, or what a bound checkpoint says
        (``scheduler_overrides``)."""
        from ..scheduling import PREDICTIONS

        kind = self.scheduler_overrides.get("prediction_type")
        return self.folder.prediction if kind is None else PREDICTIONS[kind]

    def scheduler_config(self, shift: float | None = None) -> dict[str, Any]:
        """The folder's scheduler config (with what a bound checkpoint decides: ``scheduler_overrides``), with
        ``shift`` (when given) fixed in place of any dynamic shift."""
        config = {**self.folder.scheduler, **self.scheduler_overrides}
        if shift is not None:
            config.update(shift=float(shift), use_dynamic_shifting=False)
        return config

    def size_error(self, shape: tuple[Any, ...], width: int, height: int) -> tuple[int, int] | None:
        """The one size (width, height) a denoiser exported with static sample dims takes, if it is not this one."""
        f = self.vae_factor
        fixed = [d if isinstance(d, int) and d > 0 else None for d in shape[2:4]]
        if (fixed[0] is not None and fixed[0] * f != height) or (fixed[1] is not None and fixed[1] * f != width):
            return (fixed[1] * f if fixed[1] else width), (fixed[0] * f if fixed[0] else height)
        return None

    def infotext(self, settings: Any) -> dict[str, object]:
        """Fields the family adds to the PNG ``parameters`` (Forge's names)."""
        return {}

    # ------------------------------------------------------------------ the model call
    def hooks(self, call: ModelCall) -> list[Hook]:
        """The family's per-call inputs beyond sample, timestep and conditioning."""
        hooks: list[Hook] = []
        if call.extra is not None:
            extra = call.extra

            def inpaint(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                sample = feeds[self.sample_input]
                rows = np.concatenate([extra] * (sample.shape[0] // extra.shape[0]), axis=0)
                return {self.sample_input: np.concatenate([sample, rows], axis=1)}

            hooks.append(inpaint)
        if call.edit is not None:
            image = call.edit

            def edit(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                # InstructPix2Pix: the image latent beside the sample; a call of three blocks (EditCFGDenoiser's
                # [cond, uncond, uncond]) takes zeros in the third, the "no image" guidance pass
                sample = feeds[self.sample_input]
                blocks = sample.shape[0] // image.shape[0]
                rows = [image] * blocks
                if blocks == 3:
                    rows[2] = np.zeros_like(image)
                return {self.sample_input: np.concatenate([sample, np.concatenate(rows, axis=0).astype(
                    sample.dtype, copy=False)], axis=1)}

            hooks.append(edit)
        return hooks

    def session(self, part: Part) -> Any:
        """What the denoiser runs: the part itself; a family that packs latents (Flux) wraps it here."""
        return part

    def denoiser(self, part: Part, model_sampling: Any, call: ModelCall) -> Any:
        """The guided denoiser the loop calls: ``sdrt.samplers.CFGDenoiser`` around a ``Denoiser``."""
        from ...samplers import CFGDenoiser, Denoiser, EditCFGDenoiser

        outputs = part.outputs
        model = Denoiser(self.session(part), model_sampling, sample_name=self.sample_input, cond_name=self.text_input,
                         output_name=self.output if self.output in outputs else None,
                         hooks=[*self.hooks(call), *call.hooks], after=call.after)
        cond = self.cond_feeds(call.cond, call.batch)
        uncond = self.cond_feeds(call.uncond, call.batch) if call.uncond is not None else None
        if call.edit is not None and call.edit_guidance == "edit" and uncond is not None:
            return EditCFGDenoiser(model, cond, uncond, call.cfg, call.image_cfg)
        if call.edit is not None and call.edit_guidance == "none":
            return CFGDenoiser(model, cond, None, 1.0, batched=self.batched_cfg)
        return CFGDenoiser(model, cond, uncond, call.cfg if self.guidance == "cfg" else 1.0, batched=self.batched_cfg,
                           rescale=call.guidance_rescale)

    # ------------------------------------------------------------------ the contract
    def check(self, parts: Mapping[str, Part]) -> None:
        """Each part's inputs and outputs against what this family feeds and reads; ModelError naming it."""
        from .contract import check_family

        check_family(self, parts)

    def __repr__(self) -> str:
        return f"<family {self.name}: {self.label}>"
