"""Hand the resident pages of file-mapped weights back once a backend has its own copy.

Weights reach a backend as read-only ``np.memmap`` views of their file (``model.onnx_data``, a
``.safetensors``): nothing is copied, but every page the backend reads while it compiles stays in the
process's resident set for as long as the mapping lives, next to the backend's own packed copy. The
session keeps the arrays (``update_weights`` compares against them, a swap rebinds them), so the mapping
lives as long as the session: the model counts twice in the RSS. ``release(arrays)`` tells the kernel
(``madvise(MADV_DONTNEED)``) that this process no longer needs those pages: they leave its RSS at once, stay
in the page cache, and come back on the next read of the array with no disk I/O. Arrays that are not
file-mapped (decoded, converted, in memory) are left alone.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("sdrt.weights.pages")


def _mapping(arr: Any) -> mmap.mmap | None:
    """The ``mmap`` under ``arr`` (through views and ``np.memmap``), or None."""
    seen = 0
    while arr is not None and seen < 16:
        m = getattr(arr, "_mmap", None)
        if isinstance(m, mmap.mmap):
            return m
        if isinstance(arr, mmap.mmap):
            return arr
        arr = getattr(arr, "base", None)
        seen += 1
    return None


def release(arrays: Iterable[Any]) -> int:
    """Drop this process's resident pages of the file mappings under ``arrays``; return the bytes advised.

    The arrays stay valid: a later read maps the pages again from the page cache."""
    done: set[int] = set()
    total = 0
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:  # not on this OS (Windows): the pages stay until the mapping closes
        return 0
    for arr in arrays:
        m = _mapping(arr)
        if m is None or id(m) in done or m.closed:
            continue
        done.add(id(m))
        try:
            m.madvise(advice)
        except (OSError, ValueError) as exc:  # a mapping the kernel refuses to advise: leave it
            log.debug("madvise refused: %s", exc)
            continue
        total += len(m)
    if total:
        log.debug("released %.1f MiB of mapped weights from the resident set", total / 2**20)
    return total


__all__ = ["release"]


def release_weights(weights: Any) -> int:
    """``release`` for the file mappings a ``Weights`` keeps open itself: a GGUF file is mapped once for all its
    tensors (``sdrt.weights.gguf``), and that mapping lives as long as the ``Weights`` does, so a part released
    after use (``sdrt.pipelines.lowmem``) would otherwise keep every page it read resident. Its block tensors'
    views reach the mapping without reading anything. Per-tensor mappings (``.safetensors``, ``.onnx_data``) go
    with their arrays and need nothing here. Returns the bytes advised."""
    arrays = []
    seen: set[str] = set()
    for name in weights:
        ref = weights.ref(name)
        if ref.blocks is not None and ref.source not in seen:  # one view reaches its file's whole mapping
            seen.add(ref.source)
            arrays.append(ref.blocks().data)
    return release(arrays)
