"""Fit the cost model's factors on this machine: time each op class on a backend, and its memory.

For every op class, a chain of nodes of that class is built at two sizes (onnx.helper, fixed
shapes) and run through ``sdrt.load`` on the backend, each in a child process (so that its peak
resident memory can be read, and a crash costs nothing), ``repeats`` times after a warm-up; the
median time per call is kept. Times are ``robust_ms``: the median over groups of three runs of each group's best (the machine may
be shared). Time is fitted as
``nodes x overhead + sum over classes of roofline / efficiency`` over every case at once (non-negative
least squares on relative errors): one overhead per backend, one efficiency per class; memory as
``weight_factor * weights + activation_factor * activations + base`` by least squares over all of
the graphs. The CPU's memory bandwidth is measured too (a large numpy copy), as the roofline's
bandwidth. ``sdrt selftest --calibrate`` calls ``calibrate`` and stores the result.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .devices import DeviceSpec, this_cpu
from .model import TIME_CLASSES, Factors, node_time_s
from .nodes import graph_costs

log = logging.getLogger("sdrt.cost")


def _model(name: str, inputs: list[Any], nodes: list[Any], outputs: list[Any], inits: list[Any]) -> Any:
    from onnx import helper

    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="sdrt-calibrate")
    m.ir_version = 8
    return m


def _w(name: str, shape: tuple[int, ...], rng: np.random.Generator, scale: float | None = None) -> Any:
    from onnx import numpy_helper

    fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    s = scale if scale is not None else 1.0 / np.sqrt(max(fan, 1))
    return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)


def build_case(op_class: str, size: int) -> tuple[Any, dict[str, np.ndarray]]:
    """A chain of ``op_class`` nodes at size 0 (small) or 1 (large); returns (model, feeds)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(7 + size)
    f32 = TensorProto.FLOAT
    nodes: list[Any] = []
    inits: list[Any] = []
    if op_class in ("matmul", "weights"):  # "weights": weight-heavy, for memory (and matmul at few rows)
        t, c, k = {"matmul": [(256, 320, 8), (1024, 768, 8)], "weights": [(16, 1024, 4), (16, 3072, 8)]}[op_class][size]
        x = "x"
        for i in range(k):
            inits.append(_w(f"w{i}", (c, c), rng))
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
            x = f"y{i}"
        shape = [1, t, c]
        ins = [helper.make_tensor_value_info("x", f32, shape)]
    elif op_class == "activations":  # activation-heavy: memory calibration
        c, hw = 64, 512
        inits.append(_w("b0", (c, 1, 1), rng, 0.1))
        nodes += [helper.make_node("Sigmoid", ["x"], ["s0"]), helper.make_node("Mul", ["x", "s0"], ["m0"]),
                  helper.make_node("Add", ["m0", "b0"], ["y0"])]
        x = "y0"
        shape = [1, c, hw, hw]
        ins = [helper.make_tensor_value_info("x", f32, shape)]
    elif op_class == "conv":
        c, hw, k = [(64, 32, 6), (128, 64, 4)][size]
        x = "x"
        for i in range(k):
            inits += [_w(f"w{i}", (c, c, 3, 3), rng), _w(f"b{i}", (c,), rng, 0.01)]
            nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"y{i}"], pads=[1, 1, 1, 1]))
            x = f"y{i}"
        shape = [1, c, hw, hw]
        ins = [helper.make_tensor_value_info("x", f32, shape)]
    elif op_class == "attention":
        bh, s, d, k = [(8, 256, 64, 4), (8, 1024, 64, 3)][size]
        x = "q"
        inits.append(_w("scale", (), rng, 0.0))
        inits[-1].float_data[:] = []
        from onnx import numpy_helper
        inits[-1] = numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale")
        for i in range(k):
            nodes += [helper.make_node("MatMul", [x, "kt"], [f"s{i}"]),
                      helper.make_node("Mul", [f"s{i}", "scale"], [f"m{i}"]),
                      helper.make_node("Softmax", [f"m{i}"], [f"p{i}"], axis=-1),
                      helper.make_node("MatMul", [f"p{i}", "v"], [f"o{i}"])]
            x = f"o{i}"
        ins = [helper.make_tensor_value_info("q", f32, [bh, s, d]), helper.make_tensor_value_info("kt", f32, [bh, d, s]),
               helper.make_tensor_value_info("v", f32, [bh, s, d])]
        feeds = {n.name: rng.standard_normal([v.dim_value for v in n.type.tensor_type.shape.dim]).astype(np.float32)
                 for n in ins}
        return _model(f"cal_{op_class}_{size}", ins, nodes,
                      [helper.make_tensor_value_info(x, f32, [bh, s, d])], inits), feeds
    elif op_class == "norm":
        t, c, k = [(1024, 320, 6), (4096, 640, 6)][size]
        x = "x"
        for i in range(k):
            inits += [_w(f"g{i}", (c,), rng, 1.0), _w(f"b{i}", (c,), rng, 0.1)]
            nodes.append(helper.make_node("LayerNormalization", [x, f"g{i}", f"b{i}"], [f"y{i}"], axis=-1,
                                          epsilon=1e-5))
            x = f"y{i}"
        shape = [1, t, c]
        ins = [helper.make_tensor_value_info("x", f32, shape)]
    elif op_class == "elementwise":
        c, hw, k = [(64, 32, 4), (320, 64, 4)][size]
        x = "x"
        for i in range(k):  # SiLU then a per-channel add, as a UNet's resnets do between convs
            inits.append(_w(f"b{i}", (c, 1, 1), rng, 0.1))
            nodes += [helper.make_node("Sigmoid", [x], [f"s{i}"]), helper.make_node("Mul", [x, f"s{i}"], [f"m{i}"]),
                      helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
            x = f"y{i}"
        shape = [1, c, hw, hw]
        ins = [helper.make_tensor_value_info("x", f32, shape)]
    elif op_class == "data":
        c, n, k = [(64, 1024, 6), (320, 4096, 6)][size]
        x = "x"
        shape = [1, c, n]
        for i in range(k):
            nodes.append(helper.make_node("Transpose", [x], [f"y{i}"], perm=[0, 2, 1]))
            inits.append(_w(f"b{i}", (1,), rng, 0.1))
            nodes.append(helper.make_node("Add", [f"y{i}", f"b{i}"], [f"z{i}"]))  # keeps each copy real
            x = f"z{i}"
        ins = [helper.make_tensor_value_info("x", f32, shape)]
    else:
        raise ValueError(f"unknown op class {op_class!r}")
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    return _model(f"cal_{op_class}_{size}", ins, nodes, [helper.make_tensor_value_info(x, f32, None)], inits), feeds


CASES = [(c, s) for c in TIME_CLASSES for s in (0, 1)] + [("weights", 0), ("weights", 1), ("activations", 0)]
GROUP = 3  # timed runs per group: a group's best is one sample, and the median of the samples is kept


def robust_ms(times: list[float]) -> float:
    """The median over groups of ``GROUP`` consecutive runs of each group's fastest run. On a machine that
    other jobs share, a run's time is its own plus the time it was scheduled out; the best of a few runs
    sheds most of the latter, and the median over groups sheds a lucky outlier."""
    groups = [times[i:i + GROUP] for i in range(0, len(times), GROUP)]
    return statistics.median(min(g) for g in groups if g)


def measure(path: Path, feeds: dict[str, np.ndarray], backend: str, *, repeats: int = 7, warmup: int = 2,
            device: str | None = None, timeout: float = 600.0, options: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """Compile ``path`` on ``backend`` in a child process, run it ``warmup + repeats`` times; returns
    ``{"times_ms": [...], "median_ms", "rss_before", "peak_rss", "peak_bytes"}`` (peak over the
    child's resident memory after imports, in bytes)."""
    with tempfile.TemporaryDirectory(prefix="sdrt-measure-") as tmp:
        npz = Path(tmp) / "feeds.npz"
        np.savez(npz, **feeds)
        spec = {"path": str(path), "feeds": str(npz), "backend": backend, "device": device, "repeats": repeats,
                "warmup": warmup, "options": options or {}}
        env = dict(os.environ, SDRT_CACHE_DIR=str(Path(tmp) / "cache"))
        proc = subprocess.run([sys.executable, "-c", "from sdrt.cost.calibrate import _child; _child()"],
                              input=json.dumps(spec), capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {path.name} on {backend} failed: {proc.stderr.strip()[-600:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["median_ms"] = statistics.median(out["times_ms"])
    out["robust_ms"] = robust_ms(out["times_ms"])
    return out


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss it does not inherit the parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _child() -> None:
    import gc

    import sdrt

    spec = json.loads(sys.stdin.read())
    from sdrt.plugins import get_registry
    from sdrt.runtime import select

    get_registry()
    select(spec["backend"], spec["device"])
    with np.load(spec["feeds"]) as z:
        feeds = {k: z[k] for k in z.files}
    gc.collect()
    before = _rss()
    sess = sdrt.load(spec["path"], backend=spec["backend"], device=spec["device"], **spec["options"])
    times = []
    for i in range(spec["warmup"] + spec["repeats"]):
        t = time.perf_counter()
        sess.run(feeds)
        if i >= spec["warmup"]:
            times.append(1000 * (time.perf_counter() - t))
    peak = _hwm()
    print(json.dumps({"times_ms": times, "rss_before": before, "peak_rss": peak, "peak_bytes": max(0, peak - before)}))


def measure_bandwidth(mb: int = 128, repeats: int = 9) -> float:
    """This machine's copy bandwidth in bytes/s (read + write), from ``robust_ms`` of ``repeats`` copies."""
    a = np.ones(mb * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t)
    return 2 * a.nbytes / (robust_ms(times) or 1e-9)


def calibrate(backend: str, *, device: DeviceSpec | None = None, repeats: int = 9, workdir: Path | None = None,
              progress: Callable[[str], None] | None = None) -> tuple[Factors, list[dict[str, Any]]]:
    """Time the op classes on ``backend`` here and fit its factors; returns (factors, the measurements)."""
    from ..graph import Graph

    dev = device or this_cpu()
    bw = measure_bandwidth()
    dev_bw = DeviceSpec(dev.name, dev.vendor, dev.kind, dev.memory_bytes, bw, dev.peak_flops, dev.source,
                        cores=dev.cores, isa=dev.isa)
    unit = Factors({c: 1.0 for c in TIME_CLASSES}, {c: 0.0 for c in TIME_CLASSES})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sdrt-calibrate-") as tmp:
        folder = Path(workdir or tmp)
        for op_class, size in CASES:
            model, feeds = build_case(op_class, size)
            path = folder / f"{model.graph.name}.onnx"
            path.write_bytes(model.SerializeToString())
            cost = graph_costs(Graph.load(path), {k: v.shape for k, v in feeds.items()})
            counted = [n for n in cost.nodes if n.op_class == (op_class if op_class != "weights" else "matmul")]
            timed = [n for n in cost.nodes if n.op_class != "view" and not n.fused]
            by_class: dict[str, float] = {}
            flops_ms: dict[str, float] = {}
            bytes_ms = 0.0
            for n in timed:
                by_class[n.op_class] = by_class.get(n.op_class, 0.0) + 1000 * node_time_s(
                    n.op_class, n.flops, n.bytes, dev_bw, "fp32", unit)
                flops_ms[n.op_class] = flops_ms.get(n.op_class, 0.0) + 1000 * n.flops / dev_bw.peak("fp32")
                bytes_ms += 1000 * n.bytes / bw
            roof = sum(by_class.values()) / 1000
            if progress:
                progress(f"{backend}: {model.graph.name}")
            m = measure(path, feeds, backend, repeats=repeats)
            rows.append({"case": model.graph.name, "class": op_class, "size": size, "nodes": len(counted),
                         "all_nodes": len(timed), "roofline_ms": 1000 * roof, "roofline_by_class_ms": by_class,
                         "flops_ms_by_class": flops_ms, "bytes_ms": bytes_ms,
                         "median_ms": m["median_ms"], "robust_ms": m["robust_ms"], "times_ms": m["times_ms"], "peak_bytes": m["peak_bytes"],
                         "weight_bytes": cost.weight_bytes, "activation_bytes": cost.peak_activation_bytes,
                         "flops": cost.flops})
    return fit(rows, bw, backend), rows


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (an active set, dropping the most negative each round)."""
    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (sol >= 0).all():
            x[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return x


def _fit_times(rows: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float], float]:
    """Every case at once, with an additive roofline: ``time = sum over classes of flops_time_c / efficiency_c
    + bytes_time / bandwidth_efficiency + nodes x overhead`` (flops_time at the nominal peak, bytes_time at
    the measured bandwidth), linear in the inverses, fitted with non-negative coefficients, each case
    weighted by 1/time (relative errors count alike, large case or small)."""
    timed = [r for r in rows if r.get("flops_ms_by_class") is not None and r["robust_ms"] > 0]
    classes = [c for c in TIME_CLASSES if any(r["flops_ms_by_class"].get(c) for r in timed)]
    a = np.array([[r["flops_ms_by_class"].get(c, 0.0) for c in classes] + [r["bytes_ms"], r["all_nodes"]]
                  for r in timed])
    y = np.array([r["robust_ms"] for r in timed])
    x = _nnls(a / y[:, None], np.ones(len(y)))
    o = float(x[-1]) / 1000.0  # ms -> s per node
    eff = {c: (1.0 / x[i] if x[i] > 1e-9 else 10.0) for i, c in enumerate(classes)}
    bw_eff = 1.0 / x[-2] if x[-2] > 1e-9 else 10.0
    return eff, {c: o for c in TIME_CLASSES}, bw_eff


def fit(rows: list[dict[str, Any]], bandwidth: float, backend: str) -> Factors:
    """Per class: ``t_node = overhead + roofline_node / efficiency`` through the small and large case;
    memory: least squares of ``peak = a * weights + b * activations + c`` over every case."""
    eff, over, bw_eff = _fit_times(rows)
    a = np.array([[r["weight_bytes"], r["activation_bytes"], 1.0] for r in rows])
    y = np.array([max(float(r["peak_bytes"]), 1.0) for r in rows])
    wf, af, base = (float(v) for v in _nnls(a / y[:, None], np.ones(len(y))))  # relative errors
    return Factors(eff, over, wf, af, base, True, bandwidth, f"sdrt selftest --calibrate ({backend})",
                   additive=True, bandwidth_efficiency=bw_eff,
                   fit={"bandwidth_efficiency": bw_eff,
                        "cases": [{k: r.get(k) for k in ("case", "robust_ms", "median_ms", "roofline_ms", "peak_bytes")}
                                  for r in rows]})
