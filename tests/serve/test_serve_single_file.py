"""A ``.safetensors`` checkpoint in --models is served on its own (sdrt's shipped weight-free graphs) when
it holds a whole model; it binds onto --checkpoint-base only when that is set; a file that is not a
whole model but a denoiser (a transformer-only Flux file) is listed and runs with the files a request chooses
(tests/serve/test_serve_modules.py).

The end-to-end request runs ``tests/data/ckpt/pipe-sd15/custom.safetensors`` (an A1111/LDM file of
tiny-sd15's architecture) with sdrt's shipped SD 1.x graphs and CLIP tokenizer swapped for tiny-sd15's
(stripped of their weights, as sdrt ships graphs): full-size graphs are too heavy to run here. The image
is checked against the one diffusers' single-file loader made from that file (tolerance as
tests/checkpoint/test_pipeline_weights.py).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

from sdrt.graph import Graph
from sdrt.graph.strip import strip
from sdrt.serve.registry import Registry

TESTS = Path(__file__).resolve().parent.parent
D = TESTS / "data" / "ckpt" / "pipe-sd15"
FOLDER = TESTS / "data" / "pipelines" / "tiny-sd15"
CASES = json.loads((D / "cases.json").read_text())
CASE = CASES["case"]


def _flux_transformer_only(path: Path) -> Path:
    """A header of Black Forest Labs' Flux.1 dev keys (one block; the data section is not stored)."""
    sys.path.insert(0, str(TESTS / "checkpoint"))
    from single_file_helpers import sparse

    d = 3072
    return sparse(path, {"img_in.weight": (d, 64), "txt_in.weight": (d, 4096), "guidance_in.in_layer.weight": (d, 256),
                         "double_blocks.0.img_attn.qkv.weight": (3 * d, d),
                         "single_blocks.0.linear1.weight": (3 * d + 12288, d)})


@pytest.fixture
def models(tmp_path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    shutil.copytree(FOLDER, root / "tiny-sd15")
    shutil.copy(D / "custom.safetensors", root)
    _flux_transformer_only(root / "flux1-dev.safetensors")
    return root


def test_a_complete_checkpoint_is_served_on_its_own(models, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="sdrt.serve.registry"):
        reg = Registry(models)
    by_name = {m.name: m for m in reg.models}
    # flux1-dev.safetensors: transformer only, listed; it runs with the text encoders and VAE a request chooses
    assert list(by_name) == ["tiny-sd15", "custom.safetensors", "flux1-dev.safetensors"]
    assert "T5-XXL" in by_name["flux1-dev.safetensors"].needs and by_name["custom.safetensors"].needs is None
    (models / "notes.safetensors").write_bytes(b"\x08" + bytes(7) + b"{}      ")  # no model: skipped with a warning
    with caplog.at_level("WARNING", logger="sdrt.serve.registry"):
        again = Registry(models)
    assert "not serving notes.safetensors" in caplog.text and "notes.safetensors" not in [m.name for m in again.models]
    custom = by_name["custom.safetensors"]
    assert custom.path == models / "custom.safetensors" and custom.weights is None
    assert custom.model_name == "custom"
    assert custom.hash == hashlib.sha256((D / "custom.safetensors").read_bytes()).hexdigest()[:10]
    assert reg.model("custom") is custom


def test_a_ckpt_loras_and_embeddings_of_torch_are_listed(models, tmp_path, monkeypatch):
    """A .ckpt beside the .safetensors is served on its own; .pt LoRAs and .pt/.bin embeddings are listed
    (tests/data/torch/pipe-sd15: the same weights written by torch)."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    t = TESTS / "data" / "torch" / "pipe-sd15"
    shutil.copy(t / "custom.ckpt", models / "old.ckpt")
    (models / "notes.txt").write_text("not a model")
    loras, embs = tmp_path / "loras", tmp_path / "embs"
    loras.mkdir()
    embs.mkdir()
    shutil.copy(t / "tinylora.pt", loras)
    shutil.copy(D / "tinylora.safetensors", loras / "ink.safetensors")
    shutil.copy(t / "tinyemb.pt", embs)
    shutil.copy(TESTS / "data" / "torch" / "learned_embeds.bin", embs / "tok.bin")
    reg = Registry(models, lora_dir=loras, embedding_dir=embs)
    old = reg.model("old")
    assert old.path == models / "old.ckpt" and old.weights is None and reg.model("old.ckpt") is old
    assert [m.name for m in reg.models] == ["tiny-sd15", "custom.safetensors", "flux1-dev.safetensors", "old.ckpt"]
    assert reg.loras == {"ink": loras / "ink.safetensors", "tinylora": loras / "tinylora.pt"}
    assert reg.embeddings == {"tinyemb": embs / "tinyemb.pt", "tok": embs / "tok.bin"}


def test_pytorch_controlnets_are_listed_as_the_extension_lists_them(models, tmp_path, monkeypatch):
    """ControlNet/'s .pth/.pt/.ckpt/.bin files (A1111's control_v11p_sd15_canny.pth) are listed and named, as
    safetensors ones are (torchfile reads them); of one name in two formats, the .safetensors."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    nets = models / "ControlNet"
    nets.mkdir()
    torch_file = TESTS / "data" / "torch" / "params.pt"
    for name in ("control_v11p_sd15_canny.pth", "both.pth", "old.ckpt", "notes.txt"):
        shutil.copy(torch_file, nets / name)
    shutil.copy(D / "tinylora.safetensors", nets / "both.safetensors")
    reg = Registry(models)
    listed = {e.name: e.path for e in reg.controlnets}
    assert listed == {"both": nets / "both.safetensors", "control_v11p_sd15_canny": nets / "control_v11p_sd15_canny.pth",
                      "old": nets / "old.ckpt"}
    model = reg.model("tiny-sd15")
    canny = reg.controlnet("control_v11p_sd15_canny", model, "f")
    assert canny.path == nets / "control_v11p_sd15_canny.pth"
    assert reg.controlnet(canny.title, model, "f") == canny == reg.controlnet("control_v11p_sd15_canny.pth", model, "f")


