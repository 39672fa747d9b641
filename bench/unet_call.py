"""One full-size SD 1.5 UNet call, sdrt-openvino against raw OpenVINO on what OpenVINO GenAI compiles, alternating.

    python -m bench.unet_call --size 256 --rounds 6          # sdrt, GenAI's IR (dynamic and static shapes)

The model folder is ``bench.e2e``'s (``onnx/`` and the ``genai/`` IR it converts). Every variant is compiled once
in this process at the same precision (``bf16`` unless ``--precision fp32``), with the LATENCY hint, then each
round calls every variant once on the same CFG batch (``[2, 4, size/8, size/8]``, 77 tokens) and the table gives
each one's fastest and median call and its ratio to sdrt's. Variants: ``sdrt`` (``sdrt.load`` of the ONNX pinned to
the call's shapes, as the pipeline compiles it, no cache), ``ir-dynamic`` (GenAI's IR as GenAI compiles it, dynamic
shapes), ``ir-static`` (the IR reshaped to the call's shapes). Each holds its compiled weights: about 2 GiB each
at bf16, 4 GiB at fp32.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("SDRT_E2E_MODEL", "/work/models/sd15-full")))
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--variants", default="sdrt,ir-dynamic,ir-static")
    args = ap.parse_args(argv)
    import openvino as ov

    rng = np.random.default_rng(0)
    lat = args.size // 8
    feeds = {"sample": rng.standard_normal((2, 4, lat, lat), dtype=np.float32),
             "timestep": np.array([999.0, 999.0], np.float32),
             "encoder_hidden_states": rng.standard_normal((2, 77, 768), dtype=np.float32)}
    ir_feeds = dict(feeds, timestep=np.array([999, 999], np.int64))  # GenAI's IR takes int64 timesteps
    hint = {"bf16": "bf16", "fp32": "f32"}[args.precision]
    core = ov.Core()
    calls: dict[str, Any] = {}
    for name in args.variants.split(","):
        t0 = time.perf_counter()
        if name == "sdrt":
            import sdrt
            from sdrt.graph import Graph

            graph = Graph.load(str(args.model / "onnx" / "unet" / "model.onnx"))
            sess = sdrt.load(graph.with_shapes({k: v.shape for k, v in feeds.items()}), backend="openvino",
                             precision=args.precision, cache=False)
            calls[name] = lambda s=sess: s.run(feeds)
        elif name in ("ir-dynamic", "ir-static"):
            model = core.read_model(str(args.model / "genai" / "unet" / "openvino_model.xml"))
            if name == "ir-static":
                model.reshape({k: list(v.shape) for k, v in ir_feeds.items()})
            compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint,
                                                         "PERFORMANCE_HINT": "LATENCY"})
            del model
            request = compiled.create_infer_request()
            calls[name] = lambda r=request: r.infer(ir_feeds)
        else:
            raise SystemExit(f"unknown variant {name}")
        print(f"{name}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        calls[name]()  # the first call packs weights: not timed
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    base = min(times.get("sdrt", next(iter(times.values()))))
    print(f"{'variant':12s} {'min s':>8s} {'median s':>9s} {'min / sdrt':>11s}")
    for name, t in times.items():
        print(f"{name:12s} {min(t):8.3f} {statistics.median(t):9.3f} {min(t) / base:11.2f}")
    print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
