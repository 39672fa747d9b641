"""Verify the backend on an RTX GPU: ``python -m sdrt_trt.verify [--device cuda:0] [--json report.json]``.

What no machine without a supported GPU can check: execution against the ONNX
reference evaluator, refit through ``update_weights``, the engine cache hit, the
runtime cache written beside it, speed, and engines holding int8/int4/fp8 weights. Each check prints one line; the exit
status is 0 when all pass. The model is a small SD-style block built here
(conv, group norm, SiLU, self-attention, conv), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

#: relative max error allowed at fp16 against the float32 reference evaluator
RTOL = {"fp16": 2e-2, "bf16": 6e-2, "fp32": 1e-3}


def block_model(channels: int = 32, side: int = 16, seed: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
    """An SD-style block: conv -> group norm -> SiLU -> single-head self-attention -> conv, and its feeds."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    c, n = channels, side * side

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]) or 1)).astype(np.float32)

    inits = {"conv_in.weight": w(c, 4, 3, 3), "conv_in.bias": w(c), "norm.scale": np.ones(8, np.float32),
             "norm.bias": np.zeros(8, np.float32), "gamma": 1 + 0.1 * w(c, 1, 1), "beta": 0.1 * w(c, 1, 1),
             "to_q": w(c, c), "to_k": w(c, c), "to_v": w(c, c), "conv_out.weight": w(4, c, 3, 3),
             "grouped": np.array([1, 8, -1], np.int64), "back": np.array([1, c, side, side], np.int64),
             "tokens": np.array([1, c, n], np.int64), "scale": np.array(1 / np.sqrt(c), np.float32)}
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "conv_in.weight", "conv_in.bias"], ["h0"], name="/conv_in/Conv", pads=[1, 1, 1, 1]),
        node("Reshape", ["h0", "grouped"], ["g0"], name="/norm/Reshape"),
        node("InstanceNormalization", ["g0", "norm.scale", "norm.bias"], ["g1"], name="/norm/InstanceNormalization",
             epsilon=1e-6),
        node("Reshape", ["g1", "back"], ["g2"], name="/norm/Reshape_1"),
        node("Mul", ["g2", "gamma"], ["g3"], name="/norm/Mul"),
        node("Add", ["g3", "beta"], ["g4"], name="/norm/Add"),
        node("Sigmoid", ["g4"], ["s"], name="/act/Sigmoid"),
        node("Mul", ["g4", "s"], ["h1"], name="/act/Mul"),
        node("Reshape", ["h1", "tokens"], ["t0"], name="/attn/Reshape"),
        node("Transpose", ["t0"], ["t1"], name="/attn/Transpose", perm=[0, 2, 1]),
        node("MatMul", ["t1", "to_q"], ["q"], name="/attn/to_q/MatMul"),
        node("MatMul", ["t1", "to_k"], ["k"], name="/attn/to_k/MatMul"),
        node("MatMul", ["t1", "to_v"], ["v"], name="/attn/to_v/MatMul"),
        node("Transpose", ["k"], ["kt"], name="/attn/Transpose_1", perm=[0, 2, 1]),
        node("MatMul", ["q", "kt"], ["qk"], name="/attn/MatMul"),
        node("Mul", ["qk", "scale"], ["qks"], name="/attn/Mul"),
        node("Softmax", ["qks"], ["p"], name="/attn/Softmax", axis=-1),
        node("MatMul", ["p", "v"], ["o"], name="/attn/MatMul_1"),
        node("Add", ["o", "t1"], ["r"], name="/attn/Add"),
        node("Transpose", ["r"], ["r1"], name="/attn/Transpose_2", perm=[0, 2, 1]),
        node("Reshape", ["r1", "back"], ["h2"], name="/attn/Reshape_1"),
        node("Conv", ["h2", "conv_out.weight"], ["y"], name="/conv_out/Conv", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(nodes, "sdrt_trt_verify",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, side, side])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"x": rng.standard_normal((1, 4, side, side)).astype(np.float32)}


def _reference(model: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])


def _rel(want: np.ndarray, got: np.ndarray) -> float:
    return float(np.abs(want.astype(np.float64) - got).max() / (np.abs(want).max() + 1e-12))


