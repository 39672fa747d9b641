"""Build every bench model for every TensorRT-RTX target and print a Markdown table of engine sizes and build times.

    python plugin-trt/scripts/aot_table.py --size tiny [--precision fp16] [--models unet ...]

Runs on any machine (no GPU needed): the figures in docs/trt.md come from it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from bench.models import SIZES, build
    from sdrt.graph import Graph
    from sdrt_trt import TrtBackend
    from sdrt_trt.backend import trt_version
    from sdrt_trt.errors import TrtError

    p = argparse.ArgumentParser()
    p.add_argument("--size", default="tiny", choices=["tiny", "bench", "full"])
    p.add_argument("--precision", default="fp16")
    p.add_argument("--models", nargs="*", default=list(SIZES))
    p.add_argument("--targets", nargs="*", default=None)
    args = p.parse_args()
    backend = TrtBackend()
    targets = args.targets or backend.targets()
    print(f"TensorRT-RTX {trt_version()}, bench size {args.size!r}, precision {args.precision}; "
          "engine MB / build s (wall clock of Backend.build: prepare + parse + build + write)\n")
    print("| model | " + " | ".join(targets) + " |")
    print("|---|" + "---|" * len(targets))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            graph = Graph(build(name, args.size)[0])
            cells = []
            for target in targets:
                start = time.perf_counter()
                try:
                    out = backend.build(graph, None, target, Path(tmp) / f"{name}.{target}.engine",
                                        precision=args.precision)
                except TrtError as exc:
                    cells.append(f"fails: {exc.what[:60]}")
                    continue
                cells.append(f"{out.stat().st_size / 1e6:.1f} / {time.perf_counter() - start:.1f}")
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
