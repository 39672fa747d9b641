"""sdrt serve's model-backed lineart modules: /controlnet/module_list names them as the extension does ("lineart",
its UI's "lineart_realistic"), /controlnet/detect finds each file in sd-webui-controlnet's or ComfyUI's layout beside
the models and gives the map the Python API gives (tests/pipelines/test_lineart_models.py holds that map against
the extension's code), a txt2img unit runs them; without the file, a 400 naming where it looked."""

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
from lineart_helpers import COARSE_SEED, make_anime, make_generator, make_manga, write_pth  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "lineart" / "refs.npz")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """An A1111 root: the generators in the extension's layout, the anime and manga files in ComfyUI's."""
    root = tmp_path_factory.mktemp("a1111")
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    ext = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "lineart"
    ext.mkdir(parents=True)
    write_pth(ext / "sk_model.pth", make_generator())
    write_pth(ext / "sk_model2.pth", make_generator(COARSE_SEED))
    comfy = root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    comfy.mkdir(parents=True)
    write_pth(comfy / "netG.pth", make_anime())
    write_pth(comfy / "erika.pth", make_manga())
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="openvino")) as url:
        yield url


def test_module_names(server) -> None:
    names = requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_list"]
    aliases = requests.get(f"{server}/controlnet/module_list?alias_names=true", timeout=30).json()["module_list"]
    for m in ("lineart", "lineart_coarse", "lineart_anime", "lineart_anime_denoise"):
        assert m in names
    assert "lineart_realistic" in aliases and "lineart" not in aliases
    detail = requests.get(f"{server}/controlnet/module_list", timeout=30).json()["module_detail"]
    assert detail["lineart"]["sliders"] == [] and detail["lineart_anime"]["sliders"] == []  # as lineart_standard


@pytest.mark.parametrize("module,name", [("lineart_realistic", "lineart_realistic"), ("lineart", "lineart_realistic"),
                                         ("lineart_coarse", "lineart_coarse"), ("lineart_anime", "lineart_anime"),
                                         ("lineart_anime_denoise", "lineart_anime_denoise")])
def test_detect(server, root, module, name) -> None:
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": module, "controlnet_processor_res": 100,
        "controlnet_input_images": [_b64(REFS["image"])]}, timeout=300)
    assert r.status_code == 200, r.text
    got = _rgb(r.json()["images"][0])
    want = preprocessors.preprocess(REFS["image"], name, resolution=100, models=root, backend="openvino")
    assert got.shape == (100, 139, 3) and np.array_equal(got, want) and "poses" not in r.json()


def test_detect_default_resolution_is_512(server, root) -> None:
    r = requests.post(f"{server}/controlnet/detect", json={"controlnet_module": "lineart_coarse",
                                                           "controlnet_input_images": [_b64(REFS["image"])]},
                      timeout=300)
    assert r.status_code == 200, r.text
    assert _rgb(r.json()["images"][0]).shape == (512, 711, 3)


def test_txt2img_unit(server, root) -> None:
    """A unit with the UI's name runs the map the Python API makes (the image equals a unit fed it by hand)."""
    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet

    image = REFS["image"]
    body = dict(prompt="a drawing", steps=2, width=64, height=64, seed=4, sampler_name="Euler", cfg_scale=7,
                alwayson_scripts={"controlnet": {"args": [{"image": _b64(image), "module": "lineart_realistic",
                                                           "model": "controlnet", "processor_res": 100}]}})
    r = requests.post(f"{server}/sdapi/v1/txt2img", json=body, timeout=300)
    assert r.status_code == 200, r.text
    made = preprocessors.preprocess(image, "lineart_realistic", resolution=100, models=root, backend="openvino")
    with pipelines.load(root / "models" / "tiny-cn", backend="openvino") as pipe:
        want = pipe.generate("a drawing", steps=2, width=64, height=64, seed=4, sampler="Euler", cfg=7,
                             controlnets=[ControlNet("controlnet", made, window="a1111")]).images[0]
    assert np.array_equal(_rgb(r.json()["images"][0]), want)
    assert "Module: lineart_realistic" in r.json()["info"]


def test_missing_file_names_where_it_was_looked_for(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    shutil.copytree(DATA, tmp_path / "models" / "tiny-cn")
    with live_server(ServeConfig(models=tmp_path / "models", backend="openvino")) as url:
        r = requests.post(f"{url}/controlnet/detect", json={"controlnet_module": "lineart_anime_denoise",
                                                            "controlnet_input_images": [_b64(REFS["image"])]},
                          timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "controlnet_module", r.text
    message = r.json()["message"]
    assert "erika.pth" in message and "<models>/" in message and str(tmp_path) not in message, message
