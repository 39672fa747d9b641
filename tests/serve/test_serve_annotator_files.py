"""A model-backed preprocessor's file on the server that is not its model (a truncated download, another
annotator's file under its name): /controlnet/detect and a txt2img unit answer a 400 naming the request's module
field and the file as the admin names it (``<models>/../extensions/...``), never a 500 or a server path."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server
from serve_helpers import png_b64 as _b64

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
from openpose_helpers import write_pth  # noqa: E402

pytestmark = needs_server
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
IMAGE = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
DOWNLOADS = Path("extensions") / "sd-webui-controlnet" / "annotator" / "downloads"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    (root / DOWNLOADS / "mlsd").mkdir(parents=True)
    # another network's state dict under M-LSD's name
    write_pth(root / DOWNLOADS / "mlsd" / "mlsd_large_512_fp32.pth", {"conv1.weight": np.zeros((2, 3, 1, 1), np.float32)})
    (root / DOWNLOADS / "midas").mkdir(parents=True)
    (root / DOWNLOADS / "midas" / "dpt_hybrid-midas-501f0c75.pt").write_bytes(b"PK\x03\x04 cut short")
    (root / DOWNLOADS / "openpose").mkdir(parents=True)
    for name in ("yolox_l.onnx", "dw-ll_ucoco_384.onnx"):  # not ONNX graphs
        (root / DOWNLOADS / "openpose" / name).write_bytes(b"\x0a\xff\xff\xff junk")
    (root / DOWNLOADS / "openpose" / "body_pose_model.pth").write_bytes(b"never read: the strip is refused first")
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="reference")) as url:
        yield url


@pytest.mark.parametrize("module,file", [("mlsd", "mlsd/mlsd_large_512_fp32.pth"),
                                         ("depth", "midas/dpt_hybrid-midas-501f0c75.pt"),
                                         ("dw_openpose_full", "openpose/yolox_l.onnx")])
def test_detect_with_a_broken_file_is_a_400(server, root, module, file) -> None:
    r = requests.post(f"{server}/controlnet/detect", json={"controlnet_module": module, "controlnet_processor_res": 64,
                                                           "controlnet_input_images": [_b64(IMAGE)]}, timeout=120)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]
    assert f"<models>/../{DOWNLOADS.as_posix()}/{file}" in message and str(root) not in message, message
    assert "\n" not in message and message.count("Where:") == 0, message


@pytest.mark.parametrize("module,file", [("mlsd", "mlsd/mlsd_large_512_fp32.pth"),
                                         ("normal_map", "midas/dpt_hybrid-midas-501f0c75.pt"),
                                         ("dw_openpose_full", "openpose/yolox_l.onnx")])
def test_txt2img_unit_with_a_broken_file_names_its_module(server, root, module, file) -> None:
    r = requests.post(f"{server}/sdapi/v1/txt2img", json={
        "prompt": "a room", "steps": 1, "width": 64, "height": 64, "seed": 1, "sd_model_checkpoint": "tiny-cn",
        "alwayson_scripts": {"controlnet": {"args": [{"module": module, "model": "controlnet", "image": _b64(IMAGE),
                                                      "processor_res": 64}]}}}, timeout=300)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "alwayson_scripts.controlnet.args[0].module", r.text
    message = r.json()["message"]
    assert f"<models>/../{DOWNLOADS.as_posix()}/{file}" in message and str(root) not in message, message


@pytest.mark.parametrize("module", ["openpose", "dw_openpose_full"])
def test_detect_of_a_strip_the_resolution_cannot_take_is_a_400(server, module) -> None:
    """A 300x1 strip at processor resolution 64 would be 19200 pixels long: the pose modules' detect answered a 500
    (the other modules a 400 naming the image)."""
    strip = np.random.default_rng(1).integers(0, 256, (1, 300, 3), dtype=np.uint8)
    r = requests.post(f"{server}/controlnet/detect", json={"controlnet_module": module, "controlnet_processor_res": 64,
                                                           "controlnet_input_images": [_b64(strip)]}, timeout=120)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_input_images[0]", r.text
