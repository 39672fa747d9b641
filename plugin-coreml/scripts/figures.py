"""The figures of docs/coreml.md: every bench model lowered, saved as .mlpackage, and checked by MIL
value inference against onnxruntime. Run from the repository root (needs onnxruntime):

    python plugin-coreml/scripts/figures.py --size bench --out /tmp/coreml-figures

Prints one JSON line per model and a Markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import sdrt  # noqa: E402
from bench.models import build as bench_model  # noqa: E402
from sdrt_coreml.backend import CoreMLBackend  # noqa: E402
from sdrt_coreml.evaluate import evaluate, evaluate_package  # noqa: E402
from sdrt_coreml.options import parse_options  # noqa: E402

MODELS = ["vae_decoder", "unet", "text_encoder", "mobilenet_v3", "mobilenet_v2"]


def intermediates(model: onnx.ModelProto, feeds: dict) -> dict:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for name in node.output:
            if name and name not in have:
                m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                have.add(name)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def err(got: np.ndarray | None, want: np.ndarray) -> float | None:
    return None if got is None else float(np.abs(got.astype(np.float32) - want).max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="bench")
    ap.add_argument("--out", default="/tmp/coreml-figures")
    ap.add_argument("--models", nargs="*", default=MODELS)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    be = CoreMLBackend()
    rows = []
    for name in args.models:
        model, feeds = bench_model(name, args.size)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        graph = sdrt.Graph.load(model.SerializeToString())
        row = {"model": name, "size": args.size, "onnx_nodes": len(model.graph.node), "max_abs_ref": float(np.abs(want).max())}
        for target in ("macOS14", "macOS15"):
            pkg = out_dir / f"{name}-{args.size}-{target}.mlpackage"
            shutil.rmtree(pkg, ignore_errors=True)
            opts = parse_options({"target": target})
            t0 = time.perf_counter()
            static, arrays = be._prepare(graph, None, opts)
            t1 = time.perf_counter()
            built = be._build(static, arrays, opts, pkg)
            row[target] = {"prepare_s": round(t1 - t0, 2), **{f"{k}_s": round(v, 2) for k, v in built.seconds.items()},
                           "mil_ops": built.n_ops, "top_ops": dict(list((k, v) for k, v in built.op_counts.items()
                                                                        if k != "const")[:6]),
                           "package_mb": round(size_of(pkg) / 2**20, 2),
                           "rewritable_inits": f"{len(built.weights)}/{len(built.weights) + len(built.folded)}"}
        ref = intermediates(model, feeds) if name != "text_encoder" else None
        for target in ("macOS14", "macOS15"):
            t0 = time.perf_counter()
            ev = evaluate(graph, feeds, target=target, reference=ref)
            row[target].update({"eval_s": round(time.perf_counter() - t0, 2), "lowering_err": err(
                next(iter(ev.outputs.values())), want), "stand_ins": ev.stand_ins, "sdpa": ev.fused_attention})
        if name == "text_encoder":
            for precision in ("fp16", "fp32"):
                pkg = out_dir / f"{name}-{args.size}-{precision}.mlpackage"
                shutil.rmtree(pkg, ignore_errors=True)
                be.build(graph, None, None, pkg, precision=precision)
                t0 = time.perf_counter()
                ev = evaluate_package(pkg, feeds)
                row[f"package_{precision}_err"] = err(next(iter(ev.outputs.values())), want)
                row[f"package_{precision}_eval_s"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| model | ONNX nodes | MIL ops | package MB | lower s | convert+save s | rewritable inits | "
          "lowering err (macOS14 / macOS15) | sdpa |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        a, b = r["macOS14"], r["macOS15"]
        print(f"| {r['model']} | {r['onnx_nodes']} | {a['mil_ops']} | {a['package_mb']} | {a['lower_s']} | "
              f"{a['convert_s'] + a['save_s']:.1f} | {a['rewritable_inits']} | {a['lowering_err']:.2g} / "
              f"{b['lowering_err']:.2g} | {b['sdpa']} |")


if __name__ == "__main__":
    main()
