"""InstantID through the A1111 API, as sd-webui-controlnet takes it: two units, an ``instant_id_face_embedding`` one
whose ``model`` is InstantID's adapter (``ip-adapter_instant_id_sdxl``) and, after it, an
``instant_id_face_keypoints`` (or ``none``, a keypoint map sent as it is) one whose ``model`` is InstantID's
ControlNet (``control_instant_id_sdxl``: told by its name, it reads the face tokens as its text). antelopev2 is found
in the models folder's ``insightface/models/antelopev2``. The images are diffusers' (tests/pipelines/test_instantid.py's
references, made by scripts/gen_instantid_refs.py)."""

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
from serve_helpers import png_b64 as _b64

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "pipelines"))
import faceid_fixtures as ff  # noqa: E402
import instantid_fixtures as fx  # noqa: E402
from pipeline_helpers import assert_matches_diffusers  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = TESTS / "data"
REFS = np.load(fx.FACES / "instantid_refs.npz")
META = json.loads((fx.FACES / "instantid_refs.json").read_text())
CASE = META["cases"][0]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("instantid-models")
    shutil.copytree(DATA / "pipelines" / "tiny-sdxl-controlnet", root / "tiny-sdxl-controlnet")
    (root / "ControlNet").mkdir()
    path, digest = fx.write(root / "ControlNet")
    assert digest == META["sha256"][path.name]
    path.rename(root / "ControlNet" / "ip-adapter_instant_id_sdxl.safetensors")
    shutil.copytree(DATA / "pipelines" / "tiny-sdxl-controlnet" / "controlnet",
                    root / "ControlNet" / "control_instant_id_sdxl")
    shutil.copytree(DATA / "pipelines" / "tiny-sdxl-controlnet" / "controlnet", root / "ControlNet" / "control_canny_tiny")
    fx.antelopev2(root / "insightface" / "models")
    return root


@pytest.fixture(scope="module")
def server(models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models, backend="reference")) as url:
        yield url


def _body(units: list[dict]) -> dict:
    return dict(prompt=CASE["prompt"], negative_prompt=CASE["negative_prompt"], steps=CASE["steps"], width=64,
                height=64, seed=CASE["seed"], sampler_name=CASE["sampler"], cfg_scale=CASE["cfg"],
                alwayson_scripts={"controlnet": {"args": units}})


def _units(hint_module: str = "none", hint: np.ndarray | None = None) -> list[dict]:
    return [{"enabled": True, "module": "instant_id_face_embedding", "model": "ip-adapter_instant_id_sdxl",
             "weight": CASE["scale"], "image": _b64(ff.face_picture())},
            {"enabled": True, "module": hint_module, "model": "control_instant_id_sdxl [eb2d0a5e]",
             "weight": CASE["cn_scale"], "resize_mode": "Just Resize",
             "image": _b64(REFS["hint64"] if hint is None else hint)}]


def test_the_extensions_two_units_match_diffusers(server) -> None:
    r = requests.post(f"{server}/sdapi/v1/txt2img", json=_body(_units()), timeout=300)
    assert r.status_code == 200, r.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
    assert_matches_diffusers([got], REFS[CASE["name"]])
    info = r.json()["info"]
    assert "Module: instant_id_face_embedding, Model: ip-adapter_instant_id_sdxl" in info


def test_the_keypoints_module_runs_and_detect_draws_instantids_map(server) -> None:
    r = requests.post(f"{server}/controlnet/detect", json={
        "controlnet_module": "instant_id_face_keypoints", "controlnet_input_images": [_b64(ff.face_picture())],
        "controlnet_processor_res": 256}, timeout=300)
    assert r.status_code == 200, r.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
    assert got.shape == REFS["kps_map"].shape
    assert (got != REFS["kps_map"]).any(-1).mean() < 0.002
    r = requests.post(f"{server}/sdapi/v1/txt2img", json=_body(_units("instant_id_face_keypoints",
                                                                      ff.face_picture())), timeout=300)
    assert r.status_code == 200, r.text


def test_an_instantid_controlnet_without_its_adapter_unit_is_a_400(server) -> None:
    r = requests.post(f"{server}/sdapi/v1/txt2img", json=_body(_units()[1:]), timeout=300)
    assert r.status_code == 400, r.text
    body = r.json()
    assert "InstantID's ControlNet" in body["message"] and "\n" not in body["message"], body
    assert body.get("field") == "alwayson_scripts.controlnet.args[0]", body
    # the request's words: its units and fields, not the pipeline's arguments
    assert "instant_id_face_embedding unit" in body["message"], body
    assert "ip_adapter" not in body["message"] and "face_tokens" not in body["message"], body


def test_the_keypoints_module_on_another_net_leaves_it_reading_the_prompt(server) -> None:
    """The extension tells InstantID's ControlNet by its model's name alone: an instant_id_face_keypoints map sent to
    another net (the same weights under an ordinary name) leaves that net reading the prompt, 50+ levels from the
    InstantID net's image, not a face-token net (nor, without the adapter unit, a 400)."""
    def image(units: list[dict]) -> np.ndarray:
        r = requests.post(f"{server}/sdapi/v1/txt2img", json=_body(units), timeout=300)
        assert r.status_code == 200, r.text
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB")).astype(int)

    units = _units("instant_id_face_keypoints", ff.face_picture())
    face = image(units)
    units[1]["model"] = "control_canny_tiny"
    assert np.abs(image(units) - face).max() > 50
    image(units[1:])


def test_a_picture_without_a_face_is_a_400_on_that_units_image(server) -> None:
    for k in (0, 1):  # the adapter unit's face picture, then the keypoint unit's
        units = _units("instant_id_face_keypoints", ff.face_picture())
        units[k]["image"] = _b64(ff.no_face_picture())
        r = requests.post(f"{server}/sdapi/v1/txt2img", json=_body(units), timeout=300)
        assert r.status_code == 400, r.text
        body = r.json()
        assert "no face" in body["message"] and "\n" not in body["message"], body
        assert "preprocessor none" not in body["message"], body  # the pipeline's words, not the request's
        assert body.get("field") == ("alwayson_scripts.controlnet.args[0].image", "alwayson_scripts.controlnet.args[1]")[k], body
