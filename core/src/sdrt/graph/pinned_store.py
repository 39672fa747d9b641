"""What pinning a graph inferred, kept across processes (``<cache root>/pinned``): ``shapes.pin_shapes``'s memo on disk.

``pin_shapes`` keys what it inferred (every intermediate's type, the outputs' types) by a digest of everything
inference and folding read (``shapes._memo_key``: the graph's structure with the pinned inputs, not its weights), and
keeps it in the process. A new process pinning the same structure (a pipeline's parts, for its plan, its dry run and
its compile: 0.8 s for SD 1.5's UNet) finds it here instead; the file's name adds ``FORMAT`` and the version of
onnx, whose shape inference made it. An entry is small (0.4 MB for that UNet); the folder keeps the newest ``KEEP`` of them.
Beside the entries, facts read from a pinned graph's shapes alone are kept under the same digest (``store_fact``:
the memory plan's activation peak, 0.1 s on that UNet). Anything unreadable or unwritable here is passed over: the
graph is then inferred, or the fact worked out, as before.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

log = logging.getLogger("sdrt.graph.pinned_store")

_MAGIC = b"SDRTPIN1"
#: entries kept: the oldest beyond these go when one is stored (a few sizes of a few models fit many times over)
KEEP = 256
Found = tuple[list[bytes], list[bytes]]


#: bump when what ``shapes.pin_shapes`` infers changes (with onnx's version, part of each entry's name)
FORMAT = "1"


def _file(key: bytes, fact: str = "") -> Path:
    import onnx

    from ..cache.paths import cache_dir, make_key

    if not fact:
        return cache_dir("pinned") / f"{make_key([key, FORMAT, onnx.__version__])}.bin"
    return cache_dir("pinned") / f"{make_key([key, FORMAT, onnx.__version__, fact])}.fact"


def load(key: bytes) -> Found | None:
    """The stored (value infos, output types) of this pinned structure, or None."""
    try:
        data = _file(key).read_bytes()
        if not data.startswith(_MAGIC):
            return None
        pos, lists = len(_MAGIC), []
        for _ in range(2):
            (count,) = struct.unpack_from("<I", data, pos)
            pos += 4
            items = []
            for _ in range(count):
                (n,) = struct.unpack_from("<I", data, pos)
                pos += 4
                if pos + n > len(data):
                    return None
                items.append(data[pos:pos + n])
                pos += n
            lists.append(items)
        return (lists[0], lists[1]) if pos == len(data) else None
    except (OSError, struct.error):
        return None


def store(key: bytes, found: Found) -> None:
    """Keep ``found`` for later processes (passed over where the cache cannot be written)."""
    chunks = [_MAGIC]
    for items in found:
        chunks.append(struct.pack("<I", len(items)))
        for raw in items:
            chunks += [struct.pack("<I", len(raw)), raw]
    _write(_file(key), chunks)


def load_fact(key: bytes | None, fact: str) -> int | None:
    """A whole number kept by ``store_fact`` for the graph pinned as ``key`` (``Graph.pinned_as``), or None."""
    if key is None:
        return None
    try:
        value = int(_file(key, fact).read_bytes().decode("ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return value if value >= 0 else None


def store_fact(key: bytes | None, fact: str, value: int) -> None:
    """Keep ``value``, read from the shapes of the graph pinned as ``key`` alone (the name ``fact`` says what it is and
    how it was worked out: bump its version when that changes)."""
    if key is not None:
        _write(_file(key, fact), [str(int(value)).encode("ascii")])


def _write(path: Path, chunks: list[bytes]) -> None:
    from ..cache.derived import STORES
    from ..cache.paths import write_atomic

    try:
        write_atomic(path, chunks)
        ours = [p for p in path.parent.glob(f"*{path.suffix}") if STORES["pinned"].fullmatch(p.name)]
        ours = [p for p in ours if not p.is_symlink()]  # only what sdrt wrote (cache.derived), never a link
        entries = sorted(ours, key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("%s not kept (%s)", path.name, exc)
