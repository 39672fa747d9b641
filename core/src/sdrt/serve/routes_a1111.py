"""AUTOMATIC1111's routes (``/sdapi/v1/...``, and the two ``/internal`` ones Easy Diffusion calls)."""

from __future__ import annotations

import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..pipelines.hires import LATENT_MODES
from . import a1111, controlnet, extras, modules, responses
from .errors import ApiError
from .fields import get_bool, get_str
from .http import read_json, wait_for_job
from .state import ServerState


def _state(request: Request) -> ServerState:
    return request.app.state.sdrt


async def _generate(request: Request, mode: str) -> JSONResponse:
    st = _state(request)
    body = await read_json(request, st.limits.max_body_bytes)
    options = await run_in_threadpool(st.options)
    req = await run_in_threadpool(a1111.parse, body, mode, st.registry, st.limits, options)
    job = st.queue.submit(req.work, req.task_id)
    result = await wait_for_job(request, job, st.queue)
    payload = await run_in_threadpool(responses.a1111, req.work, result, req.params, req.not_honoured, job.id,
                                      req.send_images, req.ignored)
    return JSONResponse(payload)


async def txt2img(request: Request) -> JSONResponse:
    return await _generate(request, "txt2img")


async def img2img(request: Request) -> JSONResponse:
    return await _generate(request, "img2img")


async def sd_models(request: Request) -> JSONResponse:
    return JSONResponse([{"title": m.title, "model_name": m.model_name, "hash": m.hash, "sha256": None,
                          "filename": m.name, "config": None} for m in _state(request).registry.models])


async def sd_vae(request: Request) -> JSONResponse:
    """A1111's ``/sd-vae``: the VAE folder's files (``filename``: the name only, never a server path)."""
    found = await run_in_threadpool(modules.vaes, _state(request).registry)
    return JSONResponse([{"model_name": e.name, "filename": e.name} for e in found])


async def sd_modules(request: Request) -> JSONResponse:
    """Forge's ``/sd-modules``: the VAE and text-encoder files ``forge_additional_modules`` takes."""
    found = await run_in_threadpool(modules.listing, _state(request).registry)
    return JSONResponse([{"model_name": e.name, "filename": e.name} for e in found.values()])


async def samplers(request: Request) -> JSONResponse:
    from ..samplers.names import A1111_SAMPLERS

    return JSONResponse([{"name": label, "aliases": [name], "options": {"scheduler": schedule}}
                         for label, (name, schedule, _d, _o) in A1111_SAMPLERS.items()])


async def schedulers(request: Request) -> JSONResponse:
    from ..samplers.names import A1111_SCHEDULES

    seen: dict[str, str] = {"automatic": "Automatic"}
    for label in A1111_SCHEDULES:
        seen.setdefault(label.lower().replace(" ", "_"), label)
    return JSONResponse([{"name": name, "label": label, "aliases": None, "default_rho": None,
                          "need_inner_model": None} for name, label in seen.items()])


async def loras(request: Request) -> JSONResponse:
    return JSONResponse([{"name": name, "alias": name, "path": path.name, "metadata": {}}
                         for name, path in _state(request).registry.loras.items()])


async def embeddings(request: Request) -> JSONResponse:
    from ..checkpoint import load_embedding

    def listing() -> dict[str, Any]:
        loaded: dict[str, Any] = {}
        skipped: dict[str, Any] = {}
        for name, path in _state(request).registry.embeddings.items():
            try:
                e = load_embedding(path)
            except Exception:  # noqa: BLE001 - an unreadable file is listed as skipped
                skipped[name] = {"step": None, "sd_checkpoint": None, "sd_checkpoint_name": None, "shape": 0,
                                 "vectors": 0}
                continue
            v = next(iter(e.vectors.values()))
            # by trigger word, as A1111 lists them: a file's stem, or the placeholder token of diffusers' SDXL pair
            # (learned_embeds + learned_embeds_2: one entry)
            loaded[e.name] = {"step": None, "sd_checkpoint": None, "sd_checkpoint_name": None,
                            "shape": int(v.shape[1]), "vectors": int(v.shape[0])}
        return {"loaded": loaded, "skipped": skipped}

    return JSONResponse(await run_in_threadpool(listing))


