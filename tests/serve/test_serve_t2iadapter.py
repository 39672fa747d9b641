"""T2I-Adapters through the A1111 API: a ControlNet unit whose ``model`` is a T2I-Adapter file of the models folder's
``ControlNet/`` (as sd-webui-controlnet keeps TencentARC's ``t2iadapter_*.pth``) runs it with the extension's rules
(its step window, control modes), and gives the picture the Python API makes for the same unit (whose adapter is
checked against diffusers in tests/pipelines/test_t2iadapter.py)."""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server

from sdrt import pipelines
from sdrt.pipelines.controlnet import ControlNet

Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-t2ia"
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("t2ia-models")
    shutil.copytree(DATA, root / "tiny-t2ia", ignore=shutil.ignore_patterns("*.pth", "refs.*", "full_size.json"))
    (root / "ControlNet").mkdir()
    for name in ("t2iadapter_canny_tiny.pth", "t2iadapter_color_tiny.pth"):
        shutil.copy(DATA / name, root / "ControlNet" / name)
    return root


@pytest.fixture(scope="module")
def server(models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models, backend="reference")) as url:
        yield url


@pytest.fixture(scope="module")
def pipe(models):
    from backend_helpers import register

    register("reference")
    with pipelines.load(models / "tiny-t2ia", backend="reference") as p:
        yield p


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _rgb(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def _txt2img(url: str, units: list[dict]) -> requests.Response:
    body = dict(prompt=PROMPT, steps=4, width=64, height=64, seed=11, sampler_name="Euler", cfg_scale=7,
                alwayson_scripts={"controlnet": {"args": units}})
    return requests.post(f"{url}/sdapi/v1/txt2img", json=body, timeout=300)


def test_a_t2i_adapter_unit_runs_as_the_python_api_with_the_extensions_rules(server, models, pipe) -> None:
    z = np.load(DATA / "refs.npz")
    edges = z["edges"]
    titles = requests.get(f"{server}/controlnet/model_list", timeout=60).json()["model_list"]
    title = next(t for t in titles if t.startswith("t2iadapter_canny_tiny ["))
    unit = dict(module="none", model=title, image=_b64(edges), weight=0.6, guidance_start=0.0, guidance_end=0.5,
                resize_mode="Just Resize")
    r = _txt2img(server, [unit])
    assert r.status_code == 200, r.text
    path = str(models / "ControlNet" / "t2iadapter_canny_tiny.pth")
    want = pipe.generate(PROMPT, steps=4, width=64, height=64, seed=11, sampler="Euler", cfg=7, controlnets=[
        ControlNet(path, edges, 0.6, 0.0, 0.5, resize="Just Resize", window="a1111")]).images[0]
    got = _rgb(r.json()["images"][0])
    assert np.array_equal(got, want)
    text = json.loads(r.json()["info"])["infotexts"][0]
    assert 'ControlNet 0: "Module: none, Model: t2iadapter_canny_tiny, Weight: 0.6,' in text, text
    # the extension's soft injection: "My prompt is more important" scales the four features 0.25 .. 1
    r = _txt2img(server, [dict(unit, control_mode=1)])
    soft = pipe.generate(PROMPT, steps=4, width=64, height=64, seed=11, sampler="Euler", cfg=7, controlnets=[
        ControlNet(path, edges, 0.6, 0.0, 0.5, resize="Just Resize", window="a1111",
                   control_mode="My prompt is more important")]).images[0]
    assert np.array_equal(_rgb(r.json()["images"][0]), soft)
    assert np.abs(soft.astype(int) - want).max() > 3


def test_the_t2ia_modules(server) -> None:
    z = np.load(DATA / "refs.npz")
    unit = dict(module="t2ia_color_grid", model="t2iadapter_color_tiny", image=_b64(z["colors"]), weight=0.8)
    r = _txt2img(server, [unit])
    assert r.status_code == 200, r.text
    text = json.loads(r.json()["info"])["infotexts"][0]
    assert 'ControlNet 0: "Module: ' in text and "Model: t2iadapter_color_tiny" in text, text
    r = _txt2img(server, [dict(unit, module="t2ia_style_clipvision")])  # runs now: needs ViT-L/14, which the folder lacks
    assert r.status_code == 400 and "clip_vitl.pth" in r.json()["detail"], r.text
    r = _txt2img(server, [dict(unit, module="t2ia_sketch_pidi")])  # needs PiDiNet's file, which the folder lacks
    assert r.status_code == 400 and "table5_pidinet.pth" in r.json()["detail"], r.text
