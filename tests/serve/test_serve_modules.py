"""Separate VAE and text-encoder files through ``sdrt serve``, as A1111 (``sd_vae``), Forge and Easy Diffusion 3.5
(``forge_additional_modules``) send them.

The models folder holds tiny-sd15 (an ONNX folder), a ``VAE/`` folder with ``custom_vae.safetensors`` (the VAE of
``tests/data/ckpt/pipe-sd15/custom.safetensors``, an A1111/LDM file of tiny-sd15's architecture whose weights
differ from the folder's own), a ``text_encoder/`` folder, and a transformer-only Flux.1 dev file (a header of
BFL's keys). A VAE chosen either way gives the image of the Python API with that VAE (``pipelines.load(folder,
vae=file)``, whose binding tests/checkpoint/test_single_file_pipeline.py checks against the folder with that
checkpoint), pixel for pixel on the same backend. Text encoders are only listed and refused here: sdrt identifies a
text-encoder file by its release widths, which a tiny one lacks (the Python API's binding is tested in
tests/checkpoint).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server
from test_serve_single_file import _flux_transformer_only

from sdrt.serve.registry import Registry
from sdrt.weights import Weights, stfile

TESTS = Path(__file__).resolve().parent.parent
CUSTOM = TESTS / "data" / "ckpt" / "pipe-sd15" / "custom.safetensors"
FOLDER = TESTS / "data" / "pipelines" / "tiny-sd15"
JOB = {"prompt": "a red cat on a mat", "negative_prompt": "blurry", "steps": 3, "cfg_scale": 7.0,
       "sampler_name": "Euler", "seed": 7, "width": 64, "height": 64}


def _part(prefix: str, path: Path, strip: bool) -> Path:
    w = Weights.open(CUSTOM)
    stfile.write(path, {(k.removeprefix(prefix) if strip else k): np.ascontiguousarray(np.asarray(w[k]), np.float32)
                        for k in w if k.startswith(prefix)})
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(FOLDER, root / "tiny-sd15")
    (root / "VAE").mkdir()
    (root / "text_encoder").mkdir()
    _part("first_stage_model.", root / "VAE" / "custom_vae.safetensors", strip=True)
    _part("cond_stage_model.", root / "text_encoder" / "tiny_clip.safetensors", strip=False)
    _flux_transformer_only(root / "flux1-dev.safetensors")
    return root


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):

    from sdrt.serve import ServeConfig

    with pytest.MonkeyPatch.context() as mp:  # a module's server: monkeypatch itself is per test
        mp.setenv("SDRT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        with live_server(ServeConfig(models=models, backend="openvino", keep_models=3)) as url:
            yield url


def _client(url):
    httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
    return httpx.Client(base_url=url, timeout=120)


def _image(b64: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


@pytest.fixture(scope="module")
def python_api(models) -> dict[str, np.ndarray]:
    """The Python API's images of JOB on tiny-sd15, with its own VAE and with custom_vae.safetensors."""
    from sdrt import pipelines

    kw = dict(steps=JOB["steps"], cfg=JOB["cfg_scale"], sampler=JOB["sampler_name"], seed=JOB["seed"],
              width=JOB["width"], height=JOB["height"])
    out = {}
    for name, vae in (("own", None), ("custom", models / "VAE" / "custom_vae.safetensors")):
        with pipelines.load(FOLDER, backend="openvino", vae=vae) as pipe:
            out[name] = pipe(JOB["prompt"], JOB["negative_prompt"], **kw)[0]
    assert np.abs(out["own"].astype(int) - out["custom"].astype(int)).mean() > 1  # the VAE file changes the image
    return out


