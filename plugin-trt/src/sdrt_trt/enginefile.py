"""Engine files, the ones ``sdrt compile --backend trt`` writes: TensorRT-RTX's own deliverable.

A file is a header (magic, metadata length), JSON metadata (target,
TensorRT-RTX version, what the engine was built from, its refit mode), the
SHA-256 and length of the engine, then the engine. It is written atomically
(``sdrt.cache.write_atomic``); a corrupt file is an error. Engines that
``sdrt.load`` compiles live in the core's compile cache instead (``sdrt.cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from sdrt.cache import write_atomic

from .errors import TrtError

MAGIC = b"SDRTTRT1"
_HEAD = struct.Struct("<8sI")       # magic, metadata length
_BODY = struct.Struct("<32sQ")      # sha256 of the payload, payload length
MAX_META = 1 << 20


class CorruptEngine(ValueError):
    """An engine file whose header, length or checksum is wrong (the reason is the message)."""


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
