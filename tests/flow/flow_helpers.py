"""Shared by the flow-family tests: the folders under tests/data/pipelines/tiny-{sd3,flux-dev,flux-schnell,chroma}
(scripts/gen_flow_refs.py), their reference cases and data, and backend registration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from backend_helpers import PLUGINS, REQUIRED, register  # noqa: F401  (re-exported for the tests here)

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
