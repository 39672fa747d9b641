"""sdrt serve's softedge_anyline (MistoLine's Anyline): the module and its sliders (Resolution 1280, Safe Steps 2)
in /controlnet/module_list, /controlnet/detect finding MTEED.pth in the extension's layout beside the models and
giving the Python API's map (tests/pipelines/test_anyline.py holds it against the extension's code), the default
resolution at -1, and the slider and file refusals."""

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
from anyline_helpers import write_mteed  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "anyline" / "refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    write_mteed(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "TEED")
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_module_and_detect(server, root) -> None:
    got = requests.get(f"{server}/controlnet/module_list", timeout=30).json()
    assert "softedge_anyline" in got["module_list"]
    assert got["module_detail"]["softedge_anyline"]["sliders"] == [
        {"name": "Resolution", "value": 1280, "min": 64, "max": 2048, "step": 8},
        {"name": "Safe Steps", "value": 2, "min": 0, "max": 10, "step": 1}]
    aliased = requests.get(f"{server}/controlnet/module_list?alias_names=true", timeout=30).json()["module_list"]
    assert "softedge_anyline" in aliased
    image = REFS["image"]
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "softedge_anyline", "controlnet_processor_res": 128, "controlnet_threshold_a": 5,
        "controlnet_input_images": [_b64(image)]}, timeout=300)
    assert r.status_code == 200, r.text
    made = _rgb(r.json()["images"][0])
    assert "poses" not in r.json()
    assert np.array_equal(made, preprocessors.preprocess(image, "softedge_anyline", 5, resolution=128, models=root,
                                                         backend="openvino"))
    assert (made != REFS["map/128/5"]).mean() <= 0.001
    small = REFS["small"][:20, :30]  # -1: the module's default resolution, 1280 on the shorter side
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "softedge_anyline", "controlnet_input_images": [_b64(small)]}, timeout=300)
    assert r.status_code == 200, r.text
    assert _rgb(r.json()["images"][0]).shape == (1280, 1920, 3)
    # outside the slider's 0 to 10: the default, 2 (the extension's bound_check_params); a fraction in it: a 400
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "softedge_anyline", "controlnet_threshold_a": 11, "controlnet_processor_res": 128,
        "controlnet_input_images": [_b64(image)]}, timeout=300)
    assert r.status_code == 200 and np.array_equal(_rgb(r.json()["images"][0]), preprocessors.preprocess(
        image, "softedge_anyline", 2, resolution=128, models=root, backend="openvino")), r.text[-300:]
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "softedge_anyline", "controlnet_threshold_a": 2.5, "controlnet_input_images": [_b64(image)]},
        timeout=60)
    assert r.status_code == 400 and "Anyline's safe steps" in r.json()["message"], r.text


def test_missing_file_names_where_it_was_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "softedge_anyline",
                                                            "controlnet_input_images": [_b64(REFS["image"])]},
                          timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]
    assert "MTEED.pth" in message and "<models>/" in message and str(tmp_path) not in message, message
