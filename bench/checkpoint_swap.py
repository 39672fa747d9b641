"""``python -m bench.checkpoint_swap``: weight swaps in a pipeline against a fresh load, and low-memory RSS.

    python -m bench.checkpoint_swap                                   # tiny-sd15 + its test checkpoint
    python -m bench.checkpoint_swap --folder SD15_ONNX --weights model.safetensors --lora x.safetensors

Per backend (OpenVINO, ggml where it runs the folder), interleaved over ``--rounds``:

- ``fresh``: ``pipelines.load(folder)`` and compiling every part (one 1-step generation), the cost
  of opening the folder again for other weights;
- ``first``: the warm pipeline's first ``pipe.load_weights(checkpoint)`` (OpenVINO compiles each part once
  more then, into the form later swaps import; ggml lowers again the parts whose folded weights changed);
- ``swap``: ``pipe.load_weights(...)`` on the warm pipeline, alternating between the checkpoint and a
  second one with other values (every weight changes on every swap; binding equal weights again would
  measure nothing);
- ``lora``: ``pipe.set_loras([(lora, 0.8)])``; ``unlora``: ``pipe.set_loras([])``.

Then peak RSS (``ru_maxrss`` of a fresh process, cold compile cache, median of ``--rss-runs``) of one
generation in the normal and the low-memory mode, and the time each took. The default folder is tiny
(its RSS is the libraries'); ``scripts/gen_checkpoint_data.py bench-folder DIR`` writes a ~0.6 GB one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from sdrt.errors import SdrtError

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "tests" / "data" / "pipelines" / "tiny-sd15"
DATA = ROOT / "tests" / "data" / "ckpt" / "pipe-sd15"
KW = dict(steps=1, cfg=7.0, sampler="Euler", seed=1)


def _pipeline(folder: Path, backend: str, **kw: Any) -> Any:
    from sdrt import pipelines

    return pipelines.load(folder, backend=backend, **kw)


def _other_checkpoint(weights: Path, out: Path) -> Path:
    """A checkpoint with the keys and dtypes of ``weights`` and other values (each float tensor scaled)."""
    import numpy as np

    from sdrt.weights import Weights

    src = Weights.open(weights)
    arrays = {k: (src[k] * np.asarray(0.9, src[k].dtype)) if src[k].dtype.kind == "f" else src[k] for k in src}
    Weights.from_arrays(arrays).save(out)
    return out


def time_swaps(folder: Path, weights: Path, lora: Path, backend: str, rounds: int) -> dict[str, float]:
    import tempfile

    times: dict[str, list[float]] = {"fresh": [], "first": [], "swap": [], "lora": [], "unlora": []}
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = [weights, _other_checkpoint(weights, Path(tmp) / "other.safetensors")]
        warm = _pipeline(folder, backend)
        warm("a photo", **KW)
        t = time.perf_counter()
        warm.load_weights(weights)
        times["first"].append(time.perf_counter() - t)
        for i in range(rounds):
            t = time.perf_counter()
            p = _pipeline(folder, backend)
            p("a photo", **KW)
            times["fresh"].append(time.perf_counter() - t)
            p.close()
            t = time.perf_counter()
            warm.load_weights(ckpts[(i + 1) % 2])
            times["swap"].append(time.perf_counter() - t)
            t = time.perf_counter()
            warm.set_loras([(lora, 0.8)])
            times["lora"].append(time.perf_counter() - t)
            t = time.perf_counter()
            warm.set_loras([])
            times["unlora"].append(time.perf_counter() - t)
        warm.close()
    return {k: statistics.median(v) for k, v in times.items()}


_RSS = textwrap.dedent("""
    import json, resource, sys, time
    from sdrt import pipelines
    folder, backend, low, weights, steps = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], int(sys.argv[5])
    t = time.perf_counter()
    p = pipelines.load(folder, backend=backend, low_memory=low)
    if weights:
        p.load_weights(weights)
    p("a photo of a cat", steps=steps, cfg=7.0, sampler="Euler", seed=1)
    print(json.dumps({"seconds": time.perf_counter() - t,
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")


def peak_rss(folder: Path, backend: str, low: bool, weights: Path | None, steps: int) -> dict[str, float]:
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as cache:  # a cold compile cache for each run: the same work in both modes
        out = subprocess.run([sys.executable, "-c", _RSS, str(folder), backend, "1" if low else "0",
                              str(weights or ""), str(steps)], capture_output=True, text=True, check=False,
                             env={**os.environ, "SDRT_CACHE_DIR": cache})
    if out.returncode:
        raise SystemExit(f"peak-RSS run failed ({backend}, low_memory={low}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(argv: list[str]) -> int:
    backend, folder, weights, lora, rounds = argv
    try:
        t = time_swaps(Path(folder), Path(weights), Path(lora), backend, int(rounds))
    except SdrtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(t))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench.checkpoint_swap", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=FOLDER)
    ap.add_argument("--weights", type=Path, default=DATA / "custom.safetensors")
    ap.add_argument("--lora", type=Path, default=DATA / "tinylora.safetensors")
    ap.add_argument("--backends", default="openvino,ggml")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="sampler steps of the peak-RSS generation")
    ap.add_argument("--rss-runs", type=int, default=3, help="peak-RSS runs per mode (median reported; 0: none)")
    ap.add_argument("--json", type=Path, default=Path("bench-checkpoint.json"))
    args = ap.parse_args(argv)
    results: dict[str, Any] = {"folder": str(args.folder), "weights": str(args.weights)}
    print(f"{'backend':10} {'fresh load':>11} {'1st swap':>9} {'swap':>9} {'x':>6} {'LoRA on':>9} {'x':>6} "
          f"{'LoRA off':>9} {'x':>6}")
    for backend in [b for b in args.backends.split(",") if b]:
        # in a child process: a backend that cannot run the folder (or aborts on it) is reported, not fatal
        child = subprocess.run([sys.executable, "-m", "bench.checkpoint_swap", "--child", backend, str(args.folder),
                                str(args.weights), str(args.lora), str(args.rounds)], capture_output=True, text=True,
                               check=False, cwd=ROOT)
        if child.returncode:
            why = (child.stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
            print(f"{backend:10} cannot run the folder: {why[:200]}")
            results[backend] = {"error": why}
            continue
        t = json.loads(child.stdout.strip().splitlines()[-1])
        f = t["fresh"]
        print(f"{backend:10} {f * 1e3:9.1f}ms {t['first'] * 1e3:7.1f}ms {t['swap'] * 1e3:7.1f}ms {f / t['swap']:5.1f}x "
              f"{t['lora'] * 1e3:7.1f}ms {f / t['lora']:5.1f}x {t['unlora'] * 1e3:7.1f}ms {f / t['unlora']:5.1f}x")
        if args.rss_runs < 1:
            results[backend] = {"seconds": t}
            continue
        runs: dict[str, list[dict[str, float]]] = {"normal": [], "low": []}
        for _ in range(args.rss_runs):  # interleaved; the peak of a compile varies from run to run
            for mode in runs:
                runs[mode].append(peak_rss(args.folder, backend, mode == "low", args.weights, args.steps))
        rss = {mode: {k: statistics.median(r[k] for r in rs) for k in ("peak_mib", "seconds")}
               for mode, rs in runs.items()}
        ratio = rss["low"]["peak_mib"] / rss["normal"]["peak_mib"]
        print(f"{'':10} peak RSS normal {rss['normal']['peak_mib']:.0f} MiB ({rss['normal']['seconds']:.2f} s), "
              f"low-memory {rss['low']['peak_mib']:.0f} MiB ({rss['low']['seconds']:.2f} s): {ratio:.0%} of normal")
        results[backend] = {"seconds": t, "rss": rss, "low_over_normal": ratio}
    args.json.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
