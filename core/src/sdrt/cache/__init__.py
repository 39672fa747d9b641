"""sdrt's caches: where they live (``paths``), the compile cache every backend uses (``store``),
and the identity of a graph and its weights that compile cache keys are made of (``identity``).

``import sdrt.cache`` is light: ``identity`` is imported on first use.
"""

from __future__ import annotations

from .paths import DEFAULT_MAX_BYTES, cache_dir, cache_root, file_digest, make_key, max_bytes, parse_size, write_atomic
from .store import CompileCache, Entry, wait_for_stores

__all__ = ["DEFAULT_MAX_BYTES", "CompileCache", "Entry", "cache_dir", "cache_root", "file_digest", "make_key",
           "max_bytes", "parse_size", "wait_for_stores", "write_atomic"]
