"""A1111's img2img with a mask on a FLUX.1 Fill model is inpainting (tests/data/pipelines/tiny-flux-fill, whose
images match diffusers' FluxFillPipeline in tests/flow/test_flux_tools.py): the served picture equals the Python
API's for the same settings, and a Fill model asked for txt2img is a 400 naming the mask."""

from __future__ import annotations

import base64
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

from sdrt import pipelines

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

PIPES = Path(__file__).resolve().parents[1] / "data" / "pipelines"
sys.path.insert(0, str(PIPES.parent.parent / "flow"))
from flow_helpers import tool_folder  # noqa: E402

CASE = "fill-96x64-g10"


@pytest.fixture(scope="module")
def fill_models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fill-models")
    tool_folder("fill", root)
    return root


@pytest.fixture(scope="module")
def fill_server(fill_models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=fill_models, backend="openvino")) as url:
        yield url


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_img2img_with_a_mask_on_a_fill_model_is_inpainting(fill_server, fill_models) -> None:
    refs = np.load(PIPES / "tiny-flux-fill" / "refs.npz")
    init, mask = refs[f"{CASE}/init_image"], refs[f"{CASE}/mask"]
    body = dict(prompt="a red cat", init_images=[_b64(init)], mask=_b64(mask), mask_blur=0, denoising_strength=1.0,
                steps=2, seed=5, sampler_name="Euler", cfg_scale=1, width=64, height=96)
    r = requests.post(f"{fill_server}/sdapi/v1/img2img", json=body, timeout=300)
    assert r.status_code == 200, r.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
    info = json.loads(r.json()["info"])
    assert "Distilled CFG Scale: 30" in info["infotexts"][0]  # FluxFillPipeline's default guidance
    with pipelines.load(fill_models / "tiny-flux-fill", backend="openvino") as pipe:
        want = pipe("a red cat", init_image=init, mask=mask, strength=1.0, steps=2, seed=5, sampler="Euler", cfg=1,
                    mask_overlay=True)[0]  # serve's A1111 routes paste the picture back, as A1111 and Forge do
    assert int(np.abs(got.astype(int) - want.astype(int)).max()) == 0
    r = requests.post(f"{fill_server}/sdapi/v1/txt2img", json=dict(prompt="a cat", steps=1, width=64, height=64),
                      timeout=300)
    assert r.status_code == 400 and "Fill" in r.text and "mask" in r.text, r.text


def test_a_canny_depth_model_served_says_what_serve_cannot_do_in_its_own_words(tmp_path) -> None:
    """A FLUX.1 Canny/Depth model's control image has no A1111 field here (docs/flow-families.md): the 400 says so and
    how to run it; it told a client to "pass control_image= (or --control-image PNG ...)", neither a JSON field."""
    from sdrt.serve import ServeConfig

    tool_folder("control", tmp_path)
    with live_server(ServeConfig(models=tmp_path, backend="openvino")) as url:
        r = requests.post(f"{url}/sdapi/v1/txt2img", json=dict(prompt="a cat", steps=1, width=64, height=64),
                          timeout=300)
    assert r.status_code == 400, r.text
    e = r.json()
    assert "Canny/Depth" in e["message"] and "sdrt serve does not pass a control image" in e["message"], e
    assert "--control-image PNG" not in e["message"] and e["field"] == "alwayson_scripts", e


def test_openai_generations_on_a_model_that_needs_a_picture_sends_it_to_edits(fill_server) -> None:
    """OpenAI's generations route takes no picture: a Fill model's refusal names the edits route and its fields
    (image, mask), where it said "pass init_images and mask", A1111's fields, which this route has not."""
    r = requests.post(f"{fill_server}/v1/images/generations", json=dict(prompt="a cat", size="64x64"), timeout=300)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert "init_images" not in e["message"] and "/v1/images/edits" in e["message"], e
    assert "image and mask" in e["message"] and e["param"] == "mask", e


def test_a_latent_fill_on_a_flux_model_names_inpainting_fill(fill_server) -> None:
    """inpainting_fill 2 / 3 (A1111's latent noise / nothing) on a Flux model: the pipeline refuses its masked_content,
    and the 400 names the request's field, inpainting_fill, never the pipeline's argument."""
    refs = np.load(PIPES / "tiny-flux-fill" / "refs.npz")
    init, mask = refs[f"{CASE}/init_image"], refs[f"{CASE}/mask"]
    for fill in (2, 3):
        body = dict(prompt="a red cat", init_images=[_b64(init)], mask=_b64(mask), mask_blur=0, inpainting_fill=fill,
                    steps=1, seed=5, width=64, height=96)
        r = requests.post(f"{fill_server}/sdapi/v1/img2img", json=body, timeout=300)
        assert r.status_code == 400 and r.json()["field"] == "inpainting_fill", r.text
        assert "masked_content" not in r.json()["message"] and "inpainting_fill" in r.json()["message"], r.text
