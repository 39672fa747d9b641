"""sdrt's shipped weight-free graphs: one ONNX graph per architecture, without weights.

``scripts/make_shipped_graphs.py`` exports each from its release's configuration and writes
``sdrt/data/graphs/<name>.onnx.xz``: every initializer is a typed, shaped external reference
to a file that does not exist (the ``sdrt strip`` marking), named with the diffusers/
transformers parameter name, so a single file's tensors bind onto it through
``sdrt.checkpoint``'s key maps and ``weights=``. ``shipped_graph(name)`` unpacks one into
sdrt's cache once (keyed by the packed file's content) and returns the path of the ``.onnx``.
"""

from __future__ import annotations

import hashlib
import logging
import lzma
from importlib import resources
from pathlib import Path

from ..cache import cache_dir
from ..errors import ModelError
from ..graph.strip import write_atomic

log = logging.getLogger("sdrt.checkpoint.graphs")

SUFFIX = ".onnx.xz"


def _data() -> Path:
    return Path(str(resources.files("sdrt") / "data" / "graphs"))


def shipped_names() -> list[str]:
    """The architectures sdrt ships a graph of."""
    folder = _data()
    return sorted(p.name[: -len(SUFFIX)] for p in folder.glob("*" + SUFFIX)) if folder.is_dir() else []


def shipped_graph(name: str) -> Path:
    """The path of the unpacked weight-free graph ``name`` (``sd1_unet``, ``flux_dev_transformer``, ...)."""
    packed = _data() / (name + SUFFIX)
    if not packed.is_file():
        raise ModelError(f"sdrt ships no graph named {name!r}", where=str(packed.parent),
                         fix=f"use one of: {', '.join(shipped_names()) or '(none installed: reinstall sdrt)'}")
    data = packed.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    out = cache_dir("graphs") / f"{name}-{digest}.onnx"
    if out.is_file():
        return out
    try:
        raw = lzma.decompress(data)
    except lzma.LZMAError as exc:
        raise ModelError(f"the shipped graph {name} is damaged ({exc})", where=str(packed),
                         fix="reinstall sdrt") from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, raw, "unpack the shipped graph",
                 fix="check free space and permissions of the cache folder ($SDRT_CACHE_DIR)")
    log.info("unpacked %s (%d kB) to %s", name, len(raw) // 1024, out)
    return out
