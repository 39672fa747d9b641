"""parse_prompt against A1111's own parse_prompt_attention (tests/text/data, scripts/make_prompt_refs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdrt.text import BREAK, parse_prompt

CASES = json.loads((Path(__file__).parent / "data" / "parse_prompt_attention.json").read_text(encoding="utf-8"))["cases"]


def test_every_prompt_parses_as_in_a1111():
    checked = [c for c in CASES if "runs" in c]
    assert len(checked) > 400
    wrong = [(c["text"], parse_prompt(c["text"]), c["runs"]) for c in checked
             if parse_prompt(c["text"]) != [tuple(r) for r in c["runs"]]]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("case", [c for c in CASES if "raises" in c], ids=lambda c: c["text"])
def test_weights_a1111_cannot_read_are_text(case):
    # A1111 raises ValueError here; sdrt reads the weight as text and the ')' as a plain closing bracket
    runs = parse_prompt(case["text"])
    assert runs == [(case["text"][1:-1], 1.1)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("an (important) word", [("an ", 1.0), ("important", 1.1), (" word", 1.0)]),
        ("(unbalanced", [("unbalanced", 1.1)]),
        ("\\(literal\\]", [("(literal]", 1.0)]),
        ("[a]", [("a", 1 / 1.1)]),
        ("(a:1.5)", [("a", 1.5)]),
        ("a ) b ]", [("a ) b ]", 1.0)]),
        ("a BREAK b", [("a", 1.0), BREAK, ("b", 1.0)]),
        ("aBREAK b", [("aBREAK b", 1.0)]),
        ("", [("", 1.0)]),
    ],
)
def test_documented_examples(text, expected):
    assert parse_prompt(text) == expected


@given(st.text(alphabet=st.sampled_from(list("ab ()[]:\\.,-+019BREAK\n猫")), max_size=40))
def test_any_prompt_parses_and_keeps_its_characters(text):
    runs = parse_prompt(text)
    assert runs
    for part, weight in runs:
        assert isinstance(part, str) and isinstance(weight, float)
