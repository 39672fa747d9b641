"""A1111's hires. fix fields through the server with webuiapi: ``hr_resize_x`` / ``hr_resize_y``,
``hr_sampler_name`` / ``hr_scheduler`` / ``hr_prompt`` / ``hr_negative_prompt`` honoured (they were named in
``sdrt_not_honoured``), and a second pass at the first pass's size dropped, as A1111 drops it.

Each picture is the Python API's run with the same settings (tests/pipelines/test_hires_a1111.py composes those
from separate txt2img, Pillow and img2img calls); tiny-sdxl-dyn has dynamic sizes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

from sdrt import pipelines

pytestmark = needs_server
webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
Image = pytest.importorskip("PIL.Image", reason="webuiapi needs Pillow")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
BASE = dict(prompt="a cat", negative_prompt="blurry", steps=6, seed=3, sampler_name="Euler", cfg_scale=7.0,
            width=64, height=96, alwayson_scripts={})


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("hires")
    shutil.copytree(DATA / "tiny-sdxl-dyn", root / "tiny-sdxl-dyn")
    with live_server(ServeConfig(models=root, backend="openvino")) as url:
        host, port = url.rsplit("//", 1)[1].split(":")
        yield webuiapi.WebUIApi(host=host, port=int(port))


@pytest.fixture(scope="module")
def pipe():
    with pipelines.load(DATA / "tiny-sdxl-dyn", backend="openvino") as p:
        yield p


def _notes(res) -> list[str]:
    return res.info.get("sdrt_not_honoured", [])


def test_hr_resize_and_second_pass_settings_are_honoured(api, pipe) -> None:
    res = api.txt2img(enable_hr=True, hr_scale=2, hr_resize_x=128, hr_resize_y=128, hr_upscaler="Lanczos",
                      hr_second_pass_steps=4, denoising_strength=0.5, hr_sampler_name="DPM++ 2M",
                      hr_scheduler="Karras", hr_prompt="a dog", hr_negative_prompt="ugly", **BASE)
    assert not [n for n in _notes(res) if n.startswith("hr_")], _notes(res)
    got = np.asarray(res.image.convert("RGB"))
    assert got.shape == (128, 128, 3)
    text = res.info["infotexts"][0]
    for field in ("Hires resize: 128x128", "Hires sampler: DPM++ 2M", "Hires schedule type: Karras",
                  "Hires prompt: a dog", "Hires negative prompt: ugly", "Denoising strength: 0.5"):
        assert field in text, text
    assert "Hires upscale:" not in text
    want = pipe("a cat", "blurry", steps=6, seed=3, sampler="Euler", cfg=7, width=64, height=96, hires_width=128,
                hires_height=128, hires_upscaler="Lanczos", hires_steps=4, hires_denoise=0.5, hires_sampler="DPM++ 2M",
                hires_schedule="Karras", hires_prompt="a dog", hires_negative_prompt="ugly")[0]
    assert np.array_equal(got, want)
    # a second checkpoint this server lacks: a 400 naming the field and the models it has
    # (tests/serve/test_serve_hires_checkpoint.py runs one it has)
    import httpx

    body = {k: v for k, v in BASE.items() if k != "alwayson_scripts"}
    r = httpx.post(f"{api.baseurl}/txt2img", json={**body, "enable_hr": True, "hr_resize_x": 128,
                                                   "hr_checkpoint_name": "other"}, timeout=120)
    assert r.status_code == 400 and r.json().get("field") == "hr_checkpoint_name", r.text
    assert "no model named 'other'; this server has: tiny-sdxl-dyn [" in r.text
    # hr_resize_x alone: the height follows the aspect ratio (128 * 96 // 64 = 192)
    one = api.txt2img(enable_hr=True, hr_resize_x=128, hr_upscaler="Latent", hr_second_pass_steps=2, **BASE)
    assert one.image.size == (128, 192) and "Hires resize: 128x0" in one.info["infotexts"][0]


def test_a_second_pass_at_the_same_size_does_nothing(api, pipe) -> None:
    """A1111: hr_scale 1 (or a resize to the first pass's size) sets enable_hr False: one pass, no hires fields."""
    plain = api.txt2img(**BASE)
    for extra in ({"hr_scale": 1}, {"hr_resize_x": 64, "hr_resize_y": 96}, {"hr_resize_x": 64}):
        res = api.txt2img(enable_hr=True, denoising_strength=0.5, hr_upscaler="Lanczos", **{**BASE, **extra})
        text = res.info["infotexts"][0]
        assert "Hires" not in text and "Denoising strength" not in text, (extra, text)
        assert np.array_equal(np.asarray(res.image), np.asarray(plain.image)), extra
        assert _notes(res) == [], _notes(res)
    # width and height left to the model (its own 64x64): a resize to that size is no pass either
    own = {**BASE, "width": None, "height": None}
    one = api.txt2img(**own)
    res = api.txt2img(enable_hr=True, hr_resize_x=64, hr_upscaler="Lanczos", denoising_strength=0.5, **own)
    assert "Hires" not in res.info["infotexts"][0] and np.array_equal(np.asarray(res.image), np.asarray(one.image))
    # the Python API keeps its second pass at hires_scale=1 (docs/pipelines.md): it is another picture
    twice = pipe("a cat", "blurry", steps=6, seed=3, sampler="Euler", cfg=7, width=64, height=96, hires_scale=1,
                 hires_upscaler="Lanczos", hires_denoise=0.5)[0]
    assert not np.array_equal(twice, np.asarray(plain.image.convert("RGB")))


def test_bad_hires_fields_are_a_400_naming_them(api) -> None:
    import httpx

    url = f"{api.baseurl}/txt2img"
    body = {k: v for k, v in BASE.items() if k != "alwayson_scripts"}
    for extra, field in (({"hr_sampler_name": "Nope"}, "hr_sampler_name"), ({"hr_scheduler": "wobbly"}, "hr_scheduler"),
                         ({"hr_resize_x": -8}, "hr_resize_x"), ({"hr_resize_x": 4096}, "hr_resize_x")):
        r = httpx.post(url, json={**body, "enable_hr": True, **extra}, timeout=120)
        assert r.status_code == 400 and r.json().get("field") == field, (extra, r.text)
        assert "Traceback" not in r.text and "hires_" not in json.dumps(r.json()), r.text


@pytest.mark.parametrize(("extra", "field", "said"), [
    ({"hr_scale": 8.0}, "hr_scale", "hires. fix at hr_scale 8 makes 4096x4096"),
    ({"hr_resize_x": 4096}, "hr_resize_x", "hires. fix at hr_resize 4096x0 makes 4096x4096"),
    ({"hr_resize_y": 3000, "hr_resize_x": 256}, "hr_resize_x", "hires. fix at hr_resize 256x3000 upscales the picture "
                                                               "to 3000x3000")])
def test_a_hires_size_above_the_servers_limit_is_a_400_naming_its_field(api, extra, field, said) -> None:
    """A hires. fix past the server's 2048x2048: a 400 saying the size as the request set it and naming that field
    (hr_scale, or the hr_resize side that was set), before anything runs."""
    import httpx

    body = {"prompt": "a cat", "width": 512, "height": 512, "steps": 1, "enable_hr": True, **extra}
    r = httpx.post(f"{api.baseurl}/txt2img", json=body, timeout=60)
    assert r.status_code == 400, r.text
    e = r.json()
    text = json.dumps(e)
    assert said in text and "above this server's limit of 2048x2048" in text, text
    assert e.get("field") == field, text
