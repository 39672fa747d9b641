"""GGUF block weights on ggml: one full-width Flux.1 double-stream block bound from a Q8_0 and a Q4_K GGUF file,
run with the file's blocks kept (ggml's quantized mul_mat) and with every tensor dequantized to float32 (what
every backend got before), each in a fresh process: time per run and peak RSS.

    python scripts/gguf_ggml_bench.py [--img 1024] [--txt 256] [--runs 3] [--dir /tmp/gguf-bench]

The block is ``sdrt.testing.dit_blocks.flux_double_block`` at Flux's width (3072, 24 heads; 340 M parameters,
1.36 GB in float32); its random weights are written in PyTorch's layout ([out, in]) under diffusers' names with
gguf's writer (Q8_0 by gguf's numpy quantizer, Q4_K by ggml's C quantizer, as llama.cpp's converters do; the
1-D tensors F32), and bound through ``sdrt.checkpoint.Checkpoint`` like a checkpoint. No torch is needed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _quantize(a: np.ndarray, kind: str) -> np.ndarray:
    import gguf
    from gguf import quants

    if kind == "Q8_0":
        return quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
    import ggml

    t = getattr(ggml, f"GGML_TYPE_{kind}")
    rows, n = a.shape
    out = np.zeros((rows, ggml.ggml_row_size(t, n)), np.uint8)
    ggml.ggml_quantize_init(t)
    ggml.ggml_quantize_chunk(t, a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data_as(ctypes.c_void_p),
                             0, rows, n, None)
    return out


def write(folder: Path, img: int, txt: int, dim: int = 3072) -> None:
    """The weight-free graph (``block.onnx``) and ``block-Q8_0.gguf`` / ``block-Q4_K.gguf``."""
    import gguf
    from onnx import TensorProto, numpy_helper, save_model

    from sdrt.checkpoint import param_map
    from sdrt.graph import Graph
    from sdrt.testing import dit_blocks

    folder.mkdir(parents=True, exist_ok=True)
    model, feeds = dit_blocks.flux_double_block({"dim": dim, "heads": dim // 128, "img": img, "txt": txt})
    np.savez(folder / "feeds.npz", **feeds)
    pmap = param_map(Graph(model))
    params = {slot.init: (canon, slot.layout) for canon, slot in pmap.items() if slot.alias_of is None}
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name in params}
    for kind in ("Q8_0", "Q4_K"):
        w = gguf.GGUFWriter(str(folder / f"block-{kind}.gguf"), "flux")
        for init, (canon, layout) in params.items():
            a = np.ascontiguousarray(arrays[init].T if layout == "T" else arrays[init], np.float32)
            if a.ndim == 2:
                w.add_tensor(canon, _quantize(a, kind), raw_dtype=gguf.GGMLQuantizationType[kind])
            else:
                w.add_tensor(canon, a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    for t in model.graph.initializer:  # weight-free: the checkpoint supplies them
        if t.name in params:
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", "absent.safetensors"), ("offset", "0"), ("length", "0")):
                e = t.external_data.add()
                e.key, e.value = k, v
    from sdrt.graph.strip import STRIPPED_KEY

    model.metadata_props.add(key=STRIPPED_KEY, value="absent.safetensors")  # as `sdrt strip` marks its graphs
    save_model(model, folder / "block.onnx")
    (folder / "params.json").write_text(json.dumps({c: i for i, (c, _) in params.items()}))


def _status(field: str) -> int:
    """A /proc/self/status memory field in bytes (VmHWM: this process's peak RSS; unlike getrusage's ru_maxrss
    it is not inherited from the parent across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def run(folder: Path, kind: str, mode: str, runs: int, precision: str) -> dict:
    """One configuration in this process: compile, ``runs`` timed runs; peak RSS."""
    from dataclasses import replace

    import sdrt
    from sdrt.checkpoint import Checkpoint
    from sdrt.checkpoint.ldm import Source
    from sdrt.checkpoint.single_file import with_own_constants
    from sdrt.graph import Graph
    from sdrt.weights import Weights

    graph = Graph.load(folder / "block.onnx")
    path = folder / f"block-{kind}.gguf"
    canon = json.loads((folder / "params.json").read_text())
    ck = Checkpoint(Weights.open(path), {"m": {c: Source(c) for c in canon}}, "flux block", path)
    refs = ck.lazy({"m": graph})["m"]
    if mode == "float32":  # as before: no blocks reader, every tensor dequantized when bound
        refs = {n: replace(r, blocks=None) for n, r in refs.items()}
    weights = with_own_constants(graph, refs, path)
    feeds = dict(np.load(folder / "feeds.npz"))
    t0 = time.perf_counter()
    s = sdrt.load(graph, backend="ggml", weights=weights, precision=precision)
    compile_s = time.perf_counter() - t0
    loaded_rss = _status("VmRSS")
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = s.run(feeds)
        times.append(time.perf_counter() - t0)
    res = {"kind": kind, "mode": mode, "precision": precision, "compile_s": compile_s,
           "run_s": min(times), "median_s": sorted(times)[len(times) // 2], "runs": times, "weight_bytes": s.weight_bytes(),
           "hits": {k: v for k, v in s.impl_hits.items() if "mul_mat" in k or "gguf" in k},
           "loaded_rss": loaded_rss, "peak_rss": _status("VmHWM")}
    np.save(folder / f"out-{kind}-{mode}-{precision}.npy", next(iter(out.values())))
    s.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gguf-bench"))
    ap.add_argument("--img", type=int, default=1024)
    ap.add_argument("--txt", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dim", type=int, default=3072, help="width (3072: Flux.1's; smaller for a quick check)")
    ap.add_argument("--one", nargs=3, metavar=("KIND", "MODE", "PRECISION"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run(args.dir, args.one[0], args.one[1], args.runs, args.one[2])))
        return
    if not (args.dir / "block.onnx").is_file():
        write(args.dir, args.img, args.txt, args.dim)
    rows = []
    for kind in ("Q8_0", "Q4_K"):
        for mode, precision in (("kept", "fp32"), ("float32", "fp32"), ("float32", "bf16")):
            p = subprocess.run([sys.executable, __file__, "--dir", str(args.dir), "--runs", str(args.runs),
                                "--one", kind, mode, precision], capture_output=True, text=True, check=True)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| file | weights on ggml | precision | ggml weight buffers | RSS after load | peak RSS | compile | "
          "time per run (best; median) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {'file blocks kept' if r['mode'] == 'kept' else 'dequantized to float32'} | "
              f"{r['precision']} | {r['weight_bytes'] / 1e9:.2f} GB | {r['loaded_rss'] / 1e9:.2f} GB | "
              f"{r['peak_rss'] / 1e9:.2f} GB | "
              f"{r['compile_s']:.1f} s | {r['run_s']:.2f} s; {r['median_s']:.2f} s |")
    for kind in ("Q8_0", "Q4_K"):
        a = np.load(args.dir / f"out-{kind}-kept-fp32.npy")
        b = np.load(args.dir / f"out-{kind}-float32-fp32.npy")
        print(f"{kind}: kept vs float32 dequantized, max abs diff / max abs = "
              f"{np.abs(a - b).max() / np.abs(b).max():.2e}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "core" / "src"))
    main()
