"""Which version of a file a mapped tensor was read from, and the check that refuses another.

Every file sdrt maps weights from (``.safetensors``, PyTorch checkpoints, an ONNX model's external data or its
own inline weights, ``.gguf``) is read at offsets its header gave. A file replaced under its name (a rename) or
written again in place (``cp``, a download resumed into it) is another version: the old offsets on the new bytes
are wrong weights, and a mapping of a file that shrank raises SIGBUS (the process dies) on the first page past
its new end. So:

- ``file_stamp(path)`` is a version: size, mtime (ns), inode and device, taken when a header is read;
- ``check(path, stamp, when)`` raises ``FileChanged`` when the file is another version now; every reader
  calls it before it maps or reads a tensor;
- ``mark(array, path, stamp)`` records the version on the ``np.memmap`` under a mapped array, and
  ``mapped_files(arrays)`` gives ``{path: stamp}`` of the arrays' mappings: a session that keeps mapped arrays
  (a backend sharing them, ``update_weights`` comparing against them) checks those before it reads them again
  (``check_files``). A stat per file: microseconds.

The check cannot close the window between the stat and the read; a writer that replaces a file by a rename
(``safetensors``' and the hub's downloads do) never shrinks a live mapping, as the old inode lives on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FileChanged

Stamp = tuple[int, int, int, int]
#: attribute of an ``np.memmap`` holding ``(path, stamp)`` of the version it maps
_ATTR = "_sdrt_version"


def file_stamp(path: str | os.PathLike[str]) -> Stamp | None:
    """What tells one version of a file from another without reading it: size, mtime (ns), inode and device
    (a file replaced by a rename has another inode; one written over in place, another mtime). None: unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def fd_stamp(fd: int) -> Stamp:
    """``file_stamp`` of an open file: the version that file descriptor reads, whatever the name holds now."""
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def changed(path: str | os.PathLike[str], stamp: Stamp | None) -> str | None:
    """How ``path`` differs from version ``stamp`` in words, or None when it is that version."""
    now = file_stamp(path)
    if now == stamp:
        return None
    if now is None:
        return "is gone"
    if stamp is not None and now[0] != stamp[0]:
        return f"is {now[0]} bytes now, {stamp[0]} when opened"
    return "was replaced or written again"


def check(path: str | os.PathLike[str], stamp: Stamp | None, when: str = "since it was opened") -> None:
    """``FileChanged`` when ``path`` is not version ``stamp`` any more: nothing is read through the old header."""
    what = changed(path, stamp)
    if what is not None:
        p = Path(path)
        raise FileChanged(f"{p.name} changed on disk {when} ({what}): its tensors are not read, as the old "
                          "header with the new bytes would give wrong weights", where=str(p),
                          fix="open the file again once it is complete (load the model or file again; sdrt serve "
                          "does at its next job)")


def _mappings(arr: Any) -> Iterator[np.memmap]:
    """The ``np.memmap`` objects under ``arr``, nearest first (along ``.base``; at most 16 deep)."""
    for _ in range(16):
        if arr is None:
            return
        if isinstance(arr, np.memmap):
            yield arr
        arr = getattr(arr, "base", None)


def _memmap(arr: Any) -> np.memmap | None:
    return next(_mappings(arr), None)


def version_of(arr: Any) -> tuple[str, Stamp] | None:
    """The version marked on any mapping under ``arr`` (a slice of a marked ``np.memmap`` is a memmap too)."""
    return next((v for m in _mappings(arr) if (v := getattr(m, _ATTR, None)) is not None), None)


def mark(arr: Any, path: str | os.PathLike[str], stamp: Stamp | None) -> Any:
    """Record on the mapping under ``arr`` that it maps version ``stamp`` of ``path`` (kept if already set);
    returns ``arr``."""
    m = _memmap(arr)
    if m is not None and stamp is not None and version_of(m) is None:
        try:
            setattr(m, _ATTR, (str(path), stamp))
        except AttributeError:  # pragma: no cover - a memmap subclass with slots
            pass
    return arr


def mapped_files(arrays: Iterable[Any]) -> dict[str, Stamp]:
    """``{path: stamp}`` of the file versions the marked mappings under ``arrays`` read (``BlockMatrix`` too,
    through its ``data``)."""
    out: dict[str, Stamp] = {}
    seen: set[int] = set()
    for arr in arrays:
        m = _memmap(getattr(arr, "data", None) if not isinstance(arr, np.ndarray) else arr)
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        version = version_of(m)
        if version is not None:
            out.setdefault(version[0], version[1])
    return out


def check_files(files: Mapping[str, Stamp], when: str = "since its weights were bound") -> None:
    """``check`` for each of ``files`` (``mapped_files``): before a session reads its mapped weights again."""
    for path, stamp in files.items():
        check(path, stamp, when)


__all__ = ["Stamp", "changed", "check", "check_files", "fd_stamp", "file_stamp", "mapped_files", "mark", "version_of"]
