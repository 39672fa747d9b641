"""The compile cache's entry for a ggml lowering: the weights' layouts it made, to be mapped by the next process.

What costs time when a large graph is lowered is not the graph (ggml builds it in a second) but the weights'
layouts: GEMM panels, padded conv rows, bf16 pairs (``native.pack_b``, ``aligned_pad``, ``half.py``), a fresh
array for each weight, 3.5 GB for the float32 SD 1.5 UNet. An entry holds those arrays in one file, in the order
lowering asked for them, with an index; a process that finds the entry lowers the graph again (same choices, same
rewrites, same ggml graph) but takes each layout from a copy-on-write map of the file instead of making it:
nothing transformed, no fresh memory (the file's pages are the page cache's), and ``update_weights`` still writes
into them (into private copies of the pages it touches; the file never changes).

Which layouts an entry holds (``Lowering.const``): every weight with a transform, and every initializer used as it
is, except those marked ``store=False``: Winograd's kernels, 16/9 the size of the 3x3 kernels they come from, which
would make the entry larger than the model; lowering remakes them from the model's file at each load. Nor a weight
lowering maps from the model's own file (its bytes as they are: ``sdrt.weights.pages.private_map``): a hit maps it
from there again (format 2; format 1 stored them, 1.3 GB of the float32 SD 1.5 UNet's 3.1 GB entry).

Layout of an entry: ``layouts.bin`` (each array's bytes at a ``HOST_ALIGN``-aligned offset) and ``layouts.json``
(``{"format", "arrays": [{"tag", "name", "src", "want", "dtype", "shape", "offset"}]}``: ``Request``'s fields, then
the stored array's). Replaying checks each request against the index in order; any difference makes the entry
unusable (``UnusableEntry``: the core discards it and compiles afresh).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdrt.errors import UnusableEntry

from .native import HOST_ALIGN

FORMAT = 2
DATA = "layouts.bin"
INDEX = "layouts.json"
#: a lowering whose stored layouts total less than this is not cached: making them takes well under a second, less
#: than an entry's write, sync and checksum (and the test suites' thousands of tiny graphs leave no entries)
MIN_BYTES = 32 << 20


@dataclass(frozen=True)
class Request:
    """What lowering asked a layout for: its tag, the initializer's name ("" for a derived array), the source's
    shape and dtype, and the dtype asked for ("" when lowering left it to the data's kind)."""

    tag: str
    name: str
    src: str
    want: str

    @staticmethod
    def of(arr: Any, tag: str, name: str | None, want: str | None) -> Request:
        return Request(tag, name or "", f"{tuple(int(d) for d in np.shape(arr))}:{getattr(arr, 'dtype', '?')}",
                       want or "")


def stored_bytes(items: list[tuple[Request, np.ndarray]]) -> int:
    return sum(int(a.nbytes) for _, a in items)


def write(folder: Path, items: list[tuple[Request, np.ndarray]]) -> int:
    """Write ``items`` (the lowering's requests and the arrays it made, in order) as an entry into ``folder``;
    returns the data file's size."""
    index = []
    offset = 0
    with open(folder / DATA, "wb") as f:
        for req, arr in items:
            pad = -offset % HOST_ALIGN
            if pad:
                f.write(bytes(pad))
                offset += pad
            a = np.ascontiguousarray(arr)
            f.write(memoryview(a.reshape(-1).view(np.uint8)))
            index.append({"tag": req.tag, "name": req.name, "src": req.src, "want": req.want,
                          "dtype": a.dtype.name, "shape": [int(d) for d in a.shape], "offset": offset})
            offset += a.nbytes
    (folder / INDEX).write_text(json.dumps({"format": FORMAT, "arrays": index}))
    return offset


class Replay:
    """An entry's layouts, handed out in the order they were stored (``take``), from a copy-on-write map."""

    def __init__(self, folder: Path) -> None:
        try:
            index = json.loads((folder / INDEX).read_text())
            if index.get("format") != FORMAT:
                raise UnusableEntry(f"its layouts index has format {index.get('format')!r}, this plugin writes "
                                    f"{FORMAT}")
            self._index = list(index["arrays"])
            size = (folder / DATA).stat().st_size
            self._map = np.memmap(folder / DATA, dtype=np.uint8, mode="c") if size else np.zeros(0, np.uint8)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UnusableEntry(f"its layouts cannot be read ({exc})") from exc
        self._next = 0

    def take(self, req: Request) -> np.ndarray:
        """The stored array for the next request, which must be the one stored next."""
        if self._next >= len(self._index):
            raise UnusableEntry(f"lowering asked for more layouts than the {len(self._index)} stored")
        try:
            rec = self._index[self._next]
            got = Request(str(rec["tag"]), str(rec["name"]), str(rec["src"]), str(rec["want"]))
            dtype = np.dtype(rec["dtype"])
            shape = tuple(int(d) for d in rec["shape"])
            start = int(rec["offset"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UnusableEntry(f"layout {self._next} has a bad index record ({exc})") from exc
        if got != req:
            raise UnusableEntry(f"layout {self._next} was stored for {got}, lowering asks for {req}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if start % HOST_ALIGN or start + nbytes > self._map.size:
            raise UnusableEntry(f"layout {self._next} lies outside its data file")
        self._next += 1
        return self._map[start:start + nbytes].view(dtype).reshape(shape)

    def finish(self) -> None:
        """Check that lowering took every stored layout."""
        if self._next != len(self._index):
            raise UnusableEntry(f"lowering took {self._next} of the {len(self._index)} stored layouts")


__all__ = ["DATA", "FORMAT", "INDEX", "MIN_BYTES", "Replay", "Request", "stored_bytes", "write"]
