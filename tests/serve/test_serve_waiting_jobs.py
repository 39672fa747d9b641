"""A job taken by a worker that ``/unload-checkpoint`` or ``/reload-checkpoint`` holds (a reload compiling a large
model holds it for minutes) is the current job: ``/interrupt`` answers it at once, as A1111 answers an interrupted
job, ``/skip`` skips its first run, and the jobs after it run as before."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
from serve_helpers import needs_server, serve_app

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency of the server")

BODY = {"prompt": "a red circle on a blue background", "seed": 5, "steps": 4, "width": 64, "height": 64,
        "sampler_name": "Euler"}


@pytest.fixture(scope="module")
def served(models_dir):
    from sdrt.serve import ServeConfig, create_app

    app = create_app(ServeConfig(models=models_dir, backend="openvino"))
    with serve_app(app) as url:
        yield url, app.state.sdrt.queue.workers[0]


def _post_in_thread(url: str, body: dict) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def post() -> None:
        with httpx.Client(base_url=url, timeout=300) as c:
            out["response"] = c.post("/sdapi/v1/txt2img", json=body)
            out["at"] = time.monotonic()

    t = threading.Thread(target=post)
    t.start()
    return t, out


def _taken(worker, deadline: float = 30) -> None:
    end = time.monotonic() + deadline
    while worker.current is None:
        assert time.monotonic() < end, "the worker took no job"
        time.sleep(0.01)


def _images(r) -> list[bytes]:
    assert r.status_code == 200, r.text
    return [base64.b64decode(i) for i in r.json()["images"]]


def test_an_interrupt_answers_a_job_waiting_behind_a_reload_at_once(served) -> None:
    url, worker = served
    with httpx.Client(base_url=url, timeout=300) as c:
        want = _images(c.post("/sdapi/v1/txt2img", json=BODY))
        with worker.busy:  # what /reload-checkpoint holds while it loads and compiles the model
            job, out = _post_in_thread(url, BODY)
            _taken(worker)
            # not started: a waiting job (sdrt's queued; A1111's job_count is a running job's runs)
            assert c.get("/sdapi/v1/progress").json()["state"]["queued"] == 1
            assert c.post("/sdapi/v1/interrupt").status_code == 200
            job.join(timeout=30)
            assert not job.is_alive(), "the interrupted job waited for the worker"
            released = time.monotonic()
        assert out["at"] < released  # answered while the worker was still held
        r = out["response"]
        assert _images(r) == []
        assert json.loads(r.json()["info"])["sdrt_interrupted"] is True
        # the interrupt belonged to that job only: the next one runs whole, the same image as before
        assert _images(c.post("/sdapi/v1/txt2img", json=BODY)) == want
        assert c.post("/sdapi/v1/interrupt").status_code == 200  # nothing current: reaches nothing later
        assert _images(c.post("/sdapi/v1/txt2img", json=BODY)) == want


def test_a_skip_reaches_a_waiting_job_and_skips_only_its_first_run(served) -> None:
    url, worker = served
    with httpx.Client(base_url=url, timeout=300) as c:
        want = _images(c.post("/sdapi/v1/txt2img", json={**BODY, "n_iter": 2}))
        with worker.busy:
            job, out = _post_in_thread(url, {**BODY, "n_iter": 2})
            _taken(worker)
            assert c.post("/sdapi/v1/skip").status_code == 200
            time.sleep(0.3)
            assert job.is_alive()  # its second run waits for the worker
        job.join(timeout=300)
        r = out["response"]
        info = json.loads(r.json()["info"])
        assert _images(r) == want[1:] and info["all_seeds"] == [BODY["seed"] + 1]
        assert info["sdrt_skipped_runs"] == 1 and info["sdrt_interrupted"] is False
        with worker.busy:  # a job of one run, skipped while it waits: answered at once, nothing made
            job, out = _post_in_thread(url, BODY)
            _taken(worker)
            assert c.post("/sdapi/v1/skip").status_code == 200
            job.join(timeout=30)
            assert not job.is_alive()
        assert _images(out["response"]) == []
        assert json.loads(out["response"].json()["info"])["sdrt_skipped_runs"] == 1
        assert _images(c.post("/sdapi/v1/txt2img", json={**BODY, "n_iter": 2})) == want