def test_the_registry_lists_the_files_and_the_transformer_only_model(models, monkeypatch, tmp_path):
    from sdrt.serve import modules

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    reg = Registry(models)
    assert [m.name for m in reg.models] == ["tiny-sd15", "flux1-dev.safetensors"]
    flux = reg.model("flux1-dev")
    assert flux.needs and "T5-XXL" in flux.needs and flux.weights is None
    assert [(e.name, e.folder) for e in modules.listing(reg).values()] == [
        ("custom_vae.safetensors", "vae"), ("tiny_clip.safetensors", "text_encoder")]
    vae = models / "VAE" / "custom_vae.safetensors"
    for name in ("custom_vae.safetensors", "custom_vae", "CUSTOM_VAE.SAFETENSORS", "/home/ed/models/vae/custom_vae.safetensors",
                 "C:\\EasyDiffusion\\models\\vae\\custom_vae.safetensors", "sub/custom_vae.safetensors"):
        assert modules.resolve(reg, name, "f").path == vae, name
    for bad in ("../VAE/custom_vae.safetensors", "/etc/passwd", "nope.safetensors", "", "tiny-sd15"):
        with pytest.raises(Exception, match="f: ") as exc:
            modules.resolve(reg, bad, "f")
        assert exc.value.status == 400 and exc.value.field == "f"
    assert modules.check_vae(reg, " ", "sd_vae") is None and modules.vae_option(reg, "") == "Automatic"  # as A1111
    with pytest.raises(Exception, match="no VAE file named 'tiny_clip'"):  # sd_vae takes the VAE folder's only
        modules.resolve(reg, "tiny_clip", "sd_vae", vae_only=True)
    files = tmp_path / "files"  # a transformer-only file listed first is not the default model
    files.mkdir()
    shutil.copy(models / "flux1-dev.safetensors", files / "a-flux.safetensors")
    shutil.copy(CUSTOM, files)
    assert [m.name for m in Registry(files).models] == ["a-flux.safetensors", "custom.safetensors"]
    assert Registry(files).default.name == "custom.safetensors"
    other = tmp_path / "vaes"
    other.mkdir()
    shutil.copy(vae, other / "other.safetensors")
    assert list(modules.listing(Registry(models, vae_dir=other))) == ["other.safetensors", "tiny_clip.safetensors"]


@needs_server
def test_listing_routes_and_refresh(server, models):
    with _client(server) as c:
        assert c.get("/sdapi/v1/sd-vae").json() == [{"model_name": "custom_vae.safetensors",
                                                      "filename": "custom_vae.safetensors"}]
        assert [m["model_name"] for m in c.get("/sdapi/v1/sd-modules").json()] == [
            "custom_vae.safetensors", "tiny_clip.safetensors"]
        assert "flux1-dev" in [m["model_name"] for m in c.get("/sdapi/v1/sd-models").json()]
        extra = models / "text_encoder" / "sub" / "t5_tiny.safetensors"
        extra.parent.mkdir()
        shutil.copy(models / "text_encoder" / "tiny_clip.safetensors", extra)
        try:
            for route in ("/sdapi/v1/refresh-vae", "/sdapi/v1/refresh-vae-and-text-encoders"):
                assert c.post(route).status_code == 200
            assert "t5_tiny.safetensors" in [m["model_name"] for m in c.get("/sdapi/v1/sd-modules").json()]
        finally:
            shutil.rmtree(extra.parent)
        options = c.get("/sdapi/v1/options").json()
        assert options["sd_vae"] == "Automatic" and options["forge_additional_modules"] == []


