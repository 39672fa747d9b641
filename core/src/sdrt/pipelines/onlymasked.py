"""Inpainting of the masked area only (``inpaint_area="only masked"``): A1111's img2img "Inpaint area: Only masked"
(``inpaint_full_res``, with ``inpaint_full_res_padding``), diffusers' ``padding_mask_crop``.

A small area to repaint is cut out of the init image, run at the full ``width x height`` and put back:

1. the crop: the bounding box of the mask's non-black pixels, widened by ``inpaint_padding`` pixels on each side
   (within the picture), then grown on its shorter side (split evenly, moved back inside the picture where it
   would leave it) to the run's ``width:height`` aspect ratio, as far as the picture allows (A1111's
   ``masking.get_crop_region_v2`` and ``expand_crop_region``; diffusers' ``VaeImageProcessor.get_crop_region``
   is the same arithmetic);
2. the picture and the mask cut to it and fitted to ``width x height`` with Resize and Fill (A1111's
   ``resize_image(2, ...)``, diffusers' ``resize_mode="fill"``; an ``init_upscaler`` enlarges the picture, as A1111's
   ``upscaler_for_img2img`` does); the run's mask is that fitted mask, binarized as any mask;
3. each image the run makes resized back to the crop's size with Crop and Resize (A1111's ``resize_image(1, ...)``,
   diffusers' ``resize_mode="crop"``) and laid into the init image at its own size, then the init image composited
   over it with the mask as given (grey levels kept: a blurred mask's edge blends) as the alpha of what is kept:
   A1111's and diffusers' ``apply_overlay`` (the picture premultiplied by 255 - mask, Pillow's alpha composite).

The images come back at the init image's size. The infotext says ``Inpaint area: Only masked`` and ``Masked area
padding: N`` as A1111 writes them. A mask with nothing to repaint (all black) is refused: A1111 then runs plain
img2img without the mask and says so in a comment, diffusers' crop region is undefined.

ControlNet units (:func:`cut_control`) see the same area: each unit's input image, before its preprocessor, is fitted to
the init image's size in the unit's resize mode, cut to the crop and fitted with Resize and Fill, as
sd-webui-controlnet's ``try_crop_image_with_a1111_mask`` does (a unit's ``inpaint_crop=False``: the whole image).

The whole-picture mode's paste-back (``mask_overlay=True``) is :class:`Overlay`: A1111's ``apply_overlay`` without
the crop, the fitted picture composited over each image through the fitted mask doubled (:func:`overlay_alpha`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .names import one_of

WHOLE_PICTURE = "whole picture"
ONLY_MASKED = "only masked"
#: ``inpaint_area``'s values, as A1111's img2img UI names them (0 and 1 of its ``inpaint_full_res``)
AREAS = (WHOLE_PICTURE, ONLY_MASKED)
#: A1111's default ``inpaint_full_res_padding`` ("Only masked padding, pixels")
DEFAULT_PADDING = 32


def check_area(value: Any) -> str:
    """``inpaint_area``: one of :data:`AREAS` (any case; ``_`` or ``-`` for the space)."""
    return one_of(value, AREAS, "inpaint_area")


def check_padding(value: Any) -> int:
    """``inpaint_padding``: the pixels the mask's box is widened by, an integer from 0 to the largest side."""
    from .bounds import MAX_SIDE

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_SIDE:
        raise InputError(f"{{@inpaint_padding}} must be an integer from 0 to {MAX_SIDE} (pixels), got {value!r:.40}",
                         where="inpaint_padding", fix=f"use e.g. {{@inpaint_padding=}}{DEFAULT_PADDING} (A1111's default)")
    return int(value)


def _grow(low: int, high: int, by: int, size: int) -> tuple[int, int]:
    """``[low, high)`` grown by ``by`` pixels, half before (rounded down) and the rest after, then moved back
    inside ``[0, size)`` and cut to it where it is longer."""
    low -= by // 2
    high += by - by // 2
    if high >= size:
        low -= high - size
        high = size
    if low < 0:
        high -= low
        low = 0
    return low, min(high, size)


def crop_box(gray: np.ndarray, width: int, height: int, padding: int) -> tuple[int, int, int, int] | None:
    """``(x1, y1, x2, y2)`` (x2, y2 exclusive) of the area an HxW uint8 ``gray`` mask repaints, widened by
    ``padding`` and grown to ``width:height`` (the module's step 1); None when the mask is all black."""
    rows = np.flatnonzero(gray.any(axis=1))
    cols = np.flatnonzero(gray.any(axis=0))
    if rows.size == 0:
        return None
    h, w = gray.shape
    x1, y1 = max(int(cols[0]) - padding, 0), max(int(rows[0]) - padding, 0)
    x2, y2 = min(int(cols[-1]) + 1 + padding, w), min(int(rows[-1]) + 1 + padding, h)
    ratio = width / height
    if (x2 - x1) / (y2 - y1) > ratio:  # wider than the run: taller, by the float arithmetic A1111's has
        y1, y2 = _grow(y1, y2, int((x2 - x1) / ratio - (y2 - y1)), h)
    else:
        x1, x2 = _grow(x1, x2, int((y2 - y1) * ratio - (x2 - x1)), w)
    return x1, y1, x2, y2