async def options(request: Request) -> JSONResponse:
    st = _state(request)
    if request.method == "POST":
        body = await read_json(request, st.limits.max_body_bytes)
        await run_in_threadpool(st.set_options, body)
        return JSONResponse(None)
    return JSONResponse(await run_in_threadpool(st.options))


async def progress(request: Request) -> JSONResponse:
    st = _state(request)
    skip_image = _query_bool(request, "skip_current_image", False)
    local = st.queue.running()
    report = st.progress_report()
    others = await run_in_threadpool(st.cluster.others_progress) if st.cluster is not None else []
    running = report["running"] + [j for o in others for j in o["running"] if j["progress"] < 1.0]
    queued = report["queued"] + sum(o["queued"] for o in others)
    job = running[0] if running else None
    # A1111's job_count: the current job's runs (n_iter); job_no: the 0-based run in progress; job_timestamp: when
    # the job started (YYYYmmddHHMMSS). The jobs running and waiting are sdrt's running and queued
    started = job.get("started") if job else None
    state = {"skipped": bool(job and job["skipped"]), "interrupted": bool(job and job["interrupted"]),
             "stopping_generation": False, "job": job["id"] if job else "", "job_count": job["runs"] if job else 0,
             "job_timestamp": time.strftime("%Y%m%d%H%M%S", time.localtime(started)) if started else "0",
             "job_no": job["iteration"] if job else 0,
             "sampling_step": job["step"] if job else 0, "sampling_steps": job["total"] if job else 0,
             "running": [{k: j[k] for k in ("id", "worker", "progress")} for j in running], "queued": queued}
    image = None
    if local and job is not None and job["id"] == local[0].id and not skip_image:
        image = await run_in_threadpool(responses.preview_b64, local[0].preview)
    return JSONResponse({"progress": job["progress"] if job else 0.0, "eta_relative": job["eta"] if job else 0.0,
                         "state": state, "current_image": image, "textinfo": None})


async def internal_progress(request: Request) -> JSONResponse:
    """A1111's ``/internal/progress`` (what Easy Diffusion polls): the progress of one task id."""
    st = _state(request)
    body = await read_json(request, st.limits.max_body_bytes)
    if not isinstance(body, dict):
        raise ApiError(422, "the body must be a JSON object with id_task")
    task = get_str(body, "id_task", None, max_len=200)
    live = get_bool(body, "live_preview", False)
    job = st.queue.find(task) if task else None
    if job is None:
        return JSONResponse({"active": False, "queued": False, "completed": False, "progress": None, "eta": None,
                             "live_preview": None, "id_live_preview": -1, "textinfo": "Waiting..."})
    done = job.state in ("done", "failed", "interrupted")
    preview = await run_in_threadpool(responses.preview_b64, job.preview) if live and not done else None
    return JSONResponse({"active": job.state == "running", "queued": job.state == "queued", "completed": done,
                         "progress": None if job.state == "queued" else round(job.progress, 4),
                         "eta": round(job.eta, 3) if job.state == "running" else None,
                         "live_preview": preview, "id_live_preview": job.step if preview else -1,
                         "textinfo": job.state})


async def png_info(request: Request) -> JSONResponse:
    """A1111's ``/png-info``: the ``parameters`` text of a PNG (or a JPEG/WebP's comment), and parsed."""
    from . import b64images

    st = _state(request)
    body = await read_json(request, st.limits.max_body_bytes)
    if not isinstance(body, dict):
        raise ApiError(422, "the body must be a JSON object with image (a base64 PNG)")
    image = body.get("image")
    if image is None or (isinstance(image, str) and not image.strip()):
        return JSONResponse({"info": "", "items": {}, "parameters": {}})

    def read() -> dict[str, Any]:
        from ..errors import SdrtError
        from ..pipelines.png import SIGNATURE, read_text_chunks

        raw = b64images.raw_bytes(image, "image")
        items: dict[str, Any] = {}
        if raw.startswith(SIGNATURE):
            try:
                items = dict(read_text_chunks(raw))
            except SdrtError as exc:  # a truncated PNG
                raise ApiError(400, f"image is not a readable PNG ({exc.what})", field="image") from None
        else:  # JPEG, WebP: A1111 writes the parameters as the EXIF UserComment; Pillow reads comments
            img = b64images.decode(image, "image", st.limits.max_width * st.limits.max_height * 4)
            items = {k: v for k, v in img.info.items() if isinstance(v, str)}
            try:
                comment = img.getexif().get_ifd(0x8769).get(0x9286)  # EXIF UserComment
            except Exception as exc:  # noqa: BLE001 - the client's EXIF block: Pillow raises SyntaxError and more on
                # a broken one ("not a TIFF file"), none of them a server fault
                raise ApiError(400, f"image's EXIF data cannot be read ({type(exc).__name__}), so its parameters "
                                    "(EXIF UserComment) cannot be either", field="image") from None
            if isinstance(comment, bytes) and comment[:8] in (b"UNICODE\0", b"ASCII\0\0\0"):
                codec = "utf-16-be" if comment[:8] == b"UNICODE\0" else "ascii"
                items.setdefault("parameters", comment[8:].decode(codec, errors="replace"))
        info = items.pop("parameters", "")
        return {"info": info, "items": items, "parameters": responses.parse_infotext(info) if info else {}}

    return JSONResponse(await run_in_threadpool(read))


