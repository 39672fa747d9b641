"""SentencePiece's unigram model as ``tokenizers`` runs it: the precompiled charsmap, Viterbi, ``spiece.model``.

Three small parts, each the behaviour of Hugging Face ``tokenizers`` (what
transformers' ``T5TokenizerFast`` runs), without that package:

- :class:`Precompiled`: the ``Precompiled`` normalizer. SentencePiece stores its
  NFKC-like rules as a darts-clone double-array trie (a little-endian ``u32``
  trie size, the trie's ``u32`` units, then the NUL-separated replacement
  strings). ``tokenizers`` looks up each extended grapheme cluster shorter than 6
  UTF-8 bytes as a whole and, if nothing matches, each of its characters; a
  lookup takes the *shortest* key that is a prefix of the chunk (so a matched
  prefix replaces the whole cluster, marks and all).
- :class:`Unigram`: the best segmentation of one pre-tokenized word by Viterbi
  over the pieces' log-probabilities, ties kept by the first candidate (shorter
  pieces, earlier starts), a character without a piece of its own as ``<unk>``
  with the lowest score less 10, and runs of unknown characters fused into one
  ``<unk>``.
- :func:`read_spiece_model`: the fields of a SentencePiece ``ModelProto``
  (``spiece.model``) that a tokenizer needs, read with a minimal protobuf reader.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import regex

from ..errors import ModelError

_GRAPHEMES = regex.compile(r"\X", regex.DOTALL)
_UNK_PENALTY = 10.0


class UnigramError(ModelError):
    """A unigram vocabulary, charsmap or ``spiece.model`` is malformed."""


class Precompiled:
    """The ``Precompiled`` normalizer of a SentencePiece charsmap (``nmt_nfkc`` for T5)."""

    def __init__(self, charsmap: bytes, *, source: str = "<memory>") -> None:
        try:
            (trie_size,) = struct.unpack_from("<I", charsmap, 0)
            units = trie_size // 4
            self._array = list(struct.unpack_from(f"<{units}I", charsmap, 4))
            self._replacements = bytes(charsmap[4 + trie_size:])
            self._replacements.decode("utf-8")
        except (struct.error, UnicodeDecodeError) as exc:
            raise UnigramError(f"the precompiled charsmap cannot be read ({exc})", where=source,
                               fix="replace the tokenizer file with an intact copy from the model") from exc
        if not self._array:
            raise UnigramError("the precompiled charsmap has an empty trie", where=source,
                               fix="replace the tokenizer file with an intact copy from the model")
        self._cache: dict[str, str | None] = {}

    def _lookup(self, chunk: str) -> str | None:
        """The replacement of the shortest trie key that starts ``chunk`` (None if no key does)."""
        array = self._array
        try:
            unit = array[0]
            pos = (unit >> 10) << ((unit & 0x200) >> 6)
            for byte in chunk.encode("utf-8"):
                if byte == 0:
                    return None
                pos ^= byte
                unit = array[pos]
                if unit & 0x800000FF != byte:
                    return None
                pos ^= (unit >> 10) << ((unit & 0x200) >> 6)
                if (unit >> 8) & 1:
                    start = array[pos] & 0x7FFFFFFF
                    end = self._replacements.find(b"\0", start)
                    return self._replacements[start : end if end >= 0 else None].decode("utf-8", errors="replace")
        except IndexError:
            return None
        return None

    def transform(self, chunk: str) -> str | None:
        cached = self._cache.get(chunk, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        result = self._lookup(chunk)
        if len(self._cache) < 200_000:
            self._cache[chunk] = result
        return result

    def __call__(self, text: str) -> str:
        out: list[str] = []
        transform = self.transform
        for grapheme in _GRAPHEMES.findall(text):
            if len(grapheme) == 1:
                norm = transform(grapheme)
                out.append(grapheme if norm is None else norm)
                continue
            if len(grapheme.encode("utf-8")) < 6:
                norm = transform(grapheme)
                if norm is not None:
                    out.append(norm)
                    continue
            for char in grapheme:
                norm = transform(char)
                out.append(char if norm is None else norm)
        return "".join(out)


class Unigram:
    """Viterbi segmentation over ``(piece, score)`` pairs; ids are the pairs' positions."""

    def __init__(self, vocab: Sequence[tuple[str, float]], unk_id: int | None, *, byte_fallback: bool = False,
                 source: str = "<memory>") -> None:
        if not vocab:
            raise UnigramError("the unigram vocabulary is empty", where=source,
                               fix="replace the tokenizer file with an intact copy from the model")
        if unk_id is not None and not 0 <= unk_id < len(vocab):
            raise UnigramError(f"unk_id {unk_id} is outside the vocabulary of {len(vocab)} pieces", where=source,
                               fix="replace the tokenizer file with an intact copy from the model")
        self.pieces = [piece for piece, _ in vocab]
        self.scores = [float(score) for _, score in vocab]
        self.unk_id = unk_id
        self.byte_fallback = byte_fallback
        self._ids: dict[str, int] = {piece: i for i, piece in enumerate(self.pieces)}
        #: every prefix of every piece: the Viterbi loop stops extending a candidate when it leaves this set
        self._prefixes: set[str] = {piece[:n] for piece in self._ids for n in range(1, len(piece))}
        self._prefixes.update(self._ids)
        self._max_len = max(len(piece) for piece in self._ids)
        self._unk_score = min(self.scores) - _UNK_PENALTY
        self._cache: dict[str, list[int]] = {}

    def token_to_id(self, piece: str) -> int | None:
        return self._ids.get(piece)

    def encode(self, word: str) -> list[int]:
        """The ids of one pre-tokenized word (``"▁Hello"``)."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        ids = self._viterbi(word)
        if len(self._cache) >= 100_000:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def _viterbi(self, word: str) -> list[int]:
        n = len(word)
        score = [0.0] * (n + 1)
        start = [-1] * (n + 1)
        node = [0] * (n + 1)
        ids, scores, prefixes, max_len, unk_score = self._ids, self.scores, self._prefixes, self._max_len, self._unk_score
        for i in range(n):
            base = score[i]
            single = False
            for j in range(i + 1, min(n, i + max_len) + 1):
                piece = word[i:j]
                if piece not in prefixes:
                    break
                pid = ids.get(piece)
                if pid is None:
                    continue
                candidate = base + scores[pid]
                if start[j] < 0 or candidate > score[j]:
                    score[j], start[j], node[j] = candidate, i, pid
                if j == i + 1:
                    single = True
            if not single:
                if self.unk_id is None:
                    raise UnigramError(f"the character {word[i]!r} has no piece and the vocabulary has no <unk>",
                                       where="Unigram", fix="use a vocabulary with an unk_id")
                candidate = base + unk_score
                if start[i + 1] < 0 or candidate > score[i + 1]:
                    score[i + 1], start[i + 1], node[i + 1] = candidate, i, self.unk_id
        # backtrack; adjacent unknown characters become one token
        tokens: list[str] = []
        unknown: list[str] = []
        end = n
        while end > 0:
            begin = start[end]
            if node[end] == self.unk_id:
                unknown.append(word[begin:end])
            else:
                if unknown:
                    tokens.append("".join(reversed(unknown)))
                    unknown = []
                tokens.append(word[begin:end])
            end = begin
        if unknown:
            tokens.append("".join(reversed(unknown)))
        out: list[int] = []
        for token in reversed(tokens):
            pid = ids.get(token)
            if pid is None:
                if self.byte_fallback:
                    raw = [ids.get(f"<0x{b:02X}>") for b in token.encode("utf-8")]
                    if all(r is not None for r in raw):
                        out.extend(raw)  # type: ignore[arg-type]
                        continue
                pid = self.unk_id
            out.append(pid)  # type: ignore[arg-type]
        return out


# -- spiece.model ------------------------------------------------------------------------------------------------


@dataclass
class SpieceModel:
    """What a tokenizer takes from a SentencePiece ``ModelProto``."""

    pieces: list[tuple[str, float, int]] = field(default_factory=list)  # (piece, score, type: 1 normal, 2 unk, 3 control)
    model_type: int = 1  # 1 unigram, 2 BPE, 3 word, 4 char
    unk_id: int = 0
    byte_fallback: bool = False
    charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def _fields(data: bytes, where: str):
    """(field number, wire type, value) of one protobuf message: ints for varints and fixed, bytes for the rest."""
    pos, size = 0, len(data)

    def varint() -> int:
        nonlocal pos
        result = shift = 0
        while True:
            if pos >= size or shift > 63:
                raise UnigramError("the SentencePiece model is cut short or malformed", where=where,
                                   fix="replace spiece.model with an intact copy from the model")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while pos < size:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, varint()
        elif wire == 1:
            yield number, wire, data[pos : pos + 8]
            pos += 8
        elif wire == 2:
            length = varint()
            if pos + length > size:
                raise UnigramError("the SentencePiece model is cut short", where=where,
                                   fix="replace spiece.model with an intact copy from the model")
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire == 5:
            yield number, wire, data[pos : pos + 4]
            pos += 4
        else:
            raise UnigramError(f"the SentencePiece model has a field of wire type {wire}, which it never uses",
                               where=where, fix="replace spiece.model with an intact copy from the model")


def _int32(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def read_spiece_model(data: bytes, *, source: str = "<memory>") -> SpieceModel:
    """Parse a SentencePiece ``ModelProto``: pieces, model type, unk id, byte fallback and the normalizer."""
    model = SpieceModel()
    for number, wire, value in _fields(data, source):
        if number == 1 and wire == 2:
            piece, score, kind = "", 0.0, 1
            for n, w, v in _fields(value, source):
                if n == 1 and w == 2:
                    try:
                        piece = v.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise UnigramError(f"piece {len(model.pieces)} is not UTF-8", where=source,
                                           fix="replace spiece.model with an intact copy from the model") from exc
                elif n == 2 and w == 5:
                    (score,) = struct.unpack("<f", v)
                elif n == 3 and w == 0:
                    kind = v
            model.pieces.append((piece, score, kind))
        elif number == 2 and wire == 2:
            for n, w, v in _fields(value, source):
                if w != 0:
                    continue
                if n == 3:
                    model.model_type = v
                elif n == 35:
                    model.byte_fallback = bool(v)
                elif n == 40:
                    model.unk_id = _int32(v)
        elif number == 3 and wire == 2:
            for n, w, v in _fields(value, source):
                if n == 2 and w == 2:
                    model.charsmap = bytes(v)
                elif n == 3 and w == 0:
                    model.add_dummy_prefix = bool(v)
                elif n == 4 and w == 0:
                    model.remove_extra_whitespaces = bool(v)
                elif n == 5 and w == 0:
                    model.escape_whitespaces = bool(v)
    if not model.pieces:
        raise UnigramError("the SentencePiece model has no pieces", where=source,
                           fix="replace spiece.model with an intact copy from the model")
    return model
