"""Where the first image's time and memory go: one sdrt-openvino pipeline run, per phase (a lab tool).

    SDRT_CACHE_DIR=$(mktemp -d) python -m bench.e2e_phases [--model DIR] [--size 256]   # cold, then warm
    SDRT_CACHE_DIR=<the same> python -m bench.e2e_phases                                # a warm cache

Wraps the phases of loading and compiling (Graph.load, with_shapes, fold_constants, the cache key, lookup
and store, resolve_weights, the conversion and binding of weights, OpenVINO's compile_model, import_model
and export_model, the release of mapped pages) and samples the process's RSS every 50 ms; prints each
phase nested under its caller (a phase on another thread than the main one names it), with its seconds, RSS at its start and end, and the highest RSS sampled
inside it, then ``VmHWM``. The same prompt, negative prompt, CFG 7 and 4 Euler steps as ``bench.e2e``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

T0 = time.perf_counter()
samples: list[tuple[float, int]] = []
events: list[tuple[str, int, float, float, str]] = []
_depth = threading.local()  # per thread: a part compiled ahead nests under its own thread (sdrt.pipelines.ahead)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _sample() -> None:
    while True:
        samples.append((time.perf_counter(), _rss()))
        time.sleep(0.05)


def wrap(owner: Any, attr: str, label: str) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*a: Any, **k: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            _depth.n = depth
            events.append((label, depth, t0, time.perf_counter(), threading.current_thread().name))

    setattr(owner, attr, timed)


def instrument() -> None:
    import openvino as ov

    import sdrt_openvino.backend as ob
    import sdrt_openvino.bf16 as o16
    import sdrt_openvino.convert as oc
    from sdrt import backend as sb
    from sdrt.cache import store as cstore
    from sdrt.graph import Graph
    from sdrt.pipelines import parts
    from sdrt.weights import pages
    from sdrt.weights import resolve as wres

    for owner, attr, label in [
        (Graph, "load", "Graph.load"), (Graph, "with_shapes", "Graph.with_shapes"),
        (Graph, "fold_constants", "Graph.fold_constants"), (parts.Part, "session", "Part.session"),
        (parts.Part, "run", "Part.run"), (sb.Backend, "compile", "Backend.compile"),
        (sb.Backend, "cache_key", "cache key"), (cstore.CompileCache, "lookup", "cache lookup"),
        (cstore.CompileCache, "store", "cache store"), (wres, "resolve_weights", "resolve_weights"),
        (ob.OpenVINOBackend, "_compile", "openvino _compile"), (ob.OpenVINOBackend, "_save", "openvino _save"),
        (ob.OpenVINOBackend, "_load", "openvino _load"), (oc, "read", "convert.read"), (oc, "half_weights", "convert.half_weights"),
        (o16, "twin", "bf16.twin"), (ob.OpenVINOBackend, "_save_twin", "openvino _save_twin"),
        (oc, "bind_parameters", "bind weights as Constants"), (ov.Core, "read_model", "ov read_model"),
        (ov.Core, "compile_model", "ov compile_model"), (ov.Core, "import_model", "ov import_model"),
        (ov.CompiledModel, "export_model", "ov export_model"), (pages, "release", "release mapped pages"),
        (ob, "release_read_pages", "release blob pages"),
    ]:
        wrap(owner, attr, label)
    ob.release_pages = pages.release  # the backend's own name for it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("SDRT_E2E_MODEL", "/work/models/sd15-full")))
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--save", type=Path, help="write the first image's pixels here (.npy), to compare runs")
    args = ap.parse_args()
    from bench.e2e import CFG, NEGATIVE, PROMPT, SEED

    threading.Thread(target=_sample, daemon=True).start()
    instrument()
    from sdrt import pipelines

    t = time.perf_counter()
    pipe = pipelines.load(args.model / "onnx", backend="openvino", **json.loads(os.environ.get("SDRT_E2E_OPTIONS", "{}")))
    events.append(("pipelines.load", 0, t, time.perf_counter(), "MainThread"))
    for name in ("first image", "warm image"):
        t = time.perf_counter()
        out = pipe.generate(PROMPT, NEGATIVE, steps=args.steps, cfg=CFG, sampler="Euler", seed=SEED,
                            width=args.size, height=args.size)
        events.append((name, 0, t, time.perf_counter(), "MainThread"))
        if args.save and name == "first image":
            import numpy as np

            np.save(args.save, np.asarray(out.images[0]))
    from sdrt.cache import wait_for_stores

    t = time.perf_counter()
    wait_for_stores()  # the entries held until the first job ended (sdrt.cache.deferred)
    events.append(("cache stores after the jobs", 0, t, time.perf_counter(), "MainThread"))
    gib = 2.0 ** 30

    def at(t: float) -> int:
        before = [r for ts, r in samples if ts <= t]
        return before[-1] if before else 0

    for label, depth, t0, t1, thread in sorted(events, key=lambda e: (e[2], e[1])):
        inside = [r for ts, r in samples if t0 <= ts <= t1]
        peak = max(inside) if inside else max(at(t0), at(t1))
        mark = "" if thread == "MainThread" else f" [{thread}]"
        print(f"{t0 - T0:7.1f} {'  ' * depth}{label + mark:34s} {t1 - t0:7.2f} s  RSS {at(t0) / gib:5.2f} -> "
              f"{at(t1) / gib:5.2f}, peak {peak / gib:5.2f} GiB")
    with open("/proc/self/status") as f:
        print(next(line.strip() for line in f if line.startswith("VmHWM")))


if __name__ == "__main__":
    main()