@needs_server
def test_a_vae_by_sd_vae_and_by_forge_additional_modules_gives_the_python_apis_image(server, models, python_api):
    vae = models / "VAE" / "custom_vae.safetensors"
    sha = hashlib.sha256(vae.read_bytes()).hexdigest()[:10]
    with _client(server) as c:
        c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "tiny-sd15", "sd_vae": "Automatic",
                                          "forge_additional_modules": []}).raise_for_status()
        plain = c.post("/sdapi/v1/txt2img", json=JOB).json()
        assert np.array_equal(_image(plain["images"][0]), python_api["own"])
        assert "VAE" not in json.loads(plain["info"])["infotexts"][0]
        got = {}
        r = c.post("/sdapi/v1/txt2img", json={**JOB, "override_settings": {"sd_vae": "custom_vae.safetensors"}})
        got["override_settings.sd_vae"] = r.json()
        assert c.get("/sdapi/v1/options").json()["sd_vae"] == "Automatic"  # one request only
        assert c.post("/sdapi/v1/options", json={"sd_vae": "custom_vae"}).status_code == 200
        assert c.get("/sdapi/v1/options").json()["sd_vae"] == "custom_vae.safetensors"
        got["sd_vae option"] = c.post("/sdapi/v1/txt2img", json=JOB).json()
        c.post("/sdapi/v1/options", json={"sd_vae": "None"}).raise_for_status()
        assert np.array_equal(_image(c.post("/sdapi/v1/txt2img", json=JOB).json()["images"][0]), python_api["own"])
        # Forge's option, as Easy Diffusion sends it: a path of its own models folder, matched by the file name
        c.post("/sdapi/v1/options", json={"forge_additional_modules": [f"/opt/ed/models/vae/{vae.name}"]}
               ).raise_for_status()
        assert c.get("/sdapi/v1/options").json()["forge_additional_modules"] == ["custom_vae.safetensors"]
        got["forge_additional_modules"] = c.post("/sdapi/v1/txt2img", json=JOB).json()
        c.post("/sdapi/v1/options", json={"forge_additional_modules": []}).raise_for_status()
        got["override_settings.forge_additional_modules"] = c.post("/sdapi/v1/txt2img", json={
            **JOB, "override_settings": {"forge_additional_modules": ["custom_vae.safetensors"]}}).json()
        assert c.get("/sdrt/status").json()["workers"][0]["models_loaded"] == 1  # the VAE swapped on one pipeline
    for how, res in got.items():
        assert np.array_equal(_image(res["images"][0]), python_api["custom"]), how
        info = json.loads(res["info"])
        assert f"VAE hash: {sha}, VAE: custom_vae.safetensors" in info["infotexts"][0], how
        assert (info["sd_vae_name"], info["sd_vae_hash"]) == ("custom_vae.safetensors", sha), how
        assert info["sdrt_not_honoured"] == [], how


@needs_server
def test_a_pytorch_vae_file_as_a1111s_models_vae_holds_them(server, models, python_api):
    """A1111's models/VAE holds many ``.vae.pt`` and ``.ckpt`` files: one (the same VAE, written by torch) is listed
    and gives the image of its .safetensors twin."""
    pt = models / "VAE" / "orange.vae.pt"
    shutil.copyfile(TESTS / "data" / "torch" / "pipe-sd15" / "custom.vae.pt", pt)
    try:
        with _client(server) as c:
            assert {"model_name": "orange.vae.pt", "filename": "orange.vae.pt"} in c.get("/sdapi/v1/sd-vae").json()
            r = c.post("/sdapi/v1/txt2img", json={**JOB, "override_settings": {"sd_vae": "orange.vae.pt",
                                                                               "sd_model_checkpoint": "tiny-sd15"}})
            assert r.status_code == 200, r.text
            assert np.array_equal(_image(r.json()["images"][0]), python_api["custom"])
    finally:
        pt.unlink()


