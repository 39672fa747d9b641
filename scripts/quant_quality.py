"""The quality table of docs/quantization.md: each precision (fp32, int8, int4, fp8) against float32.

Two kinds of rows, both on random-weight models (nothing is downloaded):

- image rows: the tiny pipeline folders of tests/data/pipelines, one image per (folder, precision,
  backend) on the same seed; PSNR of the final image against the float32 image of the same backend,
  and the UNet's (the quantized part's) relative tensor error on the same inputs;
- part rows: the bench-size UNet and CLIP-L-sized text encoder of ``sdrt.testing.models``
  (the ``bench`` size): relative error of the output and median time of one run.

The tiny models' layers are 8 to 64 wide, so their int4 rows use blocks of 16 (``int4-16``); the bench
models use the default blocks of 32. Run from a venv with sdrt and its plugins:

    python scripts/quant_quality.py [--backends openvino,ggml] [--out table.md]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "pipelines"
PROMPT = "a red cube on a wooden table"


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def image_rows(backends: list[str], steps: int) -> list[str]:
    from sdrt import pipelines

    rows = []
    for folder in ("tiny-sd15", "tiny-sdxl"):
        for be in backends:
            base = None
            base_unet = None
            for prec in ("fp32", "int8", "int4-16", "fp8"):
                opts = {} if prec == "fp32" else {"quantize": prec}
                pipe = pipelines.load(DATA / folder, backend=be, **opts)
                pipe(PROMPT, steps=1, seed=1)  # compile outside the timing
                t0 = time.perf_counter()
                img = pipe(PROMPT, steps=steps, seed=1)[0]
                per_step = (time.perf_counter() - t0) / steps
                unet = pipe.unet
                feeds = _unet_feeds(unet)
                out = next(iter(unet.run(feeds).values()))
                pipe.close()
                if base is None:
                    base, base_unet = img, out
                p = psnr(img, base)
                rows.append(f"| {folder} | {be} | {prec} | {'ref' if prec == 'fp32' else f'{p:.1f} dB'} | "
                            f"{rel(out, base_unet):.2e} | {per_step * 1000:.1f} |")
    return rows


def _unet_feeds(part) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for name, info in part.inputs.items():
        shape = [d if isinstance(d, int) else {"batch": 2, "sequence": 77}.get(str(d), 2) for d in info.shape]
        if name == "sample":
            shape = [2, shape[1], 8, 8]
        if info.dtype.startswith("int"):
            feeds[name] = np.full(shape, 500, info.dtype)
        elif name in ("timestep", "timesteps"):
            feeds[name] = np.full(shape, 500.0, np.float32)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def part_rows(backends: list[str], rounds: int) -> list[str]:
    import onnx

    import sdrt
    from sdrt.graph import Graph
    from sdrt.testing.models import build

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("unet", "text_encoder"):
            model, feeds = build(name, "bench")
            size = sum(int(np.prod(t.dims)) * 4 for t in model.graph.initializer if t.data_type == 1)
            path = Path(tmp) / f"{name}.onnx"
            onnx.save_model(model, str(path), save_as_external_data=True, location=f"{name}.onnx_data")
            graph = Graph.load(path)
            for be in backends:
                base = None
                for prec in ("fp32", "int8", "int4", "fp8"):
                    opts = {} if prec == "fp32" else {"quantize": prec}
                    sess = sdrt.load(graph, backend=be, **opts)
                    out = next(iter(sess.run(feeds).values()))
                    times = []
                    for _ in range(rounds):
                        t0 = time.perf_counter()
                        sess.run(feeds)
                        times.append(time.perf_counter() - t0)
                    sess.close()
                    if base is None:
                        base = out
                    rows.append(f"| {name} ({size / 1e6:.0f} MB f32) | {be} | {prec} | {rel(out, base):.2e} | "
                                f"{np.median(times) * 1000:.1f} |")
    return rows


def gguf_rows() -> list[str]:
    """Each GGUF type written with gguf's writer and read by sdrt: bits per weight, relative RMS error
    against the float32 values written, and the largest difference between sdrt's values (gguf's
    dequantizer) and ggml's own C ``to_float`` on the same bytes."""
    import sys

    import gguf

    sys.path.insert(0, str(ROOT / "tests" / "gguf"))
    from gguf_files import GGML_QUANTIZED, NUMPY_QUANTIZED, PLAIN, SHAPE, encode, ggml_dequantize, values, write

    from sdrt.weights import Weights

    rows = []
    x = values()
    with tempfile.TemporaryDirectory() as tmp:
        for t in PLAIN[:3] + NUMPY_QUANTIZED + GGML_QUANTIZED:
            data = encode(t, x)
            w = Weights.open(write(Path(tmp) / f"{t}.gguf", {"w": (t, data, SHAPE)}))
            got = np.asarray(w["w"], np.float32)
            rms = float(np.sqrt(np.mean((got - x) ** 2) / np.mean(x ** 2)))
            if t in PLAIN:
                diff = "(plain)"
            else:
                diff = f"{float(np.abs(got.reshape(-1) - ggml_dequantize(data, t, x.size)).max()):.1e}"
            bits = 8 * data.nbytes / x.size
            rows.append(f"| {t} | {bits:.2f} | {rms:.2e} | {diff} |")
    del gguf
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="openvino,ggml")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ.setdefault("SDRT_CACHE_DIR", tempfile.mkdtemp(prefix="sdrt-quant-"))
    backends = args.backends.split(",")
    lines = ["| pipeline | backend | weights | PSNR vs fp32 | UNet rel. error | ms / step |",
             "|---|---|---|---|---|---|", *image_rows(backends, args.steps), "",
             "| part | backend | weights | rel. error vs fp32 | ms / run |", "|---|---|---|---|---|",
             *part_rows(backends, args.rounds), "",
             "| GGUF type | bits/weight | rel. RMS error vs float32 | max abs diff gguf vs ggml C |",
             "|---|---|---|---|", *gguf_rows()]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
