"""Single-file checkpoints, LoRAs and embeddings through the server, named only: a ``.safetensors``
checkpoint in --models binds onto its ONNX folder (--checkpoint-base), ``<lora:name:w>`` finds --lora-dir's file, an
embedding of --embedding-dir works by its trigger word. The images are checked against the ones
diffusers' own StableDiffusionPipeline made (tests/data/ckpt/pipe-sd15, see test_pipeline_weights.py
for the tolerance)."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
Image = pytest.importorskip("PIL.Image", reason="reading the PNGs needs Pillow")

TESTS = Path(__file__).resolve().parent.parent
D = TESTS / "data" / "ckpt" / "pipe-sd15"
FOLDER = TESTS / "data" / "pipelines" / "tiny-sd15"
CASES = json.loads((D / "cases.json").read_text())
CASE = CASES["case"]
MEAN_TOL = 24  # as tests/checkpoint/test_pipeline_weights.py


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("weights")
    for sub in ("models", "loras", "embeddings"):
        (root / sub).mkdir()
    shutil.copytree(FOLDER, root / "models" / "tiny-sd15")
    shutil.copy(D / "custom.safetensors", root / "models")
    shutil.copy(D / "tinylora.safetensors", root / "loras")
    shutil.copy(D / "tinyemb.safetensors", root / "embeddings")
    config = ServeConfig(models=root / "models", lora_dir=root / "loras", embedding_dir=root / "embeddings",
                         backend="openvino", checkpoint_base="tiny-sd15")
    with live_server(config) as u:
        yield u


def _post(client, prompt: str, model: str) -> tuple[np.ndarray, dict]:
    r = client.post("/sdapi/v1/txt2img", json={
        "prompt": prompt, "negative_prompt": CASE["negative_prompt"], "steps": CASE["steps"], "cfg_scale": CASE["cfg"],
        "sampler_name": CASE["sampler"], "seed": CASE["seed"], "width": CASE["width"], "height": CASE["height"],
        "override_settings": {"sd_model_checkpoint": model}})
    assert r.status_code == 200, r.text
    data = r.json()
    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(data["images"][0]))).convert("RGB")).astype(np.int32)
    return img, json.loads(data["info"])


def _mean_diff(a, b) -> float:
    return float(np.abs(a.astype(np.int32) - b.astype(np.int32)).mean())


def test_checkpoint_lora_and_embedding_by_name(url) -> None:
    refs = dict(np.load(D / "refs.npz"))
    with httpx.Client(base_url=url, timeout=120) as c:
        models = c.get("/sdapi/v1/sd-models").json()
        assert [(m["model_name"], m["title"].split(" [")[0]) for m in models] == [
            ("tiny-sd15", "tiny-sd15"), ("custom", "custom.safetensors")]
        assert [x["name"] for x in c.get("/sdapi/v1/loras").json()] == ["tinylora"]
        emb = c.get("/sdapi/v1/embeddings").json()["loaded"]
        assert list(emb) == ["tinyemb"] and emb["tinyemb"]["vectors"] >= 1
        img, info = _post(c, CASE["prompt"], "custom")
        assert _mean_diff(img, refs["ckpt"]) < MEAN_TOL and info["sd_model_name"] == "custom"
        assert "Model: custom" in info["infotexts"][0]
        img, info = _post(c, CASES["lora_prompt"], "custom.safetensors")
        assert _mean_diff(img, refs["lora"]) < MEAN_TOL and _mean_diff(img, refs["ckpt"]) > 0
        assert "tinylora: " in info["infotexts"][0]  # Lora hashes
        img, info = _post(c, CASES["emb_prompt"], "custom")
        assert _mean_diff(img, refs["emb"]) < MEAN_TOL and "tinyemb: " in info["infotexts"][0]
        plain, _ = _post(c, CASE["prompt"], "tiny-sd15")  # the folder's own weights: far from the checkpoint's
        assert _mean_diff(plain, refs["ckpt"]) > 40
        r = c.post("/sdapi/v1/txt2img", json={"prompt": "x <lora:tinyemb:1>", "width": 64, "height": 64})
        assert r.status_code == 400 and "LoRAs here: tinylora" in r.json()["detail"]
