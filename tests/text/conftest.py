"""The committed CLIP tokenizer (tests/data/clip-tokenizer, built by scripts/make_clip_tokenizer.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sdrt.text import CLIPTokenizer

CLIP_DIR = Path(__file__).resolve().parents[1] / "data" / "clip-tokenizer"


@pytest.fixture(scope="session")
def clip_dir() -> Path:
    return CLIP_DIR


@pytest.fixture(scope="session")
def sd2_dir(tmp_path_factory) -> Path:
    """SD 2.x's tokenizer folder: the shared vocabulary with the configuration that pads with '!'."""
    folder = tmp_path_factory.mktemp("sd2-tokenizer")
    for name in ("vocab.json.gz", "merges.txt.gz"):
        shutil.copy(CLIP_DIR / name, folder / name)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(CLIP_DIR / "sd2" / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def sd1_tok() -> CLIPTokenizer:
    return CLIPTokenizer.from_folder(CLIP_DIR)


@pytest.fixture(scope="session")
def sd2_tok(sd2_dir) -> CLIPTokenizer:
    return CLIPTokenizer.from_folder(sd2_dir)


@pytest.fixture
def tok(sd1_tok) -> CLIPTokenizer:
    """A fresh SD 1.x tokenizer, for tests that add tokens."""
    return CLIPTokenizer.from_folder(CLIP_DIR)


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads((CLIP_DIR / "reference_ids.json").read_text(encoding="utf-8"))
