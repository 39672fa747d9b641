"""macOS probes: ``system_profiler -json SPDisplaysDataType`` and ``sysctl``."""

from __future__ import annotations

from typing import Any

from . import parse
from .probe import Context

#: whole subtrees: a name macOS lacks (``hw.l3cachesize`` on Apple silicon) would fail the command, and every value
SYSCTL_KEYS = ("machdep.cpu", "hw")


def gather(ctx: Context) -> dict[str, Any]:
    displays = ctx.cmd("system_profiler", ["/usr/sbin/system_profiler", "-json", "SPDisplaysDataType"])
    sysctl = ctx.cmd("sysctl", ["/usr/sbin/sysctl", *SYSCTL_KEYS])
    return {
        "displays": parse.parse_system_profiler(displays) if displays else [],
        "sysctl": parse.parse_sysctl(sysctl) if sysctl else {},
    }