async def interrupt(request: Request) -> JSONResponse:
    return JSONResponse({"interrupted": await run_in_threadpool(_state(request).interrupt)})


async def skip(request: Request) -> JSONResponse:
    return JSONResponse({"skipped": await run_in_threadpool(_state(request).skip)})


async def refresh(request: Request) -> JSONResponse:
    await run_in_threadpool(_state(request).refresh)
    return JSONResponse(None)


async def unload_checkpoint(request: Request) -> JSONResponse:
    await run_in_threadpool(_state(request).unload)
    return JSONResponse({})


async def reload_checkpoint(request: Request) -> JSONResponse:
    await run_in_threadpool(_state(request).reload)
    return JSONResponse({})


async def memory(request: Request) -> JSONResponse:
    """A1111's ``/memory``: this machine's RAM in bytes (``free``, ``used``, ``total``); no torch, so ``cuda``
    holds an ``error`` as A1111's does when it cannot read it."""
    import os

    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total, free = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
        ram: dict[str, Any] = {"free": free, "used": total - free, "total": total}
    except (ValueError, OSError, AttributeError) as exc:  # not a POSIX system
        ram = {"error": f"cannot read this machine's memory ({exc})"}
    return JSONResponse({"ram": ram, "cuda": {"error": "sdrt does not use torch; see GET /sdrt/status"}})


async def ping(request: Request) -> JSONResponse:
    return JSONResponse({})


