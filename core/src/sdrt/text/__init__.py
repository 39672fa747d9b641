"""Prompt text: CLIP's BPE and T5's unigram tokenizers, A1111's prompt syntax, and A1111's 75-token chunking.

    from sdrt.text import CLIPTokenizer, T5Tokenizer, parse_prompt, tokenize_prompt
    tok = CLIPTokenizer.from_folder("model/tokenizer")
    ids, mask = T5Tokenizer.from_folder("flux/tokenizer_2")(["a cat"], max_length=512)  # int64 [1, 512] each
    chunks = tokenize_prompt(tok, "a (red:1.2) fox BREAK snow")   # [PromptChunk(ids=77 ids, weights=77 floats)]
    prompt, loras = extract_loras("a cat <lora:ink:0.7>")          # ("a cat ", [("ink", 0.7)])

No torch, transformers, ``tokenizers`` or ``sentencepiece``: both tokenizers are small modules on ``regex``.
"""

from __future__ import annotations

from .attention import BREAK, parse_prompt
from .chunks import PromptChunk, empty_chunk, tokenize_prompt
from .loras import extract_lora_tags, extract_loras
from .t5 import T5Batch, T5Tokenizer, keep_first_pad
from .tokenizer import CLIPTokenizer, TokenizerError

__all__ = [
    "BREAK",
    "CLIPTokenizer",
    "PromptChunk",
    "T5Batch",
    "T5Tokenizer",
    "TokenizerError",
    "empty_chunk",
    "extract_lora_tags",
    "extract_loras",
    "keep_first_pad",
    "parse_prompt",
    "tokenize_prompt",
]
