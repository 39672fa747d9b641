"""A full-size model folder moved as its graphs alone, its weights made again as seeded random values where it runs.

    python scripts/weightless.py pack SRC_FOLDER DST_FOLDER [--keep-below 65536]
    python scripts/weightless.py fill DST_FOLDER [--seed 0]

Timing and memory measurements of a full-size architecture (the cost model's check on a lent GPU machine, whose
upload limit is tens of MB) need its graphs and the shapes and types of its weights, not their values. ``pack``
copies SRC_FOLDER (a pipeline's ONNX folder, or one ``.onnx``) to DST_FOLDER with every floating-point initializer of
``--keep-below`` bytes or more turned into an external-data reference (into ``<graph>.onnx_data`` beside the
graph) whose data it does not write; smaller ones (norm scales, biases, constants) and every integer initializer stay
in the graph as they were. ``fill`` writes those data files: each tensor normal with a standard deviation of
1/sqrt(fan-in) (as the layers' default initialisations), seeded by the tensor's name, at its own type. The result
loads in any ONNX runtime; its outputs are not the original model's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np

FLOATS = {1: np.float32, 10: np.float16, 11: np.float64, 16: None}  # onnx TensorProto types; 16: bfloat16
ALIGN = 4096


def _graphs(folder: Path) -> list[Path]:
    return [folder] if folder.suffix == ".onnx" else sorted(folder.rglob("*.onnx"))


def pack(src: Path, dst: Path, keep_below: int) -> None:
    import onnx
    from onnx import numpy_helper

    if dst.exists():
        sys.exit(f"error: {dst} exists; pack writes a new folder")
    if src.is_dir():
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.onnx", "*.onnx_data", "*.safetensors", "*.bin",
                                                                 "*.pb", "weights*", "*_data"))
    else:
        dst.mkdir(parents=True)
    for path in _graphs(src):
        out = dst / path.relative_to(src) if src.is_dir() else dst / path.name
        model = onnx.load(str(path), load_external_data=True)
        data = f"{out.name}_data"
        offset, moved = 0, 0
        for t in model.graph.initializer:
            if t.data_type not in FLOATS:
                continue
            if not t.raw_data and t.data_type != 16:  # values in the typed fields: as raw bytes first
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t), t.name))
            size = len(t.raw_data)
            if size < keep_below:
                continue
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            del t.external_data[:]
            for k, v in (("location", data), ("offset", str(offset)), ("length", str(size))):
                e = t.external_data.add()
                e.key, e.value = k, v
            offset += -(-size // ALIGN) * ALIGN
            moved += 1
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(out))
        print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB graph, {moved} weights ({offset / 2**20:.0f} MiB) to fill")


def _fan_in_axes(graph) -> dict[str, tuple[int, ...]]:
    """The axes of each weight that its node sums over: a MatMul's B (in, out) its first, a Gemm's B its first or
    (transB) its second; any other weight (a Conv's kernel (out, in, kh, kw)) all but its first."""
    out: dict[str, tuple[int, ...]] = {}
    for n in graph.node:
        if n.op_type == "MatMul" and len(n.input) > 1:
            out[n.input[1]] = (-2,)
        elif n.op_type == "Gemm" and len(n.input) > 1:
            trans = next((a.i for a in n.attribute if a.name == "transB"), 0)
            out[n.input[1]] = (1,) if trans else (0,)
    return out


def fill(folder: Path, seed: int) -> None:
    import onnx
    from onnx.external_data_helper import uses_external_data

    for path in _graphs(folder):
        model = onnx.load(str(path), load_external_data=False)
        fan_in = _fan_in_axes(model.graph)
        files: dict[str, list] = {}
        for t in model.graph.initializer:
            if uses_external_data(t):
                info = {e.key: e.value for e in t.external_data}
                files.setdefault(info["location"], []).append((t, int(info.get("offset", 0)), int(info["length"])))
        for location, tensors in files.items():
            target = path.parent / location
            with open(target, "wb") as f:
                for t, offset, length in sorted(tensors, key=lambda x: x[1]):
                    shape = tuple(t.dims)
                    axes = fan_in.get(t.name, tuple(range(1, len(shape))) if len(shape) > 1 else (0,))
                    fan = max(1, int(np.prod([shape[a] for a in axes])))
                    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
                    values = rng.standard_normal(int(np.prod(shape)), dtype=np.float32) / np.sqrt(fan)
                    if t.data_type == 16:  # bfloat16: the upper half of each float32
                        raw = (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
                    else:
                        raw = values.astype(FLOATS[t.data_type]).tobytes()
                    if len(raw) != length:
                        sys.exit(f"error: {path}: {t.name} holds {length} bytes, its shape {shape} {len(raw)}")
                    f.seek(offset)
                    f.write(raw)
            print(f"{target}: {target.stat().st_size / 2**20:.0f} MiB, {len(tensors)} weights")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--keep-below", type=int, default=65536, help="bytes: smaller initializers stay in the graph")
    f = sub.add_parser("fill")
    f.add_argument("folder", type=Path)
    f.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        pack(args.src, args.dst, args.keep_below)
    else:
        fill(args.folder, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
