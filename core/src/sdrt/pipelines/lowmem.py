"""Low-memory generation: only the running part is loaded (text encoders, then UNet, then VAE).

After a part has run, its compiled sessions are closed and its parsed graph is dropped; the
next use loads it again from its file, which the operating system still has in its page
cache (weights in ``model.onnx_data`` or a ``.safetensors`` file are read through mmap), so
reloading costs a re-parse and a compile, not a disk read. Custom weights
(``pipe.load_weights``) stay bound: the part's ``weights_factory`` rebuilds them (lazy references
into the mmapped checkpoint) when the next session compiles.

``auto_low_memory`` is the pure decision used when ``low_memory=None``: low-memory mode is
chosen when the device reports its memory and the model's parts would take more than half of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .parts import Part

log = logging.getLogger("sdrt.pipelines.lowmem")

#: a part needs about this many times its weight bytes while compiling and running
FOOTPRINT = 2.0


def release(parts: Iterable[Part | None], *, keep_graph: Iterable[str] = ()) -> None:
    """Close the parts' sessions and drop their parsed graphs (except those named in ``keep_graph``:
    graphs that exist only in memory, such as a text encoder with reserved embedding rows)."""
    keep = set(keep_graph)
    for part in parts:
        if part is None:
            continue
        if part.sessions:
            log.debug("low memory: releasing %s", part.name)
        part.close()
        if part.name in keep:
            continue
        if part.weights is not None:
            from ..weights.pages import release_weights

            release_weights(part.weights)  # a GGUF file's one mapping: the pages this part read leave the RSS
        if part.weights is not None and part.weights_factory is None:
            continue  # weights bound by hand refer to this graph: keep both
        part.weights = None  # rebuilt by weights_factory (lazy refs into the checkpoint) on the next compile
        part._graph = None
    give_back()


def give_back() -> None:
    """Collect, then hand freed heap pages back to the OS (glibc keeps them in its arenas otherwise, so
    the process stays as large as the part it just freed)."""
    import gc

    from ..weights.pages import trim_heap

    gc.collect()
    trim_heap()


def model_bytes(paths: Iterable[Path]) -> int:
    """Bytes of the parts' files (``model.onnx`` and its external data), each file once (``model.onnx_data`` is
    both the graph's ``_data`` and a ``*.onnx_data``: until 2026-12-01 it counted twice)."""
    total = 0
    seen: set[Path] = set()
    for p in paths:
        for f in [p, *p.parent.glob(p.name + "_data"), *p.parent.glob("*.onnx_data"), *p.parent.glob("*.bin")]:
            if f in seen:
                continue
            seen.add(f)
            try:
                total += f.stat().st_size
            except OSError:
                continue
    return total


def auto_low_memory(device_memory: int | None, part_bytes: int) -> bool:
    """Whether to run in low-memory mode: the device reports ``device_memory`` bytes and all parts
    would need more than half of it (``FOOTPRINT`` times their size). Unknown memory: no."""
    if not device_memory or device_memory <= 0:
        return False
    return part_bytes * FOOTPRINT > device_memory / 2
