"""A1111's upscalers and Extras tab: model upscalers in the models folder, ``/sdapi/v1/upscalers``,
``/sdapi/v1/extra-single-image`` and ``/sdapi/v1/extra-batch-images``.

Model upscalers (``sdrt.pipelines.upscaler``: ESRGAN, Real-ESRGAN, SRVGGNetCompact) are the
``.safetensors``/``.pth`` files in ``--models``'s ``ESRGAN/`` and ``RealESRGAN/`` folders (A1111's
``models/ESRGAN`` and ``models/RealESRGAN``), named by their file's stem. They are the hires. fix's
``hr_upscaler`` and the Extras routes' ``upscaler_1``/``upscaler_2``, beside A1111's ``None``, ``Lanczos`` and
``Nearest``. The Extras routes follow A1111's ``postprocessing_upscale``: ``resize_mode`` 0 scales by
``upscaling_resize``, 1 to ``upscaling_resize_w`` x ``upscaling_resize_h`` (centred on a black canvas of that
size with ``upscaling_crop``); an upscaler reaches ``int(side * scale) // 8 * 8`` (the model runs up to 3 times,
then Lanczos); ``upscaler_2`` at ``extras_upscaler_2_visibility`` is blended over the first. Face restoration
(GFPGAN, CodeFormer) is not run and is named in ``html_info``. Upscales run one at a time on the server's backend
and first device, each upscaler compiled once and kept (two at most).
"""

from __future__ import annotations

import base64
import collections
import logging
import threading
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from .errors import ApiError
from .fields import get_bool, get_float, get_int, get_str

log = logging.getLogger("sdrt.serve.extras")

#: the models folder's subfolders holding model upscalers (A1111's)
FOLDERS = ("ESRGAN", "RealESRGAN")
#: A1111's non-model upscalers: "None" resizes with Lanczos to the size asked
PLAIN = {"None": "LANCZOS", "Lanczos": "LANCZOS", "Nearest": "NEAREST"}
MAX_BATCH = 16

_lock = threading.Lock()
_arch: dict[tuple[str, float], tuple[int, str] | None] = {}
_loaded: collections.OrderedDict[tuple[str, str, str | None], Any] = collections.OrderedDict()


def model_upscalers(models_dir: Path | None) -> dict[str, Path]:
    """``{name: file}`` of the model upscalers in ``models_dir``'s ``ESRGAN/`` and ``RealESRGAN/``."""
    if models_dir is None:
        return {}
    from ..pipelines.upscaler import find_models

    return find_models(*(Path(models_dir) / f for f in FOLDERS))


def runnable(models_dir: Path | None) -> list[str]:
    """The names of the model upscalers in ``models_dir`` that sdrt can run."""
    return [name for name, path in model_upscalers(models_dir).items() if _described(path) is not None]


def _described(path: Path) -> tuple[int, str] | None:
    """(scale, architecture) of an upscaler file, cached by path and mtime; None when sdrt cannot run it."""
    try:
        key = (str(path), path.stat().st_mtime)
    except OSError:
        return None
    with _lock:
        if key in _arch:
            return _arch[key]
    from ..errors import SdrtError
    from ..pipelines.upscaler import detect
    from ..weights import Weights

    try:
        arch = detect(Weights.open(path).shapes(), str(path))
        found: tuple[int, str] | None = (arch.scale, arch.describe())
    except (SdrtError, OSError, ValueError) as exc:
        log.warning("%s is listed as no upscaler: %s", path.name, getattr(exc, "what", exc))
        found = None
    with _lock:
        _arch[key] = found
    return found


def listing(models_dir: Path | None) -> list[dict[str, Any]]:
    """A1111's ``/sdapi/v1/upscalers``: the plain ones, then every model upscaler sdrt can run."""
    out = [{"name": name, "model_name": None, "model_path": None, "model_url": None, "scale": 4}
           for name in PLAIN]
    for name, path in model_upscalers(models_dir).items():
        found = _described(path)
        if found is not None:
            out.append({"name": name, "model_name": found[1], "model_path": f"{path.parent.name}/{path.name}",
                        "model_url": None, "scale": found[0]})
    return out


def resolve(name: str, models_dir: Path | None) -> Path | None:
    """The file of a model upscaler named ``name`` (case-insensitive) that sdrt can run, or None."""
    models = model_upscalers(models_dir)
    path = models.get(name) or {k.casefold(): v for k, v in models.items()}.get(name.casefold())
    return path if path is not None and _described(path) is not None else None


