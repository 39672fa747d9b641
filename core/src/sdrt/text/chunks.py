"""A1111's prompt chunking: 75 tokens per chunk, ``BREAK``, and the comma back-off.

:func:`tokenize_prompt` turns a prompt into :class:`PromptChunk` s the way
A1111's ``FrozenCLIPEmbedderWithCustomWords.tokenize_line`` does: each emphasis
run of :func:`~sdrt.text.parse_prompt` is tokenized on its own; the ids fill
chunks of ``max_length - 2`` (75); ``BREAK`` closes the current chunk (padding
it); when a chunk fills up within ``comma_backtrack`` (20) tokens after a comma,
the tokens after that comma move to the next chunk. Each chunk is then
``[bos] + 75 ids + [eos]``, short chunks filled with ``eos``, and, where the
folder pads with another token (SD 2.x's ``!``), everything after the first
``eos`` becomes the pad id, as A1111 sends it to the encoder.

A multi-vector token added with :meth:`CLIPTokenizer.add_tokens` (a
textual-inversion embedding) is kept whole in one chunk, as A1111 keeps an
embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .attention import parse_prompt
from .tokenizer import CLIPTokenizer


@dataclass
class PromptChunk:
    """One encoder pass: ``max_length`` (77) ids and one weight (emphasis multiplier) per id."""

    ids: list[int] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)


def empty_chunk(tok: CLIPTokenizer) -> PromptChunk:
    """The chunk of an empty prompt; A1111 pads a shorter prompt of a batch with these."""
    return tokenize_prompt(tok, "")[0]


def tokenize_prompt(
    tok: CLIPTokenizer, text: str, *, emphasis: bool = True, comma_backtrack: int = 20
) -> list[PromptChunk]:
    """Chunks of ``max_length`` ids and weights for a prompt, as A1111 makes them (always at least one).

    ``emphasis=False`` reads brackets as plain text (A1111's ``Emphasis: None``);
    ``comma_backtrack=0`` turns the comma back-off off.
    """
    size = tok.max_length - 2
    comma = tok.token_to_id(",</w>")
    groups = {ids[0]: len(ids) for ids in tok.added_tokens.values() if len(ids) > 1}
    runs = parse_prompt(text) if emphasis else [(text, 1.0)]

    chunks: list[PromptChunk] = []
    ids: list[int] = []
    weights: list[float] = []
    last_comma = -1

    def close() -> None:
        nonlocal ids, weights, last_comma
        pad = size - len(ids)
        chunks.append(_finish(tok, ids + [tok.eos_id] * pad, weights + [1.0] * pad))
        ids, weights, last_comma = [], [], -1

    for run_text, weight in runs:
        if run_text == "BREAK" and weight == -1:
            close()
            continue
        run = tok.encode(run_text)
        position = 0
        while position < len(run):
            token = run[position]
            if token == comma:
                last_comma = len(ids)
            elif comma_backtrack and len(ids) == size and last_comma != -1 and len(ids) - last_comma <= comma_backtrack:
                cut = last_comma + 1
                moved_ids, moved_weights = ids[cut:], weights[cut:]
                ids, weights = ids[:cut], weights[:cut]
                close()
                ids, weights = moved_ids, moved_weights
            if len(ids) == size:
                close()
            span = groups.get(token, 1)
            if span > 1 and len(ids) + span > size:
                close()
            ids.extend(run[position : position + span])
            weights.extend([weight] * len(run[position : position + span]))
            position += span
    if ids or not chunks:
        close()
    return chunks


def _finish(tok: CLIPTokenizer, ids: list[int], weights: list[float]) -> PromptChunk:
    full = [tok.bos_id, *ids, tok.eos_id]
    if tok.pad_id != tok.eos_id:
        end = full.index(tok.eos_id)
        full[end + 1 :] = [tok.pad_id] * (len(full) - end - 1)
    return PromptChunk(full, [1.0, *weights, 1.0])
