"""Base64 images in requests (A1111's ``init_images`` and ``mask``, with or without a ``data:`` prefix),
decoded with Pillow under a pixel limit, and fitted to the requested size as A1111's resize modes do
(``sdrt.pipelines.images``)."""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any

import numpy as np

from .errors import ApiError


def raw_bytes(text: Any, field: str) -> bytes:
    """The bytes of a base64 string (a ``data:`` URL's too); line breaks and spaces, as MIME encoders wrap
    base64, the URL-safe alphabet and missing or extra ``=`` padding are taken. 422/400 naming ``field`` otherwise."""
    if not isinstance(text, str):
        raise ApiError(422, f"{field} must be a base64-encoded PNG or JPEG string", field=field)
    if text.startswith("data:"):
        text = text.split(",", 1)[-1]
    text = "".join(text.split())
    if "-" in text or "_" in text:
        text = text.replace("-", "+").replace("_", "/")
    text = text.rstrip("=")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{field} is not valid base64; send the image file's bytes base64-encoded (a data: "
                            "URL is taken too)", field=field) from None


def decode(text: Any, field: str, max_pixels: int) -> Any:
    """A Pillow image from a base64 string; 422/400 naming ``field`` for anything else."""
    return open_image(raw_bytes(text, field), field, max_pixels)


def open_image(raw: bytes, field: str, max_pixels: int) -> Any:
    """A Pillow image from an image file's bytes (a form upload, or decoded base64); 400 naming ``field``."""
    try:
        from PIL import Image
    except ImportError:
        raise ApiError(501, "reading init images needs Pillow on the server: pip install 'sdrt[serve]'",
                       field=field) from None
    try:
        with warnings.catch_warnings():
            # Pillow's DecompressionBombWarning (two lines in the server's log from 89 million pixels): the limit
            # here is max_pixels, checked from the header before the pixels are decoded
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            # a client's broken EXIF block reads as no rotation, as Pillow does, without its "Corrupt EXIF data"
            # warnings (from the open, the load and the transpose) in the server's log
            warnings.simplefilter("ignore", UserWarning)
            img = Image.open(io.BytesIO(raw))
            w, h = img.size
            if w * h > max_pixels:
                raise ApiError(400, f"{field} is {w}x{h}, above this server's limit of {max_pixels} pixels",
                               field=field)
            img.load()
            from PIL import ImageOps

            img = ImageOps.exif_transpose(img)  # A1111's decode_base64_to_image reads with images.read: fix_image
    except ApiError:
        raise
    except Exception as exc:  # noqa: BLE001 - the client's bytes: Pillow's decoders raise more than OSError and
        # ValueError on broken files (a TIFF whose strip offset is a fraction: TypeError), none of them a server fault
        # what Pillow found, where it says more than its class: "image file is truncated" (a cut upload)
        said = "the image file is truncated (an incomplete upload?)" if "truncated" in str(exc) else type(exc).__name__
        raise ApiError(400, f"{field} is not a readable image ({said})", field=field) from None
    return img


def fit(img: Any, width: int, height: int, mode: int, field: str = "init_images[0]") -> Any:
    """A Pillow image fitted as A1111's resize modes 0 (just resize), 1 (crop and resize) and 2 (resize and fill)
    fit it: ``sdrt.pipelines.images.fit_image``, which the Python API and ``sdrt generate`` use too. A picture
    with transparency is flattened on white first (``rgb_array``); a refusal (a sliver cropped to cover the size)
    is a 400 naming ``field``."""
    from PIL import Image

    from ..errors import SdrtError
    from ..pipelines.images import RESIZE_MODES, fit_image
    from .errors import from_pipeline

    if img.mode not in ("RGB", "L") or "transparency" in img.info:
        img = Image.fromarray(rgb_array(img))
    try:
        return fit_image(img, width, height, RESIZE_MODES[mode], field, field)
    except SdrtError as exc:
        raise ApiError(400, from_pipeline(exc).message, field=field) from None


def rgb_array(img: Any) -> np.ndarray:
    """HxWx3 uint8 as A1111 reads an init image: transparency flattened on white, 16-bit grey levels scaled
    (``sdrt.pipelines.images.pil_rgb``, which the Python API and ``sdrt generate`` use too)."""
    from ..pipelines.images import pil_rgb

    return np.ascontiguousarray(np.asarray(pil_rgb(img), dtype=np.uint8))


def mask_array(img: Any, invert: bool = False, round_alpha: bool = False) -> np.ndarray:
    """HxW uint8, white = repaint, as A1111's ``create_binary_mask`` reads a mask: the alpha channel of an RGBA mask
    with transparency, rounded to 0 or 255 (above 128: 255) unless ``round_alpha`` is off (A1111's ``mask_round``),
    else its grey levels as they are (an opaque RGBA mask's too: its alpha would repaint everything) (``pil_mask``);
    then inverted where asked (``inpainting_mask_invert``). Not blurred: A1111's ``mask_blur`` is the pipeline's
    (sdrt.pipelines.maskblur), and a1111._img2img's where it fits the mask itself."""
    from PIL import ImageOps

    from ..pipelines.images import pil_mask

    gray = pil_mask(img)
    if round_alpha and img.mode == "RGBA" and img.getchannel("A").getextrema() != (255, 255):
        gray = gray.point(lambda x: 255 if x > 128 else 0)
    if invert:
        gray = ImageOps.invert(gray)
    return np.asarray(gray, dtype=np.uint8)


__all__ = ["decode", "fit", "mask_array", "open_image", "raw_bytes", "rgb_array"]
