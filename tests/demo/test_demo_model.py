"""The embedded demo model (issue 15): shipped folder, tokenizer agreement, and prompt following.

The quality tests generate the 40 held-out captions (never seen in training; `heldout.json`, written by
scripts/demo_model/train.py) with seeds 0..39 through the real pipeline and measure each image with
`measure.py`: background colour, shape colour and the shape's cell of the 3x3 grid must all match.
At least 90% must pass, for each of four samplers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sdrt import pipelines
from sdrt.text import CLIPTokenizer

from .measure import check_image, measure

HERE = Path(__file__).parent
HELDOUT = json.loads((HERE / "heldout.json").read_text())
FOLDER = pipelines.DEMO_MODEL
PASS_RATE = 0.9
#: the demo's defaults (what `sdrt generate` uses): 20 steps, cfg 7, DPM++ 2M Karras
STEPS = 20
CFG = 7.0
SAMPLERS = ["DPM++ 2M Karras", "Euler", "Euler a", "DDIM"]
PARTS = ["text_encoder", "unet", "vae_decoder", "vae_encoder"]


def test_folder_layout_and_size() -> None:
    for rel in ["model_index.json", "scheduler/scheduler_config.json", "tokenizer/vocab.json", "tokenizer/merges.txt",
                *(f"{p}/model.onnx" for p in PARTS), *(f"{p}/config.json" for p in PARTS)]:
        assert (FOLDER / rel).is_file(), rel
    total = sum(p.stat().st_size for p in FOLDER.rglob("*") if p.is_file())
    assert total <= 8 * 1024 * 1024, f"demo folder is {total / 2**20:.2f} MiB, over 8 MiB"


def test_folder_is_sd15() -> None:
    folder = pipelines.ModelFolder.open(FOLDER)
    assert folder.family == "sd1"
    assert folder.prediction == "epsilon"
    assert folder.vae_scaling_factor == pytest.approx(0.18215)
    assert set(PARTS) <= set(folder.parts)


def test_tokenizer_matches_transformers() -> None:
    """sdrt's tokenizer on the shipped vocabulary subset gives transformers' CLIPTokenizer's ids."""
    tok = CLIPTokenizer.from_folder(FOLDER / "tokenizer")
    refs = HELDOUT["token_ids"]
    assert len(refs) >= 40
    wrong = {text: (tok(text), ids) for text, ids in refs.items() if tok(text) != ids}
    assert not wrong


def test_measure_on_exact_renders() -> None:
    """The measurement itself: a hand-made picture of each held-out case passes, a wrong one fails."""
    palette = HELDOUT["palette"]
    for case in HELDOUT["cases"]:
        img = np.empty((64, 64, 3), np.uint8)
        img[:] = palette[case["background"]]
        col, row = HELDOUT["cells"][case["position"]]
        y, x = 14 + 18 * row, 14 + 18 * col
        img[y - 8 : y + 8, x - 8 : x + 8] = palette[case["colour"]]
        assert check_image(img, case, HELDOUT) == ""
        other = dict(case, position="center" if case["position"] != "center" else "top left")
        assert "cell" in check_image(img, other, HELDOUT)
    blank = np.zeros((64, 64, 3), np.uint8)
    assert measure(blank, palette)["colour"] is None


@pytest.fixture(scope="module")
def pipe():
    p = pipelines.load(FOLDER)
    yield p
    p.close()


def _pass_rate(pipe, sampler: str, cases: list[dict]) -> tuple[float, list[str]]:
    fails = []
    for seed, case in enumerate(cases):
        image = pipe(case["prompt"], steps=STEPS, cfg=CFG, sampler=sampler, seed=seed)[0]
        why = check_image(image, case, HELDOUT)
        if why:
            fails.append(f"{case['prompt']!r} seed {seed}: {why}")
    return 1 - len(fails) / len(cases), fails


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_follows_held_out_prompts(pipe, sampler: str) -> None:
    rate, fails = _pass_rate(pipe, sampler, HELDOUT["cases"])
    assert rate >= PASS_RATE, f"{sampler}: {rate:.0%} pass; failures: {fails}"
