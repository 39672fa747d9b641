"""sdrt serve's seg_ufade20k (the extension's module ``segmentation``): /controlnet/detect finds
upernet_global_small.pth in ComfyUI's layout beside the models and gives the map the Python API gives
(tests/pipelines/test_uniformer_seg.py holds that map against the extension's code); module_detail lists its
Preprocessor Resolution slider (64 to 2048, 512), as the extension's 1.1.4xx slider config has it for "segmentation";
a txt2img unit with module seg_ufade20k runs. The same for the extension's anime_face_segment (seg_anime_face), its
UNet.pth in the extension's layout above the models folder; that module is left out of the slider config, so
module_detail lists no sliders (its UI's resolution slider, 512, is what a request without processor_res runs at)."""

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
from animeface_helpers import write_file as write_anime_face  # noqa: E402
from uniformer_helpers import write_file  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "uniformer" / "uniformer_refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("comfy")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    write_file(root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators")
    write_anime_face(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "anime_face_segment")
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_detect_segmentation(server, root) -> None:
    listed = requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_list"]
    assert "segmentation" in listed
    aliased = requests.get(f"{server}/controlnet/module_list?alias_names=true", timeout=30).json()
    assert "seg_ufade20k" in aliased["module_list"]
    assert aliased["module_detail"]["seg_ufade20k"]["sliders"] == [
        {"name": "Preprocessor Resolution", "min": 64, "max": 2048, "value": 512}]
    for module in ("segmentation", "seg_ufade20k"):  # the module's name and its UI's
        r = requests.post(f"{server}/controlnet/detect", json={
            "controlnet_module": module, "controlnet_processor_res": 64,
            "controlnet_input_images": [_b64(REFS["image"])]}, timeout=300)
        assert r.status_code == 200, r.text
        got = _rgb(r.json()["images"][0])
        want = preprocessors.preprocess(REFS["image"], "seg_ufade20k", resolution=64, models=root, backend="openvino")
        assert got.shape == (87, 64, 3) and np.array_equal(got, want)
        assert np.array_equal(got, REFS["map_64"])  # the extension's map
    r = requests.post(f"{server}/controlnet/detect", json={  # no processor_res: the UI's default slider, 512
        "controlnet_module": "segmentation", "controlnet_input_images": [_b64(REFS["image"])]}, timeout=300)
    assert r.status_code == 200, r.text
    assert _rgb(r.json()["images"][0]).shape == (698, 512, 3)


def test_module_detail_as_the_extensions_slider_config() -> None:
    """1.1.4xx's preprocessor_sliders_config lists "segmentation" with the resolution slider; not
    "anime_face_segment" (no sliders: the UI's 512). Read without a server."""
    from sdrt.serve import controlnet as cn

    detail = cn.module_detail(alias_names=False)
    assert detail["segmentation"]["sliders"] == [{"name": "Preprocessor Resolution", "min": 64, "max": 2048,
                                                  "value": 512}]
    assert detail["anime_face_segment"]["sliders"] == []


def test_txt2img_with_a_segmentation_unit(server) -> None:
    r = requests.post(f"{server}/sdapi/v1/txt2img", json={
        "prompt": "a room", "steps": 1, "width": 64, "height": 64, "seed": 1,
        "alwayson_scripts": {"controlnet": {"args": [{
            "enabled": True, "module": "seg_ufade20k", "model": "controlnet", "image": _b64(REFS["image"]),
            "processor_res": 64}]}}}, timeout=600)
    assert r.status_code == 200, r.text
    info = r.json()["info"]
    assert "Module: seg_ufade20k" in info and "Threshold A" not in info, info


def test_detect_anime_face_segment(server, root) -> None:
    refs = np.load(Path(__file__).resolve().parents[1] / "data" / "animeface" / "animeface_refs.npz")
    aliased = requests.get(f"{server}/controlnet/module_list?alias_names=true", timeout=30).json()
    assert "seg_anime_face" in aliased["module_list"] and aliased["module_detail"]["seg_anime_face"]["sliders"] == []
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "anime_face_segment", "controlnet_processor_res": 64,
        "controlnet_input_images": [_b64(refs["image"])]}, timeout=300)
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    assert got.shape == (87, 64, 3) and np.array_equal(got, refs["map_64"])  # the extension's map


@pytest.mark.parametrize("name", ["oneformer_ade20k", "seg_ofade20k", "oneformer_coco", "seg_ofcoco"])
def test_the_oneformer_modules_name_what_runs_instead(name):
    """The extension's default segmentation module is OneFormer's, which sdrt does not build: the 400 says so and
    names UniFormer's module, not just the list of every module."""
    from sdrt.serve.a1111 import ApiError
    from sdrt.serve.controlnet import module

    with pytest.raises(ApiError) as got:
        module(name, "module")
    text = str(got.value)
    assert "OneFormer" in text and "seg_ufade20k" in text and "\n" not in text, text
