"""The Ray Serve deployment on a local single-node Ray cluster (two replicas), answering the same
webuiapi calls (txt2img, img2img, options, progress, interrupt) as one server: a model switch, a
progress query and an interrupt reach every replica, whichever one Ray's proxy hands the request to.
Skipped without Ray; ``nox -s serve_ray`` runs it."""

from __future__ import annotations

import os
import threading
import time

import pytest
from serve_helpers import free_port, needs_server

pytestmark = needs_server
ray = pytest.importorskip("ray", reason="the Ray deployment needs Ray Serve: pip install 'sdrt[ray]' (nox -s serve_ray)")
pytest.importorskip("ray.serve", reason="the Ray deployment needs Ray Serve: pip install 'ray[serve]'")
webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
Image = pytest.importorskip("PIL.Image", reason="webuiapi needs Pillow")


@pytest.fixture(scope="module")
def ray_url(models_dir):
    from ray import serve

    from sdrt.serve import ServeConfig
    from sdrt.serve.ray_app import deployment

    port = free_port()
    # on a busy machine Ray's default 5 s proxy readiness check fails, and the controller restarts the
    # proxy with requests in flight; Ray's processes inherit these from this one
    for var in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        os.environ.setdefault(var, "60")
    # the replicas are new processes: they find the installed backends through entry points
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"SDRT_LOAD_ENTRY_POINTS": "1"}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(ServeConfig(models=models_dir, backend="openvino", devices=("CPU",)), replicas=2,
                             cpus_per_replica=0.5), name="sdrt", route_prefix="/")
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


def test_ray_deployment_answers_webuiapi(ray_url) -> None:
    api = webuiapi.WebUIApi(host="127.0.0.1", port=ray_url, sampler="Euler a", steps=10)
    r = api.txt2img(prompt="a red circle", seed=3, width=64, height=64, batch_size=2)
    assert len(r.images) == 2 and r.info["all_seeds"] == [3, 3] and r.info["sd_model_name"] == "demo-a"
    src = Image.new("RGB", (64, 64), (20, 40, 200))
    r = api.img2img(images=[src], prompt="a red circle", seed=3, width=64, height=64, denoising_strength=0.5)
    assert r.images[0].size == (64, 64) and r.info["denoising_strength"] == 0.5
    hosts = set()
    for _ in range(24):  # Ray's proxy spreads requests over both replicas
        hosts.add(api.txt2img(prompt="x", seed=1, width=64, height=64, steps=2).info["sdrt_host"])
        if len(hosts) == 2:
            break
    assert len(hosts) == 2, hosts
    api.util_set_model("demo-b")  # answered by one replica, seen by both
    for _ in range(6):
        assert api.util_get_current_model().startswith("demo-b")
        info = api.txt2img(prompt="x", seed=1, width=64, height=64, steps=2).info
        assert info["sd_model_name"] == "demo-b", info
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=api.txt2img(prompt="a blue square", seed=1, width=64, height=64,
                                                                 steps=150, n_iter=32)))
    t.start()
    seen = None
    deadline = time.time() + 60
    while time.time() < deadline:
        p = api.get_progress()
        if p["state"]["sampling_steps"] == 150 and p["progress"] > 0.02:  # the long job, under way
            seen = p
            break
        time.sleep(0.05)
    assert seen is not None and seen["state"]["sampling_steps"] == 150
    time.sleep(0.5)  # the running replica has reported to the shared state
    for _ in range(6):  # whichever replica answers knows the job
        p = api.get_progress()
        assert p["state"]["job_count"] == 32, p  # A1111's: the job's runs (n_iter)
    api.interrupt()
    t.join(timeout=120)
    assert "r" in out, "the interrupted request did not answer"
    assert out["r"].info["sdrt_interrupted"] is True and len(out["r"].images) < 32, out["r"].info
    assert len(api.txt2img(prompt="again", seed=2, width=64, height=64).images) == 1
