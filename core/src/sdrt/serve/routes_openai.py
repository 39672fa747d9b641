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

import secrets
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import openai_edits, responses
from .errors import ApiError, from_pipeline
from .fields import get_float, get_int, get_size, get_str, size_refused, size_words
from .http import read_json, wait_for_job
from .jobs import Work
from .state import ServerState

#: OpenAI's fields that Stable Diffusion has no use for: accepted, and listed under sdrt_not_honoured
_NOT_HONOURED = ("quality", "style", "user", "background", "moderation", "output_compression", "partial_images")
_KNOWN = frozenset(("prompt", "model", "n", "size", "response_format", "output_format", "stream", "negative_prompt",
                    "steps", "seed", "cfg_scale", "sampler_name", *_NOT_HONOURED))


def parse(body: Any, st: ServerState) -> tuple[Work, list[str], str]:
    from ..errors import SdrtError
    from ..pipelines import validate
    from ..pipelines.bounds import MAX_CFG

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
    prompt = get_str(body, "prompt", "", max_len=limits.max_prompt_chars)
    negative = get_str(body, "negative_prompt", "", max_len=limits.max_prompt_chars)

    for key, text in (("prompt", prompt), ("negative_prompt", negative)):
        st.registry.check_prompt(text, key)
    name = get_str(body, "model", None, max_len=300)
    model = st.registry.model(name, "model") if name else st.registry.model(st.options()["sd_model_checkpoint"])
    n = get_int(body, "n", 1, 1, min(limits.max_images, limits.max_batch))
    size = body.get("size")
    width, height = get_size(body, limits)
    fmt = get_str(body, "response_format", "b64_json", max_len=40)
    if fmt not in ("b64_json", "url"):
        raise ApiError(400, f"response_format must be b64_json or url, got {fmt!r}", field="response_format")
    output = get_str(body, "output_format", "png", max_len=40)
    if output != "png":
        raise ApiError(400, f"output_format {output!r} is not supported; this server writes png", field="output_format")
    steps = get_int(body, "steps", 20, 1, limits.max_steps)
    cfg = get_float(body, "cfg_scale", None, 0.0, MAX_CFG)  # unset: the model family's (7 for SD, 1 for Flux)
    sampler = get_str(body, "sampler_name", "Euler", max_len=100)
    seed = get_int(body, "seed", -1, -1, 2**32 - 1 - n)
    if seed == -1:
        seed = secrets.randbelow(2**32 - limits.max_images)
    ignored = [f"{k}: not used by Stable Diffusion models" for k in _NOT_HONOURED if body.get(k) is not None]
    kwargs: dict[str, Any] = dict(steps=steps, cfg=cfg, sampler=sampler, width=width, height=height, batch=n)
    try:
        validate(prompt, negative, seed=seed, **kwargs)
    except SdrtError as exc:
        if getattr(exc, "where", None) in ("width", "height"):  # the caller sent size, not width= / height=
            raise size_refused(exc, size, limits) from None
        raise from_pipeline(exc) from None
    return Work(model, prompt, negative, kwargs, seed, n, 1, max_size=(limits.max_width, limits.max_height)), \
        ignored, fmt


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
        return exc
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
