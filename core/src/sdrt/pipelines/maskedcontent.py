"""What the area to repaint starts from (``masked_content=``): A1111's img2img "Masked content" (``inpainting_fill``).

- ``"original"`` (default): the init image's latent, as diffusers and A1111's 1 ("original").
- ``"fill"`` (A1111's 0): the init image, once fitted to the run's size (for "only masked", the cut-out once
  fitted), is filled where the mask repaints as A1111's ``masking.fill`` fills it (:func:`fill`), then encoded.
- ``"latent noise"`` (A1111's 2): the picture filled as for ``"fill"`` (A1111 fills for every value but 1), then
  where the latent mask repaints its latent is replaced by the run's unit noise, the same tensor the run then scales
  by the first sigma and adds (A1111's processing.py img2img init: ``init_latent * (1 - latmask) + noise *
  latmask``, the noise being the seed's first draw, its sampler's too).
- ``"latent nothing"`` (A1111's 3): filled, then zeros there (``init_latent * (1 - latmask)``).

The fill's mask is A1111's ``latent_mask``: the run's grey mask (blurred, ``mask_blur``) fitted to the size, before
it is binarized. The latent mask is A1111's: that mask resized to the latent grid with Pillow's default resampling
(bicubic) and rounded to 0 or 1, not the nearest sampling the run blends with (they agree where the mask's edges
lie on the 8-pixel grid). Only the start changes: the blend after each step keeps the init latent, as A1111's,
whose blend reads only the kept part."""
from __future__ import annotations

from typing import Any

import numpy as np

from .names import one_of

ORIGINAL = "original"
FILL = "fill"
MODES = (ORIGINAL, FILL, "latent noise", "latent nothing")
#: A1111's ``inpainting_fill`` numbers of :data:`MODES`
A1111_FILL = {0: FILL, 1: ORIGINAL, 2: "latent noise", 3: "latent nothing"}


def check(value: Any) -> str:
    """``masked_content``: one of :data:`MODES` (any case; ``_`` or ``-`` for the space), or A1111's
    ``inpainting_fill`` number (0 to 3, :data:`A1111_FILL`), as ``resize_mode`` takes A1111's numbers."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) in A1111_FILL:
        return A1111_FILL[int(value)]
    return one_of(value, MODES, "masked_content")


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
    if mode in (ORIGINAL, FILL):
        return image_latents
    repaint = latent_mask(mask, image_latents.shape[2], image_latents.shape[3])[None, None]
    kept = image_latents * (1 - repaint)
    if mode == "latent noise":
        kept = kept + noise * repaint
    return kept.astype(image_latents.dtype)


def fills(mode: str) -> bool:
    """Whether ``mode`` fills the picture before it is encoded (every mode but ``"original"``, as A1111's)."""
    return mode != ORIGINAL


#: A1111's fill (modules/masking.py): Gaussian blurs of the kept picture, widest first, each laid over the last
#: the given number of times; the last, unblurred, puts the kept pixels back
_FILL_BLURS = ((256, 1), (64, 1), (16, 2), (4, 4), (2, 2), (0, 1))


def fill(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A1111's ``masking.fill`` of an HxWx3 uint8 picture: where ``mask`` (HxW uint8, white = repaint; grey levels,
    a blurred mask's edge, keep the picture partly) keeps it, the picture becomes a premultiplied-alpha layer;
    Pillow's Gaussian blurs of it at falling radii are alpha-composited, one over the other, on a transparent
    canvas, so the area to repaint takes a smooth colour field spread from its surroundings and the kept pixels come
    back as they were. A mask of another size is stretched to the picture's first."""
    from PIL import Image, ImageFilter, ImageOps

    if mask.shape != image.shape[:2]:
        from .images import JUST_RESIZE, fit_array

        mask = fit_array(mask, image.shape[1], image.shape[0], JUST_RESIZE, "mask", "mask")
    if not np.any(mask):
        return image  # nothing to repaint: the composite gives the picture back unchanged
    size = (image.shape[1], image.shape[0])
    kept = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).convert("RGBA").convert("RGBa")
    layer = Image.new("RGBa", size)  # transparent: the area to repaint
    layer.paste(kept, mask=ImageOps.invert(Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8), "L")))
    canvas = Image.new("RGBA", size)
    for radius, times in _FILL_BLURS:
        spread = layer.filter(ImageFilter.GaussianBlur(radius)).convert("RGBA")
        for _ in range(times):
            canvas.alpha_composite(spread)
    return np.asarray(canvas.convert("RGB"), dtype=np.uint8)


__all__ = ["A1111_FILL", "FILL", "MODES", "check", "fill", "fills", "latent_mask", "start_latents"]
