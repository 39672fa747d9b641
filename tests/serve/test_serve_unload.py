"""A1111's ``POST /sdapi/v1/unload-checkpoint`` and ``/reload-checkpoint`` (text-generation-webui's sd_api_pictures
calls them around each picture to share a GPU with a language model): the loaded pipelines are closed after the
running job and the next job loads its model again; reload loads the current model at once; the images stay the
same bit for bit."""

from __future__ import annotations

import base64
import threading

import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency of the server")

BODY = {"prompt": "a red circle on a blue background", "seed": 5, "steps": 4, "width": 64, "height": 64,
        "sampler_name": "Euler"}


@pytest.fixture(scope="module")
def url(models_dir):
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models_dir, backend="openvino")) as u:
        yield u


def _loaded(c: httpx.Client) -> int:
    return sum(w["models_loaded"] for w in c.get("/sdrt/status").json()["workers"])


def _image(c: httpx.Client, **kw) -> bytes:
    r = c.post("/sdapi/v1/txt2img", json={**BODY, **kw})
    assert r.status_code == 200, r.text
    return base64.b64decode(r.json()["images"][0])


def test_unload_then_reload_frees_and_loads_and_the_image_is_the_same(url) -> None:
    with httpx.Client(base_url=url, timeout=300) as c:
        first = _image(c)
        assert _loaded(c) == 1
        r = c.post("/sdapi/v1/unload-checkpoint")
        assert r.status_code == 200 and r.json() == {}
        assert _loaded(c) == 0
        assert c.post("/sdapi/v1/unload-checkpoint").json() == {}  # nothing loaded: still fine
        r = c.post("/sdapi/v1/reload-checkpoint")
        assert r.status_code == 200 and r.json() == {}
        assert _loaded(c) == 1  # loaded before any request asks for it
        assert _image(c) == first
        c.post("/sdapi/v1/unload-checkpoint")
        assert _image(c) == first  # a job after an unload loads the model again
        assert _loaded(c) == 1


def test_an_unload_during_a_job_waits_for_it(url) -> None:
    with httpx.Client(base_url=url, timeout=300) as c:
        want = _image(c, steps=30)
        got: dict[str, bytes] = {}
        job = threading.Thread(target=lambda: got.update(image=_image(c, steps=30)))
        job.start()
        while job.is_alive() and not c.get("/sdapi/v1/progress").json()["state"]["job"]:
            pass
        assert c.post("/sdapi/v1/unload-checkpoint").status_code == 200  # returns once the job is done
        job.join()
        assert got["image"] == want
        assert _loaded(c) == 0


def test_a_reload_after_the_workers_stopped_loads_nothing(models_dir) -> None:
    """A /reload-checkpoint that reaches a worker after it stopped (the server shutting down) is a 503: the worker
    closed its pipelines on its way out, and a pipeline loaded then would never be closed."""
    from sdrt.serve import ServeConfig
    from sdrt.serve.errors import ApiError
    from sdrt.serve.state import ServerState

    state = ServerState(ServeConfig(models=models_dir, backend="openvino"))
    state.reload()
    assert [len(w.pipes) for w in state.queue.workers] == [1]
    state.close()
    assert [len(w.pipes) for w in state.queue.workers] == [0]
    with pytest.raises(ApiError, match="stopping") as exc:
        state.reload()
    assert exc.value.status == 503
    assert [len(w.pipes) for w in state.queue.workers] == [0]
