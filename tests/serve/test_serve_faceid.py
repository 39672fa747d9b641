"""IP-Adapter FaceID through the A1111 API, as sd-webui-controlnet takes it: a unit whose ``module`` is
``ip-adapter_face_id`` / ``ip-adapter_face_id_plus`` and whose ``model`` names a FaceID adapter in ``ControlNet/``;
InsightFace's buffalo_l is found in the models folder's ``insightface/models/buffalo_l`` (ComfyUI's layout) or in
sd-webui-controlnet's ``annotator/downloads/insightface/models/buffalo_l``. The images are diffusers' (the
references of tests/pipelines/test_faceid.py, made by scripts/gen_faceid_refs.py)."""

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
from pipeline_helpers import assert_matches_diffusers  # noqa: E402

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = TESTS / "data"
IPA = DATA / "ipadapter"
FACES = DATA / "faces"
REFS = np.load(FACES / "faceid_refs.npz")
META = json.loads((FACES / "faceid_refs.json").read_text())
CASES = {c["name"]: c for c in META["cases"]}


@pytest.fixture(scope="module")
def tiny_encoder_graph() -> Iterator[None]:
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graphs, "shipped_graph", lambda n: IPA / "clip_vision.onnx" if n == "clip_vision_h" else real(n))
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faceid-models")
    shutil.copytree(DATA / "pipelines" / "tiny-sd15", root / "tiny-sd15")
    (root / "ControlNet").mkdir()
    for plus, name in ((False, "ip-adapter-faceid_sd15.safetensors"), (True, "ip-adapter-faceid-plusv2_sd15.safetensors")):
        path, digest = ff.write(root / "ControlNet", "sd15", plus)
        assert digest == META["sha256"][path.name]
        path.rename(root / "ControlNet" / name)
    shutil.copy(IPA / "ip-adapter_tiny.safetensors", root / "ControlNet" / "ip-adapter_sd15.safetensors")
    shutil.copytree(IPA / "image_encoder", root / "ControlNet" / "image_encoder")
    shutil.copytree(FACES / "buffalo_l", root / "insightface" / "models" / "buffalo_l")
    return root


@pytest.fixture(scope="module")
def server(models, tiny_encoder_graph) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models, backend="reference")) as url:
        yield url


def _post(url: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/sdapi/v1/txt2img", json=body, timeout=300)


def _body(case: dict, unit: dict) -> dict:
    return dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], steps=case["steps"], width=64,
                height=64, seed=case["seed"], sampler_name=case["sampler"], cfg_scale=case["cfg"],
                alwayson_scripts={"controlnet": {"args": [unit]}})


def _unit(module: str, model: str, weight: float, picture: np.ndarray | None = None) -> dict:
    return {"enabled": True, "module": module, "model": model, "weight": weight,
            "image": _b64(ff.face_picture() if picture is None else picture)}


@pytest.mark.parametrize("name, module, model", [
    ("faceid/sd15/0.8", "ip-adapter_face_id", "ip-adapter-faceid_sd15 [0123abcd]"),
    ("faceid-plusv2/sd15/1.0", "ip-adapter_face_id_plus", "ip-adapter-faceid-plusv2_sd15"),
])
def test_a_faceid_unit_matches_diffusers(server, name, module, model) -> None:
    case = CASES[name]
    r = _post(server, _body(case, _unit(module, model, case["scale"])))
    assert r.status_code == 200, r.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
    assert_matches_diffusers([got], REFS[name])
    assert f"Module: {module}, Model: {model.split(' ')[0]}" in r.json()["info"]


@pytest.mark.parametrize("module, model, picture, field, words", [
    ("ip-adapter_face_id", "ip-adapter-faceid_sd15", "noface", "image", "finds no face"),
    ("ip-adapter_clip_sd15", "ip-adapter-faceid_sd15", None, "module", "send module ip-adapter_face_id"),
    ("ip-adapter_face_id_plus", "ip-adapter-faceid_sd15", None, "module", "send module ip-adapter_face_id"),
    ("ip-adapter_face_id", "ip-adapter_sd15", None, "module", "it is no FaceID adapter"),
])
def test_bad_faceid_units_are_400s_on_their_field(server, module, model, picture, field, words) -> None:
    case = CASES["faceid/sd15/0.8"]
    unit = _unit(module, model, 1.0, ff.no_face_picture() if picture == "noface" else None)
    r = _post(server, _body(case, unit))
    assert r.status_code == 400, r.text
    body = r.json()
    assert words in body["message"], body
    assert body.get("field") == f"alwayson_scripts.controlnet.args[0].{field}", body
    assert "\n" not in body["message"]


def test_a_picture_sent_as_input_image_is_named_so_in_the_error(server) -> None:
    """A unit with its picture in ``input_image`` (the extension's other name) and no face in it: the 400 names
    ``input_image``, the field the client sent (it named ``image`` until 2026-12-01)."""
    case = CASES["faceid/sd15/0.8"]
    unit = _unit("ip-adapter_face_id", "ip-adapter-faceid_sd15", 1.0, ff.no_face_picture())
    unit["input_image"] = unit.pop("image")
    r = _post(server, _body(case, unit))
    assert r.status_code == 400, r.text
    body = r.json()
    assert "finds no face" in body["message"] and "input_image" in body["message"], body
    assert body.get("field") == "alwayson_scripts.controlnet.args[0].input_image", body


def test_buffalo_l_is_found_in_sd_webui_controlnets_layout_or_refused(tmp_path) -> None:
    from sdrt.serve.controlnet import _face_models
    from sdrt.serve.errors import ApiError

    class Reg:
        models_dir = tmp_path / "webui" / "models"

    Reg.models_dir.mkdir(parents=True)
    with pytest.raises(ApiError, match="put that folder there") as info:
        _face_models(Reg(), "f.module")
    assert info.value.status == 400
    ext = tmp_path / "webui" / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "insightface"
    shutil.copytree(FACES / "buffalo_l", ext / "models" / "buffalo_l")
    assert _face_models(Reg(), "f.module") == ext / "models" / "buffalo_l"


def test_a_faceid_unit_embeds_the_largest_face_as_the_extension(server, monkeypatch) -> None:
    """sd-webui-controlnet's FaceID preprocessors embed the largest face (``InsightFaceModel.pick_largest_face``),
    not InsightFace's best scored (sdrt's API default, h94's ``faces[0]``): a larger, lower-scored face added to
    what the stand-in detector finds (its own faces are all ~48 px, the best also the largest) is the one embedded.
    The server runs in this process (a thread), so the patched detector is the one it calls."""
    from sdrt.pipelines.faces import Face, FaceModels

    real_detect, real_embed = FaceModels.detect, FaceModels.embed
    big: list = []
    embedded: list = []

    def detect(self, rgb):
        found = real_detect(self, rgb)
        if not found:  # the plan's dry run
            return found
        big[:] = [Face(found[-1].bbox + np.array([-20, -20, 20, 20], np.float32), 0.55, found[-1].kps)]
        return [*found, *big]

    def embed(self, rgb, face, normed=True):
        embedded.append(face)
        return real_embed(self, rgb, face, normed)

    monkeypatch.setattr(FaceModels, "detect", detect)
    monkeypatch.setattr(FaceModels, "embed", embed)
    case = CASES["faceid/sd15/0.8"]
    r = _post(server, {**_body(case, _unit("ip-adapter_face_id", "ip-adapter-faceid_sd15", case["scale"])), "steps": 1})
    assert r.status_code == 200, r.text
    assert embedded and embedded[-1] is big[0]