def _upscaler(path: Path, backend: str, device: str | None, precision: str | None = None) -> Any:
    from ..pipelines.upscaler import ModelUpscaler

    key = (str(path), backend, device, precision)
    with _lock:
        up = _loaded.get(key)
        if up is not None:
            _loaded.move_to_end(key)
            return up
    up = ModelUpscaler(path, backend=backend, device=device, options={"precision": precision} if precision else None)
    with _lock:
        _loaded[key] = up
        while len(_loaded) > 2:
            _loaded.popitem(last=False)
    return up


_run_lock = threading.Lock()


def _upscale(img: Any, name: str, scale: float, path: Path | None, backend: str, device: str | None,
             precision: str | None = None) -> Any:
    """A1111's ``Upscaler.upscale``: to ``int(side * scale) // 8 * 8``, the model up to 3 times, then Lanczos."""
    import numpy as np
    from PIL import Image

    dest_w, dest_h = int(img.width * scale) // 8 * 8, int(img.height * scale) // 8 * 8
    dest_w, dest_h = max(dest_w, 8), max(dest_h, 8)
    if path is None:
        return img.resize((dest_w, dest_h), resample=getattr(Image.Resampling, PLAIN[name]))
    with _run_lock:
        up = _upscaler(path, backend, device, precision)
        out = up.upscale_to(np.asarray(img.convert("RGB")), dest_w, dest_h)
    return Image.fromarray(out)


def _which(body: dict[str, Any], key: str, models_dir: Path | None) -> tuple[str, Path | None]:
    value = get_str(body, key, "None", max_len=500)
    if value in (None, ""):
        value = "None"
    plain = {k.casefold(): k for k in PLAIN}
    if value.casefold() in plain:
        return plain[value.casefold()], None
    path = resolve(value, models_dir)
    if path is None:
        known = [u["name"] for u in listing(models_dir)]
        raise ApiError(400, f"{key}: unknown upscaler {value!r}; this server has {', '.join(known)} (model upscalers "
                            f"go in the models folder's {' or '.join(f + '/' for f in FOLDERS)})", field=key)
    return path.stem, path


