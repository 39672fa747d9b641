"""A1111's ``hr_checkpoint_name`` through the server: the hires pass on another model of the models folder, named as
``sd_model_checkpoint`` is (title, name with or without its hash; "Use same checkpoint": the first pass's). The
picture is the Python API's (``hires_checkpoint=``, which tests/pipelines/test_hires_checkpoint.py matches against
diffusers), the infotext says ``Hires checkpoint: name [hash]`` and /png-info reads it back; a name the server lacks,
or a model whose latents the first pass's cannot continue, is a 400 naming ``hr_checkpoint_name``."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
Image = pytest.importorskip("PIL.Image", reason="reading the PNGs needs Pillow")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
BODY = {"prompt": "a red cat", "negative_prompt": "blurry", "steps": 6, "seed": 5, "sampler_name": "Euler",
        "cfg_scale": 7, "width": 64, "height": 64, "enable_hr": True, "hr_scale": 2, "hr_second_pass_steps": 3,
        "denoising_strength": 0.5, "override_settings": {"sd_model_checkpoint": "tiny-sd15-dyn"}}
HIRES = dict(steps=6, seed=5, sampler="Euler", cfg=7, width=64, height=64, hires_scale=2, hires_steps=3,
             hires_denoise=0.5)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("hrckpt")
    for name in ("tiny-sd15-dyn", "tiny-sd15-dyn-b", "tiny-sdxl-dyn"):
        shutil.copytree(DATA / name, root / name)
    from test_serve_modules import _part

    (root / "VAE").mkdir()
    _part("first_stage_model.", root / "VAE" / "custom_vae.safetensors", strip=True)  # tiny-sd15's architecture
    with live_server(ServeConfig(models=root, backend="openvino")) as u:
        yield u


@pytest.fixture(scope="module")
def pipe():
    from backend_helpers import register

    from sdrt import pipelines

    register("openvino")
    with pipelines.load(DATA / "tiny-sd15-dyn", backend="openvino") as p:
        yield p


def _post(url: str, status: int = 200, **body) -> dict:
    r = httpx.post(f"{url}/sdapi/v1/txt2img", json={**BODY, **body}, timeout=300)
    assert r.status_code == status, r.text
    return r.json()


def _image(out: dict) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(out["images"][0]))).convert("RGB"))


@pytest.mark.parametrize("upscaler", ["Latent", "Lanczos"])
def test_hr_checkpoint_name_runs_the_second_pass_on_that_model(url, pipe, upscaler):
    models = httpx.get(f"{url}/sdapi/v1/sd-models", timeout=60).json()
    title = next(m["title"] for m in models if m["model_name"] == "tiny-sd15-dyn-b")
    out = _post(url, hr_checkpoint_name=title, hr_upscaler=upscaler)
    info = out["info"]
    assert f"Hires checkpoint: {title}" in info and "hr_checkpoint_name" not in info, info
    want = pipe("a red cat", "blurry", hires_upscaler=upscaler, hires_checkpoint=DATA / "tiny-sd15-dyn-b", **HIRES)[0]
    np.testing.assert_array_equal(_image(out), want)
    plain = pipe("a red cat", "blurry", hires_upscaler=upscaler, **HIRES)[0]
    assert not np.array_equal(want, plain)  # the other model made it
    # the name alone, without its hash, is the same model; /png-info reads the field back
    again = _post(url, hr_checkpoint_name="tiny-sd15-dyn-b", hr_upscaler=upscaler)
    np.testing.assert_array_equal(_image(again), want)
    back = httpx.post(f"{url}/sdapi/v1/png-info", json={"image": again["images"][0]}, timeout=60).json()
    assert back["parameters"]["Hires checkpoint"] == title and back["parameters"]["Model"] == "tiny-sd15-dyn"


def test_use_same_checkpoint_and_the_model_itself(url, pipe):
    plain = _post(url, hr_upscaler="Latent")
    same = _post(url, hr_upscaler="Latent", hr_checkpoint_name="Use same checkpoint")
    texts = [json.loads(o["info"])["infotexts"] for o in (plain, same)]
    assert texts[0] == texts[1] and "Hires checkpoint" not in same["info"]
    np.testing.assert_array_equal(_image(same), _image(plain))
    itself = _post(url, hr_upscaler="Latent", hr_checkpoint_name="tiny-sd15-dyn")
    np.testing.assert_array_equal(_image(itself), _image(plain))  # A1111 reloads nothing, and names it
    assert "Hires checkpoint: tiny-sd15-dyn [" in itself["info"]
    # without the hires fix A1111 reads it not at all
    one = _post(url, enable_hr=False, hr_checkpoint_name="no-such-model")
    assert "Hires" not in one["info"]


@pytest.mark.parametrize(("body", "words"), [
    ({"hr_checkpoint_name": "no-such-model"}, "no model named 'no-such-model'; this server has: "),
    ({"hr_checkpoint_name": "tiny-sdxl-dyn", "hr_upscaler": "Latent"},
     "hires checkpoint (tiny-sdxl-dyn) is SDXL and this model SD 1.x"),
    ({"hr_checkpoint_name": "tiny-sd15-dyn-b", "refiner_checkpoint": "tiny-sdxl-dyn"}, "hr_checkpoint_name and "
                                                                                       "refiner_checkpoint both"),
])
def test_bad_hr_checkpoint_name_is_a_400_naming_it(url, body, words):
    r = httpx.post(f"{url}/sdapi/v1/txt2img", json={**BODY, **body}, timeout=300)
    assert r.status_code == 400, r.text
    assert r.json().get("field") == "hr_checkpoint_name" and words in r.text, r.text
    assert "Traceback" not in r.text and "hires_checkpoint" not in r.text and str(DATA) not in r.text


def test_a_chosen_vae_is_said_to_apply_to_the_first_model(url):
    out = _post(url, hr_checkpoint_name="tiny-sd15-dyn-b", hr_upscaler="Latent",
                override_settings={"sd_model_checkpoint": "tiny-sd15-dyn", "sd_vae": "custom_vae.safetensors"})
    notes = json.loads(out["info"])["sdrt_not_honoured"]
    assert any("apply to the first pass's model; the hires checkpoint tiny-sd15-dyn-b runs its own" in n
               for n in notes), notes
    assert "VAE: custom_vae.safetensors" in out["info"]
