"""The flow-family tests read tests/data/pipelines/tiny-{sd3,flux-dev,flux-schnell,chroma} (scripts/gen_flow_refs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sdrt import plugins

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
KINDS = ("sd3", "flux-dev", "flux-schnell", "chroma")


def folder(kind: str) -> Path:
    return DATA / f"tiny-{kind}"


def cases(kind: str) -> list[dict]:
    return json.loads((folder(kind) / "refs.json").read_text())


_REFS: dict[str, dict[str, np.ndarray]] = {}


def refs(kind: str) -> dict[str, np.ndarray]:
    if kind not in _REFS:
        with np.load(folder(kind) / "refs.npz") as z:
            _REFS[kind] = {k: z[k] for k in z.files}
    return _REFS[kind]


@pytest.fixture(scope="module", autouse=True)
def _fresh_registry():
    plugins.reset_registry()
    yield
    plugins.reset_registry()
