"""Time `sdrt generate "a red circle on blue"` end to end (process start to PNG), per backend.

    python scripts/demo_model/time_generate.py [--runs 5] [--backends openvino,ggml,reference,auto]

Runs the command once as a warm-up (compile caches), then --runs times, in the environment's `sdrt`; prints per
backend the median wall time (min-max), the median CPU time of the child process, and the load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def one_run(sdrt: str, backend: str, out: Path) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cmd = [sdrt, "generate", "a red circle on blue", "-o", str(out)]
    if backend != "auto":
        cmd += ["--backend", backend]
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--backends", default="openvino,ggml,reference,auto")
    args = ap.parse_args()
    sdrt = shutil.which("sdrt")
    if sdrt is None:
        raise SystemExit("no `sdrt` command on PATH: run this in the environment sdrt is installed in")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.png"
        for backend in args.backends.split(","):
            one_run(sdrt, backend, out)
            runs = [one_run(sdrt, backend, out) for _ in range(args.runs)]
            walls = sorted(w for w, _ in runs)
            load = os.getloadavg()[0]
            print(f"{backend}: wall {statistics.median(walls):.2f} s ({walls[0]:.2f}-{walls[-1]:.2f}), "
                  f"CPU {statistics.median(c for _, c in runs):.2f} s, load average {load:.1f}")


if __name__ == "__main__":
    main()
