"""Request plumbing shared by the routes: the JSON body under a size limit, and error responses."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from .errors import ApiError


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def read_json(request: Request, max_bytes: int, *, empty: Any = None) -> Any:
    """The parsed body; 413 over ``max_bytes`` (checked before and while reading), 400 for bad JSON."""
    return parse_json(await read_body(request, max_bytes), empty=empty)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body's bytes; 413 over ``max_bytes`` (checked before and while reading)."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdecimal():
            raise ApiError(400, "the Content-Length header is not a number")
        if int(length) > max_bytes:
            raise ApiError(413, f"the request body is {int(length)} bytes, above this server's limit of {max_bytes}")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise ApiError(413, f"the request body is over this server's limit of {max_bytes} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # the client went away mid-upload: no one to answer, nothing to log as a fault
        raise ApiError(499, "the client closed the connection while sending the body") from None
    return b"".join(chunks)


def parse_json(raw: bytes, *, empty: Any = None) -> Any:
    """A JSON body's value; 400 naming what is wrong with it."""
    if not raw.strip():
        if empty is not None:
            return empty
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:
        body = json.loads(raw.decode("utf-8-sig"), parse_constant=_no_constant)  # a BOM, as json.loads(bytes) takes
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:  # "Unterminated string starting at": said once, with where
        raise ApiError(400, f"the request body is not valid JSON ({exc.msg.removesuffix(' at')} at line "
                            f"{exc.lineno} column {exc.colno})") from None
    except ValueError as exc:
        digits = re.search(r"\((\d+) digits\).*value has (\d+) digits", str(exc))
        if digits:  # Python's own bound on an integer's digits, whose advice is for the server's code
            raise ApiError(400, f"the request body holds a number of {digits.group(2)} digits, more than the "
                                f"{digits.group(1)} this server reads; send numbers of fewer digits") from None
        raise ApiError(400, f"the request body is not valid JSON ({exc})") from None
    except RecursionError:  # the parser recurses once per level of [ or {
        raise ApiError(400, "the request body nests too deeply (over ~1000 levels of [ or {); send a flatter "
                            "JSON object") from None
    if _ESCAPED_SURROGATE.search(raw):  # only a \\uD800-\\uDFFF escape makes one; UTF-8 bytes cannot
        _no_lone_surrogate(body)
    return body


#: a JSON escape of a UTF-16 surrogate (a pair of them is one character above U+FFFF; a lone one is no text)
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_lone_surrogate(body: Any) -> None:
    """400 naming the field when a string of ``body`` (a key or a value) holds a lone surrogate, which no UTF-8
    text holds: a prompt, a task id or a style with one would fail later, writing the PNG or the response."""
    stack: list[tuple[str, Any, bool]] = [("", body, False)]
    while stack:
        path, value, is_key = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((path, key, True))
                stack.append((f"{path}.{key}" if path else str(key), item, False))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item, False) for i, item in enumerate(value))
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                field = path.split(".")[0].split("[")[0] or None
                what = f"a key of {path or 'the body'}" if is_key else path or "the body"
                raise ApiError(400, f"{what} holds a lone surrogate U+{ord(value[exc.start]):04X} at character "
                                    f"{exc.start}, which is not text; send UTF-8 text (a character above U+FFFF as "
                                    "a pair of \\u escapes)", field=field) from None


async def _disconnect(request: Request) -> None:
    """Returns once the client has closed the connection (the body was read before)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # an ASGI server that answers at once with empty bodies is not spun on


async def wait_for_job(request: Request, job: Any, queue: Any) -> Any:
    """The job's result, or, when the client disconnects first (or the request is cancelled), the job is
    abandoned (``JobQueue.abandon``: it never runs, or stops at its next step) so it holds no worker, and
    ``ApiError(499)`` ends the request (no one reads that answer)."""
    result = asyncio.wrap_future(job.future)
    # a failed job nobody waits for any more is not "an exception never retrieved"
    result.add_done_callback(lambda f: f.cancelled() or f.exception())
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if result not in done and watcher.exception() is None:
            queue.abandon(job)
            raise ApiError(499, "the client closed the connection; the job was dropped")
        return await result
    except asyncio.CancelledError:
        queue.abandon(job)
        raise
    finally:
        watcher.cancel()


def error_response(request_path: str, status: int, message: str, field: str | None = None,
                   headers: dict[str, str] | None = None, kind: str | None = None) -> JSONResponse:
    """OpenAI's error shape under ``/v1/``; elsewhere A1111's (``error``, ``detail``, ``body``, ``errors``), with
    ``message`` and ``field``. A 500's ``error`` is the failed exception's type name (``kind``), as A1111's
    ``handle_exception`` answers one (``type(e).__name__``); no traceback, which the server logs at debug.
    The message is one line: a library's text that spans lines (onnx's, a traceback's) is joined with "; "."""
    message = "; ".join(line.strip() for line in message.splitlines() if line.strip()) or message
    if request_path.startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        body: dict[str, Any] = {"error": {"message": message, "type": kind, "param": field, "code": None}}
    else:
        name = kind if status >= 500 and kind else _names.get(status, "Error")
        body = {"error": name, "detail": message, "body": "", "errors": message,
                "message": message, "field": field}
    return JSONResponse(body, status_code=status, headers=headers)


_names = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict",
          413: "PayloadTooLarge", 499: "ClientClosedRequest", 415: "UnsupportedMediaType", 422: "UnprocessableEntity", 500: "InternalError",
          501: "NotImplemented", 503: "ServiceUnavailable"}

__all__ = ["error_response", "parse_json", "read_body", "read_json", "wait_for_job"]
