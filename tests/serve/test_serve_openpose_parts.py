"""sdrt serve's openpose_hand / openpose_face / openpose_faceonly / openpose_full: /controlnet/detect finds the
three OpenPose files in ComfyUI's layout (custom_nodes/comfyui_controlnet_aux/ckpts/lllyasviel/Annotators) above
the models folder and gives the Python API's map and OpenPose JSON (which tests/pipelines/test_openpose_parts.py
holds against the extension's code); a module whose file is missing: a 400 naming it."""

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
from openpose_helpers import make_face_weights, make_weights, write_pth  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "openpose" / "parts_refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Body and face files only: openpose_face(only) run, openpose_hand / openpose_full miss the hand's."""
    root = tmp_path_factory.mktemp("comfy")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    folder = root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    folder.mkdir(parents=True)
    write_pth(folder / "body_pose_model.pth", make_weights())
    write_pth(folder / "facenet.pth", make_face_weights())
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_detect_openpose_faceonly(server, root) -> None:
    """The map and JSON the Python API makes at processor_res 64 (the 64x72 image padded to 64x128, as the
    extension pads; tests/pipelines/test_openpose_parts.py holds the API's maps against the extension's code)."""
    listed = requests.get(f"{server}/controlnet/module_list", timeout=30).json()
    assert {"openpose_hand", "openpose_face", "openpose_faceonly", "openpose_full"} <= set(listed["module_list"])
    assert listed["module_detail"]["openpose_full"]["sliders"][0]["name"] == "Resolution"
    image = REFS["image"]
    padded = np.concatenate([image, np.repeat(image[:, -1:], 56, axis=1)], axis=1)  # edge padding to 64x128
    module = "openpose_faceonly"
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": module, "controlnet_processor_res": 64, "controlnet_input_images": [_b64(image)]},
        timeout=300)
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    made, pose = preprocessors.pose_detect(padded, preprocessors.openpose_parts(module, root, "openvino"))
    assert got.shape == image.shape and got.any() and np.array_equal(got, made[:, :72])
    assert r.json()["poses"][0] == json.loads(json.dumps(pose)) and pose["canvas_width"] == 128
    assert all(p["hand_left_keypoints_2d"] is None and p["hand_right_keypoints_2d"] is None
               for p in pose["people"]) and any(p["face_keypoints_2d"] for p in pose["people"])


def test_missing_hand_file_names_it(server) -> None:
    r = requests.post(f"{server}/controlnet/detect", json={"controlnet_module": "openpose_full",
                                                           "controlnet_input_images": [_b64(REFS["image"])]},
                      timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]
    assert "hand_pose_model.pth" in message and "<models>/" in message and "/tmp" not in message, message
