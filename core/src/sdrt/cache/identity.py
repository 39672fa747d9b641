"""The identity of a graph and of its weights: what a compile cache key is made of.

It is computed from where each weight comes from, *before* any weight is
resolved or read, so that keying a 10 GB checkpoint reads no tensor data:

- a tensor in a file (a ``.safetensors`` tensor, an ONNX external-data tensor,
  a stripped graph's weights file) is identified by that file (real path, size,
  mtime, inode, device), the tensor's byte offset and length in it, its dtype
  and shape, and the dtype it is converted to on access;
- a tensor held in memory (``Weights.from_arrays``, a LoRA merge, an
  initializer stored inside the ``.onnx`` file) is hashed in full: there is
  nothing else that names its content.

A file rewritten in place gets a new mtime, so its tensors get a new identity.
The graph's identity is the SHA-256 of the graph without its initializers.

This module speaks to ``Graph`` and ``Weights`` only through their attributes.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph
    from ..weights import Weights


def graph_identity(graph: Graph) -> str:
    """SHA-256 of the graph without its top-level initializers (their identity is ``weights_identity``'s)."""
    return hashlib.sha256(graph.model_without(graph.initializer_names).SerializeToString()).hexdigest()


class _Files:
    """The identity of each weights file, one ``stat`` each."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def __call__(self, path: Any) -> str | None:
        key = os.fspath(path)
        if key not in self._seen:
            try:
                st = os.stat(key)
            except OSError:
                return None
            self._seen[key] = f"{os.path.realpath(key)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_dev}"
        return self._seen[key]


def _content(h: Any, arr: Any) -> None:
    import numpy as np

    a = np.ascontiguousarray(arr)
    h.update(f"mem|{a.nbytes}|".encode())
    h.update(a.reshape(-1).view(np.uint8).data)


def weights_identity(graph: Graph, weights: Weights | None = None) -> str:
    """SHA-256 over every initializer's name and identity, as ``resolve_weights`` would resolve it
    (``weights`` overriding the graph's own data), without resolving any. The same values held in
    memory have the same identity wherever they come from (the graph's own data or ``weights``)."""
    h = hashlib.sha256()
    files = _Files()
    external = graph.external_refs
    infos = graph.initializer_info()
    converted = None if weights is None or weights.dtype is None else weights.dtype.name
    for t in sorted(graph.model.graph.initializer, key=lambda t: t.name):
        given = weights is not None and t.name in weights
        if given:
            ref = weights.ref(t.name)  # type: ignore[union-attr]
            dtype, shape, origin = ref.dtype.name, tuple(ref.shape), getattr(ref, "origin", None)
            as_ = converted
        else:
            if t.name in external and external[t.name] is None:  # a stripped graph without its weights file:
                h.update(f"\n{t.name}|absent".encode())      # resolve_weights says so
                continue
            ext = external.get(t.name)
            dtype, shape, as_ = infos[t.name].dtype, tuple(infos[t.name].shape), None
            origin = (ext.path, ext.offset, ext.length) if ext is not None else None
        h.update(f"\n{t.name}|{dtype}|{shape}|as={as_}|".encode())
        ident = files(origin[0]) if origin is not None else None
        if ident is not None:  # origin: (path, offset, length[, how the array is derived from the bytes])
            h.update(f"file|{ident}|{'|'.join(str(o) for o in origin[1:])}".encode())
        else:  # in memory: weights' arrays, or data inside the .onnx file
            _content(h, weights[t.name] if given else graph.tensor_array(t))  # type: ignore[index]
    return h.hexdigest()


__all__ = ["graph_identity", "weights_identity"]
