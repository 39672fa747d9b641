"""N concurrent txt2img requests on the demo model with one and with two workers: every request
answered once with its own seed, none lost or duplicated; prints queue depth, p50/p95 latency and
images per minute (``-s``; ``SDRT_SERVE_LOAD_N`` sets N, default 24)."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")

N = int(os.environ.get("SDRT_SERVE_LOAD_N", "24"))
STEPS = int(os.environ.get("SDRT_SERVE_LOAD_STEPS", "20"))


def _load(url: str, n: int) -> dict:
    depth: list[int] = []
    done = threading.Event()

    def watch() -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while not done.is_set():
                s = c.get("/sdrt/status").json()
                depth.append(s["queued"])
                time.sleep(0.01)

    def one(i: int) -> tuple[int, float, dict]:
        with httpx.Client(base_url=url, timeout=300) as c:
            t = time.perf_counter()
            r = c.post("/sdapi/v1/txt2img", json={"prompt": f"a red circle, request {i}", "seed": 1000 + i,
                                                  "width": 64, "height": 64, "steps": STEPS})
            return i, time.perf_counter() - t, {"status": r.status_code, **(json.loads(r.json()["info"])
                                                                                if r.status_code == 200 else {})}

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    with httpx.Client(base_url=url) as c:
        status = c.get("/sdrt/status").json()
    lat = sorted(r[1] for r in results)
    return {"results": results, "status": status, "wall": wall, "max_depth": max(depth, default=0),
            "p50": statistics.median(lat), "p95": lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))],
            "per_min": 60 * n / wall}


@pytest.mark.parametrize("devices", [("CPU",), ("CPU", "CPU")], ids=["1 worker", "2 workers"])
def test_concurrent_txt2img(models_dir, devices) -> None:
    from sdrt.serve import Limits, ServeConfig

    config = ServeConfig(models=models_dir, backend="openvino", devices=devices, limits=Limits(max_queue=N + 8))
    with live_server(config) as url:
        with httpx.Client(base_url=url, timeout=120) as c:  # warm every worker's pipeline first
            for _ in devices:
                c.post("/sdapi/v1/txt2img", json={"prompt": "warm up", "width": 64, "height": 64, "steps": 2})
        out = _load(url, N)
    results = out["results"]
    assert all(r[2]["status"] == 200 for r in results), [r for r in results if r[2]["status"] != 200][:3]
    # each request answered once, with the seed and prompt it asked for: nothing lost, nothing swapped
    assert sorted(r[2]["seed"] for r in results) == [1000 + i for i in range(N)]
    assert all(r[2]["prompt"] == f"a red circle, request {r[0]}" and r[2]["seed"] == 1000 + r[0] for r in results)
    assert len({r[2]["sdrt_task_id"] for r in results}) == N
    status = out["status"]
    assert status["submitted"] == N + len(devices) and status["queued"] == 0 and status["running"] == 0
    assert sum(w["jobs_done"] for w in status["workers"]) == N + len(devices)
    used = {r[2]["sdrt_worker"] for r in results}
    assert len(used) == len(devices), used  # every worker took jobs
    print(f"\n{len(devices)} worker(s) on {', '.join(devices)}: N={N} concurrent txt2img, {STEPS} steps, 64x64: "
          f"max queue depth {out['max_depth']}, p50 {out['p50']:.2f} s, p95 {out['p95']:.2f} s, "
          f"{out['per_min']:.0f} images/min (wall {out['wall']:.1f} s); per worker: "
          + ", ".join(f"{w['name']} {w['jobs_done']}" for w in status["workers"]))
