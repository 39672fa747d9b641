"""``sdrt cache list|clear|prune``: what the compile cache holds, and emptying or shrinking it."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from ..errors import counted, printable

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("cache", help="list, clear or prune the compile cache ($SDRT_CACHE_DIR/compiled)")
    p.add_argument("action", choices=["list", "clear", "prune"],
                   help="list: every entry, least recently used first; clear: remove every entry, and (without "
                        "--backend) the quantized graphs and pinned shapes kept beside them (only what sdrt "
                        "wrote: anything else in the cache folders stays, and is listed); "
                        "prune: evict least recently used entries down to --max-size")
    p.add_argument("--backend", default=None, help="only this backend's entries (list, clear)")
    p.add_argument("--max-size", default=None,
                   help="prune: the size to shrink to, e.g. 10G (default: $SDRT_CACHE_MAX_SIZE or 32G)")
    p.add_argument("--cache-dir", default=None, help="the cache root (default: $SDRT_CACHE_DIR or the user cache)")
    return p


def _legacy_size(folder: Path, entry: Any) -> int:
    """Bytes in the entries of one of sdrt 0.1's cache folders (what ``clear`` would remove)."""
    try:
        found = [p for p in folder.iterdir() if entry.fullmatch(p.name) and not p.is_symlink()]
    except OSError:
        return 0
    return sum(p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
               for p in found)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _files(paths: list[Path]) -> str:
    shown = ", ".join(str(p) for p in paths[:5])
    return shown + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


def _derived(found: dict[str, Any]) -> str:
    """``3 quantized graphs (1.2 GiB) and 40 pinned-shape entries (9.1 MiB)``"""
    nouns = {"quantized": ("quantized graph", "quantized graphs"), "pinned": ("pinned-shape entry", "pinned-shape entries")}
    return " and ".join(f"{len(h.entries)} {nouns[name][len(h.entries) != 1]} ({_size(h.size)})"
                        for name, h in found.items())


def run(args: argparse.Namespace) -> int:
    from ..cache import CompileCache, derived, parse_size
    from ..cache.store import LEGACY
    from ..errors import SdrtError

    if args.max_size is not None and args.action != "prune":  # list and clear take no size: it would be ignored
        raise SdrtError(f"--max-size applies to prune, not to {args.action}", where="sdrt cache --max-size",
                        fix=f"leave --max-size out, or run sdrt cache prune --max-size {args.max_size}")
    cache = CompileCache("-", args.cache_dir)
    named = "--cache-dir" if args.cache_dir is not None else cache.named_by
    for folder in (cache.root, cache.compiled):
        if folder.is_dir() and not os.access(folder, os.R_OK | os.X_OK):  # a PermissionError traceback
            raise SdrtError(f"cannot read the cache folder {folder} (Permission denied)",
                            where=f"sdrt cache {args.action} ({named})", fix="run it as the user who owns the cache")
    for folder in (cache.root, cache.compiled):
        if folder.exists() and not folder.is_dir():  # listed as "0 entries", cleared as "removed 0 entries"
            raise SdrtError(f"{folder} is a file, not a cache folder", where=f"sdrt cache {args.action} ({named})",
                            fix="point it at the cache folder (the default: leave --cache-dir and SDRT_CACHE_DIR "
                                "unset)")
    if args.action != "list":  # entries are removed by renaming them in their backend's folder
        if args.backend is not None:
            folders = [cache.compiled / args.backend]
        else:
            folders = [cache.compiled, *(cache.compiled / b for b in cache.backends())]
            if args.action == "clear":  # the stores kept beside the compile cache go too
                folders += [cache.root / name for name in derived.STORES]
        locked = [f for f in folders if f.is_dir() and not os.access(f, os.W_OK | os.X_OK)]
        if locked:  # it said "removed 3 entries" and removed none
            raise SdrtError(f"cannot remove entries from {_files(locked)}: this user cannot write there",
                            where=f"sdrt cache {args.action}", fix="run it as the user who owns the cache, or "
                            "make the folder writable")
    if args.backend is not None and args.action == "prune":
        raise SdrtError("prune works on the whole compile cache (one size cap for every backend)",
                        where="sdrt cache prune --backend", fix="drop --backend, or use sdrt cache clear --backend")
    if args.backend is not None:
        held = cache.backends()
        if args.backend not in held:
            raise SdrtError(f"the compile cache holds no backend {args.backend!r}",
                            where=f"sdrt cache {args.action} --backend (the cache: {cache.compiled})",
                            fix=f"pass one it holds: {', '.join(held)} (names are case-sensitive)" if held else
                            "the compile cache is empty; drop --backend")
    if args.action == "list":
        entries = cache.entries(args.backend)
        now = time.time()
        for e in entries:
            meta = " ".join(f"{k}={v}" for k, v in sorted(e.meta.items()))
            print(f"{e.backend:<9} {e.key[:12]}  {_size(e.size):>10}  used {(now - e.last_used) / 3600:6.1f} h ago  "
                  f"{meta}")
        print(f"{counted(len(entries), 'entry', 'entries')}, {_size(sum(e.size for e in entries))} in {cache.compiled} "
              f"(cap {_size(cache.max_bytes)})" + ("" if cache.compiled.is_dir() else "; that folder does not exist"))
        legacy = {name: _legacy_size(cache.root / name, entry) for name, entry in LEGACY.items()}
        legacy = {name: n for name, n in legacy.items() if n}
        if legacy and not args.backend:
            print(f"also {_size(sum(legacy.values()))} in the cache folders of sdrt 0.1 ({', '.join(legacy)}), "
                  "which nothing reads any more: sdrt cache clear removes them")
        kept = {n: h for n, h in (derived.held(cache.root) if not args.backend else {}).items() if h.entries}
        if kept:
            print(f"also {_derived(kept)} in {cache.root}, made again when needed: sdrt cache clear removes them")
        return 0
    if args.action == "clear":
        done = cache.clear(args.backend)
        gone, foreign, failed = derived.clear(cache.root) if not args.backend else ({}, [], [])
        done.foreign.extend(foreign)
        where = cache.compiled / args.backend if args.backend else cache.compiled
        print(f"removed {counted(len(done.entries), 'entry', 'entries')} ({_size(sum(e.size for e in done.entries))}) from {where}"
              + (f", {len(done.leftovers)} leftovers of interrupted writes" if done.leftovers else "")
              + (f" and {counted(len(done.legacy), 'entry', 'entries')} of sdrt 0.1's caches" if done.legacy else "")
              + (f"; and {_derived(gone)} from {cache.root}" if gone else "")
              + ("" if cache.root.is_dir() else f"; {cache.root} does not exist"))
        if done.foreign:
            n = len(done.foreign)
            kind = "file" if all(p.is_file() for p in done.foreign) else "file or folder"
            kind = kind if n == 1 else kind.replace("file", "files").replace("folder", "folders")
            print(printable(f"left {n} {kind} sdrt did not write: {_files(done.foreign)}"))
        if failed:
            print(printable(f"could not remove {len(failed)} of sdrt's entries (this user cannot delete them): "
                            f"{_files(failed)}"))
        return 0
    cap = parse_size(args.max_size, "sdrt cache prune --max-size") if args.max_size else None
    cache.sweep()
    evicted = cache.prune(cap)
    left = cache.entries()
    print(f"evicted {len(evicted)} entries ({_size(sum(e.size for e in evicted))}); {len(left)} left, "
          f"{_size(sum(e.size for e in left))}")
    return 0
