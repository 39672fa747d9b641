"""The checks that one backend and device go through. They run inside a worker process.

Each check returns a ``Check``: a group (conformance, accuracy, speed,
features, end-to-end), a name, a status and its figures. A check that raises
becomes an ``error`` check with the message; it never stops the others.

Statuses: ``passed``, ``failed`` (wrong numbers), ``error`` (it raised),
``unsupported`` (the backend does not offer the feature: not a failure),
``skipped`` (something the check needs is not installed), ``info`` (a
measurement with nothing to pass or fail, such as speed).
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..backend import Backend, Device
from ..errors import SdrtError

log = logging.getLogger("sdrt.selftest")

#: statuses that make a backend fail the self-test
FAILING = ("failed", "error")

#: ops of the SD 1.x/2.x/XL UNet, VAE and CLIP text encoders and of MobileNet-class CNNs, as onnx
#: node-test name stems (``test_<stem>_...``)
SD_OPS = ("add", "sub", "mul", "div", "pow", "sqrt", "neg", "matmul", "gemm", "conv", "softmax",
          "layer_normalization", "group_normalization", "instancenorm", "resize_upsample", "reshape",
          "transpose", "concat", "slice", "gather", "sigmoid", "erf", "gelu", "tanh", "cast", "where",
          "expand", "reduce_mean", "unsqueeze", "squeeze", "split", "shape", "cos", "sin", "exp",
          "clip", "hardsigmoid", "hardswish", "globalaveragepool", "relu", "flatten", "constantofshape",
          "equal", "argmax", "einsum")
#: the smaller set ``--quick`` runs
QUICK_OPS = ("add", "mul", "div", "matmul", "gemm", "conv", "softmax", "layer_normalization",
             "instancenorm", "resize_upsample", "reshape", "transpose", "concat", "slice", "gather",
             "sigmoid", "erf", "cast", "reduce_mean", "unsqueeze", "split")

#: the SD-style models of ``sdrt.testing.models`` the accuracy and speed checks build
MODELS = ("vae_decoder", "unet", "text_encoder", "mobilenet_v2")
#: relative error (||got - want|| / ||want||) allowed at each precision. bf16 (8-bit mantissa): OpenVINO runs
#: most ops in bf16, not only the matmuls, and one pass of the tiny UNet (random weights, random attention
#: logits) differs from float32 by 5.3e-2 on Sapphire Rapids (AMX) and 0.10-0.12 on Zen 5 (AVX-512-BF16;
#: ggml's bf16 1.3e-2 there), the other models by 0.6-2.3e-2; a wrong kernel gives errors near 1. The image bar
#: of docs/precision.md is what bounds a default precision; these catch a backend that computes wrong
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 0.2}
#: mean pixel difference (0-255) of the demo model's image to the reference backend's, at the precision the
#: pipeline runs at (the default): float32 matches; the demo model's random weights make 16-bit images move
#: more than a trained model's (OpenVINO bf16 on Zen 5: 8.3-8.9, ggml bf16 4.1); a broken pipeline is off by
#: tens
IMAGE_LIMIT = {"fp32": 2.0, "fp16": 8.0, "bf16": 12.0}


@dataclass
class Check:
    group: str
    name: str
    status: str = "passed"
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan:
    """What to run: ``quick`` is the launcher's after-install check (under a minute)."""

    quick: bool = False
    rounds: int = 10
    time_budget: float = 20.0  # seconds of timed runs per model and runner, at most
    #: run only these groups (``GROUPS``); empty: all
    groups: tuple[str, ...] = ()

    @classmethod
    def make(cls, quick: bool, groups: tuple[str, ...] = ()) -> Plan:
        if quick:
            return cls(quick=True, rounds=3, time_budget=3.0, groups=groups)
        return cls(groups=groups)

    def wants(self, group: str) -> bool:
        return not self.groups or group in self.groups

    @property
    def model_size(self) -> str:
        return "tiny" if self.quick else "bench"


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| in float64; inf when shapes differ or anything is not finite."""
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if g.shape != w.shape or not np.all(np.isfinite(g)):
        return float("inf")
    denom = float(np.linalg.norm(w)) or 1.0
    return float(np.linalg.norm(g - w)) / denom


def precisions(be: Backend, dev: Device | None = None) -> dict[str, dict[str, Any]]:
    """``{precision: compile options}`` to measure: fp32, and the default on ``dev`` when it differs (last).

    A backend says what it has with ``Backend.precisions`` (name -> options) and its default on a device
    with ``Backend.precision_for(dev)`` (``Backend.default_precision`` without a device); without them it is
    taken to run fp32 with no options.
    """
    declared: Mapping[str, Mapping[str, Any]] = getattr(be, "precisions", None) or {}
    by_device = getattr(be, "precision_for", None)
    default = by_device(dev) if dev is not None and by_device is not None else getattr(be, "default_precision", "fp32")
    out: dict[str, dict[str, Any]] = {}
    if default != "fp32" and "fp32" in declared:
        out["fp32"] = dict(declared["fp32"])
    out[default] = {}
    return out


# -- reference outputs ------------------------------------------------------
class Expected:
    """Outputs to compare against: onnxruntime on the CPU when installed, else the reference backend."""

    def __init__(self) -> None:
        try:
            import onnxruntime  # noqa: F401

            self.source = "onnxruntime"
        except ImportError:
            self.source = "reference backend"

    def __call__(self, model_bytes: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.source == "onnxruntime":
            import onnxruntime as ort

            sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
            return [np.asarray(v) for v in sess.run(None, feeds)]
        from onnx.reference import ReferenceEvaluator

        return [np.asarray(v) for v in ReferenceEvaluator(model_bytes).run(None, feeds)]


def _build(name: str, size: str) -> tuple[bytes, dict[str, np.ndarray]]:
    from ..testing import models

    model, feeds = models.build(name, size)
    return model.SerializeToString(), feeds


def _graph(model_bytes: bytes) -> Any:
    from ..graph import Graph

    return Graph.load(model_bytes)


def _outputs(session: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    got = session.run(feeds)
    return [np.asarray(got[o.name]) for o in session.outputs]


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def _median_time(fn: Callable[[], Any], plan: Plan) -> tuple[float, int]:
    """Median seconds of ``fn`` after one warm-up, over ``plan.rounds`` runs or the time budget."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < plan.rounds and (not times or time.perf_counter() - start < plan.time_budget):
        _, dt = _timed(fn)
        times.append(dt)
    return statistics.median(times), len(times)


