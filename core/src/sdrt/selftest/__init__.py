"""``sdrt selftest``: prove each installed backend on this machine, and report it.

For every installed backend and device (or the ones named) a child process
runs four groups of checks (``checks.py``): conformance on the ops that SD
models use, model accuracy and speed on small SD-style models built in
memory, features (compile cache, ``update_weights``, ahead-of-time builds),
and one short end-to-end generation with the embedded model. A backend that
crashes or hangs takes down only its child; the report records it and the
other backends still run.

>>> report = sdrt.selftest.run(quick=True)        # the same data as ``sdrt selftest --report r.json``
>>> report["passed"], [b["status"] for b in report["backends"]]

The report (``report.py``) carries the machine and versions but nothing
personal: no user or host name, and no path outside sdrt's cache.
"""

from __future__ import annotations

from .report import SCHEMA, render_markdown, render_text
from .runner import run

__all__ = ["SCHEMA", "render_markdown", "render_text", "run"]
