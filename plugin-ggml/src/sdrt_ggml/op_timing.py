"""Where the time goes: per-node timing of a compiled session, summed by ggml op.

The session must be compiled with ``scheduler=True``: ggml's scheduler then
stops after every node and calls back, so each node is timed on its own
(this adds a small launch cost per node, so use it to rank ops, not to time
the whole graph).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from sdrt.errors import SdrtError

from .ops._common import ggml_lib


def time_ops(session: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[float, int]]:
    """Run once; return {ggml op description: (total milliseconds, node count)}, slowest first."""
    g = ggml_lib()
    sched = getattr(session, "_sched", None)
    if not sched:
        raise SdrtError("profiling needs a session compiled with scheduler=True", where="sdrt_ggml.op_timing.time_ops",
                        fix="sdrt.load(model, backend='ggml', scheduler=True)")
    totals: dict[str, list[float]] = {}
    last = [time.perf_counter()]

    def cb(t: Any, ask: bool, _user: Any) -> bool:
        if ask:
            return True
        now = time.perf_counter()
        desc = g.ggml_op_desc(t).decode()
        if desc == "CUSTOM":  # sdrt-ggml's native kernels name their tensors (sdrt_gemm, ...)
            name = (g.ggml_get_name(t) or b"").decode(errors="replace")
            desc = name if name.startswith("sdrt_") else desc
        entry = totals.setdefault(desc, [0.0, 0])
        entry[0] += (now - last[0]) * 1e3
        entry[1] += 1
        last[0] = now
        return True

    fn = g.ggml_backend_sched_eval_callback(cb)
    g.ggml_backend_sched_set_eval_callback(sched, fn, None)
    try:
        last[0] = time.perf_counter()
        session.run(feeds)
    finally:
        g.ggml_backend_sched_set_eval_callback(sched, g.ggml_backend_sched_eval_callback(0), None)
    return dict(sorted(((k, (v[0], int(v[1]))) for k, v in totals.items()), key=lambda kv: -kv[1][0]))
