"""sdrt serve's openpose (body): /controlnet/detect finds body_pose_model.pth in sd-webui-controlnet's layout beside
the models and gives the map the Python API gives (tests/pipelines/test_openpose_body.py holds that map against
the extension's code) with the OpenPose JSON; without the file, a 400 naming where it looked."""

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
from openpose_helpers import make_weights, write_pth  # noqa: E402

from sdrt.pipelines import posemaps, preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "openpose" / "body_refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    folder = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "openpose"
    folder.mkdir(parents=True)
    write_pth(folder / "body_pose_model.pth", make_weights())
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_detect_openpose(server, root) -> None:
    assert "openpose" in requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_list"]
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "openpose", "controlnet_processor_res": 152,
        "controlnet_input_images": [_b64(REFS["image"])]}, timeout=300)
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    want = preprocessors.preprocess(REFS["image"], "openpose", resolution=152, models=root, backend="openvino")
    assert got.shape == REFS["image"].shape and got.any() and np.array_equal(got, want)
    pose = r.json()["poses"][0]
    assert len(pose["people"]) > 5 and (pose["canvas_height"], pose["canvas_width"]) == (256, 192)  # padded to 64
    people, h, w = posemaps.from_json(pose)
    assert np.array_equal(posemaps.draw(people, h, w, hands=False, face=False)[:200, :152], got)


def test_missing_file_names_where_it_was_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "openpose",
                                                            "controlnet_input_images": [_b64(REFS["image"])]},
                          timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]  # the folders as the admin names them (<models>), not the server's paths
    assert "body_pose_model.pth" in message and "<models>/" in message and str(tmp_path) not in message, message
