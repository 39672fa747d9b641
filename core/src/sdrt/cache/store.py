"""The compile cache: what a backend compiled, stored once per key and found again.

Layout: ``<root>/compiled/<backend>/<key>/`` is one entry. It holds the files the
backend wrote (an OpenVINO blob, a TensorRT engine, a Core ML package folder, a
MIGraphX program) and ``sdrt-entry.json``: the key, what the entry was built
from (``meta``), and for every file its size, SHA-256 and a stamp (size, mtime,
ctime, inode).

- **Atomic, concurrent writers safe.** An entry is built in a temporary folder
  beside it and renamed into place; readers in other processes see a whole
  entry or none. When two processes store the same key, the first rename wins
  and the other drops its copy.
- **Checksums, verified cheaply.** The SHA-256 of each file is computed once,
  when the entry is written. A lookup compares each file's stamp with the one
  recorded: when they agree the file has not been touched since it was hashed
  (ctime cannot be set back by any program) and nothing is read. When they
  differ (the file was written to, copied, restored from a backup), the file is
  hashed again, streamed from disk, and its stamp renewed when the hash still
  matches. A file whose size or hash is wrong discards the whole entry. A hit
  therefore costs a few ``stat`` calls, and the backend gets a *path* to load or
  map, never the bytes read into Python first.
- **A corrupt entry is discarded and rebuilt.** A bad manifest, a missing or
  changed file, or a backend that cannot load the entry (``discard``) removes
  the entry (renamed aside, then deleted); the next compile writes it again.
- **Size cap, least recently used first.** Every lookup that hits touches the
  manifest's mtime (the entry's last use); after every store, entries are
  evicted oldest use first until the whole compile cache is under the cap
  (``$SDRT_CACHE_MAX_SIZE``, default 32 GiB). ``sdrt cache prune`` does the same
  on demand, ``sdrt cache list`` and ``sdrt cache clear`` show and empty it (``clear`` removes what sdrt
  wrote there, nothing else: the cache root may be any folder).

Failures to read or write the cache are logged, never raised: the cache is optional.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SdrtError
from . import paths

log = logging.getLogger("sdrt.cache")
#: cache roots already found blocked by a file (warned once)
_BLOCKED: set[str] = set()

MANIFEST = "sdrt-entry.json"
FORMAT = 1
#: a temporary folder this much older than now was left by a writer that died mid-write
STALE_TMP_S = 6 * 3600
#: how often one process sweeps and prunes the whole cache after a store (each pass reads every manifest, so
#: a run that stores thousands of tiny entries, the conformance kit, must not pay it every time); a store
#: of an entry above 1% of the cap prunes at once
MAINTAIN_EVERY_S = 60.0
_last_maintained: dict[Path, float] = {}
#: an entry this large, stored with ``background=True``, is checksummed, synced and renamed into place in a
#: thread (its writer has returned): the full-size SD 1.5 UNet's 3.4 GB blob takes seconds to hash and sync,
#: which the first image need not wait for
BACKGROUND_BYTES = 256 << 20
_pending: list[threading.Thread] = []
_pending_lock = threading.Lock()


def wait_for_stores(timeout: float | None = None) -> bool:
    """Wait until every entry being stored in the background is in place (or ``timeout`` passed); True when
    none is left. Python also waits for them at exit (the threads are not daemons)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _pending_lock:
            _pending[:] = [t for t in _pending if t.is_alive()]
            left = list(_pending)
        if not left:
            return True
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        left[0].join(remaining)
#: the folders where the compile caches of sdrt 0.1's plugins lived, with the name of one entry in each (a file,
#: a Core ML package folder); ``clear`` removes those entries and the temporary files of their writers, nothing else
LEGACY = {"openvino": re.compile(r"[0-9a-f]{64}\.ovblob"), "trt": re.compile(r"[0-9a-f]{64}\.engine"),
          "coreml": re.compile(r"[0-9a-f]{64}"), "migraphx": re.compile(r"[0-9a-f]{64}-[0-9a-f]{64}\.mxr")}
