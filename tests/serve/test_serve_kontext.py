"""FLUX.1 Kontext through the A1111 API as Forge's ``forge2_flux_kontext`` extension takes it:
``alwayson_scripts["Forge FluxKontext"].args = [enabled, image1, image2, sizing, reduce]``, against a live server
serving the tiny Flux dev (tests/data/pipelines/tiny-flux-dev). The picture equals what the Python API makes with
the same reference image (whose Kontext path is checked against diffusers in tests/flow/test_flow_kontext.py)."""

from __future__ import annotations

import base64
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server
from serve_helpers import png_b64 as _b64

from sdrt import pipelines
from sdrt.serve import kontext
from sdrt.serve.errors import ApiError

Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")
DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-flux-dev"
PICS = np.load(DATA / "kontext.npz")


def _body(*args) -> dict:
    return {"alwayson_scripts": {"Forge FluxKontext": {"args": list(args)}}}


def test_sizing_follows_the_extension() -> None:
    pic = np.zeros((45, 70, 3), np.uint8)  # aspect 1.556: the extension's rule (raw sides) picks 1248x832
    for sizing, reduce, want in (("to BFL recommended", False, (1248, 832)), ("to BFL recommended", True, (624, 416)),
                                 ("no change", False, (70, 45)), ("to output", False, (96, 64))):
        kw = {"width": 96, "height": 64}
        notes: list[str] = []
        fields = kontext.references(_body(True, _b64(pic), None, sizing, reduce), kw, 1 << 24, notes)
        assert kw["reference_images"][0].shape[:2] == want[::-1] and kw["reference_resize"] is False
        assert fields == {"reference_images": "alwayson_scripts.Forge FluxKontext.args[1]"}
    kw = {}
    assert kontext.references(_body(False, _b64(pic)), kw, 1 << 24, []) == {} and kw == {}  # not enabled
    with pytest.raises(ApiError, match=r"args\[3\] \(sizing\) must be one of"):
        kontext.references(_body(True, _b64(pic), None, "bigger"), {}, 1 << 24, [])
    with pytest.raises(ApiError, match=r"args\[0\] must be true or false"):
        kontext.references(_body("maybe", _b64(pic)), {}, 1 << 24, [])



def test_a_picture_larger_than_the_servers_largest_image_is_refused() -> None:
    """A picture's tokens go into every transformer call: "no change" on a 4x larger picture than the server's
    largest image would run attention over that many more tokens, so it is refused naming the picture."""
    big = np.zeros((96, 128, 3), np.uint8)
    with pytest.raises(ApiError, match=r"args\[2\] is 128x96 and comes to 128x96, more pixels than this server's "
                                       r"largest image \(64x64\)") as info:
        kontext.references(_body(True, None, _b64(big), "no change"), {}, 1 << 24, [], (64, 64))
    assert info.value.field == "alwayson_scripts.Forge FluxKontext.args[2]" and info.value.status == 400
    kw: dict = {}
    kontext.references(_body(True, None, _b64(big), "no change", True), kw, 1 << 24, [], (64, 64))  # reduced: 64x48
    assert kw["reference_images"][0].shape == (48, 64, 3)


@pytest.fixture(scope="module")
def flux_server(tmp_path_factory) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("kontext-models")
    shutil.copytree(DATA, root / "tiny-flux-dev")
    shutil.copytree(pipelines.DEMO_MODEL, root / "zz-demo")  # SD 1.x: takes no reference images
    with live_server(ServeConfig(models=root, backend="openvino")) as url:
        yield url


@needs_server
def test_txt2img_with_a_kontext_image_is_the_api_image(flux_server: str) -> None:
    pic = PICS["picture/a"]
    body = {"prompt": "make the sky purple", "steps": 2, "seed": 5, "sampler_name": "Euler",
            **_body(True, _b64(pic), "", "no change", False)}
    r = requests.post(f"{flux_server}/sdapi/v1/txt2img", json=body, timeout=300)
    assert r.status_code == 200, r.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
    assert "Reference images: 1 (80x48)" in r.json()["info"]
    with pipelines.load(DATA, backend="openvino") as pipe:
        want = pipe("make the sky purple", steps=2, seed=5, sampler="Euler", reference_images=[pic],
                    reference_resize=False)[0]
    assert got.shape == (48, 80, 3)
    assert int(np.abs(got.astype(int) - want.astype(int)).max()) <= 1


@needs_server
def test_a_model_without_references_answers_400_naming_the_field(flux_server: str) -> None:
    body = {"prompt": "a cat", "steps": 1, "override_settings": {"sd_model_checkpoint": "zz-demo"},
            **_body(True, _b64(PICS["picture/a"]), None, "no change", False)}
    r = requests.post(f"{flux_server}/sdapi/v1/txt2img", json=body, timeout=300)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "alwayson_scripts.Forge FluxKontext.args[1]"
    assert "take none" in r.json()["message"]
    # the fix names the field the request used, not the Python API's reference_images
    assert "reference_images" not in r.json()["message"], r.json()["message"]
    assert "leave alwayson_scripts.Forge FluxKontext.args[1] unset" in r.json()["message"]
