"""What pinning a graph inferred, kept across processes (``<cache root>/pinned``): ``shapes.pin_shapes``'s memo on disk.

``pin_shapes`` keys what it inferred (every intermediate's type, the outputs' types) by a digest of everything
inference and folding read (``shapes._memo_key``: the graph's structure with the pinned inputs, not its weights), and
keeps it in the process. A new process pinning the same structure (a pipeline's parts, for its plan, its dry run and
its compile: 0.8 s for SD 1.5's UNet) finds it here instead; the file's name adds ``FORMAT`` and the version of
onnx, whose shape inference made it. An entry is small (0.4 MB for that UNet); the folder keeps the newest ``KEEP`` of them.
Anything unreadable or unwritable here is passed over: the graph is then inferred as before.
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


def _file(key: bytes) -> Path:
    import onnx

    from ..cache.paths import cache_dir, make_key

    return cache_dir("pinned") / f"{make_key([key, FORMAT, onnx.__version__])}.bin"


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
    from ..cache.paths import write_atomic

    chunks = [_MAGIC]
    for items in found:
        chunks.append(struct.pack("<I", len(items)))
        for raw in items:
            chunks += [struct.pack("<I", len(raw)), raw]
    try:
        path = write_atomic(_file(key), chunks)
        entries = sorted(path.parent.glob("*.bin"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("pinned shapes not kept (%s)", exc)
