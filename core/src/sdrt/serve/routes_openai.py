"""OpenAI's images API: ``POST /v1/images/generations``, ``POST /v1/images/edits`` (``openai_edits``) and
``GET /v1/models``.

Fields: ``prompt`` (required), ``model`` (a model of this server; empty: the current one), ``n``,
``size`` (``"WxH"`` or ``"auto"``), ``response_format`` (``b64_json``, the default here; ``url``
gives a ``data:image/png;base64,`` URL: the server keeps no files). ``quality``, ``style``,
``user``, ``background``, ``moderation``, ``output_compression`` and ``partial_images`` are accepted
and named under ``sdrt_not_honoured`` (an extra top-level key, which OpenAI's clients read past).
Beyond OpenAI: ``negative_prompt``, ``steps``, ``seed``, ``cfg_scale``, ``sampler_name``. Any other
field is a 400 naming it, as OpenAI's own API answers an unrecognized argument.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import a1111, openai_edits, responses
from .errors import ApiError
from .fields import get_grid_size, get_str, size_words
from .http import read_json, wait_for_job
from .jobs import Work
from .state import ServerState

#: OpenAI's fields that Stable Diffusion has no use for: accepted, and listed under sdrt_not_honoured
_NOT_HONOURED = ("quality", "style", "user", "background", "moderation", "output_compression", "partial_images")
_KNOWN = frozenset(("prompt", "model", "n", "size", "response_format", "output_format", "stream", "negative_prompt",
                    "steps", "seed", "cfg_scale", "sampler_name", *_NOT_HONOURED))


def parse(body: Any, st: ServerState) -> tuple[Work, list[str], str]:
    """A generations request as A1111's txt2img (``sdrt.serve.a1111``), so that the server's options (``sd_vae``,
    ``CLIP_stop_at_last_layers``, ``randn_source``, ...) hold here as on ``/sdapi/v1/txt2img`` and on
    ``/v1/images/edits``: (the work, what is not honoured, the response format)."""
    limits = st.limits
    if not isinstance(body, dict):
        raise ApiError(422, f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(k for k in body if k not in _KNOWN)
    if unknown:  # OpenAI answers 400 "Unrecognized request argument supplied"; dropping it would hide a typo
        raise ApiError(400, f"unrecognized request argument {unknown[0][:100]!r}; this route takes "
                            f"{', '.join(sorted(_KNOWN))}", field=unknown[0][:100])
    if body.get("prompt") is None:
        raise ApiError(400, "prompt is required", field="prompt")
    if body.get("stream") not in (None, False):
        raise ApiError(400, "stream is not supported: this server answers with the finished images",
                       field="stream")
    fmt = get_str(body, "response_format", "b64_json", max_len=40)
    if fmt not in ("b64_json", "url"):
        raise ApiError(400, f"response_format must be b64_json or url, got {fmt!r}", field="response_format")
    output = get_str(body, "output_format", "png", max_len=40)
    if output != "png":
        raise ApiError(400, f"output_format {output!r} is not supported; this server writes png", field="output_format")
    width, height = get_grid_size(body, limits)
    name = get_str(body, "model", None, max_len=300)
    model = st.registry.model(name, "model") if name else None
    txt2img: dict[str, Any] = {
        key: body[key] for key in ("prompt", "negative_prompt", "steps", "seed", "cfg_scale", "sampler_name")
        if body.get(key) is not None}
    txt2img.update(batch_size=body.get("n", 1), width=width, height=height)
    if model is not None:
        txt2img["override_settings"] = {"sd_model_checkpoint": model.title}
    try:
        req = a1111.parse(txt2img, "txt2img", st.registry, limits, st.options())
    except ApiError as exc:
        raise _to_edits(exc) from None
    ignored = [f"{k}: not used by Stable Diffusion models" for k in _NOT_HONOURED if body.get(k) is not None]
    return req.work, ignored + req.not_honoured, fmt


async def _answer(request: Request, st: ServerState, work: Work, job: Any, fmt: str, size: Any,
                  ignored: list[str], renamed: Any = None) -> JSONResponse:
    """Wait for the job; OpenAI's answer: ``data`` with one ``b64_json`` (or data: ``url``) per image. A refusal
    found once the model loaded names the caller's field (``renamed``: an edit's A1111 fields in its own words)."""
    try:
        result = await wait_for_job(request, job, st.queue)
    except ApiError as exc:
        if exc.field in ("width", "height"):  # the model refused the size: the caller sent size, not width=
            raise ApiError(exc.status, f"size {size or 'auto'}: {size_words(exc.message)}", field="size") from None
        if renamed is not None:
            raise renamed(exc) from None
        raise

    def render() -> dict[str, Any]:
        texts = responses.infotexts(result)
        data = []
        for b64 in responses.png_b64(result.images, texts):
            item = {"b64_json": b64} if fmt == "b64_json" else {"url": f"data:image/png;base64,{b64}"}
            item["revised_prompt"] = result.prompt
            data.append(item)
        return {"created": int(time.time()), "data": data, "output_format": "png",
                "size": f"{work.kwargs.get('width') or ''}x{work.kwargs.get('height') or ''}".strip("x") or "auto",
                "sdrt_not_honoured": ignored + result.not_honoured, "sdrt_interrupted": result.interrupted}

    return JSONResponse(await run_in_threadpool(render))


async def generations(request: Request) -> JSONResponse:
    st: ServerState = request.app.state.sdrt
    body = await read_json(request, st.limits.max_body_bytes)
    work, ignored, fmt = await run_in_threadpool(parse, body, st)
    return await _answer(request, st, work, st.queue.submit(work), fmt, body.get("size"), ignored, _to_edits)


def _to_edits(exc: ApiError) -> ApiError:
    """A model's refusal for want of a picture (an inpainting or Fill model's mask, the refiner's init image) in
    the generations request's words: this route takes no picture, ``/v1/images/edits`` does (``image``, ``mask``)."""
    if exc.field not in ("init_images", "init_images[0]", "mask", "denoising_strength"):
        return openai_edits.renamed(exc)  # batch_size -> n, width/height -> size, in this request's words
    edit = openai_edits.renamed(exc)
    return ApiError(exc.status, f"{edit.message} (at /v1/images/edits: /v1/images/generations takes no picture)",
                    field=edit.field)


