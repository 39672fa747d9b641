"""Text clean-up that transformers' slow ``CLIPTokenizer`` applies before BPE.

When ``ftfy`` is not installed, transformers cleans CLIP input with BERT's
``BasicTokenizer(strip_accents=False, do_split_on_punc=False)``: control
characters, NUL and U+FFFD are dropped, every whitespace character becomes a
space, each CJK ideograph becomes a word of its own, the text is NFC-normalised,
split on whitespace and lower-cased. The words are joined with single spaces.

This module reproduces those steps, and nothing else, so that
:mod:`sdrt.text.tokenizer` gives the ids transformers gives.
"""

from __future__ import annotations

import unicodedata

#: code point ranges that BERT's tokenizer treats as CJK ideographs (each becomes its own word)
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch).startswith("C")


def clean(text: str) -> str:
    """Drop NUL, U+FFFD and control/format characters; map whitespace to a space; space out CJK ideographs."""
    out: list[str] = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            continue
        if _is_whitespace(ch):
            out.append(" ")
        elif cp >= 0x3400 and _is_cjk(cp):
            out.append(f" {ch} ")
        else:
            out.append(ch)
    return "".join(out)


def normalize(text: str) -> str:
    """The text that CLIP's byte-level BPE sees: cleaned, NFC, lower-cased, single-spaced."""
    if text.isascii():
        # fast path: no CJK, no NFC change, no Unicode categories to look up
        kept = "".join(ch for ch in text if " " <= ch != "\x7f" or ch in "\t\n\r")
        return " ".join(kept.lower().split())
    text = unicodedata.normalize("NFC", clean(text))
    return " ".join(w.lower() for w in text.split())
