"""A1111's ``refiner_checkpoint`` / ``refiner_switch_at`` through the server: tiny-sdxl with tiny-sdxl-refiner (a
model of the same models folder, named as A1111 names checkpoints) gives the pipeline's own image and writes
A1111's ``Refiner`` fields; bad values are a 400 naming the field."""

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


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("refiner")
    for name in ("tiny-sdxl", "tiny-sdxl-refiner", "tiny-sd15", "tiny-sdxl-dyn"):
        shutil.copytree(DATA / name, root / name)
    with live_server(ServeConfig(models=root, backend="openvino")) as u:
        yield u


def _txt2img(url: str, status: int = 200, **body) -> dict:
    r = httpx.post(f"{url}/sdapi/v1/txt2img", json={
        "prompt": "a red cat", "steps": 10, "seed": 5, "sampler_name": "Euler", "width": 64, "height": 64,
        "override_settings": {"sd_model_checkpoint": "tiny-sdxl"}, **body}, timeout=300)
    assert r.status_code == status, r.text
    return r.json()


def test_refiner_checkpoint_runs_the_refiner_as_the_api_does(url):
    from backend_helpers import register

    from sdrt import pipelines

    out = _txt2img(url, refiner_checkpoint="tiny-sdxl-refiner", refiner_switch_at=0.7)
    info = out["info"]
    assert "Refiner: tiny-sdxl-refiner [" in info and "Refiner switch at: 0.7" in info
    assert "refiner_checkpoint" not in info.split("sdrt_not_honoured")[-1]
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(out["images"][0]))).convert("RGB"))
    register("openvino")
    with pipelines.load(DATA / "tiny-sdxl", backend="openvino") as pipe:
        want = pipe("a red cat", steps=10, seed=5, sampler="Euler", width=64, height=64, cfg=7,
                    refiner=DATA / "tiny-sdxl-refiner", refiner_switch_at=0.7)[0]
    np.testing.assert_array_equal(got, want)


