"""Model upscalers through the server: ESRGAN/ and RealESRGAN/ in the models folder, /upscalers, hr_upscaler,
and the Extras routes (/extra-single-image, /extra-batch-images) through webuiapi and plain HTTP."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

from sdrt import pipelines
from sdrt.weights import Weights

pytestmark = needs_server
webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
httpx = pytest.importorskip("httpx")
Image = pytest.importorskip("PIL.Image", reason="the extras need Pillow")

DATA = Path(__file__).resolve().parents[1] / "data" / "upscalers"
OK = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 3, "seed": 1}


@pytest.fixture(scope="module")
def up_server(tmp_path_factory):
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("upmodels")
    shutil.copytree(pipelines.DEMO_MODEL, root / "demo-a")  # the default model (first by name)
    # dynamic sizes: a hires pass at another size than the first (A1111 skips a same-size one)
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sdxl-dyn", root / "tiny-sdxl-dyn")
    (root / "ESRGAN").mkdir()
    (root / "RealESRGAN").mkdir()
    shutil.copy(DATA / "rrdb_x4_new.safetensors", root / "ESRGAN" / "4x-Tiny.safetensors")
    shutil.copy(DATA / "rrdb_x2_new.safetensors", root / "RealESRGAN" / "RealESRGAN_x2plus_tiny.safetensors")
    shutil.copy(DATA / "compact_x4.safetensors", root / "RealESRGAN" / "realesr-tiny-x4.safetensors")
    Weights.from_arrays({"lora_unet_down.weight": np.zeros((4, 4), np.float32)}).save(root / "ESRGAN" / "junk.safetensors")
    with live_server(ServeConfig(models=root, backend="openvino")) as url:
        yield url


def _image(w: int = 20, h: int = 24):
    rgb = (np.random.default_rng(5).random((h, w, 3)) * 255).astype(np.uint8)
    return Image.fromarray(rgb)


def _b64(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _decoded(text: str):
    return Image.open(io.BytesIO(base64.b64decode(text))).convert("RGB")


def test_upscalers_listed(up_server) -> None:
    api = webuiapi.WebUIApi(baseurl=f"{up_server}/sdapi/v1")
    ups = {u["name"]: u for u in api.get_upscalers()}
    assert list(ups)[:3] == ["None", "Lanczos", "Nearest"]
    assert ups["4x-Tiny"]["scale"] == 4 and ups["RealESRGAN_x2plus_tiny"]["scale"] == 2
    assert ups["realesr-tiny-x4"]["model_path"] == "RealESRGAN/realesr-tiny-x4.safetensors"
    assert "junk" not in ups  # a LoRA-shaped file in ESRGAN/ is no upscaler
    with httpx.Client(base_url=up_server, timeout=60) as client:
        real = client.get("/sdapi/v1/realesrgan-models").json()
    assert sorted(m["name"] for m in real) == ["RealESRGAN_x2plus_tiny", "realesr-tiny-x4"]


def test_extra_single_image_with_webuiapi(up_server) -> None:
    from sdrt.pipelines.upscaler import ModelUpscaler

    api = webuiapi.WebUIApi(baseurl=f"{up_server}/sdapi/v1")
    img = _image()
    r = api.extra_single_image(img, upscaler_1="4x-Tiny", upscaling_resize=4)
    assert r.images[0].size == (80, 96)
    want = ModelUpscaler(DATA / "rrdb_x4_new.safetensors", backend="openvino").upscale(np.asarray(img))
    assert np.array_equal(np.asarray(r.images[0].convert("RGB")), want)
    assert "Postprocess upscaler: 4x-Tiny" in r.info
    # scale 2 of a x4 model: A1111 resizes its result down to int(side * 2) // 8 * 8 with Lanczos
    r = api.extra_single_image(img, upscaler_1="4x-tiny", upscaling_resize=2, gfpgan_visibility=0.5)
    assert r.images[0].size == (40, 48)
    assert "gfpgan_visibility: sdrt has no face restoration" in r.info
    # to a size, centred on a black canvas (upscaling_crop), blended with Lanczos at 0.5
    r = api.extra_single_image(img, resize_mode=1, upscaling_resize_w=64, upscaling_resize_h=64,
                               upscaler_1="realesr-tiny-x4", upscaler_2="Lanczos", extras_upscaler_2_visibility=0.5)
    assert r.images[0].size == (64, 64) and "Postprocess upscaler 2: Lanczos" in r.info


def test_extra_batch_images_and_errors(up_server) -> None:
    with httpx.Client(base_url=up_server, timeout=120) as client:
        body = {"imageList": [{"data": _b64(_image()), "name": "a.png"}, {"data": _b64(_image(16, 16)), "name": "b"}],
                "upscaler_1": "RealESRGAN_x2plus_tiny", "upscaling_resize": 2}
        r = client.post("/sdapi/v1/extra-batch-images", json=body)
        assert r.status_code == 200, r.text
        sizes = [_decoded(t).size for t in r.json()["images"]]
        assert sizes == [(40, 48), (32, 32)]
        r = client.post("/sdapi/v1/extra-single-image", json={"image": _b64(_image()), "upscaler_1": "ESRGAN_4x"})
        assert r.status_code == 400 and "unknown upscaler 'ESRGAN_4x'" in r.json()["detail"]
        assert "4x-Tiny" in r.json()["detail"]
        r = client.post("/sdapi/v1/extra-single-image", json={"image": _b64(_image()), "upscaler_1": "junk"})
        assert r.status_code == 400
        r = client.post("/sdapi/v1/extra-single-image", json={"image": _b64(_image()), "upscaling_resize": 8,
                                                               "upscaler_1": "None"})
        assert r.status_code == 200 and _decoded(r.json()["image"]).size == (160, 192)


def test_hr_upscaler_runs_a_model(up_server) -> None:
    """hr_upscaler naming a model of ESRGAN/ runs it between the passes (tiny-sdxl-dyn, 32x32 then 64x64: the demo
    model makes 64x64 only, and A1111 runs no second pass at the first pass's size); a name the server lacks is named
    and Lanczos runs."""
    hires = {**OK, "width": 32, "height": 32, "enable_hr": True, "hr_scale": 2.0, "denoising_strength": 0.5,
             "override_settings": {"sd_model_checkpoint": "tiny-sdxl-dyn"}}
    with httpx.Client(base_url=up_server, timeout=300) as client:
        r = client.post("/sdapi/v1/txt2img", json={**hires, "hr_upscaler": "4x-Tiny"})
        assert r.status_code == 200, r.text
        info = json.loads(r.json()["info"])
        assert info["sdrt_not_honoured"] == []
        assert "Hires upscaler: 4x-Tiny" in info["infotexts"][0] and _decoded(r.json()["images"][0]).size == (64, 64)
        lanczos = client.post("/sdapi/v1/txt2img", json={**hires, "hr_upscaler": "Lanczos"})
        assert lanczos.status_code == 200, lanczos.text
        assert np.asarray(_decoded(r.json()["images"][0])).tolist() != \
            np.asarray(_decoded(lanczos.json()["images"][0])).tolist()  # the model upscaler ran, not Lanczos
        r = client.post("/sdapi/v1/txt2img", json={**hires, "hr_upscaler": "R-ESRGAN 4x+"})
        notes = json.loads(r.json()["info"])["sdrt_not_honoured"]
        assert notes and "'R-ESRGAN 4x+'" in notes[0] and "4x-Tiny" in notes[0] and "Lanczos ran" in notes[0]
        assert "junk" not in notes[0]
        r = client.post("/sdapi/v1/txt2img", json={**hires, "hr_upscaler": "junk"})
        assert r.status_code == 200 and "Lanczos ran" in json.loads(r.json()["info"])["sdrt_not_honoured"][0]


def test_upscaler_for_img2img_enlarges_the_init_image(up_server) -> None:
    """A1111's upscaler_for_img2img (override_settings, then the server's option): a model of ESRGAN/ enlarges the
    20x24 init image to 64x64, as the pipeline's init_upscaler does; a name the server lacks is named and the picture
    is resized with Lanczos (A1111's None); None and a shrinking picture change nothing."""
    from backend_helpers import register

    body = {**OK, "init_images": [_b64(_image())], "denoising_strength": 0.5, "cfg_scale": 1}

    def run(client, **extra):
        r = client.post("/sdapi/v1/img2img", json={**body, **extra})
        assert r.status_code == 200, r.text
        return r.json()

    with httpx.Client(base_url=up_server, timeout=300) as client:
        model = run(client, override_settings={"upscaler_for_img2img": "4x-tiny"})
        assert "Init upscaler: 4x-Tiny" in model["info"] and json.loads(model["info"])["sdrt_not_honoured"] == []
        plain = run(client)
        assert "Init upscaler" not in plain["info"] and plain["images"] != model["images"]
        assert run(client, override_settings={"upscaler_for_img2img": "None"})["images"] == plain["images"]
        unknown = run(client, override_settings={"upscaler_for_img2img": "R-ESRGAN 4x+"})
        notes = json.loads(unknown["info"])["sdrt_not_honoured"]
        assert notes and "upscaler_for_img2img: 'R-ESRGAN 4x+'" in notes[0] and "4x-Tiny" in notes[0]
        assert unknown["images"] == plain["images"]
        client.post("/sdapi/v1/options", json={"upscaler_for_img2img": "4x-Tiny"}).raise_for_status()
        try:
            assert client.get("/sdapi/v1/options").json()["upscaler_for_img2img"] == "4x-Tiny"
            assert run(client)["images"] == model["images"]
        finally:
            client.post("/sdapi/v1/options", json={"upscaler_for_img2img": None}).raise_for_status()
        r = client.post("/sdapi/v1/options", json={"upscaler_for_img2img": 4})
        assert r.status_code == 422 and "upscaler_for_img2img must be an upscaler's name" in r.text
    register("openvino")
    with pipelines.load(pipelines.DEMO_MODEL, backend="openvino") as pipe:
        want = pipe("a red circle", init_image=np.asarray(_image()), width=64, height=64, steps=3, seed=1, cfg=1,
                    sampler="Euler",
                    strength=0.5, strength_rule="a1111", init_upscaler=str(DATA / "rrdb_x4_new.safetensors"))[0]
    np.testing.assert_array_equal(np.asarray(_decoded(model["images"][0])), want)
