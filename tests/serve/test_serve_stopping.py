"""serve's stop (``sdrt.serve.stopping``): a stopped run answers with its partial images, and a partial that cannot
be decoded leaves the stop standing (the job keeps its finished images) instead of failing the request."""

from __future__ import annotations

import pytest

from sdrt import pipelines
from sdrt.errors import SdrtError
from sdrt.serve.stopping import generate_until_stopped


@pytest.fixture(scope="module")
def pipe(backends):
    p = pipelines.load(pipelines.DEMO_MODEL, backend="reference")
    yield p
    p.close()


def _run(pipe, wants_partial=lambda: True):
    """The demo model's 3-step job, stopped after its first step: (what generate_until_stopped gives, the steps)."""
    steps: list[int] = []
    out = generate_until_stopped(pipe, lambda: bool(steps), lambda step, total, x: steps.append(step),
                                 "a red circle", "", wants_partial, steps=3, seed=1)
    return out, steps


def test_a_stopped_run_gives_its_partial_images_unless_nobody_reads_them(pipe, monkeypatch) -> None:
    (gen, stopped), steps = _run(pipe)
    assert stopped and len(gen.images) == 1 and steps == [1]
    decoded = []
    monkeypatch.setattr(type(pipe), "_decode", lambda self, x: decoded.append(x) or [])
    assert _run(pipe, lambda: False)[0] == (None, True) and not decoded  # a client that left: no decode


def test_a_partial_that_cannot_be_decoded_leaves_the_stop_standing(pipe, monkeypatch, caplog) -> None:
    def fail(self, x):
        raise SdrtError("the VAE decoder failed", where="vae_decoder")

    monkeypatch.setattr(type(pipe), "_decode", fail)
    with caplog.at_level("WARNING", logger="sdrt.serve"):
        assert _run(pipe)[0] == (None, True)
    assert "partial images could not be decoded: the VAE decoder failed" in caplog.text
