"""T5's SentencePiece unigram tokenizer, read from a diffusers ``tokenizer_2/`` (Flux), ``tokenizer_3/`` (SD3)
or ``tokenizer/`` (Chroma) folder.

It gives the ids of transformers' ``T5TokenizerFast`` (what diffusers calls)
without transformers, ``tokenizers`` or ``sentencepiece``, following the same
steps as the ``tokenizers`` pipeline that class builds:

1. special tokens (``<pad>``, ``</s>``, ``<unk>``, ``<extra_id_N>``) are split
   off the raw text;
2. each remaining part is normalized (SentencePiece's precompiled charsmap, then
   the ``Replace``/``Strip`` steps of the file);
3. pre-tokenized (``Metaspace``: spaces become ``▁``, a ``▁`` is put in front,
   and the text is split before each ``▁``);
4. each word is segmented by the unigram model (:mod:`sdrt.text.unigram`);
5. ``</s>`` is appended, then the ids are truncated and padded.

Which pipeline ``T5TokenizerFast`` builds depends on the folder, and this
follows it: with ``tokenizer.json`` and no ``add_prefix_space`` in
``tokenizer_config.json``, the file's own normalizer, pre-tokenizer and
post-processor; when ``tokenizer_config.json`` sets ``add_prefix_space`` (FLUX.1's
``tokenizer_2`` does) or there is no ``tokenizer.json``, transformers rebuilds the
tokenizer from ``spiece.model`` (its ``T5Converter``: charsmap, strip on the right,
runs of spaces to one ``▁``, ``Metaspace`` with the ``legacy`` prefix scheme), and
so does this.
"""

from __future__ import annotations

import json
import logging
import os
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import regex

from .tokenizer import TokenizerError, _read_json_object, _read_text, _token_content
from .unigram import Precompiled, Unigram, UnigramError, read_spiece_model

log = logging.getLogger("sdrt.text.t5")

_DEFAULT_MAX_LENGTH = 512
_METASPACE = "▁"
#: Rust's char::is_whitespace (Unicode White_Space), which the Strip normalizer and WhitespaceSplit use
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
              "\u2028\u2029\u202f\u205f\u3000"
_WHITESPACE_RUN = regex.compile(f"[{regex.escape(_WHITESPACE)}]+")


class T5Batch(NamedTuple):
    """``ids`` and ``mask``: int64 arrays ``[batch, length]``; ``mask`` is 1 on tokens and ``</s>``, 0 on padding."""

    ids: Any
    mask: Any


class _AddedToken(NamedTuple):
    content: str
    id: int
    lstrip: bool
    rstrip: bool
    normalized: bool
    special: bool


# -- the steps of a tokenizers pipeline ---------------------------------------------------------------------------


