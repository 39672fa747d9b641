"""diffusers' SDXL textual inversion (``textual_inversion_sdxl.py``'s ``learned_embeds.safetensors`` for CLIP-L and
``learned_embeds_2.safetensors`` for CLIP-G, each ``{"<cat-toy>": [2, 32]}``) given as either file or their folder,
against diffusers' two ``load_textual_inversion`` calls on the same tiny SDXL pipeline (scripts/make_sdxl_ti_refs.py):
the prompt's embeddings and pooled output, and the image. sdrt read ``learned_embeds.safetensors`` as a CLIP-L-only
embedding before (refused on SDXL) and ``learned_embeds_2.safetensors`` as another one.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.checkpoint import load_embedding
from sdrt.errors import WeightsError

TI = DATA / "sdxl_ti"
PROMPT = "a photo of a <cat-toy> on a wooden table"


@pytest.fixture(scope="module")
def sdxl():
    register("reference")
    with pipelines.load(DATA / "tiny-sdxl", backend="reference") as pipe:
        yield pipe


@pytest.mark.parametrize("given", ["learned_embeds.safetensors", "learned_embeds_2.safetensors", "."])
def test_either_file_or_the_folder_is_one_sdxl_embedding(given):
    emb = load_embedding(TI / given)
    assert emb.name == "<cat-toy>" and emb.count == 2 and set(emb.vectors) == {"clip_l", "clip_g"}
    assert emb.source == str(TI / "learned_embeds.safetensors")
    assert not np.array_equal(emb.vectors["clip_l"], emb.vectors["clip_g"])  # both 32 wide here: the order matters


def test_prompt_embeddings_and_image_match_diffusers_load_textual_inversion(sdxl):
    ref = np.load(TI / "refs.npz")
    sdxl.add_embedding(TI / "learned_embeds_2.safetensors")
    assert [e.name for e in sdxl.weights.embeddings] == ["<cat-toy>"]
    cond = sdxl.prompts.encode(PROMPT)
    np.testing.assert_allclose(cond.hidden, ref["prompt_embeds"], atol=2e-5)
    np.testing.assert_allclose(cond.pooled, ref["pooled"], atol=2e-5)
    got = sdxl(PROMPT, "blurry", steps=4, cfg=5.0, sampler="Euler", seed=7, width=64, height=64)
    assert_matches_diffusers(got, ref["image"])


def test_a_missing_half_is_one_line_naming_it(tmp_path, sdxl):
    shutil.copy(TI / "learned_embeds_2.safetensors", tmp_path)
    with pytest.raises(WeightsError, match=r"learned_embeds_2.safetensors is the text_encoder_2 \(CLIP-G\) half of "
                       r"diffusers' SDXL textual inversion, and its text_encoder \(CLIP-L\) half "
                       r"learned_embeds.safetensors is not beside it") as e:
        load_embedding(tmp_path)
    assert "\n" not in str(e.value)
    (tmp_path / "learned_embeds_2.safetensors").unlink()
    shutil.copy(TI / "learned_embeds.safetensors", tmp_path)
    with pytest.raises(WeightsError, match=r"embedding 'learned_embeds' \(learned_embeds"
                       r".safetensors\) is the text_encoder half of diffusers' SDXL textual inversion, and its "
                       r"text_encoder_2 half learned_embeds_2.safetensors is not beside it") as e:
        sdxl.add_embedding(tmp_path / "learned_embeds.safetensors")
    assert "\n" not in str(e.value)


def test_the_cli_refuses_a_lone_second_half_before_loading(tmp_path, capsys):
    from sdrt.cli import main

    shutil.copy(TI / "learned_embeds_2.safetensors", tmp_path)
    out = tmp_path / "z.png"
    assert main(["generate", str(DATA / "tiny-sdxl"), PROMPT, "--backend", "reference", "--embedding",
                 str(tmp_path / "learned_embeds_2.safetensors"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"--embedding {tmp_path / 'learned_embeds_2.safetensors'}: learned_embeds_2.safetensors is the " \
        "text_encoder_2 (CLIP-G) half" in err
    assert "Traceback" not in err and not out.exists()


def test_a_pair_of_two_tokens_or_an_empty_folder_is_refused(tmp_path):
    from sdrt.weights import Weights, stfile

    shutil.copy(TI / "learned_embeds.safetensors", tmp_path)
    w = Weights.open(TI / "learned_embeds_2.safetensors")
    stfile.write(tmp_path / "learned_embeds_2.safetensors", {"<dog>": np.asarray(w["<cat-toy>"])})
    with pytest.raises(WeightsError, match=r"learned_embeds.safetensors holds the token '<cat-toy>' and "
                       r"learned_embeds_2.safetensors '<dog>': they are not one training run's pair"):
        load_embedding(tmp_path / "learned_embeds_2.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match="the folder empty holds no learned_embeds.safetensors") as e:
        load_embedding(tmp_path / "empty")
    assert "--embedding-dir" in str(e.value)


def test_both_files_are_one_embedding_and_a_changed_half_is_read_again(tmp_path):
    """The pair given as both its files (a folder's listing) is added once; when learned_embeds_2 alone is written anew
    (a served embeddings folder), reread_embeddings(learned_embeds_2) reads the pair again: the CLIP-G rows change."""
    from safetensors.numpy import load_file, save_file

    for f in ("learned_embeds.safetensors", "learned_embeds_2.safetensors"):
        shutil.copy(TI / f, tmp_path / f)
    register("reference")
    with pipelines.load(DATA / "tiny-sdxl", backend="reference") as pipe:
        added = pipe.add_embedding(tmp_path / "learned_embeds.safetensors", tmp_path / "learned_embeds_2.safetensors")
        assert [e.name for e in pipe.weights.embeddings] == ["<cat-toy>"], added
        second = tmp_path / "learned_embeds_2.safetensors"
        arrays = load_file(second)
        save_file({k: (v * 2 + 1).astype(v.dtype) for k, v in arrays.items()}, second)
        assert pipe.reread_embeddings(second) == ["<cat-toy>"]
        [emb] = pipe.weights.embeddings
        np.testing.assert_array_equal(emb.vectors["clip_g"], next(iter(arrays.values())) * 2 + 1)


def test_an_sd1_embedding_on_sdxl_says_it_has_no_clip_g_half(sdxl):
    """It said "does not fit text_encoder_2: it has clip_l [2, 32], the encoder's tokens are 32 wide": a width that
    fits, named as the reason. The embedding has no vectors for CLIP-G at all."""
    emb = DATA.parent / "ckpt" / "pipe-sd15" / "tinyemb.safetensors"  # emb_params [2, 32]: SD 1.x's
    with pytest.raises(WeightsError) as e:
        sdxl.add_embedding(emb)
    msg = str(e.value)
    assert "has no vectors for text_encoder_2 (clip_g)" in msg and "tokens are 32 wide" not in msg, msg
