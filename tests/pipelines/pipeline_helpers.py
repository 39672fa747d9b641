"""Tiny diffusers pipelines exported to ONNX (tests/data/pipelines, made by scripts/gen_pipeline_refs.py).

``backend_name`` registers the backend a test runs on: the reference backend always; OpenVINO and
ggml when their plugin packages are installed (skipped with the reason otherwise, never faked).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from backend_helpers import PLUGINS, REQUIRED, register  # noqa: F401  (re-exported for the tests here)

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
#: tiny-sdxl-dyn: SDXL exported with dynamic height and width (as Optimum does), with non-square references;
#: tiny-sd2-inpaint / tiny-sdxl-inpaint: 9-channel UNets against StableDiffusionInpaintPipeline /
#: StableDiffusionXLInpaintPipeline
FOLDERS = ["tiny-sd15", "tiny-sd15-inpaint", "tiny-sd2v", "tiny-sdxl", "tiny-sdxl-dyn", "tiny-sd2-inpaint",
           "tiny-sdxl-inpaint"]


def fast_backend() -> str:
    """OpenVINO when installed (for tests of many short runs whose numerics test_pipelines_diffusers checks), else
    the reference backend."""
    try:
        register("openvino")
        return "openvino"
    except pytest.skip.Exception:
        register("reference")
        return "reference"


def assert_matches_diffusers(images, want: np.ndarray) -> None:
    """sdrt's images against diffusers' (uint8): the same shape, no value more than 1 level off, at most 0.5% of
    the values off at all (float32 rounding differs between the backends and torch)."""
    got = np.stack(images).astype(np.int16)
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = np.abs(got - want.astype(np.int16))
    assert diff.max() <= 1, f"max difference {diff.max()}, mean {diff.mean():.4f}"
    assert (diff > 0).mean() <= 0.005, f"{(diff > 0).mean():.2%} of values differ"


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