async def edits(request: Request) -> JSONResponse:
    """``POST /v1/images/edits`` (``sdrt.serve.openai_edits``): one picture redrawn, or repainted under a mask."""
    st: ServerState = request.app.state.sdrt
    body = await openai_edits.read_edit(request, st.limits.max_body_bytes)
    req, ignored, fmt = await run_in_threadpool(openai_edits.parse, body, st)
    size = body.get("size") if isinstance(body.get("size"), str) else None
    return await _answer(request, st, req.work, st.queue.submit(req.work), fmt, size, ignored,
                         openai_edits.renamed)


async def models(request: Request) -> JSONResponse:
    st: ServerState = request.app.state.sdrt
    return JSONResponse({"object": "list", "data": [{"id": m.model_name, "object": "model", "created": 0,
                                                     "owned_by": "sdrt"} for m in st.registry.models]})


async def model(request: Request) -> JSONResponse:
    """OpenAI's ``GET /v1/models/{model}`` (the SDK's ``models.retrieve``); 404 for a model this server lacks."""
    st: ServerState = request.app.state.sdrt
    name = request.path_params["model"]
    for m in st.registry.models:
        if name in (m.model_name, m.name):
            return JSONResponse({"id": m.model_name, "object": "model", "created": 0, "owned_by": "sdrt"})
    raise ApiError(404, f"no model {name[:200]!r} on this server; GET /v1/models lists them", field="model")


ROUTES = [
    Route("/v1/images/generations", generations, methods=["POST"]),
    Route("/v1/images/edits", edits, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", model, methods=["GET"]),
]

__all__ = ["ROUTES", "parse"]
