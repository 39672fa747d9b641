"""An unexpected server error (a bug in a route: no ``ApiError``) is a normal JSON 500 in A1111's shape (``error``,
``detail``, ``body``, ``errors``) on a keep-alive connection that stays usable: Starlette's last resort answered and
raised again, uvicorn then closed the connection, and a client's next call on it failed ("connection reset by peer"
for httpx; webuiapi's and SillyTavern's sessions). The log has one line; the traceback is at debug, never sent."""

from __future__ import annotations

import logging

import pytest
from serve_helpers import needs_server, serve_app

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency of the server")


async def _bug(request):  # a route with a bug, standing for any the server may still have
    return {"styles": []}["names"]


@pytest.fixture(scope="module")
def url(models_dir):
    from starlette.routing import Route

    from sdrt.serve import ServeConfig, create_app

    app = create_app(ServeConfig(models=models_dir, backend="openvino"))
    app.router.routes.insert(0, Route("/sdapi/v1/prompt-styles", _bug, methods=["GET"]))
    app.router.routes.insert(0, Route("/v1/bug", _bug, methods=["GET"]))
    with serve_app(app) as u:
        yield u


def _check_500(r, openai: bool = False) -> None:
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    body = r.json()
    text = r.text
    assert "Traceback" not in text and "names" not in text and ".py" not in text  # no traceback, no message
    if openai:
        assert body["error"]["type"] == "server_error" and "KeyError" in body["error"]["message"]
        return
    assert set(body) >= {"error", "detail", "body", "errors"}
    assert body["error"] == "KeyError"  # A1111's handle_exception: type(e).__name__, not a status word
    assert "internal error (KeyError)" in body["detail"] and body["errors"] == body["detail"]


def test_a_500_keeps_the_httpx_connection_usable(url, caplog) -> None:
    with httpx.Client(base_url=url, timeout=60) as c, caplog.at_level(logging.DEBUG, logger="sdrt.serve"):
        for _ in range(3):
            _check_500(c.get("/sdapi/v1/prompt-styles"))
            r = c.get("/sdapi/v1/sd-models")  # the same connection: it was reset
            assert r.status_code == 200 and r.json()
        _check_500(c.get("/v1/bug"), openai=True)
        assert c.get("/v1/models").status_code == 200
    lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 4 and all("\n" not in r.getMessage() and r.exc_info is None for r in lines)
    assert "internal error on GET /sdapi/v1/prompt-styles: KeyError: 'names'" in lines[0].getMessage()
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(debug) == 4  # the traceback, at debug


def test_a_500_keeps_a_requests_session_usable(url) -> None:
    requests = pytest.importorskip("requests")
    with requests.Session() as s:
        for _ in range(3):
            _check_500(s.get(f"{url}/sdapi/v1/prompt-styles", timeout=60))
            assert s.get(f"{url}/sdapi/v1/sd-models", timeout=60).status_code == 200


def test_webuiapi_goes_on_after_a_500(url) -> None:
    webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
    host, port = url.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port))
    assert "internal error (KeyError)" in api.get_prompt_styles()["detail"]
    assert [m["model_name"] for m in api.get_sd_models()] == ["demo-a", "demo-b"]
    assert api.get_options()["sd_model_checkpoint"].startswith("demo-a")
