"""sdrt serve's mlsd: /controlnet/detect finds mlsd_large_512_fp32.pth in ComfyUI's layout beside the models and
gives the map the Python API gives (tests/pipelines/test_mlsd.py holds that map against the extension's code) with
the two sliders as threshold_a / threshold_b; module_detail lists them as the extension does; a txt2img unit with
module mlsd runs; without the file, a 400 naming where it looked."""

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
from mlsd_helpers import write_file  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "mlsd" / "mlsd_refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("comfy")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    write_file(root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators")
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_detect_mlsd(server, root) -> None:
    assert "mlsd" in requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_list"]
    detail = requests.get(f"{server}/controlnet/module_list?alias_names=false", timeout=30).json()["module_detail"]
    assert [s["name"] for s in detail["mlsd"]["sliders"]] == ["Preprocessor Resolution", "MLSD Value Threshold",
                                                              "MLSD Distance Threshold"]
    assert (detail["mlsd"]["sliders"][1]["max"], detail["mlsd"]["sliders"][2]["max"]) == (2.0, 20.0)
    for extra, lo, hi in (({}, 0.1, 0.1), ({"controlnet_threshold_a": 0.3, "controlnet_threshold_b": 4.0}, 0.3, 4.0)):
        r = requests.post(f"{server}/controlnet/detect", json={
            "controlnet_module": "mlsd", "controlnet_processor_res": 64,
            "controlnet_input_images": [_b64(REFS["image"])], **extra}, timeout=300)
        assert r.status_code == 200, r.text
        got = _rgb(r.json()["images"][0])
        want = preprocessors.preprocess(REFS["image"], "mlsd", lo, hi, resolution=64, models=root, backend="openvino")
        assert got.shape == (84, 64, 3) and got.any() and np.array_equal(got, want)
        if not extra:
            assert np.array_equal(got[:, :, 0], REFS["map_64"])  # the extension's map


def test_txt2img_with_an_mlsd_unit(server) -> None:
    r = requests.post(f"{server}/sdapi/v1/txt2img", json={
        "prompt": "a room", "steps": 1, "width": 64, "height": 64, "seed": 1,
        "alwayson_scripts": {"controlnet": {"args": [{
            "enabled": True, "module": "mlsd", "model": "controlnet", "image": _b64(REFS["image"]),
            "processor_res": 64, "threshold_a": 0.2, "threshold_b": 2.0}]}}}, timeout=600)
    assert r.status_code == 200, r.text
    info = r.json()["info"]
    assert "Module: mlsd" in info and "Threshold A: 0.2" in info and "Threshold B: 2" in info, info


def test_missing_file_names_where_it_was_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "mlsd",
                                                            "controlnet_input_images": [_b64(REFS["image"])]},
                          timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]
    assert "mlsd_large_512_fp32.pth" in message and "<models>/" in message and str(tmp_path) not in message, message