#: an entry's folder: its key (a SHA-256, ``paths.make_key``)
_KEY = re.compile(r"[0-9a-f]{64}")
#: what sdrt's writers leave beside an entry: a temporary folder or file (``mkdtemp``/``mkstemp`` with the key's
#: first characters as prefix), or an entry renamed aside to be deleted (``_remove_tree``, sdrt 0.1's Core ML cache)
_LEFTOVER = re.compile(r"\.[^/\\]{1,24}\.(?:[a-z0-9_]{1,16}\.tmp|\d+(?:\.\d+)?\.trash)")


@dataclass(frozen=True)
class Cleared:
    """What ``CompileCache.clear`` did: the entries it removed, the leftovers of sdrt's writers and the entries
    of sdrt 0.1's caches it removed too, and what it left because sdrt did not write it."""

    entries: list[Entry]
    leftovers: list[Path]
    legacy: list[Path]
    foreign: list[Path]


@dataclass(frozen=True)
class Entry:
    """One stored compile result: its folder, key and what it was built from."""

    path: Path
    key: str
    backend: str
    meta: Mapping[str, Any] = field(default_factory=dict)
    #: relative path -> size in bytes, for every payload file
    files: Mapping[str, int] = field(default_factory=dict)
    created: float = 0.0
    last_used: float = 0.0

    @property
    def size(self) -> int:
        return sum(self.files.values())

    def file(self, name: str) -> Path:
        """A payload file of this entry (what the backend wrote as ``name``)."""
        return self.path / name


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    paths.write_atomic(path, [json.dumps(data, sort_keys=True).encode()])


def _read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of an entry folder; raises OSError or ValueError when it is absent or unreadable."""
    data = json.loads((folder / MANIFEST).read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
        raise ValueError("not an sdrt cache manifest of this format")
    return data


def _entry(folder: Path, data: Mapping[str, Any], last_used: float) -> Entry:
    return Entry(folder, str(data.get("key", folder.name)), str(data.get("backend", folder.parent.name)),
                 dict(data.get("meta") or {}), {k: int(v["size"]) for k, v in data["files"].items()},
                 float(data.get("created", 0.0)), last_used)


def _remove_tree(path: Path) -> None:
    """Take ``path`` out of readers' sight at once (a rename), then delete it."""
    trash = path.with_name(f".{path.name[:16]}.{os.getpid()}.{time.monotonic_ns()}.trash")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


