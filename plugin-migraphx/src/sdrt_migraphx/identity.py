"""The identity of a graph and its weights, for the compiled-program cache key.

A cache hit must not read gigabytes of weights, so a weight mapped from a file
(``np.memmap``, as sdrt maps safetensors and ONNX external data) is identified
by that file (real path, size, mtime, inode), the tensor's offset in it, its
dtype and shape, and a few sampled bytes. A weight held in memory (converted,
merged with a LoRA, or embedded in the .onnx file) is hashed in full.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np


def _mapped_file(arr: np.ndarray) -> tuple[str, int] | None:
    """(file, byte offset of ``arr`` in it) when ``arr`` views a file-backed ``np.memmap``."""
    base: Any = arr
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    if not isinstance(base, np.memmap) or not getattr(base, "filename", None):
        return None
    start = arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return str(base.filename), int(base.offset) + int(start)


def sample(arr: np.ndarray, chunk: int = 256, count: int = 16) -> bytes:
    """The first, last and ``count`` evenly spaced ``chunk``-byte pieces of an array's bytes."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    n = flat.size
    if n <= chunk * (count + 2):
        return flat.tobytes()
    starts = [0, n - chunk] + [int(i * (n - chunk) / count) for i in range(1, count)]
    return b"".join(flat[s:s + chunk].tobytes() for s in starts)


def weights_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over every initializer's name, dtype, shape and identity (see the module docstring)."""
    h = hashlib.sha256()
    stats: dict[str, str] = {}
    for name in sorted(arrays):
        arr = arrays[name]
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        mapped = _mapped_file(arr) if arr.flags.c_contiguous else None
        if mapped is not None:
            path, offset = mapped
            if path not in stats:
                try:
                    st = os.stat(path)
                    stats[path] = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
                except OSError:
                    stats[path] = ""
            if stats[path]:
                h.update(f"file|{stats[path]}|{offset}|".encode())
                h.update(sample(arr))
                continue
        data = np.ascontiguousarray(arr)
        h.update(struct.pack("<Q", data.nbytes))
        h.update(data.reshape(-1).view(np.uint8))
    return h.hexdigest()


def graph_digest(graph: Any) -> str:
    """SHA-256 of the graph without its top-level initializers (they are keyed by ``weights_digest``)."""
    return hashlib.sha256(graph.model_without(graph.initializer_names).SerializeToString()).hexdigest()
