"""sdrt serve's ``inpaint_only+lama``: the module in /controlnet/module_list; ControlNetLama.pth found in the
extension's layout beside the models; a txt2img unit with its image and mask giving the extension's image
(scripts/gen_lama_controlnet_refs.py, within 1 level on the float32 reference backend: A1111's per-image noise is
torch's seeded draw for one image, the reference's); /controlnet/detect with ``controlnet_masks`` giving the filled
picture (tests/pipelines/test_lama.py holds the fill against the extension's code)."""

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
from lama_helpers import make_lama, write_pth  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-controlnet"
REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "lama" / "refs.npz")


#: the module's A1111 root (the LaMa file under it), for the Python API's runs beside the server's
SERVER_ROOT: list[Path] = []


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a1111")
    SERVER_ROOT[:] = [root]
    shutil.copytree(DATA, root / "models" / "tiny-cn")
    folder = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "lama"
    folder.mkdir(parents=True)
    write_pth(folder / "ControlNetLama.pth", make_lama())
    return root


@pytest.fixture(scope="module")
def server(root) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", backend="reference")) as url:
        yield url


def test_lama_unit_and_detect(server) -> None:
    got = requests.get(f"{server}/controlnet/module_list", timeout=30).json()
    assert "inpaint_only+lama" in got["module_list"] and got["module_detail"]["inpaint_only+lama"]["sliders"] == []
    case = json.loads((DATA / "lama.json").read_text())[0]
    z, ref = np.load(DATA / "inpaint.npz"), np.load(DATA / "lama.npz")
    body = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], steps=case["steps"],
                cfg_scale=case["cfg"], seed=case["seed"], sampler_name="Euler", width=64, height=64,
                alwayson_scripts={"controlnet": {"args": [dict(model="controlnet", module="inpaint_only+lama",
                                                               image=_b64(z["picture"]), mask=_b64(z["mask"]))]}})
    r = requests.post(f"{server}/sdapi/v1/txt2img", timeout=300, json=body)
    assert r.status_code == 200, r.text
    info = json.loads(r.json()["info"])
    assert 'ControlNet 0: "Module: inpaint_only+lama, Model: controlnet' in info["infotexts"][0]
    assert np.abs(_rgb(r.json()["images"][0]).astype(int) - ref["image"][0]).max() <= 1
    rgba = REFS["up_rgba"]
    mask = np.repeat(rgba[:, :, 3:], 3, axis=2)
    r = requests.post(f"{server}/controlnet/detect", timeout=300, json={
        "controlnet_module": "inpaint_only+lama", "controlnet_input_images": [_b64(np.ascontiguousarray(rgba[:, :, :3]))],
        "controlnet_masks": [_b64(np.ascontiguousarray(mask))]})
    assert r.status_code == 200, r.text
    d = np.abs(_rgb(r.json()["images"][0]).astype(int) - REFS["up_map"][:, :, :3])
    assert d.max() <= 1 and (d > 0).mean() < 0.01
    r = requests.post(f"{server}/controlnet/detect", timeout=60, json={
        "controlnet_module": "inpaint_only+lama", "controlnet_input_images": [_b64(np.ascontiguousarray(rgba[:, :, :3]))],
        "controlnet_masks": [_b64(np.ascontiguousarray(mask[:10]))]})
    assert r.status_code == 400 and r.json()["field"] == "controlnet_masks[0]", r.text


def test_lama_leans_the_first_of_n_iter_only(server) -> None:
    """serve runs a request's ``n_iter`` batches as separate runs; the extension leans the job's first batch only
    (HackedImageRNG wraps ``p.rng`` before batch 0): the second image is the unleaned run of its seed (the Python
    API's, ``lean_noise=False``), not the leaned one a request of that seed alone gives."""
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet

    case = json.loads((DATA / "lama.json").read_text())[0]
    z, ref = np.load(DATA / "inpaint.npz"), np.load(DATA / "lama.npz")

    def body(seed: int, n_iter: int) -> dict:
        return dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], steps=case["steps"],
                    cfg_scale=case["cfg"], seed=seed, sampler_name="Euler", width=64, height=64, n_iter=n_iter,
                    alwayson_scripts={"controlnet": {"args": [dict(model="controlnet", module="inpaint_only+lama",
                                                                   image=_b64(z["picture"]), mask=_b64(z["mask"]))]}})

    r = requests.post(f"{server}/sdapi/v1/txt2img", timeout=300, json=body(case["seed"], 2))
    assert r.status_code == 200, r.text
    first, second = (_rgb(im).astype(int) for im in r.json()["images"])
    assert np.abs(first - ref["image"][0]).max() <= 1
    r = requests.post(f"{server}/sdapi/v1/txt2img", timeout=300, json=body(case["seed"] + 1, 1))
    alone = _rgb(r.json()["images"][0]).astype(int)
    assert np.abs(second - alone).max() >= 3
    unit = ControlNet(case["controlnet"], z["picture"], case["scale"], preprocessor="inpaint_only+lama",
                      control_mask=z["mask"], preprocessor_models=SERVER_ROOT[0])
    unit.lean_noise = False
    with pipelines.load(DATA, backend=fast_backend(), precision="fp32") as pipe:
        plain = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[unit], steps=case["steps"],
                              cfg=case["cfg"], sampler="Euler", seed=case["seed"] + 1, width=64, height=64).images[0]
    assert np.abs(second - plain.astype(int)).max() <= 1
