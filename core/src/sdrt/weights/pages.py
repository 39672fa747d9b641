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


def release(arrays: Iterable[Any], *, quiet: bool = False) -> int:
    """Drop this process's resident pages of the file mappings under ``arrays``; return the bytes advised.

    The arrays stay valid: a later read maps the pages again from the page cache. ``quiet``: no log line (a
    caller that releases weight by weight)."""
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
    if total and not quiet:
        log.debug("released %.1f MiB of mapped weights from the resident set", total / 2**20)
    return total


def mapped_region(arr: Any) -> tuple[Any, int] | None:
    """``(the np.memmap of a file under arr, arr's byte offset in that file)`` for a C-contiguous view of a file
    map (an external-data or ``.safetensors`` tensor), else None.

    The map is the one numpy made from the file: a slice of an ``np.memmap`` is a memmap too but keeps the first
    one's ``offset`` (a GGUF reader's tensors are slices of its one map of the file), so the walk goes on to the
    memmap that is not a view of another array."""
    import numpy as np

    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous or arr.nbytes == 0:
        return None
    base: Any = arr
    while base is not None and not (isinstance(base, np.memmap) and getattr(base, "filename", None)
                                    and not isinstance(base.base, np.ndarray)):
        base = getattr(base, "base", None)
    if base is None:
        return None
    return base, int(base.offset) + arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]


def private_map(arr: Any, align: int | None = None) -> Any:
    """A copy-on-write map of the file region under a read-only, file-mapped ``arr`` (same values, writable,
    nothing copied), or None when ``arr`` is writable, is not a contiguous view of an ``np.memmap`` of a file,
    or (``align``) does not start on an ``align``-byte boundary of the file.

    sdrt hands weights out as read-only maps of their file (nobody may write the file through them). A backend
    that keeps a weight as the file stores it takes this instead of a copy: nothing is read now (the pages come
    from the page cache when first read, and count once), and a write (OpenVINO's shared ``Constant``, ggml's
    ``update_weights``) copies the page it touches into this process only, never into the file. A file changed
    on disk since ``arr`` mapped it is refused (``FileChanged``): a map by its name would read the new file at
    the old offsets."""
    import numpy as np

    if not isinstance(arr, np.ndarray) or arr.flags.writeable:
        return None
    region = mapped_region(arr)
    if region is None:
        return None
    base, start = region
    if align and start % align:
        return None
    from ..stamps import check, mark, version_of

    version = version_of(base)
    if version is not None:  # mapped again by name: only while the name is still the version ``arr`` maps
        check(version[0], version[1], "since its weights were read")
    try:
        cow = np.memmap(base.filename, dtype=np.uint8, mode="c", offset=start, shape=(arr.nbytes,))
    except (OSError, ValueError) as exc:  # the file went away or cannot be mapped again: the caller copies
        log.debug("cannot map %s again: %s", base.filename, exc)
        return None
    out = cow.view(arr.dtype).reshape(arr.shape)
    return mark(out, *version) if version is not None else out


def unmapped_bytes(arrays: Iterable[Any]) -> int:
    """The bytes of ``arrays`` held in the process's own memory rather than on a file mapping (weights converted
    while binding, e.g. a float16 checkpoint on float32 graphs): what ``release`` cannot hand back."""
    return sum(int(getattr(a, "nbytes", 0)) for a in arrays if _mapping(a) is None)


