"""The benchmark harness: every installed sdrt backend against raw onnxruntime and raw OpenVINO.

For each model it builds (or reuses) the ONNX file, prepares one runner per
contender, checks each runner's outputs against onnxruntime's, then times them
interleaved: every round runs each contender once, in a rotated order, so that
load from other processes on the machine hits all of them alike. It reports the
median, the ratio to the best peer (raw onnxruntime or raw OpenVINO), and the
max relative error ``max|out - ort| / max|ort|`` over every output.

sdrt backends are discovered through ``sdrt.plugins.get_registry()``: any
installed plugin shows up. The reference backend (onnx's ReferenceEvaluator) is
skipped unless asked for, being far too slow to time.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import platform
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdrt.testing import models

log = logging.getLogger("sdrt.bench")

Feeds = dict[str, np.ndarray]
RunFn = Callable[[Feeds], list[np.ndarray]]

#: runners whose times are the yardstick; sdrt backends are measured against the best of them
PEERS = ("onnxruntime", "openvino-raw")


@dataclass
class Result:
    model: str
    runner: str
    kind: str  # "peer" or "sdrt"
    size: str = "bench"  # the size the model was built at (sdrt.testing.models.SIZES)
    median_ms: float | None = None
    min_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    runs: int = 0
    prepare_s: float | None = None
    ratio_to_best_peer: float | None = None
    #: median over rounds of (this run / the paired peer's run in the same round): robust to load drift
    paired_ratio: float | None = None
    paired_with: str | None = None
    max_rel_err: float | None = None
    error: str | None = None
    times_ms: list[float] = field(default_factory=list, repr=False)


# ---------------------------------------------------------------------------
# runners: each prepares a model file and returns a function feeds -> outputs
def ort_runner(path: Path, output_names: list[str], threads: int | None) -> RunFn:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # onnxruntime's pool threads spin after each run by default and would steal the cores from the
    # contender timed next; with spinning off every contender starts on idle cores.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(output_names, feeds)


def openvino_runner(path: Path, output_names: list[str], threads: int | None, precision: str = "f32") -> RunFn:
    """Raw OpenVINO as an expert would call it: one InferRequest, inputs shared, outputs copied."""
    import openvino as ov

    core = ov.Core()
    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    request = compiled.create_infer_request()
    ports = [compiled.output(n) for n in output_names]

    def run(feeds: Feeds) -> list[np.ndarray]:
        result = request.infer(feeds, share_inputs=True, share_outputs=False)
        return [result[p] for p in ports]

    return run


def load_for_timing(model: Any, **kwargs: Any) -> Any:
    """``sdrt.load``, returned once the compile cache's new entry is written: the cache writes it on a thread of its
    own, which took one of two cores from the first calls (a bf16 CLIP text encoder's 323 MB: 28 -> 45 ms a call)."""
    import sdrt
    from sdrt.cache import wait_for_stores

    session = sdrt.load(model, **kwargs)
    wait_for_stores()
    return session


def sdrt_runner(path: Path, output_names: list[str], backend: str, options: dict[str, Any]) -> RunFn:

    options = dict(options)
    device = options.pop("device", None)
    session = load_for_timing(str(path), backend=backend, device=device, **options)

    def run(feeds: Feeds) -> list[np.ndarray]:
        out = session.run(feeds)
        return [out[n] for n in output_names]

    return run


def sdrt_backends(include_reference: bool = False, only: Sequence[str] | None = None) -> list[str]:
    """Names of the installed sdrt backends that offer a device here."""
    from sdrt.plugins import get_registry

    names = []
    for name, be in sorted(get_registry().backends.items()):
        if only and name not in only:
            continue
        if name == "reference" and not include_reference and not only:
            continue
        try:
            if not be.devices():
                log.info("skipping sdrt backend %s: no device here", name)
                continue
        except Exception as exc:  # noqa: BLE001 - a broken backend is reported, never fatal
            log.warning("skipping sdrt backend %s: devices() failed: %r", name, exc)
            continue
        names.append(name)
    return names


# ---------------------------------------------------------------------------
#: a model whose initializers hold more than this many bytes is written with ONNX external data
#: (one ``<name>.onnx.data`` file beside the ``.onnx``): protobuf cannot serialize a message above
#: 2 GB, and the full-size UNet holds ~3.4 GB of float32 weights
EXTERNAL_DATA_ABOVE = int(1.5 * 2**30)


def model_file(name: str, size: str, workdir: Path, *,
               external_above: int = EXTERNAL_DATA_ABOVE) -> tuple[Path, Feeds, list[str]]:
    """Build model ``name`` once per source version; return its path, inputs and output names.

    Models with more than ``external_above`` bytes of initializers keep their weights in
    ``<path>.data`` (ONNX external data, which onnxruntime, OpenVINO and ``sdrt.Graph.load``
    read from the model's folder). Every file is written under a temporary folder and moved
    into place, the weights before the ``.onnx`` that refers to them.
    """
    import onnx

    src = Path(models.__file__).read_bytes() + Path(models.__file__).with_name("builder.py").read_bytes()
    tag = hashlib.sha256(src + size.encode()).hexdigest()[:10]
    path = workdir / f"{name}-{size}-{tag}.onnx"
    feeds_path = path.with_suffix(".npz")
    if path.exists() and feeds_path.exists():
        proto = onnx.load(str(path), load_external_data=False)
        if _external_files_present(proto, path.parent):
            with np.load(feeds_path) as data:
                return path, {k: data[k] for k in data.files}, [o.name for o in proto.graph.output]
        log.warning("%s: its external-data file is missing; building it again", path)
    model, feeds = models.build(name, size)
    outputs = [o.name for o in model.graph.output]
    workdir.mkdir(parents=True, exist_ok=True)
    tmpdir = workdir / f".build-{path.stem}-{os.getpid()}"
    tmpdir.mkdir()
    try:
        external = sum(t.ByteSize() for t in model.graph.initializer) > external_above
        if external:
            data_name = path.name + ".data"
            log.info("%s: writing the weights as external data (%s)", path.name, data_name)
            # writes each initializer's bytes to the data file and drops them from ``model``, so the
            # weights are held once, not twice, while the small .onnx is serialized
            onnx.save_model(model, str(tmpdir / path.name), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=data_name, size_threshold=1024)
            shutil.copymode(tmpdir / path.name, tmpdir / data_name)  # onnx creates it 0600; match the .onnx
            os.replace(tmpdir / data_name, path.parent / data_name)
        else:
            (tmpdir / path.name).write_bytes(model.SerializeToString())
        del model
        np.savez(tmpdir / feeds_path.name, **feeds)
        os.replace(tmpdir / path.name, path)
        os.replace(tmpdir / feeds_path.name, feeds_path)
    finally:
        for leftover in tmpdir.glob("*"):
            leftover.unlink()
        tmpdir.rmdir()
    return path, feeds, outputs


def _external_files_present(model: Any, folder: Path) -> bool:
    """Whether every external-data file that ``model``'s initializers name exists in ``folder``."""
    locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    return all((folder / loc).is_file() for loc in locations)


def stripped_file(path: Path) -> Path | None:
    """The weight-stripped graph (+ .safetensors beside it) of ``path``, made by sdrt's strip, or None."""
    import sdrt

    out = path.with_name(path.stem + ".stripped.onnx")
    weights = out.with_suffix(".safetensors")
    if out.exists() and weights.exists():
        return out
    graph = sdrt.Graph.load(path)
    if not hasattr(graph, "strip"):
        return None
    tmpdir = path.parent / f".strip-{path.stem}-{os.getpid()}"
    tmpdir.mkdir(parents=True, exist_ok=True)
    try:
        graph.strip(tmpdir / out.name, tmpdir / weights.name)
        os.replace(tmpdir / weights.name, weights)
        os.replace(tmpdir / out.name, out)
    finally:
        for leftover in tmpdir.glob("*"):
            leftover.unlink()
        tmpdir.rmdir()
    return out


def max_rel_err(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    worst = 0.0
    for g, r in zip(got, ref):
        g64, r64 = np.asarray(g, np.float64), np.asarray(r, np.float64)
        if g64.shape != r64.shape:
            return float("inf")
        scale = float(np.abs(r64).max()) or 1.0
        worst = max(worst, float(np.abs(g64 - r64).max()) / scale)
    return worst


def bench_model(name: str, size: str, workdir: Path, backends: Sequence[str], *, rounds: int | None,
                min_seconds: float, warmup: int, threads: int | None, peers: Sequence[str] = PEERS,
                sdrt_options: dict[str, dict[str, Any]] | None = None,
                pair_with: str = "openvino-raw", sdrt_input: str = "stripped") -> list[Result]:
    path, feeds, outputs = model_file(name, size, workdir)
    sdrt_path = (stripped_file(path) or path) if sdrt_input == "stripped" else path
    contenders: list[tuple[str, str, Callable[[], RunFn]]] = []
    if "onnxruntime" in peers:
        contenders.append(("onnxruntime", "peer", lambda: ort_runner(path, outputs, threads)))
    if "openvino-raw" in peers:
        contenders.append(("openvino-raw", "peer", lambda: openvino_runner(path, outputs, threads)))
    for be in backends:
        opts = dict((sdrt_options or {}).get(be, {}))
        if threads and be in ("openvino", "ggml"):  # both take a `threads` compile option
            opts.setdefault("threads", threads)
        contenders.append((f"sdrt-{be}", "sdrt",
                           lambda be=be, opts=opts: sdrt_runner(sdrt_path, outputs, be, opts)))

    results: list[Result] = []
    ready: list[tuple[Result, RunFn]] = []
    reference: list[np.ndarray] | None = None
    for runner, kind, prepare in contenders:
        res = Result(name, runner, kind, size)
        results.append(res)
        try:
            t0 = time.perf_counter()
            fn = prepare()
            res.prepare_s = time.perf_counter() - t0
            out = fn(feeds)
            for _ in range(warmup):
                fn(feeds)
        except Exception as exc:  # noqa: BLE001 - one failing contender must not stop the table
            res.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            log.warning("%s on %s failed: %s", runner, name, res.error)
            continue
        if runner == "onnxruntime":
            reference = out
        res.max_rel_err = max_rel_err(out, reference) if reference is not None else None
        ready.append((res, fn))

    if not ready:
        return results
    n = rounds
    if not n:  # estimate a run's cost to pick the number of rounds (skipped when given: full-size runs take seconds)
        t0 = time.perf_counter()
        for _, fn in ready:
            fn(feeds)
        per_round = time.perf_counter() - t0
        n = int(min(1000, max(10, min_seconds / max(per_round, 1e-6))))
    for r in range(n):
        shift = r % len(ready)
        for res, fn in ready[shift:] + ready[:shift]:
            gc.disable()
            t0 = time.perf_counter()
            fn(feeds)
            dt = time.perf_counter() - t0
            gc.enable()
            res.times_ms.append(dt * 1e3)
    for res, _ in ready:
        ts = sorted(res.times_ms)
        res.runs = len(ts)
        res.median_ms = statistics.median(ts)
        res.min_ms = ts[0]
        res.p10_ms = ts[int(0.1 * (len(ts) - 1))]
        res.p90_ms = ts[int(0.9 * (len(ts) - 1))]
    best_peer = min((r.median_ms for r in results if r.kind == "peer" and r.median_ms), default=None)
    for res in results:
        if best_peer and res.median_ms:
            res.ratio_to_best_peer = res.median_ms / best_peer
    timed = {r.runner: r for r in results if r.median_ms}
    ref = timed.get(pair_with) or min((r for r in timed.values() if r.kind == "peer"),
                                       key=lambda r: r.median_ms or 0.0, default=None)
    if ref is not None:
        for res in timed.values():
            res.paired_with = ref.runner
            res.paired_ratio = statistics.median(a / b for a, b in zip(res.times_ms, ref.times_ms))
    return results


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                            "cpu_count": os.cpu_count(), "platform": platform.platform()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        info["cpu"] = platform.processor()
    for mod in ("onnxruntime", "openvino", "onnx", "numpy", "sdrt"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            info[mod] = None
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    return info


def label(r: Result) -> str:
    """The model column: the name, with ``@size`` for rows not at the default bench size."""
    return r.model if r.size == "bench" else f"{r.model}@{r.size}"


def render(results: Sequence[Result]) -> str:
    paired = next((r.paired_with for r in results if r.paired_with), None) or "-"
    w = max([14, *(len(label(r)) for r in results)])
    head = f"{'model':<{w}} {'runner':<18} {'median ms':>10} {'min ms':>9} {'p10-p90 ms':>17} {'runs':>5} " \
           f"{'vs best peer':>12} {'paired vs ' + paired:>24} {'max rel err':>12}"
    lines = [head, "-" * len(head)]
    last = None
    for r in results:
        if last is not None and label(r) != last:
            lines.append("")
        last = label(r)
        if r.error:
            lines.append(f"{last:<{w}} {r.runner:<18} {'failed: ' + r.error}")
            continue
        spread = f"{r.p10_ms:.2f}-{r.p90_ms:.2f}" if r.p10_ms is not None else ""
        ratio = f"{r.ratio_to_best_peer:.3f}x" if r.ratio_to_best_peer else "-"
        err = f"{r.max_rel_err:.2e}" if r.max_rel_err is not None else "-"
        pair = f"{r.paired_ratio:.3f}x" if r.paired_ratio is not None else "-"
        lines.append(f"{last:<{w}} {r.runner:<18} {r.median_ms:>10.2f} {r.min_ms:>9.2f} {spread:>17} {r.runs:>5} "
                     f"{ratio:>12} {pair:>24} {err:>12}")
    return "\n".join(lines)


def to_json(results: Sequence[Result], config: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for r in results:
        row = asdict(r)
        row["times_ms"] = [round(t, 4) for t in r.times_ms]
        rows.append(row)
    return {"environment": environment(), "config": config, "results": rows,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
