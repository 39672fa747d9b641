"""sdrt-ggml variants timed against each other: each rewrite on/off, conv and depthwise layouts.

    python -m bench.ggml_rewrites                      # bench-size models, every variant
    python -m bench.ggml_rewrites --models unet --rounds 7 --threads 1

Every variant of a model is compiled once, checked against onnxruntime (max
relative error), then all are timed interleaved (each round runs each variant
once, in rotated order) so machine load hits them alike. Prints the median per
variant and its ratio to the default configuration.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path
from typing import Any

from sdrt.testing import models

from . import harness
from .__main__ import _default_workdir

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no rewrites": {"rewrites": ()},
    "no attention rewrite": {"rewrites": ("silu", "groupnorm")},
    "attention by ggml (flash)": {"attention": "ggml"},
    "gelu by ggml (erff)": {"gelu": "ggml"},
    "groupnorm by ggml": {"groupnorm": "ggml"},
    "no native kernels": {"attention": "ggml", "gelu": "ggml", "groupnorm": "ggml"},
    "no groupnorm rewrite": {"rewrites": ("silu", "attention")},
    "no silu rewrite": {"rewrites": ("attention", "groupnorm")},
    "conv im2col_nhwc": {"conv_impl": "im2col_nhwc"},
    "conv direct": {"conv_impl": "direct"},
    "conv taps": {"conv_impl": "taps"},
    "conv im2col": {"conv_impl": "im2col"},
    "conv rowcopy": {"conv_impl": "rowcopy"},
    "depthwise nchw": {"dw_layout": "nchw"},
    "no K padding": {"pad_k": False},
    "accel (BLAS)": {"accel": True},
    "transpose by strided write": {"transpose": "write"},
    "NCHW only": {"layouts": False},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ggml_rewrites", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(models.MODELS))
    p.add_argument("--size", default="bench", choices=["tiny", "bench", "full"])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    workdir = args.workdir or _default_workdir()
    for name in args.models.split(","):
        path, feeds, outputs = harness.model_file(name, args.size, workdir)
        ref = harness.ort_runner(path, outputs, args.threads)(feeds)
        runs: list[tuple[str, Any, list[float], float]] = []
        for label in args.variants.split(","):
            opts = dict(VARIANTS[label])
            if args.threads:
                opts["threads"] = args.threads
            fn = harness.sdrt_runner(path, outputs, "ggml", opts)
            err = harness.max_rel_err(fn(feeds), ref)
            runs.append((label, fn, [], err))
        for r in range(args.rounds):
            shift = r % len(runs)
            for _label, fn, times, _ in runs[shift:] + runs[:shift]:
                gc.disable()
                t0 = time.perf_counter()
                fn(feeds)
                times.append((time.perf_counter() - t0) * 1e3)
                gc.enable()
        base = statistics.median(runs[0][2])
        print(f"\n{name} ({args.size}), {args.rounds} rounds")
        print(f"{'variant':24s} {'median ms':>10s} {'vs default':>10s} {'max rel err':>12s}")
        for label, _, times, err in runs:
            med = statistics.median(times)
            print(f"{label:24s} {med:10.2f} {med / base:9.3f}x {err:12.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
