"""What the request fuzz (tests/serve/test_serve_fuzz.py) found, each as a hand-written case: in process (Starlette's
TestClient on the ASGI app), on copies of the demo model under tiny limits."""

from __future__ import annotations

import pytest
from serve_helpers import needs_server

pytestmark = needs_server
pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")

T2I = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 1, "seed": 1}


@pytest.fixture(scope="module")
def client(models_dir):
    from starlette.testclient import TestClient

    from sdrt.serve import Limits, ServeConfig, create_app

    limits = Limits(max_width=64, max_height=64, max_steps=4, max_batch=1, max_images=1)
    with TestClient(create_app(ServeConfig(models=models_dir, backend="openvino", limits=limits)),
                    raise_server_exceptions=False) as c:
        yield c


def _refused(r, status: int) -> tuple[str, str]:
    assert r.status_code == status, (r.status_code, r.text)
    data = r.json()
    return data["detail"], data["field"]


@pytest.mark.parametrize("key", ["sd_model_checkpoint", "randn_source", "hires_fix_refiner_pass"])
@pytest.mark.parametrize("value", [0, False, [], {}])
def test_an_override_of_the_wrong_type_is_refused_not_dropped(client, key, value) -> None:
    """override_settings' model, random source and refiner pass that were 0, false, [] or {} ran with the server's
    option (``overrides.get(key) or options.get(key)``): a 200 that silently dropped what the client sent."""
    r = client.post("/sdapi/v1/txt2img", json={**T2I, "override_settings": {key: value}})
    assert r.status_code in (400, 422), r.text
    message, field = r.json()["detail"], r.json()["field"]
    assert field == f"override_settings.{key}" and f"override_settings.{key}" in message, message


def test_an_empty_override_still_means_the_servers_option(client) -> None:
    r = client.post("/sdapi/v1/txt2img", json={**T2I, "override_settings": {"sd_model_checkpoint": "",
                                                                              "randn_source": None}})
    assert r.status_code == 200, r.text