class CompileCache:
    """The compile cache of one backend, under ``root/compiled/<backend>`` (``root``: ``cache_root()``)."""

    def __init__(self, backend: str, root: str | os.PathLike[str] | None = None, *,
                 max_bytes: int | None = None) -> None:
        self.backend = plain_name(backend)
        self.root = Path(root) if root is not None else paths.cache_root()
        #: what named the root, for the message when it cannot hold a cache
        self.named_by = ("cache_dir=" if root is not None else
                         "SDRT_CACHE_DIR" if os.environ.get("SDRT_CACHE_DIR") else "the user cache folder")
        self.compiled = self.root / "compiled"
        self.dir = self.compiled / backend
        self.max_bytes = paths.max_bytes() if max_bytes is None else max_bytes

    @classmethod
    def of(cls, entry: Entry) -> CompileCache:
        """The cache ``entry`` belongs to."""
        return cls(entry.backend, entry.path.parents[2])

    def path(self, key: str) -> Path:
        return self.dir / key

    # -- reading -------------------------------------------------------
    def lookup(self, key: str) -> Entry | None:
        """The entry stored under ``key`` with every file checked, or None (a damaged entry is discarded)."""
        folder = self.path(key)
        if not os.path.isdir(folder):  # also an unreadable cache folder (PermissionError from is_dir): a miss
            return None
        try:
            data = _read_manifest(folder)
        except FileNotFoundError:
            self.discard(key, "it has no manifest")
            return None
        except (OSError, ValueError) as exc:
            self.discard(key, f"its manifest is unreadable ({exc})")
            return None
        renewed = False
        for rel, rec in data["files"].items():
            try:
                st = os.stat(folder / rel)
            except OSError:
                self.discard(key, f"its file {rel} is missing")
                return None
            if st.st_size != rec.get("size"):
                self.discard(key, f"{rel} has {st.st_size} bytes where {rec.get('size')} were written")
                return None
            if _stamp(st) == rec.get("stamp"):
                continue  # untouched since it was hashed
            try:
                digest = paths.file_digest(folder / rel)
            except OSError as exc:
                log.warning("cannot read cache file %s (%s); compiling instead", folder / rel, exc)
                return None
            if digest != rec.get("sha256"):
                self.discard(key, f"checksum mismatch in {rel}")
                return None
            rec["stamp"] = _stamp(os.stat(folder / rel))
            renewed = True
        if renewed:  # hashed again and still whole: later lookups trust the new stamp
            with contextlib.suppress(OSError):
                _write_json(folder / MANIFEST, data)
        now = time.time()
        with contextlib.suppress(OSError):
            os.utime(folder / MANIFEST, (now, now))  # its last use, for least-recently-used eviction
        return _entry(folder, data, now)

    # -- writing -------------------------------------------------------
    def unusable(self) -> str | None:
        """Why no entry can be written here, in words (a file where the cache's folder goes, a folder this user
        cannot write in), or None when entries can be written."""
        p = self.dir
        while not os.path.lexists(p) and p != p.parent:
            p = p.parent
        if not p.is_dir():
            return f"{p} is a file, not a folder"
        if not os.access(p, os.W_OK | os.X_OK):
            return f"{p} is a folder this user cannot write in"
        return None

    def _blocked(self) -> bool:
        """Whether the cache's folders cannot be written (``unusable``): said once per root, naming what set it
        (``SDRT_CACHE_DIR``), instead of an OS error for every part stored."""
        why = self.unusable()
        if why is None:
            return False
        if str(self.root) not in _BLOCKED:
            _BLOCKED.add(str(self.root))
            fix = {"SDRT_CACHE_DIR": "point SDRT_CACHE_DIR at a folder you can write in, or unset it",
                   "cache_dir=": "pass cache_dir= a folder you can write in"}.get(
                       self.named_by, "make it writable, or set SDRT_CACHE_DIR to a folder you can write in")
            log.warning("the compile cache cannot go in %s: %s (%s); going on without the cache, so the next run "
                        "compiles again. What to do: %s", self.root, why, self.named_by, fix)
        return True

    def store(self, key: str, write: Callable[[Path], Any], meta: Mapping[str, Any] | None = None, *,
              replace: bool = False, background: bool = False) -> Entry | None:
        """Store what ``write(folder)`` puts in ``folder`` under ``key``, atomically.

        ``write`` returning ``False`` means: nothing to cache. When another process stored the key
        first its entry is kept, unless ``replace``. Errors are logged and give None. With ``background``
        an entry of ``BACKGROUND_BYTES`` or more is finished (synced, checksummed, renamed into place) in a
        thread once ``write`` has returned, and None is returned; ``wait_for_stores`` waits for it.
        """
        tmp: Path | None = None
        if self._blocked():
            return None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.dir))
            if write(tmp) is False:
                shutil.rmtree(tmp, ignore_errors=True)
                return None
            size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
        except Exception as exc:  # noqa: BLE001 - the cache is optional: a vendor's export error or a full disk
            log.warning("cannot write cache entry %s (%s); going on without it", self.path(key), exc)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            return None
        if background and size >= BACKGROUND_BYTES:
            thread = threading.Thread(target=self._commit, args=(key, tmp, meta, replace),
                                      name=f"sdrt-cache-store-{key[:8]}", daemon=False)
            with _pending_lock:
                _pending.append(thread)
            thread.start()
            log.info("storing %s entry %s (%d bytes) in the background", self.backend, key[:12], size)
            return None
        return self._commit(key, tmp, meta, replace)

    def _commit(self, key: str, tmp: Path, meta: Mapping[str, Any] | None, replace: bool) -> Entry | None:
        """Sync, checksum and rename into place the entry ``store``'s writer put in ``tmp``."""
        final = self.path(key)
        left: Path | None = tmp
        try:
            files: dict[str, Any] = {}
            for p in sorted(tmp.rglob("*")):
                if p.is_file():
                    with open(p, "rb") as f:
                        os.fsync(f.fileno())
                    files[p.relative_to(tmp).as_posix()] = {"size": p.stat().st_size,
                                                            "sha256": paths.file_digest(p),
                                                            "stamp": _stamp(p.stat())}
            data = {"format": FORMAT, "key": key, "backend": self.backend, "created": time.time(),
                    "meta": dict(meta or {}), "files": files}
            _write_json(tmp / MANIFEST, data)
            if replace and final.exists():
                _remove_tree(final)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():
                    raise
                log.info("cache entry %s appeared while this process compiled it; keeping that one", key[:12])
                return self.lookup(key)
            left = None
            log.info("cached %s entry %s (%d bytes)", self.backend, final, sum(f["size"] for f in files.values()))
            entry = _entry(final, data, time.time())
        except Exception as exc:  # noqa: BLE001 - the cache is optional: a vendor's export error or a full disk
            log.warning("cannot write cache entry %s (%s); going on without it", final, exc)
            return None
        finally:
            if left is not None:
                shutil.rmtree(left, ignore_errors=True)
        self._maintain(entry)
        return entry

    def _maintain(self, stored: Entry) -> None:
        """Sweep leftovers and prune to the cap, when due (see ``MAINTAIN_EVERY_S``)."""
        now = time.monotonic()
        due = now - _last_maintained.get(self.compiled, -MAINTAIN_EVERY_S) >= MAINTAIN_EVERY_S
        if due or stored.size * 100 > self.max_bytes:
            _last_maintained[self.compiled] = now
            self.sweep()
            self.prune(keep={stored.path})

    def discard(self, key: str, reason: str) -> None:
        """Remove the entry of ``key`` (damaged, or its backend cannot load it), saying why."""
        log.warning("cache entry %s is unusable (%s); removing it and compiling again", self.path(key), reason)
        _remove_tree(self.path(key))

    # -- the whole cache -------------------------------------------------
    def entries(self, backend: str | None = None) -> list[Entry]:
        """Every readable entry of the compile cache (all backends, or one), least recently used first."""
        out = []
        folders = [self.compiled / plain_name(backend)] if backend else _dirs(self.compiled)
        for bdir in folders:
            for folder in _dirs(bdir):
                try:
                    data = _read_manifest(folder)
                    used = (folder / MANIFEST).stat().st_mtime
                except (OSError, ValueError):
                    continue
                out.append(_entry(folder, data, used))
        return sorted(out, key=lambda e: e.last_used)

    def sweep(self, max_age_s: float = STALE_TMP_S) -> list[Path]:
        """Remove what killed writers left: temporary folders older than ``max_age_s``, half-deleted
        entries, and entry folders without a readable manifest older than ``max_age_s``."""
        removed = []
        cutoff = time.time() - max_age_s
        for bdir in _dirs(self.compiled, hidden=True):
            for p in _dirs(bdir, hidden=True):
                try:
                    old = p.stat().st_mtime < cutoff
                except OSError:
                    continue
                broken = _KEY.fullmatch(p.name) is not None and not (p / MANIFEST).is_file()
                leftover = _LEFTOVER.fullmatch(p.name) is not None
                if (leftover and p.name.endswith(".trash")) or (old and (leftover or broken)):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p)
        if removed:
            log.info("removed %d leftovers of interrupted cache writes in %s", len(removed), self.compiled)
        return removed

    def prune(self, max_bytes: int | None = None, keep: Iterable[Path] = ()) -> list[Entry]:
        """Evict least recently used entries until the compile cache holds at most ``max_bytes``
        (default: this cache's cap); entries in ``keep`` stay. Returns the evicted entries."""
        cap = self.max_bytes if max_bytes is None else max_bytes
        kept = set(keep)
        entries = self.entries()
        total = sum(e.size for e in entries)
        evicted = []
        for e in entries:
            if total <= cap:
                break
            if e.path in kept:
                continue
            _remove_tree(e.path)
            total -= e.size
            evicted.append(e)
        if evicted:
            log.info("evicted %d least recently used cache entries (%d bytes) to stay under %d bytes",
                     len(evicted), sum(e.size for e in evicted), cap)
        return evicted

    def backends(self) -> list[str]:
        """The backends the compile cache holds a folder for."""
        return [p.name for p in _dirs(self.compiled)]

    def clear(self, backend: str | None = None) -> Cleared:
        """Remove every entry (of one backend, or of all and the entries of sdrt 0.1's caches) and what sdrt's
        writers left beside them. Only what sdrt wrote goes: an entry is a folder holding sdrt's manifest, a
        leftover has the name sdrt's writers give it; anything else is left where it is and listed."""
        done = Cleared([], [], [], [])
        folders = [self.compiled / plain_name(backend)] if backend else _dirs(self.compiled, hidden=True)
        done.foreign.extend(_others(self.compiled, folders) if not backend else [])
        for bdir in folders:
            if bdir.is_symlink() or not bdir.is_dir():
                done.foreign.append(bdir)
                continue
            for p in _children(bdir):
                if not p.name.startswith(".") and p.is_dir() and not p.is_symlink() and (p / MANIFEST).is_file():
                    try:
                        done.entries.append(_entry(p, _read_manifest(p), 0.0))
                    except (OSError, ValueError):  # sdrt's, but damaged
                        done.leftovers.append(p)
                    _remove_tree(p)
                elif _LEFTOVER.fullmatch(p.name) and not p.is_symlink():
                    _remove(p)
                    done.leftovers.append(p)
                else:
                    done.foreign.append(p)
            _rmdir(bdir)
        if not backend:
            _rmdir(self.compiled)
            for name, entry in LEGACY.items():
                folder = self.root / name
                if folder.is_symlink() or not folder.is_dir():
                    continue
                for p in _children(folder):
                    if p.is_symlink() or not (entry.fullmatch(p.name) or _LEFTOVER.fullmatch(p.name)):
                        done.foreign.append(p)
                    else:
                        _remove(p)
                        (done.legacy if entry.fullmatch(p.name) else done.leftovers).append(p)
                _rmdir(folder)
        return done


def plain_name(backend: str) -> str:
    """``backend`` when it is a plain name, one folder of the compile cache (no path separator, not ``..``)."""
    if not backend or backend in (".", "..") or any(c in backend for c in "/\\\0") or os.path.isabs(backend):
        raise SdrtError(f"{backend!r} is not a backend name", where="the compile cache's backend",
                        fix="give a backend's plain name, such as openvino or ggml (sdrt cache list shows them)")
    return backend


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _others(folder: Path, known: list[Path]) -> list[Path]:
    """What ``folder`` holds besides ``known``: files (sdrt writes only folders there)."""
    return [p for p in _children(folder) if p not in known]


def _remove(path: Path) -> None:
    if path.is_dir():
        _remove_tree(path)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _rmdir(folder: Path) -> None:
    """Remove ``folder`` when it is empty (what sdrt did not write keeps it)."""
    with contextlib.suppress(OSError):
        folder.rmdir()


def _dirs(folder: Path, hidden: bool = False) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and (hidden or not p.name.startswith(".")))
    except OSError:
        return []