def trim_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``; nothing elsewhere). Freed memory stays
    in glibc's arenas otherwise: a backend that converts its weights one at a time (ggml's bf16 copies) frees each
    weight's temporaries between the weights it keeps, and where they are under glibc's mmap threshold (which grows to
    32 MiB) the holes stay resident: 78 MiB after forty 16 MiB float32 matmul weights were made bf16, 2 MiB a weight."""
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim
            pass


__all__ = ["Prefetcher", "cached_fraction", "file_ranges", "mapped_region", "prefetch", "private_map", "release",
           "release_weights", "trim_heap", "unmapped_bytes"]


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


# ---------------------------------------------------------------------------- prefetch
def file_ranges(refs: Iterable[Any]) -> dict[str, list[tuple[int, int]]]:
    """``{file: [(offset, length), ...]}`` of the tensors whose bytes are in a file: ``TensorRef.origin`` or a
    graph's ``ExternalRef`` (anything with ``path``, ``offset`` and ``length``); the rest are skipped."""
    out: dict[str, list[tuple[int, int]]] = {}
    for r in refs:
        if r is None:
            continue
        origin = getattr(r, "origin", None)
        if origin is not None and len(origin) >= 3:
            path, off, length = origin[0], origin[1], origin[2]
        elif hasattr(r, "path") and hasattr(r, "offset") and hasattr(r, "length"):
            path, off, length = r.path, r.offset, r.length
        else:
            continue
        try:
            out.setdefault(str(path), []).append((int(off), int(length)))
        except (TypeError, ValueError):
            continue
    return out


def prefetch(ranges: dict[str, list[tuple[int, int]]]) -> int:
    """Ask the kernel to read these file ranges into the page cache now (``posix_fadvise(WILLNEED)``), so a
    later read of them (a backend binding mapped weights) finds them there instead of waiting on the disk.

    Nothing joins this process's resident set: the pages sit in the page cache, which the kernel may evict,
    until something maps and reads them. Blocks while the reads are queued, so it runs on a thread beside the
    work it overlaps (``Prefetcher``). Returns the bytes advised (0 where the OS has no ``posix_fadvise``)."""
    import os

    advise = getattr(os, "posix_fadvise", None)
    flag = getattr(os, "POSIX_FADV_WILLNEED", None)
    if advise is None or flag is None:
        return 0
    total = 0
    for path, spans in ranges.items():
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            log.debug("prefetch: cannot open %s: %s", path, exc)
            continue
        try:
            for off, length in _merged(spans):
                advise(fd, off, length, flag)
                total += length
        except OSError as exc:
            log.debug("prefetch of %s refused: %s", path, exc)
        finally:
            os.close(fd)
    return total


def _merged(spans: Iterable[tuple[int, int]], gap: int = 1 << 20) -> list[tuple[int, int]]:
    """Sorted byte ranges with neighbours closer than ``gap`` joined (fewer, longer reads)."""
    out: list[list[int]] = []
    for off, length in sorted(spans):
        if out and off <= out[-1][0] + out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], off + length - out[-1][0])
        else:
            out.append([off, length])
    return [(a, b) for a, b in out]


class Prefetcher:
    """One background thread that prefetches file ranges in the order they are asked for, while the caller goes
    on (``start`` returns at once); ``wait`` returns when everything asked so far has been advised."""

    def __init__(self) -> None:
        self._queue: Any = None
        self._thread: Any = None
        #: bytes advised so far, and seconds the prefetch thread spent
        self.bytes = 0
        self.seconds = 0.0

    def start(self, ranges: dict[str, list[tuple[int, int]]]) -> None:
        import queue
        import threading

        if not ranges:
            return
        if self._thread is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._work, name="sdrt-prefetch", daemon=True)
            self._thread.start()
        self._queue.put(ranges)

    def _work(self) -> None:
        import time

        while True:
            ranges = self._queue.get()
            try:
                t0 = time.perf_counter()
                self.bytes += prefetch(ranges)
                self.seconds += time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 - a hint to the kernel: never fatal
                log.debug("prefetch failed: %s", exc)
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        if self._queue is not None:
            self._queue.join()


def cached_fraction(path: Any) -> float | None:
    """The share of ``path``'s pages in the page cache now (Linux ``mincore`` over a read-only mapping that is
    never read, so nothing comes in by asking); None where it cannot be told."""
    import ctypes
    import os
    import sys

    import numpy as np

    if not sys.platform.startswith("linux"):
        return None
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        n = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * n)()
        view = np.frombuffer(m, dtype=np.uint8)
        addr = view.__array_interface__["data"][0]
        del view
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            return None
        return float((np.frombuffer(vec, dtype=np.uint8) & 1).astype(bool).mean())
    except (OSError, AttributeError):
        return None
    finally:
        m.close()
