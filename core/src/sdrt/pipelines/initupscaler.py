"""``init_upscaler`` (A1111's ``upscaler_for_img2img``): what enlarges an init image that grows to the run's size.

- ``parse(value)``: the setting checked, as ``(name, model file or None)`` or None (a Lanczos resize, A1111's
  default): ``"Lanczos"``, ``"Nearest"``, or a model upscaler as ``hires_upscaler`` takes one
  (:mod:`sdrt.pipelines.hires`: a path, or a name in ``$SDRT_UPSCALERS``).
- ``enlarge(upscaler, mode, model_upscaler)``: that upscaler as the ``enlarge`` step of
  :func:`sdrt.pipelines.images.fit_image`, which fits the init image.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["enlarge", "parse"]


def parse(value: object) -> tuple[str, Path | None] | None:
    """``init_upscaler`` (A1111's ``upscaler_for_img2img``): ``(name, model file or None)`` of the upscaler that
    enlarges an init image; None or ``"None"``: none (a Lanczos resize, A1111's default). ``"Lanczos"``,
    ``"Nearest"`` (any case), or a model upscaler as ``hires_upscaler`` takes one (a path, or a name in
    ``$SDRT_UPSCALERS``)."""
    from .hires import IMAGE_MODES, model_upscaler, models_hint

    if value is None or (isinstance(value, str) and value.strip().casefold() in ("", "none")):
        return None
    if isinstance(value, Path):
        value = str(value)
    plain = {u.casefold(): u for u in IMAGE_MODES}
    if isinstance(value, str) and value.strip().casefold() in plain:
        return plain[value.strip().casefold()], None
    model = model_upscaler(value)  # a file that is no upscaler fails now, before any model loads
    if model is None:
        raise InputError(f"unknown init upscaler {str(value)[:60]!r}", where="init_upscaler",
                         fix=f"use 'Lanczos' or 'Nearest'{models_hint()} (None: a Lanczos resize)")
    return model.stem, model


def enlarge(upscaler: tuple[str, Path | None] | None, mode: str,
            model_upscaler: Callable[[Path], Any] | None) -> Any:
    """``upscaler`` (:func:`parse`'s) as :func:`sdrt.pipelines.images.fit_image`'s ``enlarge``, or None (a Lanczos
    resize; the latent upscale ``mode`` resizes latents, not pixels). ``model_upscaler(path)``: the pipeline's
    model upscaler for a file; None for the plan, which takes the sizes alone (no model compiled or run)."""
    from .images import LATENT_UPSCALE, plain_upscale, upscaler_enlarge

    if upscaler is None or mode == LATENT_UPSCALE:
        return None
    name, path = upscaler
    if path is None:
        return upscaler_enlarge(plain_upscale(name))
    if model_upscaler is None:  # the plan: the sizes alone, no model compiled or run
        return upscaler_enlarge(plain_upscale("Lanczos"))
    up = model_upscaler(path)

    def step(img: Any, scale: float) -> Any:  # an ESRGAN-family model: by its own factor, in tiles
        from PIL import Image

        return Image.fromarray(up.upscale(np.asarray(img.convert("RGB"))))

    return upscaler_enlarge(step)
