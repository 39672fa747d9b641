"""What the EDM tests share (tests/pipelines/test_edm.py, tests/checkpoint/test_edm_files.py): diffusers' captured
images and configs (scripts/make_edm_refs.py) and tiny-sdxl set up as Playground v2.5 / CosXL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "data" / "pipelines"
SPEC = json.loads((DATA / "edm_refs.json").read_text())
REFS = np.load(DATA / "edm_refs.npz")
COMMON = SPEC["common"]


def edm_copy(model: str, out: Path, **vae: object) -> Path:
    """tiny-sdxl with the scheduler and VAE configs diffusers ran it with as ``model`` (``playground``, ``cosxl``)."""
    shutil.copytree(DATA / "tiny-sdxl", out)
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(SPEC[model]["scheduler"]))
    for part in ("vae_decoder", "vae_encoder"):
        cfg = out / part / "config.json"
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **SPEC[model].get("vae", {}), **vae}))
    return out


def init_image() -> np.ndarray:
    """gen_pipeline_refs.init_image (64x64): a gradient, a red square and a blue disc."""
    y, x = np.mgrid[0:64, 0:64].astype(np.float32) / 63
    img = np.stack([x, y, 1 - (x + y) / 2], axis=-1)
    img[16:40, 20:44] = (0.9, 0.2, 0.1)
    yy, xx = np.mgrid[0:64, 0:64]
    img[(yy - 44) ** 2 + (xx - 18) ** 2 < 100] = (0.1, 0.3, 0.9)
    return (img * 255).round().astype(np.uint8)


def case_kwargs(case: dict) -> dict:
    kw = dict(steps=COMMON["steps"], cfg=COMMON["cfg"], sampler=case["sampler"], seed=COMMON["seed"],
              width=COMMON["width"], height=COMMON["height"])
    if case["mode"] == "img2img":
        kw.update(init_image=init_image(), strength=case["strength"])
    return kw


def ref_name(case: dict) -> str:
    return f"{case['model']}/{case['mode']}/{case['sampler']}"
