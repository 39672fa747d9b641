"""A1111's hires. fix (``enable_hr``) and variation seeds (``subseed_strength``) through the server, on a
model folder whose graphs take any size (tiny-sdxl-dyn): the second pass makes the upscaled image, and the
infotext says what ran, as A1111 writes it."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
Image = pytest.importorskip("PIL.Image", reason="reading the PNGs needs Pillow")

FOLDER = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sdxl-dyn"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("dyn")
    shutil.copytree(FOLDER, root / "tiny-sdxl-dyn")
    with live_server(ServeConfig(models=root, backend="openvino")) as u:
        yield u


def _txt2img(url: str, **body) -> dict:
    r = httpx.post(f"{url}/sdapi/v1/txt2img", json={"prompt": "a red cat", "steps": 3, "width": 64, "height": 64,
                                                    "seed": 5, "sampler_name": "Euler", **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_enable_hr_runs_the_second_pass_at_the_upscaled_size(url):
    out = _txt2img(url, enable_hr=True, hr_scale=1.5, hr_second_pass_steps=2, denoising_strength=0.5,
                   hr_upscaler="Latent (bicubic)")
    image = Image.open(io.BytesIO(base64.b64decode(out["images"][0])))
    assert image.size == (96, 96)
    info = out["info"]
    assert "Hires upscale: 1.5" in info and "Hires steps: 2" in info and "Hires upscaler: Latent (bicubic)" in info
    assert "enable_hr" not in info  # honoured, so not listed as not honoured


def test_an_upscaler_model_sdrt_lacks_is_named_and_lanczos_runs(url):
    """An image upscaler for an image upscaler (Latent ran, blurred at the low denoising such clients send)."""
    out = _txt2img(url, enable_hr=True, hr_scale=1.5, hr_upscaler="R-ESRGAN 4x+")
    assert "hr_upscaler: 'R-ESRGAN 4x+' is not one of sdrt's" in out["info"] and "); Lanczos ran" in out["info"]
    assert "Hires upscaler: Lanczos" in out["info"]
    assert Image.open(io.BytesIO(base64.b64decode(out["images"][0]))).size == (96, 96)


def test_variation_seeds_change_the_image_and_are_written(url):
    plain = _txt2img(url)
    varied = _txt2img(url, subseed=9, subseed_strength=0.5)
    assert varied["images"][0] != plain["images"][0]
    assert "Variation seed: 9" in varied["info"] and "Variation seed strength: 0.5" in varied["info"]


def test_variation_seeds_across_n_iter_follow_a1111(url):
    """A1111's ``p.all_seeds`` / ``p.all_subseeds``: with a variation seed, every image of the job keeps the seed
    and image ``j`` (over n_iter x batch_size) gets subseed ``subseed + j``. serve runs each n_iter batch as its
    own generate(): batch 1's first image is the same picture as a one-image job with subseed 9 + 2."""
    out = _txt2img(url, subseed=9, subseed_strength=0.5, n_iter=2, batch_size=2)
    info = json.loads(out["info"])
    assert info["all_seeds"] == [5, 5, 5, 5]
    assert info["all_subseeds"] == [9, 10, 11, 12]
    assert [t.count("Variation seed: ") for t in info["infotexts"]] == [1] * 4
    assert [int(t.split("Variation seed: ")[1].split(",")[0]) for t in info["infotexts"]] == [9, 10, 11, 12]
    assert ["Seed: 5," in t for t in info["infotexts"]] == [True] * 4
    alone = _txt2img(url, subseed=11, subseed_strength=0.5)
    assert _pixels(out["images"][2]) == _pixels(alone["images"][0])
    assert _pixels(out["images"][2]) != _pixels(out["images"][0])


def _pixels(b64: str) -> bytes:
    return Image.open(io.BytesIO(base64.b64decode(b64))).tobytes()


def test_without_variation_the_subseeds_are_still_listed_as_a1111_lists_them(url):
    """A1111 fixes the subseed whatever the strength (``get_fixed_seed``: -1 is a random one) and lists
    ``all_subseeds = subseed + j`` with ``subseed = all_subseeds[0]`` in ``info`` (``Processed``); the infotexts
    write no variation seed at strength 0. sdrt said -1 for each."""
    info = json.loads(_txt2img(url, subseed=9, n_iter=2, batch_size=2)["info"])
    assert info["subseed"] == 9 and info["all_subseeds"] == [9, 10, 11, 12]
    assert not any("Variation seed" in t for t in info["infotexts"])
    drawn = json.loads(_txt2img(url, subseed=-1, batch_size=2)["info"])
    first = drawn["subseed"]
    assert 0 <= first < 2**32 and drawn["all_subseeds"] == [first, first + 1]


def test_a_seed_takes_the_range_the_cli_and_the_api_take(url):
    """A1111 hands the seed to torch.manual_seed, which takes -2**63 to 2**64 - 1 (a negative seed is seed + 2**64),
    as sdrt's CLI and API do; the HTTP routes refused all but -1 to 2**32 - 1, so a 64-bit seed from a ComfyUI
    infotext or a negative one an A1111 client sends got a 400 here and an image from A1111."""
    wrapped = _txt2img(url, seed=2**64 - 5)
    negative = _txt2img(url, seed=-5, batch_size=2)
    info = json.loads(negative["info"])
    assert info["seed"] == -5, info["seed"]
    assert info["all_seeds"] == [s - 10 for s in json.loads(_txt2img(url, seed=5, batch_size=2)["info"])["all_seeds"]]
    assert _pixels(negative["images"][0]) == _pixels(wrapped["images"][0])  # -5 draws what 2**64 - 5 draws
    big = json.loads(_txt2img(url, seed=2**40)["info"])
    assert big["seed"] == 2**40 and "Seed: 1099511627776," in big["infotexts"][0]
