"""A VAE, a LoRA or a checkpoint replaced under the same name (written over in place, or renamed over) is the one the
next job runs, with or without a refresh: the pipeline bound the old file's weights, and served them (or, where it
read them again, the old header's offsets on the new bytes). Each image is checked against the one the same file
gives under another name, bit for bit on the same backend. A1111 reloads a LoRA on its mtime, and a VAE or checkpoint
only on another name; a user replacing a file expects the new one (docs/serve.md)."""

from __future__ import annotations

import base64
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

from sdrt.weights import Weights, stfile

pytestmark = needs_server
httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")
Image = pytest.importorskip("PIL.Image", reason="reading the PNGs needs Pillow")

TESTS = Path(__file__).resolve().parent.parent
D = TESTS / "data" / "ckpt" / "pipe-sd15"
FOLDER = TESTS / "data" / "pipelines" / "tiny-sd15"
JOB = {"prompt": "a red cat on a mat", "negative_prompt": "blurry", "steps": 3, "cfg_scale": 7.0,
       "sampler_name": "Euler", "seed": 7, "width": 64, "height": 64}


def _write(path: Path, source: Path, prefix: str = "", change: str = "", by: float = 0.0, scale: float = 1.0) -> Path:
    """``source``'s tensors under ``prefix`` (stripped), ``change``'s plus ``by`` and every ``lora_up`` times
    ``scale``: the same layout (names, shapes, offsets), other values."""
    w = Weights.open(source)
    out = {}
    for k in w:
        if not k.startswith(prefix):
            continue
        a = np.array(w[k], np.float32)
        if k.endswith(change) and change:
            a += by
        if "lora_up" in k:
            a *= scale
        out[k.removeprefix(prefix) if prefix == "first_stage_model." else k] = a
    stfile.write(path, out)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("replaced")
    models, loras, made = root / "models", root / "loras", root / "made"
    for d in (models, models / "VAE", loras, made, root / "embeddings"):
        d.mkdir()
    shutil.copytree(FOLDER, models / "tiny-sd15")
    _write(made / "vae_a.safetensors", D / "custom.safetensors", "first_stage_model.")
    _write(made / "vae_b.safetensors", D / "custom.safetensors", "first_stage_model.", "decoder.conv_out.bias", 0.4)
    shutil.copy(made / "vae_a.safetensors", models / "VAE" / "my_vae.safetensors")
    shutil.copy(made / "vae_b.safetensors", models / "VAE" / "vae_b.safetensors")
    _write(made / "lora_b.safetensors", D / "tinylora.safetensors", scale=3.0)
    shutil.copy(D / "tinylora.safetensors", loras / "style.safetensors")
    shutil.copy(made / "lora_b.safetensors", loras / "style_b.safetensors")
    _write(made / "ckpt_b.safetensors", D / "custom.safetensors", change="decoder.conv_out.bias", by=-0.4)
    shutil.copy(D / "custom.safetensors", models / "custom.safetensors")
    shutil.copy(made / "ckpt_b.safetensors", models / "custom_b.safetensors")
    return root


@pytest.fixture(scope="module")
def url(root):
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=root / "models", lora_dir=root / "loras", embedding_dir=root / "embeddings",
                                 backend="openvino", checkpoint_base="tiny-sd15", keep_models=3)) as u:
        yield u


def _image(c, **settings) -> np.ndarray:
    prompt = settings.pop("prompt", JOB["prompt"])
    r = c.post("/sdapi/v1/txt2img", json={**JOB, "prompt": prompt, "override_settings": settings})
    assert r.status_code == 200, r.text
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))


def _in_place(path: Path, source: Path) -> None:
    """Written over: the same inode, new bytes (what cp, or a trainer saving again, does)."""
    data = source.read_bytes()
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()


def test_a_vae_replaced_in_place_or_renamed_over_is_the_next_jobs(url, root) -> None:
    vae = root / "models" / "VAE" / "my_vae.safetensors"
    with httpx.Client(base_url=url, timeout=300) as c:
        b = _image(c, sd_model_checkpoint="tiny-sd15", sd_vae="vae_b.safetensors")
        a = _image(c, sd_model_checkpoint="tiny-sd15", sd_vae="my_vae.safetensors")
        assert np.abs(a.astype(int) - b.astype(int)).mean() > 1  # the two files give two images
        _in_place(vae, root / "made" / "vae_b.safetensors")
        assert np.array_equal(_image(c, sd_model_checkpoint="tiny-sd15", sd_vae="my_vae.safetensors"), b)
        os.replace(shutil.copy(root / "made" / "vae_a.safetensors", root / "vae.tmp"), vae)
        assert c.post("/sdapi/v1/refresh-vae").status_code == 200
        assert np.array_equal(_image(c, sd_model_checkpoint="tiny-sd15", sd_vae="my_vae.safetensors"), a)
        assert c.get("/sdrt/status").json()["workers"][0]["models_loaded"] == 1


