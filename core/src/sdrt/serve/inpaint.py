"""A1111's img2img mask fields (``mask``, ``mask_blur``, ``inpainting_fill``, ``inpaint_full_res``, ...) for
:mod:`sdrt.serve.a1111`: the mask read and blurred as A1111 reads and blurs it, and "Inpaint area: Only masked"
handed to the pipeline's ``inpaint_area="only masked"`` (sdrt.pipelines.onlymasked)."""

from __future__ import annotations

from typing import Any

from ..pipelines.images import JUST_RESIZE
from ..pipelines.maskedcontent import A1111_FILL
from . import b64images
from .errors import from_pipeline
from .fields import get_bool, get_float, get_int


def denoising_strength(body: dict[str, Any]) -> float:
    """A1111's ``denoising_strength`` (0.75): the img2img run's ``strength``."""
    return get_float(body, "denoising_strength", 0.75, 0.0, 1.0, low_open=True)


def masked_content(body: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """A1111's ``inpainting_fill`` (1, original): 0, 2 and 3 are the pipeline's ``masked_content``."""
    fill = get_int(body, "inpainting_fill", 1, 0, 3, fixed=True)
    if fill != 1:
        kwargs["masked_content"] = A1111_FILL[fill]


def blur_of(body: dict[str, Any]) -> tuple[int, int]:
    """A1111's mask blur: ``mask_blur`` sets both directions, else ``mask_blur_x`` and ``mask_blur_y`` (4 each)."""
    blur = get_int(body, "mask_blur", None, 0, 64)
    if blur is not None:
        return blur, blur
    return get_int(body, "mask_blur_x", 4, 0, 64), get_int(body, "mask_blur_y", 4, 0, 64)


def blurred(gray: Any, blur: tuple[int, int]) -> Any:
    """``gray`` blurred as A1111 blurs a mask (sdrt.pipelines.maskblur, the pipeline's mask_blur)."""
    from ..pipelines.maskblur import blur as mask_blur

    return mask_blur(gray, *blur)


def read_mask(body: dict[str, Any], mask: Any, max_pixels: int, not_honoured: list[str]) -> Any:
    """The request's mask, HxW uint8 at its own size, as A1111's create_binary_mask reads it (an alpha mask rounded
    unless mask_round is false), then inverted (inpainting_mask_invert); not yet blurred."""
    m = b64images.decode(mask, "mask", max_pixels)
    invert = get_int(body, "inpainting_mask_invert", 0, 0, 1, fixed=True) == 1
    round_alpha = get_bool(body, "mask_round", True)
    if not round_alpha:
        not_honoured.append("mask_round: false keeps an alpha mask's levels, but the run's latent mask is still "
                            "rounded (sdrt's pipeline binarizes it)")
    return b64images.mask_array(m, invert, round_alpha)


def only_masked(body: dict[str, Any], kwargs: dict[str, Any], img: Any, picture: Any, gray: Any,
                 blur: tuple[int, int], upscaler: str | None) -> Any:
    """A1111's "Inpaint area: Only masked" (``inpaint_full_res``, ``inpaint_full_res_padding``): the pipeline's
    ``inpaint_area="only masked"`` (sdrt.pipelines.onlymasked) on the picture at its own size and the mask, blurred
    by the pipeline's ``mask_blur`` (a mask of another size is blurred here and stretched to the picture's): the
    blurred mask's box cut out, fitted with Resize and Fill (resize_mode does not apply, as in A1111), run at
    width x height and pasted back with the blurred mask. inpainting_fill 0, 2 and 3 are the pipeline's
    masked_content, which fills the fitted cut-out, as A1111 fills it."""
    kwargs["strength"] = denoising_strength(body)
    padding = get_int(body, "inpaint_full_res_padding", 32, 0, 4096)
    if gray.shape != picture.shape[:2]:
        gray, blur = fit(blurred(gray, blur), picture.shape[1], picture.shape[0], JUST_RESIZE, "mask"), (0, 0)
    kwargs["init_image"], kwargs["mask"] = picture, gray
    if blur != (0, 0):
        kwargs["mask_blur"] = blur
    if upscaler is not None:  # the pipeline enlarges the cut-out with it (A1111's resize_image(2, ...) does)
        kwargs["init_upscaler"] = upscaler
    kwargs["inpaint_area"], kwargs["inpaint_padding"] = "only masked", padding
    masked_content(body, kwargs)
    return img


def fit(image: Any, width: int, height: int, mode: str, field: str) -> Any:
    """``sdrt.pipelines.images.fit_array``, its refusal (a sliver cropped and resized) a 400 naming ``field``."""
    from ..errors import SdrtError
    from ..pipelines.images import fit_array

    try:
        return fit_array(image, width, height, mode, "init image" if field != "mask" else "mask", field)
    except SdrtError as exc:
        raise from_pipeline(exc) from None
