"""Text conditioning with a T5 encoder (SD3, Flux, Chroma): CLIP's A1111 chunks and T5's padded sequence, joined.

``T5Encoder`` tokenizes a prompt to ``max_sequence_length`` ids (``sdrt.text.T5Tokenizer``, as
``T5TokenizerFast(padding="max_length", truncation=True)``) and runs the encoder part; when the graph
takes an ``attention_mask`` (Chroma's export, sdrt's shipped ``t5xxl``) it is fed the family's mask: the
tokenizer's for Chroma, all ones for SD3 and Flux (their diffusers pipelines pass none, so every position,
padding included, attends). A graph without the input is fed ``input_ids`` alone. A1111's prompt syntax is
read on the CLIP side only (emphasis, ``BREAK``): T5 gets the prompt's text with the brackets, weights
and ``BREAK`` words taken out, so ``a (red:1.2) fox`` reaches T5 as ``a red fox``.

``TextConditioner`` holds a CLIP ``PromptEncoder`` (none for Chroma) and a ``T5Encoder`` and hands both
results to the family's ``join_text``, which makes the ``Conditioning`` the transformer takes. Its
``encode``/``pad_to``/``zeros_like``/``weights_changed`` are the ``PromptEncoder`` interface the generic
pipeline calls, with ``max_length`` (the run's ``max_sequence_length``) added.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .prompts import Conditioning, PromptEncoder

if TYPE_CHECKING:  # pragma: no cover
    from ..text import T5Tokenizer
    from .parts import Part


def t5_text(prompt: str) -> str:
    """The prompt's plain text for T5: A1111's emphasis brackets, weights and ``BREAK`` removed."""
    from ..text import parse_prompt

    text = "".join(text if weight >= 0 else " " for text, weight in parse_prompt(prompt))  # BREAK: a space
    return re.sub(" {2,}", " ", text).strip()


@dataclass
class FlowConditioning(Conditioning):
    """A ``Conditioning`` that keeps its pieces: the CLIP conditioning (chunks), T5's states and masks."""

    clip: Conditioning | None = None
    t5: np.ndarray | None = None
    #: the tokenizer's attention mask [1, L] (1 = a real token), and the family's text mask (Chroma's) [1, L] bool
    tokenizer_mask: np.ndarray | None = None
    text_mask: np.ndarray | None = None

    @property
    def chunks(self) -> int:
        return self.clip.chunks if self.clip is not None else 1


#: what a T5 encoder's ``attention_mask`` input gets: all ones (SD3, Flux: diffusers passes no mask), the
#: tokenizer's mask (Chroma), or the tokenizer's mask widened to keep the first padding token
T5_MASKS = ("ones", "tokenizer", "keep_first")


#: (prompt text, max_length) pairs whose cut was said (``T5Encoder._say_cut``)
_SAID: set[tuple[str, int]] = set()


