"""sd-webui-controlnet's inpaint modules through the A1111 API: ``inpaint_only`` with a unit's image and mask in
txt2img, ``inpaint_global_harmonious`` without an image in img2img with a mask (the init image and the request's
mask, as the extension's ``choose_input_image``), each the Python API's picture (itself checked against diffusers
and the extension's algorithm in tests/pipelines/test_inpaint_controlnet.py); ``inpaint_only+lama`` without
ControlNetLama.pth under the server's models folder is a 400 naming the file."""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

from sdrt import pipelines
from sdrt.pipelines.controlnet import ControlNet

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
BACKEND = "reference"  # float32: the pictures are also checked against the references (within 1 level)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inpaint-cn-models")
    shutil.copytree(DATA, root / "tiny-cn")
    return root


@pytest.fixture(scope="module")
def server(models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models, backend=BACKEND)) as url:
        yield url


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _rgb(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def _cases() -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((DATA / "inpaint.json").read_text())}


def _body(case: dict, unit: dict, **more) -> dict:
    return dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], steps=case["steps"],
                cfg_scale=case["cfg"], seed=case["seed"], sampler_name="Euler", width=64, height=64,
                alwayson_scripts={"controlnet": {"args": [dict(model="controlnet", **unit)]}}, **more)


def test_inpaint_only_txt2img_and_harmonious_img2img(server, models) -> None:
    z = np.load(DATA / "inpaint.npz")
    pic, mask = z["picture"], z["mask"]
    cases = _cases()
    only = cases["inpaint_only/txt2img"]
    r = requests.post(f"{server}/sdapi/v1/txt2img", timeout=300, json=_body(
        only, {"image": _b64(pic), "mask": _b64(mask), "module": "inpaint_only"}))
    assert r.status_code == 200, r.text
    info = json.loads(r.json()["info"])
    assert info["sdrt_not_honoured"] == [] and info["sdrt_ignored_fields"] == []
    got = _rgb(r.json()["images"][0])
    assert np.abs(got.astype(int) - z[only["name"]][0]).max() <= 1
    assert 'ControlNet 0: "Module: inpaint_only, Model: controlnet, Weight: 1' in info["infotexts"][0]
    # img2img with a mask: the unit without an image takes the init image and the request's mask
    i2i = cases["inpaint/img2img mask"]
    r = requests.post(f"{server}/sdapi/v1/img2img", timeout=300, json=_body(
        i2i, {"module": "inpaint_global_harmonious"}, init_images=[_b64(pic)], mask=_b64(mask), mask_blur=0,
        inpainting_fill=1, denoising_strength=0.75))
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    with pipelines.load(models / "tiny-cn", backend=BACKEND) as pipe:
        want = pipe.generate(i2i["prompt"], i2i["negative_prompt"], steps=i2i["steps"], cfg=i2i["cfg"],
                             seed=i2i["seed"], sampler="Euler", width=64, height=64, init_image=pic, mask=mask,
                             strength=0.75, strength_rule="a1111", mask_overlay=True,  # serve runs A1111's img2img
                             controlnets=[ControlNet("controlnet", None, preprocessor="inpaint", window="a1111")]
                             ).images[0]
        plain = pipe.generate(i2i["prompt"], i2i["negative_prompt"], steps=i2i["steps"], cfg=i2i["cfg"],
                              seed=i2i["seed"], sampler="Euler", width=64, height=64, init_image=pic, mask=mask,
                              strength=0.75, strength_rule="a1111", mask_overlay=True,
                              controlnets=[ControlNet("controlnet", pic, window="a1111")]).images[0]
    assert np.array_equal(got, want)
    assert np.abs(plain.astype(int) - want).max() > 5  # the run's mask made the hint


@pytest.mark.parametrize("unit, field, words", [
    ({"module": "inpaint_only+lama"}, "module", "inpaint_only+lama needs ControlNetLama.pth, found in neither"),
    ({"module": "inpaint_only", "image": None, "mask": "x"}, "mask", "is given without"),
])
def test_inpaint_refusals(server, unit, field, words) -> None:
    z = np.load(DATA / "inpaint.npz")
    case = _cases()["inpaint_only/txt2img"]
    body = _body(case, {"image": _b64(z["picture"]), **unit}, init_images=[_b64(z["picture"])])
    r = requests.post(f"{server}/sdapi/v1/img2img", timeout=300, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == f"alwayson_scripts.controlnet.args[0].{field}" and words in r.json()["message"]
    assert "\n" not in r.json()["message"]