@dataclass
class Paste:
    """What puts a run's images back into its init image: the picture at its own size, the mask as given (the
    overlay's alpha) and the crop box."""

    picture: np.ndarray
    overlay: np.ndarray
    box: tuple[int, int, int, int]
    padding: int
    enlarge: Any = None

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """One HxWx3 uint8 image of the run, pasted (the module's step 3)."""
        from PIL import Image

        from .images import CROP_AND_RESIZE, fit_array

        x1, y1, x2, y2 = self.box
        back = fit_array(np.ascontiguousarray(image, dtype=np.uint8), x2 - x1, y2 - y1, CROP_AND_RESIZE,
                         enlarge=self.enlarge)
        base = Image.fromarray(self.picture).convert("RGBA")  # outside the box the mask is black: the picture
        base.paste(Image.fromarray(back).convert("RGBA"), (x1, y1))
        base.alpha_composite(kept_layer(self.picture, self.overlay))
        return np.asarray(base.convert("RGB"), dtype=np.uint8)


def kept_layer(picture: np.ndarray, alpha: np.ndarray) -> Any:
    """A1111's overlay image: the picture (HxWx3 uint8) premultiplied by its kept share, 255 - ``alpha`` (HxW uint8,
    white = repaint), as an RGBA Pillow image to alpha-composite over a run's image (``apply_overlay``)."""
    from PIL import Image, ImageOps

    h, w = picture.shape[:2]
    kept = Image.new("RGBa", (w, h))
    kept.paste(Image.fromarray(np.ascontiguousarray(picture, np.uint8)).convert("RGBA").convert("RGBa"),
               mask=ImageOps.invert(Image.fromarray(np.ascontiguousarray(alpha, np.uint8), "L")))
    return kept.convert("RGBA")


def overlay_alpha(fitted: np.ndarray) -> np.ndarray:
    """A1111's whole-picture ``mask_for_overlay``: the fitted grey mask doubled, clipped to 255 (processing.py:
    ``np.clip(mask * 2, 0, 255)``): half a level of blur already keeps the run's pixels alone."""
    return np.clip(fitted.astype(np.float32) * 2, 0, 255).astype(np.uint8)


@dataclass
class Overlay:
    """``mask_overlay`` in the whole-picture mode: the fitted init image (before any fill) composited over each
    image of the run where :func:`overlay_alpha` of the fitted mask keeps it, as A1111's ``apply_overlay`` without
    a paste location: where the mask is black the picture comes back byte for byte."""

    picture: np.ndarray
    alpha: np.ndarray

    def __call__(self, image: np.ndarray) -> np.ndarray:
        from PIL import Image

        base = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).convert("RGBA")
        base.alpha_composite(kept_layer(self.picture, self.alpha))
        return np.asarray(base.convert("RGB"), dtype=np.uint8)


def prepare(picture: np.ndarray, gray: np.ndarray, width: int, height: int, padding: int,
            enlarge: Any = None) -> tuple[np.ndarray, np.ndarray, Paste]:
    """The init image and the grey mask cut to the masked area and fitted to ``width x height`` (steps 1 and 2),
    and the :class:`Paste` that puts the run's images back. ``gray`` is the mask at the picture's size."""
    from .images import RESIZE_AND_FILL, fit_array

    box = crop_box(gray, width, height, padding)
    if box is None:
        raise InputError("the mask is all black: with {@inpaint_area} 'only masked' the picture is cut to the area "
                         "the mask repaints, and it repaints none", where="mask",
                         fix="paint the area to repaint white, or leave {@inpaint_area} unset (img2img: leave "
                             "{@mask} out)")
    x1, y1, x2, y2 = box
    init = fit_array(np.ascontiguousarray(picture[y1:y2, x1:x2]), width, height, RESIZE_AND_FILL, enlarge=enlarge)
    mask = fit_array(np.ascontiguousarray(gray[y1:y2, x1:x2]), width, height, RESIZE_AND_FILL, "mask", "mask")
    return init, mask, Paste(np.ascontiguousarray(picture, dtype=np.uint8), np.ascontiguousarray(gray, np.uint8),
                             box, padding, enlarge)


def cut_control(image: np.ndarray, paste: Paste, mode: str, width: int, height: int, what: str = "control image",
                where: str = "controlnets") -> np.ndarray:
    """A ControlNet unit's input image (HxWx3 uint8) cut to the area an only-masked run repaints, before its
    preprocessor, as sd-webui-controlnet's ``try_crop_image_with_a1111_mask`` cuts it (its
    ``inpaint_crop_input_image``, on by default): fitted to the init image's size with the unit's resize ``mode``
    (A1111's ``resize_image``, Lanczos), cut to the run's crop box (``paste.box``, the box the picture is cut to), and
    fitted to ``width x height`` with Resize and Fill, as the picture's cut-out is."""
    from .images import RESIZE_AND_FILL, fit_array

    ph, pw = paste.picture.shape[:2]
    x1, y1, x2, y2 = paste.box
    full = fit_array(np.ascontiguousarray(image, dtype=np.uint8), pw, ph, mode, what, where)
    return fit_array(np.ascontiguousarray(full[y1:y2, x1:x2]), width, height, RESIZE_AND_FILL, what, where)


def infotext(padding: int) -> dict[str, object]:
    """A1111's fields for an only-masked run (processing.py's ``extra_generation_params``)."""
    return {"Inpaint area": "Only masked", "Masked area padding": padding}


__all__ = ["AREAS", "DEFAULT_PADDING", "ONLY_MASKED", "WHOLE_PICTURE", "Overlay", "Paste", "check_area",
           "check_padding", "crop_box", "cut_control", "infotext", "kept_layer", "overlay_alpha", "prepare"]
