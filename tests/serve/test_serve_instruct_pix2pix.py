"""A1111's img2img with an InstructPix2Pix model, through the ``webuiapi`` client: ``image_cfg_scale`` (A1111's Image
CFG Scale) is the model's image guidance, and the run is A1111's (the picture's latent noised at
``denoising_strength``, A1111's steps, its guidance rule: sdrt.pipelines.edit). Other models take none: a value other
than the one clients always send is named in ``sdrt_not_honoured``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

from sdrt import pipelines

pytestmark = needs_server
webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
Image = pytest.importorskip("PIL.Image", reason="webuiapi needs Pillow")

IP2P = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-ip2p"
PROMPT = "turn it into a watercolor painting"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ip2p-models")
    shutil.copytree(IP2P, root / "ip2p", ignore=shutil.ignore_patterns("refs.*"))
    shutil.copytree(pipelines.DEMO_MODEL, root / "demo-a")
    return root


@pytest.fixture(scope="module")
def server(models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models, backend="openvino")) as url:
        yield url


def _api(url: str):
    host, port = url.removeprefix("http://").split(":")
    return webuiapi.WebUIApi(host=host, port=int(port), sampler="Euler a", steps=8)


def _picture() -> np.ndarray:
    return np.load(IP2P / "refs.npz")["init_image"]


def _img2img(api, model: str, **kw):
    return api.img2img(images=[Image.fromarray(_picture())], prompt=PROMPT, seed=5, cfg_scale=7.5,
                       denoising_strength=0.9, width=64, height=64, override_settings={"sd_model_checkpoint": model},
                       alwayson_scripts={}, **kw)


def test_image_cfg_scale_is_the_models_image_guidance(server, models) -> None:
    api = _api(server)
    r = _img2img(api, "ip2p", image_cfg_scale=2.5)
    assert r.info["sdrt_not_honoured"] == [], r.info
    assert "Image CFG scale: 2.5" in r.info["infotexts"][0] and "Denoising strength: 0.9" in r.info["infotexts"][0]
    got = np.asarray(r.images[0].convert("RGB"))
    # the pipeline's API with A1111's rule, strength and noise gives that picture
    with pipelines.load(models / "ip2p", backend="openvino") as pipe:
        want = pipe(PROMPT, "", steps=8, cfg=7.5, sampler="Euler a", seed=5, init_image=_picture(), strength=0.9,
                    strength_rule="a1111", image_cfg=2.5, rng="cpu")[0]
        plain = pipe(PROMPT, "", steps=8, cfg=7.5, sampler="Euler a", seed=5, init_image=_picture(), strength=0.9,
                     strength_rule="a1111", image_cfg=1.0, rng="cpu")[0]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    other = np.asarray(_img2img(api, "ip2p", image_cfg_scale=1.5).images[0].convert("RGB"))
    assert np.abs(other.astype(int) - got.astype(int)).max() > 10  # honoured, not ignored
    # unset (A1111's API default, None): ordinary CFG with the picture on both rows, as image_cfg 1
    unset = np.asarray(_img2img(api, "ip2p", image_cfg_scale=None).images[0].convert("RGB"))
    assert np.abs(unset.astype(int) - plain.astype(int)).max() <= 1


def test_other_models_name_an_image_cfg_scale_they_cannot_use(server) -> None:
    api = _api(server)
    assert _img2img(api, "demo-a", image_cfg_scale=1.5).info["sdrt_not_honoured"] == []  # webuiapi's default
    r = _img2img(api, "demo-a", image_cfg_scale=2.5)
    assert r.info["sdrt_not_honoured"] == ["image_cfg_scale: demo-a is no InstructPix2Pix model; its image guidance "
                                           "applies to those only"], r.info


def test_an_instruct_pix2pix_model_needs_a_picture(server) -> None:
    """txt2img on an editing model is a client error naming what it needs (webuiapi raises on a non-200 answer)."""
    with pytest.raises(RuntimeError) as got:
        _api(server).txt2img(prompt=PROMPT, seed=5, steps=2, width=64, height=64,
                             override_settings={"sd_model_checkpoint": "ip2p"})
    status, text = got.value.args
    assert status == 400 and "InstructPix2Pix editing model" in text and "init_images" in text, text
