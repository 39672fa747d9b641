"""sdrt serve's dw_openpose_full: /controlnet/detect (map + the extension's OpenPose JSON), a txt2img unit, and
/controlnet/render_openpose_json, against the extension's own code's output (tests/data/control/dwpose_refs.npz,
scripts/gen_dwpose_refs.py), DWPose's files (stand-ins) found in sd-webui-controlnet's layout beside the models."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server
from serve_helpers import png_b64 as _b64
from serve_helpers import png_rgb as _rgb

from sdrt import pipelines
from sdrt.pipelines.controlnet import ControlNet

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
import dwpose_graphs  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "control" / "dwpose_refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    dwpose_graphs.write(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "openpose")
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_detect_and_render(server) -> None:
    post = lambda route, body: requests.post(f"{server}/controlnet/{route}", json=body, timeout=120)  # noqa: E731
    assert "dw_openpose_full" in requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_list"]
    r = post("detect", {"controlnet_module": "dw_openpose_full", "controlnet_processor_res": 256,
                        "controlnet_input_images": [_b64(REFS["image/stripes"])]})
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    assert np.array_equal(got, REFS["map/ort/stripes_256"])
    pose = r.json()["poses"][0]
    assert len(pose["people"]) == 2 and (pose["canvas_height"], pose["canvas_width"]) == REFS["input/stripes_256"].shape[:2]
    # the JSON the detect gave draws the same map (render_openpose_json, the extension's renderer)
    again = post("render_openpose_json", [pose]).json()
    assert np.array_equal(_rgb(again["images"][0])[:256, :341], got)
    ref = json.loads(bytes(REFS["json/render"]).decode())
    r = post("render_openpose_json", [ref, ref])
    assert r.json()["info"] == "Success" and len(r.json()["images"]) == 2
    assert np.array_equal(_rgb(r.json()["images"][1]), REFS["map/render"])
    assert post("render_openpose_json", []).json() == {"info": "No pose data detected."}
    r = post("render_openpose_json", [{"foo": 10, "bar": 100}])
    assert r.status_code == 422 and "canvas_height" in r.json()["message"], r.text


def test_detect_runs_dwpose_on_the_servers_backend(server, root) -> None:
    """/controlnet/detect's DWPose compiles on the server's --backend and first device, as its units' do; it
    compiled on 'auto' (the best installed), so serve --backend ggml detected on OpenVINO, and a detect between two
    jobs closed and recompiled the job's graphs."""
    from sdrt.pipelines import preprocessors

    def served() -> dict:  # the server's DWPose (other tests in this process keep theirs)
        return {k: v for k, v in preprocessors._DWPOSE.items() if k[3].startswith(str(root))}

    r = requests.post(f"{server}/controlnet/detect", json={"controlnet_module": "dw_openpose_full",
                                                           "controlnet_processor_res": 128,
                                                           "controlnet_input_images": [_b64(REFS["image/stripes"])]},
                      timeout=120)
    assert r.status_code == 200, r.text
    assert [key[1] for key in served()] == ["openvino"]
    kept = list(served().values())
    assert str(list(served())[0][2]).startswith("openvino:")  # resolved: the device a job's unit names
    body = dict(prompt="a dancer", steps=1, width=64, height=64, seed=4, sampler_name="Euler",
                alwayson_scripts={"controlnet": {"args": [{"image": _b64(REFS["image/stripes"]),
                                                           "module": "dw_openpose_full", "model": "controlnet",
                                                           "processor_res": 128}]}})
    assert requests.post(f"{server}/sdapi/v1/txt2img", json=body, timeout=300).status_code == 200
    assert list(served().values()) == kept  # the job ran on the detect's graphs, not compiled anew


def test_txt2img_unit_equals_the_python_api(server, root) -> None:
    image = REFS["image/stripes"]
    body = dict(prompt="a dancer", steps=3, width=64, height=64, seed=4, sampler_name="Euler", cfg_scale=7,
                alwayson_scripts={"controlnet": {"args": [{"image": _b64(image), "module": "dw_openpose_full",
                                                           "model": "controlnet", "processor_res": 256}]}})
    r = requests.post(f"{server}/sdapi/v1/txt2img", json=body, timeout=300)
    assert r.status_code == 200, r.text
    with pipelines.load(root / "models" / "tiny-cn", backend="openvino") as pipe:
        want = pipe.generate("a dancer", steps=3, width=64, height=64, seed=4, sampler="Euler", cfg=7,
                             controlnets=[ControlNet("controlnet", REFS["map/ort/stripes_256"], window="a1111")]).images[0]
    assert np.array_equal(_rgb(r.json()["images"][0]), want)


def test_missing_files_name_where_they_were_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "dw_openpose_full",
                                                            "controlnet_input_images": [_b64(REFS["image/stripes"])]},
                          timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]  # the folders as the admin names them (<models>), not the server's paths
    assert "yolox_l.onnx" in message and "<models>/" in message and str(tmp_path) not in message, message
