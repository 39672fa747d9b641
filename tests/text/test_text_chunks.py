"""tokenize_prompt against A1111's own tokenize_line (tests/text/data, scripts/make_chunk_refs.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sdrt.text import PromptChunk, empty_chunk, tokenize_prompt

REF = json.loads(gzip.decompress((Path(__file__).parent / "data" / "tokenize_line.json.gz").read_bytes()))


@pytest.mark.parametrize("backtrack", [20, 0])
def test_chunks_equal_a1111(sd1_tok, backtrack):
    rows = REF[f"backtrack_{backtrack}"]
    assert len(REF["texts"]) > 100 and sum(len(r) > 1 for r in rows) > 40
    wrong = []
    for text, expected in zip(REF["texts"], rows):
        got = [[c.ids, c.weights] for c in tokenize_prompt(sd1_tok, text, comma_backtrack=backtrack)]
        if got != expected:
            wrong.append(text)
    assert not wrong, wrong[:2]


def test_comma_back_off_moves_the_tail_to_the_next_chunk(sd1_tok):
    # 70 x "cat" then ", " then 10 words: the chunk fills 4 tokens after the comma, so those 4 move
    text = " ".join(["cat"] * 70) + ", " + " ".join(["dog"] * 10)
    first, second = tokenize_prompt(sd1_tok, text)
    assert first.ids[1:72] == [2368] * 70 + [267] and first.ids[72:] == [49407] * 5
    assert second.ids[1:11] == [1929] * 10
    assert [len(c.ids) for c in tokenize_prompt(sd1_tok, text, comma_backtrack=0)] == [77, 77]
    assert tokenize_prompt(sd1_tok, text, comma_backtrack=0)[0].ids[76] == 49407


def test_break_and_weights(sd1_tok):
    chunks = tokenize_prompt(sd1_tok, "a (cat:1.5) BREAK [dog]")
    assert len(chunks) == 2
    assert chunks[0].ids[:5] == [49406, 320, 2368, 49407, 49407] and chunks[0].weights[:4] == [1.0, 1.0, 1.5, 1.0]
    assert chunks[1].ids[:3] == [49406, 1929, 49407] and chunks[1].weights[1] == pytest.approx(1 / 1.1)
    assert all(len(c.ids) == len(c.weights) == 77 for c in chunks)


def test_emphasis_off_reads_brackets_as_text(sd1_tok):
    (chunk,) = tokenize_prompt(sd1_tok, "(cat:1.5)", emphasis=False)
    ids = sd1_tok.encode("(cat:1.5)")
    assert set(chunk.weights) == {1.0} and chunk.ids[1 : len(ids) + 2] == ids + [49407]


def test_empty_prompt_is_one_padded_chunk(sd1_tok, sd2_tok):
    assert empty_chunk(sd1_tok) == PromptChunk([49406] + [49407] * 76, [1.0] * 77)
    assert tokenize_prompt(sd2_tok, "")[0].ids == [49406, 49407] + [0] * 75


def test_sd2_pads_after_the_first_end_token(sd2_tok):
    chunks = tokenize_prompt(sd2_tok, "a cat BREAK " + "dog " * 80)
    assert chunks[0].ids[:4] == [49406, 320, 2368, 49407] and set(chunks[0].ids[4:]) == {0}
    assert chunks[1].ids[76] == 49407 and 0 not in chunks[1].ids  # a full chunk has no padding
    assert chunks[2].ids[:7] == [49406] + [1929] * 5 + [49407] and set(chunks[2].ids[7:]) == {0}


def test_multi_vector_embedding_stays_in_one_chunk(tok):
    ids = tok.add_tokens("style-x", vectors=4)["style-x"]
    chunks = tokenize_prompt(tok, " ".join(["cat"] * 73) + " (style-x:1.2)")
    assert len(chunks) == 2
    assert chunks[0].ids[1:74] == [2368] * 73 and chunks[0].ids[74:] == [49407] * 3
    assert chunks[1].ids[1:5] == ids and chunks[1].weights[1:5] == [1.2] * 4