def test_refiner_switch_at_alone_changes_nothing(url):
    """A1111's example payload sends refiner_switch_at 0 with no refiner."""
    out = _txt2img(url, refiner_switch_at=0, refiner_checkpoint="")
    assert "Refiner" not in out["info"].split("sdrt_not_honoured")[0]


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"refiner_checkpoint": "tiny-sdxl-refiner", "refiner_switch_at": 1.5}, "refiner_switch_at", "above 0 and at most 1"),
    ({"refiner_checkpoint": "tiny-sdxl-refiner", "refiner_switch_at": 0}, "refiner_switch_at", "above 0 and at most 1"),
    ({"refiner_checkpoint": "tiny-sdxl-refiner", "enable_hr": True, "width": 64, "height": 64,
      "override_settings": {"hires_fix_refiner_pass": "third pass"}}, "hires_fix_refiner_pass",
     "must be one of first pass, second pass, both passes"),
    ({"refiner_checkpoint": "no-such-refiner"}, "refiner_checkpoint", "no model named"),
])
def test_bad_refiner_fields_are_a_400(url, body, field, words):
    r = httpx.post(f"{url}/sdapi/v1/txt2img", json={"prompt": "a cat", "steps": 2, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert words in r.text and field in r.text


def test_the_sdxl_refiner_after_sd15_is_refused(url):
    r = httpx.post(f"{url}/sdapi/v1/txt2img", json={
        "prompt": "a cat", "steps": 2, "override_settings": {"sd_model_checkpoint": "tiny-sd15"},
        "refiner_checkpoint": "tiny-sdxl-refiner"}, timeout=300)
    assert r.status_code == 400, r.text
    assert "SDXL refiner model and this model is SD 1.x" in r.text
    assert r.json()["field"] == "refiner_checkpoint"  # the request's field, not the Python API's refiner


def test_the_model_as_its_own_refiner_runs_no_refiner_as_a1111(url):
    """A1111's apply_refiner switches nothing when refiner_checkpoint is the loaded checkpoint; sdrt loaded a second
    copy of the model (twice its memory) to run the same weights, and wrote a Refiner field."""
    plain = _txt2img(url)
    out = _txt2img(url, refiner_checkpoint="tiny-sdxl", refiner_switch_at=0.5)
    assert out["images"][0] == plain["images"][0]
    assert "Refiner:" not in out["info"].split("sdrt_not_honoured")[0]
    assert "refiner_checkpoint: tiny-sdxl is the model itself" in out["info"]


def test_two_models_share_one_refiner_pipeline_counted_with_them(tmp_path):
    """The refiner is one of the worker's pipelines (counted in keep_models, as A1111 holds one refiner): two SDXL
    models refined in turn hold 3 pipelines and give the Python API's images; before, each base pipeline loaded a
    refiner of its own, out of sight of keep_models (2 models + 2 hidden refiners)."""
    from backend_helpers import register

    from sdrt import pipelines
    from sdrt.serve import ServeConfig

    for name in ("tiny-sdxl", "tiny-sdxl-refiner"):
        shutil.copytree(DATA / name, tmp_path / name)
    shutil.copytree(DATA / "tiny-sdxl", tmp_path / "tiny-sdxl-b")
    with live_server(ServeConfig(models=tmp_path, backend="openvino", keep_models=3)) as u:
        images = [_txt2img(u, refiner_checkpoint="tiny-sdxl-refiner", steps=4,
                           override_settings={"sd_model_checkpoint": m})["images"][0]
                  for m in ("tiny-sdxl", "tiny-sdxl-b", "tiny-sdxl")]
        workers = httpx.get(f"{u}/sdrt/status", timeout=60).json()["workers"]
    assert [w["models_loaded"] for w in workers] == [3]
    assert images[0] == images[2]
    pixels = [np.asarray(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB")) for b in images]
    np.testing.assert_array_equal(pixels[0], pixels[1])  # the same weights (the PNGs name their models)
    register("openvino")
    with pipelines.load(DATA / "tiny-sdxl", backend="openvino") as pipe:
        want = pipe("a red cat", steps=4, seed=5, sampler="Euler", width=64, height=64, cfg=7,
                    refiner=DATA / "tiny-sdxl-refiner")[0]
    np.testing.assert_array_equal(pixels[0], want)


@pytest.mark.parametrize("passes", [None, "first pass"])
def test_refiner_with_the_hires_fix_runs_as_the_api_does(url, passes):
    """enable_hr with refiner_checkpoint (refused before): the pipeline's image, A1111's Refiner fields, and its
    hires_fix_refiner_pass option (override_settings or /options) as hires_refiner_pass, named when not the default."""
    from backend_helpers import register

    from sdrt import pipelines

    hr = {"enable_hr": True, "hr_scale": 1.5, "hr_second_pass_steps": 3, "denoising_strength": 0.5,
          "hr_upscaler": "Lanczos"}
    over = {"sd_model_checkpoint": "tiny-sdxl-dyn", **({"hires_fix_refiner_pass": passes} if passes else {})}
    out = _txt2img(url, steps=6, refiner_checkpoint="tiny-sdxl-refiner", override_settings=over, **hr)
    info = out["info"].split("sdrt_not_honoured")[0]
    assert "Refiner: tiny-sdxl-refiner [" in info and "Refiner switch at: 0.8" in info
    assert ("Hires refiner" in info) == (passes is not None) and (not passes or f"Hires refiner: {passes}" in info)
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(out["images"][0]))).convert("RGB"))
    register("openvino")
    with pipelines.load(DATA / "tiny-sdxl-dyn", backend="openvino") as pipe:
        want = pipe("a red cat", steps=6, seed=5, sampler="Euler", width=64, height=64, cfg=7, hires_scale=1.5,
                    hires_steps=3, hires_denoise=0.5, hires_upscaler="Lanczos", refiner=DATA / "tiny-sdxl-refiner",
                    **({"hires_refiner_pass": passes} if passes else {}))[0]
    np.testing.assert_array_equal(got, want)


def test_hires_fix_refiner_pass_option_is_checked(url):
    r = httpx.post(f"{url}/sdapi/v1/options", json={"hires_fix_refiner_pass": "every pass"}, timeout=60)
    assert r.status_code == 400 and "hires_fix_refiner_pass must be one of" in r.text
    assert httpx.get(f"{url}/sdapi/v1/options", timeout=60).json()["hires_fix_refiner_pass"] == "second pass"


def test_refiner_switch_by_sample_steps_runs_as_the_api_does(url):
    """A1111's refiner_switch_by_sample_steps option, per request and server-wide: the switch counts denoiser calls
    (Heun: two a step), the pipeline's refiner_switch_by_steps=True image, and the infotext says so."""
    from backend_helpers import register

    from sdrt import pipelines

    body = dict(refiner_checkpoint="tiny-sdxl-refiner", refiner_switch_at=0.5, sampler_name="Heun", steps=6)
    out = _txt2img(url, override_settings={"sd_model_checkpoint": "tiny-sdxl", "refiner_switch_by_sample_steps": True},
                   **body)
    assert "Refiner switch by sampling steps: True" in out["info"]
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(out["images"][0]))).convert("RGB"))
    register("openvino")
    with pipelines.load(DATA / "tiny-sdxl", backend="openvino") as pipe:
        want = pipe("a red cat", steps=6, seed=5, sampler="Heun", width=64, height=64, cfg=7,
                    refiner=DATA / "tiny-sdxl-refiner", refiner_switch_at=0.5, refiner_switch_by_steps=True)[0]
        by_time = pipe("a red cat", steps=6, seed=5, sampler="Heun", width=64, height=64, cfg=7,
                       refiner=DATA / "tiny-sdxl-refiner", refiner_switch_at=0.5)[0]
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(want, by_time)  # the two rules switch at different calls here
    httpx.post(f"{url}/sdapi/v1/options", json={"refiner_switch_by_sample_steps": True}, timeout=60).raise_for_status()
    try:
        again = _txt2img(url, **body)
    finally:
        httpx.post(f"{url}/sdapi/v1/options", json={"refiner_switch_by_sample_steps": False},
                   timeout=60).raise_for_status()
    assert again["images"] == out["images"] and "Refiner switch by sampling steps: True" in again["info"]
    plain = _txt2img(url, **body)
    assert "Refiner switch by sampling steps" not in plain["info"]
    r = httpx.post(f"{url}/sdapi/v1/txt2img", json={"prompt": "x", "override_settings": {
        "refiner_switch_by_sample_steps": "often"}}, timeout=60)
    assert r.status_code == 422 and "override_settings.refiner_switch_by_sample_steps must be true or false" in r.text


def _pixels(out: dict) -> bytes:
    return Image.open(io.BytesIO(base64.b64decode(out["images"][0]))).convert("RGB").tobytes()


def test_refiner_switch_by_sample_steps_is_in_the_infotext_without_a_refiner(url):
    """A1111's apply_refiner (sd_samplers_common.py), called at every denoiser call, writes "Refiner switch by
    sampling steps: True" while the option is on before it looks for a refiner: a run without one says it too (and
    one whose refiner is the model itself, which A1111 never swaps in), its image the plain run's."""
    on = {"override_settings": {"sd_model_checkpoint": "tiny-sdxl", "refiner_switch_by_sample_steps": True}}
    plain = _txt2img(url, steps=3)
    alone = _txt2img(url, steps=3, **on)
    itself = _txt2img(url, steps=3, refiner_checkpoint="tiny-sdxl", **on)
    assert "Refiner switch by sampling steps" not in plain["info"]
    for out in (alone, itself):
        assert _pixels(out) == _pixels(plain)  # the PNG's own infotext differs
        assert "Refiner switch by sampling steps: True" in out["info"]
        assert json.loads(out["info"])["infotexts"][0].endswith("Refiner switch by sampling steps: True")
