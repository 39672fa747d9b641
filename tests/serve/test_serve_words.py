"""A served request reads its own words (a newcomer's hunt): its fields, never a CLI flag or an API argument."""

from __future__ import annotations

import base64
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
Image = pytest.importorskip("PIL.Image", reason="the serve tests need Pillow")
requests = pytest.importorskip("requests", reason="the serve tests need requests")

DATA = Path(__file__).resolve().parents[1] / "data"
CN = DATA / "pipelines" / "tiny-sd15-controlnet"
LORA = DATA / "ckpt" / "sd1" / "lora_kohya.safetensors"
BASE = dict(prompt="a cat", steps=1, width=64, height=64, seed=11, sampler_name="Euler", cfg_scale=7)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("words-models")
    shutil.copytree(CN, root / "tiny-cn")
    shutil.copy(LORA, root / "ink.safetensors")  # a LoRA in the checkpoints folder: not served, and why
    (root / "Lora").mkdir()
    shutil.copy(LORA, root / "Lora" / "ink.safetensors")  # made for another SD 1.x width: refused by the model
    return root


@pytest.fixture(scope="module")
def url(models) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models, backend="openvino", lora_dir=models / "Lora")) as u:
        yield u


def _b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _post(url: str, route: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/sdapi/v1/{route}", json=body, timeout=300)


def test_a_lora_asked_for_as_the_checkpoint_names_the_prompt_tag(url) -> None:
    r = _post(url, "txt2img", dict(BASE, override_settings={"sd_model_checkpoint": "ink.safetensors"}))
    assert r.status_code == 400, r.text
    msg = r.json()["detail"]
    assert "kohya LoRA (not a checkpoint: pass it with a <lora:NAME:WEIGHT> tag in the prompt" in msg, msg
    assert "--lora " not in msg and "set_loras" not in msg and "in the API" not in msg and "not a model" not in msg


def test_a_threshold_a_the_picture_cannot_take_names_threshold_a(url) -> None:
    """tile_resample's down sampling rate (threshold_a) larger than the control image: the unit's field."""
    unit = {"model": "controlnet", "module": "tile_resample", "threshold_a": 8,
            "image": _b64(np.full((4, 4, 3), 128, np.uint8))}
    r = _post(url, "txt2img", dict(BASE, alwayson_scripts={"controlnet": {"args": [unit]}}))
    assert r.status_code == 400, r.text
    body = r.json()
    assert body.get("field") == "alwayson_scripts.controlnet.args[0].threshold_a", body
    assert "args[0].threshold_a" in body["detail"] and " low" not in body["detail"], body


@pytest.mark.parametrize("key", ["prompt", "negative_prompt"])
def test_a_lora_the_model_refuses_names_the_prompt_not_a_server_path(url, models, key) -> None:
    """The LoRA of a prompt tag that does not fit the model: the field was the LoRA's path on the server."""
    r = _post(url, "txt2img", dict(BASE, **{key: "a cat <lora:ink:1>"}))
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == key, body
    assert str(models) not in r.text and "ink.safetensors" in body["detail"], body


def test_a_size_the_model_refuses_says_the_width_that_was_sent(url) -> None:
    """width 100 runs as 96 (A1111's multiple of 8); the refusal said "96x64 was asked" of a request that sent 100."""
    r = _post(url, "txt2img", dict(BASE, width=100))
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == "width" and "(width: 100 ran as 96, a multiple of 8, as A1111 runs it)" in body["detail"]
