"""sdrt serve's depth_anything / depth_anything_v2: /controlnet/detect finds the files beside the models (the
extension's layout for V1, ComfyUI's for V2) and gives the map the Python API gives (tests/pipelines/
test_depth_anything.py holds that map against transformers and the extension's steps); the modules have the UI's
default resolution slider; without a file, a 400 naming where it looked."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server
from serve_helpers import png_b64 as _b64
from serve_helpers import png_rgb as _rgb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
from depthanything_helpers import TINY, make_weights  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "depthanything" / "refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    weights = make_weights(TINY)
    v1 = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "depth_anything"
    v1.mkdir(parents=True)
    write_pth(v1 / "depth_anything_vitl14.pth", weights)
    v2 = root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "depth-anything" / "Depth-Anything-V2-Large"
    v2.mkdir(parents=True)
    write_pth(v2 / "depth_anything_v2_vitl.pth", weights)
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


@pytest.mark.parametrize("module", ["depth_anything", "depth_anything_v2"])
def test_detect_depth_anything(server, root, module) -> None:
    listed = requests.get(f"{server}/controlnet/module_list", timeout=30).json()
    assert module in listed["module_list"] and listed["module_detail"][module]["sliders"] == []
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": module, "controlnet_processor_res": 96,
        "controlnet_input_images": [_b64(REFS["image"])]}, timeout=300)
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    want = preprocessors.preprocess(REFS["image"], module, resolution=96, models=root, backend="openvino")
    assert got.shape == (96, 120, 3) and got.any() and np.array_equal(got, want)
    # no processor_res: the UI's default slider, 512
    r = requests.post(f"{server}/controlnet/detect", json={"controlnet_module": module,
                                                           "controlnet_input_images": [_b64(REFS["image"])]},
                      timeout=300)
    assert r.status_code == 200 and _rgb(r.json()["images"][0]).shape == (512, 640, 3), r.text


def test_missing_file_names_where_it_was_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "depth_anything_v2",
                                                            "controlnet_input_images": [_b64(REFS["image"])]},
                          timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]  # the folders as the admin names them (<models>), not the server's paths
    assert "depth_anything_v2_vitl.safetensors" in message and "<models>/" in message, message
    assert str(tmp_path) not in message and "\n" not in message
