"""A Control-LoRA file in the models folder's ``ControlNet/`` (as A1111's models/ControlNet keeps Stability AI's
control-lora files) is listed by ``/controlnet/model_list`` and runs through ``alwayson_scripts.controlnet`` on an
SDXL model: the image is diffusers' (tests/checkpoint/test_control_lora.py's reference) within 1 level. The shipped
SDXL ControlNet graph is full size, so the graph lookup is pointed at the tiny folder's ControlNet graph stripped of
its weights, as the Python API's test does."""

from __future__ import annotations

import base64
import io
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

TESTS = Path(__file__).resolve().parents[1]
FOLDER = TESTS / "data" / "pipelines" / "tiny-sdxl-controlnet"
DATA = FOLDER / "controllora"
CASE = json.loads((DATA / "refs.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    sys.path.insert(0, str(TESTS / "checkpoint"))
    import single_file_helpers as h

    from sdrt.checkpoint import controlnet
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("cl-models")
    shutil.copytree(FOLDER, root / "tiny-xl", ignore=shutil.ignore_patterns("controllora"))
    (root / "ControlNet").mkdir()
    shutil.copy(DATA / CASE["file"], root / "ControlNet" / "control-lora-canny-rank128.safetensors")
    graph = h.stripped(FOLDER, ["controlnet"], tmp_path_factory.mktemp("cl-graph"))["controlnet"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(controlnet, "shipped_graph", lambda name: graph if name == "sdxl_controlnet" else None)
        with live_server(ServeConfig(models=root, backend="reference")) as url:
            yield url


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_a_control_lora_in_the_controlnet_folder_is_listed_and_runs(server) -> None:
    names = requests.get(f"{server}/controlnet/model_list", timeout=60).json()["model_list"]
    title = next(n for n in names if n.startswith("control-lora-canny-rank128"))
    refs = np.load(DATA / "refs.npz")
    body = {"prompt": CASE["prompt"], "negative_prompt": CASE["negative_prompt"], "sampler_name": "Euler",
            "steps": CASE["steps"], "seed": CASE["seed"], "cfg_scale": CASE["cfg"], "width": 64, "height": 64,
            "alwayson_scripts": {"controlnet": {"args": [
                {"image": "data:image/png;base64," + _b64(refs["edges"]), "weight": CASE["scale"][0],
                 "module": "none", "model": title}]}}}
    r = requests.post(f"{server}/sdapi/v1/txt2img", json=body, timeout=300)
    assert r.status_code == 200, r.text
    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
    diff = np.abs(img.astype(int) - refs["image"].astype(int))
    assert diff.max() <= 1, (diff.max(), diff.mean())
