"""The compiled-program cache: MIGraphX ``.mxr`` files under the user cache directory.

An entry is one plain ``.mxr`` file, exactly as ``migraphx.save`` writes it
(``migraphx-driver`` and ``migraphx.load`` read it as is), named
``<key>-<sha256 of its bytes>.mxr``. The key hashes the graph, the weights'
identity, the target and gfx architecture, the MIGraphX and plugin versions and
the options, so a change to any of them misses. The checksum in the name is
checked before MIGraphX reads the file: a truncated or altered entry is removed
and compiled again, never loaded. Writes go to a temporary file in the same
folder that is renamed into place (``os.replace``), so a reader in another
process sees a whole entry or none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sdrt.cache import cache_dir, file_digest, make_key  # noqa: F401 - make_key is part of this module's API

log = logging.getLogger("sdrt.migraphx.cache")

P = TypeVar("P")
_ENTRY = re.compile(r"^(?P<key>[0-9a-f]{64})-(?P<digest>[0-9a-f]{64})\.mxr$")


def default_dir() -> Path:
    """``$SDRT_CACHE_DIR/migraphx`` if set, else ``<user cache dir>/sdrt/migraphx``."""
    return cache_dir("migraphx")


class ProgramCache:
    """Get compiled programs by key, compiling and storing them on a miss."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def entries(self, key: str) -> list[Path]:
        try:
            return sorted(p for p in self.root.glob(f"{key}-*.mxr") if _ENTRY.match(p.name))
        except OSError:
            return []

    def lookup(self, key: str) -> Path | None:
        """A stored entry for ``key`` whose bytes match its checksum, or None (mismatching ones are removed)."""
        for path in self.entries(key):
            try:
                digest = file_digest(path)
            except OSError as exc:
                log.warning("cannot read cache entry %s (%s); compiling instead", path, exc)
                continue
            want = _ENTRY.match(path.name)["digest"]  # type: ignore[index]
            if digest == want:
                return path
            self.discard(path, f"checksum mismatch: the file hashes to {digest[:16]}..., its name says {want[:16]}...")
        return None

    def store(self, key: str, save: Callable[[Path], None]) -> Path | None:
        """Write an entry with ``save(path)`` atomically; failures are logged, never raised (the cache is optional)."""
        tmp: str | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.root)
            os.close(fd)
            save(Path(tmp))
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            final = self.root / f"{key}-{file_digest(Path(tmp))}.mxr"
            os.replace(tmp, final)
            tmp = None
            for other in self.entries(key):  # an older program for the same key (a compile that differed)
                if other != final:
                    with contextlib.suppress(OSError):
                        other.unlink()
            log.info("cached compiled program %s (%d bytes)", final, final.stat().st_size)
            return final
        except Exception as exc:  # noqa: BLE001 - MIGraphX's save raises RuntimeError; OSError for the disk
            log.warning("cannot write cache entry for %s in %s (%s); going on without it", key[:16], self.root, exc)
            return None
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def get_or_compile(self, key: str, load: Callable[[Path], P], compile_: Callable[[], P],
                       save: Callable[[Any, Path], None]) -> tuple[P, bool]:
        """``(program, hit)``: ``load`` a checked entry, or ``compile_`` and store it with ``save``."""
        path = self.lookup(key)
        if path is not None:
            try:
                return load(path), True
            except Exception as exc:  # noqa: BLE001 - any load failure means: rebuild
                self.discard(path, f"MIGraphX could not load it ({str(exc).splitlines()[0][:200] if str(exc) else exc!r})")
        program = compile_()
        self.store(key, lambda p: save(program, p))
        return program, False

    @staticmethod
    def discard(path: Path, reason: str) -> None:
        log.warning("cache entry %s is unusable (%s); removing it and compiling again", path, reason)
        with contextlib.suppress(OSError):
            path.unlink()
