"""The real exports of issue 20 on one ggml device, against onnxruntime: max error, time, placement.

    python scripts/ggml_device_check.py --device Vulkan0 [--models unet_sd15 ...] [--json out.json]

Runs each graph of ``tests/data/ggml_exports`` (filled with the seeded random weights that
``tests/plugins/ggml/test_ggml_exports.py`` uses) on the named ggml device and on onnxruntime's
CPU provider, and prints per model: the max error relative to the output's range, the compile time, the first run's (which also builds the device's pipelines) and the second's, and how many ggml graph nodes ran on the device and
how many fell back to the CPU through ggml's scheduler (with the op names that did). Exits 1
when a model fails or exceeds ``--limit``. ``nox -s ggml_vulkan`` runs it on Mesa's lavapipe.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "plugins" / "ggml"))



def check_model(name: str, device: object, tmp: Path, limit: float) -> dict[str, object]:
    import onnx
    from test_ggml_exports import range_error, reference

    from sdrt.graph import Graph
    from sdrt_ggml import GgmlBackend

    path, feeds, want = reference(name, tmp)
    t0 = time.perf_counter()
    with GgmlBackend().compile(Graph(onnx.load(str(path))), None, device) as session:
        t1 = time.perf_counter()
        got = session.run(feeds)
        t2 = time.perf_counter()
        session.run(feeds)  # the first run also builds the device's pipelines (shader compiles)
        t3 = time.perf_counter()
        placement = session.placement()
    err = max(range_error(got[key], w) for key, w in want.items())
    return {"model": name, "max_rel_error": err, "ok": err <= limit, "compile_s": round(t1 - t0, 2),
            "first_run_s": round(t2 - t1, 2), "run_s": round(t3 - t2, 3), "placement": placement}


def main() -> int:
    from test_ggml_exports import MODELS

    from sdrt_ggml import GgmlBackend

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", required=True, help="a ggml device id as `sdrt info` lists it (Vulkan0, CUDA0, CPU)")
    ap.add_argument("--models", nargs="*", default=MODELS, help=f"default: all of {', '.join(MODELS)}")
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    ap.add_argument("--limit", type=float, default=1e-4,
                    help="max error, relative to the output's range (default 1e-4, the CPU tests' limit)")
    args = ap.parse_args()
    devices = {d.id: d for d in GgmlBackend().devices()}
    if args.device not in devices:
        print(f"error: ggml device {args.device!r} is not registered (this build has: {', '.join(devices)})",
              file=sys.stderr)
        return 2
    device = devices[args.device]
    print(f"device {device.id}: {device.name}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            try:
                r = check_model(name, device, Path(tmp), args.limit)
            except Exception as exc:  # noqa: BLE001 - report every model, then fail
                r = {"model": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            results.append(r)
            if "error" in r:
                print(f"{name:20s} FAILED {r['error']}")
                continue
            pl = r["placement"]
            cpu_ops = ", ".join(f"{op} {n}" for op, n in sorted(pl["fallback_ops"].items())) or "-"
            print(f"{name:20s} {'ok  ' if r['ok'] else 'FAIL'} max err {r['max_rel_error']:.1e}  "
                  f"compile {r['compile_s']:5.2f} s  first run {r['first_run_s']:6.2f} s  run {r['run_s']:7.3f} s  "
                  f"nodes on device {pl['device_nodes']}, on CPU {pl['fallback_nodes']} ({cpu_ops}), splits {pl['splits']}",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": device.id, "name": device.name, "results": results}, indent=1))
    failed = [r["model"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
