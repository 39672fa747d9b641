"""SD 3 without T5 (a folder without text_encoder_3/, tokenizer_3/) against diffusers' StableDiffusion3Pipeline
with ``text_encoder_3=None, tokenizer_3=None`` (scripts/gen_sd3_not5_refs.py): T5's states are zeros
``[1, max_sequence_length, joint_attention_dim]`` for the prompt and the negative prompt."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from flow_helpers import register

from sdrt import pipelines

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
SD3 = DATA / "tiny-sd3"
CASES = json.loads((SD3 / "refs_not5.json").read_text())


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    """The tiny SD3 folder without its T5 encoder and tokenizer (the other parts linked, not copied)."""
    root = tmp_path_factory.mktemp("sd3-no-t5")
    for entry in SD3.iterdir():
        if entry.name not in ("text_encoder_3", "tokenizer_3") and not entry.name.startswith("refs"):
            (root / entry.name).symlink_to(entry)
    return root


_PIPES: dict = {}


def _pipe(root: Path, backend: str):
    register(backend)
    if backend not in _PIPES:
        _PIPES[backend] = pipelines.load(root, backend=backend)
    return _PIPES[backend]


def _kwargs(case: dict) -> dict:
    return dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"],
                batch=case["batch"], cfg=case["cfg"], sampler="Euler", max_sequence_length=case["max_sequence_length"])


PARAMS = [(c["name"], b) for c in CASES for b in ("reference", "openvino", "ggml")]


@pytest.mark.parametrize(("name", "backend"), PARAMS, ids=[f"{n}-{b}" for n, b in PARAMS])
def test_image_matches_diffusers_without_t5(bare: Path, name: str, backend: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    refs = np.load(SD3 / "refs_not5.npz")
    images = _pipe(bare, backend)(case["prompt"], case["negative_prompt"] or "", **_kwargs(case))
    got = np.stack(images).astype(int)
    want = refs[f"{name}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got - want).max())
    assert diff <= 1, f"SD3 without T5, {name} on {backend}: max difference {diff}"


def test_text_states_match_diffusers_without_t5(bare: Path) -> None:
    refs = np.load(SD3 / "refs_not5.npz")
    prompts = _pipe(bare, "reference").prompts
    for case in CASES:
        for text, key in ((case["prompt"], "prompt_embeds"), (case["negative_prompt"] or "", "negative_prompt_embeds")):
            got = prompts.encode(text, 1, max_length=case["max_sequence_length"]).hidden
            want = refs[f"{case['name']}/{key}"]
            assert got.shape == want.shape, (key, got.shape, want.shape)
            np.testing.assert_allclose(got, want, atol=2e-4)


def test_missing_t5_matters_and_warns_once(bare: Path, caplog) -> None:
    """The same case with T5 (the folder's own reference) is another image: the zeros are not a no-op."""
    case = CASES[0]
    with_t5 = json.loads((SD3 / "refs.json").read_text())[0]
    assert {k: v for k, v in with_t5.items() if k != "name"} == {k: v for k, v in case.items() if k != "name"}
    full = np.load(SD3 / "refs.npz")[f"{with_t5['name']}/image"].astype(int)
    ours = np.load(SD3 / "refs_not5.npz")[f"{case['name']}/image"].astype(int)
    assert np.abs(full - ours).mean() > 5
    with caplog.at_level(logging.WARNING):
        pipelines.load(bare, backend="reference").close()
    lines = [r.getMessage() for r in caplog.records if "T5" in r.getMessage()]
    assert len(lines) == 1 and "no T5 text encoder" in lines[0], lines


def test_folder_without_model_index_is_sd3_not_flux(bare: Path, tmp_path: Path) -> None:
    """No model_index.json: transformer/ and text_encoder_2/ alone would be Flux's parts; the transformer's
    config (SD3Transformer2DModel) says SD3, and the plan names the missing T5."""
    root = tmp_path / "no-index"
    root.mkdir()
    for entry in bare.iterdir():
        if entry.name != "model_index.json":
            (root / entry.name).symlink_to(entry.resolve())
    with pipelines.load(root, backend="reference") as pipe:
        assert pipe.family.name == "sd3"
        plan = pipe.plan("a cat", steps=1, width=64, height=64).format()
        assert "text_encoder_3: none (no T5 text encoder)" in plan, plan
        assert "[1, 333, 64]" in plan or "[2, 333, 64]" in plan  # 77 CLIP tokens + 256 zero rows
        assert "text_encoder_3 " not in plan.split("memory:")[1]  # no memory counted for a part not loaded


def test_t5_false_leaves_a_present_t5_out() -> None:
    """``t5=False`` on the full tiny SD3 folder (T5 present): diffusers' text_encoder_3=None image, T5 not loaded."""
    case = CASES[0]
    refs = np.load(SD3 / "refs_not5.npz")
    register("reference")
    with pipelines.load(SD3, backend="reference", t5=False) as pipe:
        assert "text_encoder_3" not in pipe.parts
        got = np.stack(pipe(case["prompt"], case["negative_prompt"] or "", **_kwargs(case))).astype(int)
    assert int(np.abs(got - refs[f"{case['name']}/image"].astype(int)).max()) <= 1


def test_no_t5_flag_and_its_refusals(tmp_path: Path, capsys) -> None:
    from sdrt.cli import main
    from sdrt.errors import InputError

    register("reference")
    assert main(["generate", str(SD3), "a cat", "--no-t5", "--steps", "1", "--width", "64", "--height", "64",
                 "--backend", "reference", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "text_encoder_3: none" in out and "text_encoder_3 (text)" not in out, out
    with pytest.raises(InputError, match="needs its T5 encoder"):
        pipelines.load(DATA / "tiny-flux-dev", backend="reference", t5=False)
    rc = main(["generate", str(DATA / "tiny-flux-dev"), "a cat", "--no-t5", "--steps", "1", "--backend", "reference",
               "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("error:") == 1 and "--no-t5" in err and "Traceback" not in err, err
    assert "t5=False" not in err, err  # the command line's words only: it said "t5=False (--no-t5)"
    with pytest.raises(InputError) as e:
        pipelines.load(DATA / "tiny-flux-dev", backend="reference", t5=False)
    assert str(e.value).startswith("t5=False runs SD 3") and "--no-t5" not in str(e.value)  # the API's words only


def test_max_sequence_length_on_a_model_without_t5_is_refused_in_the_callers_words(capsys) -> None:
    """It read "error: max_sequence_length sets T5's token count" on the command line, the API's name."""
    from sdrt.cli import main

    register("reference")
    rc = main(["generate", str(DATA / "tiny-sd15"), "a cat", "--max-sequence-length", "64", "--steps", "1",
               "--backend", "reference", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("error: --max-sequence-length sets T5's token count"), err
    assert "max_sequence_length" not in err, err