def _query_bool(request: Request, name: str, default: bool) -> bool:
    text = request.query_params.get(name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if text.strip().lower() in ("false", "0", "no", "off", ""):
        return False
    raise ApiError(422, f"{name} must be true or false, got {text[:40]!r}", field=name)


async def cn_version(request: Request) -> JSONResponse:
    return JSONResponse({"version": controlnet.API_VERSION})


async def cn_models(request: Request) -> JSONResponse:
    """sd-webui-controlnet's model list: ``name [hash]`` of each ControlNet a unit can name (read from the folders
    on every call, so ``?update=true`` and ``false`` answer alike)."""
    _query_bool(request, "update", True)
    nets = await run_in_threadpool(lambda: _state(request).registry.controlnets)
    seen: dict[str, str] = {}
    for e in nets:  # a part name several model folders share is listed once
        seen.setdefault(e.name.casefold(), e.title)
    return JSONResponse({"model_list": list(seen.values())})


async def cn_modules(request: Request) -> JSONResponse:
    alias = _query_bool(request, "alias_names", False)
    return JSONResponse({"module_list": controlnet.module_list(alias), "module_detail": controlnet.module_detail(alias)})


async def cn_settings(request: Request) -> JSONResponse:
    return JSONResponse({"control_net_unit_count": controlnet.MAX_UNITS})


async def cn_detect(request: Request) -> JSONResponse:
    st = _state(request)
    body = await read_json(request, st.limits.max_body_bytes)
    lim = st.limits
    return JSONResponse(await run_in_threadpool(controlnet.detect, body, lim.max_width * lim.max_height * 4,
                                                max(lim.max_width, lim.max_height), st.registry.models_dir,
                                                st.config.backend, st.config.devices[0]))


async def cn_render_openpose(request: Request) -> JSONResponse:
    st = _state(request)
    body = await read_json(request, st.limits.max_body_bytes)
    return JSONResponse(await run_in_threadpool(controlnet.render_openpose_json, body))


def _empty(value: Any) -> Any:
    async def route(request: Request) -> JSONResponse:
        return JSONResponse(value)

    return route


ROUTES = [
    Route("/sdapi/v1/txt2img", txt2img, methods=["POST"]),
    Route("/sdapi/v1/img2img", img2img, methods=["POST"]),
    Route("/sdapi/v1/sd-models", sd_models, methods=["GET"]),
    Route("/sdapi/v1/samplers", samplers, methods=["GET"]),
    Route("/sdapi/v1/schedulers", schedulers, methods=["GET"]),
    Route("/sdapi/v1/loras", loras, methods=["GET"]),
    Route("/sdapi/v1/embeddings", embeddings, methods=["GET"]),
    Route("/sdapi/v1/options", options, methods=["GET", "POST"]),
    Route("/sdapi/v1/progress", progress, methods=["GET"]),
    Route("/sdapi/v1/interrupt", interrupt, methods=["POST"]),
    Route("/sdapi/v1/skip", skip, methods=["POST"]),
    Route("/sdapi/v1/refresh-checkpoints", refresh, methods=["POST"]),
    Route("/sdapi/v1/refresh-loras", refresh, methods=["POST"]),
    Route("/sdapi/v1/png-info", png_info, methods=["POST"]),
    Route("/sdapi/v1/refresh-embeddings", refresh, methods=["POST"]),
    Route("/sdapi/v1/refresh-vae", refresh, methods=["POST"]),
    Route("/sdapi/v1/unload-checkpoint", unload_checkpoint, methods=["POST"]),
    Route("/sdapi/v1/reload-checkpoint", reload_checkpoint, methods=["POST"]),
    Route("/sdapi/v1/refresh-vae-and-text-encoders", refresh, methods=["POST"]),  # Forge's
    # upscalers: A1111's plain ones ("None" is a Lanczos resize), the models in ESRGAN/ and RealESRGAN/, the
    # Extras tab's routes (sdrt.serve.extras), and the hires. fix's latent modes
    Route("/sdapi/v1/upscalers", extras.upscalers, methods=["GET"]),
    Route("/sdapi/v1/extra-single-image", extras.extra_single_image, methods=["POST"]),
    Route("/sdapi/v1/extra-batch-images", extras.extra_batch_images, methods=["POST"]),
    Route("/sdapi/v1/latent-upscale-modes", _empty([{"name": name} for name in LATENT_MODES]), methods=["GET"]),
    # lists clients read at start-up; sdrt has none of these
    Route("/sdapi/v1/sd-vae", sd_vae, methods=["GET"]),
    Route("/sdapi/v1/sd-modules", sd_modules, methods=["GET"]),
    Route("/sdapi/v1/hypernetworks", _empty([]), methods=["GET"]),
    Route("/sdapi/v1/face-restorers", _empty([]), methods=["GET"]),
    Route("/sdapi/v1/prompt-styles", _empty([]), methods=["GET"]),
    # the always-on scripts a request's alwayson_scripts may name (A1111 lists scripts by their lower-case titles)
    Route("/sdapi/v1/scripts", _empty({"txt2img": ["controlnet", "forge fluxkontext"],
                                       "img2img": ["controlnet", "forge fluxkontext"]}), methods=["GET"]),
    Route("/sdapi/v1/cmd-flags", _empty({}), methods=["GET"]),
    Route("/sdapi/v1/script-info", _empty([]), methods=["GET"]),
    Route("/sdapi/v1/memory", memory, methods=["GET"]),
    Route("/sdapi/v1/extensions", _empty([]), methods=["GET"]),
    Route("/sdapi/v1/realesrgan-models", extras.realesrgan, methods=["GET"]),
    Route("/internal/ping", ping, methods=["GET"]),
    # sd-webui-controlnet's routes (its scripts/api.py)
    Route("/controlnet/version", cn_version, methods=["GET"]),
    Route("/controlnet/model_list", cn_models, methods=["GET"]),
    Route("/controlnet/module_list", cn_modules, methods=["GET"]),
    Route("/controlnet/settings", cn_settings, methods=["GET"]),
    Route("/controlnet/detect", cn_detect, methods=["POST"]),
    Route("/controlnet/render_openpose_json", cn_render_openpose, methods=["POST"]),
    Route("/internal/progress", internal_progress, methods=["POST"]),
]

__all__ = ["ROUTES"]
