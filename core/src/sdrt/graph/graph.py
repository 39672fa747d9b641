"""``Graph``: an ONNX model loaded safely, described, and transformed.

onnx is imported lazily so that ``import sdrt`` stays light. Loading rules
(external data inside the model folder, clear errors) live in ``onnxfile``;
shape inference and constant folding in ``shapes`` and ``fold``; weight
stripping in ``strip``.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelError, ModelNotFoundError
from ..tensors import NON_TENSOR, Dim, TensorInfo
from . import onnxfile
from .fold import fold_constants, folded_record
from .protos import copy_model
from .shapes import pin_shapes
from .strip import STRIPPED_KEY, StripResult, save_graph, strip

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import onnx

log = logging.getLogger("sdrt.graph")

#: with ``load_external=None``, external data up to this total is read into ``graph.model``; above it
#: (protobuf cannot serialize a model above 2 GiB anyway) it stays mapped from disk
MAX_INLINE_BYTES = 2**31 - 2**20


def _tensor_info(value_info: Any) -> TensorInfo:
    if not value_info.type.HasField("tensor_type"):  # a sequence, map or optional value
        return TensorInfo(value_info.name, NON_TENSOR, ())
    ttype = value_info.type.tensor_type
    dtype = onnxfile.dtype_name(ttype.elem_type) if ttype.elem_type else "undefined"
    shape: list[Dim] = []
    if ttype.HasField("shape"):
        for d in ttype.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                shape.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                shape.append(d.dim_param)
            else:  # no size, or a negative one (-1: "any", as some exporters write it and onnxruntime reads it)
                shape.append(None)
    return TensorInfo(value_info.name, dtype, tuple(shape))


def _special(path: Path) -> str | None:
    """What ``path`` is when it is neither a regular file nor a folder (a device, FIFO or socket), in words."""
    import stat

    mode = path.stat().st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a regular file")


class Graph:
    """An ONNX graph. Build one with ``Graph.load(path_or_bytes)``.

    ``model`` is the ``onnx.ModelProto``. For a normal model every initializer
    holds its data inline once loaded (external data is read in, after its
    location is checked). A graph written by ``sdrt strip`` keeps its
    initializers as references to its ``.safetensors`` file; its weights come
    from ``Weights`` at compile time (``initializer_arrays`` maps them lazily).
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        path: Path | None = None,
        *,
        base_dir: Path | None = None,
        external: Mapping[str, onnxfile.ExternalRef | None] | None = None,
        read_from: Iterable[Path] = (),
        label: str | None = None,
    ) -> None:
        self.model = model
        self.path = path
        self.base_dir = base_dir if base_dir is not None else (path.parent if path else None)
        #: initializer name -> checked external location (None: the file is absent) for lazy initializers
        self._external: dict[str, onnxfile.ExternalRef | None] = dict(external or {})
        #: the external data files ``load`` found, whether their bytes were read in or stay mapped
        self.read_from: tuple[Path, ...] = tuple(read_from)
        #: ``with_shapes``'s graphs: the digest of the pinned structure (``shapes.pin_shapes``); whatever is read
        #: from the pinned shapes alone may be kept under it (``pinned_store.load_fact``)
        self.pinned_as: bytes | None = None
        #: what logs and the compile cache's listing call the graph (``label``); set by whoever knows better than
        #: the file name, as a pipeline does for its parts ("dreamshaper_8/unet")
        self._label: str | None = label or None

    # -- loading -------------------------------------------------------
    @classmethod
    def load(
        cls,
        source: str | os.PathLike[str] | bytes,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        load_external: bool | None = None,
    ) -> Graph:
        """Load from a file path or from the serialized bytes of a model.

        External data is checked (inside the model folder, present, long
        enough). ``load_external`` says whether to read it into ``model``:
        ``None`` (default) reads it for normal models below 2 GiB and leaves it
        as mapped references (``mapped_initializers``) for larger models and for
        graphs written by ``sdrt strip``. ``base_dir`` is the folder for
        external data when loading from bytes.
        """
        if isinstance(source, (bytes, bytearray, memoryview)):
            where = "<bytes>"
            model = onnxfile.parse_model(bytes(source), where)
            path = None
            own: dict[str, tuple[int, int]] = {}
            folder = Path(base_dir) if base_dir is not None else None
        else:
            path = Path(source)
            where = str(path)
            try:
                exists = path.exists()
            except OSError as exc:  # name too long, permission denied on a parent
                raise ModelError(f"cannot access the model path ({exc.strerror or exc})", where=where[:300],
                                 fix="check the path") from exc
            if not exists:
                raise ModelNotFoundError(
                    "the model file does not exist", where=where,
                    fix="check the path, or export the model to ONNX first",
                )
            special = _special(path)
            if special is not None:  # /dev/zero was read until memory ran out; a FIFO waited for a writer
                raise ModelError(f"the model path is {special}, not a file", where=where,
                                 fix="pass the .onnx file itself")
            from ..stamps import file_stamp

            version = file_stamp(path)  # the inline weights left in the file are mapped from this version only
            # large inline weights stay in the file and are mapped from it (never read into memory)
            data, own = onnxfile.read_model_file(path, map_inline=load_external is not True and base_dir is None)
            model = onnxfile.parse_model(data, where)
            del data
            folder = Path(base_dir) if base_dir is not None else path.parent
        stripped = any(p.key == STRIPPED_KEY for p in model.metadata_props)
        files: dict[str, Any] = {}  # each external-data file resolved and stat'ed once
        if own and version is not None:  # the inline weights left in the file: the model file itself, read already
            files[path.name] = (path, True, version, version[0])  # (a symlink to it leads nowhere else)
        refs = [(t, onnxfile.external_ref(t, folder, where, must_exist=load_external is True or not stripped,
                                          files=files))
                for t in model.graph.initializer if onnxfile.uses_external(t)]
        eager = load_external
        if eager is None:
            total = sum(r.length for t, r in refs if r is not None and t.name not in own)
            eager = not stripped and total < MAX_INLINE_BYTES
            if not eager and not stripped:
                log.info("%s: %.2f GiB of external data stays mapped (above protobuf's 2 GiB limit)",
                         where, total / 2**30)
        external: dict[str, onnxfile.ExternalRef | None] = {}
        for t, ref in refs:  # top-level initializers may stay mapped
            if eager and t.name not in own:
                assert ref is not None
                onnxfile.inline(t, onnxfile.read_external(ref, where))
            else:
                external[t.name] = ref
        if own:
            log.debug("%s: %d inline initializers left in the file, mapped", where, len(own))
        for t in onnxfile.iter_tensors(model.graph, top_initializers=False):  # anything else is read in
            if onnxfile.uses_external(t):
                ref = onnxfile.external_ref(t, folder, where)
                assert ref is not None
                onnxfile.inline(t, onnxfile.read_external(ref, where))
        if external:
            log.debug("%s: %d initializers left as external references", where, len(external))
        if own:  # the offsets of its inline weights are those of the version read, which the refs must be
            from ..stamps import check

            assert path is not None
            check(path, version, "while it was read")
            external = {k: (replace(r, stamp=version) if r is not None and k in own else r)
                        for k, r in external.items()}
        read_from = dict.fromkeys(r.path for _, r in refs if r is not None)
        return cls(model, path, base_dir=folder, external=external, read_from=read_from)

    def derive(self, model: onnx.ModelProto) -> Graph:
        """A new Graph for a transformed copy of ``model`` (same path and folder), keeping the
        lazy external references of the initializers that remain."""
        names = {t.name for t in model.graph.initializer}
        ext = {k: v for k, v in self._external.items() if k in names}
        return Graph(model, self.path, base_dir=self.base_dir, external=ext, read_from=self.read_from,
                     label=self._label)

    # -- description ---------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name if self.path else (self.model.graph.name or "<graph>")

    @property
    def label(self) -> str:
        """The graph as logs and ``sdrt cache list`` show it: what was set (a pipeline's ``model/part``), else the
        file with its folder (``unet/model.onnx``: Optimum and diffusers name every part's file alike)."""
        if self._label:
            return self._label
        parent = self.path.parent.name if self.path else ""
        return f"{parent}/{self.name}" if parent else self.name

    @label.setter
    def label(self, value: str | None) -> None:
        self._label = value or None

    @property
    def is_stripped(self) -> bool:
        """True for a graph written by ``sdrt strip`` (its weights live in a .safetensors file)."""
        return any(p.key == STRIPPED_KEY for p in self.model.metadata_props)

    @property
    def initializer_names(self) -> list[str]:
        return [t.name for t in self.model.graph.initializer]

    @property
    def inputs(self) -> list[TensorInfo]:
        """Graph inputs that the caller feeds (initializers excluded)."""
        inits = set(self.initializer_names)
        return [_tensor_info(v) for v in self.model.graph.input if v.name not in inits]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [_tensor_info(v) for v in self.model.graph.output]

    def value_infos(self) -> dict[str, TensorInfo]:
        """TensorInfo of every named value the graph declares: inputs, intermediates (after
        ``with_shapes``), outputs and initializers."""
        g = self.model.graph
        out: dict[str, TensorInfo] = {}
        for t in g.initializer:
            out[t.name] = TensorInfo(t.name, onnxfile.dtype_name(t.data_type), tuple(int(d) for d in t.dims))
        for v in list(g.input) + list(g.value_info) + list(g.output):
            out[v.name] = _tensor_info(v)
        return out

    def initializer_info(self) -> dict[str, TensorInfo]:
        """Name, dtype and shape of every initializer, without reading any data."""
        return {
            t.name: TensorInfo(t.name, onnxfile.dtype_name(t.data_type), tuple(int(d) for d in t.dims))
            for t in self.model.graph.initializer
        }

    def initializer_arrays(self, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """The graph's own initializers as numpy arrays (external ones mapped, not copied)."""
        wanted = set(names) if names is not None else None
        out: dict[str, np.ndarray] = {}
        for t in self.model.graph.initializer:
            if wanted is not None and t.name not in wanted:
                continue
            out[t.name] = self.tensor_array(t)
        if wanted is not None and (absent := wanted - set(out)):
            raise ModelError(f"no initializers named {sorted(absent)}", where=self.name,
                             fix="see graph.initializer_names")
        return out

    @property
    def mapped_initializers(self) -> list[str]:
        """Initializers left as external references (stripped graphs, ``load_external=False``):
        ``graph.model`` holds no bytes for them; ``initializer_arrays`` maps them from disk."""
        return list(self._external)

    def model_without(self, names: Iterable[str]) -> onnx.ModelProto:
        """A copy of ``model`` without the named initializers (and their graph-input entries), for
        backends that build from the proto and supply those tensors themselves."""
        drop = set(names)
        m = copy_model(self.model, initializers=False)
        m.graph.initializer.extend(t for t in self.model.graph.initializer if t.name not in drop)
        return m

    def has_data(self, name: str) -> bool:
        """Whether the graph itself can supply initializer ``name`` (a stripped graph whose
        weights file is absent cannot)."""
        return name in set(self.initializer_names) and (name not in self._external or self._external[name] is not None)

    @property
    def external_refs(self) -> Mapping[str, onnxfile.ExternalRef | None]:
        """``{initializer name: checked external location}`` of the initializers left mapped
        (``None``: a stripped graph whose weights file is absent)."""
        return self._external

    def folded_initializers(self) -> dict[str, list[str]]:
        """What ``fold_constants(fold_weights=True)`` did to the initializers:
        ``{"added": [...], "removed": [...]}`` (empty lists for an unfolded graph)."""
        return folded_record(self.model)

    def tensor_array(self, t: onnx.TensorProto) -> np.ndarray:
        """The data of initializer ``t`` of this graph: decoded, or mapped from its external file."""
        if t.name in self._external or onnxfile.uses_external(t):
            ref = self._external.get(t.name)
            if ref is None:
                ref = onnxfile.external_ref(t, self.base_dir, self.name)
            assert ref is not None
            dtype = onnxfile.np_dtype(t.data_type)
            return onnxfile.map_external(ref, dtype, tuple(int(d) for d in t.dims), self.name)
        return onnxfile.tensor_array(t, self.name)

    def op_types(self) -> Iterable[str]:
        return (n.op_type for n in self.model.graph.node)

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each op type, subgraphs included, most common first.
        Ops outside the default domain are named ``domain.OpType``."""
        counts: Counter[str] = Counter()

        def walk(g: Any) -> None:
            for n in g.node:
                counts[f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type] += 1
                for a in n.attribute:
                    if a.HasField("g"):
                        walk(a.g)
                    for sub in a.graphs:
                        walk(sub)

        walk(self.model.graph)
        return dict(counts.most_common())

    @property
    def opset(self) -> int:
        return next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))

    # -- transforms ----------------------------------------------------
    def with_shapes(self, shapes: Mapping[str, Sequence[int] | int] | None = None, /, **more: Sequence[int] | int
                    ) -> Graph:
        """Pin dynamic dims and infer the shape of every intermediate; returns a new Graph.

        Keys are input names (value: the full shape) or symbolic dim names
        (value: an int), e.g. ``g.with_shapes(sample=(2, 4, 64, 64))`` or
        ``g.with_shapes(batch=2)``. For input names that are not Python
        identifiers pass a dict: ``g.with_shapes({"input.1": (1, 77)})``.
        """
        model, key = pin_shapes(self, {**(shapes or {}), **more})
        pinned = self.derive(model)
        pinned.pinned_as = key
        return pinned

    def fold_constants(self, *, max_bytes: int = 1 << 20, fold_weights: bool = False) -> Graph:
        """Evaluate constant subgraphs and remove dead nodes; returns a new Graph.

        A node folds when all its inputs are constant (initializers, Constant
        nodes, or Shape/Size of a value whose shape is static). A folded value
        larger than ``max(max_bytes, 4 * its inputs' bytes)`` is left unfolded so
        folding never inflates the model.
        """
        return self.derive(fold_constants(self, max_bytes=max_bytes, fold_weights=fold_weights))

    def keep_outputs(self, names: Iterable[str]) -> Graph:
        """The graph with only the outputs ``names``, less the nodes and initializers only the others read; returns
        a new Graph. Unlike ``fold_constants`` it evaluates nothing, and a pinned graph's value types stay (cut a
        graph after ``with_shapes``, not before: no inference again)."""
        from .fold import keep_outputs

        names = tuple(names)
        have = {o.name for o in self.model.graph.output}
        missing = [n for n in names if n not in have]
        if missing:
            raise ModelError(f"the graph has no output {missing[0]!r}", where=self.name,
                             fix="outputs: " + ", ".join(o.name for o in self.model.graph.output))
        return self.derive(keep_outputs(self, names))

    def without_contrib_ops(self, keep: Iterable[str] = (), backend: str = "") -> Graph:
        """onnxruntime's contrib ops (``com.microsoft``: MultiHeadAttention, GroupNorm, NhwcConv...) rewritten
        into standard ONNX ops, except those in ``keep`` (``"com.microsoft.GroupNorm"``), with a log line naming
        what was rewritten for ``backend``; the graph itself when it has none (see ``sdrt.graph.contrib``)."""
        from .contrib import rewrite_graph

        return rewrite_graph(self, keep, backend)

    def strip(self, out_graph: str | os.PathLike[str], out_weights: str | os.PathLike[str] | None = None
              ) -> StripResult:
        """Write a weight-free copy of this graph plus a .safetensors with every initializer
        (see ``sdrt.graph.strip``); returns a ``StripResult`` with both paths and sizes."""
        return strip(self, out_graph, out_weights)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the graph as one .onnx file (models above 2 GB: use ``sdrt strip``)."""
        return save_graph(self, Path(path))

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"Graph({self.name}: ({ins}) -> ({outs}))"

