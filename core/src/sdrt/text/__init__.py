"""Prompt text: CLIP's BPE tokenizer, A1111's prompt syntax, and A1111's 75-token chunking.

    from sdrt.text import CLIPTokenizer, parse_prompt, tokenize_prompt
    tok = CLIPTokenizer.from_folder("model/tokenizer")
    chunks = tokenize_prompt(tok, "a (red:1.2) fox BREAK snow")   # [PromptChunk(ids=77 ids, weights=77 floats)]
    prompt, loras = extract_loras("a cat <lora:ink:0.7>")          # ("a cat ", [("ink", 0.7)])

No torch, transformers or ``tokenizers``: the BPE is a small module on ``regex``.
"""

from __future__ import annotations

from .attention import BREAK, parse_prompt
from .chunks import PromptChunk, empty_chunk, tokenize_prompt
from .loras import extract_loras
from .tokenizer import CLIPTokenizer, TokenizerError

__all__ = [
    "BREAK",
    "CLIPTokenizer",
    "PromptChunk",
    "TokenizerError",
    "empty_chunk",
    "extract_loras",
    "parse_prompt",
    "tokenize_prompt",
]
