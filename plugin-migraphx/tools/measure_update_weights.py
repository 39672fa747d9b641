"""Time how the MIGraphX backend swaps weights: ``update_weights`` (a recompile, or a cache hit) against a load.

    PYTHONPATH=/path/to/migraphx/build/lib python plugin-migraphx/tools/measure_update_weights.py \
        --models unet,text_encoder --size tiny --device ref

For each model (from ``bench.models``; run from the repository root) it builds
the graph, a perturbed copy of its weights, and times, with a fresh cache folder:

- ``load, no cache``: ``backend.compile(graph, weights, cache=False)`` (write, parse, quantize, compile);
- ``update, miss``: ``session.update_weights`` with weights the cache has not seen (recompile and store);
- ``update, hit``: ``session.update_weights`` back to weights seen before (one ``migraphx.load``);
- ``load, hit``: ``backend.compile`` of weights the cache has (one ``migraphx.load``).

It checks that every path gives the same outputs as onnxruntime with those weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository root, for bench.models

def _perturbed(arrays: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, arr in arrays.items():
        if arr.dtype.kind == "f" and arr.ndim >= 2:
            arr = (arr * (1 + 0.01 * rng.standard_normal(arr.shape))).astype(arr.dtype)
        out[name] = arr
    return out


def _ort(model, arrays: dict, feeds: dict) -> list:
    import onnxruntime as ort
    from onnx import numpy_helper

    m = type(model)()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(arrays[t.name], t.name))
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def measure(name: str, size: str, device_id: str, rounds: int) -> dict:
    import sdrt
    from bench import models
    from sdrt.weights import Weights
    from sdrt_migraphx import MIGraphXBackend

    backend = MIGraphXBackend()
    device = next(d for d in backend.devices() if d.id == device_id)
    model, feeds = models.build(name, size)
    graph = sdrt.Graph.load(model.SerializeToString())
    own = graph.initializer_arrays()
    times: dict[str, list[float]] = {"load, no cache": [], "update, miss": [], "update, hit": [], "load, hit": []}
    worst = 0.0

    def check(out: dict, arrays: dict) -> None:
        nonlocal worst
        for got, want in zip(out.values(), _ort(model, arrays, feeds)):
            worst = max(worst, float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12)))

    mxr = 0
    for r in range(rounds):
        with tempfile.TemporaryDirectory(prefix="sdrt-mx-uw-") as cache:
            other = _perturbed(own, seed=r + 1)
            t0 = time.perf_counter()
            backend.compile(graph, None, device, cache=False).close()
            t1 = time.perf_counter()
            session = backend.compile(graph, None, device, cache_dir=cache)
            t2 = time.perf_counter()
            session.update_weights(Weights.from_arrays(other))
            t3 = time.perf_counter()
            check(session.run(feeds), other)
            t4 = time.perf_counter()
            session.update_weights(Weights.from_arrays(own))
            t5 = time.perf_counter()
            check(session.run(feeds), own)
            t6 = time.perf_counter()
            again = backend.compile(graph, Weights.from_arrays(other), device, cache_dir=cache)
            t7 = time.perf_counter()
            check(again.run(feeds), other)
            for key, t in (("load, no cache", t1 - t0), ("update, miss", t3 - t2), ("update, hit", t5 - t4),
                           ("load, hit", t7 - t6)):
                times[key].append(t)
            mxr = sum(p.stat().st_size for p in (Path(cache) / "migraphx").glob("*.mxr"))
    weights_mb = sum(a.nbytes for a in own.values()) / 2**20
    return {"model": name, "weights_mb": weights_mb, "mxr_mb": mxr / 2**20 / 2, "worst_rel_err": worst,
            **{k: statistics.median(v) for k, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="unet,text_encoder,vae_decoder")
    p.add_argument("--size", default="tiny", choices=["tiny", "bench", "full"])
    p.add_argument("--device", default="ref")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    cols = ["load, no cache", "update, miss", "update, hit", "load, hit"]
    print(f"{'model':<13} {'weights MB':>10} {'.mxr MB':>8} " + " ".join(f"{c + ' s':>16}" for c in cols)
          + f" {'max rel err':>12}")
    for name in args.models.split(","):
        r = measure(name, args.size, args.device, args.rounds)
        print(f"{r['model']:<13} {r['weights_mb']:>10.1f} {r['mxr_mb']:>8.1f} "
              + " ".join(f"{r[c]:>16.3f}" for c in cols) + f" {r['worst_rel_err']:>12.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
