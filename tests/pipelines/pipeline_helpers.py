"""Tiny diffusers pipelines exported to ONNX (tests/data/pipelines, made by scripts/gen_pipeline_refs.py).

``backend_name`` registers the backend a test runs on: the reference backend always; OpenVINO and
ggml when their plugin packages are installed (skipped with the reason otherwise, never faked).
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from sdrt import plugins

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
#: tiny-sdxl-dyn: SDXL exported with dynamic height and width (as Optimum does), with non-square references
FOLDERS = ["tiny-sd15", "tiny-sd15-inpaint", "tiny-sd2v", "tiny-sdxl", "tiny-sdxl-dyn"]
PLUGINS = {"reference": ("sdrt_reference", "sdrt-reference"), "openvino": ("sdrt_openvino", "sdrt-openvino"),
           "ggml": ("sdrt_ggml", "sdrt-ggml")}


REQUIRED = {n for n in os.environ.get("SDRT_REQUIRE_PLUGINS", "").split(",") if n}


def register(name: str) -> None:
    """Register one backend plugin in a fresh registry; skip when its package is not installed, unless
    ``nox -s tests`` installed it (``SDRT_REQUIRE_PLUGINS``): then a failure to load fails the test."""
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
        pytest.skip(f"the {name} backend did not load here: {record.state if record else '?'} "
                    f"{record.error if record else ''}")


def cases(folder: str) -> list[dict]:
    return json.loads((DATA / folder / "refs.json").read_text())


def refs(folder: str) -> np.lib.npyio.NpzFile:
    return np.load(DATA / folder / "refs.npz")


def call_kwargs(case: dict, ref: np.lib.npyio.NpzFile) -> dict:
    """The sdrt arguments of a reference case. The script's clip_skip is diffusers' (layers skipped);
    sdrt takes A1111's (1 = last layer), so it is one more."""
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], batch=case["batch"],
              clip_skip=(case["clip_skip"] or 0) + 1)
    if case["mode"] == "txt2img":
        kw.update(width=case["width"], height=case["height"])
    else:
        kw.update(init_image=ref["init_image"], strength=case["strength"])
    if case["mode"] == "inpaint":
        kw["mask"] = ref["mask"]
    return kw
