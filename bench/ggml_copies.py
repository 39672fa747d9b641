"""Where sdrt-ggml moves data: copy bytes per model, and the per-op profile.

    python -m bench.ggml_copies                        # bench-size models, counts only
    python -m bench.ggml_copies --profile --runs 5     # and the per-op time shares
    python -m bench.ggml_copies --models unet --option conv_impl=rowcopy

For each model the session is compiled (``scheduler=True`` when profiling) and the
computed ggml graph is walked after lowering: every node whose op only moves data
(``CONT``, ``CPY``, ``SET``, ``DUP``, and ``CONCAT``/``PAD``/``REPEAT``, which write a
new tensor from parts of others; and sdrt-ggml's own ``sdrt_copy``, ``sdrt_concat`` and
``sdrt_upscale`` ops, which replace ggml's ``CONT``, ``CONCAT`` and ``UPSCALE`` on the CPU) is
counted with the bytes it writes. With
``--profile`` each op's share of the run comes from ``sdrt_ggml.op_timing.time_ops``
(the sum over ``--runs`` runs; the per-node callback adds a little to every node, so
this ranks ops rather than timing the whole graph).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sdrt.testing import models

from . import harness
from .__main__ import _default_workdir, _parse_options

#: ops that only copy: their whole output is written from data already in memory
COPY_OPS = ("CONT", "CPY", "SET", "DUP", "sdrt_copy")
#: ops that assemble a new tensor from parts (also pure data movement)
ASSEMBLY_OPS = ("CONCAT", "PAD", "REPEAT", "sdrt_concat", "sdrt_upscale")


def graph_copies(session: Any) -> dict[str, tuple[int, int]]:
    """{ggml op name: (nodes, bytes written)} for the copy ops of a compiled session's graph."""
    from sdrt_ggml.ops._common import ggml_lib

    g = ggml_lib()
    graph = session._graph
    out: dict[str, list[int]] = {}
    for i in range(g.ggml_graph_n_nodes(graph)):
        node = g.ggml_graph_node(graph, i)
        op = g.ggml_op_name(node.contents.op).decode()
        if op == "CUSTOM":  # sdrt-ggml's ops go by their tensor's name
            op = (g.ggml_get_name(node) or b"").decode()
        if op in COPY_OPS + ASSEMBLY_OPS:
            entry = out.setdefault(op, [0, 0])
            entry[0] += 1
            # SET and CPY write their source's bytes into (a view of) the destination
            src = node.contents.src[1] if op in ("SET", "CPY") else None
            entry[1] += int(g.ggml_nbytes(src if src else node))
    return {k: (v[0], v[1]) for k, v in out.items()}


def profile(session: Any, feeds: dict[str, Any], runs: int) -> dict[str, float]:
    """{ggml op: share of the run}, summed over ``runs`` runs."""
    from sdrt_ggml.op_timing import time_ops

    session.run(feeds)  # warm-up
    totals: dict[str, float] = {}
    for _ in range(runs):
        for op, (ms, _n) in time_ops(session, feeds).items():
            totals[op] = totals.get(op, 0.0) + ms
    whole = sum(totals.values()) or 1.0
    return {k: v / whole for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ggml_copies", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(models.MODELS))
    p.add_argument("--size", default="bench", choices=["tiny", "bench", "full"])
    p.add_argument("--profile", action="store_true", help="also print each op's share of the run")
    p.add_argument("--runs", type=int, default=3, help="profiled runs, summed")
    p.add_argument("--top", type=int, default=10, help="ops listed per profile")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a ggml compile option")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)

    options = _parse_options([f"ggml:{o}" for o in args.option]).get("ggml", {})
    workdir = args.workdir or _default_workdir()
    report: dict[str, Any] = {}
    for name in args.models.split(","):
        path, feeds, _outputs = harness.model_file(name, args.size, workdir)
        session = harness.load_for_timing(path, backend="ggml", **options, **({"scheduler": True} if args.profile else {}))
        try:
            copies = graph_copies(session)
            shares = profile(session, feeds, args.runs) if args.profile else {}
        finally:
            session.close()
        total = sum(b for op, (_n, b) in copies.items() if op in COPY_OPS)
        assembled = sum(b for op, (_n, b) in copies.items() if op in ASSEMBLY_OPS)
        print(f"\n{name} ({args.size}): copies {total / 2**20:.1f} MiB, assembly {assembled / 2**20:.1f} MiB")
        for op, (n, b) in sorted(copies.items(), key=lambda kv: -kv[1][1]):
            print(f"  {op:8s} {n:5d} nodes {b / 2**20:9.2f} MiB")
        if shares:
            print("  profile: " + ", ".join(f"{op} {s:.1%}" for op, s in list(shares.items())[:args.top]))
        report[name] = {"copies": {op: {"nodes": n, "bytes": b} for op, (n, b) in copies.items()},
                        "copy_bytes": total, "assembly_bytes": assembled, "profile": shares}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