def _normalizer(spec: Any, source: str) -> list[Callable[[str], str]]:
    """The normalizer of a tokenizer.json as a list of str -> str steps."""
    if spec is None:
        return []
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if kind == "Sequence":
        steps: list[Callable[[str], str]] = []
        for part in spec.get("normalizers", []):
            steps.extend(_normalizer(part, source))
        return steps
    if kind == "Precompiled":
        import base64
        import binascii

        charsmap = spec.get("precompiled_charsmap") or ""
        try:
            data = base64.b64decode(charsmap, validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise TokenizerError(f"the Precompiled normalizer's charsmap is not base64 ({exc})", where=source,
                                 fix="replace tokenizer.json with an intact copy from the model") from exc
        return [Precompiled(data, source=source)] if data else []
    if kind == "Replace":
        pattern, content = spec.get("pattern", {}), spec.get("content", "")
        if isinstance(pattern, Mapping) and isinstance(pattern.get("Regex"), str):
            compiled = regex.compile(pattern["Regex"])
        elif isinstance(pattern, Mapping) and isinstance(pattern.get("String"), str):
            compiled = regex.compile(regex.escape(pattern["String"]))
        else:
            raise TokenizerError(f"the Replace normalizer has the pattern {pattern!r}", where=source,
                                 fix="replace tokenizer.json with an intact copy from the model")
        return [lambda text, c=compiled, r=content: c.sub(lambda _m: r, text)]
    if kind == "Strip":
        left, right = bool(spec.get("strip_left", spec.get("left", True))), bool(spec.get("strip_right",
                                                                                     spec.get("right", True)))
        return [_strip(left, right)]
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return [lambda text, form=kind: unicodedata.normalize(form, text)]
    if kind == "Lowercase":
        return [str.lower]
    raise TokenizerError(f"the normalizer type {kind!r} is not supported by sdrt's T5 tokenizer", where=source,
                         fix="use a T5 tokenizer.json (Precompiled, Replace and Strip normalizers)")


def _strip(left: bool, right: bool) -> Callable[[str], str]:
    def strip(text: str) -> str:
        if left:
            text = text.lstrip(_WHITESPACE)
        if right:
            text = text.rstrip(_WHITESPACE)
        return text

    return strip


class _Metaspace(NamedTuple):
    replacement: str
    prepend: str  # "always", "first" or "never"
    split: bool

    def __call__(self, words: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        rep = self.replacement
        for text, first in words:
            text = text.replace(" ", rep)
            if text and not text.startswith(rep) and (self.prepend == "always" or (self.prepend == "first" and first)):
                text = rep + text
            if not self.split:
                out.append((text, first))
                continue
            begin = 0
            for i in range(1, len(text)):
                if text[i] == rep:
                    out.append((text[begin:i], first and begin == 0))
                    begin = i
            if text:
                out.append((text[begin:], first and begin == 0))
        return [(t, f) for t, f in out if t]


def _whitespace_split(words: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    for text, first in words:
        pos = 0
        for match in _WHITESPACE_RUN.finditer(text):
            if match.start() > pos:
                out.append((text[pos:match.start()], first and pos == 0))
            pos = match.end()
        if pos < len(text):
            out.append((text[pos:], first and pos == 0))
    return out


def _pre_tokenizer(spec: Any, source: str) -> list[Callable[[list[tuple[str, bool]]], list[tuple[str, bool]]]]:
    if spec is None:
        return []
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if kind == "Sequence":
        steps = []
        for part in spec.get("pretokenizers", []):
            steps.extend(_pre_tokenizer(part, source))
        return steps
    if kind == "Metaspace":
        replacement = spec.get("replacement", _METASPACE)
        prepend = spec.get("prepend_scheme", "always")
        if spec.get("add_prefix_space") is False:
            prepend = "never"
        if prepend not in ("always", "first", "never") or not isinstance(replacement, str) or len(replacement) != 1:
            raise TokenizerError(f"the Metaspace pre-tokenizer has replacement {replacement!r} and prepend_scheme"
                                 f" {prepend!r}", where=source,
                                 fix="replace tokenizer.json with an intact copy from the model")
        return [_Metaspace(replacement, prepend, bool(spec.get("split", True)))]
    if kind == "WhitespaceSplit":
        return [_whitespace_split]
    raise TokenizerError(f"the pre-tokenizer type {kind!r} is not supported by sdrt's T5 tokenizer", where=source,
                         fix="use a T5 tokenizer.json (Metaspace and WhitespaceSplit pre-tokenizers)")


def _template(spec: Any, ids: Mapping[str, int], source: str) -> tuple[list[int], list[int]]:
    """The ids a single-sequence TemplateProcessing puts before and after the text (T5: none, ``</s>``)."""
    if spec is None:
        return [], []
    if not isinstance(spec, Mapping) or spec.get("type") != "TemplateProcessing":
        raise TokenizerError(f"the post-processor {spec.get('type') if isinstance(spec, Mapping) else spec!r} is not"
                             " supported by sdrt's T5 tokenizer", where=source,
                             fix="use a T5 tokenizer.json (TemplateProcessing post-processor)")
    before: list[int] = []
    after: list[int] = []
    seen = False
    specials = spec.get("special_tokens", {})
    for item in spec.get("single", []):
        if "Sequence" in item:
            seen = True
        elif "SpecialToken" in item:
            name = item["SpecialToken"].get("id")
            entry = specials.get(name, {})
            token_ids = entry.get("ids") if isinstance(entry, Mapping) else None
            if not isinstance(token_ids, list):
                token_ids = [ids[name]] if name in ids else None
            if token_ids is None:
                raise TokenizerError(f"the post-processor's special token {name!r} has no id", where=source,
                                     fix="replace tokenizer.json with an intact copy from the model")
            (after if seen else before).extend(int(i) for i in token_ids)
    return before, after


# -- the tokenizer ------------------------------------------------------------------------------------------------


class T5Tokenizer:
    """T5 unigram: ``encode(text)`` gives bare ids; ``tok(texts, max_length)`` gives padded ``ids`` and ``mask``.

    Build one with :meth:`from_folder`. ``eos_id``, ``pad_id``, ``unk_id`` and the
    default ``max_length`` come from the folder.
    """

    def __init__(
        self,
        model: Unigram,
        *,
        normalizers: Sequence[Callable[[str], str]] = (),
        pre_tokenizers: Sequence[Callable[[list[tuple[str, bool]]], list[tuple[str, bool]]]] = (),
        added_tokens: Iterable[_AddedToken] = (),
        prefix: Sequence[int] = (),
        suffix: Sequence[int] = (),
        eos_token: str = "</s>",
        pad_token: str = "<pad>",
        unk_token: str = "<unk>",
        max_length: int = _DEFAULT_MAX_LENGTH,
        source: str = "<memory>",
    ) -> None:
        self.source = source
        self._model = model
        self._normalizers = list(normalizers)
        self._pre_tokenizers = list(pre_tokenizers)
        self._prefix, self._suffix = list(prefix), list(suffix)
        self._added: dict[str, _AddedToken] = {}
        for token in added_tokens:
            self._added[token.content] = token
        self.eos_token, self.pad_token, self.unk_token = eos_token, pad_token, unk_token
        self.eos_id = self._special_id(eos_token, "eos_token")
        self.pad_id = self._special_id(pad_token, "pad_token")
        self.unk_id = self._special_id(unk_token, "unk_token")
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
            raise TokenizerError(f"max_length is {max_length!r}, not a positive number of tokens", where=source,
                                 fix="set model_max_length in tokenizer_config.json to the text encoder's length")
        self.max_length = max_length
        self._group_tokens: dict[tuple[bool, str], int] = {}
        self._id_to_token: dict[int, str] = {i: p for i, p in enumerate(model.pieces)}
        for token in self._added.values():
            self._id_to_token[token.id] = token.content
        self._raw_splitter = self._splitter(normalized=False)
        self._normalized_splitter = self._splitter(normalized=True)

    def _special_id(self, token: str, role: str) -> int:
        if token in self._added:
            return self._added[token].id
        found = self._model.token_to_id(token)
        if found is None:
            raise TokenizerError(f"the {role} {token!r} is not in the vocabulary", where=self.source,
                                 fix="use the tokenizer.json / spiece.model that belongs to this configuration")
        return found

    def _splitter(self, *, normalized: bool) -> regex.Pattern[str] | None:
        tokens = sorted((t for t in self._added.values() if t.normalized == normalized),
                        key=lambda t: len(t.content), reverse=True)
        if not tokens:
            return None
        ws = f"[{regex.escape(_WHITESPACE)}]*"
        parts = [f"{ws if t.lstrip else ''}(?P<t{n}>{regex.escape(t.content)}){ws if t.rstrip else ''}"
                 for n, t in enumerate(tokens)]
        for n, t in enumerate(tokens):
            self._group_tokens[(normalized, f"t{n}")] = t.id
        return regex.compile("|".join(parts))

    # -- construction -----------------------------------------------------------------------------------------

    @classmethod
    def from_folder(cls, path: str | os.PathLike[str], *, transformers: int = 4) -> T5Tokenizer:
        """Read a diffusers T5 tokenizer folder: ``tokenizer.json`` and/or ``spiece.model``, and, when present,
        ``tokenizer_config.json`` and ``special_tokens_map.json`` (which overrides it, as in transformers).

        ``tokenizer.json.gz`` and ``spiece.model.gz`` are read when the plain files are absent. ``transformers`` is the major
        version of transformers whose ``T5TokenizerFast`` to follow:

        - 4 (the default; diffusers' references in this project): the folder's ``tokenizer.json``
          as it is, but, as 4.x does, a ``tokenizer_config.json`` that sets ``add_prefix_space``
          (or ``from_slow``) builds the tokenizer from ``spiece.model`` with transformers' converter;
        - 5: 5.x's ``T5Tokenizer``, which rebuilds every T5 tokenizer the same way from the
          vocabulary and the charsmap (charsmap, whitespace split, ``Metaspace``), whatever the folder's
          ``tokenizer.json`` says.
        """
        if transformers not in (4, 5):
            raise TokenizerError(f"transformers is {transformers!r}", where="T5Tokenizer.from_folder(transformers=...)",
                                 fix="pass 4 or 5, the major version of transformers whose ids to give")
        folder = Path(path)
        if not folder.is_dir():
            raise TokenizerError("the tokenizer folder does not exist", where=str(folder),
                                 fix="give the model's T5 tokenizer folder (tokenizer_2/ for Flux, tokenizer_3/ for"
                                     " SD3), with tokenizer.json or spiece.model")
        settings: dict[str, Any] = {}
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            file = folder / name
            if file.is_file():
                settings.update(_read_json_object(file))
        json_file = next((f for f in (folder / "tokenizer.json", folder / "tokenizer.json.gz") if f.is_file()), None)
        spiece = next((f for f in (folder / "spiece.model", folder / "spiece.model.gz") if f.is_file()),
                      folder / "spiece.model")
        from_slow = settings.get("add_prefix_space") is not None or bool(settings.get("from_slow"))
        if transformers == 5:
            from_slow = False
        if json_file is not None and not (from_slow and spiece.is_file()):
            if from_slow:
                log.warning("%s asks for the tokenizer to be built from spiece.model, which is missing; reading %s",
                            folder, json_file.name)
            return cls._from_tokenizer_json(json_file, settings, str(folder), transformers5=transformers == 5)
        if spiece.is_file():
            if json_file is not None and settings.get("add_prefix_space") is None:
                # "from_slow" with a tokenizer.json: 4.x builds the slow tokenizer with add_prefix_space=None,
                # which its converter reads as "never" (without tokenizer.json the slow default, True, holds)
                settings["add_prefix_space"] = False
            return cls._from_spiece(spiece, settings, str(folder), transformers5=transformers == 5)
        raise TokenizerError("the tokenizer folder has neither tokenizer.json nor spiece.model", where=str(folder),
                             fix="point at the model's T5 tokenizer folder (tokenizer_2/ for Flux, tokenizer_3/ for"
                                 " SD3, tokenizer/ for Chroma)")

    @classmethod
    def _from_tokenizer_json(cls, file: Path, settings: Mapping[str, Any], folder: str, *,
                             transformers5: bool = False) -> T5Tokenizer:
        where = str(file)
        try:
            data = json.loads(_read_text(file))
        except json.JSONDecodeError as exc:
            raise TokenizerError(f"the file is not valid JSON ({exc})", where=where,
                                 fix="replace it with an intact copy from the model") from exc
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise TokenizerError("the file has no tokenizer model", where=where,
                                 fix="replace it with an intact copy from the model")
        spec = data["model"]
        if spec.get("type") != "Unigram":
            raise TokenizerError(f"the tokenizer model is {spec.get('type')!r}, not T5's Unigram", where=where,
                                 fix="point at a T5 tokenizer folder (tokenizer_2/ for Flux, tokenizer_3/ for SD3)")
        vocab = spec.get("vocab")
        if not isinstance(vocab, list) or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], (int, float))
            for v in vocab
        ):
            raise TokenizerError("the Unigram vocabulary is not a list of [piece, score] pairs", where=where,
                                 fix="replace it with an intact copy from the model")
        try:
            model = Unigram([(p, s) for p, s in vocab], spec.get("unk_id"),
                            byte_fallback=bool(spec.get("byte_fallback")), source=where)
        except UnigramError as exc:
            raise TokenizerError(exc.args[0] if exc.args else str(exc), where=where,
                                 fix="replace it with an intact copy from the model") from exc
        added = []
        for entry in data.get("added_tokens") or []:
            if isinstance(entry, Mapping) and isinstance(entry.get("content"), str) and isinstance(entry.get("id"), int):
                added.append(_AddedToken(entry["content"], entry["id"], bool(entry.get("lstrip")),
                                         bool(entry.get("rstrip")), bool(entry.get("normalized")),
                                         bool(entry.get("special"))))
        added = _with_config_tokens(added, settings, model, where)
        ids = {t.content: t.id for t in added}
        if transformers5:
            normalizers = [step for step in _normalizer(data.get("normalizer"), where) if isinstance(step, Precompiled)]
            return cls._transformers5(model, normalizers[:1], added, settings, folder)
        prefix, suffix = _template(data.get("post_processor"), ids, where)
        return cls(model, normalizers=_normalizer(data.get("normalizer"), where),
                   pre_tokenizers=_pre_tokenizer(data.get("pre_tokenizer"), where), added_tokens=added,
                   prefix=prefix, suffix=suffix, max_length=_max_length(settings, folder), source=folder,
                   **_special_names(settings, folder))

    @classmethod
    def _transformers5(cls, model: Unigram, normalizers: list[Callable[[str], str]], added: list[_AddedToken],
                       settings: Mapping[str, Any], folder: str) -> T5Tokenizer:
        """transformers 5's ``T5Tokenizer``: the charsmap alone, whitespace split, ``Metaspace`` always, ``$A </s>``."""
        names = _special_names(settings, folder)
        eos = names.get("eos_token", "</s>")
        eos_id = next((t.id for t in added if t.content == eos), model.token_to_id(eos))
        return cls(model, normalizers=normalizers,
                   pre_tokenizers=[_whitespace_split, _Metaspace(_METASPACE, "always", True)], added_tokens=added,
                   suffix=[] if eos_id is None else [eos_id], max_length=_max_length(settings, folder),
                   source=folder, **names)

    @classmethod
    def _from_spiece(cls, file: Path, settings: Mapping[str, Any], folder: str, *,
                     transformers5: bool = False) -> T5Tokenizer:
        """As transformers' ``T5Converter`` builds ``T5TokenizerFast`` from the slow tokenizer's ``spiece.model``."""
        where = str(file)
        try:
            raw = file.read_bytes()
            if file.suffix == ".gz":
                import gzip

                raw = gzip.decompress(raw)
            proto = read_spiece_model(raw, source=where)
        except (OSError, EOFError) as exc:
            raise TokenizerError(f"cannot read spiece.model ({exc})", where=where,
                                 fix="replace it with an intact copy from the model") from exc
        except UnigramError as exc:
            raise TokenizerError(exc.args[0] if exc.args else str(exc), where=where,
                                 fix="replace it with an intact copy from the model") from exc
        if proto.model_type != 1:
            raise TokenizerError(f"the SentencePiece model type is {proto.model_type}, not unigram (1)", where=where,
                                 fix="point at a T5 tokenizer folder (tokenizer_2/ for Flux, tokenizer_3/ for SD3)")
        extra_ids = settings.get("extra_ids", 100)
        if not isinstance(extra_ids, int) or isinstance(extra_ids, bool) or extra_ids < 0:
            raise TokenizerError(f"extra_ids is {extra_ids!r}, not a count", where=folder,
                                 fix="set extra_ids in tokenizer_config.json to 100, as T5's")
        vocab = [(piece, score) for piece, score, _ in proto.pieces]
        vocab += [(f"<extra_id_{i}>", 0.0) for i in range(extra_ids - 1, -1, -1)]
        try:
            model = Unigram(vocab, proto.unk_id, source=where)
        except UnigramError as exc:
            raise TokenizerError(exc.args[0] if exc.args else str(exc), where=where,
                                 fix="replace it with an intact copy from the model") from exc
        steps: list[Callable[[str], str]] = []
        if proto.charsmap:
            steps.append(Precompiled(proto.charsmap, source=where))
        added = _with_config_tokens([], settings, model, where)
        if transformers5:
            return cls._transformers5(model, steps, added, settings, folder)
        steps += [_strip(False, True), lambda text: _SPACE_RUN.sub(_METASPACE, text)]
        add_prefix_space = settings.get("add_prefix_space", True)
        legacy = settings.get("legacy", True)
        prepend = ("always" if legacy is not False else "first") if add_prefix_space is not False else "never"
        eos = _token_content(settings.get("eos_token")) or "</s>"
        eos_id = next((t.id for t in added if t.content == eos), model.token_to_id(eos))
        return cls(model, normalizers=steps, pre_tokenizers=[_Metaspace(_METASPACE, prepend, True)],
                   added_tokens=added, suffix=[] if eos_id is None else [eos_id],
                   max_length=_max_length(settings, folder), source=folder, **_special_names(settings, folder))

    # -- encoding ----------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return max(len(self._model.pieces), max((t.id + 1 for t in self._added.values()), default=0))

    def _split(self, text: str, splitter: regex.Pattern[str] | None, normalized: bool,
               start: int) -> list[tuple[str, int] | int]:
        if splitter is None:
            return [(text, start)] if text else []
        out: list[tuple[str, int] | int] = []
        pos = 0
        for match in splitter.finditer(text):
            if match.start() > pos:
                out.append((text[pos:match.start()], start + pos))
            out.append(self._group_tokens[(normalized, match.lastgroup or "")])
            pos = match.end()
        if pos < len(text):
            out.append((text[pos:], start + pos))
        return out

    def encode(self, text: str) -> list[int]:
        """Unigram ids of ``text`` with no ``</s>``, truncation or padding (transformers' ``add_special_tokens=False``)."""
        if not isinstance(text, str):
            raise TokenizerError(f"the prompt is a {type(text).__name__}, not text", where="T5Tokenizer.encode",
                                 fix="pass the prompt as a str")
        ids: list[int] = []
        for part in self._split(text, self._raw_splitter, False, 0):
            if isinstance(part, int):
                ids.append(part)
                continue
            piece, start = part
            for step in self._normalizers:
                piece = step(piece)
            for sub in self._split(piece, self._normalized_splitter, True, start):
                if isinstance(sub, int):
                    ids.append(sub)
                    continue
                words = [(sub[0], sub[1] == 0)]
                for pre in self._pre_tokenizers:
                    words = pre(words)
                for word, _ in words:
                    ids.extend(self._model.encode(word))
        return ids

    def __call__(
        self,
        texts: str | Sequence[str],
        max_length: int | None = None,
        *,
        padding: str = "max_length",
        truncation: bool = True,
        add_special_tokens: bool = True,
    ) -> T5Batch:
        """Ids and attention mask for each text, as ``T5TokenizerFast(texts, padding=..., max_length=...,
        truncation=..., add_special_tokens=...)`` gives them: ``T5Batch(ids, mask)``, int64 ``[batch, length]``.

        ``padding="max_length"`` pads every row to ``max_length`` (the pipelines' call);
        ``"longest"`` to the longest row. With ``truncation`` a row keeps its first
        ``max_length - 1`` ids and ``</s>``; without, a text longer than ``max_length`` is an error.
        """
        import numpy as np

        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, Sequence) or not texts or not all(isinstance(t, str) for t in texts):
            raise TokenizerError("texts must be a str or a non-empty list of str", where="T5Tokenizer(texts)",
                                 fix="pass the prompt, or a list of prompts, as text")
        if max_length is None:
            max_length = self.max_length
        extra = len(self._prefix) + len(self._suffix) if add_special_tokens else 0
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < max(1, extra):
            raise TokenizerError(f"max_length is {max_length!r}, but it must hold at least {max(1, extra)} token(s)",
                                 where="T5Tokenizer(max_length=...)",
                                 fix="pass max_sequence_length as the pipeline sets it (256 for SD3 and Flux schnell,"
                                     " 512 for Flux dev and Chroma)")
        if padding not in ("max_length", "longest"):
            raise TokenizerError(f"padding is {padding!r}", where="T5Tokenizer(padding=...)",
                                 fix='pass padding="max_length" (the pipelines\') or "longest"')
        rows: list[list[int]] = []
        for n, text in enumerate(texts):
            ids = self.encode(text)
            if len(ids) + extra > max_length:
                if not truncation:
                    raise TokenizerError(f"text {n} is {len(ids) + extra} tokens long, over max_length {max_length}",
                                         where="T5Tokenizer(truncation=False)",
                                         fix="pass truncation=True (as the pipelines do) or a larger max_length")
                ids = ids[: max_length - extra]
            rows.append([*self._prefix, *ids, *self._suffix] if add_special_tokens else ids)
        width = max_length if padding == "max_length" else max(len(r) for r in rows)
        out = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return T5Batch(out, mask)

    # -- decoding ----------------------------------------------------------------------------------------------

    def id_to_token(self, token_id: int) -> str | None:
        """The piece of an id (``"▁cat"``), the added token of an added id, or None."""
        return self._id_to_token.get(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        """The id of a piece (``"▁cat"``) or of an added token, or None."""
        if token in self._added:
            return self._added[token].id
        return self._model.token_to_id(token)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``: pieces joined, ``▁`` read as a space (the prefix space dropped)."""
        parts: list[str] = []
        for i in ids:
            token = self._id_to_token.get(int(i))
            if token is None:
                continue
            added = self._added.get(token)
            if added is not None and added.special and skip_special:
                continue
            parts.append(token)
        text = "".join(parts).replace(_METASPACE, " ")
        return text[1:] if text.startswith(" ") else text

    def __repr__(self) -> str:
        return (f"T5Tokenizer({self.source!r}, vocab={len(self._model.pieces)}, added={len(self._added)},"
                f" max_length={self.max_length})")


def keep_first_pad(mask: Any) -> Any:
    """Chroma's text mask for the transformer: the tokenizer's mask plus the first padding position.

    diffusers' ``ChromaPipeline`` (and the original implementation) let every text
    token, ``</s>`` and the first ``<pad>`` attend and mask the rest:
    position ``i`` is kept when ``i <= sum(mask)``. Returns int64 ``[batch, length]``.
    """
    import numpy as np

    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise TokenizerError(f"the mask has shape {mask.shape}, not [batch, length]", where="keep_first_pad(mask)",
                             fix="pass the mask that T5Tokenizer(...) returned")
    lengths = mask.astype(np.int64).sum(axis=1, keepdims=True)
    return (np.arange(mask.shape[1])[None, :] <= lengths).astype(np.int64)


_SPACE_RUN = regex.compile(" {2,}")


def _with_config_tokens(added: list[_AddedToken], settings: Mapping[str, Any], model: Unigram,
                        where: str) -> list[_AddedToken]:
    """Add the special tokens that tokenizer_config.json names (as transformers registers them) to ``added``."""
    have = {t.content for t in added}
    out = list(added)
    decoder = settings.get("added_tokens_decoder")
    if isinstance(decoder, Mapping):
        for key, value in sorted(decoder.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else -1):
            content = _token_content(value)
            if content is None or not str(key).isdigit() or content in have:
                continue
            info = value if isinstance(value, Mapping) else {}
            special = bool(info.get("special", True))
            out.append(_AddedToken(content, int(key), bool(info.get("lstrip")), bool(info.get("rstrip")),
                                   bool(info.get("normalized", not special)), special))
            have.add(content)
    names: list[Any] = [settings.get(k) for k in ("eos_token", "unk_token", "pad_token")]
    extra = settings.get("additional_special_tokens")
    if isinstance(extra, list):
        names += extra
    for value in names:
        content = _token_content(value)
        if content is None or content in have:
            continue
        token_id = model.token_to_id(content)
        if token_id is None:
            raise TokenizerError(f"the special token {content!r} is not in the vocabulary", where=where,
                                 fix="use the tokenizer.json / spiece.model that belongs to this configuration")
        out.append(_AddedToken(content, token_id, False, False, False, True))
        have.add(content)
    return out


def _special_names(settings: Mapping[str, Any], folder: str) -> dict[str, str]:
    names: dict[str, str] = {}
    for key in ("eos_token", "pad_token", "unk_token"):
        if settings.get(key) is None:
            continue
        content = _token_content(settings[key])
        if content is None:
            raise TokenizerError(f"{key} is {settings[key]!r}, not a string or an AddedToken object", where=folder,
                                 fix=f"write {key} as a string such as \"</s>\"")
        names[key] = content
    return names


def _max_length(settings: Mapping[str, Any], folder: str) -> int:
    value = settings.get("model_max_length", _DEFAULT_MAX_LENGTH)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1_000_000:
        log.debug("model_max_length %r in %s is not a usable length; using %d", value, folder, _DEFAULT_MAX_LENGTH)
        return _DEFAULT_MAX_LENGTH
    return value
