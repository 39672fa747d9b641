"""Weight-stripped graphs (``sdrt strip``) and saving graphs.

A stripped graph is a standard ONNX file whose every initializer is an
external-data reference into a ``.safetensors`` file next to it: the
safetensors data section is raw little-endian bytes, exactly the layout
ONNX external data uses, so each reference is just (file, offset, length).
The graph holds no weight bytes, the safetensors file holds every initializer
under its ONNX name, and the pair still loads in any ONNX runtime. The graph
is marked in its metadata (``sdrt.stripped_weights``) so that sdrt maps the
weights lazily and lets ``weights=`` replace them.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelError
from ..weights import stfile
from . import onnxfile
from .protos import copy_model

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Graph

log = logging.getLogger("sdrt.graph.strip")

#: metadata key that marks a graph written by ``sdrt strip``; its value names the weights file
STRIPPED_KEY = "sdrt.stripped_weights"


@dataclass(frozen=True)
class StripResult:
    graph_path: Path
    weights_path: Path
    graph_bytes: int
    weights_bytes: int
    tensors: int


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file: the same resolved path, or (both existing) the same inode."""
    if Path(a).resolve() == Path(b).resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def input_files(graph: Graph) -> list[Path]:
    """Every file ``graph`` reads: its .onnx and the files its external data (or stripped weights) live in."""
    files = [graph.path] if graph.path is not None else []
    mapped = {r.path for r in graph.external_refs.values() if r is not None}
    return list(dict.fromkeys([*files, *graph.read_from, *sorted(mapped)]))


