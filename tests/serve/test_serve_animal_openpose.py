"""sdrt serve's animal_openpose: its module and slider, /controlnet/detect (the map and, as the extension answers
for a module whose name holds "openpose", its OpenPose JSON as ``poses`` with the animals under ``animals``), a
txt2img unit, and /controlnet/render_openpose_json given such JSON (the extension's request model drops
``animals``: a black canvas), against the extension's own code's output (tests/data/control/animal_refs.npz,
scripts/ref_animal_openpose.py); the files (stand-ins) found in sd-webui-controlnet's layout beside the models."""

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
import animal_graphs  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "control" / "animal_refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    animal_graphs.write(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "openpose")
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_detect_and_render(server) -> None:
    post = lambda route, body: requests.post(f"{server}/controlnet/{route}", json=body, timeout=120)  # noqa: E731
    got = requests.get(f"{server}/controlnet/module_list", timeout=30).json()
    assert "animal_openpose" in got["module_list"]
    assert got["module_detail"]["animal_openpose"]["sliders"] == [{"name": "Resolution", "value": 512, "min": 64,
                                                                    "max": 2048}]
    r = post("detect", {"controlnet_module": "animal_openpose", "controlnet_processor_res": 256,
                        "controlnet_input_images": [_b64(REFS["image/stripes"])]})
    assert r.status_code == 200, r.text
    assert np.array_equal(_rgb(r.json()["images"][0]), REFS["map/stripes_256"])
    pose, want = r.json()["poses"][0], json.loads(bytes(REFS["json/stripes_256"]))
    assert pose["people"] == [] and len(pose["animals"]) == 3
    assert (pose["canvas_height"], pose["canvas_width"]) == (want["canvas_height"], want["canvas_width"])
    np.testing.assert_allclose(pose["animals"], want["animals"], atol=1e-4)
    again = post("render_openpose_json", [pose])  # the extension's PoseData has no animals field: black
    assert again.status_code == 200 and not _rgb(again.json()["images"][0]).any()


def test_txt2img_unit_equals_the_python_api(server, root) -> None:
    image = REFS["image/stripes"]
    body = dict(prompt="a dog", steps=3, width=64, height=64, seed=4, sampler_name="Euler", cfg_scale=7,
                alwayson_scripts={"controlnet": {"args": [{"image": _b64(image), "module": "animal_openpose",
                                                           "model": "controlnet", "processor_res": 256}]}})
    r = requests.post(f"{server}/sdapi/v1/txt2img", json=body, timeout=300)
    assert r.status_code == 200, r.text
    with pipelines.load(root / "models" / "tiny-cn", backend="openvino") as pipe:
        want = pipe.generate("a dog", steps=3, width=64, height=64, seed=4, sampler="Euler", cfg=7,
                             controlnets=[ControlNet("controlnet", REFS["map/stripes_256"], window="a1111")]).images[0]
    assert np.array_equal(_rgb(r.json()["images"][0]), want)


def test_missing_files_name_where_they_were_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "animal_openpose",
                                                            "controlnet_input_images": [_b64(REFS["image/stripes"])]},
                          timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]
    assert "rtmpose-m_simcc-ap10k" in message and "<models>/" in message and str(tmp_path) not in message, message
