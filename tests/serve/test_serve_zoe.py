"""sdrt serve's depth_zoe: the module and its slider (the extension's default resolution; no thresholds),
/controlnet/detect finding ZoeD_M12_N.pt in Forge's layout beside the models and giving the map the Python API gives
(tests/pipelines/test_zoe_depth.py holds that map against the extension's code), a txt2img unit with it, and the
one-line answer without the file."""

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
from zoe_helpers import write_file  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "zoe" / "zoe_refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("forge")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    write_file(root / "models" / "ControlNetPreprocessor" / "zoedepth")  # Forge's models/ControlNetPreprocessor
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_detect_depth_zoe(server, root) -> None:
    listed = requests.get(f"{server}/controlnet/module_list", timeout=30).json()
    assert "depth_zoe" in listed["module_list"] and listed["module_detail"]["depth_zoe"]["sliders"] == []
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "depth_zoe", "controlnet_processor_res": 64,
        "controlnet_input_images": [_b64(REFS["image"])]}, timeout=300)
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    want = preprocessors.preprocess(REFS["image"], "depth_zoe", resolution=64, models=root / "models",
                                    backend="openvino")
    assert got.shape == (82, 64, 3) and np.array_equal(got, want)
    assert np.abs(got[..., 0].astype(int) - REFS["r64_map"]).max() <= 1  # the extension's map


def test_txt2img_with_a_depth_zoe_unit(server) -> None:
    r = requests.post(f"{server}/sdapi/v1/txt2img", json={
        "prompt": "a room", "steps": 1, "width": 64, "height": 64, "seed": 1,
        "alwayson_scripts": {"controlnet": {"args": [{
            "enabled": True, "module": "depth_zoe", "model": "controlnet", "image": _b64(REFS["image"]),
            "processor_res": 64}]}}}, timeout=600)
    assert r.status_code == 200, r.text
    assert "Module: depth_zoe" in r.json()["info"]


def test_detect_depth_zoe_without_the_file(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={
            "controlnet_module": "depth_zoe", "controlnet_input_images": [_b64(REFS["image"])]}, timeout=60)
    assert r.status_code in (400, 404, 422, 500) and "ZoeD_M12_N.pt" in r.text and r.status_code != 500, r.text