# -- the checks ---------------------------------------------------------------
def conformance(be: Backend, dev: Device, plan: Plan) -> Check:
    from ..testing import BackendTest

    ops = QUICK_OPS if plan.quick else SD_OPS
    pattern = r"^test_(" + "|".join(ops) + r")(_|$)"
    # at float32 where the backend has it: onnx's node tests hold float32's tolerances (rtol 1e-3), which a bf16
    # default misses on every matmul (the accuracy checks measure the default precision)
    fp32 = precisions(be, dev).get("fp32", {})
    suite = BackendTest(be, dev, suites=("node",) if plan.quick else ("node", "light"), **fp32).include(pattern)
    if plan.quick:
        suite.exclude(r"_expanded(_|$)", "function bodies: the op itself is tested")
    summary = suite.run()
    totals = summary.totals()
    failures = [f"{name} [{op}]: {msg}" for op, r in sorted(summary.ops.items())
                for name, msg in r.failures if not msg.startswith("xfail")]
    status = "failed" if totals["failed"] else "passed"
    return Check("conformance", "SD ops" + (" (quick)" if plan.quick else " + light models"), status,
                 figures={"totals": totals, "failures": failures[:25], "ops": len(summary.ops)})


def accuracy(be: Backend, dev: Device, plan: Plan, expected: Expected) -> Iterator[Check]:
    """Each model at every precision against onnxruntime (or the reference backend)."""
    for name in MODELS:
        model_bytes, feeds = _build(name, "tiny")
        want = expected(model_bytes, feeds)
        graph = _graph(model_bytes)
        for precision, options in precisions(be, dev).items():
            check = Check("accuracy", f"{name} {precision}")
            try:
                session, compile_s = _timed(lambda: be.compile(graph, None, dev, **options))  # noqa: B023
                with session:
                    got = _outputs(session, feeds)
                err = max(rel_err(g, w) for g, w in zip(got, want))
                tol = TOLERANCE.get(precision, 1e-2)
                check.status = "passed" if err <= tol else "failed"
                check.figures = {"rel_err": err, "tolerance": tol, "against": expected.source,
                                 "compile_s": round(compile_s, 3)}
                if check.status == "failed":
                    check.message = f"relative error {err:.2e} is above {tol:.0e}"
            except Exception as exc:  # noqa: BLE001 - recorded, the next model still runs
                check.status, check.message = _error_status(exc), _message(exc)
            yield check