def test_a_lora_replaced_is_read_again(url, root) -> None:
    lora = root / "loras" / "style.safetensors"
    with httpx.Client(base_url=url, timeout=300) as c:
        b = _image(c, sd_model_checkpoint="tiny-sd15", prompt=JOB["prompt"] + " <lora:style_b:1>")
        a = _image(c, sd_model_checkpoint="tiny-sd15", prompt=JOB["prompt"] + " <lora:style:1>")
        assert np.abs(a.astype(int) - b.astype(int)).mean() > 1
        _in_place(lora, root / "made" / "lora_b.safetensors")
        assert np.array_equal(_image(c, sd_model_checkpoint="tiny-sd15", prompt=JOB["prompt"] + " <lora:style:1>"), b)
        os.replace(shutil.copy(D / "tinylora.safetensors", root / "lora.tmp"), lora)
        assert c.post("/sdapi/v1/refresh-loras").status_code == 200
        assert np.array_equal(_image(c, sd_model_checkpoint="tiny-sd15", prompt=JOB["prompt"] + " <lora:style:1>"), a)


def test_a_checkpoint_replaced_is_loaded_again(url, root) -> None:
    ckpt = root / "models" / "custom.safetensors"
    with httpx.Client(base_url=url, timeout=300) as c:
        b = _image(c, sd_model_checkpoint="custom_b.safetensors")
        a = _image(c, sd_model_checkpoint="custom.safetensors")
        assert np.abs(a.astype(int) - b.astype(int)).mean() > 1
        _in_place(ckpt, root / "made" / "ckpt_b.safetensors")
        assert np.array_equal(_image(c, sd_model_checkpoint="custom.safetensors"), b)
        assert c.post("/sdapi/v1/refresh-checkpoints").status_code == 200  # the listing's hash follows the file
        title = next(m["title"] for m in c.get("/sdapi/v1/sd-models").json() if m["model_name"] == "custom")
        assert title == next(m["title"] for m in c.get("/sdapi/v1/sd-models").json()
                             if m["model_name"] == "custom_b").replace("custom_b", "custom")
        assert np.array_equal(_image(c, sd_model_checkpoint=title), b)
        # the current model's option reads as the listing does (a client shows the current model by that title)
        c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "custom.safetensors"}).raise_for_status()
        _in_place(ckpt, D / "custom.safetensors")
        assert c.post("/sdapi/v1/refresh-checkpoints").status_code == 200
        title = next(m["title"] for m in c.get("/sdapi/v1/sd-models").json() if m["model_name"] == "custom")
        assert c.get("/sdapi/v1/options").json()["sd_model_checkpoint"] == title
        assert np.array_equal(_image(c), a)
        c.post("/sdapi/v1/options", json={"sd_model_checkpoint": "tiny-sd15"}).raise_for_status()


def test_an_embedding_added_after_the_model_loaded_works_and_one_removed_is_gone(url, root) -> None:
    """The pipeline loaded the embeddings folder's files when it was built: one added later (and listed by
    /embeddings) was plain text in the prompt until the model was loaded again."""
    from sdrt import pipelines

    emb = root / "embeddings" / "tinyemb.safetensors"
    prompt = "a tinyemb cat on a mat"
    with pipelines.load(FOLDER, backend="openvino") as pipe:
        pipe.add_embedding(D / "tinyemb.safetensors")
        want = pipe(prompt, JOB["negative_prompt"], steps=JOB["steps"], cfg=JOB["cfg_scale"],
                    sampler=JOB["sampler_name"], seed=JOB["seed"], width=JOB["width"], height=JOB["height"])[0]
    with httpx.Client(base_url=url, timeout=300) as c:
        plain = _image(c, sd_model_checkpoint="tiny-sd15", prompt=prompt)
        shutil.copy(D / "tinyemb.safetensors", emb)
        assert c.post("/sdapi/v1/refresh-embeddings").status_code == 200
        assert list(c.get("/sdapi/v1/embeddings").json()["loaded"]) == ["tinyemb"]
        got = _image(c, sd_model_checkpoint="tiny-sd15", prompt=prompt)
        assert np.array_equal(got, want) and not np.array_equal(got, plain)
        emb.unlink()
        assert np.array_equal(_image(c, sd_model_checkpoint="tiny-sd15", prompt=prompt), plain)


def test_a_file_that_changes_during_a_job_is_a_503_to_retry(tmp_path) -> None:
    """A file replaced while a job reads it (a copy still under way) fails that job, not as the request's fault."""
    from sdrt.errors import FileChanged
    from sdrt.serve.jobs import _Generating, _public_error

    p = _write(tmp_path / "v.safetensors", D / "tinylora.safetensors")
    w = Weights.open(p)
    _in_place(p, _write(tmp_path / "b.safetensors", D / "tinylora.safetensors", scale=2.0))
    with pytest.raises(FileChanged) as exc:
        w[next(iter(w))]
    for raised in (exc.value, _Generating("tiny-sd15", {})):
        if isinstance(raised, _Generating):
            raised.__cause__ = exc.value
        err = _public_error(raised)
        assert err.status == 503 and "v.safetensors changed on disk since it was opened" in err.message
        assert "retry" in err.message and str(tmp_path) not in err.message
