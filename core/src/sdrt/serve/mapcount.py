"""A long-running server's memory maps, against the kernel's limit (Linux).

OpenVINO keeps 100-200 of the process's memory maps for each model it compiles and releases (docs/openvino.md,
"Memory maps in a long-running process"); a server that switches models hundreds of times, or is told to unload
and reload them, would reach ``vm.max_map_count`` (65530 by default), where every allocation and compile fails.
After each job the server counts its maps and warns once when they pass ``WARN_SHARE`` of the limit, naming what
to do, before anything fails.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("sdrt.serve")

#: warn when the maps pass this share of vm.max_map_count
WARN_SHARE = 0.75
_warned = False


def usage() -> tuple[int, int] | None:
    """(maps this process holds, the kernel's vm.max_map_count); None where either cannot be read (not Linux)."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as f:
            count = sum(1 for _ in f)
    except (OSError, ValueError):
        return None
    return count, limit


def check() -> bool:
    """Warn (once per process) when the maps pass ``WARN_SHARE`` of the limit; whether they have."""
    global _warned
    seen = usage()
    if seen is None or seen[0] < WARN_SHARE * seen[1]:
        return False
    if not _warned:
        _warned = True
        log.warning("this server holds %d memory maps of the kernel's limit of %d (vm.max_map_count): loading more "
                    "models may fail once it is reached; raise the limit (sudo sysctl -w vm.max_map_count=262144) or "
                    "restart the server (docs/openvino.md, \"Memory maps in a long-running process\")", *seen)
    return True