def test_checkpoint_base_binds_the_files_onto_that_folder(models, tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    reg = Registry(models, checkpoint_base="tiny-sd15")
    custom = reg.model("custom")
    assert custom.path == models / "tiny-sd15" and custom.weights == models / "custom.safetensors"
    assert reg.model("flux1-dev").weights is not None  # bound (and refused, naming the family, when loaded)


@needs_server
def test_txt2img_on_a_single_file(models, tmp_path, monkeypatch):
    httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
    image_mod = pytest.importorskip("PIL.Image", reason="reading the PNGs needs Pillow")
    from sdrt.checkpoint import files
    from sdrt.serve import ServeConfig

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    graphs = {}
    for name, part in (("sd1_unet", "unet"), ("clip_l", "text_encoder"), ("vae4_decoder", "vae_decoder"),
                       ("vae4_encoder", "vae_encoder")):
        result = strip(Graph.load(FOLDER / part / "model.onnx"), tmp_path / "g" / f"{part}.onnx")
        result.weights_path.unlink()
        graphs[name] = result.graph_path
    monkeypatch.setattr(files, "shipped_graph", lambda name: graphs[name])
    monkeypatch.setattr(files, "release_tokenizer", lambda name: FOLDER / "tokenizer")
    shutil.rmtree(models / "tiny-sd15")
    config = ServeConfig(models=models, backend="openvino")
    with live_server(config) as url, httpx.Client(base_url=url, timeout=120) as c:
        listed = c.get("/sdapi/v1/sd-models").json()
        assert [m["model_name"] for m in listed] == ["custom", "flux1-dev"]  # the first is current
        r = c.post("/sdapi/v1/txt2img", json={
            "prompt": CASE["prompt"], "negative_prompt": CASE["negative_prompt"], "steps": CASE["steps"],
            "cfg_scale": CASE["cfg"], "sampler_name": CASE["sampler"], "seed": CASE["seed"], "width": CASE["width"],
            "height": CASE["height"]})
        assert r.status_code == 200, r.text
    data = r.json()
    img = np.asarray(image_mod.open(io.BytesIO(base64.b64decode(data["images"][0]))).convert("RGB"))
    ref = np.load(D / "refs.npz")["ckpt"]
    assert float(np.abs(img.astype(np.int32) - ref.astype(np.int32)).mean()) < 24
    info = json.loads(data["info"])["infotexts"][0]
    assert "Model: custom" in info and f"Model hash: {listed[0]['hash']}" in info


def test_the_default_model_is_the_first_that_makes_images_from_a_prompt(tmp_path, monkeypatch):
    """The first model in order was the default even when it cannot run txt2img (an inpainting model, the SDXL
    refiner, FLUX.1 Fill or Canny/Depth): every plain txt2img client then got a 400. A model a request or
    --default-model names stays the model."""
    from sdrt.serve import ServeConfig
    from sdrt.serve.state import ServerState

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    pipelines = TESTS / "data" / "pipelines"
    root = tmp_path / "models"
    root.mkdir()
    inpaint = pipelines / "tiny-sd15-inpaint"
    for name in ("a-inpaint", "a2-inpaint"):  # told by model_index.json's class (a UNet without its config.json), or
        (root / name / "unet").mkdir(parents=True)  # the UNet config's 9 input channels (the plain pipeline's class)
        for part in inpaint.iterdir():
            if part.name not in ("model_index.json", "unet"):
                (root / name / part.name).symlink_to(part)
        for part in (inpaint / "unet").iterdir():
            if part.name != "config.json" or name == "a2-inpaint":
                (root / name / "unet" / part.name).symlink_to(part)
    index = json.loads((inpaint / "model_index.json").read_text())  # ORTStableDiffusionInpaintPipeline
    (root / "a-inpaint" / "model_index.json").write_text(json.dumps(index))
    (root / "a2-inpaint" / "model_index.json").write_text(json.dumps({**index, "_class_name": "StableDiffusionPipeline"}))
    flux = pipelines / "tiny-flux-dev"  # as FLUX.1 Fill: its transformer config's 384 input channels
    (root / "a3-fill" / "transformer").mkdir(parents=True)
    for part in [*flux.iterdir(), *(flux / "transformer").iterdir()]:
        if part.name not in ("transformer", "config.json"):
            (root / "a3-fill" / part.relative_to(flux)).symlink_to(part)
    config = json.loads((flux / "transformer" / "config.json").read_text())
    (root / "a3-fill" / "transformer" / "config.json").write_text(json.dumps({**config, "in_channels": 384}))
    (root / "b-refiner").symlink_to(pipelines / "tiny-sdxl-refiner")
    (root / "c-inpainting.safetensors").symlink_to(TESTS / "data" / "ckpt" / "sd2-inpaint" / "512-inpainting-tiny"
                                                   ".safetensors")  # a single SD 2.x inpainting file
    (root / "d-custom.safetensors").symlink_to(D / "custom.safetensors")  # SD 1.x
    reg = Registry(root)
    assert [m.name for m in reg.models] == ["a-inpaint", "a2-inpaint", "a3-fill", "b-refiner",
                                            "c-inpainting.safetensors", "d-custom.safetensors"]
    assert reg.default.name == "d-custom.safetensors"
    assert ServerState(ServeConfig(models=root)).options()["sd_model_checkpoint"] == reg.default.title
    chosen = ServerState(ServeConfig(models=root, default_model="a-inpaint"))  # --default-model: as given
    assert chosen.options()["sd_model_checkpoint"] == reg.model("a-inpaint").title
    (root / "d-custom.safetensors").unlink()  # none can: the first, whose refusal says what it needs
    assert Registry(root).default.name == "a-inpaint"
    (root / "b-sd15").symlink_to(pipelines / "tiny-sd15")  # a folder that can, before the files
    assert Registry(root).default.name == "b-sd15"
