"""Answers of the auth and CORS middleware keep the client's keep-alive connection, as the JSON 500 of a route does
(test_serve_server_errors): an ``Authorization: Basic`` header with bytes outside ASCII raised in the auth check
(base64's ValueError), Starlette's last resort answered 500 and raised again, and uvicorn closed the connection; the
client got "connection reset by peer". Now that header is a 401, an error in auth or CORS is a JSON 500 on an open
connection, and a refused CORS preflight is a JSON 400 saying what was refused and what is allowed."""

from __future__ import annotations

import base64

import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency of the server")

ORIGIN = "http://app.local"


@pytest.fixture(scope="module")
def url(models_dir):
    from sdrt.serve import ServeConfig

    config = ServeConfig(models=models_dir, backend="openvino", auth=(("alice", "s3cret"),), tokens=("tok",),
                         cors_origins=(ORIGIN,))
    with live_server(config) as u:
        yield u


def _peer(r) -> tuple[str, int]:
    """The client's end of the connection the answer came on: the same one means it was kept."""
    return r.extensions["network_stream"].get_extra_info("client_addr")


GOOD = {"Authorization": "Bearer tok"}


def test_a_non_ascii_basic_header_is_a_401_on_a_kept_connection(url) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        for header in ("Basic é".encode("latin-1"), "Basic ÿÿÿÿ".encode("latin-1"), b"Basic \xe9:\xe9"):
            r = c.get("/sdapi/v1/sd-models", headers={"Authorization": header})
            assert r.status_code == 401 and r.json()["error"] == "Unauthorized", r.text
            ok = c.get("/sdapi/v1/sd-models", headers=GOOD)
            assert ok.status_code == 200 and _peer(ok) == _peer(r)
        basic = "Basic " + base64.b64encode(b"alice:s3cret").decode()
        assert c.get("/sdapi/v1/options", headers={"Authorization": basic}).status_code == 200


def test_an_error_in_the_auth_check_is_a_json_500_on_a_kept_connection(url, monkeypatch) -> None:
    from sdrt.serve import app

    def broken(header, users, tokens):  # any bug the check may still have
        if header == "Bearer boom":
            raise RuntimeError("broken check")
        return header == "Bearer tok"

    monkeypatch.setattr(app, "allowed", broken)
    with httpx.Client(base_url=url, timeout=60) as c:
        for path in ("/sdapi/v1/sd-models", "/v1/models"):
            r = c.get(path, headers={"Authorization": "Bearer boom", "Origin": ORIGIN})
            assert r.status_code == 500 and r.headers["content-type"] == "application/json"
            assert "internal error (RuntimeError)" in r.text and "broken check" not in r.text
            ok = c.get(path, headers=GOOD)
            assert ok.status_code == 200 and _peer(ok) == _peer(r)


def test_a_refused_cors_preflight_is_json_and_keeps_the_connection(url) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.options("/sdapi/v1/txt2img", headers={"Origin": "http://evil.example",
                                                    "Access-Control-Request-Method": "POST"})
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["error"] == "BadRequest" and body["detail"].startswith("CORS preflight refused: origin not allowed")
        assert f"allowed origin: {ORIGIN}" in body["detail"] and "--cors-allow-origins" in body["detail"]
        ok = c.get("/sdapi/v1/sd-models", headers=GOOD)
        assert ok.status_code == 200 and _peer(ok) == _peer(r)
        r = c.options("/sdapi/v1/txt2img", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "PUT",
                                                    "Access-Control-Request-Headers": "x-custom"})
        assert r.status_code == 400 and "method, headers not allowed" in r.json()["detail"]
        assert "allowed method: GET, POST" in r.json()["detail"]
        assert r.headers["access-control-allow-origin"] == ORIGIN  # the preflight's own headers stay
        pre = c.options("/sdapi/v1/txt2img", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "authorization"})
        assert pre.status_code == 200 and _peer(pre) == _peer(r)


def test_requests_and_webuiapi_go_on_after_auth_and_cors_refusals(url) -> None:
    requests = pytest.importorskip("requests")
    with requests.Session() as s:
        for _ in range(2):
            r = s.get(f"{url}/sdapi/v1/sd-models", headers={"Authorization": "Basic é".encode("latin-1")}, timeout=60)
            assert r.status_code == 401
            r = s.options(f"{url}/sdapi/v1/txt2img", headers={"Origin": "http://evil.example",
                                                               "Access-Control-Request-Method": "POST"}, timeout=60)
            assert r.status_code == 400 and r.json()["detail"].startswith("CORS preflight refused")
            assert s.get(f"{url}/sdapi/v1/sd-models", headers=GOOD, timeout=60).status_code == 200
    webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
    host, port = url.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port))
    api.set_auth("alice", "wrong")
    assert api.session.get(f"{url}/sdapi/v1/options", timeout=60).status_code == 401
    api.set_auth("alice", "s3cret")
    assert [m["model_name"] for m in api.get_sd_models()] == ["demo-a", "demo-b"]
