"""What real clients do beyond the happy path, against a live server: a client that goes away mid-job."""

from __future__ import annotations

import json
import threading
import time

import pytest
from serve_helpers import needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")

OK = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 3, "seed": 1}
LONG = {**OK, "steps": 150, "n_iter": 32}  # ~10 s on a 2-core CPU


def _info(r) -> dict:
    assert r.status_code == 200, r.text
    return json.loads(r.json()["info"])


def _status(client) -> dict:
    return client.get("/sdrt/status").json()


def _wait(pred, seconds: float = 60) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_a_client_that_disconnects_frees_the_worker(server) -> None:
    """A client that gives up (a timeout, a closed browser tab) has its job stopped at the next step, and a job it
    left in the queue never runs: before, both ran to the end while every later request waited."""
    with httpx.Client(base_url=server, timeout=120) as client:
        client.post("/sdapi/v1/txt2img", json=OK)  # compiled and warm
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server}/sdapi/v1/txt2img", json=LONG, timeout=1.0)
        assert _wait(lambda: _status(client)["running"] == 0, 10), "the abandoned job kept running"
        start = time.time()
        assert client.post("/sdapi/v1/txt2img", json=OK).status_code == 200
        assert time.time() - start < 5

        # a queued job whose client goes away: it is dropped when the worker reaches it
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=client.post("/sdapi/v1/txt2img",
                                                                     json={**LONG, "force_task_id": "keeper"})))
        t.start()
        assert _wait(lambda: _status(client)["running"] == 1)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server}/sdapi/v1/txt2img", json={**LONG, "force_task_id": "leaver"}, timeout=0.5)
        client.post("/sdapi/v1/interrupt")
        t.join(timeout=60)
        assert _info(out["r"])["sdrt_interrupted"] is True
        assert _wait(lambda: client.post("/internal/progress", json={"id_task": "leaver"}).json()["completed"], 10)
        assert client.post("/internal/progress", json={"id_task": "leaver"}).json()["textinfo"] == "interrupted"
        assert _status(client)["running"] == 0 and _status(client)["queued"] == 0
