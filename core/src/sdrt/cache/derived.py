"""What sdrt keeps under the cache root besides the compile cache, and that it can make again: quantized copies of
graphs (``<root>/quantized``, as large as the weights they hold: ``sdrt.quantization.cached``) and what pinning a graph
inferred (``<root>/pinned``, ``sdrt.graph.pinned_store``). ``sdrt cache list`` counts them and ``sdrt cache clear``
removes them with the compile cache's entries. Only names sdrt's writers give are counted or removed; the
calibration (``<root>/calibration``: measurements, not a cache) is never touched.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

#: folder -> the names sdrt writes there: a quantized graph's folder (the key's first 32 hex digits), a pinned
#: structure's entry or fact (a SHA-256 key); a writer's temporary file (``paths.write_atomic``) too
STORES = {"quantized": re.compile(r"[0-9a-f]{32}"), "pinned": re.compile(r"[0-9a-f]{64}\.(?:bin|fact)")}
_TEMP = re.compile(r"\..+\.tmp")


@dataclass
class Held:
    """What one store holds: its entries (sdrt's names), their bytes, and what else is there (not sdrt's)."""

    entries: list[Path] = field(default_factory=list)
    size: int = 0
    foreign: list[Path] = field(default_factory=list)


def held(root: Path) -> dict[str, Held]:
    """Each store under ``root`` that holds anything, by folder name."""
    out = {}
    for name, pattern in STORES.items():
        found = Held()
        for p in _children(root / name):
            if not p.is_symlink() and (pattern.fullmatch(p.name) or _TEMP.fullmatch(p.name)):
                found.entries.append(p)
                found.size += _bytes(p)
            else:
                found.foreign.append(p)
        if found.entries or found.foreign:
            out[name] = found
    return out


def clear(root: Path) -> tuple[dict[str, Held], list[Path], list[Path]]:
    """Remove every entry of each store under ``root``; returns what was removed, by folder name, what was left
    because sdrt did not write it, and what could not be removed (this user may not write there)."""
    gone, foreign, failed = {}, [], []
    for name, found in held(root).items():
        done = Held()
        foreign += found.foreign
        for p in found.entries:
            size = _bytes(p)
            try:
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
            except OSError:
                failed.append(p)
                continue
            done.entries.append(p)
            done.size += size
        if done.entries:
            gone[name] = done
        try:
            (root / name).rmdir()  # only when nothing else is left there
        except OSError:
            pass
    return gone, foreign, failed


def _children(folder: Path) -> list[Path]:
    if folder.is_symlink() or not folder.is_dir():
        return []
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _bytes(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        return path.stat().st_size
    except OSError:
        return 0
