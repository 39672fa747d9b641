"""A1111's img2img with a ControlNet unit on a Flux.1 dev model, from ``webuiapi`` (a client no one here wrote): the
served picture is the Python API's for the same unit (whose Flux ControlNet img2img is checked against diffusers'
FluxControlNetImg2ImgPipeline in tests/flow/test_flux_controlnet_img2img.py).

The tiny net (tests/data/pipelines/tiny-flux-controlnet/canny, a diffusers ControlNet folder in the models folder's
``ControlNet/``) is of tiny-flux-dev's widths: it binds onto the tiny weight-free dev graph beside it, which this
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
requests = pytest.importorskip("requests", reason="the serve tests need requests")

PIPES = Path(__file__).resolve().parents[1] / "data" / "pipelines"
NETS = PIPES / "tiny-flux-controlnet"
CASE = "img2img/canny/96x64/strength 0.6/window 0.3-0.7"
PROMPT = "a red cat on a table"


@pytest.fixture(scope="module")
def flux_models(tmp_path_factory) -> Iterator[Path]:
    from sdrt.checkpoint import controlnet as ckpt

    root = tmp_path_factory.mktemp("flux-cn-models")
    shutil.copytree(PIPES / "tiny-flux-dev", root / "tiny-flux-dev")
    (root / "ControlNet").mkdir()
    shutil.copytree(NETS / "canny", root / "ControlNet" / "flux-canny")
    shutil.copytree(NETS / "union", root / "ControlNet" / "flux-union")
    shipped = ckpt.shipped_graph
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ckpt, "shipped_graph", lambda name: NETS / "flux_dev_transformer.onnx"
                   if name == "flux_dev_transformer" else shipped(name))
        yield root


@pytest.fixture(scope="module")
def flux_server(flux_models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=flux_models, backend="openvino")) as url:
        yield url


def test_webuiapi_img2img_with_a_flux_controlnet_unit(flux_server, flux_models) -> None:
    webuiapi = pytest.importorskip("webuiapi", reason="the webuiapi client is a test dependency: pip install webuiapi")
    refs = np.load(NETS / "img2img.npz")
    init, edges = refs[f"{CASE}/init_image"], refs[f"{CASE}/control_image_0"]  # 96x64
    host, port = flux_server.removeprefix("http://").split(":")
    api = webuiapi.WebUIApi(host=host, port=int(port), sampler="Euler", steps=5)
    title = next(m for m in api.controlnet_model_list() if m.startswith("flux-canny ["))
    unit = webuiapi.ControlNetUnit(image=Image.fromarray(edges), module="none", model=title, weight=0.8,
                                   resize_mode="Just Resize", guidance_start=0.3, guidance_end=0.7)
    kw = dict(prompt=PROMPT, seed=7, width=96, height=64, cfg_scale=1, denoising_strength=0.6, alwayson_scripts={})
    r = api.img2img(images=[Image.fromarray(init)], controlnet_units=[unit], **kw)
    assert not any("ontrol" in note for note in r.info["sdrt_not_honoured"]), r.info["sdrt_not_honoured"]
    assert 'ControlNet 0: "Module: none, Model: flux-canny, Weight: 0.8' in r.info["infotexts"][0]
    got = np.asarray(r.image.convert("RGB")).astype(int)
    # the extension's step window (on while 0.3 <= i / 4 <= 0.7 over the 4 steps A1111's rule runs at strength 0.6:
    # step 2)
    net = ControlNet(str(flux_models / "ControlNet" / "flux-canny"), edges, 0.8, 0.3, 0.7, "none", "Just Resize",
                     window="a1111")
    with pipelines.load(flux_models / "tiny-flux-dev", backend="openvino") as pipe:
        args = dict(init_image=init, strength=0.6, steps=5, seed=7, sampler="Euler", cfg=1, width=96, height=64,
                    strength_rule="a1111")  # serve's A1111 routes run A1111's img2img steps
        want = pipe(PROMPT, controlnets=[net], **args)[0].astype(int)
        plain = pipe(PROMPT, **args)[0].astype(int)
    assert int(np.abs(got - want).max()) == 0
    assert int(np.abs(got - plain).max()) > 10  # the unit changed the picture


def test_a_union_net_needs_a_mode_no_unit_field_carries(flux_server) -> None:
    """A union Flux ControlNet needs its mode (``union_mode`` in the API, ``--control-union-mode`` on the command line);
    no A1111 unit field carries one: a 400 naming the unit and the mode."""
    import base64
    import io

    buf = io.BytesIO()
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(buf, "PNG")
    unit = {"image": base64.b64encode(buf.getvalue()).decode(), "model": "flux-union"}
    r = requests.post(f"{flux_server}/sdapi/v1/txt2img", timeout=300, json=dict(
        prompt=PROMPT, steps=1, width=64, height=64, alwayson_scripts={"controlnet": {"args": [unit]}}))
    assert r.status_code == 400 and "union ControlNet" in r.text and "mode" in r.text, r.text
    # the unit as the request names it, not the pipeline's controlnets[0]
    assert "alwayson_scripts.controlnet.args[0] is a union ControlNet" in r.json()["detail"], r.text
    assert "controlnets[" not in r.text, r.text
