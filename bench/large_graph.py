"""Load, run and strip an ONNX model above 2 GB (external data), with peak RSS per step.

    python bench/large_graph.py              # 2.25 GiB embedding table, temporary folder
    python bench/large_graph.py --gib 3

The model is a Gather from a float32 [rows, 1024] table stored as external
data in a sparse file (a few rows written, the rest a hole): protobuf cannot
serialize a message above 2 GB, so this exercises exactly the path a real
UNet/DiT export above 2 GB takes. Each step runs in a fresh process and
reports its peak resident set size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

DIM = 1024
MARKED = (0, 123_456)


def build(folder: Path, gib: float) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    rows = int(gib * 2**30) // (DIM * 4)
    with open(folder / "table.bin", "wb") as f:
        f.truncate(rows * DIM * 4)
        for r in (*MARKED, rows - 1):
            f.seek(r * DIM * 4)
            f.write(np.full(DIM, r, np.float32).tobytes())
    t = TensorProto()
    t.name, t.data_type = "table", TensorProto.FLOAT
    t.dims.extend([rows, DIM])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "table.bin"), ("offset", "0"), ("length", str(rows * DIM * 4))):
        e = t.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "big",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", DIM])], [t])
    p = folder / "big.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(p))
    return p


PRELUDE = textwrap.dedent("""
    import os, resource, sys, time
    from pathlib import Path
    import numpy as np
    os.environ["SDRT_LOAD_ENTRY_POINTS"] = "0"
    import sdrt, sdrt_reference
    from sdrt import plugins
    from sdrt.graph import Graph
    reg = plugins.get_registry(); reg.register_plugin(sdrt_reference, "reference")
    P = Path(sys.argv[1])
    IDS = np.array([0, 123456, 5], np.int64)
    t0 = time.perf_counter()
""")

STEPS = {
    "Graph.load(load_external=True) (read in)": "g = Graph.load(P, load_external=True)",
    "Graph.load (default: mapped above 2 GiB)": "g = Graph.load(P); assert g.mapped_initializers == ['table']",
    "load + with_shapes(n=3) + run Gather": (
        "g = Graph.load(P).with_shapes(n=3)\n"
        "with sdrt.load(g, backend='reference') as s: y = s.run({'ids': IDS})['y']\n"
        "assert y[1, 0] == 123456 and y[2, 0] == 0"),
    "Graph.load(load_external=True) + run Gather": (
        "g = Graph.load(P, load_external=True)\n"
        "with sdrt.load(g, backend='reference') as s: y = s.run({'ids': IDS})['y']\n"
        "assert y[1, 0] == 123456"),
    "sdrt strip (mapped, streamed)": "g = Graph.load(P); r = g.strip(P.with_name('s.onnx'))",
    "stripped graph + weights=... + run Gather": (
        "with sdrt.load(P.with_name('s.onnx'), weights=P.with_name('s.safetensors'), backend='reference') as s:\n"
        "    y = s.run({'ids': IDS})['y']\n"
        "assert y[1, 0] == 123456"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.25)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        p = build(Path(tmp), args.gib)
        size = (Path(tmp) / "table.bin").stat().st_size
        print(f"model: {p.name} {p.stat().st_size:,} bytes + table.bin {size:,} bytes ({size / 2**30:.2f} GiB)")
        for label, code in STEPS.items():
            script = PRELUDE + code + (
                "\nprint(f'{time.perf_counter() - t0:.2f}', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", script, str(p)], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{label:46s} FAILED: {out.stderr.strip().splitlines()[-1]}")
                return 1
            secs, rss = out.stdout.split()
            print(f"{label:46s} {float(secs):6.2f} s   peak RSS {int(rss) / 1024:8.1f} MiB"
                  f"   (process {time.perf_counter() - t:5.1f} s)")
        s_onnx, s_st = Path(tmp) / "s.onnx", Path(tmp) / "s.safetensors"
        print(f"stripped: s.onnx {s_onnx.stat().st_size:,} bytes, s.safetensors {s_st.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
