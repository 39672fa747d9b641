"""sdrt's images against diffusers' own torch pipelines, same seed, sampler, steps and CFG.

Tolerance: at most 1 (of 255) in any channel, and at most 0.5 % of values off at all. The references
are diffusers' float32 torch images rounded to uint8. sdrt runs the same float32 arithmetic with other
kernels (the ONNX reference evaluator, OpenVINO), so latents differ by about 1e-6 relative and a value
that falls close to a rounding boundary can round the other way: off by one in a few pixels. Any
difference in the formulas (schedule, noise stream, guidance, VAE sampling) shows as tens of levels
over most of the image (seen while building this: 5-72), so this bound separates the two cleanly.
Measured: max 1, mean absolute difference at most 0.0005 on every case and backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_helpers import DATA, FOLDERS, call_kwargs, cases, refs, register

from sdrt import pipelines

#: the reference backend (the ONNX reference evaluator) is slow: it runs a few cases that cover every sampler,
#: mode and folder between them; OpenVINO runs them all
REFERENCE_CASES = {
    "tiny-sd15": {"txt2img/DPM++ 2M Karras", "img2img/Euler a", "inpaint-blend/Euler", "txt2img/Euler/cfg1"},
    "tiny-sd15-inpaint": {"inpaint/Euler a/strength 0.7"},
    "tiny-sd2v": {"txt2img/DDIM"},
    "tiny-sdxl": {"txt2img/Euler a"},
}
GGML_VAE = ("ggml aborts the process (GGML_ASSERT(ggml_is_padded_1d(a)) in ggml.c) on the VAE's mid-block "
            "attention MatMul [1,1,64,16]x[1,1,16,64]; reported to the ggml plugin's owner")

_PIPES: dict[tuple[str, str], pipelines.Pipeline] = {}


def _pipe(folder: str, backend: str) -> pipelines.Pipeline:
    key = (folder, backend)
    if key not in _PIPES:
        _PIPES[key] = pipelines.load(DATA / folder, backend=backend)
    return _PIPES[key]


def _params():
    for folder in FOLDERS:
        for k, case in enumerate(cases(folder)):
            for backend in ("reference", "openvino", "ggml"):
                if backend == "reference" and case["name"] not in REFERENCE_CASES[folder]:
                    continue
                if backend == "ggml" and k > 0:  # one (expected to fail) case per folder says where ggml stands
                    continue
                marks = [pytest.mark.xfail(run=False, reason=GGML_VAE)] if backend == "ggml" else []
                yield pytest.param(folder, case["name"], backend, id=f"{folder}:{case['name']}:{backend}", marks=marks)


@pytest.fixture(scope="module", autouse=True)
def _close_pipes():
    yield
    for p in _PIPES.values():
        p.close()
    _PIPES.clear()


@pytest.mark.parametrize(("folder", "name", "backend"), list(_params()))
def test_image_matches_diffusers(folder: str, name: str, backend: str) -> None:
    register(backend)
    case = next(c for c in cases(folder) if c["name"] == name)
    ref = refs(folder)
    images = _pipe(folder, backend)(case["prompt"], case["negative_prompt"], **call_kwargs(case, ref))
    got = np.stack(images).astype(np.int16)
    want = ref[name].astype(np.int16)
    assert got.shape == want.shape
    diff = np.abs(got - want)
    assert diff.max() <= 1, f"max difference {diff.max()}, mean {diff.mean():.4f}"
    assert (diff > 0).mean() <= 0.005, f"{(diff > 0).mean():.2%} of values differ"


def test_text_encoder_and_unet_on_ggml_match_the_reference_backend() -> None:
    """What ggml can run of the pipeline (its VAE aborts, see GGML_VAE): text encoder and UNet outputs."""
    register("reference")
    register("ggml")
    rng = np.random.default_rng(0)
    ref = pipelines.load(DATA / "tiny-sd15", backend="reference")
    gg = pipelines.load(DATA / "tiny-sd15", backend="ggml")
    ids = np.asarray([[49406, 320, 1125, 539, 320, 736] + [49407] * 71], np.int64) % 1514
    feeds = {"sample": rng.standard_normal((2, 4, 8, 8)).astype(np.float32),
             "timestep": np.array([500.0, 500.0], np.float32),
             "encoder_hidden_states": rng.standard_normal((2, 77, 32)).astype(np.float32)}
    try:
        for part, inputs, outputs in (("text_encoder", {"input_ids": ids}, ("last_hidden_state",)),
                                      ("unet", feeds, ())):
            a = getattr(ref, part).run(inputs, outputs)
            b = getattr(gg, part).run(inputs, outputs)
            for name in a:
                np.testing.assert_allclose(b[name], a[name], rtol=1e-3, atol=1e-3, err_msg=f"{part} {name}")
    finally:
        ref.close()
        gg.close()
