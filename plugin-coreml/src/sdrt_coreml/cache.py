"""The package cache: built ``.mlpackage`` folders under the user cache directory.

An entry is a folder ``<key>/`` holding ``model.mlpackage`` and ``checksums.json``
(size and SHA-256 of every file of the package). The key hashes the graph, the
weights, the options that change the package (precision, target) and the
coremltools and plugin versions; the compute unit is not in it, because one
package serves every compute unit. An entry is built in a temporary folder
beside it and renamed into place, so other processes see a whole entry or none;
when two processes build the same entry, the first rename wins and the other
drops its copy. An entry whose files do not match their checksums is moved
aside, deleted and built again: a damaged entry never breaks a load.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from sdrt.cache import cache_dir, file_digest, make_key  # noqa: F401 - make_key is part of this module's API

log = logging.getLogger("sdrt.coreml.cache")

PACKAGE = "model.mlpackage"
CHECKSUMS = "checksums.json"


def default_dir() -> Path:
    """``$SDRT_CACHE_DIR/coreml`` if set, else ``<user cache dir>/sdrt/coreml``."""
    return cache_dir("coreml")


def checksums(folder: Path) -> dict[str, list[int | str]]:
    """``{relative path: [size, sha256]}`` of every file under ``folder``."""
    out: dict[str, list[int | str]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        out[path.relative_to(folder).as_posix()] = [path.stat().st_size, file_digest(path)]
    return out


class PackageCache:
    """Get packages by key, building and storing them on a miss."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def entry(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> Path | None:
        """The package stored under ``key``, or None if absent or damaged (a damaged entry is removed)."""
        entry = self.entry(key)
        pkg = entry / PACKAGE
        if not entry.is_dir():
            return None
        try:
            want = json.loads((entry / CHECKSUMS).read_text())
        except (OSError, ValueError) as exc:
            return self._discard(entry, f"no readable checksum list ({exc})")
        try:
            have = checksums(pkg)
        except OSError as exc:
            return self._discard(entry, f"unreadable ({exc})")
        if have != want:
            bad = sorted(set(have) ^ set(want) | {k for k in have if k in want and have[k] != want[k]})
            return self._discard(entry, f"files differ from their checksums: {', '.join(bad[:3])}")
        return pkg

    def get_or_build(self, key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """``(package path, hit)``: the stored package, or ``build(path)`` then store it."""
        pkg = self.get(key)
        if pkg is not None:
            return pkg, True
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.root))
        try:
            build(tmp / PACKAGE)
            (tmp / CHECKSUMS).write_text(json.dumps(checksums(tmp / PACKAGE)))
            try:
                os.rename(tmp, self.entry(key))
            except OSError:  # another process stored it first: use theirs
                log.info("cache entry %s appeared while building; keeping the other copy", key[:12])
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                log.info("cached package %s", self.entry(key))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        got = self.get(key)
        if got is None:  # the entry vanished or broke right away: nothing else to do but fail loudly
            raise OSError(f"cache entry {self.entry(key)} is not readable after writing it")
        return got, False

    def _discard(self, entry: Path, reason: str) -> None:
        log.warning("cache entry %s is damaged (%s); removing it and building again", entry, reason)
        trash = entry.with_name(f".{entry.name[:16]}.{os.getpid()}.trash")
        with contextlib.suppress(OSError):
            os.rename(entry, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return None
