"""T5Tokenizer against transformers' T5TokenizerFast (reference ids in tests/data/t5-tokenizer, T5's real vocabulary).

scripts/make_t5_refs.py writes the data: two configurations of the same folder, ``json``
(T5TokenizerFast reads tokenizer.json) and ``flux`` (FLUX.1's tokenizer_config.json, with which
it rebuilds itself from spiece.model), and diffusers' Chroma attention mask, all from transformers 4.x;
scripts/make_t5_refs_tf5.py adds transformers 5's ids (reference_ids_tf5.json.gz).
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import SdrtError
from sdrt.text import T5Tokenizer, TokenizerError, keep_first_pad
from sdrt.text.unigram import Precompiled, read_spiece_model

T5_DIR = Path(__file__).resolve().parents[1] / "data" / "t5-tokenizer"
CONFIGS = ("json", "flux")


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(gzip.decompress((T5_DIR / "reference_ids.json.gz").read_bytes()))


def _folder(root: Path, config: str, files=("tokenizer.json.gz", "spiece.model", "special_tokens_map.json")) -> Path:
    folder = root / config
    folder.mkdir()
    for name in files:
        shutil.copy(T5_DIR / name, folder / name)
    source = T5_DIR / "flux" if config == "flux" else T5_DIR
    shutil.copy(source / "tokenizer_config.json", folder / "tokenizer_config.json")
    return folder


@pytest.fixture(scope="module")
def toks(tmp_path_factory) -> dict[str, T5Tokenizer]:
    root = tmp_path_factory.mktemp("t5")
    found = {config: T5Tokenizer.from_folder(_folder(root, config)) for config in CONFIGS}
    spiece = root / "spiece"
    spiece.mkdir()
    for name in ("spiece.model", "special_tokens_map.json", "tokenizer_config.json"):
        shutil.copy(T5_DIR / name, spiece / name)
    found["spiece"] = T5Tokenizer.from_folder(spiece)  # spiece.model alone: transformers converts it
    return found


@pytest.mark.parametrize("config", [*CONFIGS, "spiece"])
def test_ids_equal_t5tokenizerfast_on_the_whole_corpus(config, reference, toks):
    tok, texts = toks[config], reference["texts"]
    agree = sum(tok.encode(t) == ids for t, ids in zip(texts, reference[config]["ids"]))
    print(f"\nT5 tokenizer ({config}): {agree} of {len(texts)} texts give T5TokenizerFast's ids"
          f" (transformers {reference['transformers']}, tokenizers {reference['tokenizers']})")
    wrong = [(t, tok.encode(t), ids) for t, ids in zip(texts, reference[config]["ids"]) if tok.encode(t) != ids]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", ["256", "512", "256_bare", "512_bare"])
def test_padded_ids_and_mask_as_the_pipelines_call_it(config, case, reference, toks):
    # SD3 and Flux schnell: 256; Flux dev and Chroma: 512; padding="max_length", truncation=True
    length, special = int(case.split("_")[0]), not case.endswith("_bare")
    ids, mask = toks[config](reference["texts"], max_length=length, add_special_tokens=special)
    want = reference[config][case]
    assert ids.dtype == np.int64 and ids.shape == (len(reference["texts"]), length) and mask.shape == ids.shape
    assert ids.tolist() == want["input_ids"]
    assert mask.tolist() == want["attention_mask"]


@pytest.mark.parametrize("variant", ["first", "never", "from_slow"])
def test_the_converters_other_prefix_schemes(variant, reference, tmp_path):
    # tokenizer_config.json with legacy=False, add_prefix_space=False or from_slow: other Metaspace schemes
    case = reference["variants"][variant]
    folder = _folder(tmp_path, "json")
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, **case["config"]}), encoding="utf-8")
    tok = T5Tokenizer.from_folder(folder)
    agree = sum(tok.encode(t) == ids for t, ids in zip(reference["texts"], case["ids"]))
    assert agree == len(reference["texts"]), (case["prepend_scheme"], agree)


@pytest.fixture(scope="module")
def reference5() -> dict:
    return json.loads(gzip.decompress((T5_DIR / "reference_ids_tf5.json.gz").read_bytes()))


@pytest.mark.parametrize("config", ["json", "flux", "spiece"])
def test_transformers5_ids_on_the_whole_corpus(config, reference, reference5, tmp_path):
    # transformers 5 rebuilds every T5 tokenizer the same way, whatever the folder holds
    files = ("spiece.model", "special_tokens_map.json") if config == "spiece" else \
        ("tokenizer.json.gz", "spiece.model", "special_tokens_map.json")
    tok = T5Tokenizer.from_folder(_folder(tmp_path, "flux" if config == "flux" else "json", files=files),
                                  transformers=5)
    texts, want = reference["texts"], reference5[config]
    agree = sum(tok.encode(t) == ids for t, ids in zip(texts, want["ids"]))
    print(f"\nT5 tokenizer, transformers=5 ({config}): {agree} of {len(texts)} texts give transformers"
          f" {reference5['transformers']}'s ids")
    assert agree == len(texts)
    for length in (256, 512):
        ids, mask = tok(texts, max_length=length)
        assert ids.tolist() == want[str(length)]["input_ids"]
        assert mask.tolist() == want[str(length)]["attention_mask"]
    # it differs from 4.x's on a few texts (U+0085 is whitespace to 5.x's split), so both are tested for real
    assert 0 < sum(a != b for a, b in zip(want["ids"], reference["flux"]["ids"])) < 10


def test_chroma_mask_equals_diffusers(reference, toks):
    chroma = reference["chroma"]
    _, mask = toks["json"](chroma["texts"], max_length=512)
    assert keep_first_pad(mask).tolist() == chroma["mask"]
    assert keep_first_pad(mask)[4].sum() == 512  # a prompt that fills all 512 positions keeps them all


def test_corpus_covers_what_the_issue_names(reference):
    texts, ids = reference["texts"], reference["json"]["ids"]
    assert len(texts) >= 300
    assert any(any("\u4e00" <= c <= "\u9fff" for c in t) for t in texts)  # CJK
    assert any(any(ord(c) >= 0x1F300 for c in t) for t in texts)  # emoji
    assert any("é" in t for t in texts) and any("\u0301" in t for t in texts)  # accents, composed and not
    assert any(c.isdigit() for t in texts for c in t)
    assert any("   " in t for t in texts) and any("\t\t" in t for t in texts)  # whitespace runs
    assert sum(len(row) >= 256 for row in ids) >= 10 and sum(len(row) >= 512 for row in ids) >= 8
    assert sum(2 in row for row in ids) >= 10  # <unk>
    # the two configurations disagree on some texts (trailing spaces, ...): each path is tested for real
    differ = sum(a != b for a, b in zip(ids, reference["flux"]["ids"]))
    assert differ >= 20


def test_special_ids_and_defaults(toks):
    tok = toks["json"]
    assert (tok.eos_id, tok.pad_id, tok.unk_id, tok.max_length, tok.vocab_size) == (1, 0, 2, 512, 32100)
    assert tok.token_to_id("<extra_id_0>") == 32099 and tok.token_to_id("▁") == 3
    assert tok.encode("a photo of a cat") == [3, 9, 1202, 13, 3, 9, 1712]
    ids, mask = tok("a photo of a cat", max_length=10)
    assert ids.tolist() == [[3, 9, 1202, 13, 3, 9, 1712, 1, 0, 0]] and mask.tolist() == [[1] * 8 + [0, 0]]
    assert tok.decode(ids[0]) == "a photo of a cat"
    assert tok.encode("x</s>y") == tok.encode("x") + [1] + tok.encode("y")


def test_truncation_keeps_the_end_token_and_padding_longest(toks):
    tok = toks["flux"]
    ids, mask = tok(["cat " * 600, "a dog"], max_length=256)
    assert ids.shape == (2, 256) and ids[0, -1] == 1 and mask[0].sum() == 256 and ids[0, 0] == tok.encode("cat")[0]
    bare, _ = tok("cat " * 600, max_length=256, add_special_tokens=False)
    assert 1 not in bare[0].tolist()
    ids, mask = tok(["a dog", "a"], padding="longest")
    assert ids.shape == (2, len(tok.encode("a dog")) + 1) and mask[1].tolist()[-1] == 0


def test_folder_variants(tmp_path, toks, caplog):
    texts = ["a cat  ", "café 猫 </s>  x ", "  leading"]
    # only spiece.model: transformers converts from the slow tokenizer, as with the flux config
    assert [toks["spiece"].encode(t) for t in texts] == [toks["flux"].encode(t) for t in texts]
    # the flux config without spiece.model reads tokenizer.json, and says so
    no_spiece = _folder(tmp_path, "flux", files=("tokenizer.json.gz",))
    with caplog.at_level(logging.WARNING, logger="sdrt.text.t5"):
        tok = T5Tokenizer.from_folder(no_spiece)
    assert "spiece.model" in caplog.text
    assert [tok.encode(t) for t in texts] == [toks["json"].encode(t) for t in texts]
    # plain tokenizer.json, no configuration at all: T5's defaults
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes(gzip.decompress((T5_DIR / "tokenizer.json.gz").read_bytes()))
    tok = T5Tokenizer.from_folder(bare)
    assert (tok.eos_id, tok.pad_id, tok.max_length) == (1, 0, 512)
    assert [tok.encode(t) for t in texts] == [toks["json"].encode(t) for t in texts]


def test_spiece_model_matches_tokenizer_json():
    data = json.loads(gzip.decompress((T5_DIR / "tokenizer.json.gz").read_bytes()))
    proto = read_spiece_model((T5_DIR / "spiece.model").read_bytes())
    assert len(proto.pieces) == 32000 and proto.unk_id == 2 and proto.model_type == 1
    assert [(p, s) for p, s, _ in proto.pieces[:5]] == [tuple(v) for v in data["model"]["vocab"][:5]]
    charsmap = data["normalizer"]["normalizers"][0]["precompiled_charsmap"]
    assert proto.charsmap == base64.b64decode(charsmap)


def test_precompiled_charsmap_rules():
    charsmap = json.loads(gzip.decompress((T5_DIR / "tokenizer.json.gz").read_bytes()))["normalizer"]["normalizers"][0]
    norm = Precompiled(base64.b64decode(charsmap["precompiled_charsmap"]))
    assert norm("ｆｕｌｌ") == "full" and norm("ﬁ") == "fi" and norm("cafe\u0301") == "café"
    assert norm("a\u00a0b") == "a b" and norm("plain text") == "plain text"


@pytest.mark.parametrize("name, content, match", [
    ("tokenizer.json", "{not json", "not valid JSON"),
    ("tokenizer.json", json.dumps({"model": {"type": "BPE", "vocab": {}}}), "not T5's Unigram"),
    ("tokenizer.json", json.dumps({"model": {"type": "Unigram", "vocab": [["a", "x"]]}}), "pairs"),
    ("spiece.model", "\x0a\xff\xff", "cut short"),
])
def test_broken_files_are_one_line_errors(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content.encode("latin-1"))
    with pytest.raises(TokenizerError, match=match) as info:
        T5Tokenizer.from_folder(tmp_path)
    assert isinstance(info.value, SdrtError) and "\n" not in str(info.value)


def test_bad_arguments(tmp_path, toks):
    tok = toks["json"]
    with pytest.raises(TokenizerError, match="does not exist"):
        T5Tokenizer.from_folder(tmp_path / "missing")
    with pytest.raises(TokenizerError, match="neither tokenizer.json nor spiece.model"):
        T5Tokenizer.from_folder(tmp_path)
    with pytest.raises(TokenizerError, match="max_length"):
        tok("a cat", max_length=0)
    with pytest.raises(TokenizerError, match="padding"):
        tok("a cat", padding="do_not_pad")
    with pytest.raises(TokenizerError, match="over max_length 8"):
        tok("a long prompt about a cat on a mat", max_length=8, truncation=False)
    with pytest.raises(TokenizerError, match="not text"):
        tok.encode(42)  # type: ignore[arg-type]
    with pytest.raises(TokenizerError, match="list of str"):
        tok([])
    with pytest.raises(TokenizerError, match="pass 4 or 5"):
        T5Tokenizer.from_folder(T5_DIR, transformers=3)
