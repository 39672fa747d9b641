"""A job's later parts compile ahead on one background thread (sdrt.pipelines.ahead), on real OpenVINO and ggml: the
same sessions and the same image as compiling each part on first use, nothing compiled twice, and never where it could
change what the job holds (a tight budget, low-memory mode, a backend that does not compile this way)."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import DATA, register  # noqa: E402

from sdrt import pipelines  # noqa: E402
from sdrt.errors import SdrtError  # noqa: E402
from sdrt.pipelines import ahead  # noqa: E402

KW = dict(width=64, height=64, steps=2, seed=3)


@pytest.fixture(scope="module")
def backend():
    register("openvino")
    from sdrt_openvino.backend import OpenVINOBackend

    assert OpenVINOBackend.compiles_beside  # what the rest of this file relies on
    return OpenVINOBackend


@pytest.fixture(scope="module", params=["openvino", "ggml"])
def each(request):
    """(name, backend class) of each backend that compiles beside another compile or run."""
    register(request.param)
    from sdrt.runtime import select

    be, _ = select(request.param)
    assert type(be).compiles_beside
    return request.param, type(be)


def _threads(caplog) -> dict[str, str]:
    """``{part: thread}`` of each ``compiling <part> for ...`` line."""
    return {r.getMessage().split()[1]: r.threadName for r in caplog.records
            if r.name == "sdrt.pipelines.parts" and r.getMessage().startswith("compiling ")}


def test_the_later_parts_compile_ahead_once_and_the_image_is_the_same(each, tmp_path, monkeypatch, caplog):
    name, backend = each
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    caplog.set_level(logging.INFO)
    with pipelines.load(DATA / "tiny-sd15", backend=name) as pipe:
        got = pipe.generate("a cat", **KW)
        assert {n: len(p.sessions) for n, p in pipe._parts.items()} == \
            {"text_encoder": 1, "unet": 1, "vae_decoder": 1, "vae_encoder": 0}
        assert all(p._ahead is None for p in pipe._parts.values())
        again = pipe.generate("a cat", **KW)  # compiled: nothing more to do ahead
        assert all(len(p.sessions) <= 1 for p in pipe._parts.values())
    threads = _threads(caplog)
    # the UNet on the thread started for it; the VAE there too or on the job's thread, which takes it over while it
    # waits for the UNet (Ahead.help)
    assert threads["text_encoder"] == "MainThread" and threads["unet"] == "sdrt-compile-ahead", threads
    assert sorted(threads) == ["text_encoder", "unet", "vae_decoder"], threads
    assert not [t for t in threading.enumerate() if t.name == "sdrt-compile-ahead"]
    caplog.clear()
    monkeypatch.setattr(backend, "compiles_beside", False)
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "other"))
    with pipelines.load(DATA / "tiny-sd15", backend=name) as pipe:
        alone = pipe.generate("a cat", **KW)
    assert set(_threads(caplog).values()) == {"MainThread"}
    assert np.array_equal(got.images[0], alone.images[0]) and np.array_equal(got.images[0], again.images[0])


def test_the_compiles_made_ahead_are_stored_after_the_job(backend, tmp_path, monkeypatch):
    """Their cache entries are held with the job's (stored after it) and a second process's pipeline finds them."""
    from sdrt.cache import wait_for_stores

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    with pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        pipe.generate("a cat", **KW)
    wait_for_stores()
    entries = [p for p in (tmp_path / "compiled" / "openvino").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 3, entries


def _plan_of(pipe, **kw):
    calls = pipe._job_calls("a cat", "", dict(KW, **kw))
    pipe._apply_memory_plan(calls, extras=pipe._job_extras, beside=pipe._job_beside)
    return ahead.plan_ahead(pipe, calls, pipe._job_outputs)


def test_what_compiles_ahead_and_when_nothing_does(backend, monkeypatch):
    with pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        assert [(p.name, s) for p, s in _plan_of(pipe)] == [
            ("unet", {"sample": (2, 4, 8, 8), "timestep": (2,), "encoder_hidden_states": (2, 77, 32)}),
            ("vae_decoder", {"latent_sample": (1, 4, 8, 8)})]
        plan = pipe.memory_plan()
    # a budget that releases parts after use: nothing ahead (two compiles at once would hold both)
    with pipelines.load(DATA / "tiny-sd15", backend="openvino",
                        memory=int(plan.base_bytes + (plan.peak_bytes - plan.base_bytes) / 2)) as pipe:
        pipe.memory = int(pipe.memory_plan().base_bytes + (plan.peak_bytes - plan.base_bytes) / 2)
        assert _plan_of(pipe) == [] and any(p.placement != "resident" for p in pipe.memory_plan().parts)
    # every part resident, but no room for a second compile's transient (the largest part's weights) beside the peak
    largest = max(p.weight_bytes for p in plan.parts)
    for room, ahead_of in ((largest // 2, []), (largest + largest // 2, ["unet", "vae_decoder"])):
        with pipelines.load(DATA / "tiny-sd15", backend="openvino", memory=plan.peak_bytes) as pipe:
            pipe.memory = int(pipe.memory_plan().base_bytes + (plan.peak_bytes - plan.base_bytes) + room)
            assert [p.name for p, _ in _plan_of(pipe)] == ahead_of
            assert all(p.placement == "resident" for p in pipe.memory_plan().parts)
    with pipelines.load(DATA / "tiny-sd15", backend="openvino", low_memory=True) as pipe:
        assert _plan_of(pipe) == []
    monkeypatch.setattr(backend, "compiles_beside", False)
    with pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        assert _plan_of(pipe) == []


def test_a_thread_waiting_for_one_compile_takes_over_those_not_started(backend):
    """The job's thread, waiting for the UNet, compiles the VAE decoder itself instead of idling (the background
    thread is not started here: the UNet's compile is taken as if it had started it)."""
    with pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        unet, vae = pipe._parts["unet"], pipe._parts["vae_decoder"]
        job = ahead.Ahead([(unet, {"sample": (2, 4, 8, 8), "timestep": (2,), "encoder_hidden_states": (2, 77, 32)}),
                           (vae, {"latent_sample": (1, 4, 8, 8)})])
        running = job._take()
        assert running is not None and running[0] is unet
        job.help(running[2])  # this thread waits for the UNet: it compiles the VAE decoder meanwhile
        assert len(vae.sessions) == 1 and vae._ahead.done.is_set() and not running[2].done.is_set()
        assert unet.sessions == {}
        job.stop()  # never started: nothing to wait for; what it holds is released
        assert unet._ahead is None and vae._ahead is None
        unet.session({"sample": (2, 4, 8, 8), "timestep": (2,), "encoder_hidden_states": (2, 77, 32)})  # no wait