def check_outputs(outputs: Mapping[str, str | os.PathLike[str]], inputs: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse outputs that would destroy an input or each other: ``outputs`` maps how the caller names each
    output (``"-o"``, ``"--weights"``) to its path, ``inputs`` are the files the input is read from
    (``input_files``). Raises ``ModelError`` before anything is written."""
    from ..cache.paths import replace_mode

    named = list(outputs.items())
    for flag, path in named:  # what write_atomic would refuse after the work: a device, a folder, a read-only file
        try:
            replace_mode(path)
            folder = Path(path).parent
            if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, f"its folder {folder} is not writable")
        except OSError as exc:
            raise ModelError(f"{flag} {path}: {exc.strerror}", where=str(path),
                             fix=f"pass another {flag} path (a new file, or a writable regular file)") from None
    for i, (flag, path) in enumerate(named):
        for other, other_path in named[i + 1:]:
            if same_file(path, other_path):
                raise ModelError(f"{flag} and {other} name one file, so one output would overwrite the other",
                                 where=str(path), fix=f"give {flag} and {other} different paths")
        for src in inputs:
            if same_file(path, src):
                raise ModelError(f"{flag} {path} is a file the input model is read from ({src}); writing it "
                                 "would destroy the model", where=str(path), fix=f"pass another {flag} path")


def strip(graph: Graph, out_graph: str | os.PathLike[str], out_weights: str | os.PathLike[str] | None = None
          ) -> StripResult:
    """Write ``graph`` as a weight-free .onnx plus a .safetensors holding every initializer."""
    from onnx import TensorProto

    out_graph = Path(out_graph)
    out_weights = Path(out_weights) if out_weights is not None else out_graph.with_suffix(".safetensors")
    folder = out_graph.resolve().parent
    target = out_weights.resolve()
    if folder not in target.parents:
        raise ModelError("the weights file must sit in the stripped graph's folder (or below it)",
                         where=f"{out_graph} + {out_weights}",
                         fix="write both into the same folder; ONNX external data must stay inside the model folder")
    location = target.relative_to(folder).as_posix()
    check_outputs({"out_graph": out_graph, "out_weights": out_weights}, input_files(graph))
    for d in (out_graph.parent, out_weights.parent):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModelError(f"cannot create the output folder ({exc.strerror or exc})", where=str(d),
                             fix="check the path and permissions") from exc
    items = []
    kept_inline = []
    for t in graph.model.graph.initializer:
        if onnxfile.nbytes_of(t.data_type, t.dims) is None or not _safetensors_holds(t.data_type):
            kept_inline.append(t.name)  # strings, and 4-bit types (sdrt quantize --to int4) safetensors has no code for
            continue
        ref = graph.external_refs.get(t.name)
        if ref is not None:  # mapped external data: copied file to file, never through memory
            items.append((t.name, stfile.FileSlice(ref.path, ref.offset, ref.length, onnxfile.np_dtype(t.data_type),
                                                   tuple(int(d) for d in t.dims))))
        else:
            items.append((t.name, graph.tensor_array(t)))
    if kept_inline:
        log.warning("kept %d initializers inline (strings or 4-bit types, which safetensors cannot hold): %s",
                    len(kept_inline), ", ".join(kept_inline[:8]) + (", ..." if len(kept_inline) > 8 else ""))
    offsets = stfile.write(out_weights, items, {"sdrt.source": graph.name, "format": "sdrt-stripped"})
    model = copy_model(graph.model, initializers=False)
    for t in graph.model.graph.initializer:
        new = model.graph.initializer.add()
        if t.name not in offsets:
            new.CopyFrom(t)
            continue
        new.name, new.data_type, new.doc_string = t.name, t.data_type, t.doc_string
        new.dims.extend(t.dims)
        off, length = offsets[t.name]
        for key, value in (("location", location), ("offset", str(off)), ("length", str(length))):
            entry = new.external_data.add()
            entry.key, entry.value = key, value
        new.data_location = TensorProto.EXTERNAL
    props = [p for p in model.metadata_props if p.key != STRIPPED_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    mark = model.metadata_props.add()
    mark.key, mark.value = STRIPPED_KEY, location
    write_atomic(out_graph, model.SerializeToString())
    result = StripResult(out_graph, out_weights, out_graph.stat().st_size, out_weights.stat().st_size, len(offsets))
    log.info("stripped %s: graph %d bytes, weights %d bytes (%d tensors)", graph.name, result.graph_bytes,
             result.weights_bytes, result.tensors)
    return result


def _safetensors_holds(data_type: int) -> bool:
    """Whether a .safetensors file has a dtype code for this ONNX element type."""
    from ..errors import WeightsError

    try:
        stfile.st_code(onnxfile.np_dtype(data_type))
    except (WeightsError, KeyError, TypeError, ValueError):
        return False
    return True


def save_graph(graph: Graph, path: Path) -> Path:
    """Write ``graph.model`` to one file. Lazy external references must stay valid, so a graph
    that has them is saved only into the folder its weights are in."""
    elsewhere = [r for r in graph.external_refs.values() if r is None or r.path != graph.path]
    if elsewhere and graph.base_dir is not None and path.resolve().parent != graph.base_dir.resolve():
        raise ModelError("this graph refers to external weights by relative path; saving it elsewhere breaks them",
                         where=str(path), fix=f"save it into {graph.base_dir}, or strip it again with `sdrt strip`")
    model = graph.model
    own = {n for n, r in graph.external_refs.items() if r is not None and graph.path is not None and r.path == graph.path}
    if own:  # initializers mapped from inside the .onnx file itself (Graph.load): written inline, as they came
        model = copy_model(graph.model, initializers=False)
        for t in graph.model.graph.initializer:
            new = model.graph.initializer.add()
            new.CopyFrom(t)
            if t.name in own:
                onnxfile.inline(new, np.ascontiguousarray(graph.tensor_array(t)).tobytes())
    try:
        data = model.SerializeToString()
    except ValueError as exc:  # protobuf refuses messages above 2 GB
        raise ModelError(f"the graph is too large for one ONNX file ({exc})", where=str(path),
                         fix="use `sdrt strip` (or graph.strip) to move the weights into a .safetensors file") from exc
    write_atomic(path, data)
    return path


def write_atomic(path: Path, data: bytes, what: str = "write the graph",
                 fix: str = "check free disk space and permissions") -> None:
    """``data`` to ``path`` through a temporary file and a rename (``sdrt.cache.write_atomic``): a reader never
    sees half a file; a failure is one ``ModelError`` saying what could not be written."""
    from ..cache.paths import write_atomic as write_chunks

    try:
        write_chunks(path, [data])
    except OSError as exc:
        raise ModelError(f"cannot {what} ({exc.strerror or exc})", where=str(path), fix=fix) from exc
