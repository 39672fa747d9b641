"""What the area to repaint starts from (``masked_content=``): A1111's img2img "Masked content" (``inpainting_fill``).

- ``"original"`` (default): the init image's latent, as diffusers and A1111's 1 ("original").
- ``"latent noise"`` (A1111's 2): where the latent mask repaints, the init latent is replaced by the run's unit
  noise, the same tensor the run then scales by the first sigma and adds (A1111's processing.py img2img init:
  ``init_latent * (1 - latmask) + noise * latmask``, the noise being the seed's first draw, its sampler's too).
- ``"latent nothing"`` (A1111's 3): there it becomes zeros (``init_latent * (1 - latmask)``).

The latent mask is A1111's: the run's mask (white = repaint) resized to the latent grid with Pillow's default
resampling (bicubic) and rounded to 0 or 1, not the nearest sampling the run blends with (they agree where the
mask's edges lie on the 8-pixel grid). Only the start changes: the blend after each step keeps the init latent,
as A1111's, whose blend reads only the kept part. A1111's fill 0 (``masking.fill`` of the picture) is sdrt
serve's (``sdrt.serve.b64images.fill_masked``), a change to the picture before this."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from .names import spelled

ORIGINAL = "original"
MODES = (ORIGINAL, "latent noise", "latent nothing")


def check(value: Any) -> str:
    """``masked_content``: one of :data:`MODES` (any case; ``_`` or ``-`` for the space)."""
    if isinstance(value, str):
        key = spelled(value)
        if key in MODES:
            return key
    raise InputError(f"unknown {{@masked_content}} {str(value)[:40]!r}", where="masked_content",
                     fix=f"use one of {', '.join(repr(m) for m in MODES)}")


def latent_mask(mask: np.ndarray, h: int, w: int) -> np.ndarray:
    """A1111's ``latmask``: the mask (HxW, 0..1, 1 = repaint) as 8-bit grey, resized to (h, w) by Pillow's bicubic
    filter (``Image.resize``'s default), then rounded: 1 where the latent repaints."""
    from PIL import Image

    grey = Image.fromarray(np.clip(np.rint(np.asarray(mask, np.float64) * 255), 0, 255).astype(np.uint8), "L")
    small = np.asarray(grey.resize((w, h), Image.Resampling.BICUBIC), np.float32) / 255
    return np.around(small).astype(np.float32)


def start_latents(mode: str, image_latents: np.ndarray, noise: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The latent a run starts from (before its first sigma's noise is added): ``image_latents`` (NCHW) with the
    repainted area as ``mode`` says; ``noise`` is the run's unit noise of the same shape."""
    if mode == ORIGINAL:
        return image_latents
    repaint = latent_mask(mask, image_latents.shape[2], image_latents.shape[3])[None, None]
    kept = image_latents * (1 - repaint)
    if mode == "latent noise":
        kept = kept + noise * repaint
    return kept.astype(image_latents.dtype)


__all__ = ["MODES", "check", "latent_mask", "start_latents"]