@needs_server
def test_easy_diffusions_flush_model_changes_with_modules(server, models, python_api):
    """easydiffusion/easydiffusion ui/easydiffusion/backends/webui_common.py (commit 3262d9ef): ping() posts
    DEFAULT_WEBUI_OPTIONS and reads them back; flush_model_changes() posts the checkpoint (relative to ED's models
    folder) with the VAE and text-encoder paths as forge_additional_modules; generate_images() posts txt2img;
    refresh_models() posts refresh-checkpoints and refresh-vae-and-text-encoders."""
    with _client(server) as c:
        assert c.get("/internal/ping").status_code == 200
        c.post("/sdapi/v1/options", json={"show_progress_every_n_steps": 3, "show_progress_grid": True,
                                          "live_previews_enable": False, "forge_additional_modules": []}
               ).raise_for_status()
        assert "forge_additional_modules" in c.get("/sdapi/v1/options").json()  # how ED's tools tell Forge apart
        r = c.post("/sdapi/v1/options", json={
            "sd_model_checkpoint": "tiny-sd15",
            "forge_additional_modules": ["C:\\EasyDiffusion\\models\\vae\\custom_vae.safetensors"]})
        assert r.status_code == 200, r.text
        ed_job = {**JOB, "scheduler": "simple", "distilled_cfg_scale": 3.5, "batch_size": 1}  # generate_images()
        r = c.post("/sdapi/v1/txt2img", json={"force_task_id": "ed-1", **ed_job})
        assert r.status_code == 200, r.text
        with_vae = _image(r.json()["images"][0])
        assert "VAE: custom_vae.safetensors" in json.loads(r.json()["info"])["infotexts"][0]
        for kind in ("checkpoints", "vae-and-text-encoders"):
            assert c.post(f"/sdapi/v1/refresh-{kind}").status_code == 200
        # an unload (ED sends the model with no modules) goes back to the folder's own VAE
        c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "tiny-sd15", "forge_additional_modules": []}
               ).raise_for_status()
        own = _image(c.post("/sdapi/v1/txt2img", json={"force_task_id": "ed-2", **ed_job}).json()["images"][0])
        assert np.abs(own.astype(int) - with_vae.astype(int)).mean() > 1
        again = c.post("/sdapi/v1/txt2img", json={**ed_job, "override_settings": {"sd_vae": "custom_vae"}}).json()
        assert np.array_equal(_image(again["images"][0]), with_vae)  # the same as sd_vae's


@needs_server
def test_bad_names_are_400s_naming_the_field(server, models):
    with _client(server) as c:
        def err(path, body, status=400):
            r = c.post(path, json=body)
            assert r.status_code == status, (body, r.text)
            e = r.json()
            assert str(models) not in e["message"] and "Traceback" not in e["message"]
            return e

        e = err("/sdapi/v1/options", {"sd_vae": "nope.safetensors"})
        assert e["field"] == "sd_vae" and "custom_vae.safetensors" in e["message"]
        e = err("/sdapi/v1/options", {"sd_vae": "tiny_clip.safetensors"})  # a text encoder is no sd_vae
        assert e["field"] == "sd_vae"
        e = err("/sdapi/v1/options", {"forge_additional_modules": ["custom_vae.safetensors", "../../etc/passwd"]})
        assert e["field"] == "forge_additional_modules[1]" and "is a path" in e["message"]
        e = err("/sdapi/v1/options", {"forge_additional_modules": ["/etc/passwd"]})
        assert e["field"] == "forge_additional_modules[0]" and "'/etc/passwd'" in e["message"]
        assert err("/sdapi/v1/options", {"forge_additional_modules": 3}, 422)["field"] == "forge_additional_modules"
        assert err("/sdapi/v1/options", {"sd_vae": 3}, 422)["field"] == "sd_vae"
        e = err("/sdapi/v1/txt2img", {**JOB, "override_settings": {"sd_vae": "../VAE/custom_vae.safetensors"}})
        assert e["field"] == "override_settings.sd_vae"
        e = err("/sdapi/v1/txt2img", {**JOB, "override_settings": {"forge_additional_modules": ["x.safetensors"]}})
        assert e["field"] == "override_settings.forge_additional_modules[0]"
        # a file the model refuses (a tiny CLIP the pipeline cannot identify as a text encoder): a 400 naming it
        e = err("/sdapi/v1/txt2img", {**JOB, "override_settings": {"forge_additional_modules": ["tiny_clip"]}})
        assert e["field"] == "override_settings.forge_additional_modules" and "tiny_clip.safetensors" in e["message"]
        opts = c.get("/sdapi/v1/options").json()
        assert (opts["sd_vae"], opts["forge_additional_modules"]) == ("None", [])  # nothing stored by a refusal
        # still serving
        assert c.post("/sdapi/v1/txt2img", json=JOB).status_code == 200


