"""What a pipeline learns by pinning a part's graph to a call's shapes, kept across processes
(``<cache root>/shapes``): the outputs' shapes (the dry run, ``Part._dry_run``) and the activations' peak (the
memory plan, ``MemoryMixin._activations``).

Each pins the part's whole graph (``Graph.with_shapes``: shape inference and constant folding, 0.6-0.8 s for SD
1.5's UNet, twice); with a warm compile cache that was about a quarter of what a new process spent before its first
step beyond a warm image (SD 1.5, 512 px, OpenVINO).
Both depend only on the graph file and the shapes, so they are stored here under a key of the file (resolved path
and its size, modification and change times, inode and device), the part's graph edit, the input dims, what is
stored, ``FORMAT`` and onnx's version. A file written anew gets a new key. Anything unreadable or unwritable here is ignored:
the graph is then pinned as before.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .paths import cache_dir, make_key, write_atomic

log = logging.getLogger("sdrt.cache.shapes")

#: bump when what is stored changes meaning (or how sdrt infers it: with onnx's version, part of the key)
FORMAT = "1"

#: name -> (shape, dtype); a dim the graph leaves symbolic is its name
Outputs = dict[str, tuple[tuple[int | str, ...], str]]


def key_for(path: Path, edit_key: Any, dims: Mapping[str, tuple[int, ...]], what: str = "outputs") -> str | None:
    """The key of ``what`` (``"outputs"``, ``"activations"``) of ``path``'s graph at ``dims`` under the edit
    ``edit_key``; None when the file cannot be read."""
    import onnx

    try:  # ctime too: a program can set mtime back after writing in place, not ctime (design-notes.md)
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    return make_key(["sdrt pinned-graph facts", what, FORMAT, onnx.__version__, os.path.realpath(path), repr(stamp),
                     repr(edit_key), repr(sorted((k, tuple(int(d) for d in v)) for k, v in dims.items()))])


def _file(key: str) -> Path:
    return cache_dir("shapes") / f"{key}.json"


def _load(key: str) -> Any:
    try:
        data = json.loads(_file(key).read_text())
        return data["value"] if data.get("format") == FORMAT else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _store(key: str, value: Any) -> None:
    try:
        write_atomic(_file(key), [json.dumps({"format": FORMAT, "value": value}).encode()])
    except OSError as exc:  # a cache that cannot be written is passed over
        log.debug("pinned-graph facts not kept (%s)", exc)


def load_outputs(key: str) -> Outputs | None:
    """The stored outputs, or None (not stored, or not readable as this format)."""
    try:
        return {str(name): (tuple(d if isinstance(d, str) else int(d) for d in shape), str(dtype))
                for name, (shape, dtype) in _load(key).items()}
    except (ValueError, TypeError, AttributeError):
        return None


def store_outputs(key: str, outputs: Outputs) -> None:
    _store(key, {n: [list(s), d] for n, (s, d) in outputs.items()})


def load_peak(key: str) -> int | None:
    """A stored activation peak (bytes), or None."""
    value = _load(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def store_peak(key: str, peak: int) -> None:
    _store(key, int(peak))


def key_of_part(part: Any, dims: Mapping[str, tuple[int, ...]], what: str) -> str | None:
    """``key_for`` a pipeline part's graph, or None where its graph is not the file's as ``Part.graph`` loads it (a
    graph set otherwise, or an edit without a name)."""
    if part._graph is not None and part._graph is not part._loaded_graph:
        return None
    if part.graph_edit is not None and part.graph_edit_key is None:
        return None
    return key_for(part.path, part.graph_edit_key if part.graph_edit is not None else None, dims, what)
