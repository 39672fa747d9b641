"""Peak RSS of opening a multi-GB .safetensors file with ``sdrt.Weights`` (mmap, no copy).

    python bench/weights_rss.py                 # 4 GiB file, in a temporary folder
    python bench/weights_rss.py --gib 8 --dir /data/tmp

Each measurement runs in a fresh Python process and reports that process's
peak resident set size (``ru_maxrss``), next to a baseline process that only
imports sdrt, numpy and onnx. The file is written sparse (header, then the data
region left as a hole), so it costs no disk; mapped pages of a hole read as
zeros exactly like real data would, and RSS counts only pages a process
touches. For comparison it also loads the file with the ``safetensors``
package's numpy API (which reads every tensor into memory), when installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

MIB = 2**20


def write_sparse_safetensors(path: Path, gib: float, tensors: int = 4) -> int:
    """``tensors`` float16 tensors totalling ``gib`` GiB; the data region is a hole."""
    per = int(gib * 2**30) // tensors // 2 // 4096 * 4096  # elements per tensor, page-aligned rows
    header: dict[str, object] = {}
    pos = 0
    for i in range(tensors):
        n = per * 2
        header[f"model.layers.{i}.weight"] = {"dtype": "F16", "shape": [per // 4096, 4096], "data_offsets": [pos, pos + n]}
        pos += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        f.truncate(8 + len(blob) + pos)
    return 8 + len(blob) + pos


PROBES = {
    "baseline (import sdrt, numpy, onnx)": "",
    "sdrt Weights.open": "w = Weights.open(P)",
    "sdrt Weights.open + every w[name]": "w = Weights.open(P); arrs = [w[k] for k in w]",
    "sdrt open + read one 4 MiB slice": "w = Weights.open(P); k = next(iter(w)); s = float(w[k][:512].sum())",
    "sdrt open + bind to a matching graph": "w = Weights.open(P); b = w.bind(G)",
    "safetensors.numpy.load_file (copies)": "from safetensors.numpy import load_file; d = load_file(str(P))",
}

PRELUDE = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    import numpy as np
    import onnx  # in the baseline too, so that only the weights show in the differences
    import sdrt
    from sdrt.graph import Graph
    from sdrt.weights import Weights
    P = Path(sys.argv[1])
    G = None
    if "bind" in sys.argv[2]:
        from onnx import TensorProto, helper
        from sdrt.graph import Graph
        w0 = Weights.open(P)
        inits = []
        for k in w0:
            t = helper.make_tensor_value_info(k, TensorProto.FLOAT16, list(w0.ref(k).shape))
            inits.append(t)
        # a graph whose initializers are declared but whose data lives in the weights: a stripped graph
        from sdrt.graph import STRIPPED_KEY
        tensors = []
        for k in w0:
            tp = TensorProto(); tp.name = k; tp.data_type = TensorProto.FLOAT16; tp.dims.extend(w0.ref(k).shape)
            tp.data_location = TensorProto.EXTERNAL
            e = tp.external_data.add(); e.key, e.value = "location", "absent.bin"
            tensors.append(tp)
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
        node = helper.make_node("Identity", [next(iter(w0))], ["y"])
        m = helper.make_model(helper.make_graph([node], "g", [], [out], tensors),
                              opset_imports=[helper.make_opsetid("", 17)])
        m.metadata_props.add(key=STRIPPED_KEY, value="absent.bin")
        P.parent.joinpath("g.onnx").write_bytes(m.SerializeToString())
        G = Graph.load(P.parent / "g.onnx")
""")


def measure(path: Path, code: str) -> float:
    script = PRELUDE + "\n" + code + "\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    out = subprocess.run([sys.executable, "-c", script, str(path), code], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr else "failed")
    return int(out.stdout.strip().splitlines()[-1]) / 1024  # KiB -> MiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=4.0, help="file size in GiB (default 4)")
    ap.add_argument("--dir", default=None, help="folder for the temporary file")
    ap.add_argument("--skip-copy", action="store_true", help="do not run the safetensors package (it reads it all)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "big.safetensors"
        size = write_sparse_safetensors(path, args.gib)
        print(f"file: {size / 2**30:.2f} GiB ({size:,} bytes), {os.stat(path).st_blocks * 512 / MIB:.1f} MiB on disk")
        base = None
        for label, code in PROBES.items():
            if "safetensors.numpy" in code and args.skip_copy:
                continue
            try:
                rss = measure(path, code)
            except RuntimeError as exc:
                print(f"{label:44s} skipped: {exc}")
                continue
            base = rss if base is None else base
            print(f"{label:44s} peak RSS {rss:9.1f} MiB  (+{rss - base:8.1f} MiB over baseline, "
                  f"{(rss - base) * MIB / size:.4f} x file)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
