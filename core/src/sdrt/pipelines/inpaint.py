"""What an inpainting run adds to a run, as a mixin of :class:`sdrt.pipelines.pipeline.Pipeline`.

The mask read and blurred (:mod:`.maskblur`), the init image filled where it repaints (:mod:`.maskedcontent`),
kept for the overlay or cut to the mask's area and pasted back (:mod:`.onlymasked`), and the infotext fields
these write. Kept out of ``pipeline.py`` so that the job flow reads there; the pipeline calls these from
``_fit_init`` (``_mask_gray``, ``_fit_masked_area``, ``_masked_start``), on each decoded image (``_pasted``) and
for the infotext (``_mask_infotext``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from .settings import Settings

log = logging.getLogger("sdrt.pipelines")


class InpaintMixin:
    """Mask blur, masked content, mask overlay and only-masked inpainting for the generic pipeline."""

    _dry: bool
    _model_upscaler: Any
    _init_fit: Any
    _init_source: np.ndarray | None
    _paste: Any

    def _mask_gray(self, s: Settings) -> np.ndarray | None:
        """The run's mask as grey levels, at its own size, blurred by ``s.mask_blur`` (A1111's mask blur); None
        without a mask."""
        from .images import mask_gray

        gray = mask_gray(s.mask) if s.mask is not None else None
        if gray is not None and s.mask_blur != (0, 0):  # A1111's mask blur, at the mask's own size
            from .maskblur import blur

            gray = blur(gray, *s.mask_blur)
        return gray

    def _masked_start(self, s: Settings, init: np.ndarray, fitted: np.ndarray, gray: np.ndarray) -> np.ndarray:
        """The whole-picture run's init image, as A1111's img2img init makes it: the fitted picture, before any
        fill, kept for ``mask_overlay`` (sdrt.pipelines.onlymasked.Overlay), then filled where the fitted grey mask
        repaints for every ``masked_content`` but "original" (sdrt.pipelines.maskedcontent.fill); the latent
        upscale's picture at its own size is filled there, with the mask stretched to it."""
        from .maskedcontent import fill, fills
        from .onlymasked import Overlay, overlay_alpha

        if s.mask_overlay:
            self._paste = Overlay(init, overlay_alpha(fitted))
        if not fills(s.masked_content) or self._dry:
            return init
        if getattr(self, "_init_source", None) is not None:
            self._init_source = fill(self._init_source, gray)
        return fill(init, fitted)

    def _fit_masked_area(self, s: Settings, picture: np.ndarray, gray: np.ndarray, tw: int,
                         th: int) -> tuple[np.ndarray, np.ndarray]:
        """``inpaint_area="only masked"`` (:mod:`sdrt.pipelines.onlymasked`): the init image and mask cut to the
        mask's area and fitted to the run's ``tw x th``; the job's ``_paste`` puts its images back."""
        from .images import RESIZE_AND_FILL, binarize
        from .initupscaler import enlarge
        from .maskedcontent import fill, fills
        from .onlymasked import prepare

        h, w = picture.shape[:2]
        if gray.shape != (h, w):
            raise InputError(f"the mask is {gray.shape[1]}x{gray.shape[0]}, the init image {w}x{h}: with "
                             "{@inpaint_area} 'only masked' the mask's area is cut out of the picture", where="mask",
                             fix="give a mask of the init image's size (white = repaint)")
        grow = enlarge(s.init_upscaler, RESIZE_AND_FILL, None if self._dry else self._model_upscaler)
        init, mask, paste = prepare(picture, gray, tw, th, s.inpaint_padding, grow)
        if fills(s.masked_content) and not self._dry:  # the fitted cut-out filled (A1111's order: crop, fit, fill)
            init = fill(init, mask)
        x1, y1, x2, y2 = paste.box
        line = (f"only masked: the init image's {x2 - x1}x{y2 - y1} area at ({x1}, {y1}) (the mask's box and "
                f"{s.inpaint_padding} pixels, in the run's aspect ratio) runs at {tw}x{th}, and is pasted back "
                f"into the {w}x{h} picture")
        if self._dry:
            self._init_fit = line
        else:
            log.info("%s", line)
        self._paste = paste
        s.width, s.height = tw, th
        return init, binarize(mask)

    def _pasted(self, images: list[np.ndarray], paste: Any = None) -> list[np.ndarray]:
        """A run's images put back into its init image (``inpaint_area="only masked"``), else as they are."""
        paste = paste if paste is not None else getattr(self, "_paste", None)
        if paste is None or self._dry:
            return images
        return [paste(image) for image in images]

    def _mask_infotext(self, s: Settings) -> dict[str, object]:
        """The infotext fields of a run with a mask, in A1111's order."""
        from .maskblur import infotext as blur_infotext

        info: dict[str, object] = {}
        info.update(blur_infotext(*s.mask_blur))  # A1111's "Mask blur: 4"
        if s.masked_content != "original":
            info["Masked content"] = s.masked_content  # A1111's field and values (it writes none for "original")
        if s.mask_overlay and s.inpaint_area != "only masked":
            info["Mask overlay"] = True  # sdrt's: A1111 writes none (it always composites)
        if s.inpaint_area == "only masked":
            from .onlymasked import infotext as masked_area

            info.update(masked_area(s.inpaint_padding))
        return info
