"""``python -m bench.preview``: the cost of a live preview against one UNet step.

Times, interleaved: one step of the bench UNet (``bench/models.py``'s SD 1.x UNet, the batch of 2
that classifier-free guidance runs) on each sdrt backend, and ``sdrt.pipelines.preview.project``
on latents of real sizes (SD 1.x 512x512: 4x64x64; SDXL 1024x1024: 4x128x128; Flux 1024x1024:
16x128x128), plus ``upscale=8`` for SD 1.x. Prints medians and the preview's share of a step.
The bench UNet is 4-5x narrower and runs at a quarter of the real latent area, so its step is far
cheaper than a real one: the share printed is an upper bound for the real models.

    python -m bench.preview [--backends openvino] [--size bench] [--rounds 30] [--taesd FILE]

``--taesd FILE`` also times a TAESD-family decoder (``TaesdPreview``) on a 4x64x64 latent on each backend;
``scripts/make_taesd_bench.py`` exports one with TAESD's real widths (random weights).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from . import harness

LATENTS = [("sd1 4x64x64", "sd1", (4, 64, 64), 1), ("sd1 4x64x64 upscale 8", "sd1", (4, 64, 64), 8),
           ("sdxl 4x128x128", "sdxl", (4, 128, 128), 1), ("flux 16x128x128", "flux", (16, 128, 128), 1)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=None, help="comma-separated sdrt backends (default: every installed one)")
    ap.add_argument("--size", default="bench", choices=["tiny", "bench", "full"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--taesd", type=Path, default=None, help="a TAESD decoder ONNX file to time as well")
    args = ap.parse_args(argv)

    from sdrt.pipelines.preview import project

    workdir = args.workdir or Path(tempfile.gettempdir()) / "sdrt-bench-models"
    workdir.mkdir(parents=True, exist_ok=True)
    path, feeds, outputs = harness.model_file("unet", args.size, workdir)
    backends = harness.sdrt_backends(only=args.backends.split(",") if args.backends else None)
    runners = {b: harness.sdrt_runner(path, outputs, b, {}) for b in backends}
    rng = np.random.default_rng(0)
    latents = {label: rng.standard_normal(shape).astype(np.float32) for label, _, shape, _ in LATENTS}
    times: dict[str, list[float]] = {f"unet step ({b})": [] for b in backends}
    times.update({f"preview {label}": [] for label, *_ in LATENTS})
    taesd = {}
    if args.taesd is not None:
        from sdrt.pipelines.preview import TaesdPreview

        taesd = {b: TaesdPreview(args.taesd, backend=b) for b in backends}
        times.update({f"taesd 4x64x64 ({b})": [] for b in backends})
    for run in runners.values():
        run(feeds)  # warm up
    for prev in taesd.values():
        prev(latents[LATENTS[0][0]])  # compiles once per shape
    for _ in range(args.rounds):
        for b, run in runners.items():
            t = time.perf_counter()
            run(feeds)
            times[f"unet step ({b})"].append(time.perf_counter() - t)
        for label, fmt, _, up in LATENTS:
            t = time.perf_counter()
            project(latents[label], fmt, upscale=up)
            times[f"preview {label}"].append(time.perf_counter() - t)
        for b, prev in taesd.items():
            t = time.perf_counter()
            prev(latents[LATENTS[0][0]])
            times[f"taesd 4x64x64 ({b})"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    shape = "x".join(str(d) for d in feeds["sample"].shape)
    print(f"bench UNet ({args.size}, sample {shape}), {args.rounds} interleaved rounds, medians:")
    for k, v in med.items():
        print(f"  {k:<34} {v:9.3f} ms")
    for b in backends:
        step = med[f"unet step ({b})"]
        for label, *_ in LATENTS:
            print(f"  preview {label:<26} / step ({b}): {100 * med[f'preview {label}'] / step:6.2f} %")
        if taesd:
            print(f"  taesd 4x64x64 ({b})             / step ({b}): {100 * med[f'taesd 4x64x64 ({b})'] / step:6.2f} %")


if __name__ == "__main__":
    main()
