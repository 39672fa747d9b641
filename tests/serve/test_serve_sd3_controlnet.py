"""A1111's img2img with a ControlNet unit on an SD3 model, from ``webuiapi`` (a client no one here wrote): the served
picture is the Python API's for the same unit (whose SD3 ControlNet img2img and inpainting are checked against
diffusers in tests/flow/test_sd3_controlnet_img2img.py), with and without a ``mask``.

The tiny net (tests/data/pipelines/tiny-sd3-controlnet/canny, a diffusers ControlNet folder in the models folder's
``ControlNet/``) is of tiny-sd3's widths: it binds onto the tiny weight-free SD3.5 Medium graph beside it, which this
module's fixture gives in place of the shipped full-size one (sdrt's own lookup, not a vendor library)."""

from __future__ import annotations

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

PIPES = Path(__file__).resolve().parents[1] / "data" / "pipelines"
NETS = PIPES / "tiny-sd3-controlnet"
PROMPT = "a red cat on a table"


@pytest.fixture(scope="module")
def sd3_models(tmp_path_factory) -> Iterator[Path]:
    from sdrt.checkpoint import graphs
    from sdrt.checkpoint import sd3controlnet as scn

    root = tmp_path_factory.mktemp("sd3-cn-models")
    shutil.copytree(PIPES / "tiny-sd3", root / "tiny-sd3")
    (root / "ControlNet").mkdir()
    shutil.copytree(NETS / "canny", root / "ControlNet" / "sd3-canny")
    shutil.copytree(NETS / "inpaint", root / "ControlNet" / "sd3-inpaint")  # alimama's design (17 channels)
    shipped = graphs.shipped_graph
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scn, "base_of", lambda lay, shapes: "sd35_medium_transformer")
        mp.setattr(graphs, "shipped_graph", lambda name: NETS / "sd35_medium_transformer.onnx"
                   if name == "sd35_medium_transformer" else shipped(name))
        yield root


@pytest.fixture(scope="module")
def sd3_server(sd3_models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=sd3_models, backend="openvino")) as url:
        yield url


@pytest.mark.parametrize("case", ["img2img/canny/96x64/cfg 5/strength 0.6/window 0.3-0.7",
                                  "inpaint/canny/64x96/cfg 5/strength 0.6/window 0-0.67"])
def test_webuiapi_img2img_with_an_sd3_controlnet_unit(sd3_server, sd3_models, case) -> None:
    webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
    refs = np.load(NETS / "img2img.npz")
    init, edges = refs[f"{case}/init_image"], refs[f"{case}/control_image_0"]
    h, w = init.shape[:2]
    host, port = sd3_server.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port), sampler="Euler", steps=5)
    title = next(m for m in api.controlnet_model_list() if m.startswith("sd3-canny ["))
    unit = webuiapi.ControlNetUnit(image=Image.fromarray(edges), module="none", model=title, weight=0.8,
                                   resize_mode="Just Resize", guidance_start=0.3, guidance_end=0.7)
    kw = dict(prompt=PROMPT, seed=7, width=w, height=h, cfg_scale=5, denoising_strength=0.6, alwayson_scripts={})
    args = dict(init_image=init, strength=0.6, steps=5, seed=7, sampler="Euler", cfg=5, width=w, height=h,
                strength_rule="a1111")  # serve's A1111 routes run A1111's img2img steps
    if case.startswith("inpaint"):
        mask = refs[f"{case}/mask"]
        kw.update(mask_image=Image.fromarray(mask), inpainting_fill=1, inpaint_full_res=False, mask_blur=0)
        args["mask"], args["mask_overlay"] = mask, True  # serve's A1111 routes paste the picture back, as A1111
    r = api.img2img(images=[Image.fromarray(init)], controlnet_units=[unit], **kw)
    assert not any("ontrol" in note for note in r.info["sdrt_not_honoured"]), r.info["sdrt_not_honoured"]
    assert 'ControlNet 0: "Module: none, Model: sd3-canny, Weight: 0.8' in r.info["infotexts"][0]
    got = np.asarray(r.image.convert("RGB")).astype(int)
    # the extension's step window (on while 0.3 <= i / 4 <= 0.7 over the 4 steps A1111's rule runs at strength 0.6:
    # step 2)
    net = ControlNet(str(sd3_models / "ControlNet" / "sd3-canny"), edges, 0.8, 0.3, 0.7, "none", "Just Resize",
                     window="a1111")
    with pipelines.load(sd3_models / "tiny-sd3", backend="openvino") as pipe:
        want = pipe(PROMPT, controlnets=[net], **args)[0].astype(int)
        plain = pipe(PROMPT, **args)[0].astype(int)
    assert int(np.abs(got - want).max()) == 0
    assert int(np.abs(got - plain).max()) > 10  # the unit changed the picture