def speed(be: Backend, dev: Device, plan: Plan) -> Iterator[Check]:
    """Median time per model, beside onnxruntime's on the CPU in the same process."""
    for name in MODELS:
        check = Check("speed", f"{name} ({plan.model_size})", "info")
        try:
            model_bytes, feeds = _build(name, plan.model_size)
            graph = _graph(model_bytes)
            with be.compile(graph, None, dev) as session:
                median, n = _median_time(lambda: session.run(feeds), plan)  # noqa: B023
            check.figures = {"median_ms": round(median * 1e3, 3), "runs": n}
            ort_ms = _ort_median(model_bytes, feeds, plan)
            if ort_ms is not None:
                check.figures.update(onnxruntime_ms=round(ort_ms, 3), speedup=round(ort_ms / (median * 1e3), 3))
        except Exception as exc:  # noqa: BLE001
            check.status, check.message = _error_status(exc), _message(exc)
        yield check


def _ort_median(model_bytes: bytes, feeds: dict[str, np.ndarray], plan: Plan) -> float | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    median, _ = _median_time(lambda: sess.run(None, feeds), plan)
    return median * 1e3


@contextmanager
def _fresh_cache() -> Iterator[str]:
    """A private, empty ``SDRT_CACHE_DIR`` for the duration, so a cold compile is really cold."""
    old = os.environ.get("SDRT_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="sdrt-selftest-cache-") as tmp:
        os.environ["SDRT_CACHE_DIR"] = tmp
        try:
            yield tmp
        finally:
            if old is None:
                os.environ.pop("SDRT_CACHE_DIR", None)
            else:
                os.environ["SDRT_CACHE_DIR"] = old


def compile_cache(be: Backend, dev: Device, plan: Plan) -> Check:
    """A cold compile against a second compile of the same graph (a cache hit where the backend caches)."""
    check = Check("features", "compile cache", "info")
    model_bytes, feeds = _build("text_encoder" if plan.quick else "unet", plan.model_size)
    with _fresh_cache():
        first, cold = _timed(lambda: be.compile(_graph(model_bytes), None, dev))
        first.close()
        second, warm = _timed(lambda: be.compile(_graph(model_bytes), None, dev))
        with second:
            _outputs(second, feeds)
    check.figures = {"cold_s": round(cold, 3), "second_s": round(warm, 3),
                     "speedup": round(cold / warm, 2) if warm > 0 else None}
    return check


def update_weights(be: Backend, dev: Device, plan: Plan, expected: Expected) -> Check:
    """Swap every float weight for new values with ``update_weights``; the outputs must follow."""
    import onnx
    from onnx import numpy_helper

    from ..weights import Weights

    check = Check("features", "update_weights")
    model_bytes, feeds = _build("text_encoder", "tiny")
    model = onnx.load_from_string(model_bytes)
    rng = np.random.default_rng(7)
    new: dict[str, np.ndarray] = {}
    changed = 0
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        if arr.dtype.kind == "f" and arr.size > 1:
            arr = (arr * rng.uniform(0.8, 1.2, size=arr.shape)).astype(arr.dtype)
            t.CopyFrom(numpy_helper.from_array(arr, t.name))
            changed += 1
        new[t.name] = arr
    want = expected(model.SerializeToString(), feeds)
    tol = TOLERANCE.get(list(precisions(be, dev))[-1], 1e-2)  # compiled below with no options: the default
    with be.compile(_graph(model_bytes), None, dev) as session:
        before = _outputs(session, feeds)
        try:
            _, seconds = _timed(lambda: session.update_weights(Weights.from_arrays(new)))
        except SdrtError as exc:
            if "cannot update weights" in str(exc):
                return Check("features", "update_weights", "unsupported", message=_message(exc))
            raise
        got = _outputs(session, feeds)
    err = max(rel_err(g, w) for g, w in zip(got, want))
    moved = max(rel_err(b, w) for b, w in zip(before, want))
    check.figures = {"update_s": round(seconds, 4), "rel_err": err, "tolerance": tol, "tensors": changed}
    if err > tol:
        check.status = "failed"
        check.message = f"after update_weights the outputs are {err:.2e} from the new weights' (before: {moved:.2e})"
    return check


def ahead_of_time(be: Backend, dev: Device, plan: Plan) -> Check:
    """``sdrt compile``'s path: build for the backend's first AOT target into a file."""
    targets = getattr(be, "targets", None)
    build = getattr(be, "build", None)
    if not callable(targets) or not callable(build):
        return Check("features", "ahead-of-time build", "unsupported",
                     message=f"backend {be.name!r} offers no ahead-of-time build")
    names = list(targets())
    if not names:
        return Check("features", "ahead-of-time build", "unsupported", message="no AOT targets listed")
    model_bytes, _ = _build("unet", "tiny")
    with tempfile.TemporaryDirectory(prefix="sdrt-selftest-aot-") as tmp:
        out = os.path.join(tmp, f"unet.{be.name}")
        _, seconds = _timed(lambda: build(_graph(model_bytes), None, names[0], out))
        size = _size(out)
    return Check("features", f"ahead-of-time build ({names[0]})", "passed",
                 figures={"seconds": round(seconds, 3), "bytes": size})


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path) if os.path.exists(path) else 0


