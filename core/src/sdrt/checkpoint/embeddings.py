"""Textual-inversion embeddings: A1111's files, and the token rows they add.

Formats read (``.safetensors``, or PyTorch ``.pt``/``.bin`` read by ``sdrt.weights.torchfile``, which runs nothing
from the file):

- A1111 / SD 1.x-2.x: ``emb_params`` [n, d] (n vectors, the trigger word stands for n tokens);
- SDXL: ``clip_l`` [n, 768] for the first text encoder and ``clip_g`` [n, 1280] for the second;
- diffusers' ``learned_embeds.safetensors``: one tensor named after its token, [d] or [n, d];
- A1111's ``.pt`` (``string_to_param`` ``{"*": vectors}``, read as ``string_to_param.*``; rinongal's original
  textual inversion keeps it in a ``ParameterDict``, read the same way, its one term ``*`` or the placeholder the
  trainer was given), or that layout flattened into a ``.safetensors``;
- diffusers' ``learned_embeds.bin``: one tensor named after its token;
- diffusers' SDXL textual inversion (``examples/textual_inversion/textual_inversion_sdxl.py``): two files,
  ``learned_embeds.safetensors`` (``text_encoder``, CLIP-L) and ``learned_embeds_2.safetensors`` (``text_encoder_2``,
  CLIP-G), each ``{placeholder token: [n, d]}`` (``learned_embeds[_2]-steps-N.safetensors`` while it trains). Given
  either file, or the folder holding them, the pair is one SDXL embedding (``clip_l`` + ``clip_g``) whose trigger
  word is the placeholder token the files hold (``<cat-toy>``), as diffusers' two ``load_textual_inversion`` calls
  (one per text encoder) use it; ``learned_embeds.safetensors`` without a ``_2`` beside it is a one-encoder
  embedding (diffusers' SD 1.x/2.x script writes that name too).

An embedding is used the way A1111 and diffusers' ``load_textual_inversion``
use it: its trigger word (the file's stem) becomes n new tokens, and n new rows
are added at the end of the text encoder's token-embedding table, so the
tokens' ids are ``vocab + i``. ``extend_table`` builds that table;
``reserve_rows`` gives a text-encoder graph room for such rows once, so later
embeddings change only weights (``Session.update_weights``), never the graph.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import WeightsError
from ..weights import Weights
from .onnxmap import param_map

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph

TOKEN_TABLE = "embeddings.token_embedding.weight"
#: what an embeddings folder's files are (``--embedding-dir``, the server's): A1111's formats
EMBEDDING_SUFFIXES = (".safetensors", ".pt", ".bin")


@dataclass(frozen=True)
class Embedding:
    """One embedding: its trigger word and vectors per text encoder (``clip_l``: the first or only,
    ``clip_g``: SDXL's second)."""

    name: str
    vectors: Mapping[str, np.ndarray] = field(repr=False)
    source: str = "<memory>"

    @property
    def count(self) -> int:
        """How many tokens the trigger word stands for."""
        return int(next(iter(self.vectors.values())).shape[0])

    def for_encoder(self, key: str) -> np.ndarray | None:
        return self.vectors.get(key)

    def shorthash(self) -> str:
        """A1111's ``TI hashes`` value: the first 12 hex digits of the file's sha256."""
        return sha256_file(Path(self.source))[:12] if Path(self.source).is_file() else ""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


#: diffusers' textual-inversion outputs: ``learned_embeds[-steps-N]`` (text_encoder) and, from its SDXL script,
#: ``learned_embeds_2[-steps-N]`` (text_encoder_2)
_DIFFUSERS_TI = re.compile(r"^learned_embeds(?P<two>_2)?(?P<steps>-steps-\d+)?(?P<ext>\.safetensors|\.bin)$",
                           re.IGNORECASE)
_PAIR_FIX = "textual_inversion_sdxl.py saves learned_embeds.safetensors (text_encoder) and learned_embeds_2.safetensors " \
    "(text_encoder_2) together: keep both in one folder and pass either file or the folder"


def _sibling(p: Path, stem: str) -> Path | None:
    """``stem`` beside ``p`` with ``p``'s suffix, else with the other one diffusers writes (.safetensors / .bin)."""
    for ext in dict.fromkeys((p.suffix, ".safetensors", ".bin")):
        q = p.with_name(stem + ext)
        if q.is_file():
            return q
    return None


def embedding_files(path: str | os.PathLike[str]) -> tuple[Path, Path | None]:
    """The file(s) an embedding path stands for: ``(file, None)``, or for diffusers' SDXL textual inversion
    ``(learned_embeds, learned_embeds_2)`` from either file or the folder holding them. Reads no tensors;
    ``WeightsError`` when one half of the pair is missing, or a folder holds no such file."""
    p = Path(path)
    if p.is_dir():
        first = _sibling(p / "learned_embeds.safetensors", "learned_embeds")
        second = _sibling(p / "learned_embeds_2.safetensors", "learned_embeds_2")
        if first is None and second is None:
            raise WeightsError(f"the folder {p.name} holds no learned_embeds.safetensors (diffusers' textual-inversion "
                               "output)", where=str(p), fix="pass the embedding file itself, or a folder of A1111 "
                               "embeddings with --embedding-dir (embedding_dir= in the server)")
        p = first or second  # type: ignore[assignment]
    m = _DIFFUSERS_TI.match(p.name)
    if not m:
        return p, None
    steps = m["steps"] or ""
    if m["two"]:
        first = _sibling(p, "learned_embeds" + steps)
        if first is None:
            raise WeightsError(f"{p.name} is the text_encoder_2 (CLIP-G) half of diffusers' SDXL textual inversion, and "
                               f"its text_encoder (CLIP-L) half learned_embeds{steps}{p.suffix} is not beside it",
                               where=str(p.parent), fix=_PAIR_FIX)
        return first, p
    return p, _sibling(p, "learned_embeds_2" + steps)


def missing_half(emb: Embedding) -> str | None:
    """For an SDXL model given diffusers' ``learned_embeds`` alone: which file is missing beside it, else None."""
    m = _DIFFUSERS_TI.match(Path(emb.source).name)
    if m is None or m["two"] or "clip_g" in emb.vectors:
        return None
    return f"learned_embeds_2{m['steps'] or ''}{Path(emb.source).suffix}"


def _diffusers_pair(first: Path, second: Path, name: str | None) -> Embedding:
    """diffusers' SDXL textual inversion: ``{token: vectors}`` in each file, CLIP-L's and CLIP-G's."""
    tokens, vectors = [], {}
    for key, f in (("clip_l", first), ("clip_g", second)):
        w = Weights.open(f)
        keys = list(w)
        if len(keys) != 1:
            raise WeightsError(f"{f.name} holds {len(keys)} tensors ({', '.join(keys[:4])}), diffusers' "
                               "textual-inversion file holds one, named after its placeholder token", where=str(f),
                               fix="pass the learned_embeds files textual_inversion_sdxl.py saved")
        tokens.append(keys[0])
        vectors[key] = np.asarray(w[keys[0]])
    if tokens[0] != tokens[1]:
        raise WeightsError(f"{first.name} holds the token {tokens[0]!r} and {second.name} {tokens[1]!r}: they are not "
                           "one training run's pair", where=str(first.parent), fix=_PAIR_FIX)
    return Embedding(name or tokens[0], _checked(vectors, first), str(first))


def load_embedding(path: str | os.PathLike[str], name: str | None = None) -> Embedding:
    """Read an embedding file. The trigger word is ``name`` or, as in A1111, the file's stem (for diffusers' SDXL
    pair, given as either file or their folder: the placeholder token the files hold)."""
    p, second = embedding_files(path)
    if second is not None:
        return _diffusers_pair(p, second, name)
    w = Weights.open(p)
    keys = list(w)
    if not ({"clip_l", "clip_g", "emb_params"} & set(keys) or len(keys) == 1
            or any(k.startswith("string_to_param.") for k in keys)):
        # headers only: a 6 GB checkpoint given as an embedding is not read into memory to be refused
        from .families import NOT_CHECKPOINTS, detect, identify, with_use

        shapes = w.shapes()
        plain = detect(shapes)
        what = with_use(plain, "an embedding") if plain in NOT_CHECKPOINTS else identify(shapes).label
        raise WeightsError(
            f"not a textual-inversion embedding: it looks like {what} (keys {', '.join(keys[:4])}"
            f"{', ...' if len(keys) > 4 else ''})", where=str(p),
            fix="pass an A1111 embedding (.safetensors with emb_params, or clip_l/clip_g for SDXL)")
    arrays = {k: np.asarray(w[k]) for k in keys if k in ("clip_l", "clip_g", "emb_params")
              or k.startswith("string_to_param.") or len(keys) == 1}
    vectors: dict[str, np.ndarray] = {}
    if "clip_l" in arrays or "clip_g" in arrays:
        vectors = {k: arrays[k] for k in ("clip_l", "clip_g") if k in arrays}
    elif "emb_params" in arrays:
        vectors = {"clip_l": arrays["emb_params"]}
    elif params := [k for k in arrays if k.startswith("string_to_param.")]:
        # A1111's .pt layout (or a .safetensors flattened from one); its one term is "*", or the placeholder a
        # textual-inversion trainer was given (rinongal's placeholder_strings): A1111 takes the one term, whatever it is
        if len(params) > 1:
            raise WeightsError(f"the embedding holds {len(params)} terms ({', '.join(params[:4])}), A1111's format "
                               "holds one", where=str(p), fix="split it into one file per term")
        vectors = {"clip_l": arrays[params[0]]}
    elif len(arrays) == 1:
        vectors = {"clip_l": next(iter(arrays.values()))}
    else:
        raise WeightsError(
            f"not a textual-inversion embedding: keys {', '.join(list(arrays)[:6])}", where=str(p),
            fix="pass an A1111 embedding (.safetensors with emb_params, or clip_l/clip_g for SDXL)")
    return Embedding(name or p.stem, _checked(vectors, p), str(p))


def _checked(vectors: Mapping[str, np.ndarray], p: Path) -> dict[str, np.ndarray]:
    """Each encoder's vectors as float32 [tokens, width], finite, one token count for all."""
    out: dict[str, np.ndarray] = {}
    for k, v in vectors.items():
        v = v.reshape(1, -1) if v.ndim == 1 else v
        if v.ndim != 2 or v.shape[0] < 1 or v.shape[1] < 1:
            raise WeightsError(f"embedding {k} has shape {list(v.shape)}, expected [tokens, width]", where=str(p),
                               fix="re-export the embedding")
        if not (v.dtype.kind == "f" or v.dtype.name == "bfloat16"):
            raise WeightsError(f"embedding {k} has dtype {v.dtype}, expected a float type", where=str(p),
                               fix="re-export the embedding")
        v32 = v.astype(np.float32)
        if not np.isfinite(v32).all():
            raise WeightsError(f"embedding {k} holds NaN or Inf values", where=str(p), fix="re-export the embedding")
        out[k] = v32
    counts = {v.shape[0] for v in out.values()}
    if len(counts) != 1:
        raise WeightsError(f"clip_l and clip_g hold different token counts {sorted(counts)}", where=str(p),
                           fix="re-export the embedding")
    return out


def token_table(graph: Graph) -> tuple[str, tuple[int, int], str]:
    """``(initializer name, [vocab, width], dtype)`` of a text encoder graph's token-embedding table."""
    slot = param_map(graph).get(TOKEN_TABLE)
    if slot is None or len(slot.shape) != 2:
        raise WeightsError("the text encoder has no token-embedding table (embeddings.token_embedding.weight)",
                           where=graph.name, fix="use a CLIP text encoder exported from transformers")
    return slot.init, (slot.shape[0], slot.shape[1]), slot.dtype


def reserve_rows(graph: Graph, rows: int) -> Graph:
    """A copy of ``graph`` whose token table has ``rows`` more (zero) rows, for embeddings to fill
    through ``update_weights``. The Gather output does not depend on the table's length, so
    nothing else in the graph changes. A weight-free graph (sdrt's shipped graphs, whose weights come
    from a single file) gets a table of zeros: the caller binds the whole table."""
    import onnx.numpy_helper as nh

    from ..errors import ModelError
    from ..graph.shapes import copy_model
    from .onnxmap import _np_dtype

    init, (vocab, width), dtype = token_table(graph)
    if rows <= 0:
        return graph
    model = copy_model(graph.model, initializers=False)
    try:
        arrays = graph.initializer_arrays([init])
    except ModelError:
        if not graph.is_stripped:
            raise
        arrays = {init: np.zeros((vocab, width), _np_dtype(dtype))}
    for t in graph.model.graph.initializer:
        if t.name == init:
            base = arrays[init]
            table = np.concatenate([base, np.zeros((rows, width), base.dtype)])
            model.graph.initializer.append(nh.from_array(table, init))
        else:
            model.graph.initializer.append(t)
    for vi in list(model.graph.input):
        if vi.name == init:  # old exports list initializers as inputs too
            vi.type.tensor_type.shape.dim[0].dim_value = vocab + rows
    return graph.derive(model)


def extend_table(base: np.ndarray, embeddings: Sequence[Embedding], key: str, capacity: int | None = None,
                 vocab: int | None = None) -> tuple[np.ndarray, dict[str, list[int]]]:
    """The token table with each embedding's ``key`` vectors appended after the first ``vocab`` rows
    (default: all of ``base``), padded with zeros to ``capacity`` rows; and ``{name: token ids}``."""
    vocab = base.shape[0] if vocab is None else vocab
    width = base.shape[1]
    rows: list[np.ndarray] = []
    ids: dict[str, list[int]] = {}
    nxt = vocab
    for emb in embeddings:
        v = emb.for_encoder(key)
        if v is None:
            raise WeightsError(f"embedding {emb.name!r} has no {key} vectors (it has {', '.join(emb.vectors)})",
                               where=emb.source, fix="use an embedding made for this model family")
        if v.shape[1] != width:
            raise WeightsError(
                f"embedding {emb.name!r} is {v.shape[1]} wide, the text encoder's tokens are {width} wide",
                where=emb.source, fix="use an embedding made for this model family (SD 1.x: 768, SD 2.x: 1024, "
                "SDXL: clip_l 768 + clip_g 1280)")
        rows.append(v)
        ids[emb.name] = list(range(nxt, nxt + v.shape[0]))
        nxt += v.shape[0]
    total = capacity if capacity is not None else nxt
    if nxt > total:
        raise WeightsError(f"{nxt - vocab} embedding tokens do not fit the {total - vocab} reserved rows",
                           where="text encoder token table", fix="reserve more rows (load the pipeline with "
                           "more embedding capacity), or use fewer embeddings")
    table = np.zeros((total, width), base.dtype)
    table[:vocab] = base[:vocab]
    if rows:
        table[vocab:nxt] = np.concatenate(rows).astype(base.dtype)
    return table, ids
