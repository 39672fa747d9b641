"""sdrt serve's soft edges (HED, PiDiNet, TEED): the extension's module names and its labels, /controlnet/detect
and a txt2img unit find the files in sd-webui-controlnet's or ComfyUI's layout beside the models and give the maps
the Python API gives (tests/pipelines/test_softedge.py holds those against the extension's code); without a file,
a 400 naming where it looked."""

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
from softedge_helpers import write_hed, write_pidi, write_teed  # noqa: E402

from sdrt import pipelines  # noqa: E402
from sdrt.pipelines import preprocessors  # noqa: E402
from sdrt.pipelines.controlnet import ControlNet  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "softedge" / "refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """An A1111 folder with HED and TEED in the extension's downloads; PiDiNet in ComfyUI's layout."""
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    down = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads"
    write_hed(down / "hed")
    write_teed(down / "TEED")
    write_pidi(root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators")
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_modules_and_detect(server, root) -> None:
    """The extension's names (hed, pidinet_scribble) and labels (softedge_hed, scribble_pidinet) both run; the
    maps equal the Python API's and the extension's reference maps; TEED reads threshold_a as its Safe Steps."""
    got = requests.get(f"{server}/controlnet/module_list", timeout=30).json()
    assert {"hed", "hed_safe", "scribble_hed", "pidinet", "pidinet_safe", "pidinet_scribble",
            "softedge_teed"} <= set(got["module_list"])
    assert got["module_detail"]["softedge_teed"]["sliders"][1]["name"] == "Safe Steps"
    aliased = requests.get(f"{server}/controlnet/module_list?alias_names=true", timeout=30).json()["module_list"]
    assert {"softedge_hed", "softedge_hedsafe", "softedge_pidinet", "softedge_pidisafe", "scribble_pidinet"} <= \
        set(aliased)
    image = REFS["image"]
    for module, name in (("hed", "softedge_hed"), ("softedge_hedsafe", "softedge_hedsafe"),
                         ("pidinet_scribble", "scribble_pidinet"), ("softedge_pidinet", "softedge_pidinet")):
        r = requests.post(f"{server}/controlnet/detect", json={
            "controlnet_module": module, "controlnet_processor_res": 72,
            "controlnet_input_images": [_b64(image)]}, timeout=300)
        assert r.status_code == 200, r.text
        made = _rgb(r.json()["images"][0])
        assert "poses" not in r.json()
        want = preprocessors.preprocess(image, name, resolution=72, models=root, backend="openvino")
        assert np.array_equal(made, want)
        assert (made[:, :, 0] != REFS[f"map/{name}/72"]).mean() <= 0.001
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "softedge_teed", "controlnet_processor_res": 96, "controlnet_threshold_a": 5,
        "controlnet_input_images": [_b64(image)]}, timeout=300)
    assert r.status_code == 200, r.text
    assert (_rgb(r.json()["images"][0])[:, :, 0] != REFS["map/softedge_teed_5/96"]).mean() <= 0.001
    # outside the slider's 0 to 10: the default, 2, as the extension's bound_check_params
    maps = [requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "softedge_teed", "controlnet_processor_res": 96, "controlnet_input_images": [_b64(image)],
        **extra}, timeout=300) for extra in ({"controlnet_threshold_a": 11}, {"controlnet_threshold_a": 2})]
    assert all(m.status_code == 200 for m in maps), maps[0].text
    assert maps[0].json()["images"] == maps[1].json()["images"]


def test_txt2img_unit_equals_the_python_api(server, root) -> None:
    image = REFS["image"]
    body = dict(prompt="a photo", steps=2, width=64, height=64, seed=4, sampler_name="Euler", cfg_scale=7,
                alwayson_scripts={"controlnet": {"args": [{"image": _b64(image), "module": "softedge_pidisafe",
                                                           "model": "controlnet", "processor_res": 72}]}})
    r = requests.post(f"{server}/sdapi/v1/txt2img", json=body, timeout=300)
    assert r.status_code == 200, r.text
    control = preprocessors.preprocess(image, "softedge_pidisafe", resolution=72, models=root, backend="openvino")
    with pipelines.load(root / "models" / "tiny-cn", backend="openvino") as pipe:
        want = pipe.generate("a photo", steps=2, width=64, height=64, seed=4, sampler="Euler", cfg=7,
                             controlnets=[ControlNet("controlnet", control, window="a1111")]).images[0]
    assert np.array_equal(_rgb(r.json()["images"][0]), want)


def test_missing_file_names_where_it_was_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "softedge_hed",
                                                            "controlnet_input_images": [_b64(REFS["image"])]},
                          timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]  # the folders as the admin names them (<models>), not the server's paths
    assert "ControlNetHED.pth" in message and "<models>/" in message and str(tmp_path) not in message, message
    assert "ckpts/lllyasviel/Annotators" in message, message


def test_a_strip_at_a_large_resolution_is_a_400_not_gigabytes(tmp_path) -> None:
    """A 16x128 image at processor_res 2048 would be 2048x16384 for HED (~19 GB of activations): refused before
    the network, a 400 naming controlnet_processor_res (the Python API: one ControlImageError); 4:1 still runs."""
    from sdrt.errors import InputError
    from sdrt.pipelines.controlmaps import ControlImageError
    from sdrt.serve.controlnet import detect
    from sdrt.serve.errors import ApiError

    write_hed(tmp_path / "hed")
    strip = np.zeros((16, 128, 3), np.uint8)
    with pytest.raises(ApiError) as exc:
        detect({"controlnet_module": "hed", "controlnet_processor_res": 2048, "controlnet_input_images": [_b64(strip)]},
               2048 * 2048 * 4, 2048, tmp_path, "reference")
    assert exc.value.status == 400 and exc.value.field == "controlnet_processor_res", exc.value.message
    assert "16384x2048" in exc.value.message, exc.value.message
    for name in ("softedge_hed", "scribble_pidinet", "softedge_teed", "lineart_realistic", "lineart_anime_denoise",
                 "normal_bae"):  # the networks that read the image at the processor resolution
        with pytest.raises(ControlImageError, match="16384x2048"):
            preprocessors.preprocess(strip, name, resolution=2048, models=tmp_path)
    with pytest.raises(InputError, match="needs dw-ll_ucoco_384|needs DWPose|yolox_l"):  # DWPose's own 640 box: on
        preprocessors.preprocess(strip, "dw_openpose_full", resolution=2048, models=tmp_path)
    preprocessors.check_net_pixels(2048, 8192, 2048)  # 4:1 at the extension's largest resolution: allowed