#: what the end-to-end check generates (small and fast; the embedded demo model)
E2E_PROMPT = "a red circle on a blue background"


def end_to_end(be: Backend, dev: Device, plan: Plan) -> Check:
    """One short generation with the embedded model, against the reference backend's image."""
    try:
        from .. import pipelines
    except ImportError as exc:
        return Check("end-to-end", "generate", "skipped", message=f"sdrt.pipelines is not available: {exc}")
    steps = 2 if plan.quick else 6
    kwargs = {"steps": steps, "seed": 1}

    def image(backend: str, device: str | None) -> np.ndarray:
        pipe = pipelines.load(pipelines.DEMO_MODEL, backend=backend, device=device)
        try:
            result = pipe(E2E_PROMPT, **kwargs)
        finally:
            close = getattr(pipe, "close", None)
            if callable(close):
                close()
        images = getattr(result, "images", result)
        return np.asarray(images[0])

    got, seconds = _timed(lambda: image(be.name, dev.id))
    check = Check("end-to-end", f"generate ({steps} steps)", figures={"seconds": round(seconds, 3),
                                                                     "shape": list(got.shape)})
    if be.name == "reference":
        return check
    try:
        want = image("reference", None)
    except SdrtError as exc:
        check.status, check.message = "info", f"no reference image to compare with: {exc}"
        return check
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    mean = float(diff.mean())
    limit = IMAGE_LIMIT.get(list(precisions(be, dev))[-1], 8.0)  # the pipeline runs at the default
    check.figures.update(mean_abs_diff=round(mean, 3), max_abs_diff=int(diff.max()), limit=limit)
    if mean > limit:
        check.status, check.message = "failed", f"mean pixel difference {mean:.2f} to the reference is above {limit}"
    return check


def _error_status(exc: BaseException) -> str:
    from ..errors import UnsupportedGraph

    return "unsupported" if isinstance(exc, UnsupportedGraph) else "error"


def _message(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, SdrtError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:500]


def run_checks(be: Backend, dev: Device, plan: Plan, emit: Callable[[Check], None],
               announce: Callable[[str], None] = lambda _: None) -> None:
    """Run every check in order, passing each result to ``emit`` as soon as it is known.

    ``announce(name)`` is called before a check starts, so that a crash can be
    blamed on the check that was running.
    """
    expected = Expected()
    steps: list[tuple[str, Callable[[], Check | Iterator[Check]]]] = [
        ("conformance", lambda: conformance(be, dev, plan)),
        ("accuracy", lambda: accuracy(be, dev, plan, expected)),
        ("speed", lambda: speed(be, dev, plan)),
        ("compile cache", lambda: compile_cache(be, dev, plan)),
        ("update_weights", lambda: update_weights(be, dev, plan, expected)),
        ("ahead-of-time build", lambda: ahead_of_time(be, dev, plan)),
        ("end-to-end", lambda: end_to_end(be, dev, plan)),
    ]
    for name, step in steps:
        if not plan.wants(_group(name)):
            continue
        announce(name)
        t0 = time.perf_counter()
        try:
            result = step()
            for check in ([result] if isinstance(result, Check) else result):
                if not check.seconds:
                    check.seconds = round(time.perf_counter() - t0, 3)
                emit(check)
                t0 = time.perf_counter()
                announce(name)
        except Exception as exc:  # noqa: BLE001 - a failing check never stops the run
            log.debug("check %s raised", name, exc_info=True)
            emit(Check(_group(name), name, _error_status(exc), round(time.perf_counter() - t0, 3),
                       message=_message(exc)))


def _group(step: str) -> str:
    return {"compile cache": "features", "update_weights": "features",
            "ahead-of-time build": "features"}.get(step, step)


#: the check groups, in the order they run
GROUPS = ("conformance", "accuracy", "speed", "features", "end-to-end")