@needs_server
def test_a_transformer_only_flux_file_says_which_files_it_needs(server):
    with _client(server) as c:
        r = c.post("/sdapi/v1/txt2img", json={**JOB, "override_settings": {"sd_model_checkpoint": "flux1-dev"}})
        assert r.status_code == 400, r.text
        e = r.json()
        assert e["field"] == "forge_additional_modules" and "T5-XXL" in e["message"]
        assert "forge_additional_modules" in e["message"] and "sd_vae" in e["message"]
        # with files chosen, they reach the pipeline, which names what does not fit (a 4-channel VAE for Flux)
        r = c.post("/sdapi/v1/txt2img", json={**JOB, "override_settings": {
            "sd_model_checkpoint": "flux1-dev", "sd_vae": "custom_vae.safetensors"}})
        assert r.status_code == 400, r.text
        e = r.json()
        assert e["field"] == "override_settings.sd_vae" and "custom_vae.safetensors" in e["message"], e
        assert "16-channel" in e["message"] and "/tmp" not in e["message"] and str(Path.home()) not in e["message"]


def test_a_transformer_only_flux_file_with_its_files_plans_on_the_shipped_graphs(tmp_path):
    """Full-size Flux.1 dev (BFL keys, fp8), clip_l, t5xxl and ae files (sparse: headers only) chosen as Easy Diffusion
    sends them: each file goes to its part by its tensors (not by its folder or its place in the list), and the
    worker's PipelineSpec builds a pipeline that plans a Flux dev job on the shipped graphs (nothing compiles: a
    full-size Flux run is out of this machine's reach). The model file sits outside --models, so the registry does not
    hash its 12 GB of (sparse) zeros."""
    import sys

    sys.path.insert(0, str(TESTS / "checkpoint"))
    import single_file_helpers as h
    from test_open_single_file import _graph_shapes, flux_shapes

    from sdrt.pipelines.singlefile import missing_parts
    from sdrt.serve import modules
    from sdrt.serve.registry import ModelEntry
    from sdrt.serve.spec import PipelineSpec

    flux = h.sparse(tmp_path / "flux1-dev.safetensors", flux_shapes(True, "model.diffusion_model.", 19, 38), "F8_E4M3")
    root = tmp_path / "models"
    (root / "VAE").mkdir(parents=True)
    (root / "text_encoder").mkdir()
    clip = h.sparse(root / "text_encoder" / "clip_l.safetensors", _graph_shapes("clip_l"))
    t5 = h.sparse(root / "VAE" / "t5xxl_fp16.safetensors", _graph_shapes("t5xxl"))  # in the wrong folder
    ae = h.sparse(root / "text_encoder" / "ae.safetensors", {**_graph_shapes("vae16_decoder"),
                                                             **_graph_shapes("vae16_encoder")}, "BF16")
    reg = Registry(root)
    entry = ModelEntry(flux.name, flux, "0" * 10, needs=missing_parts(flux))
    assert modules.part_only(flux) and "T5-XXL" in entry.needs
    notes: list[str] = []
    model = modules.choose(reg, entry, {}, {"forge_additional_modules": [
        "C:\\EasyDiffusion\\models\\text-encoder\\t5xxl_fp16.safetensors", "clip_l", "/ed/models/vae/ae.safetensors"]},
        notes)
    assert (model.vae, model.text_encoders, notes) == (ae, (t5, clip), [])
    assert model.key == entry.key and model.module_field == "forge_additional_modules"  # one pipeline per model
    pipe = PipelineSpec(model.path, "reference", vae=model.vae, text_encoders=model.text_encoders).build()
    assert pipe.folder.family == "flux"
    plan = pipe.plan("a red fox", width=256, height=256, steps=4).format()
    assert "guidance [1]" in plan and "input_ids [1, 512]" in plan
    assert all(not p.sessions for p in pipe.parts.values())