def test_webuiapi_txt2img_with_an_sd3_inpainting_net_reads_the_units_mask(sd3_server, sd3_models) -> None:
    """alimama's SD3 inpainting net gets the unit's mask (white = repaint) as its control_mask: the served picture is
    the Python API's for the same unit (checked against diffusers' StableDiffusion3ControlNetInpaintingPipeline in
    tests/flow/test_sd3_inpaint_controlnet.py). It was dropped with a note, and the net refused the run for want of
    one."""
    import json

    webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
    case = json.loads((NETS / "inpaint-net.json").read_text())["cases"][0]
    refs = np.load(NETS / "inpaint-net.npz")
    picture, mask = refs[f"{case['name']}/control_image_0"], refs[f"{case['name']}/control_mask_0"]
    w, h = case["width"], case["height"]
    host, port = sd3_server.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port), sampler="Euler", steps=3)
    title = next(m for m in api.controlnet_model_list() if m.startswith("sd3-inpaint ["))
    unit = webuiapi.ControlNetUnit(image=Image.fromarray(picture), mask=Image.fromarray(mask), module="none",
                                   model=title, weight=0.9, resize_mode="Just Resize")
    # a dict of its own: webuiapi writes the units into its mutable default alwayson_scripts, which later calls share
    r = api.txt2img(prompt=PROMPT, seed=21, width=w, height=h, cfg_scale=5, controlnet_units=[unit], alwayson_scripts={})
    assert not any("mask" in note for note in r.info["sdrt_not_honoured"]), r.info["sdrt_not_honoured"]
    got = np.asarray(r.image.convert("RGB")).astype(int)
    path = str(sd3_models / "ControlNet" / "sd3-inpaint")
    args = dict(steps=3, seed=21, sampler="Euler", cfg=5, width=w, height=h)
    with pipelines.load(sd3_models / "tiny-sd3", backend="openvino") as pipe:
        want = pipe(PROMPT, controlnets=[ControlNet(path, picture, 0.9, resize="Just Resize", window="a1111",
                                                    control_mask=mask)], **args)[0].astype(int)
        other = pipe(PROMPT, controlnets=[ControlNet(path, picture, 0.9, resize="Just Resize", window="a1111",
                                                     control_mask=255 - mask)], **args)[0].astype(int)
    assert int(np.abs(got - want).max()) == 0
    assert int(np.abs(got - other).max()) > 10  # the mask read is the unit's


def test_an_sd3_inpainting_unit_without_a_mask_is_a_400_naming_the_units_mask(sd3_server) -> None:
    import base64
    import io

    httpx = pytest.importorskip("httpx", reason="httpx is a test dependency of the server")
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, "PNG")
    unit = {"model": "sd3-inpaint", "module": "none", "image": base64.b64encode(buf.getvalue()).decode()}
    body = {"prompt": PROMPT, "steps": 1, "width": 64, "height": 64, "alwayson_scripts": {"controlnet": {"args": [unit]}}}
    r = httpx.post(f"{sd3_server}/sdapi/v1/txt2img", json=body, timeout=300)
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "needs the mask of its picture" in detail and "alwayson_scripts.controlnet.args[0].mask" in detail
    assert "control_mask" not in detail



def test_img2img_with_an_inpainting_unit_is_refused_for_the_init_image_not_the_units_mask(sd3_server) -> None:
    """A1111's img2img with a mask and an SD3 inpainting unit that brings no mask (sd-webui-controlnet would hand it
    the img2img's): the net runs in txt2img only (diffusers' StableDiffusion3ControlNetInpaintingPipeline), so the
    400 says that. It asked for the unit's mask first, and a client that then sent one met the init-image refusal."""
    import base64
    import io

    httpx = pytest.importorskip("httpx", reason="httpx is a test dependency of the server")
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, "PNG")
    picture = base64.b64encode(buf.getvalue()).decode()
    buf = io.BytesIO()
    Image.new("L", (64, 64), 255).save(buf, "PNG")
    body = {"prompt": PROMPT, "steps": 1, "width": 64, "height": 64, "init_images": [picture],
            "mask": base64.b64encode(buf.getvalue()).decode(),
            "alwayson_scripts": {"controlnet": {"args": [{"model": "sd3-inpaint", "module": "none"}]}}}
    r = httpx.post(f"{sd3_server}/sdapi/v1/img2img", json=body, timeout=300)
    assert r.status_code == 400 and r.json()["field"] == "init_images", r.text
    assert "an init image with one is not supported" in r.json()["message"]
    assert "needs the mask" not in r.json()["message"]
