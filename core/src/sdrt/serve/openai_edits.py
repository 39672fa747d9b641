"""OpenAI's ``POST /v1/images/edits``: the edit of one picture, run as A1111's img2img (``sdrt.serve.a1111``).

The body is ``multipart/form-data``, as OpenAI's SDKs and Open WebUI's "openai" edit engine send it (an
``image`` or ``image[]`` file, a ``mask`` file, text fields), or JSON (``image``: a base64 string or a
``data:`` URL; or ``images: [{"image_url": ...}]``, and ``mask`` as a string or ``{"image_url": ...}``).

- Fields: ``prompt`` (required), ``model``, ``n``, ``size`` (``WxH``; unset or ``auto``: the picture's own,
  rounded down to a multiple of 8), ``response_format``, ``output_format`` (png); beyond OpenAI's:
  ``negative_prompt``, ``steps``, ``seed``, ``cfg_scale``, ``sampler_name`` and ``strength`` (how far the picture
  may move: 0.75 when the whole picture is redrawn, 1.0 inside a mask). OpenAI's fields that Stable Diffusion
  has no use for (``quality``, ``background``, ...) are named under ``sdrt_not_honoured``; any other is a 400.
- **What is redrawn.** A ``mask`` is a PNG with an alpha channel, the picture's size, whose fully transparent
  pixels mark what to repaint, as OpenAI takes it. With no mask, a picture that has fully transparent pixels is
  its own mask (DALL-E 2's rule). Otherwise the whole picture is redrawn at ``strength``.
- **One picture.** OpenAI's newer models combine several; Stable Diffusion edits one, so a second is a 400.
- **No URLs.** The server opens no connection: an ``http(s)://`` image is a 400 asking for the bytes.
"""

from __future__ import annotations

import base64
import io
import re
from typing import Any

from starlette.datastructures import Headers

from . import a1111, b64images
from .errors import ApiError
from .fields import get_float, get_grid_size, get_str, size_words
from .http import parse_json, read_body
from .state import ServerState

#: OpenAI's edit fields that Stable Diffusion has no use for: accepted, and listed under sdrt_not_honoured
NOT_HONOURED = ("quality", "background", "user", "input_fidelity", "moderation", "output_compression",
                "partial_images")
_IMAGES = ("image", "image[]", "images")
_KNOWN = frozenset(("prompt", "model", "n", "size", "response_format", "output_format", "stream", "negative_prompt",
                    "steps", "seed", "cfg_scale", "sampler_name", "strength", "mask", *_IMAGES, *NOT_HONOURED))
#: A1111's img2img fields -> the edit request's, for the messages of the checks the img2img parser makes
_RENAMED = {"init_images[0]": "image", "init_images": "image", "denoising_strength": "strength", "batch_size": "n",
            "width": "size", "height": "size", "override_settings.sd_model_checkpoint": "model"}


class Upload:
    """A file part of a multipart body: its bytes and the name the client gave it."""

    def __init__(self, data: bytes, filename: str | None) -> None:
        self.data, self.filename = data, filename


async def read_edit(request: Any, max_bytes: int) -> dict[str, Any]:
    """The request's fields: a multipart form's (files as ``Upload``, the picture's as a list under ``image``), or
    the JSON object's. 413 over ``max_bytes``, 400 for a body that cannot be read."""
    raw = await read_body(request, max_bytes)
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise ApiError(422, f"the request body must be a JSON object or a multipart form, got "
                                f"{type(body).__name__}")
        return body
    return await _form(request.headers, raw)


async def _form(headers: Headers, raw: bytes) -> dict[str, Any]:
    try:
        from starlette.datastructures import UploadFile
        from starlette.formparsers import MultiPartException, MultiPartParser
    except ImportError:  # pragma: no cover - starlette is what serves this route
        raise ApiError(501, "reading forms needs starlette's form parser") from None

    async def stream() -> Any:
        yield raw

    try:
        # a field's size: starlette's own bound (1 MiB since 0.40; max_part_size is an argument only from 0.44,
        # and serve takes starlette>=0.37), inside the body's (read_body)
        form = await MultiPartParser(headers, stream(), max_files=8, max_fields=64).parse()
    except AssertionError:  # starlette asserts that python-multipart is installed
        raise ApiError(501, "reading multipart forms needs python-multipart on the server: "
                            "pip install 'sdrt[serve]'") from None
    except MultiPartException as exc:
        raise ApiError(400, f"the multipart form cannot be read ({exc.message})") from None
    body: dict[str, Any] = {}
    try:
        for key, value in form.multi_items():
            item: Any = value
            if isinstance(value, UploadFile):
                item = Upload(await value.read(), value.filename)
            if key in _IMAGES:
                body.setdefault("image", []).append(item)
            elif key in body:
                raise ApiError(400, f"{key} is given twice in the form", field=key)
            else:
                body[key] = item
    finally:
        await form.close()
    return body


def _image_bytes(value: Any, field: str) -> bytes:
    """The bytes of one picture: a form file, a base64 string or data: URL, or ``{"image_url": ...}``."""
    if isinstance(value, Upload):
        return value.data
    if isinstance(value, dict):
        if "file_id" in value:
            raise ApiError(400, f"{field}: file_id refers to OpenAI's file store, which this server does not have; "
                                "send the picture itself (a file, or base64 in image_url)", field=field)
        value = value.get("image_url")
        if isinstance(value, dict):  # {"image_url": {"url": ...}}, as the chat API nests it
            value = value.get("url")
    if isinstance(value, str) and re.match(r"^\s*https?://", value, re.IGNORECASE):
        raise ApiError(400, f"{field} is a URL; this server fetches nothing: send the picture's bytes (a file, or "
                            "base64)", field=field)
    return b64images.raw_bytes(value, field)


