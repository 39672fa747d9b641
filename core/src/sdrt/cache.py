"""Where sdrt and its backends cache things, and how cache keys are made.

Every cache lives under one root: ``$SDRT_CACHE_DIR`` if set, else the user
cache dir's ``sdrt`` folder; each backend takes a folder of its own there
(``cache_dir("openvino")``). Keys are SHA-256 over length-prefixed parts, so
``("ab", "c")`` and ``("a", "bc")`` never collide.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable
from pathlib import Path


def cache_root() -> Path:
    """``$SDRT_CACHE_DIR`` if set, else ``<user cache dir>/sdrt``."""
    env = os.environ.get("SDRT_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sdrt"))


def cache_dir(name: str) -> Path:
    """The folder of one cache (a backend's compiled models, the node-test data) under ``cache_root()``."""
    return cache_root() / name


def make_key(parts: Iterable[bytes | str]) -> str:
    """SHA-256 hex digest over length-prefixed parts."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 hex digest of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


__all__ = ["cache_dir", "cache_root", "file_digest", "make_key"]
