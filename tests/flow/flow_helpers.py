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


def tool_folder(tool: str, root: Path) -> Path:
    """tiny-flux-TOOL (``fill``, ``control``: scripts/gen_flux_tools_refs.py) as a whole folder: its transformer and
    model_index.json with tiny-flux-dev's other parts beside them (symbolic links)."""
    out = root / f"tiny-flux-{tool}"
    out.mkdir(parents=True, exist_ok=True)
    for src in (DATA / "tiny-flux-dev", DATA / f"tiny-flux-{tool}"):
        for p in src.iterdir():
            if p.name in ("refs.json", "refs.npz", "t5_corpus.json") or (src.name == "tiny-flux-dev" and p.name in (
                    "transformer", "model_index.json")):
                continue
            (out / p.name).symlink_to(p.resolve())
    return out
