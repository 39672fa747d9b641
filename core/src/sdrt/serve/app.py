"""The Starlette app: routes, auth, body limits, and errors that are always JSON and never end the server."""

from __future__ import annotations

import logging
import re
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .auth import allowed
from .config import ServeConfig
from .errors import ApiError
from .http import error_response
from .state import ServerState

log = logging.getLogger("sdrt.serve")


class SlashesMiddleware:
    """``//sdapi/v1/txt2img`` is ``/sdapi/v1/txt2img``: a client given a base URL ending in ``/`` joins it with a path
    that starts with one (it was a 404 "no route")."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "//" in scope.get("path", ""):
            scope = dict(scope, path=re.sub(r"/{2,}", "/", scope["path"]))
            scope.pop("raw_path", None)
        await self.app(scope, receive, send)


class ServerErrors:
    """An unexpected error (a bug: no ``ApiError``) answers a JSON 500 in A1111's shape on a connection that stays
    open, with one line in the log and the traceback at debug. Starlette's own last resort
    (``ServerErrorMiddleware``) raises again after answering, and uvicorn then closes the keep-alive connection:
    a client's next call on it (webuiapi's requests session, SillyTavern's) failed with "connection reset"."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:  # half an answer is out: only closing the connection ends it
                raise
            response = _internal_error(scope.get("method", ""), scope.get("path", ""), exc)
            await response(scope, receive, send)


def _internal_error(method: str, path: str, exc: BaseException) -> JSONResponse:
    """The 500 of an unexpected error: its type only for the client, one log line, the traceback at debug."""
    text = " ".join(str(exc).split())[:300]
    log.error("internal error on %s %s: %s%s (traceback at debug level)", method, path[:200], type(exc).__name__,
              f": {text}" if text else "")
    log.debug("traceback of the internal error on %s %s", method, path[:200], exc_info=exc)
    return error_response(path, 500, f"internal error ({type(exc).__name__}); the server logged it and keeps serving",
                          kind=type(exc).__name__)


class AuthMiddleware:
    """Every route needs a configured user (HTTP basic) or token (bearer) when any is configured."""

    def __init__(self, app: ASGIApp, config: ServeConfig) -> None:
        self.app = app
        self.users = config.auth
        self.tokens = config.tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (self.users or self.tokens):
            header = None
            for key, value in scope.get("headers", []):
                if key == b"authorization":
                    header = value.decode("latin-1")
            if not allowed(header, self.users, self.tokens):
                challenge = 'Basic realm="sdrt"' if self.users else 'Bearer realm="sdrt"'
                response = error_response(scope.get("path", ""), 401, "authentication required: HTTP basic with a "
                                          "user from --api-auth, or 'Authorization: Bearer TOKEN' with an --api-token",
                                          headers={"WWW-Authenticate": challenge})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    headers = {"Retry-After": "2"} if exc.status == 503 else None
    return error_response(request.url.path, exc.status, exc.message, exc.field, headers, kind=exc.kind)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    path = request.url.path if len(request.url.path) <= 200 else request.url.path[:200] + "..."  # not echoed whole
    message = {404: f"no route {path}" + _MISSING.get(request.url.path.rstrip("/"), ""),
               405: f"{request.method} is not allowed on {path}"}
    return error_response(request.url.path, exc.status_code, message.get(exc.status_code, str(exc.detail)),
                          headers=dict(exc.headers or {}))


