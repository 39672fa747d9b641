"""The long property-based run of the ggml backend: random graphs in child processes.

    python scripts/ggml_fuzz.py [--graphs 20000] [--batch 50] [--out ggml-fuzz.jsonl]

Hypothesis draws batches of random graphs (``tests/plugins/ggml/fuzz_graphs.py``); each batch
runs on ggml in a child process and is compared with onnxruntime. Every finding (mismatch,
error, crash) is written with its graph to ``--out``; the counts are printed at the end.
``nox -s ggml_fuzz`` runs it. The reference is float32, so ggml runs at float32 too
(``SDRT_PRECISION=fp32``, as the test suite pins it) unless ``--precision`` names another.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "plugins" / "ggml"))

from fuzz_graphs import graph_plans, run_batch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--max-nodes", type=int, default=6)
    ap.add_argument("--out", default="ggml-fuzz.jsonl")
    ap.add_argument("--precision", default="fp32",
                    help="ggml's precision (default fp32: onnxruntime's float32 is the reference)")
    args = ap.parse_args()
    os.environ["SDRT_PRECISION"] = args.precision  # the child processes inherit it
    counts: collections.Counter[str] = collections.Counter()
    refused: collections.Counter[str] = collections.Counter()
    start = time.time()
    out = Path(args.out).open("w")

    @settings(max_examples=max(1, args.graphs // args.batch), deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.lists(graph_plans(args.max_nodes), min_size=args.batch, max_size=args.batch))
    def run(plans):  # type: ignore[no-untyped-def]
        for o in run_batch(plans):
            counts[o.status] += 1
            if o.status == "refused":
                why = re.search(r"cannot lower this node \((.*?)\)[:.]|cannot run this graph.*?: ([^.]*)", o.detail)
                refused[next((g for g in why.groups() if g), "") if why else o.detail[:60]] += 1
            if o.status in ("mismatch", "error", "crash"):
                out.write(json.dumps({"status": o.status, "detail": o.detail, "graph": o.plan.describe()}) + "\n")
                out.flush()
        total = sum(counts.values())
        print(f"{total} graphs in {time.time() - start:.0f} s: {dict(counts)}", flush=True)

    run()
    print("refusals:", dict(refused.most_common(15)))
    return 1 if any(counts[k] for k in ("mismatch", "error", "crash")) else 0


if __name__ == "__main__":
    raise SystemExit(main())