@needs_server
def test_switching_the_vae_back_and_forth_keeps_one_pipeline_and_gives_each_vaes_image(server, models, python_api):
    """A1111 and Forge swap only the VAE: the model's pipeline stays (one per worker, its UNet and text encoder kept
    compiled), and each switch gives the Python API's image of a pipeline loaded with that VAE, bit for bit."""
    with _client(server) as c:
        c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "tiny-sd15", "sd_vae": "Automatic",
                                          "forge_additional_modules": []}).raise_for_status()
        for vae in ("custom_vae.safetensors", "Automatic", "custom_vae", "None", "custom_vae.safetensors"):
            c.post("/sdapi/v1/options", json={"sd_vae": vae}).raise_for_status()
            r = c.post("/sdapi/v1/txt2img", json=JOB)
            assert r.status_code == 200, r.text
            want = python_api["own" if vae in ("Automatic", "None") else "custom"]
            assert _image(r.json()["images"][0]).tobytes() == want.tobytes(), vae
        status = c.get("/sdrt/status").json()["workers"][0]
        assert status["models_loaded"] == 1
        c.post("/sdapi/v1/options", json={"sd_vae": "Automatic"}).raise_for_status()


@needs_server
def test_a_bad_vae_file_is_one_400_about_sd_vae_and_loses_nothing(server, models, python_api):
    """A VAE file that cannot be read is refused when it is chosen (the option is not stored); a VAE of another
    family (16 channels, for Flux) is refused by the job, naming sd_vae; either way the VAE in use stays and the next
    image is the one before, bit for bit, from the same pipeline."""
    import sys

    sys.path.insert(0, str(TESTS / "checkpoint"))
    import single_file_helpers as h
    from test_open_single_file import _graph_shapes

    folder = models / "VAE"
    data = (folder / "custom_vae.safetensors").read_bytes()
    (folder / "broken.safetensors").write_bytes(data[: len(data) // 3])
    h.sparse(folder / "ae.safetensors", {**_graph_shapes("vae16_decoder"), **_graph_shapes("vae16_encoder")}, "BF16")
    try:
        with _client(server) as c:
            c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "tiny-sd15", "sd_vae": "custom_vae",
                                              "forge_additional_modules": []}).raise_for_status()
            before = c.post("/sdapi/v1/txt2img", json=JOB).json()
            assert _image(before["images"][0]).tobytes() == python_api["custom"].tobytes()
            for body, field in (({"sd_vae": "broken"}, "sd_vae"),
                                ({**JOB, "override_settings": {"sd_vae": "broken.safetensors"}},
                                 "override_settings.sd_vae")):
                r = c.post("/sdapi/v1/options" if "prompt" not in body else "/sdapi/v1/txt2img", json=body)
                assert r.status_code == 400, r.text
                e = r.json()
                assert e["field"] == field and "broken.safetensors" in e["message"] and "truncated" in e["message"]
                assert "\n" not in e["message"] and str(models) not in e["message"]
            assert c.get("/sdapi/v1/options").json()["sd_vae"] == "custom_vae.safetensors"  # not stored
            c.post("/sdapi/v1/options", json={"sd_vae": "ae.safetensors"}).raise_for_status()  # a VAE, of Flux
            r = c.post("/sdapi/v1/txt2img", json=JOB)
            assert r.status_code == 400, r.text
            e = r.json()
            assert e["field"] == "sd_vae" and "ae.safetensors" in e["message"] and "16-channel" in e["message"], e
            assert "sd_vae" in e["message"] and "\n" not in e["message"] and str(models) not in e["message"]
            c.post("/sdapi/v1/options", json={"sd_vae": "custom_vae"}).raise_for_status()
            after = c.post("/sdapi/v1/txt2img", json=JOB).json()
            assert _image(after["images"][0]).tobytes() == python_api["custom"].tobytes()
            assert c.get("/sdrt/status").json()["workers"][0]["models_loaded"] == 1
            c.post("/sdapi/v1/options", json={"sd_vae": "Automatic"}).raise_for_status()
    finally:
        for name in ("broken.safetensors", "ae.safetensors"):
            (folder / name).unlink()


