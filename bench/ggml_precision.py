"""sdrt-ggml at fp32, bf16 and fp16 against onnxruntime float32, interleaved in one run.

    python -m bench.ggml_precision                              # the bench UNet, 5 rounds
    python -m bench.ggml_precision --models unet,flux_single --rounds 3

Each round times every contender once (the median of 3 calls after one warm-up call), in turn, so all
see the same machine load; the table has each contender's median over rounds, its ratio to onnxruntime,
its weight bytes (``GgmlSession.weight_bytes``: ggml's tensors; onnxruntime: the graph's initializers)
and its largest error against onnxruntime relative to the output's largest magnitude.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np


def _time(fn: Any, calls: int = 3) -> float:
    best = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ggml_precision", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="unet")
    p.add_argument("--size", default="bench")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--precisions", default="fp32,bf16,fp16")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)

    import onnxruntime as ort

    from sdrt.graph import Graph
    from sdrt.precision_default import cpu_flags
    from sdrt.testing import models
    from sdrt_ggml import GgmlBackend

    be = GgmlBackend()
    cpu = next(d for d in be.devices() if d.kind == "cpu")
    isa = sorted(f for f in cpu_flags() if f.startswith(("avx512_bf16", "amx", "avx2", "f16c")))
    print(f"device {cpu.name}; flags {' '.join(isa)}; load average {os.getloadavg()[0]:.1f}; threads {a.threads}")
    for name in a.models.split(","):
        model, feeds = models.build(name, a.size)
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
        init_bytes = sum(np.prod(i.dims, dtype=np.int64) * 4 for i in model.graph.initializer if i.data_type == 1)
        runs: dict[str, Any] = {"onnxruntime fp32": lambda s=sess, f=feeds: s.run(None, f)}
        info: dict[str, tuple[int, float]] = {"onnxruntime fp32": (int(init_bytes), 0.0)}
        sessions = []
        for prec in a.precisions.split(","):
            s = be.compile(Graph(model), None, cpu, precision=prec, threads=a.threads)
            sessions.append(s)
            out = s.run(feeds)
            err = max(float(np.abs(np.asarray(out[o.name], np.float64) - r).max() / (np.abs(r).max() or 1.0))
                      for o, r in zip(sess.get_outputs(), ref))
            info[f"ggml {prec}"] = (s.weight_bytes(), err)
            runs[f"ggml {prec}"] = lambda s=s, f=feeds: s.run(f)
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(a.rounds):
            for k, fn in runs.items():
                fn()
                times[k].append(_time(fn))
        base = statistics.median(times["onnxruntime fp32"])
        print(f"\n{name} ({a.size}), {a.rounds} rounds, load average now {os.getloadavg()[0]:.1f}")
        print(f"{'contender':<18} {'median ms':>10} {'x ort':>6} {'weights MB':>11} {'max rel err':>12}")
        for k, ts in times.items():
            med = statistics.median(ts)
            wb, err = info[k]
            print(f"{k:<18} {med * 1e3:>10.1f} {med / base:>6.2f} {wb / 1e6:>11.2f} {err:>12.2e}")
        for s in sessions:
            s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
