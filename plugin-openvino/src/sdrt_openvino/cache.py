"""The compiled-model cache: OpenVINO's exported blobs under the user cache directory.

An entry is one file, ``<key>.ovblob``: a header (magic, SHA-256 and length of
the blob) followed by the bytes of ``CompiledModel.export_model()``. The key
hashes the graph, the weights, the device, the OpenVINO and plugin versions and
the options, so a change to any of them misses. Writes go to a temporary file in
the same folder and are renamed over the entry with ``os.replace``: readers in
other processes see the old file or the new one, never half of one. A file whose
checksum does not match, or that OpenVINO refuses to import, is deleted and
compiled again: a corrupted entry never crashes a load.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sdrt.cache import cache_dir, make_key  # noqa: F401 - make_key is part of this module's API

log = logging.getLogger("sdrt.openvino.cache")

MAGIC = b"SDRTOVB1"
#: a temporary file this much older than now was left by a writer that died (killed mid-write):
#: a live writer finishes a blob in seconds to minutes
STALE_TMP_S = 6 * 3600
_HEADER = struct.Struct("<8s32sQ")  # magic, sha256 of the blob, blob length


def default_dir() -> Path:
    """``$SDRT_CACHE_DIR/openvino`` if set, else ``<user cache dir>/sdrt/openvino``."""
    return cache_dir("openvino")


class CompiledCache:
    """Get compiled models by key, compiling and storing them on a miss."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.ovblob"

    def read(self, key: str) -> bytes | None:
        """The blob stored under ``key``, or None if absent or corrupt (a corrupt file is removed)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read cache entry %s (%s); compiling instead", path, exc)
            return None
        if len(data) < _HEADER.size:
            return self._corrupt(path, "shorter than its header")
        magic, digest, length = _HEADER.unpack_from(data)
        blob = memoryview(data)[_HEADER.size:]
        if magic != MAGIC:
            return self._corrupt(path, "wrong magic")
        if length != len(blob):
            return self._corrupt(path, f"length {len(blob)} where the header says {length}")
        if hashlib.sha256(blob).digest() != digest:
            return self._corrupt(path, "checksum mismatch")
        return bytes(blob)

    def sweep(self, max_age_s: float = STALE_TMP_S) -> list[Path]:
        """Remove temporary files that killed writers left behind (older than ``max_age_s``); return them."""
        removed = []
        cutoff = time.time() - max_age_s
        try:
            leftovers = list(self.root.glob(".*.tmp"))
        except OSError:
            return removed
        for tmp in leftovers:
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
                    removed.append(tmp)
        if removed:
            log.info("removed %d temporary files left by interrupted cache writes in %s", len(removed), self.root)
        return removed

    def write(self, key: str, blob: bytes) -> None:
        """Store ``blob`` atomically; failures are logged, never raised (the cache is optional).

        Every write first sweeps the temporary files that killed writers left behind.
        """
        path = self.path(key)
        tmp = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.sweep()
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.root)
            with os.fdopen(fd, "wb") as f:
                f.write(_HEADER.pack(MAGIC, hashlib.sha256(blob).digest(), len(blob)))
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
            log.info("cached compiled model %s (%d bytes)", path, len(blob))
        except OSError as exc:
            log.warning("cannot write cache entry %s (%s); going on without it", path, exc)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def discard(self, key: str, reason: str) -> None:
        self._corrupt(self.path(key), reason)

    def get_or_compile(self, key: str, load: Callable[[bytes], Any], compile_: Callable[[], Any],
                       export: Callable[[Any], bytes]) -> tuple[Any, bool]:
        """``(compiled, hit)``: import the entry with ``load``, or ``compile_`` and store ``export`` of it."""
        blob = self.read(key)
        if blob is not None:
            try:
                return load(blob), True
            except Exception as exc:  # noqa: BLE001 - any import failure means: rebuild
                self.discard(key, f"OpenVINO could not import it ({str(exc).splitlines()[0][:200]})")
        compiled = compile_()
        try:
            data = export(compiled)
        except Exception as exc:  # noqa: BLE001 - a device that cannot export just is not cached
            log.info("not caching: export failed (%s)", str(exc).splitlines()[0][:200] if str(exc) else repr(exc))
            return compiled, False
        self.write(key, data)
        return compiled, False

    @staticmethod
    def _corrupt(path: Path, reason: str) -> None:
        log.warning("cache entry %s is corrupt (%s); removing it and compiling again", path, reason)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
