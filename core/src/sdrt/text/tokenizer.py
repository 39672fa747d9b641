"""CLIP's byte-level BPE tokenizer, read from a diffusers ``tokenizer/`` folder.

It gives the ids of transformers' slow ``CLIPTokenizer`` (the one diffusers and
A1111 call) without transformers or ``tokenizers``: the text is cleaned as
transformers cleans it when ``ftfy`` is absent (:mod:`sdrt.text.normalize`),
split with CLIP's word pattern, mapped to bytes, and merged with the ranks in
``merges.txt``. Special tokens (``<|startoftext|>``, ``<|endoftext|>``, and the
pad token, which is ``!`` for SD 2.x) are split off the raw text first, as
transformers does. See ``docs/pipelines.md`` for why this is not the
``tokenizers`` package.

Tokens added with :meth:`CLIPTokenizer.add_tokens` (textual-inversion
embeddings) are whole words, matched without regard to case, each mapped to one
or more new ids.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import regex

from ..errors import ModelError

log = logging.getLogger("sdrt.text.tokenizer")

#: CLIP's word pattern (transformers' ``CLIPTokenizer.pat``; the special tokens are split off before it)
_WORDS = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""", regex.IGNORECASE)
_LETTER_OR_NUMBER = regex.compile(r"[\p{L}\p{N}]")
_DEFAULT_MAX_LENGTH = 77
_CACHE_LIMIT = 100_000


def added_pattern(token: str) -> str:
    """The pattern an added token (an embedding's trigger word) matches: the whole word, in any case."""
    head = r"(?<![\p{L}\p{N}])" if _LETTER_OR_NUMBER.match(token[0]) else ""
    tail = r"(?![\p{L}\p{N}])" if _LETTER_OR_NUMBER.match(token[-1]) else ""
    return f"(?i:{head}{regex.escape(token)}{tail})"


def mentions(text: str, token: str) -> bool:
    """Whether ``text`` holds the added token ``token`` as the tokenizer matches it (:func:`added_pattern`)."""
    return bool(token) and regex.search(added_pattern(token), text) is not None


class TokenizerError(ModelError):
    """A tokenizer folder or file is missing or malformed, or a token cannot be added."""


