"""A model the server lists that cannot load (leftovers of the fresh-eyes passes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from serve_helpers import live_server, needs_server

pytestmark = needs_server
# SD 1.x's tensor names at a tiny width: listed (its keys say SD 1.x), refused when it binds onto the shipped graphs
TINY_LDM = Path(__file__).resolve().parents[1] / "data" / "ckpt" / "sd1" / "ldm.safetensors"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("models")
    shutil.copy(TINY_LDM, root / "resized.safetensors")
    with live_server(ServeConfig(models=root, backend="reference")) as u:
        yield u


def test_a_listed_model_that_cannot_load_is_named_with_why(url):
    """As A1111 answers a checkpoint that fails to load (500), with the model's name, why, and what to do; not
    "internal error". A retry reads the file again and says the same."""
    with httpx.Client(base_url=url, timeout=300) as client:
        assert [m["model_name"] for m in client.get("/sdapi/v1/sd-models").json()] == ["resized"]
        for _ in range(2):
            r = client.post("/sdapi/v1/txt2img", json={"prompt": "a fox", "steps": 1, "width": 64, "height": 64})
            assert r.status_code == 500, r.text
            assert r.json()["error"] == "WeightsError"  # the exception's type name, as A1111's handle_exception
            detail = r.json()["detail"]
            assert detail.startswith("the model resized.safetensors cannot be loaded: ") and "\n" not in detail
            assert "does not fit the SD 1.x architecture" in detail and "What to do:" in detail
            assert "internal error" not in detail.lower()
