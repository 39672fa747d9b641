"""Pure numpy pieces of the flow-matching families (SD3/3.5, Flux.1, Chroma), as diffusers' pipelines compute them.

The family modules call these; each is checked against the values diffusers computed for the tiny folders
(``tests/flow``, data from ``scripts/gen_flow_refs.py``).

- Latents: ``sd3_latent_shape``/``flux_latent_shape`` (where the seeded noise is drawn),
  ``pack_latents``/``unpack_latents`` (Flux's and Chroma's 2x2 patches), ``latent_image_ids``/``text_ids``.
- Text: ``sd3_prompt_embeds`` (CLIP-L and CLIP-G penultimate states side by side, zero-padded to T5's width,
  then T5's sequence after them), ``sd3_pooled`` and ``sd3_clip_output`` (which hidden-state output to read),
  ``chroma_text_mask`` and ``chroma_attention_mask`` (every real token and the first padding token).
- VAE: ``vae_latent`` (a ``latent_parameters`` output to a latent, the sample drawn as diffusers draws it), and the
  16-channel scale *and* shift: ``to_vae`` (before ``vae_decoder``) and ``from_vae`` (after ``vae_encoder``).
- ``transformer_timestep``: what the exported transformer takes as ``timestep`` for a scheduler timestep.
- Sizes: ``flow_size_error`` (sides a multiple of 16: VAE 8 x patch 2), ``largest_side`` and ``sd3_size_error``
  (SD 3's learned position table, which bounds the image), as errors in the caller's words.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = [
    "chroma_attention_mask",
    "chroma_text_mask",
    "flow_size_error",
    "flux_latent_shape",
    "from_vae",
    "largest_side",
    "latent_image_ids",
    "pack_latents",
    "sd3_clip_output",
    "sd3_latent_shape",
    "sd3_pooled",
    "sd3_prompt_embeds",
    "sd3_size_error",
    "text_ids",
    "to_vae",
    "transformer_timestep",
    "unpack_latents",
    "vae_latent",
]

_WHERE = "sdrt.pipelines.flowparts"
VAE_FACTOR = 8


class WrappedPart:
    """A denoiser part seen through a wrapper that changes its feeds and its output (Flux's packing, FLUX.1 Kontext's
    reference tokens): the part's inputs and outputs, and ``sample``/``output`` as the family names them."""

    def __init__(self, part: Any, sample: str, output: str) -> None:
        self.part, self.sample, self.output = part, sample, output

    @property
    def inputs(self) -> Any:
        return self.part.inputs

    @property
    def outputs(self) -> Any:
        return self.part.outputs

    def output_name(self, out: Mapping[str, Any]) -> str:
        """The family's output among ``out``, else the first (an export that names it otherwise)."""
        return self.output if self.output in out else next(iter(out))


def _check_size(height: int, width: int, multiple: int, what: str) -> None:
    if height <= 0 or width <= 0 or height % multiple or width % multiple:
        raise InputError(f"image size {width}x{height} is not a positive multiple of {multiple}", where=what,
                         fix=f"pass a width and height divisible by {multiple}")


# ---------------------------------------------------------------- sizes
def flow_size_error(width: int | None, height: int | None, label: str, source: str | None = None
                    ) -> InputError | None:
    """A width or height (the first, width before height) that is not a multiple of 16, which a flow model
    (``label``: SD3, Flux.1, Chroma) needs (VAE 8 x patch 2), as an error naming the argument; else None.
    ``source``: the argument the size came from when not width and height (``init_image``, ``hires_scale``)."""
    where, value = next(((w, v) for w, v in (("width", width), ("height", height)) if v is not None and v % 16),
                        (None, 0))
    if where is None:
        return None
    if source is not None:  # the size came from the init image or the hires scale, not from width/height
        assert width is not None and height is not None
        return InputError(f"the {'init image' if source == 'init_image' else 'hires pass'} is {width}x{height}, and "
                          f"{label} needs multiples of 16 (VAE 8 x patch 2)", where=source,
                          fix=f"make it {width - width % 16}x{height - height % 16}")
    down = value - value % 16
    return InputError(f"{{@{where}}} {value} is not a multiple of 16, which {label} needs (VAE 8 x patch 2)",
                      where=where, fix=f"use {down} or {down + 16}" if down else "use 16")