@needs_server
def test_a_vae_switch_sent_while_a_job_runs_waits_for_it(server, models):
    """A request with another VAE, sent while a long job runs, is served after it on the same pipeline: the running
    job's image is the Python API's with the VAE it started with."""
    import threading
    import time

    from sdrt import pipelines

    long_job = {**JOB, "steps": 40, "seed": 11}
    kw = dict(steps=40, cfg=JOB["cfg_scale"], sampler=JOB["sampler_name"], seed=11, width=64, height=64)
    with pipelines.load(FOLDER, backend="openvino") as pipe:
        want_long = pipe(JOB["prompt"], JOB["negative_prompt"], **kw)[0]
    with pipelines.load(FOLDER, backend="openvino", vae=models / "VAE" / "custom_vae.safetensors") as pipe:
        want_custom = pipe(JOB["prompt"], JOB["negative_prompt"], **{**kw, "steps": 3, "seed": 7})[0]
    with _client(server) as c:
        c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "tiny-sd15", "sd_vae": "Automatic",
                                          "forge_additional_modules": []}).raise_for_status()
        out = {}
        first = threading.Thread(target=lambda: out.setdefault("long", c.post("/sdapi/v1/txt2img", json=long_job)))
        first.start()
        deadline = time.time() + 60
        while c.get("/sdapi/v1/progress?skip_current_image=true").json()["state"]["sampling_step"] < 1:
            assert time.time() < deadline and first.is_alive()
            time.sleep(0.01)
        r = c.post("/sdapi/v1/txt2img", json={**JOB, "override_settings": {"sd_vae": "custom_vae"}})
        first.join(60)
        assert r.status_code == 200 and out["long"].status_code == 200
        assert _image(out["long"].json()["images"][0]).tobytes() == want_long.tobytes()
        assert _image(r.json()["images"][0]).tobytes() == want_custom.tobytes()
        assert c.get("/sdrt/status").json()["workers"][0]["models_loaded"] == 1


def test_the_folder_listing_is_read_again_only_when_a_folder_changes(tmp_path, monkeypatch):
    """The VAE and text-encoder folders are listed once and kept while no folder's mtime changes (a folder of
    thousands of files is not walked per request); a file added, renamed or removed, in a subfolder too, shows at the
    next call, with no refresh. A folder read within 2 s of a change is read again next time (a coarse mtime)."""
    import os

    from sdrt.serve import modules

    (tmp_path / "VAE" / "sub").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "VAE" / f"v{i}.safetensors").write_bytes(b"")
    reg = Registry(tmp_path)
    reads = []
    real = modules._read_files
    monkeypatch.setattr(modules, "_read_files", lambda folder: reads.append(folder) or real(folder))
    old = 1_000_000_000  # folders last changed long ago: not racy
    for d in (tmp_path / "VAE", tmp_path / "VAE" / "sub", tmp_path):
        os.utime(d, ns=(old, old))
    modules.forget()
    assert list(modules.listing(reg)) == ["v0.safetensors", "v1.safetensors", "v2.safetensors"]
    assert modules.resolve(reg, "V1", "sd_vae", vae_only=True).name == "v1.safetensors"
    assert len(reads) == 1
    for _ in range(3):
        modules.listing(reg)
    assert len(reads) == 1  # nothing changed: not read again
    (tmp_path / "VAE" / "sub" / "new.vae.pt").write_bytes(b"")
    assert "new.vae.pt" in modules.listing(reg) and len(reads) == 2
    modules.listing(reg)
    assert len(reads) == 3  # changed just now: read again until its mtime is 2 s old
    assert modules.resolve(reg, "new.vae", "sd_vae", vae_only=True).name == "new.vae.pt"
    (tmp_path / "VAE" / "v0.safetensors").unlink()
    with pytest.raises(Exception, match="no VAE file named 'v0'"):
        modules.resolve(reg, "v0", "sd_vae", vae_only=True)
    for d in (tmp_path / "VAE", tmp_path / "VAE" / "sub"):
        os.utime(d, ns=(old + 1, old + 1))
    modules.listing(reg)
    n = len(reads)
    modules.listing(reg)
    assert len(reads) == n
    modules.forget()  # /refresh-vae
    modules.listing(reg)
    assert len(reads) == n + 1