@cache
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json / special_tokens_map.json write it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class CLIPTokenizer:
    """CLIP BPE: ``encode(text)`` gives bare ids; ``tok(text)`` gives the padded ``max_length`` ids.

    Build one with :meth:`from_folder`. ``bos_id``, ``eos_id``, ``pad_id`` and
    ``max_length`` come from the folder's configuration.
    """

    def __init__(
        self,
        vocab: Mapping[str, int],
        merges: Iterable[tuple[str, str]],
        *,
        bos_token: str = "<|startoftext|>",
        eos_token: str = "<|endoftext|>",
        pad_token: str | None = None,
        unk_token: str = "<|endoftext|>",
        max_length: int = _DEFAULT_MAX_LENGTH,
        source: str = "<memory>",
    ) -> None:
        self.source = source
        self._vocab: dict[str, int] = dict(vocab)
        self._ranks: dict[tuple[str, str], int] = {}
        for pair in merges:
            self._ranks.setdefault(pair, len(self._ranks))
        pad_token = eos_token if pad_token is None else pad_token
        self.bos_token, self.eos_token, self.pad_token, self.unk_token = bos_token, eos_token, pad_token, unk_token
        self.bos_id = self._special_id(bos_token, "bos_token")
        self.eos_id = self._special_id(eos_token, "eos_token")
        self.pad_id = self._special_id(pad_token, "pad_token")
        self.unk_id = self._special_id(unk_token, "unk_token")
        if max_length < 2:
            raise TokenizerError(
                f"max_length is {max_length}, but it must hold at least the start and end tokens",
                where=source, fix="set model_max_length in tokenizer_config.json to the text encoder's length (77 for CLIP)")
        self.max_length = max_length
        self._id_to_token = {i: t for t, i in self._vocab.items()}
        self._next_id = max(self._vocab.values(), default=-1) + 1
        #: added whole-word tokens, lower-cased text -> ids (one per embedding vector)
        self._added: dict[str, tuple[int, ...]] = {}
        self._bpe_cache: dict[str, list[int]] = {}
        self._specials = sorted({bos_token, eos_token, pad_token, unk_token}, key=len, reverse=True)
        self._splitter: regex.Pattern[str] | None = None

    # -- construction -----------------------------------------------------------------------------------------

    @classmethod
    def from_folder(cls, path: str | os.PathLike[str]) -> CLIPTokenizer:
        """Read a diffusers ``tokenizer/`` folder: ``vocab.json``, ``merges.txt`` and, when present,
        ``tokenizer_config.json``, ``special_tokens_map.json`` and ``added_tokens.json``.

        ``special_tokens_map.json`` overrides ``tokenizer_config.json``, as in transformers.
        ``vocab.json.gz`` and ``merges.txt.gz`` are read when the plain files are absent. A folder that
        transformers 5 saved holds ``tokenizer.json`` alone: its BPE model's ``vocab`` and ``merges`` (and its
        ``added_tokens``) are read then.
        """
        folder = Path(path)
        if not folder.is_dir():
            raise TokenizerError("the tokenizer folder does not exist", where=str(folder),
                                 fix="give the model's tokenizer/ folder (with vocab.json and merges.txt)")
        single = folder / "tokenizer.json"
        if not any((folder / f).is_file() for f in ("vocab.json", "vocab.json.gz")) and single.is_file():
            vocab, merges, added = _read_tokenizer_json(single)
        else:
            vocab = _read_vocab(_find(folder, "vocab.json"))
            merges = _read_merges(_find(folder, "merges.txt"))
            added = {}
        settings: dict[str, Any] = {}
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            file = folder / name
            if file.is_file():
                settings.update(_read_json_object(file))
        kwargs: dict[str, Any] = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            if key in settings and settings[key] is not None:
                content = _token_content(settings[key])
                if content is None:
                    raise TokenizerError(f"{key} is {settings[key]!r}, not a string or an AddedToken object",
                                         where=str(folder), fix=f"write {key} as a string such as \"<|endoftext|>\"")
                kwargs[key] = content
        max_length = settings.get("model_max_length", _DEFAULT_MAX_LENGTH)
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length > 1_000_000:
            # transformers writes a huge sentinel when no length was set; CLIP's is 77
            log.debug("model_max_length %r in %s is not a usable length; using %d", max_length, folder,
                      _DEFAULT_MAX_LENGTH)
            max_length = _DEFAULT_MAX_LENGTH
        tok = cls(vocab, merges, max_length=max_length, source=str(folder), **kwargs)
        tok._load_added_tokens(folder, settings, added)
        return tok

    def _load_added_tokens(self, folder: Path, settings: Mapping[str, Any],
                           added: Mapping[str, int] | None = None) -> None:
        """Tokens that a saved tokenizer added beyond its vocabulary (diffusers' textual inversion saves them)."""
        found: dict[str, int] = dict(added or {})
        decoder = settings.get("added_tokens_decoder")
        if isinstance(decoder, Mapping):
            for key, value in decoder.items():
                content = _token_content(value)
                if content is not None and str(key).isdigit():
                    found[content] = int(key)
        file = folder / "added_tokens.json"
        if file.is_file():
            for content, index in _read_json_object(file).items():
                if isinstance(index, int) and not isinstance(index, bool):
                    found[content] = index
        for content, index in sorted(found.items(), key=lambda item: item[1]):
            if content in self._vocab or content in self._specials:
                continue
            self._register_added(content, (index,))

    def _special_id(self, token: str, role: str) -> int:
        if token not in self._vocab:
            raise TokenizerError(f"the {role} {token!r} is not in the vocabulary", where=self.source,
                                 fix="use the vocab.json that belongs to this tokenizer configuration")
        return self._vocab[token]

    # -- added tokens (textual inversion) -----------------------------------------------------------------------

    def add_tokens(self, tokens: str | Iterable[str], *, vectors: int = 1) -> dict[str, list[int]]:
        """Add whole-word tokens (textual-inversion trigger words); give each ``vectors`` new ids.

        A token matches where it stands as a word of its own in a prompt, in any
        case (CLIP lower-cases all text), and encodes to its ids instead of its
        BPE pieces. Adding a token again returns the ids it already has.
        Returns ``{token: [ids]}`` in the order given.
        """
        if isinstance(tokens, str):
            tokens = [tokens]
        if not isinstance(vectors, int) or vectors < 1:
            raise TokenizerError(f"vectors is {vectors!r}, but each added token needs at least one id",
                                 where=self.source, fix="pass vectors=N with N >= 1 (the embedding's vector count)")
        result: dict[str, list[int]] = {}
        for token in tokens:
            if not isinstance(token, str) or not token.strip() or token != token.strip():
                raise TokenizerError(f"cannot add the token {token!r}: it must be non-empty text without"
                                     " leading or trailing whitespace", where=self.source,
                                     fix="use the embedding's trigger word, such as 'easynegative'")
            key = token.lower()
            if key in self._added:
                have = self._added[key]
                if len(have) != vectors:
                    raise TokenizerError(f"the token {token!r} was added with {len(have)} vector(s), now with"
                                         f" {vectors}", where=self.source,
                                         fix="load each embedding once, or use a fresh tokenizer")
                result[token] = list(have)
                continue
            ids = tuple(range(self._next_id, self._next_id + vectors))
            self._register_added(token, ids)
            result[token] = list(ids)
        return result

    def _register_added(self, token: str, ids: tuple[int, ...]) -> None:
        self._added[token.lower()] = ids
        for n, i in enumerate(ids):
            self._id_to_token.setdefault(i, token if n == 0 else f"{token}_{n}")
        self._next_id = max(self._next_id, max(ids) + 1)
        self._splitter = None

    @property
    def added_tokens(self) -> dict[str, list[int]]:
        """Added whole-word tokens (lower-cased) and their ids."""
        return {k: list(v) for k, v in self._added.items()}

    def added_group(self, token_id: int) -> int:
        """How many ids start at ``token_id`` as one added multi-vector token (0 if it starts none)."""
        for ids in self._added.values():
            if ids[0] == token_id:
                return len(ids)
        return 0

    def _build_splitter(self) -> regex.Pattern[str]:
        parts = [f"(?P<s{n}>{regex.escape(t)})" for n, t in enumerate(self._specials)]
        for n, text in enumerate(sorted(self._added, key=len, reverse=True)):
            parts.append(f"(?P<a{n}>{added_pattern(text)})")
        return regex.compile("|".join(parts))

    # -- encoding ----------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Ids in use: the vocabulary and every added id."""
        return self._next_id

    def encode(self, text: str) -> list[int]:
        """BPE ids of ``text`` with no start, end or padding tokens (transformers' ``add_special_tokens=False``)."""
        if not isinstance(text, str):
            raise TokenizerError(f"the prompt is a {type(text).__name__}, not text", where="CLIPTokenizer.encode",
                                 fix="pass the prompt as a str")
        splitter = self._splitter or self._build_splitter()
        self._splitter = splitter
        ids: list[int] = []
        start = 0
        for m in splitter.finditer(text):
            ids.extend(self._encode_plain(text[start:m.start()]))
            start = m.end()
            group = m.lastgroup or ""
            if group.startswith("s"):
                ids.append(self._vocab[m.group()])
            else:
                ids.extend(self._added[m.group().lower()])
        ids.extend(self._encode_plain(text[start:]))
        return ids

    def __call__(self, text: str) -> list[int]:
        """``max_length`` ids: start, the first ``max_length - 2`` BPE ids, end, then padding.

        The same as transformers' ``CLIPTokenizer(text, padding="max_length", truncation=True)``.
        """
        ids = [self.bos_id, *self.encode(text)[: self.max_length - 2], self.eos_id]
        return ids + [self.pad_id] * (self.max_length - len(ids))

    def _encode_plain(self, text: str) -> list[int]:
        if not text:
            return []
        from .normalize import normalize

        ids: list[int] = []
        for word in _WORDS.findall(normalize(text)):
            ids.extend(self._bpe(word))
        return ids

    def _bpe(self, word: str) -> list[int]:
        cached = self._bpe_cache.get(word)
        if cached is not None:
            return cached
        table = _byte_to_unicode()
        chars = "".join(table[b] for b in word.encode("utf-8"))
        parts = [*chars[:-1], chars[-1] + "</w>"]
        ranks = self._ranks
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get((parts[i], parts[i + 1]), 1 << 62))
            pair = (parts[best], parts[best + 1])
            if pair not in ranks:
                break
            merged: list[str] = []
            i = 0
            while i < len(parts):
                if i < len(parts) - 1 and parts[i] == pair[0] and parts[i + 1] == pair[1]:
                    merged.append(pair[0] + pair[1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = [self._vocab.get(p, self.unk_id) for p in parts]
        if len(self._bpe_cache) >= _CACHE_LIMIT:
            self._bpe_cache.clear()
        self._bpe_cache[word] = ids
        return ids

    # -- decoding ----------------------------------------------------------------------------------------------

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of an id (``"cat</w>"``), the added token for an added id, or None."""
        return self._id_to_token.get(token_id)

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry (``"cat</w>"``), or of an added token's first vector, or None."""
        if token in self._vocab:
            return self._vocab[token]
        added = self._added.get(token.lower())
        return added[0] if added else None

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of ``ids`` (lower-cased and space-separated as CLIP sees it)."""
        inverse = {c: b for b, c in _byte_to_unicode().items()}
        specials = {self.bos_id, self.eos_id, self.pad_id} if skip_special else set()
        out = bytearray()
        for i in ids:
            if i in specials:
                continue
            token = self._id_to_token.get(int(i))
            if token is None:
                continue
            if token in self._specials or token.lower() in self._added:
                out += token.encode("utf-8") + b" "
                continue
            word = token.endswith("</w>")
            out += bytes(inverse[c] for c in token.removesuffix("</w>") if c in inverse)
            if word:
                out += b" "
        return out.decode("utf-8", errors="replace").strip()

    def __repr__(self) -> str:
        return (f"CLIPTokenizer({self.source!r}, vocab={len(self._vocab)}, added={len(self._added)},"
                f" max_length={self.max_length}, pad={self.pad_token!r})")


# -- file reading -------------------------------------------------------------------------------------------------


def _find(folder: Path, name: str) -> Path:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise TokenizerError(f"the tokenizer folder has no {name}", where=str(folder),
                         fix="point at a diffusers tokenizer/ folder, which holds vocab.json and merges.txt")


def _read_text(file: Path) -> str:
    try:
        raw = file.read_bytes()
        if file.suffix == ".gz":
            import gzip

            raw = gzip.decompress(raw)
        return raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"cannot read the tokenizer file ({exc})", where=str(file),
                             fix="replace it with an intact copy from the model") from exc


def _read_json_object(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(_read_text(file))
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"the file is not valid JSON ({exc})", where=str(file),
                             fix="replace it with an intact copy from the model") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"the file holds a JSON {type(data).__name__}, not an object", where=str(file),
                             fix="replace it with an intact copy from the model")
    return data


def _read_vocab(file: Path) -> dict[str, int]:
    data = _read_json_object(file)
    bad = [k for k, v in data.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0]
    if bad:
        raise TokenizerError(f"{len(bad)} vocabulary entries have no non-negative integer id (first: {bad[0]!r})",
                             where=str(file), fix="replace it with an intact copy from the model")
    if not data:
        raise TokenizerError("the vocabulary is empty", where=str(file),
                             fix="replace it with an intact copy from the model")
    return data


def _read_tokenizer_json(file: Path) -> tuple[dict[str, int], list[tuple[str, str]], dict[str, int]]:
    """(vocab, merges, added tokens) of a ``tokenizers`` file whose model is BPE, as transformers 5 saves CLIP's:
    ``merges`` as ``["a", "b"]`` pairs (tokenizers 0.20 and later) or ``"a b"`` strings (earlier)."""
    data = _read_json_object(file)
    model = data.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise TokenizerError(f"tokenizer.json holds a {kind or 'no'} model, not CLIP's BPE", where=str(file),
                             fix="use the tokenizer.json (or vocab.json and merges.txt) of a CLIP tokenizer")
    vocab = model.get("vocab")
    bad = "vocab is not an object" if not isinstance(vocab, dict) or not vocab else next(
        (f"vocab entry {k!r} has no non-negative integer id" for k, v in vocab.items()
         if not isinstance(v, int) or isinstance(v, bool) or v < 0), None)
    merges: list[tuple[str, str]] = []
    raw = model.get("merges")
    if bad is None and not isinstance(raw, list):
        bad = "merges is not a list"
    for number, item in enumerate(raw if bad is None else []):
        parts = item.split() if isinstance(item, str) else item
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) for p in parts):
            bad = f"merge {number} is {item!r:.60}, not two symbols"
            break
        merges.append((parts[0], parts[1]))
    if bad is not None:
        raise TokenizerError(f"tokenizer.json's BPE model: {bad}", where=str(file),
                             fix="replace it with an intact copy from the model")
    added = {t["content"]: t["id"] for t in data.get("added_tokens") or []
             if isinstance(t, dict) and isinstance(t.get("content"), str) and isinstance(t.get("id"), int)}
    return dict(vocab), merges, added


def _read_merges(file: Path) -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    for number, line in enumerate(_read_text(file).splitlines(), start=1):
        if not line.strip() or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenizerError(f"line {number} is {line[:60]!r}, not two space-separated symbols",
                                 where=str(file), fix="replace it with an intact copy from the model")
        merges.append((parts[0], parts[1]))
    return merges
