"""``python -m bench.update_weights``: ``Session.update_weights`` against a full reload, per backend.

For each model it writes the weight-stripped graph and two weight files (the
model's own and a perturbed copy, as a LoRA swap would produce), then times,
interleaved:

- ``update``: ``session.update_weights(Weights.open(other))`` on a live session;
- ``reload``: ``sdrt.load(graph, weights=other)`` from scratch (parse, convert,
  compile; compile caches are turned off where the backend has the ``cache`` option).

It checks that both give the same outputs and prints the medians and the speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from sdrt.testing import models

from . import harness


def _perturbed(weights: Any, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in weights:
        arr = np.asarray(weights[name])
        if arr.dtype.kind == "f" and arr.ndim >= 2 and not name.startswith("onnx::"):  # weights, not masks
            arr = (arr * (1 + 0.01 * rng.standard_normal(arr.shape)).astype(arr.dtype)).astype(arr.dtype)
        out[name] = arr
    return out


def measure(name: str, size: str, backend: str, rounds: int, options: dict[str, Any]) -> dict[str, Any]:
    import sdrt
    from sdrt.weights import Weights

    model, feeds = models.build(name, size)
    with tempfile.TemporaryDirectory(prefix="sdrt-uw-") as tmp:
        full = Path(tmp) / f"{name}.onnx"
        full.write_bytes(model.SerializeToString())
        graph = Path(tmp) / f"{name}.stripped.onnx"
        sdrt.Graph.load(full).strip(graph)
        del model
        own = Weights.open(graph.with_suffix(".safetensors"))
        files = []
        for i in range(2):
            path = Path(tmp) / f"other{i}.safetensors"
            Weights.from_arrays(_perturbed(own, seed=i)).save(path)
            files.append(path)
        reload_opts = dict(options)
        if backend == "openvino":  # a compiled-model cache hit would not be a full reload
            reload_opts["cache"] = False
        session = sdrt.load(graph, backend=backend, **options)
        session.run(feeds)
        t_update, t_reload, t_default = [], [], []
        def update(path: Path) -> dict[str, np.ndarray]:
            t0 = time.perf_counter()
            session.update_weights(Weights.open(path))
            t_update.append(time.perf_counter() - t0)
            return session.run(feeds)

        def reload(path: Path) -> dict[str, np.ndarray]:
            t0 = time.perf_counter()
            fresh = sdrt.load(graph, weights=path, backend=backend, **reload_opts)
            t_reload.append(time.perf_counter() - t0)
            out = fresh.run(feeds)
            fresh.close()
            return out

        for r in range(rounds):
            path = files[r % 2]
            if r % 2:  # alternate which goes first: the first to map a file pays its page faults
                out_reload, out_update = reload(path), update(path)
            else:
                out_update, out_reload = update(path), reload(path)
            if backend == "openvino":  # the default load: new weights miss the cache, so compile + store
                t0 = time.perf_counter()
                sdrt.load(graph, weights=path, backend=backend, cache_dir=str(Path(tmp) / f"cache{r}"),
                          **options).close()
                t_default.append(time.perf_counter() - t0)
            err = harness.max_rel_err(list(out_update.values()), list(out_reload.values()))
            if err > 1e-5:
                raise SystemExit(f"{name}: update_weights and a full reload disagree (max rel err {err:.2e})")
        session.close()
    up, re_ = statistics.median(t_update), statistics.median(t_reload)
    default = statistics.median(t_default) if t_default else None
    return {"model": name, "backend": backend, "update_s": up, "reload_s": re_, "speedup": re_ / up,
            "reload_cached_s": default, "rounds": rounds, "update_all_s": t_update, "reload_all_s": t_reload}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.update_weights", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="unet,text_encoder,vae_decoder,mobilenet_v2")
    p.add_argument("--size", default="bench", choices=["tiny", "bench", "full"])
    p.add_argument("--backends", default="openvino")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    print(f"{'model':<14} {'backend':<10} {'update_weights s':>17} {'reload, no cache s':>19} {'speed-up':>9} "
          f"{'reload, cache miss+store s':>27} {'speed-up':>9}")
    for backend in args.backends.split(","):
        for name in args.models.split(","):
            r = measure(name, args.size, backend, args.rounds, {"device": "CPU"} if backend == "openvino" else {})
            d = r["reload_cached_s"]
            cached = "-" if d is None else f"{d:.3f}"
            cached_x = "-" if d is None else f"{d / r['update_s']:.2f}x"
            print(f"{r['model']:<14} {r['backend']:<10} {r['update_s']:>17.3f} {r['reload_s']:>19.3f} "
                  f"{r['speedup']:>8.2f}x {cached:>27} {cached_x:>9}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
