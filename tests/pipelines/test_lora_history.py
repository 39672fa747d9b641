"""The same request gives the same image whatever ran before: a LoRA's image does not depend on whether the part was
first compiled with the LoRA merged or had it bound later onto a live session (docs/pipelines.md, "LoRA").

On OpenVINO a session rebound to new weights runs the swappable form, which feeds biases and norm vectors as inputs
that the CPU plugin adds after the kernel instead of fusing them: a part first compiled with a merged LoRA was 1 level
(of 255) off the same LoRA bound later at float32, up to 22 levels at bf16. Every installed backend is held to it.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from pipeline_helpers import DATA, register

from sdrt import pipelines

LORA = DATA.parent / "ckpt" / "pipe-sd15" / "tinylora.safetensors"
KW = dict(steps=3, cfg=7.0, sampler="Euler", seed=7, width=64, height=64)


def _image(pipe, loras) -> np.ndarray:
    pipe.set_loras(loras)
    return np.asarray(pipe("a red cat on a mat", "blurry", **KW)[0])


@pytest.mark.parametrize(("backend", "precision", "low_memory"), [
    ("reference", "fp32", False), ("ggml", "fp32", False), ("ggml", "default", False), ("openvino", "fp32", False),
    ("openvino", "default", False),
    ("openvino", "default", True)])
def test_a_lora_job_is_the_same_first_in_a_fresh_pipeline_and_after_other_jobs(backend, precision, low_memory,
                                                                                 monkeypatch):
    if precision == "default":  # the device's own (bf16 on a CPU with AVX-512-BF16 or AMX: OpenVINO 22 levels off before)
        monkeypatch.delenv("SDRT_PRECISION", raising=False)
    register(backend)
    with pipelines.load(DATA / "tiny-sd15", backend=backend, low_memory=low_memory) as pipe:
        first = _image(pipe, [(LORA, 1.0)])  # the UNet and text encoder first compiled with the LoRA
        plain = _image(pipe, [])
        after_plain = _image(pipe, [(LORA, 1.0)])
        _image(pipe, [(LORA, 0.4)])  # another LoRA set
        after_other = _image(pipe, [(LORA, 1.0)])
        assert np.abs(first.astype(int) - plain.astype(int)).mean() > 1  # the LoRA shows
    with pipelines.load(DATA / "tiny-sd15", backend=backend, low_memory=low_memory) as pipe:
        fresh_plain = _image(pipe, [])
    for what, got in (("after a job without a LoRA", after_plain), ("after another LoRA", after_other)):
        diff = np.abs(first.astype(int) - got.astype(int))
        assert diff.max() == 0, f"{backend}: the LoRA job {what} is {diff.max()} levels off the first ({(diff > 0).sum()} values)"
    assert np.array_equal(plain, fresh_plain), "a job without a LoRA after one with it differs from a fresh pipeline's"


def test_a_lora_active_at_the_first_compile_is_compiled_in_once_on_openvino(caplog):
    """OpenVINO offers the rebound program at once (``rebind_options``): a part compiled while a LoRA is active is
    compiled with the merged weights in the swappable form, not compiled plain and then rebound, which kept both
    forms resident (a full-size SD 1.5 single file with a LoRA peaked at 9.8 GB against 3.9 GB without)."""
    register("openvino")
    with caplog.at_level(logging.INFO), pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        _image(pipe, [(LORA, 1.0)])
        unet = next(iter(pipe.unet.sessions.values()))
        rebound = [r.getMessage() for r in caplog.records if r.getMessage().startswith("updated ")]
        assert not rebound, f"a part was compiled and then rebound: {rebound}"
        assert unet._rebinder is not None, "the UNet was not compiled in the swappable form"  # swap.Rebinder
        caplog.clear()
        _image(pipe, [(LORA, 0.4)])  # a later change of the LoRA set rebinds the live session, as before
        assert any("updated " in r.getMessage() and "weightless import" in r.getMessage() for r in caplog.records)


@pytest.mark.xfail(strict=True, reason="kept: a checkpoint bound on live OpenVINO sessions runs the swappable form, "
                   "one bound before the first job the default compile (24 levels apart at bf16 on tiny SD 1.x); the "
                   "swappable form there measured 1.32x the first image's time (docs/openvino.md, 'A checkpoint bound "
                   "before the first job stays in the default form')")
def test_a_checkpoint_job_is_the_same_bound_before_the_first_job_and_after_one(monkeypatch):
    monkeypatch.delenv("SDRT_PRECISION", raising=False)
    register("openvino")
    ckpt = DATA.parent / "ckpt" / "pipe-sd15" / "custom.safetensors"
    with pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        pipe.load_weights(ckpt)
        before = _image(pipe, [])
    with pipelines.load(DATA / "tiny-sd15", backend="openvino") as pipe:
        _image(pipe, [])
        pipe.load_weights(ckpt)
        after = _image(pipe, [])
    assert np.array_equal(before, after)
