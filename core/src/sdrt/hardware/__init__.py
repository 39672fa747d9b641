"""What this machine has, and which one sdrt plugin fits it.

>>> hw = sdrt.hardware.detect()          # probes once per process, then cached
>>> rec = sdrt.hardware.recommend(hw)
>>> rec.plugin, rec.reason

``detect()`` never raises because of one probe: each failure becomes a line
in ``hw.notes``. Probing (``probe*.py``) is kept apart from the pure
functions that parse (``parse.py``), assemble (``assemble.py``) and decide
(``recommend.py``).
"""

from __future__ import annotations

import logging
import os
import platform
import threading

from .model import CPU, Accelerator, Hardware, Recommendation
from .probe import DEFAULT_TIMEOUT, Context, Runner
from .recommend import PLUGINS, cannot_run_here, distribution, recommend

log = logging.getLogger("sdrt.hardware")

_cache: Hardware | None = None
_lock = threading.Lock()


def detect(*, refresh: bool = False) -> Hardware:
    """Probe this machine (once per process; ``refresh=True`` probes again)."""
    global _cache
    with _lock:
        if _cache is None or refresh:
            _cache = collect()
        return _cache


def collect(system: str | None = None, machine: str | None = None, root: str | os.PathLike[str] = "/",
            runner: Runner | None = None, timeout: float = DEFAULT_TIMEOUT) -> Hardware:
    """Probe without the cache. Tests pass a fixture ``root`` and a ``runner`` of captured outputs."""
    from . import assemble, parse

    system = system or platform.system()
    arch = parse.normalize_arch(machine or platform.machine())
    ctx = Context(root, runner, timeout)
    try:
        if system == "Linux":
            from . import probe_linux

            hw = assemble.linux(probe_linux.gather(ctx), arch)
        elif system == "Windows":
            from . import probe_windows

            hw = assemble.windows(probe_windows.gather(ctx), arch)
        elif system == "Darwin":
            from . import probe_macos

            hw = assemble.macos(probe_macos.gather(ctx), arch)
        else:
            hw = Hardware(os=system, arch=arch, cpu=CPU(arch=arch))
            ctx.note(f"no hardware probes for {system}; reporting the CPU architecture only")
    except Exception as exc:  # noqa: BLE001 - detection must always return something
        log.warning("hardware detection failed: %r", exc, exc_info=True)
        hw = Hardware(os=system, arch=arch, cpu=CPU(arch=arch))
        ctx.note(f"detection failed: {exc!r}")
    hw.notes.extend(ctx.notes)
    return hw


__all__ = ["CPU", "PLUGINS", "Accelerator", "Hardware", "Recommendation", "cannot_run_here", "collect", "detect", "distribution",
           "recommend"]