@needs_server
def test_reload_checkpoint_on_a_transformer_only_file_is_a_400_naming_its_files(server):
    """``/reload-checkpoint`` loads the current model as a request without overrides would: with the sd_vae and
    forge_additional_modules options; a transformer-only file without them was a 500 "internal error (ModelError)"
    (a traceback in the log, the connection dropped)."""
    with _client(server) as c:
        assert c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "flux1-dev"}).status_code == 200
        try:
            r = c.post("/sdapi/v1/reload-checkpoint")
            assert r.status_code == 400, r.text
            e = r.json()
            assert e["field"] == "forge_additional_modules" and "T5-XXL" in e["message"], e
        finally:
            c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "tiny-sd15"})
        assert c.post("/sdapi/v1/reload-checkpoint").status_code == 200
        assert c.post("/sdapi/v1/txt2img", json=JOB).status_code == 200


def test_a_t5_chosen_for_an_sd3_file_without_one_loads_it_again_with_and_without(tmp_path):
    """Full-size sd3_medium_incl_clips.safetensors (sparse; no T5, a whole model to the server) with
    forge_additional_modules naming t5xxl_fp16: the worker first ran it without T5, the file dropped without a word,
    then refused it with a 400. Forge loads the model again when its modules change; so does the worker now: the
    pipeline holds text_encoder_3 from the T5 file, as ``pipelines.load(f, text_encoders=[t5])`` does, and a later
    request without the T5 loads it again without that part. A refused file on the way keeps the pipeline held."""
    import dataclasses
    import sys

    sys.path.insert(0, str(TESTS / "checkpoint"))
    from test_sd3_medium import _incl_clips_and_t5

    from sdrt import pipelines
    from sdrt.serve.errors import ApiError
    from sdrt.serve.jobs import Worker
    from sdrt.serve.registry import ModelEntry
    from sdrt.serve.spec import PipelineSpec

    f, t5 = _incl_clips_and_t5(tmp_path)
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(t5.read_bytes()[:100])
    entry = ModelEntry(f.name, f, "0" * 10)
    worker = Worker("w", None, None, lambda m, d: PipelineSpec(m.path, "reference", vae=m.vae,  # type: ignore[arg-type]
                                                                   text_encoders=m.text_encoders))
    pipe = worker.pipeline(entry)
    assert "text_encoder_3" not in pipe.parts
    with pipelines.load(f, backend="reference", text_encoders=[t5]) as ref:
        want = set(ref.parts)
    chosen = dataclasses.replace(entry, text_encoders=(t5,), module_field="forge_additional_modules")
    with_t5 = worker.pipeline(chosen)
    assert with_t5 is not pipe and set(with_t5.parts) == want and "text_encoder_3" in want
    assert with_t5.weights.part_files["text_encoder_3"] == t5 and list(worker.pipes.values()) == [with_t5]
    assert worker.pipeline(chosen) is with_t5  # the same choice again: no load
    with pytest.raises(ApiError) as e:  # a refused file: a 400 naming the field, the pipeline kept
        worker.pipeline(dataclasses.replace(chosen, text_encoders=(t5, bad)))
    assert e.value.status == 400 and e.value.field == "forge_additional_modules", e.value.message
    assert "cut.safetensors" in e.value.message and str(tmp_path) not in e.value.message, e.value.message
    assert list(worker.pipes.values()) == [with_t5]
    again = worker.pipeline(entry)  # no T5 chosen any more: loaded again without it
    assert again is not with_t5 and "text_encoder_3" not in again.parts and list(worker.pipes.values()) == [again]
    again.close()
