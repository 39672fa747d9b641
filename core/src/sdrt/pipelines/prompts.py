"""Prompt -> conditioning: A1111's chunks through the text encoder(s), with emphasis and clip skip.

Each 77-id chunk from ``sdrt.text.tokenize_prompt`` runs through the encoder on its own; the
per-token weights scale the output and the mean is restored (A1111's "Original" emphasis);
chunks are concatenated along the token axis. Clip skip follows A1111's setting: 1 is the last
layer, 2 the one before it, and so on; SD 1.x/2.x then apply the encoder's final layer norm, as
A1111 and diffusers do. SDXL uses the penultimate layer of both encoders (no final norm), their
outputs side by side, and the pooled ``text_embeds`` of the second encoder's first chunk.
With no weights other than 1 and a prompt within 75 tokens this is exactly diffusers' encoding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelError

if TYPE_CHECKING:  # pragma: no cover
    from ..text import CLIPTokenizer
    from .parts import Part

log = logging.getLogger("sdrt.pipelines.prompts")


@dataclass
class Conditioning:
    """``hidden``: [1, 77 * chunks, D]; ``pooled``: [1, P] (SDXL) or None; ``extra``: more per-prompt model
    inputs a conditioner makes (a T5 attention mask, say), fed as they are named."""

    hidden: np.ndarray
    pooled: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    #: tokens per chunk (CLIP: 77, with its start and end tokens)
    chunk: int = 77

    @property
    def chunks(self) -> int:
        return self.hidden.shape[1] // self.chunk


class TextEncoder:
    """One tokenizer and its encoder part. ``penultimate`` (SDXL) reads hidden_states[-2] without final norm."""

    def __init__(self, tokenizer: CLIPTokenizer, part: Part, *, penultimate: bool = False,
                 pooled_output: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.part = part
        self.penultimate = penultimate
        self.pooled_output = pooled_output
        self._norm: tuple[np.ndarray, np.ndarray] | None = None
        self._rows: int | None = None

    def _layers(self) -> list[str]:
        names = [n for n in self.part.outputs if n.startswith("hidden_states.")]
        return sorted(names, key=lambda n: int(n.rsplit(".", 1)[1]) if n.rsplit(".", 1)[1].isdecimal() else -1)

    def _output_for(self, clip_skip: int) -> tuple[str, bool]:
        """(output name, apply final layer norm) for A1111's clip skip (1 = last layer). An encoder read at its
        penultimate layer (SDXL, SD3) counts from the end as A1111 and Forge do: clip skip 1 and 2 both
        read that layer (Forge's ``minimal_clip_skip`` 2; A1111 leaves SDXL's at it), 3 the one before. It read one
        layer deeper (2: the third-to-last), so the "Clip skip: 2" that Pony and Illustrious images carry changed
        the picture that A1111 and Forge make."""
        skip = max(clip_skip, 2) if self.penultimate else clip_skip
        if skip <= 1:
            self.part.require_output("last_hidden_state")
            return "last_hidden_state", False
        layers = self._layers()
        if layers and len(layers) < skip:  # the outputs are there, and fewer than asked for
            most = len(layers)
            raise ModelError(
                f"{{@clip_skip=}}{clip_skip} asks for layer {clip_skip} from the end, and this text encoder "
                f"({self.part.path}) has {len(layers)} hidden states: its largest clip skip is {most}", where="clip_skip",
                fix=f"use a {{@clip_skip}} from 1 to {most} (A1111's 2 is the second-to-last layer)")
        if len(layers) < skip:
            raise ModelError(
                f"clip skip {clip_skip} needs the text encoder's hidden_states outputs, and the graph has "
                f"{len(layers)}", where=str(self.part.path),
                fix="export the text encoder with output_hidden_states=True (Optimum does for SDXL), or use clip skip 1",
            )
        return layers[-skip], not self.penultimate

    def _final_norm(self) -> tuple[np.ndarray, np.ndarray]:
        """Scale and bias of the LayerNormalization that makes ``last_hidden_state`` (read from the graph)."""
        if self._norm is None:
            graph = self.part.graph
            model = graph.model.graph
            producer = {o: n for n in model.node for o in n.output}
            node = producer.get("last_hidden_state")
            while node is not None and node.op_type == "Identity":
                node = producer.get(node.input[0])
            if node is None or node.op_type != "LayerNormalization" or len(node.input) < 3:
                raise ModelError("clip skip needs the text encoder's final layer norm, and last_hidden_state is not "
                                 "made by a LayerNormalization node", where=str(self.part.path),
                                 fix="export the text encoder with opset 17 or later, or use clip skip 1")
            self._norm = (self._constant(node.input[1], producer), self._constant(node.input[2], producer))
        return self._norm

    def _constant(self, name: str, producer: dict) -> np.ndarray:
        from onnx import numpy_helper

        graph = self.part.graph
        while name not in graph.initializer_names and name in producer and producer[name].op_type == "Identity":
            name = producer[name].input[0]
        if name in graph.initializer_names:
            # a checkpoint's norm, once one is bound; a single file's, bound onto the shipped weight-free graph
            current = self.part.weights if self.part.weights is not None else self.part.default_weights
            if current is not None and name in current:
                return np.asarray(current[name], dtype=np.float32)
            return np.asarray(graph.initializer_arrays([name])[name], dtype=np.float32)
        node = producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute:
            return numpy_helper.to_array(node.attribute[0].t).astype(np.float32)
        raise ModelError(f"the final layer norm's {name!r} is not a constant of the graph", where=str(self.part.path),
                         fix="use clip skip 1")

    def _vocab_rows(self) -> int:
        """Rows of the token embedding that ``input_ids`` index (0 when the graph does not show it)."""
        if self._rows is None:
            graph = self.part.graph
            model = graph.model.graph
            feeds = {"input_ids"}
            for node in model.node:  # input_ids, possibly through Cast/Reshape, into a Gather's indices
                if node.op_type in ("Cast", "Reshape", "Flatten", "Identity") and node.input and node.input[0] in feeds:
                    feeds.update(node.output)
            info = graph.initializer_info
            info = info() if callable(info) else info  # a method today; a property would do as well
            rows = [info[n.input[0]].shape[0] for n in model.node
                    if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] in feeds and n.input[0] in info]
            self._rows = int(rows[0]) if rows and isinstance(rows[0], int) else 0
        return self._rows

    def encode_chunks(self, chunks: list, clip_skip: int) -> tuple[np.ndarray, np.ndarray | None]:
        """[1, 77 * len(chunks), D] with emphasis applied, and the pooled output of the first chunk."""
        name, norm = self._output_for(clip_skip)
        rows = self._vocab_rows()
        top = max(max(c.ids) for c in chunks)
        if rows and top >= rows:
            raise ModelError(f"the tokenizer gives id {top} and the text encoder's token embedding has {rows} rows",
                             where=str(self.part.path), fix="use the tokenizer folder that belongs to this model")
        ids_dtype = np.dtype(self.part.input("input_ids").dtype)
        pieces, pooled = [], None
        wanted = (name, self.pooled_output) if self.pooled_output else (name,)
        for k, chunk in enumerate(chunks):
            ids = np.asarray([chunk.ids], dtype=ids_dtype)
            out = self.part.run({"input_ids": ids}, wanted)
            z = np.asarray(out[name], dtype=np.float32)
            if norm:
                weight, bias = self._final_norm()
                mean = z.mean(-1, keepdims=True)
                var = ((z - mean) ** 2).mean(-1, keepdims=True)
                z = (z - mean) / np.sqrt(var + np.float32(1e-5)) * weight + bias
            weights = np.asarray(chunk.weights, dtype=np.float32)
            if np.any(weights != 1.0):
                original = z.mean()
                z = z * weights.reshape(1, -1, 1)
                weighted = z.mean()
                if weighted != 0:  # A1111's mean rescale; an all-zero output (the dry run's stand-in) stays zero
                    z = z * (original / weighted)
            pieces.append(z.astype(np.float32))
            if k == 0 and self.pooled_output is not None:
                self.part.require_output(self.pooled_output)
                pooled = np.asarray(out[self.pooled_output], dtype=np.float32)
        return np.concatenate(pieces, axis=1), pooled


class PromptEncoder:
    """Encodes prompts with one (SD 1.x/2.x) or two (SDXL) text encoders; caches the last few prompts."""

    def __init__(self, encoders: list[TextEncoder]) -> None:
        self.encoders = encoders
        self._cache: dict[tuple[str, int], Conditioning] = {}

    def encode(self, prompt: str, clip_skip: int = 1, max_length: int | None = None) -> Conditioning:
        """``max_length`` is T5's (``sdrt.pipelines.textcond``); CLIP's chunks are always 77 tokens."""
        key = (prompt, clip_skip)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        from ..text import tokenize_prompt

        hidden, pooled = [], None
        counts = []
        per_encoder = [tokenize_prompt(enc.tokenizer, prompt) for enc in self.encoders]
        longest = max(len(c) for c in per_encoder)
        for enc, chunks in zip(self.encoders, per_encoder):
            counts.append(len(chunks))
            if len(chunks) < longest:  # tokenizers that split differently: pad with empty chunks
                chunks = chunks + tokenize_prompt(enc.tokenizer, "") * (longest - len(chunks))
            z, p = enc.encode_chunks(chunks, clip_skip)
            hidden.append(z)
            if p is not None:  # SDXL: CLIP-G's; SD3: CLIP-L's and CLIP-G's side by side
                pooled = p if pooled is None else np.concatenate([pooled, p], axis=-1)
        cond = Conditioning(np.concatenate(hidden, axis=-1), pooled)
        if len(self._cache) > 8:
            self._cache.clear()
        self._cache[key] = cond
        log.debug("encoded prompt into %d chunk(s)", cond.chunks)
        return cond

    def weights_changed(self) -> None:
        """The encoders' weights changed (checkpoint, LoRA, embedding): forget cached encodings (and the token
        table's length: an embedding's reserved rows lengthen it)."""
        self._cache.clear()
        for enc in self.encoders:
            enc._norm = None
            enc._rows = None

    def zeros_like(self, cond: Conditioning) -> Conditioning:
        """SDXL's ``force_zeros_for_empty_prompt`` negative conditioning."""
        pooled = None if cond.pooled is None else np.zeros_like(cond.pooled)
        return Conditioning(np.zeros_like(cond.hidden), pooled)

    def pad_to(self, cond: Conditioning, chunks: int, clip_skip: int, max_length: int | None = None) -> Conditioning:
        """Add empty-prompt chunks until ``cond`` has ``chunks`` (A1111 pads the shorter of cond/uncond)."""
        if cond.chunks >= chunks:
            return cond
        empty = self.encode("", clip_skip)
        extra = np.concatenate([empty.hidden] * (chunks - cond.chunks), axis=1)
        return Conditioning(np.concatenate([cond.hidden, extra], axis=1), cond.pooled)
