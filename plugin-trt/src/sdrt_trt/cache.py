"""Engine files and the engine cache.

One format serves the files ``sdrt compile`` writes and the cache entries: a
header (magic, metadata length), JSON metadata (target, TensorRT-RTX version,
what the engine was built from, its refit mode), the SHA-256 and length of the
engine, then the engine. Writes go to a temporary file in the same folder and
are renamed over the target with ``os.replace``, so readers in other processes
see the old file or the new one, never half of one. A cache entry that fails
its checksum is deleted and rebuilt; a corrupt ``sdrt compile`` file is an error.

The cache lives in ``$SDRT_CACHE_DIR/trt`` or ``<user cache dir>/sdrt/trt``:
``<key>.engine``, and beside it ``<key>.rtcache``, TensorRT-RTX's JIT runtime
cache for that engine, in the same format.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

from sdrt.cache import cache_dir, make_key  # noqa: F401 - make_key is part of this module's API

from .errors import TrtError

log = logging.getLogger("sdrt.trt.cache")

MAGIC = b"SDRTTRT1"
_HEAD = struct.Struct("<8sI")       # magic, metadata length
_BODY = struct.Struct("<32sQ")      # sha256 of the payload, payload length
MAX_META = 1 << 20


class CorruptEngine(ValueError):
    """An engine file whose header, length or checksum is wrong (the reason is the message)."""


def default_dir() -> Path:
    """``$SDRT_CACHE_DIR/trt`` if set, else ``<user cache dir>/sdrt/trt``."""
    return cache_dir("trt")


def pack(meta: dict[str, Any], payload: bytes) -> list[bytes]:
    raw = json.dumps(meta, sort_keys=True).encode()
    return [_HEAD.pack(MAGIC, len(raw)), raw, _BODY.pack(hashlib.sha256(payload).digest(), len(payload)), payload]


def unpack(data: bytes) -> tuple[dict[str, Any], bytes]:
    """``(metadata, payload)``; raises ``CorruptEngine`` saying what is wrong."""
    if len(data) < _HEAD.size:
        raise CorruptEngine("shorter than its header")
    magic, meta_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEngine(f"wrong magic {magic!r} (not written by sdrt-trt)")
    if meta_len > MAX_META or len(data) < _HEAD.size + meta_len + _BODY.size:
        raise CorruptEngine("truncated metadata")
    try:
        meta = json.loads(data[_HEAD.size:_HEAD.size + meta_len])
    except ValueError as exc:
        raise CorruptEngine(f"unreadable metadata ({exc})") from exc
    if not isinstance(meta, dict):
        raise CorruptEngine("metadata is not an object")
    digest, length = _BODY.unpack_from(data, _HEAD.size + meta_len)
    payload = memoryview(data)[_HEAD.size + meta_len + _BODY.size:]
    if length != len(payload):
        raise CorruptEngine(f"engine of {len(payload)} bytes where the header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEngine("checksum mismatch")
    return meta, bytes(payload)


def write_atomic(path: Path, parts: list[bytes]) -> None:
    """Write ``parts`` to ``path`` through a temporary file and a rename; raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:24]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_engine(path: Path, meta: dict[str, Any], engine: bytes) -> Path:
    """An ``sdrt compile`` output file; raises ``TrtError`` when it cannot be written."""
    try:
        write_atomic(path, pack(meta, engine))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(path, 0o666 & ~umask)  # an output file, not a private temporary
    except OSError as exc:
        raise TrtError(f"cannot write the engine file ({exc.strerror or exc})", where=str(path),
                       fix="check the folder exists and is writable") from exc
    return path


def read_engine(path: Path) -> tuple[dict[str, Any], bytes]:
    """Read an ``sdrt compile`` output file; raises ``TrtError`` for a missing or corrupt one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrtError(f"cannot read the engine file ({exc.strerror or exc})", where=str(path),
                       fix="pass the path sdrt compile wrote (engine=...)") from exc
    try:
        return unpack(data)
    except CorruptEngine as exc:
        raise TrtError(f"the engine file is corrupt: {exc}", where=str(path),
                       fix="build it again with sdrt compile MODEL --backend trt --target smXX -o FILE") from exc


class EngineCache:
    """Engines and runtime caches by key; a corrupt entry is removed and reported as a miss."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str, kind: str = "engine") -> Path:
        return self.root / f"{key}.{kind}"

    def get(self, key: str, kind: str = "engine") -> tuple[dict[str, Any], bytes] | None:
        path = self.path(key, kind)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read cache entry %s (%s); building instead", path, exc)
            return None
        try:
            return unpack(data)
        except CorruptEngine as exc:
            self.discard(key, str(exc), kind)
            return None

    def put(self, key: str, meta: dict[str, Any], payload: bytes, kind: str = "engine") -> None:
        """Store atomically; failures are logged, never raised (the cache is optional)."""
        path = self.path(key, kind)
        try:
            write_atomic(path, pack(meta, payload))
            log.info("cached %s %s (%d bytes)", kind, path, len(payload))
        except OSError as exc:
            log.warning("cannot write cache entry %s (%s); going on without it", path, exc)

    def discard(self, key: str, reason: str, kind: str = "engine") -> None:
        path = self.path(key, kind)
        log.warning("cache entry %s is unusable (%s); removing it", path, reason)
        with contextlib.suppress(OSError):
            path.unlink()
