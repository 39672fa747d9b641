"""The flow-family tests read tests/data/pipelines/tiny-{sd3,flux-dev,flux-schnell,chroma} (scripts/gen_flow_refs.py)."""

from __future__ import annotations

import importlib
import json
import os
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


PLUGINS = {"reference": ("sdrt_reference", "sdrt-reference"), "openvino": ("sdrt_openvino", "sdrt-openvino"),
           "ggml": ("sdrt_ggml", "sdrt-ggml")}
REQUIRED = {n for n in os.environ.get("SDRT_REQUIRE_PLUGINS", "").split(",") if n}


def register(name: str) -> None:
    """Register one backend plugin; skip when its package is not installed (unless nox required it)."""
    module, dist = PLUGINS[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        if name in REQUIRED:
            raise
        pytest.skip(f"the {dist} plugin is not installed ({exc})")
    reg = plugins.get_registry()
    if name not in reg.backends:
        reg.register_plugin(mod, name, distribution=dist)
    if name not in reg.backends:
        record = reg.plugins.get(name)
        assert name not in REQUIRED, f"required plugin {name} did not load: {record}"
        pytest.skip(f"the {name} backend did not load here: {record.state if record else '?'}")