def _process(body: dict[str, Any], images: list[Any], models_dir: Path | None, backend: str,
             device: str | None, max_side: int, precision: str | None = None) -> tuple[list[Any], str]:
    """A1111's extras on Pillow images: (the results, html_info)."""
    from PIL import Image

    mode = get_int(body, "resize_mode", 0, 0, 1, fixed=True)
    factor = get_float(body, "upscaling_resize", 2.0, 1.0, 8.0)
    tw = get_int(body, "upscaling_resize_w", 512, 1, max_side)
    th = get_int(body, "upscaling_resize_h", 512, 1, max_side)
    crop = get_bool(body, "upscaling_crop", True)
    name1, path1 = _which(body, "upscaler_1", models_dir)
    name2, path2 = _which(body, "upscaler_2", models_dir)
    vis2 = get_float(body, "extras_upscaler_2_visibility", 0.0, 0.0, 1.0)
    notes = []
    for key in ("gfpgan_visibility", "codeformer_visibility"):
        if get_float(body, key, 0.0, 0.0, 1.0):
            notes.append(f"{key}: sdrt has no face restoration models (GFPGAN, CodeFormer); none ran")
    if get_bool(body, "upscale_first", False):
        notes.append("upscale_first: no face restoration ran, so the order is moot")
    out = []
    for img in images:
        img = img.convert("RGB")
        scale = factor if mode == 0 else max(tw / img.width, th / img.height)
        if int(img.width * scale) // 8 * 8 > max_side or int(img.height * scale) // 8 * 8 > max_side:
            # the field that set the scale: resize_mode 1 scales to upscaling_resize_w x upscaling_resize_h (512 each
            # when unset), and its 400 named upscaling_resize, which that mode does not read
            field = "upscaling_resize" if mode == 0 else \
                "upscaling_resize_w" if tw / img.width >= th / img.height else "upscaling_resize_h"
            how = f"by {scale:g}" if mode == 0 else f"to cover {tw}x{th} (upscaling_resize_w x upscaling_resize_h)"
            raise ApiError(400, f"{field}: upscaling {img.width}x{img.height} {how} is above this server's limit of "
                                f"{max_side} pixels a side", field=field)
        first = _upscale(img, name1, scale, path1, backend, device, precision)
        if name2 != "None" and vis2 > 0:
            second = _upscale(img, name2, scale, path2, backend, device, precision)
            if second.size != first.size:
                second = second.resize(first.size, resample=Image.Resampling.LANCZOS)
            first = Image.blend(first, second, vis2)
        if mode == 1 and crop:
            canvas = Image.new("RGB", (tw, th))
            canvas.paste(first, box=(tw // 2 - first.width // 2, th // 2 - first.height // 2))
            first = canvas
        out.append(first)
    info = [f"Postprocess upscale {'by' if mode == 0 else 'to'}: "
            f"{f'{factor:g}' if mode == 0 else f'{tw}x{th}'}", f"Postprocess upscaler: {name1}"]
    if name2 != "None" and vis2 > 0:
        info.append(f"Postprocess upscaler 2: {name2}, visibility {vis2:g}")
    text = ", ".join(info)
    if notes:
        text += "<br>sdrt did not honour: " + "; ".join(notes)
    return out, text


def _public(work: Any) -> Any:
    """``work()``, its sdrt errors as API errors (a model the server cannot run is the server's: 500)."""
    from ..errors import InputError, SdrtError

    try:
        return work()
    except SdrtError as exc:
        raise ApiError(400 if isinstance(exc, InputError) else 500, str(exc)) from None


def realesrgan_models(models_dir: Path | None) -> list[dict[str, Any]]:
    """A1111's ``/sdapi/v1/realesrgan-models``: the model upscalers in ``RealESRGAN/``."""
    if models_dir is None:
        return []
    from ..pipelines.upscaler import find_models

    out = []
    for name, path in find_models(Path(models_dir) / "RealESRGAN").items():
        found = _described(path)
        if found is not None:
            out.append({"name": name, "path": f"RealESRGAN/{path.name}", "scale": found[0]})
    return out


async def realesrgan(request: Request) -> JSONResponse:
    st = request.app.state.sdrt
    return JSONResponse(await run_in_threadpool(realesrgan_models, st.registry.models_dir))


def _b64png(img: Any) -> str:
    import numpy as np

    from ..pipelines.png import encode_png

    return base64.b64encode(encode_png(np.asarray(img.convert("RGB")))).decode("ascii")


async def upscalers(request: Request) -> JSONResponse:
    st = request.app.state.sdrt
    return JSONResponse(await run_in_threadpool(listing, st.registry.models_dir))


def _config(st: Any) -> tuple[Path | None, str, str | None, int, int, str | None]:
    limits = st.limits
    side = max(limits.max_width, limits.max_height)
    return st.registry.models_dir, st.config.backend, st.config.devices[0], side, side * side, st.config.precision


async def extra_single_image(request: Request) -> JSONResponse:
    from . import b64images
    from .http import read_json

    st = request.app.state.sdrt
    body = await read_json(request, st.limits.max_body_bytes)
    if not isinstance(body, dict):
        raise ApiError(422, "the body must be a JSON object with image (a base64 PNG or JPEG)")
    models, backend, device, side, pixels, precision = _config(st)

    def work() -> dict[str, Any]:
        img = b64images.decode(body.get("image"), "image", pixels)
        out, info = _process(body, [img], models, backend, device, side * 2, precision)
        return {"html_info": info, "image": _b64png(out[0])}

    return JSONResponse(await run_in_threadpool(_public, work))


async def extra_batch_images(request: Request) -> JSONResponse:
    from . import b64images
    from .http import read_json

    st = request.app.state.sdrt
    body = await read_json(request, st.limits.max_body_bytes)
    if not isinstance(body, dict):
        raise ApiError(422, "the body must be a JSON object with imageList (a list of {data, name})")
    items = body.get("imageList")
    if not isinstance(items, list) or not items:
        raise ApiError(422, "imageList must be a non-empty list of {\"data\": base64 image, \"name\": ...}",
                       field="imageList")
    if len(items) > MAX_BATCH:
        raise ApiError(400, f"imageList has {len(items)} images, above this server's limit of {MAX_BATCH}",
                       field="imageList")
    models, backend, device, side, pixels, precision = _config(st)

    def work() -> dict[str, Any]:
        images = []
        for i, item in enumerate(items):
            data = item.get("data") if isinstance(item, dict) else None
            images.append(b64images.decode(data, f"imageList[{i}].data", pixels))
        out, info = _process(body, images, models, backend, device, side * 2, precision)
        return {"html_info": info, "images": [_b64png(im) for im in out]}

    return JSONResponse(await run_in_threadpool(_public, work))


__all__ = ["FOLDERS", "extra_batch_images", "extra_single_image", "listing", "model_upscalers", "realesrgan",
           "resolve", "runnable", "upscalers"]
