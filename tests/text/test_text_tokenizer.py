"""CLIPTokenizer against transformers' CLIPTokenizer (reference ids in tests/data/clip-tokenizer)."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdrt.errors import ModelError, SdrtError
from sdrt.text import CLIPTokenizer, TokenizerError


@pytest.mark.parametrize("config", ["sd1", "sd2"])
def test_ids_equal_transformers_on_the_whole_corpus(config, reference, sd1_tok, sd2_tok):
    tok = sd1_tok if config == "sd1" else sd2_tok
    texts = reference["texts"]
    assert len(texts) >= 200
    wrong = [(t, tok.encode(t), row["ids"]) for t, row in zip(texts, reference[config]) if tok.encode(t) != row["ids"]]
    assert not wrong, wrong[:3]
    wrong = [t for t, row in zip(texts, reference[config]) if tok(t) != row["padded"]]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("config", ["sd1", "sd2"])
def test_contractions_equal_transformers(config, clip_dir, sd1_tok, sd2_tok):
    """CLIP's word pattern takes 's 't 're 've 'm 'll 'd before letters, in any case (contractions_ids.json,
    from transformers' CLIPTokenizer, checked against CLIPTokenizerFast, by scripts/make_clip_tokenizer.py)."""
    ref = json.loads((clip_dir / "contractions_ids.json").read_text(encoding="utf-8"))
    tok = sd1_tok if config == "sd1" else sd2_tok
    texts = ref["texts"]
    for c in ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d"):
        assert any(c in t for t in texts) and any(c.upper() in t for t in texts), c
    assert all(row["fast_agrees"] for row in ref[config])
    wrong = [(t, tok.encode(t), row["ids"]) for t, row in zip(texts, ref[config]) if tok.encode(t) != row["ids"]]
    assert not wrong, wrong[:3]
    wrong = [t for t, row in zip(texts, ref[config]) if tok(t) != row["padded"]]
    assert not wrong, wrong[:3]


def test_corpus_covers_what_the_issue_names(reference):
    texts = reference["texts"]
    assert any(any("\u4e00" <= c <= "\u9fff" for c in t) for t in texts)  # CJK
    assert any(any(ord(c) >= 0x1F300 for c in t) for t in texts)  # emoji
    assert any("é" in t for t in texts)
    assert sum(len(row["ids"]) > 75 for row in reference["sd1"]) >= 4  # past 77 tokens
    # slow and fast transformers agree on a good part of it; those are the cross-checked cases
    assert sum(row["fast_agrees"] for row in reference["sd1"]) >= 100


def test_special_ids_and_padding(sd1_tok, sd2_tok):
    assert (sd1_tok.bos_id, sd1_tok.eos_id, sd1_tok.pad_id, sd1_tok.max_length) == (49406, 49407, 49407, 77)
    assert (sd2_tok.bos_id, sd2_tok.eos_id, sd2_tok.pad_id) == (49406, 49407, 0)
    ids = sd2_tok("a cat")
    assert ids[:4] == [49406, 320, 2368, 49407] and set(ids[4:]) == {0} and len(ids) == 77
    assert sd1_tok("a cat")[4:] == [49407] * 73


def test_truncation_keeps_the_end_token(sd1_tok):
    ids = sd1_tok("cat " * 200)
    assert len(ids) == 77 and ids[0] == 49406 and ids[-1] == 49407 and ids[1:76] == [2368] * 75


def test_known_ids(sd1_tok):
    # the ids every SD 1.x user has seen: "a photo of a cat"
    assert sd1_tok.encode("a photo of a cat") == [320, 1125, 539, 320, 2368]
    assert sd1_tok.encode("A PHOTO") == sd1_tok.encode("a photo")
    assert sd1_tok.encode(",") == [267]
    assert sd1_tok.decode(sd1_tok("a photo of a cat")) == "a photo of a cat"


def test_gzip_and_plain_files_read_the_same(clip_dir, tmp_path, sd1_tok):
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes(gzip.decompress((clip_dir / f"{name}.gz").read_bytes()))
    tok = CLIPTokenizer.from_folder(tmp_path)  # no configs: CLIP's defaults
    assert tok.encode("naïve 猫 cat!") == sd1_tok.encode("naïve 猫 cat!")
    assert (tok.pad_id, tok.max_length) == (49407, 77)


# -- added tokens (textual inversion) ------------------------------------------------------------------------------


def test_added_tokens_are_whole_words_in_any_case(tok):
    added = tok.add_tokens(["EasyNegative", "<cat-toy>"])
    assert added == {"EasyNegative": [49408], "<cat-toy>": [49409]}
    assert tok.encode("easynegative, a cat") == [49408, 267, 320, 2368]
    assert tok.encode("EASYNEGATIVE") == [49408]
    assert tok.encode("easynegatives") != [49408] and 49408 not in tok.encode("easynegatives")
    assert tok.encode("a<cat-toy>b") == tok.encode("a") + [49409] + tok.encode("b")
    assert tok.add_tokens("easynegative") == {"easynegative": [49408]}  # again: same ids
    assert tok.vocab_size == 49410


def test_added_multi_vector_token(tok):
    ids = tok.add_tokens("style-x", vectors=3)["style-x"]
    assert ids == [49408, 49409, 49410]
    assert tok.encode("in style-x now") == tok.encode("in") + ids + tok.encode("now")
    assert tok.added_group(49408) == 3 and tok.added_group(49409) == 0
    with pytest.raises(TokenizerError, match="added with 3 vector"):
        tok.add_tokens("style-x", vectors=2)


@pytest.mark.parametrize("bad", ["", "  ", " pad", 7])
def test_bad_added_token(tok, bad):
    with pytest.raises(TokenizerError, match="cannot add the token"):
        tok.add_tokens([bad])


def test_bad_vector_count(tok):
    with pytest.raises(TokenizerError, match="vectors"):
        tok.add_tokens("x", vectors=0)


def test_saved_added_tokens_are_loaded(clip_dir, tmp_path):
    for name in ("vocab.json.gz", "merges.txt.gz", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(clip_dir / name, tmp_path / name)
    (tmp_path / "added_tokens.json").write_text(json.dumps({"<my-concept>": 49408}))
    tok = CLIPTokenizer.from_folder(tmp_path)
    assert tok.encode("a <my-concept> photo") == [320, 49408, 1125]


# -- errors -----------------------------------------------------------------------------------------------------


def _folder(clip_dir, tmp_path, **overrides):
    for name in ("vocab.json.gz", "merges.txt.gz", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(clip_dir / name, tmp_path / name)
    for name, content in overrides.items():
        name = name.replace("_json", ".json").replace("_txt", ".txt")
        (tmp_path / f"{name}.gz").unlink(missing_ok=True)
        if content is None:
            (tmp_path / name).unlink(missing_ok=True)
        else:
            (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return tmp_path


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vocab_json": None}, "has no vocab.json"),
        ({"merges_txt": None}, "has no merges.txt"),
        ({"vocab_json": "{not json"}, "not valid JSON"),
        ({"vocab_json": "[1, 2]"}, "JSON list, not an object"),
        ({"vocab_json": '{"a": "x"}'}, "no non-negative integer id"),
        ({"vocab_json": "{}"}, "vocabulary is empty"),
        ({"vocab_json": b"\xff\xfe"}, "cannot read the tokenizer file"),
        ({"merges_txt": "#version: 0.2\na b c\n"}, "line 2"),
        ({"vocab_json": '{"a": 0, "b": 1}'}, "is not in the vocabulary"),
        ({"special_tokens_map_json": '{"pad_token": 5}'}, "pad_token is 5"),
        ({"tokenizer_config_json": '{"model_max_length": 1}'}, "max_length is 1"),
    ],
)
def test_malformed_folders_raise_one_clear_error(clip_dir, tmp_path, overrides, message):
    folder = _folder(clip_dir, tmp_path, **overrides)
    with pytest.raises(TokenizerError, match=message) as info:
        CLIPTokenizer.from_folder(folder)
    assert isinstance(info.value, ModelError) and isinstance(info.value, SdrtError)
    assert str(folder) in str(info.value) and "What to do" in str(info.value)


def test_missing_folder(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        CLIPTokenizer.from_folder(tmp_path / "nope")


def test_broken_gzip(clip_dir, tmp_path):
    folder = _folder(clip_dir, tmp_path)
    (folder / "merges.txt.gz").write_bytes(b"\x1f\x8b\x08\x00broken")
    with pytest.raises(TokenizerError, match="cannot read"):
        CLIPTokenizer.from_folder(folder)


def test_unusable_max_length_falls_back_to_77(clip_dir, tmp_path):
    folder = _folder(clip_dir, tmp_path, tokenizer_config_json='{"model_max_length": 1000000000000000019884624838656}')
    assert CLIPTokenizer.from_folder(folder).max_length == 77


# -- robustness ---------------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_any_text_encodes(sd1_tok, text):
    ids = sd1_tok.encode(text)
    assert all(0 <= i < sd1_tok.vocab_size for i in ids)
    assert len(sd1_tok(text)) == 77


def test_lone_surrogates_and_non_text(sd1_tok):
    assert sd1_tok.encode("a\ud800b") == sd1_tok.encode("ab")
    with pytest.raises(TokenizerError, match="not text"):
        sd1_tok.encode(None)


def test_a_folder_transformers_5_saved_with_tokenizer_json_only_reads_as_transformers_reads_it(tmp_path):
    """transformers 5 saves a CLIP tokenizer as ``tokenizer.json`` + ``tokenizer_config.json`` (no vocab.json or
    merges.txt): the BPE model, its merges and its added token (``<my-style>``) come from that file, and the ids
    are transformers' own (scripts/make_clip_tokenizer_json.py wrote both)."""
    import json
    import shutil
    from pathlib import Path

    from sdrt.checkpoint.diffusers_folder import has_tokenizer
    from sdrt.text import CLIPTokenizer
    from sdrt.text.tokenizer import TokenizerError

    data = Path(__file__).parent / "data" / "clip-tokenizer-json"
    ref = json.loads((data / "ids.json").read_text(encoding="utf-8"))
    tok = CLIPTokenizer.from_folder(data / "tokenizer")
    assert [tok(p) for p in ref["prompts"]] == ref["ids"]
    assert has_tokenizer(data / "tokenizer", "clip")
    # the same folder as vocab.json + merges.txt (tiny-sd15's) gives the same ids but for the added token
    plain = CLIPTokenizer.from_folder(Path(__file__).parents[1] / "data" / "pipelines" / "tiny-sd15" / "tokenizer")
    assert plain(ref["prompts"][0]) == ref["ids"][0]
    # a broken tokenizer.json is one line naming it
    bad = tmp_path / "tok"
    shutil.copytree(data / "tokenizer", bad)
    spec = json.loads((bad / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["merges"][3] = ["only-one"]
    (bad / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match="tokenizer.json's BPE model: merge 3 is"):
        CLIPTokenizer.from_folder(bad)
    spec["model"] = {"type": "Unigram", "vocab": []}
    (bad / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match="holds a Unigram model, not CLIP's BPE"):
        CLIPTokenizer.from_folder(bad)