def run(device_id: str | None = None, precision: str = "fp16", runs: int = 50) -> dict[str, Any]:
    """Every check, as ``{"checks": [{"name", "ok", "detail"}], "device": ..., ...}``."""
    from onnx import numpy_helper

    from sdrt.graph import Graph
    from sdrt.weights import Weights

    from .backend import TrtBackend, trt_version

    backend = TrtBackend()
    report: dict[str, Any] = {"tensorrt_rtx": trt_version(), "precision": precision, "checks": [],
                              "unusable": backend.unusable()}
    checks: list[dict[str, Any]] = report["checks"]

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})

    devices = backend.devices()
    device = next((d for d in devices if device_id in (None, d.id)), None)
    if device is None:
        check("device", False, f"no usable device{' ' + device_id if device_id else ''}; "
                               f"unusable: {report['unusable'] or 'no NVIDIA GPU found'}")
        return report
    report["device"] = {"id": device.id, "name": device.name, **{k: str(v) for k, v in device.properties.items()}}
    check("device", True, str(device))
    model, feeds = block_model()
    graph = Graph(model)
    want = _reference(model, feeds)
    with tempfile.TemporaryDirectory() as cache_dir:
        start = time.perf_counter()
        session = backend.compile(graph, None, device, precision=precision, cache_dir=cache_dir)
        report["compile_s"] = round(time.perf_counter() - start, 3)
        with session:
            got = session.run(feeds)["y"]
            err = _rel(want, got)
            check("run", err < RTOL[precision], f"relative error {err:.2e} against the reference evaluator "
                                                f"(limit {RTOL[precision]:.0e})")
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                session.run(feeds)
                times.append(time.perf_counter() - t)
            report["run_ms_median"] = round(1000 * float(np.median(times)), 3)
            check("speed", True, f"median {report['run_ms_median']} ms over {runs} runs (numpy in and out)")
            arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
            new = {k: (v * 1.5).astype(np.float32) for k, v in arrays.items() if k in ("to_v", "conv_out.weight")}
            session.update_weights(Weights.from_arrays({**arrays, **new}))
            changed = model.__class__()
            changed.CopyFrom(model)
            for t in changed.graph.initializer:
                if t.name in new:
                    t.CopyFrom(numpy_helper.from_array(new[t.name], t.name))
            err2 = _rel(_reference(changed, feeds), session.run(feeds)["y"])
            check("update_weights", err2 < RTOL[precision],
                  f"after new weights (2 of {len(arrays)} changed): relative error {err2:.2e}")
        rt_files = list(Path(cache_dir).rglob("*.rtcache"))
        check("runtime cache", bool(rt_files), f"{len(rt_files)} runtime cache file(s) written at close")
        start = time.perf_counter()
        with backend.compile(graph, None, device, precision=precision, cache_dir=cache_dir) as again:
            report["cached_compile_s"] = round(time.perf_counter() - start, 3)
            err3 = _rel(want, again.run(feeds)["y"])
        check("engine cache", err3 < RTOL[precision] and report["cached_compile_s"] < report["compile_s"],
              f"second compile {report['cached_compile_s']} s (first {report['compile_s']} s), error {err3:.2e}")
        _quantized_checks(backend, graph, feeds, device, precision, cache_dir, check)
    return report


def _quantized_checks(backend: Any, graph: Any, feeds: dict[str, np.ndarray], device: Any, precision: str,
                      cache_dir: str, check: Any) -> None:
    """Each weight-only scheme the device's target keeps quantized (int8; int4 from sm80; fp8 from sm89): the engine
    runs the quantized graph, and its output is compared with the reference evaluator on the same quantized graph."""
    from sdrt import quantization

    from .quantized import for_target

    target = str(device.properties["target"])
    for scheme, block in (("int8", 32), ("int4", 32), ("fp8", 32)):
        q = quantization.quantize(graph, scheme, block_size=block, keep_layers=())
        given = for_target(quantization.for_backend(q, backend), target)
        kept = len(quantization.quantized_weights(given))
        if not kept:
            check(f"{scheme} weights", True, f"not kept quantized for {target}: run as float32 (nothing to check)")
            continue
        with backend.compile(given, None, device, precision=precision, cache_dir=cache_dir) as session:
            err = _rel(_reference(q.model, feeds), session.run(feeds)["y"])
        check(f"{scheme} weights", err < RTOL[precision],
              f"{kept} weights kept as {scheme}: relative error {err:.2e} against the reference evaluator on the "
              f"quantized graph (limit {RTOL[precision]:.0e})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdrt_trt.verify", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda:N (default: the first usable GPU)")
    parser.add_argument("--precision", default="fp16", choices=sorted(RTOL))
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    from sdrt.errors import SdrtError

    try:
        report = run(args.device, args.precision)
    except SdrtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for c in report["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if all(c["ok"] for c in report["checks"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
