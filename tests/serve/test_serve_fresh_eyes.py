"""Notes a request hears in ``info.sdrt_not_honoured`` (a fresh-eyes pass; each failed before its fix)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from serve_helpers import live_server, needs_server

from sdrt import pipelines

pytestmark = needs_server
FLUX = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-flux-dev"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from sdrt.serve import ServeConfig

    root = tmp_path_factory.mktemp("models")
    shutil.copytree(pipelines.DEMO_MODEL, root / "demo")
    shutil.copytree(FLUX, root / "flux")
    with live_server(ServeConfig(models=root, backend="reference")) as u:
        yield u


def _notes(url: str, **body) -> list[str]:
    with httpx.Client(base_url=url, timeout=300) as client:
        r = client.post("/sdapi/v1/txt2img", json={"steps": 1, "seed": 1, "width": 64, "height": 64, **body})
    assert r.status_code == 200, r.text
    return json.loads(r.json()["info"]).get("sdrt_not_honoured", [])


def test_a_flux_cfg_with_no_negative_prompt_is_named(url):
    flux = {"override_settings": {"sd_model_checkpoint": "flux"}, "prompt": "a fox"}
    assert any(n.startswith("cfg_scale: 3 runs one pass") for n in _notes(url, cfg_scale=3, **flux))
    assert not any(n.startswith("cfg_scale") for n in _notes(url, cfg_scale=3, negative_prompt="blurry", **flux))
    demo = {"override_settings": {"sd_model_checkpoint": "demo"}, "prompt": "a red circle"}
    assert not any(n.startswith("cfg_scale") for n in _notes(url, cfg_scale=7, **demo))  # SD: CFG with ""


def test_a_hypernetwork_tag_is_named_as_removed(url):
    notes = _notes(url, prompt="a red circle <hypernet:ink:1>", override_settings={"sd_model_checkpoint": "demo"})
    assert any("<hypernet:ink:1>" in n and "removed" in n for n in notes), notes
