"""sdrt serve's depth_midas / normal_midas: the extension's module names (``depth``, ``normal_map``) and their UI
names, their sliders, /controlnet/detect finding dpt_hybrid-midas-501f0c75.pt in sd-webui-controlnet's layout beside
the models and giving the maps the Python API gives (tests/pipelines/test_midas_depth.py holds those against the
extension's code), a txt2img unit; without the file, a 400 naming where it looked."""

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
from midas_helpers import SMALL, make_weights, sample_image  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
IMAGE = sample_image(100, 70)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    folder = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "midas"
    folder.mkdir(parents=True)
    write_pth(folder / "dpt_hybrid-midas-501f0c75.pt", make_weights(SMALL))
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_module_names_and_sliders(server) -> None:
    names = requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_list"]
    aliases = requests.get(f"{server}/controlnet/module_list?alias_names=true", timeout=30).json()["module_list"]
    assert {"depth", "normal_map"} <= set(names) and {"depth_midas", "normal_midas"} <= set(aliases)
    detail = requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_detail"]
    assert detail["depth"]["sliders"] == [{"name": "Resolution", "value": 512, "min": 64, "max": 2048}]
    assert detail["normal_map"]["sliders"][1] == {"name": "Normal Background Threshold", "value": 0.4, "min": 0.0,
                                                  "max": 1.0, "step": 0.01}


def test_detect_depth_and_normal(server, root) -> None:
    for module, pre, extra in (("depth", "depth_midas", {}), ("depth_midas", "depth_midas", {}),
                               ("normal_map", "normal_midas", {"controlnet_threshold_a": 0.3}),
                               ("normal_midas", "normal_midas", {})):
        r = requests.post(f"{server}/controlnet/detect", json={
            "controlnet_module": module, "controlnet_processor_res": 64,
            "controlnet_input_images": [_b64(IMAGE)], **extra}, timeout=300)
        assert r.status_code == 200, r.text
        got = _rgb(r.json()["images"][0])
        want = preprocessors.preprocess(IMAGE, pre, extra.get("controlnet_threshold_a", 0.4 if pre == "normal_midas"
                                                                 else None),
                                        resolution=64, models=root, backend="openvino")
        assert got.shape == (91, 64, 3) and np.array_equal(got, want), module
    # outside the slider's 0 to 1: the default, 0.4, as the extension's bound_check_params
    maps = [requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "normal_midas", "controlnet_processor_res": 64, "controlnet_input_images": [_b64(IMAGE)],
        **extra}, timeout=300) for extra in ({"controlnet_threshold_a": 1.5}, {"controlnet_threshold_a": 0.4})]
    assert all(m.status_code == 200 for m in maps), maps[0].text
    assert maps[0].json()["images"] == maps[1].json()["images"]


def test_txt2img_unit(server) -> None:
    r = requests.post(f"{server}/sdapi/v1/txt2img", json={
        "prompt": "a room", "steps": 1, "width": 64, "height": 64, "seed": 1, "sd_model_checkpoint": "tiny-cn",
        "alwayson_scripts": {"controlnet": {"args": [{"module": "depth_midas", "model": "controlnet",
                                                      "image": _b64(IMAGE), "processor_res": 64}]}}}, timeout=300)
    assert r.status_code == 200, r.text
    assert "Module: depth_midas" in r.json()["info"]


def test_missing_file_names_where_it_was_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "depth",
                                                            "controlnet_input_images": [_b64(IMAGE)]}, timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]
    assert "dpt_hybrid-midas-501f0c75.pt" in message and "<models>/" in message and str(tmp_path) not in message