def test_a_compile_that_fails_ahead_fails_where_the_part_is_used(backend):
    """The error is raised by the job's own call, as without the thread, and the thread is gone."""
    with pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        unet = pipe._parts["unet"]
        wrong = {"sample": (2, 4, 8), "timestep": (2,), "encoder_hidden_states": (2, 77, 32)}  # a rank short
        job = ahead.Ahead([(unet, wrong)]).start()
        with pytest.raises(SdrtError) as ahead_error:
            unet.session(wrong)  # waits for the compile ahead, then compiles itself
        job.stop()
        with pytest.raises(SdrtError) as own_error:
            unet.session(wrong)
        assert str(ahead_error.value) == str(own_error.value) and unet.sessions == {} and unet._ahead is None


def test_a_failed_job_leaves_no_compile_running(backend):
    """A job stopped by its callback at the first step: the thread is waited for and the parts are free."""
    def stop(*_):
        raise KeyboardInterrupt

    with pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        with pytest.raises(KeyboardInterrupt):
            pipe.generate("a cat", callback=stop, **KW)
        assert not [t for t in threading.enumerate() if t.name == "sdrt-compile-ahead"]
        assert all(p._ahead is None for p in pipe._parts.values())
        assert len(pipe._parts["unet"].sessions) == 1 and len(pipe._parts["vae_decoder"].sessions) <= 1
        pipe.generate("a cat", **KW)
        assert len(pipe._parts["vae_decoder"].sessions) == 1