def largest_side(config: Mapping[str, Any], graph: Any) -> int | None:
    """The largest side in pixels an SD 3 transformer makes: its position table's patches a side (the config's
    ``pos_embed_max_size``, else the ``pos_embed.pos_embed`` table of the graph, ``[1, n*n, width]``) x 16 (patch 2 x
    VAE 8), as diffusers' ``PatchEmbed.cropped_pos_embed`` refuses more; None when neither says."""
    size = config.get("pos_embed_max_size")
    if not isinstance(size, int) or size <= 0:
        table = next((t for n, t in graph.initializer_info().items() if n.endswith("pos_embed.pos_embed")), None)
        if table is None or len(table.shape) != 3 or not isinstance(table.shape[1], int):
            return None
        size = math.isqrt(table.shape[1])
        if size * size != table.shape[1]:
            return None
    return size * 16


def sd3_size_error(width: int, height: int, largest: int | None, label: str, source: str | None = None
                   ) -> InputError | None:
    """A side above ``largest`` (:func:`largest_side`; None: no bound known), as an error naming the argument
    (``source``: as :func:`flow_size_error`'s); else None."""
    if largest is None or max(width, height) <= largest:
        return None
    if source is not None:
        what = "init image" if source == "init_image" else "hires fix's second pass"
        return InputError(f"the {what} is {width}x{height}, above the {largest} pixels a side "
                          f"{label} makes (its transformer's position table)", where=source,
                          fix=f"pass {{@width}} and {{@height}} of {largest} or less" if source == "init_image"
                          else "pass a smaller {@hires_scale} or {@width} and {@height}")
    where, value = ("width", width) if width > largest else ("height", height)
    sides = " and ".join(f"{{@{side}=}}{largest}" for side, v in (("width", width), ("height", height)) if v > largest)
    return InputError(f"{{@{where}}} {value} is above the {largest} pixels a side {label} makes (its transformer's "
                      f"position table is {largest // 16} patches of 16 pixels a side)", where=where,
                      fix=f"pass {sides} or less, the largest side this model makes")