class T5Encoder:
    """A T5 tokenizer and its encoder part; ``mask`` (one of ``T5_MASKS``) is what the encoder's
    ``attention_mask`` input gets when the graph has one."""

    def __init__(self, tokenizer: T5Tokenizer, part: Part, *, mask: str = "ones") -> None:
        self.tokenizer, self.part, self.mask = tokenizer, part, mask

    def encode(self, prompt: str, max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """(``last_hidden_state`` [1, max_length, D] float32, the tokenizer's mask [1, max_length] int64)."""
        text = t5_text(prompt)
        self._say_cut(text, max_length)
        batch = self.tokenizer([text], max_length=max_length)
        ids, mask = batch.ids, batch.mask
        inputs = self.part.inputs
        feeds: dict[str, np.ndarray] = {"input_ids": ids.astype(np.dtype(self.part.input("input_ids").dtype))}
        if "attention_mask" in inputs:
            feeds["attention_mask"] = self._encoder_mask(mask).astype(np.dtype(inputs["attention_mask"].dtype))
        self.part.require_output("last_hidden_state")
        out = self.part.run(feeds, ("last_hidden_state",))
        return np.asarray(out["last_hidden_state"], dtype=np.float32), mask

    def _say_cut(self, text: str, max_length: int) -> None:
        """A prompt longer than T5's ``max_length`` tokens is cut there (diffusers cuts it too, with a warning):
        said once per prompt and length (the conditioner encodes a prompt again per job), where it was cut in
        silence."""
        if (text, max_length) in _SAID or len(text) < max_length:  # a token is a character or more
            return
        n = len(self.tokenizer.encode(text)) + 1  # and </s>
        if n > max_length:
            import logging

            from ..errors import in_caller_words

            if len(_SAID) > 256:
                _SAID.clear()
            _SAID.add((text, max_length))
            logging.getLogger("sdrt.pipelines").warning(in_caller_words(
                f"a prompt is {n} T5 tokens and T5 reads {max_length} ({{@max_sequence_length}}): its last "
                f"{n - max_length} tokens are cut, as diffusers cuts them ({text[:40]!r}...); raise "
                "{@max_sequence_length} (up to 512) or shorten the prompt"))

    def _encoder_mask(self, mask: np.ndarray) -> np.ndarray:
        if self.mask == "ones":
            return np.ones_like(mask)
        if self.mask == "keep_first":
            from ..text import keep_first_pad

            return np.asarray(keep_first_pad(mask))
        return np.asarray(mask)


class ZeroT5:
    """No T5 encoder (SD 3 without T5-XXL, diffusers' ``text_encoder_3=None``): T5's states are zeros
    ``[1, max_length, width]`` (``width``: the transformer's ``joint_attention_dim``), for the prompt and the
    negative prompt alike, as ``StableDiffusion3Pipeline._get_t5_prompt_embeds`` gives them."""

    part = None

    def __init__(self, width: int) -> None:
        self.width = int(width)

    def encode(self, prompt: str, max_length: int) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((1, max_length, self.width), np.float32), np.ones((1, max_length), np.int64)


#: ``join(clip conditioning or None, T5 states [1, L, D], tokenizer mask [1, L]) -> FlowConditioning``
Join = Callable[[Conditioning | None, np.ndarray, np.ndarray], FlowConditioning]


class TextConditioner:
    """CLIP chunks (A1111 syntax) and T5's sequence, joined by the family; caches the last few prompts."""

    def __init__(self, clip: PromptEncoder | None, t5: T5Encoder | ZeroT5, join: Join, max_length: int) -> None:
        self.clip, self.t5, self.join, self.max_length = clip, t5, join, max_length
        self._cache: dict[tuple[str, int, int], FlowConditioning] = {}

    @property
    def encoders(self) -> list[Any]:
        return [*(self.clip.encoders if self.clip is not None else []), *([] if self.t5.part is None else [self.t5])]

    def _length(self, max_length: int | None) -> int:
        return int(max_length or self.max_length)

    def encode(self, prompt: str, clip_skip: int = 1, max_length: int | None = None) -> FlowConditioning:
        length = self._length(max_length)
        key = (prompt, clip_skip, length)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        clip = self.clip.encode(prompt, clip_skip) if self.clip is not None else None
        states, mask = self.t5.encode(prompt, length)
        cond = self.join(clip, states, mask)
        if len(self._cache) > 8:
            self._cache.clear()
        self._cache[key] = cond
        return cond

    def pad_to(self, cond: Conditioning, chunks: int, clip_skip: int, max_length: int | None = None) -> Conditioning:
        """CLIP's side padded with empty-prompt chunks (A1111), then joined with the same T5 states again."""
        if not isinstance(cond, FlowConditioning) or cond.clip is None or self.clip is None or cond.chunks >= chunks:
            return cond
        assert cond.t5 is not None and cond.tokenizer_mask is not None
        return self.join(self.clip.pad_to(cond.clip, chunks, clip_skip), cond.t5, cond.tokenizer_mask)

    def zeros_like(self, cond: Conditioning) -> Conditioning:
        pooled = None if cond.pooled is None else np.zeros_like(cond.pooled)
        return Conditioning(np.zeros_like(cond.hidden), pooled)

    def weights_changed(self) -> None:
        self._cache.clear()
        if self.clip is not None:
            self.clip.weights_changed()

