"""Where sdrt's caches live, how big the compile cache may grow, and how keys and checksums are made.

Every cache lives under one root: ``$SDRT_CACHE_DIR`` if set, else the user
cache dir's ``sdrt`` folder. The compile cache takes ``<root>/compiled``; other
caches (the ONNX node-test data) take a folder of their own (``cache_dir(name)``).
Keys are SHA-256 over length-prefixed parts, so ``("ab", "c")`` and
``("a", "bc")`` never collide.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import struct
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..errors import SdrtError

#: the compile cache's size cap when ``$SDRT_CACHE_MAX_SIZE`` is unset
DEFAULT_MAX_BYTES = 32 << 30
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def cache_root() -> Path:
    """``$SDRT_CACHE_DIR`` if set, else ``<user cache dir>/sdrt``."""
    env = os.environ.get("SDRT_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sdrt"))


def cache_dir(name: str) -> Path:
    """The folder of one cache (the compiled models, the node-test data) under ``cache_root()``."""
    return cache_root() / name


def parse_size(text: str | int, where: str = "SDRT_CACHE_MAX_SIZE") -> int:
    """Bytes in ``"20G"``, ``"500M"``, ``"1.5T"``, ``"4096B"``, ``"2000000"`` (binary units; ``GiB``/``GB`` read
    the same). A bare number below 1 MiB other than 0 (``"0.5"``, ``"20"``) is refused: a cache of a few bytes is
    a forgotten unit, and pruning to it would evict every entry."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if m is None:
        raise SdrtError(f"cache size {text!r} is not a size", where=where,
                        fix="write a number of bytes with an optional unit: 20G, 500M, 1.5T")
    size = int(float(m.group(1)) * _UNITS[m.group(2)])
    if not m.group(2) and not m.group(3) and 0 < float(m.group(1)) < 2**20:
        number = m.group(1)
        raise SdrtError(f"cache size {text!r} has no unit, so it reads as bytes: too few to hold a compiled model",
                        where=where, fix=f"did you mean {number}G? Write the unit: 20G, 500M, or B for bytes")
    return size


def max_bytes() -> int:
    """The compile cache's size cap: ``$SDRT_CACHE_MAX_SIZE`` (``20G``), else ``DEFAULT_MAX_BYTES``."""
    env = os.environ.get("SDRT_CACHE_MAX_SIZE")
    return parse_size(env) if env else DEFAULT_MAX_BYTES


def make_key(parts: Iterable[bytes | str]) -> str:
    """SHA-256 hex digest over length-prefixed parts."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 hex digest of a file, streamed in 4 MiB blocks (never the whole file in memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def umask() -> int:
    """This process's umask (read without changing it where ``/proc`` tells it)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace_mode(path: str | os.PathLike[str]) -> int:
    """The permission bits a file written over ``path`` should get, as a plain ``open(path, "wb")`` would give:
    an existing file keeps its own, a new one gets ``0o666 & ~umask``. Raises PermissionError when ``path`` is a
    read-only file (not writable by this user, or with no write bit at all, which a rename would ignore), and
    IsADirectoryError / OSError when it is anything but a regular file (a folder, a device such as /dev/null, a
    FIFO or a socket), which a rename would replace."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return 0o666 & ~umask()
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "it is a folder; not replaced", str(path))
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EEXIST, "it is not a regular file (a device, FIFO or socket); not replaced", str(path))
    if not st.st_mode & 0o222 or not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "it is a read-only file; not replaced", str(path))
    return stat.S_IMODE(st.st_mode)


#: what to do about an output that is a dangling symlink (``write_target`` refuses one)
DANGLING_FIX = "create the target, remove the link, or pick another file name"


def write_target(path: str | os.PathLike[str]) -> Path:
    """The file that writing ``path`` replaces: a symlink's target, as ``open`` writes through it (the link stays).
    Raises FileNotFoundError for a dangling symlink, its ``strerror`` the refusal every output shows: as cp refuses,
    neither a file nor the link's missing folders are made."""
    target = Path(path)
    if os.path.islink(target):  # os.path: a name too long to stat is the caller's OSError later, not one here
        target = Path(os.path.realpath(target))
        if not os.path.exists(target):
            raise FileNotFoundError(errno.ENOENT, f"{os.fspath(path)} is a symlink to {target}, which does not exist, "
                                    "and no output is written through a dangling symlink (as cp does not)", str(path))
    return target


def write_atomic(path: str | os.PathLike[str], chunks: Iterable[bytes | memoryview]) -> Path:
    """Write ``chunks`` to ``path`` through a temporary file in the same folder, synced and renamed over
    ``path``: a reader in another process sees the old file or the new one, never half of one. The file gets the
    mode a plain ``open`` would give it (``replace_mode``); a read-only ``path`` is refused, and so is anything but
    a regular file (a rename would put a file in place of a folder or of a device such as /dev/null). A symlink
    is written through to its target, as ``open`` would (the link stays). Raises OSError."""
    target = write_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = replace_mode(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:24]}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600
        replace_mode(target)  # still a regular file (or none) right before the rename
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(path)
