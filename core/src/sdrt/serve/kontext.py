"""Forge's FLUX.1 Kontext extension on sdrt's reference images: ``alwayson_scripts["Forge FluxKontext"]``.

A1111's API has no Kontext field; Forge users run Kontext through the ``forge2_flux_kontext`` extension
(DenOfEquity), whose script ``Forge FluxKontext`` takes positional ``args``:
``[enabled, image1, image2, sizing, reduce]`` (images as base64, ``null`` or ``""`` for none; ``sizing`` one of
``"no change"``, ``"to output"``, ``"to BFL recommended"`` (its default); ``reduce``: half width and height).
The extension sizes each image itself (Lanczos, centre crop) before encoding it; so does this module (A1111's
crop-and-resize, ``b64images.fit`` mode 1), and the pipeline then gets ``reference_resize=False``.
"""

from __future__ import annotations

from typing import Any

from .errors import ApiError
from .fields import get_bool

TITLE = "forge fluxkontext"
SIZINGS = ("no change", "to output", "to BFL recommended")


def is_title(name: Any) -> bool:
    return str(name).strip().casefold() == TITLE


def references(body: dict[str, Any], kwargs: dict[str, Any], max_pixels: int, not_honoured: list[str],
               max_size: tuple[int, int] | None = None) -> dict[str, str]:
    """Put the request's Kontext images into ``kwargs`` (``reference_images``, ``reference_resize=False``);
    returns ``{pipeline argument: request field}`` for the errors. ``max_pixels``: the most a picture may decode to;
    ``max_size``: the server's largest image (width, height), whose area a sized picture may not pass (its tokens
    ride along in every transformer call, as the image's own do)."""
    from ..pipelines.reference import nearest_preferred
    from . import b64images

    scripts = body.get("alwayson_scripts")
    if not isinstance(scripts, dict):
        return {}
    key = next((str(k) for k in scripts if is_title(k)), None)
    if key is None:
        return {}
    value = scripts[key]
    where = f"alwayson_scripts.{key}.args"
    args = value.get("args", []) if isinstance(value, dict) else None
    if not isinstance(args, list):
        raise ApiError(422, f"alwayson_scripts.{key} must be an object with args: [enabled, image1, image2, sizing, "
                            "reduce]", field=f"alwayson_scripts.{key}")
    args = [*args, None, None, None, None, None][:5]
    holder = {f"{where}[0]": args[0], f"{where}[4]": args[4]}  # enabled, reduce: named by position in errors
    if not get_bool(holder, f"{where}[0]", False):
        return {}
    sizing = args[3] if args[3] is not None else "to BFL recommended"
    if sizing not in SIZINGS:
        raise ApiError(422, f"{where}[3] (sizing) must be one of {', '.join(map(repr, SIZINGS))}, got {sizing!r:.60}",
                       field=f"{where}[3]")
    reduce = get_bool(holder, f"{where}[4]", False)
    images, fields = [], {}
    for i in (1, 2):
        if args[i] is None or args[i] == "":
            continue
        img = b64images.decode(args[i], f"{where}[{i}]", max_pixels)
        w, h = img.width, img.height
        if sizing == "to BFL recommended":  # the extension's (ComfyUI's) rule: the raw sides' aspect ratio
            w, h = nearest_preferred(w / h)
        elif sizing == "to output":
            if kwargs.get("width") and kwargs.get("height"):
                w, h = kwargs["width"], kwargs["height"]
            else:
                not_honoured.append(f"{where}[3]: 'to output' without width and height keeps the image's size")
        if reduce:
            w, h = w // 2, h // 2
        if w < 16 or h < 16:
            raise ApiError(400, f"{where}[{i}] is {img.width}x{img.height} and comes to {w}x{h}, under the 16x16 a "
                                "reference needs", field=f"{where}[{i}]")
        if max_size is not None and w * h > max_size[0] * max_size[1]:
            raise ApiError(400, f"{where}[{i}] is {img.width}x{img.height} and comes to {w}x{h}, more pixels than this "
                                f"server's largest image ({max_size[0]}x{max_size[1]}); send a smaller picture, or use "
                                f"the sizing 'to BFL recommended' or reduce ({where}[4])", field=f"{where}[{i}]")
        images.append(b64images.rgb_array(b64images.fit(img, w, h, 1, f"{where}[{i}]")))
        fields.setdefault("reference_images", f"{where}[{i}]")
    if images:
        kwargs["reference_images"] = images
        kwargs["reference_resize"] = False
    return fields
