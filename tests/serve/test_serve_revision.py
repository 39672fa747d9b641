"""The extension's Revision and style adapter units over A1111's API: ``module: revision_clipvision`` /
``revision_ignore_prompt`` with ``model: "None"``, the image encoder found in the models folder (ComfyUI's
``clip_vision/clip_vision_g.safetensors``), and ``clip_vision`` (``t2ia_style_clipvision``) with the adapter as the
model: the same image as the Python API's unit and within 1 level of the torch references."""

from __future__ import annotations

import base64
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
from pipeline_helpers import assert_matches_diffusers  # noqa: E402

from sdrt import pipelines  # noqa: E402
from sdrt.pipelines.controlnet import ControlNet  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

ROOT = Path(__file__).resolve().parents[1] / "data"
REV = ROOT / "revision"
REFS = np.load(REV / "refs.npz")
CASES = {c["name"]: c for c in json.loads((REV / "refs.json").read_text())}


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _rgb(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    from safetensors.numpy import save_file

    from sdrt.checkpoint import graphs
    from sdrt.weights import Weights

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph",
                        lambda name: REV / "clip_vision_g.onnx" if name == "clip_vision_g" else real(name))
    shutil.copytree(ROOT / "pipelines" / "tiny-sdxl", tmp_path / "tiny-sdxl")
    shutil.copytree(ROOT / "pipelines" / "tiny-sd15", tmp_path / "tiny-sd15")
    w = Weights.open(REV / "clip_vision" / "clip_g.pth")
    (tmp_path / "clip_vision").mkdir()
    save_file({k: np.ascontiguousarray(w.get_array(k)) for k in w.shapes()},
              str(tmp_path / "clip_vision" / "clip_vision_g.safetensors"))
    return tmp_path


def test_revision_units_run_as_the_python_api(models) -> None:
    from sdrt.serve import ServeConfig

    case = CASES["ignore/0.7/noise0.3"]
    unit = {"image": _b64(REFS["image0"]), "module": "revision_ignore_prompt", "model": "None", "weight": 0.7,
            "threshold_a": 0.3, "control_mode": 2, "resize_mode": 1}
    body = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], steps=case["steps"], width=64,
                height=64, seed=case["seed"], sampler_name="Euler", cfg_scale=case["cfg"],
                override_settings={"sd_model_checkpoint": "tiny-sdxl"},
                alwayson_scripts={"controlnet": {"args": [unit]}})
    with live_server(ServeConfig(models=models, backend="openvino")) as url:
        r = requests.post(f"{url}/sdapi/v1/txt2img", json=body, timeout=300)
        assert r.status_code == 200, r.text
        got = _rgb(r.json()["images"][0])
        info = json.loads(r.json()["info"])
        assert any("has no control mode" in n for n in info["sdrt_not_honoured"]), info["sdrt_not_honoured"]
        assert 'ControlNet 0: "Module: revision_ignore_prompt, Model: None, Weight: 0.7' in info["infotexts"][0]
        detail = requests.get(f"{url}/controlnet/module_list", timeout=60).json()["module_detail"]
        assert detail["revision_clipvision"] == {"model_free": True, "sliders": [None, {
            "name": "Noise Augmentation", "value": 0.0, "min": 0.0, "max": 1.0}]}
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "revision_clipvision",
                                                             "controlnet_input_images": [_b64(REFS["image0"])]},
                          timeout=60)
        assert r.status_code == 400 and "makes no control map" in r.text
        sd15 = dict(body, override_settings={"sd_model_checkpoint": "tiny-sd15"})
        r = requests.post(f"{url}/sdapi/v1/txt2img", json=sd15, timeout=300)
        assert r.status_code == 400 and "alwayson_scripts.controlnet.args[0]" in r.text and "SD 1.x" in r.text, \
            r.text
    assert_matches_diffusers([got], REFS[case["name"]])
    with pipelines.load(models / "tiny-sdxl", backend="openvino") as pipe:
        want = pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], width=64, height=64,
                             seed=case["seed"], sampler="Euler", cfg=case["cfg"], controlnets=[
                                 ControlNet(None, REFS["image0"], 0.7, preprocessor="revision_ignore_prompt", low=0.3,
                                            window="a1111",
                                            preprocessor_models=models / "clip_vision" / "clip_vision_g.safetensors")
                             ]).images[0]
    assert np.array_equal(got, want)


def test_style_adapter_unit_runs_as_the_python_api(tmp_path, monkeypatch) -> None:
    """The extension's ``clip_vision`` module (its UI's ``t2ia_style_clipvision``) with the adapter as the unit's
    model from ``ControlNet/`` and CLIP ViT-L/14 in the models folder's ``clip_vision/``: the Python API's image,
    within 1 level of the torch reference (tests/pipelines/test_style_adapter.py)."""
    from sdrt.checkpoint import graphs
    from sdrt.serve import ServeConfig

    sty = ROOT / "styleadapter"
    refs = np.load(sty / "refs.npz")
    case = json.loads((sty / "refs.json").read_text())[0]
    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph",
                        lambda name: sty / "clip_vision_l.onnx" if name == "clip_vision_l" else real(name))
    shutil.copytree(ROOT / "pipelines" / "tiny-sd15", tmp_path / "tiny-sd15")
    (tmp_path / "ControlNet").mkdir()
    shutil.copy(sty / "t2iadapter_style_tiny.pth", tmp_path / "ControlNet")
    shutil.copytree(sty / "clip_vision", tmp_path / "clip_vision")
    unit = {"image": _b64(refs["image0"]), "module": "t2ia_style_clipvision", "model": "t2iadapter_style_tiny",
            "weight": 1.0}
    body = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], steps=case["steps"], width=64,
                height=64, seed=case["seed"], sampler_name="Euler", cfg_scale=case["cfg"],
                alwayson_scripts={"controlnet": {"args": [unit]}})
    with live_server(ServeConfig(models=tmp_path, backend="openvino")) as url:
        r = requests.post(f"{url}/sdapi/v1/txt2img", json=body, timeout=300)
        assert r.status_code == 200, r.text
        got = _rgb(r.json()["images"][0])
        info = json.loads(r.json()["info"])
        assert 'ControlNet 0: "Module: t2ia_style_clipvision, Model: t2iadapter_style_tiny, Weight: 1' in \
            info["infotexts"][0]
        plain = requests.get(f"{url}/controlnet/module_list", timeout=60).json()
        assert "clip_vision" in plain["module_list"] and plain["module_detail"]["clip_vision"]["model_free"] is False
    assert_matches_diffusers([got], refs[case["name"]])
    with pipelines.load(tmp_path / "tiny-sd15", backend="openvino") as pipe:
        want = pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], width=64, height=64,
                             seed=case["seed"], sampler="Euler", cfg=case["cfg"], controlnets=[
                                 ControlNet(tmp_path / "ControlNet" / "t2iadapter_style_tiny.pth", refs["image0"], 1.0,
                                            preprocessor="t2ia_style_clipvision", window="a1111",
                                            preprocessor_models=tmp_path / "clip_vision" / "clip_vitl.pth")
                             ]).images[0]
    assert np.array_equal(got, want)
