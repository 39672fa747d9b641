"""sdrt serve's depth_leres: its sliders (the extension's Preprocessor Resolution, Remove Near %, Remove Background %),
/controlnet/detect finding res101.pth in ComfyUI's layout beside the models and giving the map the Python API gives
(tests/pipelines/test_leres_depth.py holds that map against the extension's code), a txt2img unit whose sliders are
the infotext's; a slider above 100 runs its default, as the extension's; depth_leres++ beside it."""

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
from leres_helpers import write_file, write_generator  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "leres" / "leres_refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("comfy")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    folder = root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    write_file(folder)
    write_generator(folder)  # depth_leres++'s merge network beside it
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_detect_depth_leres(server, root) -> None:
    assert "depth_leres" in requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_list"]
    detail = requests.get(f"{server}/controlnet/module_list?alias_names=false", timeout=30).json()["module_detail"]
    assert [s["name"] for s in detail["depth_leres"]["sliders"]] == ["Preprocessor Resolution", "Remove Near %",
                                                                     "Remove Background %"]
    assert detail["depth_leres"]["sliders"][1] == {"name": "Remove Near %", "min": 0, "max": 100, "value": 0,
                                                   "step": 0.1}
    for extra, a, b, key in (({}, None, None, "map_64"),
                             ({"controlnet_threshold_a": 20, "controlnet_threshold_b": 30}, 20, 30, "map_64_thr")):
        r = requests.post(f"{server}/controlnet/detect", json={
            "controlnet_module": "depth_leres", "controlnet_processor_res": 64,
            "controlnet_input_images": [_b64(REFS["image"])], **extra}, timeout=300)
        assert r.status_code == 200, r.text
        got = _rgb(r.json()["images"][0])
        want = preprocessors.preprocess(REFS["image"], "depth_leres", a, b, resolution=64, models=root,
                                        backend="openvino")
        assert got.shape == (82, 64, 3) and np.array_equal(got, want)
        assert np.abs(got[..., 0].astype(int) - REFS[key]).max() <= 1  # the extension's map
    r = requests.post(f"{server}/controlnet/detect", json={  # no processor_res: the slider's default, 512
        "controlnet_module": "depth_leres", "controlnet_input_images": [_b64(REFS["image"])]}, timeout=300)
    assert r.status_code == 200, r.text
    assert _rgb(r.json()["images"][0]).shape == (658, 512, 3)
    # a slider outside its 0 to 100: the default, 0 (the extension's bound_check_params)
    maps = [requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "depth_leres", "controlnet_processor_res": 64, "controlnet_input_images": [_b64(REFS["image"])],
        **extra}, timeout=300) for extra in ({"controlnet_threshold_b": 101}, {"controlnet_threshold_b": 0})]
    assert all(m.status_code == 200 for m in maps), maps[0].text
    assert maps[0].json()["images"] == maps[1].json()["images"]


def test_detect_depth_leres_boost(server, root) -> None:
    """depth_leres++ finds both files in ComfyUI's folder and gives the Python API's map (a 200 x 150 image at 150:
    the double estimate; tests/pipelines/test_leres_boost.py holds it against the extension's); at 64 the padded
    image is under the 160 pixels its resolution search needs: a 400 naming controlnet_processor_res."""
    boost = np.load(Path(__file__).resolve().parents[1] / "data" / "leres" / "leres_boost_refs.npz")
    detail = requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_detail"]
    assert detail["depth_leres++"]["sliders"] == detail["depth_leres"]["sliders"]
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "depth_leres++", "controlnet_processor_res": 150, "controlnet_threshold_a": 10,
        "controlnet_input_images": [_b64(boost["small_image"])]}, timeout=300)
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    want = preprocessors.preprocess(boost["small_image"], "depth_leres++", 10, None, resolution=150, models=root,
                                    backend="openvino")
    assert got.shape == (150, 200, 3) and np.array_equal(got, want)
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "depth_leres++", "controlnet_processor_res": 64,
        "controlnet_input_images": [_b64(boost["small_image"])]}, timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_processor_res" and "160" in r.text, r.text


def test_txt2img_with_a_depth_leres_unit(server) -> None:
    r = requests.post(f"{server}/sdapi/v1/txt2img", json={
        "prompt": "a room", "steps": 1, "width": 64, "height": 64, "seed": 1,
        "alwayson_scripts": {"controlnet": {"args": [{
            "enabled": True, "module": "depth_leres", "model": "controlnet", "image": _b64(REFS["image"]),
            "processor_res": 64, "threshold_a": 12.5}]}}}, timeout=600)
    assert r.status_code == 200, r.text
    info = r.json()["info"]
    assert "Module: depth_leres" in info and "Threshold A: 12.5" in info and "Threshold B: 0" in info, info
    r = requests.post(f"{server}/sdapi/v1/txt2img", json={
        "prompt": "a room", "steps": 1, "width": 64, "height": 64, "seed": 1,
        "alwayson_scripts": {"controlnet": {"args": [{
            "enabled": True, "module": "depth_leres", "model": "controlnet", "image": _b64(REFS["image"]),
            "processor_res": 64, "threshold_a": 150}]}}}, timeout=600)
    assert r.status_code == 200, r.text  # outside the slider's 0 to 100: the default 0, named
    info = r.json()["info"]
    assert "Threshold A: 0," in info and "threshold_a: 150 is outside Remove Near %'s 0 to 100" in info, info