#: A1111 and OpenAI routes sdrt does not have, with what to use instead (a 404 all the same)
_MISSING = {
    "/v1/images/variations": ": variations are A1111's img2img here (POST /sdapi/v1/img2img)",
    "/sdapi/v1/interrogate": ": sdrt has no image captioner (CLIP or DeepDanbooru interrogation)",
    "/sdapi/v1/create/embedding": ": sdrt does not train embeddings",
    "/sdapi/v1/create/hypernetwork": ": sdrt does not train hypernetworks",
    "/sdapi/v1/train/embedding": ": sdrt does not train embeddings",
    "/sdapi/v1/train/hypernetwork": ": sdrt does not train hypernetworks",
    "/controlnet/txt2img": ": ControlNet units go in POST /sdapi/v1/txt2img's alwayson_scripts.controlnet.args (the "
                           "extension's current API)",
    "/controlnet/img2img": ": ControlNet units go in POST /sdapi/v1/img2img's alwayson_scripts.controlnet.args (the "
                           "extension's current API)",
    "/controlnet/control_types": ": sdrt's ControlNet modules are in GET /controlnet/module_list, its nets in "
                                 "/controlnet/model_list",
}


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's last resort, for an error outside ``ServerErrors`` (in a middleware around it)."""
    return _internal_error(request.method, request.url.path, exc)


async def _status(request: Request) -> JSONResponse:
    st: ServerState = request.app.state.sdrt
    workers = [{"name": w.label, "device": w.device, "jobs_done": w.done, "models_loaded": len(w.pipes),
                "busy": w.current is not None} for w in st.queue.workers]
    return JSONResponse({"queued": st.queue.queued(), "running": len(st.queue.running()),
                         "submitted": st.queue.submitted, "workers": workers})


def create_app(config: ServeConfig | None = None, cluster: Any = None) -> Starlette:
    """An ASGI app serving ``config`` (default: the demo model on the default device); ``cluster``
    shares options, interrupts and progress with other replicas (the Ray deployment gives one)."""
    from . import routes_a1111, routes_openai

    config = config or ServeConfig()
    if config.models is not None and not config.models.is_dir():  # not a FileNotFoundError from the registry's scan
        from ..errors import InputError

        raise InputError(f"the models folder {config.models} does not exist or is not a folder",
                         where="ServeConfig(models=...)", fix="give an existing folder, or None for the demo model")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        try:
            yield
        finally:
            state.close()

    state = ServerState(config, cluster)
    routes = [*routes_a1111.ROUTES, *routes_openai.ROUTES, Route("/sdrt/status", _status, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error})
    app.state.sdrt = state
    app.add_middleware(ServerErrors)  # innermost: its 500 passes auth's and CORS's headers as any answer does
    app.add_middleware(AuthMiddleware, config=config)
    app.add_middleware(SlashesMiddleware)
    if config.cors_origins:  # a browser's preflight is answered before auth asks for credentials
        app.add_middleware(_cors_middleware(), allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], allow_credentials=True)
    # outermost: an error in auth or CORS is a JSON 500 on a connection that stays open too (Starlette's last
    # resort, around this, answers and raises again: uvicorn then closes the connection)
    app.add_middleware(ServerErrors)
    return app


def _cors_middleware() -> type:
    """Starlette's CORS middleware, whose refused preflight is a JSON 400 in A1111's shape saying what was refused
    and what is allowed (Starlette's is the text "Disallowed CORS origin")."""
    from starlette.datastructures import Headers
    from starlette.middleware.cors import CORSMiddleware
    from starlette.responses import Response

    class Cors(CORSMiddleware):
        def preflight_response(self, request_headers: Headers) -> Response:
            response = super().preflight_response(request_headers)
            if response.status_code != 400:
                return response
            text = bytes(response.body).decode("utf-8", "replace")
            allowed = {"origin": ", ".join(sorted(self.allow_origins)), "method": ", ".join(sorted(self.allow_methods)),
                       "headers": ", ".join(sorted(self.allow_headers))}
            refused = [w for w in allowed if w in text.removeprefix("Disallowed CORS ")]
            message = (f"CORS preflight refused: {text.removeprefix('Disallowed CORS ')} not allowed; "
                       + "; ".join(f"allowed {w}: {allowed[w]}" for w in refused)
                       + ("; the server allows origins with --cors-allow-origins" if "origin" in refused else ""))
            headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
            return error_response("", 400, message, headers=headers)

    return Cors


__all__ = ["create_app"]