def _pictures(body: dict[str, Any]) -> list[Any]:
    items: list[Any] = []
    for key in ("image", "image[]"):  # a form's image[] parts are gathered under image; JSON may send either
        value = body.get(key)
        items += list(value) if isinstance(value, list) else [] if value is None else [value]
    images = body.get("images")
    if images is not None:
        if not isinstance(images, list):
            raise ApiError(422, "images must be a list of {\"image_url\": ...}", field="images")
        items += images
    return items


def _repaint_mask(img: Any, mask: Any) -> Any:
    """The mask as A1111's img2img reads it (white = repaint, an L image), from OpenAI's (transparent = repaint):
    the ``mask`` given, else the picture's own transparent pixels; None when nothing is transparent."""
    source = mask if mask is not None else img
    if source.mode in ("PA", "LA") or ("transparency" in source.info and source.mode in ("P", "L", "RGB")):
        source = source.convert("RGBA")  # a palette or grey PNG's transparency, as the picture's own alpha
    if "A" not in source.getbands():
        if mask is not None:
            raise ApiError(400, f"mask is a {source.mode} image with no alpha channel; send a PNG with one, its fully "
                                "transparent pixels marking what to edit (as OpenAI's API takes it)", field="mask")
        return None
    alpha = source.getchannel("A")
    if mask is None and alpha.getextrema()[0] > 0:
        return None
    if mask is not None and mask.size != img.size:
        raise ApiError(400, f"mask is {mask.width}x{mask.height} and image {img.width}x{img.height}; they must be "
                            "the same size", field="mask")
    return alpha.point(lambda a: 255 if a == 0 else 0)


def _png_b64(img: Any) -> str:
    out = io.BytesIO()
    img.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode("ascii")


def parse(body: dict[str, Any], st: ServerState) -> tuple[a1111.Request, list[str], str]:
    """An edit request as A1111's img2img: (the checked request, what is not honoured, the response format)."""
    limits = st.limits
    unknown = sorted(k for k in body if k not in _KNOWN)
    if unknown:  # as OpenAI answers an unrecognized argument; dropping it would hide a typo
        raise ApiError(400, f"unrecognized request argument {unknown[0][:100]!r}; this route takes "
                            f"{', '.join(sorted(_KNOWN - {'image[]'}))}", field=unknown[0][:100])
    files = sorted(k for k, v in body.items() if isinstance(v, Upload) and k not in (*_IMAGES, "mask"))
    if files:  # a form's text field sent as a file: its message showed the object ("<...Upload object at 0x...>")
        raise ApiError(422, f"{files[0]} must be a text field of the form, got a file", field=files[0])
    if body.get("prompt") is None:
        raise ApiError(400, "prompt is required: what the edited picture should show", field="prompt")
    if body.get("stream") not in (None, False, "false"):
        raise ApiError(400, "stream is not supported: this server answers with the finished images", field="stream")
    pictures = _pictures(body)
    if not pictures:
        raise ApiError(400, "image is required: the picture to edit (a PNG, JPEG or WebP file)", field="image")
    if len(pictures) > 1:
        raise ApiError(400, f"{len(pictures)} images were given; Stable Diffusion edits one picture: send one",
                       field="image")
    max_pixels = limits.max_width * limits.max_height * 4
    raw = _image_bytes(pictures[0], "image")
    img = b64images.open_image(raw, "image", max_pixels)
    mask_in = body.get("mask")
    mask = None if mask_in in (None, "") else b64images.open_image(_image_bytes(mask_in, "mask"), "mask", max_pixels)
    repaint = _repaint_mask(img, mask)
    fmt = get_str(body, "response_format", "b64_json", max_len=40)
    if fmt not in ("b64_json", "url"):
        raise ApiError(400, f"response_format must be b64_json or url, got {fmt!r}", field="response_format")
    if get_str(body, "output_format", "png", max_len=40) != "png":
        raise ApiError(400, f"output_format {body['output_format']!r} is not supported; this server writes png",
                       field="output_format")
    width, height = get_grid_size(body, limits)
    strength = get_float(body, "strength", 1.0 if repaint is not None else 0.75, 0.0, 1.0, low_open=True)
    name = get_str(body, "model", None, max_len=300)
    model = st.registry.model(name, "model") if name else None
    img2img: dict[str, Any] = {
        key: body[key] for key in ("prompt", "negative_prompt", "steps", "seed", "cfg_scale", "sampler_name")
        if body.get(key) is not None}
    img2img.update(init_images=[base64.b64encode(raw).decode("ascii")], batch_size=body.get("n", 1),
                   denoising_strength=strength, resize_mode=0, width=width, height=height)
    if model is not None:
        img2img["override_settings"] = {"sd_model_checkpoint": model.title}
    if repaint is not None:
        img2img.update(mask=_png_b64(repaint), mask_blur=0, inpainting_fill=1)
    try:
        req = a1111.parse(img2img, "img2img", st.registry, limits, st.options())
    except ApiError as exc:
        raise renamed(exc) from None
    ignored = [f"{k}: not used by Stable Diffusion models" for k in NOT_HONOURED if body.get(k) is not None]
    return req, ignored + req.not_honoured, fmt


def renamed(exc: ApiError) -> ApiError:
    """An error of the img2img checks, in the edit request's words (``denoising_strength`` -> ``strength``...)."""
    field = _RENAMED.get(exc.field or "", exc.field)
    message = size_words(exc.message)  # width and height are one field here
    for old, new in _RENAMED.items():
        message = re.sub(rf"(?<![\w.\[]){re.escape(old)}(?![\w\[])", new, message)
    return ApiError(exc.status, message, field=field)


__all__ = ["NOT_HONOURED", "Upload", "parse", "read_edit", "renamed"]
