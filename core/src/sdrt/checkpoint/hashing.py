"""A1111's model hash of a checkpoint file, computed once per file version.

``Model hash:`` in A1111's PNG parameters is the first 10 hex digits of the file's SHA-256
(``sd_models.CheckpointInfo.calculate_shorthash``). Hashing a 6 GB file takes tens of
seconds, so the full digest is cached under ``<sdrt cache>/hashes/``, keyed by the file's
absolute path and checked against its size and modification time: a file that changes is
hashed again, an unchanged one is never re-read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from ..cache import cache_dir, file_digest
from ..errors import ModelError

log = logging.getLogger("sdrt.checkpoint.hashing")


def _entry(path: Path) -> Path:
    return cache_dir("hashes") / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")


def model_hash(path: str | os.PathLike[str]) -> str:
    """The file's full SHA-256 hex digest (A1111's short hash is its first 10 digits), cached."""
    p = Path(path).resolve()
    try:
        st = p.stat()
    except OSError as exc:
        raise ModelError(f"cannot read the checkpoint to hash it ({exc.strerror or exc})", where=str(p),
                         fix="check the path") from exc
    key = {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    entry = _entry(p)
    try:
        cached = json.loads(entry.read_text())
        if {k: cached.get(k) for k in key} == key and isinstance(cached.get("sha256"), str):
            return cached["sha256"]
    except (OSError, ValueError):
        pass
    digest = file_digest(p)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**key, "sha256": digest}))
        os.replace(tmp, entry)
    except OSError as exc:  # a read-only cache costs a re-hash next time, nothing else
        log.warning("cannot cache the hash of %s: %s", p.name, exc)
    return digest
