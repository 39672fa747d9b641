"""Time and peak memory of reading bitsandbytes NF4 weights: one full-size Flux.1 double block.

    PYTHONPATH=core/src /work/venv/bin/python scripts/bench_bnb4.py [--blocks N]

Writes (in a temporary folder) N double blocks of Flux.1 in Forge's layout (``model.diffusion_model.double_blocks.
I.*``: img/txt mod, qkv, proj and both MLP weights, 340M values a block; random codes, double-quantized absmax in
blocks of 64 / 256, recorded dtype bf16), then in a fresh process opens the file and reads every weight once as
sdrt does (``Weights.open(...)[name]``, then dropped), and prints the time, the values per second and the peak RSS
over the process's RSS after ``Weights.open``. The codes are random bytes: the dequantizer's cost does not depend
on them (every byte goes through the same table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {"img_mod.lin": (18432, 3072), "img_attn.qkv": (9216, 3072), "img_attn.proj": (3072, 3072),
          "img_mlp.0": (12288, 3072), "img_mlp.2": (3072, 12288)}


def write(path: Path, blocks: int) -> int:
    from sdrt.weights import stfile

    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {}
    total = 0
    for b in range(blocks):
        for side in ("img", "txt"):
            for name, shape in SHAPES.items():
                key = f"model.diffusion_model.double_blocks.{b}.{name.replace('img', side)}.weight"
                n = shape[0] * shape[1]
                total += n
                nb = n // 64
                tensors[key] = rng.integers(0, 256, (n // 2, 1), dtype=np.uint8)
                tensors[key + ".absmax"] = rng.integers(0, 256, nb, dtype=np.uint8)
                tensors[key + ".quant_map"] = np.linspace(-1, 1, 16, dtype=np.float32)
                tensors[key + ".nested_absmax"] = rng.uniform(0.001, 0.01, -(-nb // 256)).astype(np.float32)
                tensors[key + ".nested_quant_map"] = np.linspace(-1, 1, 256, dtype=np.float32)
                state = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": list(shape),
                         "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.02}
                tensors[key + ".quant_state.bitsandbytes__nf4"] = np.frombuffer(json.dumps(state).encode(), np.uint8)
    stfile.write(path, tensors)
    return total


def measure(path: Path, as_float32: bool) -> None:
    import resource

    from sdrt.weights import Weights

    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) * 1024

    t0 = time.perf_counter()
    w = Weights.open(path)
    t_open = time.perf_counter() - t0
    base = rss()
    t0 = time.perf_counter()
    n = 0
    for name in w:
        a = w[name]
        if as_float32:  # what binding onto a float32 graph does next
            a = a.astype(np.float32)
        n += a.size
        del a
    dt = time.perf_counter() - t0
    peak = rss()
    largest = max(np.prod(w.ref(k).shape) for k in w)
    out_b = 4 if as_float32 else 2
    print(json.dumps({"tensors": len(w), "values": n, "open_s": round(t_open, 3), "read_s": round(dt, 2),
                      "Mvalues_per_s": round(n / dt / 1e6, 1), "as_float32": as_float32,
                      "peak_over_open_MiB": round((peak - base) / 2**20, 1),
                      "largest_tensor_out_MiB": round(largest * out_b / 2**20, 1),
                      "maxrss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--float32", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        measure(Path(args.measure), args.float32)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "flux-double-blocks-nf4.safetensors"
        total = write(path, args.blocks)
        print(f"{args.blocks} double block(s): {total / 1e6:.0f}M values, file {path.stat().st_size / 2**20:.0f} MiB")
        for f32 in (False, True):
            subprocess.run([sys.executable, __file__, "--measure", str(path)] + (["--float32"] if f32 else []),
                           check=True, env=dict(os.environ))


if __name__ == "__main__":
    main()
