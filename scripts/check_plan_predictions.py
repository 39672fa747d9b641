"""Predicted against measured time per call and peak memory, on this machine, for each bench model and
for the parts of SD 1.x and SDXL pipelines at two sizes (docs/plan.md records the figures).

Run after `sdrt selftest --calibrate`:

    python scripts/check_plan_predictions.py [--backend openvino --backend ggml] [--repeats 9] [--passes 2] [--json out.json]
    python scripts/check_plan_predictions.py --backend ggml --device CUDA0 ...   # on a GPU (after --calibrate --device)

Each measurement compiles the part in a child process (sdrt.cost.calibrate.measure), a part with
dynamic dims pinned to its call's shapes on every backend (as a pipeline compiles it and `sdrt plan`
costs it), runs it
``repeats`` times after two warm-ups and keeps the median over groups of 3 runs of each group's best
(as the calibration does; the plain median is printed too); every row is measured in ``passes`` passes
over all the rows, and the pass with the lower robust time is kept (as the calibration does); its peak memory is the child process's
whole peak resident memory (VmHWM), against the prediction with the calibrated runtime base, and,
the stricter figure, both less what the process held after importing sdrt ("over imports"). The machine may be shared: the medians say so.
With ``--device`` (a backend's device id, as `sdrt info` lists it) the parts run there and are predicted on its library
spec (``sdrt.cost.devices.for_runtime``); on a GPU the memory figures are the GPU's memory in use
(``Backend.memory_in_use``): the whole figure against the prediction, and "over imports" both less what was in use
before the part was compiled (the device runtime's context).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: the full-size SD 1.5 (ONNX, fp32 weights) that the SD 1.x rows run; --sd15 names another copy
SD15 = Path("/work/models/sd15-full/onnx")
#: the full-size SDXL base (ONNX, fp32 weights, scripts/make_sdxl_full.py) for the SDXL rows; --sdxl names another copy
SDXL = Path("/work/models/sdxl-full")
#: the sizes its rows run at (SDXL's own 1024 px costs a minute a UNet call at fp32 on 2 cores; --sdxl-size)
SDXL_SIZES = [512, 768]
#: the bench models of bench/models.py that the check runs (the DiT blocks are left out: seconds per call)
BENCH = ("vae_decoder", "unet", "text_encoder", "mobilenet_v3", "mobilenet_v2")
#: the precision that the calibration and the check both pin (--precision bf16: sdrt's default on a CPU with bf16
#: dot products, which `sdrt selftest --calibrate` measures there too)
PRECISION = "fp32"
sys.path.insert(0, str(ROOT))


def feeds_for(graph, shapes):
    rng = np.random.default_rng(0)
    out = {}
    for i in graph.inputs:
        shape = shapes.get(i.name) or tuple(i.shape)
        if i.dtype.startswith("int"):
            out[i.name] = np.full(shape, 7, dtype=i.dtype)
        elif "timestep" in i.name:
            out[i.name] = np.full(shape, 500, dtype=i.dtype)
        else:
            out[i.name] = rng.standard_normal(shape).astype(i.dtype)
    return out


def cases(workdir: Path):
    """(label, path, shapes, calls per image or None) for each bench model and pipeline part."""
    from sdrt.cost.planner import plan_parts
    from sdrt.testing import models

    for name in BENCH:
        model, feeds = models.build(name, "bench")
        path = workdir / f"{name}-bench.onnx"
        path.write_bytes(model.SerializeToString())
        yield "bench", name, path, {k: v.shape for k, v in feeds.items()}, None
    for label, folder, sizes in [("SD 1.5", SD15, [128, 256]), ("SDXL", SDXL, SDXL_SIZES),
                                 ("SDXL tiny-dyn", ROOT / "tests/data/pipelines/tiny-sdxl-dyn", [256, 512])]:
        if not (folder / "model_index.json").is_file():
            print(f"skipping {label}: no model folder at {folder}", flush=True)
            continue
        for size in sizes:
            _, parts, _ = plan_parts(folder, width=size, height=size, steps=4)
            for p in parts:
                shapes, _ = max(p.signatures, key=lambda s: s[1])
                yield f"{label} {size}px", p.name, p.path, shapes, p.calls


def main(argv=None) -> int:
    global SD15, SDXL, SDXL_SIZES, PRECISION
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", action="append", default=[])
    ap.add_argument("--device", default=None, help="run on this device id of the backends (default: their choice, "
                                                   "the CPU here)")
    ap.add_argument("--spec", default=None, help="with --from-json: predict on this library device (the rows' GPU)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--passes", type=int, default=2,
                    help="measure every row in this many passes over all the rows and keep the faster (default 2)")
    ap.add_argument("--budget", type=float, default=8.0,
                    help="seconds of timed runs for a part whose call takes over a second (default 8)")
    ap.add_argument("--json")
    ap.add_argument("--sd15", type=Path, default=SD15, help="a full-size SD 1.5 ONNX folder for the SD 1.x rows")
    ap.add_argument("--sdxl", type=Path, default=SDXL, help="a full-size SDXL ONNX folder for the SDXL rows")
    ap.add_argument("--sdxl-size", type=int, action="append", default=[],
                    help=f"a size of the SDXL rows (default {SDXL_SIZES[0]} and {SDXL_SIZES[1]})")
    ap.add_argument("--group", action="append", default=[], help="only cases whose group starts with this")
    ap.add_argument("--part", action="append", default=[], help="only parts with this name (e.g. unet)")
    ap.add_argument("--from-json", type=Path,
                    help="measure nothing: re-predict the rows of a JSON this script wrote (their measured figures kept) "
                         "with this code and the stored calibration")
    ap.add_argument("--precision", default=PRECISION,
                    help="the precision to pin and predict (default fp32, as `sdrt selftest --calibrate` measures; "
                         "another one is predicted from its own calibration where one is stored, else from fp32's)")
    args = ap.parse_args(argv)
    SD15, SDXL = args.sd15, args.sdxl
    SDXL_SIZES = args.sdxl_size or SDXL_SIZES
    PRECISION = args.precision
    from sdrt.cost.calibrate import features, measure, quiet_for
    from sdrt.cost.devices import for_runtime, this_cpu
    from sdrt.cost.model import activation_scale, copies_heads, factors_for, load_calibration, predict
    from sdrt.cost.nodes import graph_costs
    from sdrt.graph import Graph

    cpu = this_cpu()
    if args.device and len(args.backend) != 1:
        ap.error("--device names one backend's device: pass that backend with --backend (one)")
    if args.spec and not args.from_json:
        ap.error("--spec predicts stored rows (--from-json) on a library device; to measure, pass --device")
    if args.spec:  # re-predicting stored rows of another machine's device
        from sdrt.cost.devices import find

        cpu = find(args.spec)
    elif args.device:  # the library spec of the backends' device (one device id for all of them)
        from sdrt.runtime import select

        cpu = for_runtime(select(args.backend[0], args.device)[1])
        print(f"device {args.device}: {cpu.name}", flush=True)
    cal = load_calibration()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sdrt-check-plan-") as tmp:
        todo = []
        for group, name, path, shapes, calls in cases(Path(tmp)):
            if args.group and not any(group.startswith(x) for x in args.group):
                continue
            if args.part and name not in args.part:
                continue
            g = Graph.load(path, load_external=False)
            # a graph with dynamic dims is pinned to the call's shapes, measured and predicted, as a pipeline
            # compiles its parts (Part.session) and `sdrt plan` costs them (cost_parts), whatever the backend
            pin = {k: tuple(int(x) for x in v) for k, v in shapes.items()} if any(
                not isinstance(d, int) for i in g.inputs for d in i.shape) else None
            cost = graph_costs(g.with_shapes(pin), None, PRECISION, inferred=True) if pin else graph_costs(
                g, shapes, PRECISION)
            todo.append((group, name, path, pin, calls, cost, feeds_for(g, shapes)))
        best: dict[tuple[str, str, str], dict] = {}
        stored = {(r["group"], r["part"], r["backend"]): r for r in json.loads(args.from_json.read_text())
                  if "robust_ms" in r} if args.from_json else None
        for p in range(1 if stored is not None else max(1, args.passes)):
            for group, name, path, pin, calls, cost, feeds in todo:
                for be in args.backend or ["openvino", "ggml"]:
                    key = (group, name, be)
                    pass_no = p + 1
                    if stored is not None:  # the stored row's measurement, re-predicted
                        if key not in stored:
                            continue
                        o = stored[key]
                        m = {"robust_ms": o["robust_ms"], "median_ms": o["measured_ms"], "times_ms": o["times_ms"],
                             "peak_rss": o["measured_process_peak"], "peak_bytes": o["measured_peak"],
                             "compile_peak_rss": o.get("measured_compile_peak"), "memory": o.get("memory") or "process",
                             "placement": o.get("placement"), "host_peak_rss": o.get("host_peak_rss"),
                             "run_peak_rss": o.get("measured_run_peak"), "compiled_rss": o.get("measured_compiled"),
                             "busy_before": o.get("busy_before"), "slow_before": o.get("slow_before")}
                        pass_no = o.get("pass", 1)
                    else:
                        try:
                            m = measure(path, feeds, be, repeats=args.repeats, options={"precision": PRECISION},
                                        budget_s=args.budget, shapes=pin, device=args.device,
                                        quiet_s=quiet_for(cpu))
                        except Exception as exc:  # noqa: BLE001 - report it, keep going
                            best.setdefault(key, {"group": group, "part": name, "backend": be,
                                                  "error": str(exc)[-300:]})
                            print(f"{group:<18} {name:<16} {be:<9} ERROR {str(exc)[-200:]}", flush=True)
                            continue
                    m["pass"] = pass_no
                    old = best.get(key)
                    if old is not None and "robust_ms" in old and old["robust_ms"] <= m["robust_ms"]:
                        old["pass_ms"].append(m["robust_ms"])
                        print(f"{group:<18} {name:<16} {be:<9} pass {pass_no}: {m['robust_ms']:9.2f} ms (kept "
                              f"{old['robust_ms']:.2f})", flush=True)
                        continue
                    f = factors_for(be, cpu, PRECISION, cal)
                    pr = predict(cost, cpu, be, PRECISION, f, pinned=pin is not None)
                    r = {"group": group, "part": name, "backend": be, "calls_per_image": calls, "pass": pass_no,
                         "pass_ms": (old or {}).get("pass_ms", []) + [m["robust_ms"]],
                         "predicted_ms": pr.ms, "measured_ms": m["median_ms"], "min_ms": min(m["times_ms"]),
                         "robust_ms": m["robust_ms"], "times_ms": m["times_ms"], "time_ratio": pr.ms / m["robust_ms"],
                         "median_ratio": pr.ms / m["median_ms"],
                         # process: the child's whole peak (VmHWM) against the prediction with the runtime base;
                         # over imports: both less what the process held after importing sdrt (the stricter ratio)
                         "predicted_process_peak": pr.peak_bytes, "measured_process_peak": m["peak_rss"],
                         "peak_ratio": pr.peak_bytes / max(m["peak_rss"], 1),
                         "predicted_peak": pr.peak_bytes - f.imports_bytes, "measured_peak": m["peak_bytes"],
                         "peak_ratio_over_imports": (pr.peak_bytes - f.imports_bytes) / max(m["peak_bytes"], 1),
                         # the two phases (where the child could reset its peak): compiling, then the runs
                         "predicted_compile_peak": pr.compile_peak_bytes, "predicted_run_peak": pr.run_peak_bytes,
                         "measured_compile_peak": m.get("compile_peak_rss"), "measured_run_peak": m.get("run_peak_rss"),
                         "measured_compiled": m.get("compiled_rss"), "memory": m.get("memory", "process"),
                         "host_peak_rss": m.get("host_peak_rss"), "placement": m.get("placement"),
                         "gflop": cost.flops / 1e9, "busy_before": m.get("busy_before"),
                         "slow_before": m.get("slow_before"), "weight_bytes": cost.weight_bytes,
                         "activation_bytes": cost.peak_activation_bytes, "by_class_ms": pr.by_class_ms,
                         "features": features(cost, cpu.peak(PRECISION), f.bandwidth_bytes_per_s or cpu.bandwidth_bytes_per_s,
                                              act_scale=activation_scale(PRECISION, f), tail32=f.float32_tail,
                                              transfers=f.host_transfers, dense_heads=copies_heads(be, cpu.kind),
                                              cache_bytes=(f.stream_cache_bytes or cpu.cache_bytes)
                                              if cpu.kind == "cpu" else 0)}
                    best[key] = r
                    print(f"{group:<18} {name:<16} {be:<9} pred {pr.ms:9.2f} ms  meas {m['median_ms']:9.2f} ms "
                          f"(robust {r['robust_ms']:8.2f})  x{r['time_ratio']:.2f}   process peak pred {pr.peak_bytes / 2**20:7.0f} MiB "
                          f"meas {m['peak_rss'] / 2**20:7.0f} MiB  x{r['peak_ratio']:.2f}  over imports "
                          f"{r['predicted_peak'] / 2**20:7.0f}/{m['peak_bytes'] / 2**20:7.0f} MiB "
                          f"x{r['peak_ratio_over_imports']:.2f}  pass {pass_no}, probe x{r['slow_before'] or 0:.2f}"
                          + (f"  compile/run pred {pr.compile_peak_bytes / 2**20:.0f}/{pr.run_peak_bytes / 2**20:.0f} meas "
                             f"{m['compile_peak_rss'] / 2**20:.0f}/{m['run_peak_rss'] / 2**20:.0f} MiB"
                             if m.get("run_peak_rss") else "")
                          + (f"  {m['placement']['fallback_nodes']} nodes on the CPU {m['placement']['fallback_ops']}"
                             if (m.get("placement") or {}).get("fallback_nodes") else ""), flush=True)
    rows = list(best.values())
    ok_t = [r for r in rows if "time_ratio" in r and 0.7 <= r["time_ratio"] <= 1.3]
    ok_m = [r for r in rows if "peak_ratio" in r and 0.85 <= r["peak_ratio"] <= 1.15]
    ok_i = [r for r in rows if "peak_ratio" in r and 0.85 <= r["peak_ratio_over_imports"] <= 1.15]
    n = sum(1 for r in rows if "time_ratio" in r)
    print(f"time within +-30%: {len(ok_t)}/{n}; process peak memory within +-15%: {len(ok_m)}/{n}; "
          f"peak over imports within +-15%: {len(ok_i)}/{n}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
