"""``python -m bench.isa_rows``: sdrt-ggml against onnxruntime on each CPU ISA, at float32 and the default.

    python -m bench.isa_rows                       # 5 models x (avx512, avx2 pin) x (fp32, default)
    python -m bench.isa_rows --min-seconds 4 --isas avx2 --precisions fp32
    python -m bench.isa_rows --isas native --busy 1   # loaded: one busy loop beside every run

Each configuration is one ``python -m bench`` run in a child process (onnxruntime and sdrt-ggml interleaved
in each round, so the ratios come from one run), with the dispatch pinned through ``SDRT_GGML_GEMM_ISA`` and
``SDRT_GGML_OPS_ISA`` for the pinned ISAs. onnxruntime has no public ISA pin: its MLAS kernels always take
the best the CPU has, so a pinned row compares sdrt-ggml's AVX2 kernels with MLAS's AVX-512 ones on an
AVX-512 CPU, not what an AVX2 CPU measures. The table gives, per model and configuration, both medians, the
median ratio, the paired ratio (median over rounds of ggml / onnxruntime) and the target (docs/ggml.md,
"Every CPU"), with the load average before and after each run. ``--busy N`` starts N busy loops (one Python
process each, normal priority, unpinned) for the length of each run: the "loaded" rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: the most sdrt-ggml may take, as a multiple of onnxruntime's time (issue 38)
TARGETS = {"vae_decoder": 1.0, "unet": 1.0, "text_encoder": 1.0, "mobilenet_v3": 1.5, "mobilenet_v2": 1.5}


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def run_config(isa: str, precision: str, models: str, min_seconds: float, out: Path, busy: int = 0) -> dict:
    env = dict(os.environ)
    if isa != "native":
        env["SDRT_GGML_GEMM_ISA"] = env["SDRT_GGML_OPS_ISA"] = isa
    cmd = [sys.executable, "-m", "bench", "--models", models, "--peers", "onnxruntime", "--backends", "ggml",
           "--pair-with", "onnxruntime", "--no-full", "--no-pipeline", "--min-seconds", str(min_seconds),
           "--json", str(out)]
    if precision != "default":
        cmd += ["--option", f"ggml:precision={precision}"]
    before = _load()
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
    try:
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return {"load": f"{before}->{_load()}", "busy": busy, **json.loads(out.read_text())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.isa_rows", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(TARGETS))
    p.add_argument("--isas", default="native,avx2", help="native (the best the CPU has) and/or pins (avx2, ...)")
    p.add_argument("--precisions", default="fp32,default", help="fp32, bf16 and/or default (the device's)")
    p.add_argument("--min-seconds", type=float, default=6.0, help="timing budget per model and configuration")
    p.add_argument("--busy", type=int, default=0, help="busy loops beside each run (the loaded rows)")
    p.add_argument("--json", type=Path, default=Path("bench-isa-rows.json"))
    args = p.parse_args(argv)
    rows, report = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for isa in args.isas.split(","):
            for prec in args.precisions.split(","):
                res = run_config(isa, prec, args.models, args.min_seconds, Path(tmp) / f"{isa}-{prec}.json",
                                 args.busy)
                report[f"{isa}/{prec}"] = res
                by = {(r["model"], r["runner"]): r for r in res["results"]}
                first = len(rows)
                for model in args.models.split(","):
                    ort, ggml = by.get((model, "onnxruntime")), by.get((model, "sdrt-ggml"))
                    if not ort or not ggml or ggml.get("error") or ggml["median_ms"] is None:
                        rows.append(f"{model:13s} {isa:7s} {prec:8s} failed: {(ggml or {}).get('error')}")
                        continue
                    ratio, paired = ggml["median_ms"] / ort["median_ms"], ggml["paired_ratio"]
                    ok = "ok" if max(ratio, paired) <= TARGETS.get(model, 1.0) else "MISS"
                    rows.append(f"{model:13s} {isa:7s} {prec:8s} {ort['median_ms']:9.2f} {ggml['median_ms']:9.2f} "
                                f"{ratio:7.3f}x {paired:7.3f}x  <= {TARGETS.get(model, 1.0):.1f}x {ok:4s} "
                                f"{ggml['max_rel_err']:.1e}  {res['load']}")
                print("\n".join(rows[first:]), flush=True)
    print(f"\n{'model':13s} {'isa':7s} {'ggml':8s} {'ort ms':>9s} {'ggml ms':>9s} {'median':>8s} {'paired':>8s}"
          f"  target      max rel err  load")
    print("\n".join(rows))
    args.json.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
