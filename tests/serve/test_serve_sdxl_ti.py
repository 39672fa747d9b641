"""``sdrt serve`` with diffusers' SDXL textual inversion in its embeddings folder (``learned_embeds.safetensors`` and
``learned_embeds_2.safetensors``, tests/pipelines/test_sdxl_ti.py): A1111's ``/sdapi/v1/embeddings`` lists the pair
once, under its trigger word (the placeholder token), not as two embeddings named after the files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from serve_helpers import live_server, needs_server

httpx = pytest.importorskip("httpx", reason="httpx is a test dependency: pip install httpx")

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"


@needs_server
def test_the_pair_is_one_embedding_named_by_its_token(tmp_path) -> None:
    from sdrt.serve import ServeConfig

    (tmp_path / "models").mkdir()
    emb = tmp_path / "embeddings"
    emb.mkdir()
    for f in ("learned_embeds.safetensors", "learned_embeds_2.safetensors"):
        shutil.copy(DATA / "sdxl_ti" / f, emb / f)
    with live_server(ServeConfig(models=tmp_path / "models", embedding_dir=emb, backend="reference")) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            loaded = c.get("/sdapi/v1/embeddings").json()["loaded"]
    assert list(loaded) == ["<cat-toy>"] and loaded["<cat-toy>"]["vectors"] == 2