# ---------------------------------------------------------------- latents
def sd3_latent_shape(batch: int, height: int, width: int, channels: int = 16) -> tuple[int, int, int, int]:
    """SD3's latent (and noise) shape: ``(batch, 16, height / 8, width / 8)``; sizes a multiple of 16 (8 x patch 2)."""
    _check_size(height, width, 16, f"{_WHERE}.sd3_latent_shape")
    return (batch, channels, height // VAE_FACTOR, width // VAE_FACTOR)


def flux_latent_shape(batch: int, height: int, width: int, channels: int = 16) -> tuple[int, int, int, int]:
    """Where Flux's and Chroma's pipelines draw their noise: ``(batch, 16, 2 (height // 16), 2 (width // 16))``,
    unpacked; ``pack_latents`` then makes the transformer's tokens. diffusers rounds sizes down to 16."""
    if height < 16 or width < 16:
        raise InputError(f"image size {width}x{height} is under 16 pixels", where=f"{_WHERE}.flux_latent_shape",
                         fix="pass a width and height of at least 16 (multiples of 16)")
    return (batch, channels, 2 * (height // 16), 2 * (width // 16))


def pack_latents(latents: np.ndarray) -> np.ndarray:
    """``[B, C, H, W]`` -> ``[B, (H/2)(W/2), 4C]``: each 2x2 patch one token, channels-major within it."""
    b, c, h, w = latents.shape
    if h % 2 or w % 2:
        raise InputError(f"latent size {h}x{w} is odd", where=f"{_WHERE}.pack_latents",
                         fix="use an image size that is a multiple of 16")
    x = latents.reshape(b, c, h // 2, 2, w // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(b, (h // 2) * (w // 2), c * 4))


def unpack_latents(packed: np.ndarray, height: int, width: int) -> np.ndarray:
    """The inverse of ``pack_latents`` for an image of ``height x width`` pixels."""
    b, n, d = packed.shape
    h, w = 2 * (height // 16), 2 * (width // 16)
    if n != (h // 2) * (w // 2) or d % 4:
        raise InputError(f"packed latents of shape {packed.shape} do not fit a {width}x{height} image",
                         where=f"{_WHERE}.unpack_latents", fix="pass the size the latents were made for")
    x = packed.reshape(b, h // 2, w // 2, d // 4, 2, 2).transpose(0, 3, 1, 4, 2, 5)
    return np.ascontiguousarray(x.reshape(b, d // 4, h, w))


def latent_image_ids(height: int, width: int) -> np.ndarray:
    """Flux's ``img_ids`` ``[(h/2)(w/2), 3]`` float32 for an image of ``height x width`` pixels: (0, row, column)."""
    rows, cols = height // 16, width // 16
    ids = np.zeros((rows, cols, 3), np.float32)
    ids[..., 1] = np.arange(rows, dtype=np.float32)[:, None]
    ids[..., 2] = np.arange(cols, dtype=np.float32)[None, :]
    return ids.reshape(rows * cols, 3)


def text_ids(length: int) -> np.ndarray:
    """Flux's and Chroma's ``txt_ids``: zeros ``[length, 3]`` float32."""
    return np.zeros((length, 3), np.float32)


# ---------------------------------------------------------------- text
def sd3_clip_output(num_layers: int, clip_skip: int | None = None) -> str:
    """The text encoder output SD3 reads: ``hidden_states[-(clip_skip + 2)]`` (penultimate layer by default), i.e.
    the ONNX output ``hidden_states.{num_layers + 1 - (clip_skip + 2)}`` (no final layer norm)."""
    skip = 0 if clip_skip is None else int(clip_skip)
    index = num_layers + 1 - (skip + 2)
    if skip < 0 or index < 0:
        raise InputError(f"clip_skip {clip_skip} is out of range for a {num_layers}-layer text encoder",
                         where=f"{_WHERE}.sd3_clip_output", fix=f"pass clip_skip between 0 and {num_layers - 1}")
    return f"hidden_states.{index}"


def sd3_prompt_embeds(clip_l: np.ndarray, clip_g: np.ndarray, t5: np.ndarray | None, *,
                      t5_width: int | None = None) -> np.ndarray:
    """SD3's joint text sequence: ``[CLIP-L | CLIP-G]`` features zero-padded to T5's width, then T5's tokens.

    ``clip_l``: ``[B, 77, dl]``, ``clip_g``: ``[B, 77, dg]``, ``t5``: ``[B, L, dt]`` or None (no third encoder:
    diffusers uses zeros ``[B, 77, joint width]``; pass ``t5_width``). Returns ``[B, 77 + L, dt]`` float32."""
    if clip_l.shape[:2] != clip_g.shape[:2]:
        raise InputError(f"CLIP-L states {clip_l.shape} and CLIP-G states {clip_g.shape} differ in batch or length",
                         where=f"{_WHERE}.sd3_prompt_embeds", fix="encode the same prompts to 77 tokens with both")
    clip = np.concatenate([clip_l, clip_g], axis=-1).astype(np.float32)
    if t5 is None:
        if t5_width is None:
            raise InputError("no T5 states and no t5_width", where=f"{_WHERE}.sd3_prompt_embeds",
                             fix="pass t5_width (the transformer's joint_attention_dim)")
        t5 = np.zeros((clip.shape[0], 77, t5_width), np.float32)
    width = t5.shape[-1]
    if clip.shape[-1] > width or t5.shape[0] != clip.shape[0]:
        raise InputError(f"CLIP features {clip.shape} do not fit T5 states {t5.shape}",
                         where=f"{_WHERE}.sd3_prompt_embeds", fix="check the folder's text encoders")
    clip = np.pad(clip, ((0, 0), (0, 0), (0, width - clip.shape[-1])))
    return np.concatenate([clip, t5.astype(np.float32)], axis=-2)


def sd3_pooled(pooled_l: np.ndarray, pooled_g: np.ndarray) -> np.ndarray:
    """SD3's ``pooled_projections``: CLIP-L's and CLIP-G's ``text_embeds`` side by side."""
    return np.concatenate([pooled_l, pooled_g], axis=-1).astype(np.float32)


def chroma_text_mask(tokenizer_mask: np.ndarray) -> np.ndarray:
    """Chroma's text mask from the T5 tokenizer's ``attention_mask`` ``[B, L]``: every real token and the first
    padding token attend, the rest of the padding is dropped (lodestone-rock/flow, ComfyUI, diffusers' rule)."""
    m = np.asarray(tokenizer_mask)
    if m.ndim != 2:
        raise InputError(f"tokenizer mask of shape {m.shape} is not [batch, length]",
                         where=f"{_WHERE}.chroma_text_mask", fix="pass the tokenizer's attention_mask")
    lengths = (m != 0).sum(axis=1)
    return np.arange(m.shape[1])[None, :] <= lengths[:, None]


def chroma_attention_mask(text_mask: np.ndarray, image_tokens: int) -> np.ndarray:
    """The transformer's boolean ``attention_mask`` ``[B, text + image]``: the text mask, then every image token."""
    b = text_mask.shape[0]
    return np.concatenate([text_mask.astype(bool), np.ones((b, image_tokens), bool)], axis=1)


# ---------------------------------------------------------------- VAE
def vae_latent(parameters: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
    """A latent from ``vae_encoder``'s ``latent_parameters`` ``[B, 2C, h, w]``: the mean, or with ``noise`` (drawn
    as diffusers draws it, ``randn`` of the mean's shape from the run's generator) ``mean + std * noise``, with
    log-variance clamped to [-30, 20] as diffusers' ``DiagonalGaussianDistribution``."""
    mean, logvar = np.split(parameters.astype(np.float32), 2, axis=1)
    if noise is None:
        return mean
    std = np.exp(np.float32(0.5) * np.clip(logvar, -30.0, 20.0))
    return (mean + std * noise.astype(np.float32)).astype(np.float32)


def to_vae(latents: np.ndarray, scaling_factor: float, shift_factor: float = 0.0) -> np.ndarray:
    """The ``vae_decoder`` input: ``latents / scaling_factor + shift_factor`` (SD3: 1.5305, 0.0609; Flux and
    Chroma: 0.3611, 0.1159; SD 1.x/XL have no shift)."""
    return (latents.astype(np.float32) / np.float32(scaling_factor) + np.float32(shift_factor)).astype(np.float32)


def from_vae(latent: np.ndarray, scaling_factor: float, shift_factor: float = 0.0) -> np.ndarray:
    """A ``vae_encoder`` latent in the transformer's space: ``(latent - shift_factor) * scaling_factor``."""
    return ((latent.astype(np.float32) - np.float32(shift_factor)) * np.float32(scaling_factor)).astype(np.float32)


# ---------------------------------------------------------------- timestep
def transformer_timestep(family: str, timestep: float | np.ndarray, batch: int) -> np.ndarray:
    """The exported transformer's ``timestep`` input ``[batch]`` float32 for a scheduler timestep (0..1000):
    SD3 takes it as is; Flux and Chroma take ``timestep / 1000`` (their graphs scale by 1000 inside, and Flux
    dev's ``guidance`` input is the guidance scale, scaled inside too)."""
    t = np.float32(timestep)
    if family == "sd3":
        value = t
    elif family in ("flux", "chroma"):
        value = t / np.float32(1000)
    else:
        raise InputError(f"unknown flow family {family!r}", where=f"{_WHERE}.transformer_timestep",
                         fix="pass 'sd3', 'flux' or 'chroma'")
    return np.full((batch,), value, np.float32)
