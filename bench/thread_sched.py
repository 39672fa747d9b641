"""``python -m bench.thread_sched``: where each runtime's threads spend a loaded run (Linux scheduler statistics).

    python -m bench.thread_sched --models text_encoder --busy 1          # onnxruntime and sdrt-ggml (fp32)
    python -m bench.thread_sched --models unet --runners ggml --option ggml:precision=bf16 --rounds 3

Each runner times the model in a process of its own (a runtime's threads and their CPU affinity cannot
change where the other runtime's threads run, as they can inside one ``python -m bench`` process), with
``--busy`` busy loops beside it (``python -c 'while 1: pass'``, unpinned, as ``bench.isa_rows --busy``).
Over the timed runs it reads ``/proc/self/task/*/schedstat`` and ``status`` of every thread and prints,
for each thread that ran at least 1% of the time: the CPU it was on at the end and the CPUs it may use,
the share of the wall time it ran and the share it waited runnable on a run queue, and its voluntary
(it slept) and involuntary (the OS took its core) context switches. Two threads on one CPU, or a large
run-queue share, show where the time went; ``perf sched`` does not run on every VM, these files do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _task_stats() -> dict[str, dict[str, Any]]:
    """Per thread of this process: name, CPU time and run-queue wait (ns), switches, CPU, allowed CPUs."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        base = Path("/proc/self/task") / tid
        try:
            run_ns, wait_ns, _ = (int(v) for v in (base / "schedstat").read_text().split()[:3])
            status = dict(line.split(":", 1) for line in (base / "status").read_text().splitlines() if ":" in line)
            stat = (base / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        out[tid] = {"run_ns": run_ns, "wait_ns": wait_ns, "cpu": int(stat[36]),
                    "allowed": status["Cpus_allowed_list"].strip(),
                    "voluntary": int(status["voluntary_ctxt_switches"]),
                    "involuntary": int(status["nonvoluntary_ctxt_switches"])}
    return out


def thread_stats(run: Callable[[], object], seconds: float) -> dict[str, Any]:
    """Call ``run`` for ``seconds``; its times (ms) and each busy thread's scheduler statistics over them."""
    if not Path("/proc/self/task").is_dir() or not Path(f"/proc/self/task/{os.getpid()}/schedstat").exists():
        raise RuntimeError("bench.thread_sched needs Linux's /proc/<pid>/task/<tid>/schedstat")
    window0 = time.perf_counter()  # the statistics' window: from before the first read to after the last
    before = _task_stats()
    t0 = time.perf_counter()
    times = []
    while True:
        s = time.perf_counter()
        run()
        times.append((time.perf_counter() - s) * 1e3)
        if time.perf_counter() - t0 >= seconds:
            break
    wall = time.perf_counter() - t0
    after = _task_stats()
    window = time.perf_counter() - window0  # the CPU time read includes reading the statistics themselves
    threads = []
    for tid, b in after.items():
        a = before.get(tid)
        if a is None or (b["run_ns"] - a["run_ns"]) < 0.01 * window * 1e9:
            continue
        threads.append({"tid": int(tid), "main": int(tid) == os.getpid(), "cpu": b["cpu"], "allowed": b["allowed"],
                        "run": (b["run_ns"] - a["run_ns"]) / 1e9 / window,
                        "runqueue_wait": (b["wait_ns"] - a["wait_ns"]) / 1e9 / window,
                        "voluntary": b["voluntary"] - a["voluntary"],
                        "involuntary": b["involuntary"] - a["involuntary"]})
    threads.sort(key=lambda t: (not t["main"], -t["run"]))
    return {"runs": len(times), "median_ms": statistics.median(times), "wall_s": wall, "threads": threads}


def _child(runner: str, model: str, size: str, options: dict[str, Any], seconds: float, warmup: int) -> dict:
    from bench import harness
    from bench.__main__ import _default_workdir

    path, feeds, outputs = harness.model_file(model, size, _default_workdir())
    if runner == "onnxruntime":
        fn = harness.ort_runner(path, outputs, None)
    else:
        fn = harness.sdrt_runner(harness.stripped_file(path) or path, outputs, runner, options)
    for _ in range(warmup):
        fn(feeds)
    return thread_stats(lambda: fn(feeds), seconds)


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.thread_sched", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="text_encoder", help="comma-separated bench models")
    p.add_argument("--size", default="bench", choices=["tiny", "bench", "full"])
    p.add_argument("--runners", default="onnxruntime,ggml", help="onnxruntime and/or sdrt backends")
    p.add_argument("--option", action="append", default=[], metavar="BACKEND:KEY=VALUE",
                   help="an sdrt load option (default ggml:precision=fp32)")
    p.add_argument("--busy", type=int, default=1, help="busy loops beside each run")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per runner and round")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the runners alternating in each")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    options: dict[str, dict[str, Any]] = {"ggml": {"precision": "fp32"}}
    for opt in args.option:
        be, _, kv = opt.partition(":")
        key, _, value = kv.partition("=")
        if not be or not key or not value:
            p.error(f"--option {opt!r}: expected BACKEND:KEY=VALUE, e.g. ggml:precision=fp32")
        options.setdefault(be, {})[key] = value
    if args.child:
        runner, _, model = args.child.partition(":")
        res = _child(runner, model, args.size, options.get(runner, {}), args.seconds, args.warmup)
        print(json.dumps(res))
        return 0
    for r in range(args.rounds):
        for model in args.models.split(","):
            for runner in args.runners.split(","):
                cmd = [sys.executable, "-m", "bench.thread_sched", "--child", f"{runner}:{model}", "--size", args.size,
                       "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
                for opt in args.option:
                    cmd += ["--option", opt]
                before = _load()
                loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
                try:
                    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
                finally:
                    for loop in loops:
                        loop.kill()
                        loop.wait()
                res = json.loads(done.stdout.strip().splitlines()[-1])
                label = runner if runner == "onnxruntime" else f"sdrt-{runner}"
                print(f"round {r + 1} {model} {label}: median {res['median_ms']:.1f} ms over {res['runs']} runs, "
                      f"busy {args.busy}, load {before}->{_load()}; threads with their process's CPU time "
                      f"{sum(t['run'] for t in res['threads']):.2f} cores")
                for t in res["threads"]:
                    print(f"  {'caller' if t['main'] else 'thread':6s} cpu {t['cpu']} (may use {t['allowed']:>5s})  "
                          f"ran {100 * t['run']:5.1f}%  waited runnable {100 * t['runqueue_wait']:5.1f}%  "
                          f"slept {t['voluntary']:5d}x  preempted {t['involuntary']:5d}x")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
