"""xinsir's SDXL ControlNet Union through the A1111 API: a union net in the models folder's ``ControlNet/`` runs with
the control type the unit's ``module`` makes (as sd-webui-controlnet and Forge pick it), the same picture as the
Python API's unit with that preprocessor; a module that does not tell the type is refused in one line.

The net is the tiny union of tests/data/pipelines/union (scripts/gen_union_refs.py, checked against diffusers in
tests/checkpoint/test_union_controlnet.py), written here as an ONNX ControlNet folder: its weight-free graph with the
file's tensors put in by name."""

from __future__ import annotations

import base64
import io
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

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
PROMPT = "a photo of a red cat"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    import onnx
    from onnx import numpy_helper

    from sdrt.weights import stfile

    root = tmp_path_factory.mktemp("union-models")
    shutil.copytree(DATA / "tiny-sdxl-controlnet", root / "tiny-xl")
    model = onnx.load(str(DATA / "union" / "model.onnx"), load_external_data=False)
    tensors = stfile.read(DATA / "union" / "diffusion_pytorch_model.safetensors") if hasattr(stfile, "read") else None
    if tensors is None:
        from safetensors.numpy import load_file

        tensors = load_file(str(DATA / "union" / "diffusion_pytorch_model.safetensors"))
    inits = []
    for t in model.graph.initializer:
        inits.append(numpy_helper.from_array(np.asarray(tensors[t.name], np.float32), t.name) if t.external_data else t)
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    del model.metadata_props[:]
    (root / "ControlNet" / "tiny_union").mkdir(parents=True)
    onnx.save_model(model, str(root / "ControlNet" / "tiny_union" / "model.onnx"))
    return root


@pytest.fixture(scope="module")
def server(models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models, backend="openvino")) as url:
        yield url


def _photo() -> np.ndarray:
    y, x = np.mgrid[0:64, 0:64]
    img = np.zeros((64, 64, 3), np.uint8)
    img[..., 0] = (x * 4).astype(np.uint8)
    img[(y - 32) ** 2 + (x - 24) ** 2 < 200] = (250, 240, 230)
    return img


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _post(url: str, unit: dict) -> requests.Response:
    body = dict(prompt=PROMPT, steps=4, width=64, height=64, seed=11, sampler_name="Euler", cfg_scale=7,
                alwayson_scripts={"controlnet": {"args": [{"image": _b64(_photo()), "model": "tiny_union", **unit}]}})
    return requests.post(f"{url}/sdapi/v1/txt2img", json=body, timeout=300)


def test_the_units_module_picks_the_union_type(server, models) -> None:
    r = _post(server, {"module": "canny", "threshold_a": 80, "threshold_b": 160, "processor_res": 64})
    assert r.status_code == 200, r.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
    net = str(models / "ControlNet" / "tiny_union")
    with pipelines.load(models / "tiny-xl", backend="openvino") as pipe:
        def run(**kw) -> np.ndarray:
            unit = ControlNet(net, _photo(), 1.0, 0.0, 1.0, "canny", low=80, high=160, window="a1111",
                              processor_res=64, **kw)
            return pipe.generate(PROMPT, controlnets=[unit], steps=4, width=64, height=64, seed=11, sampler="Euler",
                                 cfg=7).images[0]
        want = run()
        assert np.array_equal(got, want)
        assert np.abs(run(union_mode="depth").astype(int) - want).max() > 3  # the type matters here
    assert "Union Mode: 3" in r.json()["info"]


def test_a_module_that_does_not_tell_the_type_is_one_line(server) -> None:
    r = _post(server, {"module": "none"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert "ControlNet Union" in body["message"] and "\n" not in body["message"], body
    # in the request's words: the unit's module field, no pipeline argument (the request has no union_mode)
    assert body["field"] == "alwayson_scripts.controlnet.args[0].module", body
    assert "alwayson_scripts.controlnet.args[0].module 'none'" in body["message"], body
    assert "union_mode" not in body["message"] and "controlnets[" not in body["message"], body


def test_the_extensions_union_control_type_field_picks_the_type(server, models) -> None:
    """sd-webui-controlnet's unit field union_control_type ("Depth", "Hard Edge", ...) is the type, over the module."""
    r = _post(server, {"module": "canny", "threshold_a": 80, "threshold_b": 160, "processor_res": 64,
                       "union_control_type": "Depth"})
    assert r.status_code == 200, r.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
    net = str(models / "ControlNet" / "tiny_union")
    with pipelines.load(models / "tiny-xl", backend="openvino") as pipe:
        unit = ControlNet(net, _photo(), 1.0, 0.0, 1.0, "canny", low=80, high=160, window="a1111", processor_res=64,
                          union_mode="depth")
        want = pipe.generate(PROMPT, controlnets=[unit], steps=4, width=64, height=64, seed=11, sampler="Euler",
                             cfg=7).images[0]
    assert np.array_equal(got, want)
    assert "Union Mode: 1" in r.json()["info"]
    assert "union_control_type" not in str(r.json().get("info")).split("Union Mode")[0]  # read, not noted as ignored
    r = _post(server, {"module": "none", "union_control_type": "Hard Edge"})  # the field tells what the module does not
    assert r.status_code == 200, r.text
    r = _post(server, {"module": "canny", "union_control_type": "Sketch"})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "alwayson_scripts.controlnet.args[0].union_control_type", r.json()
    assert "Soft Edge" in r.json()["message"], r.json()
