"""An ``.mlpackage``: build one from a lowered program, describe it, rewrite its weights in place.

A package holds the ML Program (``Data/com.apple.CoreML/model.mlmodel``) and one
weight file (``weights/weight.bin``: a 64-byte header, then per constant a 64-byte
record -- sentinel 0xDEADBEEF, data type, size, data offset -- and the data).
sdrt writes what a session needs into the model's user metadata
(``sdrt.io``, ``sdrt.weights``): the ONNX names and dtypes of the inputs and
outputs, and for each initializer the constants that hold it unchanged, so that
``update_weights`` can overwrite them without lowering again. Initializers that
were folded into other constants (by the lowering or by coremltools' passes) are
listed with a digest instead: if one of them changes, the program is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CoreMLError, ct, first_line
from .lower import Lowered
from .options import Options

log = logging.getLogger("sdrt.coreml.package")

WEIGHT_FILE = Path("Data/com.apple.CoreML/weights/weight.bin")
PROGRAM_FILE = Path("Data/com.apple.CoreML/model.mlmodel")
_RECORD = struct.Struct("<IIQQ")  # sentinel, data type, size in bytes, data offset
_SENTINEL = 0xDEADBEEF
#: MIL blob data types sdrt rewrites in place
_BLOB_DTYPES = {1: np.dtype(np.float16), 2: np.dtype(np.float32)}


@dataclass
class Built:
    """A package on disk and what sdrt knows about it."""

    path: Path
    io: dict[str, Any]
    weights: dict[str, list[list[str]]]
    folded: dict[str, str]
    op_counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def n_ops(self) -> int:
        return sum(n for op, n in self.op_counts.items() if op != "const")


def digest(arr: np.ndarray) -> str:
    a = np.ascontiguousarray(arr)
    return hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.reshape(-1).view(np.uint8).tobytes()).hexdigest()


def convert(lowered: Lowered, opts: Options, where: str) -> Any:
    """The lowered program as an ML Program ``MLModel`` (not loaded: works on every OS)."""
    coremltools = ct()
    precision = coremltools.precision.FLOAT16 if opts.precision == "fp16" else coremltools.precision.FLOAT32
    target = getattr(coremltools.target, opts.target)
    sink = io.StringIO()  # coremltools draws tqdm progress bars on stderr; sdrt prints nothing outside the CLI
    try:
        with contextlib.redirect_stderr(sink):
            return coremltools.convert(lowered.program, convert_to="mlprogram", compute_precision=precision,
                                       minimum_deployment_target=target, skip_model_load=True)
    except Exception as exc:  # noqa: BLE001 - any failure inside coremltools' passes or serializer
        raise CoreMLError(f"coremltools could not convert the lowered program: {first_line(exc)}", where=where,
                          fix="report this as a bug of sdrt-coreml with the model's op counts "
                              "(sdrt.Graph.load(MODEL).op_counts()); meanwhile try precision='fp32' or another "
                              "target") from exc


def build(lowered: Lowered, arrays: Mapping[str, np.ndarray], inputs: Sequence[Any], outputs: Sequence[Any],
          opts: Options, out: Path, where: str) -> Built:
    """Convert ``lowered`` and save it as the package ``out`` (a folder that must not exist).

    ``inputs``/``outputs`` are the graph's ``TensorInfo``s, in the order the program has them.
    """
    t0 = time.perf_counter()
    model = convert(lowered, opts, where)
    t1 = time.perf_counter()
    spec = model.get_spec()
    io_info = {
        "inputs": [[i.name, d.name, i.dtype, list(i.shape)] for i, d in zip(inputs, spec.description.input)],
        "outputs": [[o.name, d.name, o.dtype, list(o.shape)] for o, d in zip(outputs, spec.description.output)],
    }
    weight_file = Path(model.weights_dir) / WEIGHT_FILE.name  # the package coremltools keeps until saved
    weights, folded = _weight_map(weight_file, _blob_consts(spec), _inline_consts(spec), arrays)
    meta = model.user_defined_metadata
    meta["sdrt.io"] = json.dumps(io_info)
    meta["sdrt.weights"] = json.dumps({"mapped": weights, "folded": folded})
    meta["sdrt.options"] = opts.key()
    with contextlib.redirect_stderr(io.StringIO()):
        model.save(str(out))
    t2 = time.perf_counter()
    built = Built(out, io_info, weights, folded, _op_counts(spec), {"convert": t1 - t0, "save": t2 - t1})
    log.info("%s: %d MIL ops, %d of %d initializers rewritable in place, built in %.1fs", where, built.n_ops,
             len(weights), len(weights) + len(folded), t2 - t0)
    return built


def load(path: Path) -> Built:
    """What sdrt stored in a package it built; ``CoreMLError`` for a package sdrt did not build."""
    coremltools = ct()
    try:
        spec = coremltools.utils.load_spec(str(path))
        meta = dict(spec.description.metadata.userDefined)
        io_info = json.loads(meta["sdrt.io"])
        w = json.loads(meta["sdrt.weights"])
    except (KeyError, ValueError, OSError, RuntimeError) as exc:
        raise CoreMLError(f"not a package built by sdrt-coreml ({first_line(exc)})", where=str(path),
                          fix="build it with `sdrt compile MODEL --backend coreml -o FILE.mlpackage`") from exc
    return Built(Path(path), io_info, w["mapped"], w["folded"], _op_counts(spec))


def _main_ops(spec: Any) -> list[Any]:
    fn = spec.mlProgram.functions["main"]
    block = fn.block_specializations[fn.opset]
    return list(block.operations)


def _op_counts(spec: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op in _main_ops(spec):
        counts[op.type] = counts.get(op.type, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _blob_consts(spec: Any) -> dict[str, int]:
    """Const name -> offset of its record in the weight file, for constants stored in it."""
    out = {}
    for op in _main_ops(spec):
        if op.type == "const":
            val = op.attributes["val"]
            if val.HasField("blobFileValue"):
                out[op.outputs[0].name] = int(val.blobFileValue.offset)
    return out


def _inline_consts(spec: Any) -> dict[str, np.ndarray]:
    """Const name -> value, for float tensors of 2 or more elements written into the program itself."""
    out = {}
    for op in _main_ops(spec):
        if op.type != "const":
            continue
        val = op.attributes["val"]
        dims = [int(d.constant.size) for d in val.type.tensorType.dimensions]
        if not val.HasField("immediateValue") or int(np.prod(dims, dtype=np.int64)) < 2:
            continue
        tensor = val.immediateValue.tensor
        kind = tensor.WhichOneof("value")
        if kind == "floats":
            out[op.outputs[0].name] = np.asarray(tensor.floats.values, np.float32)
        elif kind == "bytes" and len(tensor.bytes.values) == 2 * int(np.prod(dims)):  # float16 as raw bytes
            out[op.outputs[0].name] = np.frombuffer(tensor.bytes.values, np.float16).copy()
    return out


def read_record(data: bytes | memoryview, offset: int) -> tuple[np.dtype | None, int, int]:
    """(numpy dtype or None for types sdrt does not rewrite, size in bytes, data offset) of one record."""
    sentinel, dtype, size, start = _RECORD.unpack_from(data, offset)
    if sentinel != _SENTINEL:
        raise CoreMLError(f"weight record at offset {offset} has no sentinel", where=str(WEIGHT_FILE),
                          fix="the package is damaged: build it again")
    return _BLOB_DTYPES.get(dtype), size, start


#: how an initializer can sit in a constant unchanged but for layout: as it is, or transposed (a 2-D
#: MatMul weight that coremltools' ``fuse_matmul_weight_bias`` turns into a ``linear`` weight)
_TRANSFORMS = {"": lambda a: a, "T": lambda a: a.T}


def _weight_map(weight_file: Path, blobs: dict[str, int], inline: dict[str, np.ndarray],
                arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, list[list[str]]], dict[str, str]]:
    """Initializers that constants hold by value (-> [[const, transform, place]]), and the rest (-> digest).

    ``place`` is ``blob`` (in the weight file) or ``inline`` (tensors under 10 elements, which
    coremltools writes into the program itself).

    Constants are matched by value, not by name: coremltools' passes rename and fuse
    constants (a bias moves into ``linear``, a group norm's affine into ``batch_norm``),
    and a value match is what makes a rewrite safe. A constant that matches two
    initializers (deduplicated equal values) maps to neither.
    """
    data = weight_file.read_bytes() if weight_file.exists() else b""
    index: dict[tuple[str, int, bytes], list[str]] = {}
    for name, offset in blobs.items():
        dtype, size, start = read_record(data, offset)
        if dtype is not None:
            key = (dtype.str, size, hashlib.sha1(memoryview(data)[start:start + size]).digest())
            index.setdefault(key, []).append((name, "blob"))
    for name, arr in inline.items():
        index.setdefault((arr.dtype.str, arr.nbytes, hashlib.sha1(arr.tobytes()).digest()), []).append((name, "inline"))
    hits: dict[str, list[list[str]]] = {}
    owners: dict[str, set[str]] = {}
    for init, arr in arrays.items():
        arr = np.asarray(arr)
        if arr.size < 2 or arr.dtype.kind != "f" or np.all(arr == arr.reshape(-1)[0]):
            continue  # a constant-valued tensor (zeros, ones) could match a constant that is not it
        for tag, fn in _TRANSFORMS.items():
            if tag and arr.ndim != 2:
                continue
            moved = np.ascontiguousarray(fn(arr))
            for dtype in _BLOB_DTYPES.values():
                with np.errstate(over="ignore"):
                    raw = moved.astype(dtype).tobytes()
                for const, place in index.get((dtype.str, len(raw), hashlib.sha1(raw).digest()), []):
                    hits.setdefault(init, []).append([const, tag, place])
                    owners.setdefault(const, set()).add(init)
    shared = {c for c, inits in owners.items() if len(inits) > 1}
    mapped = {init: consts for init, consts in hits.items() if not any(c in shared for c, _, _ in consts)}
    folded = {name: digest(np.asarray(arr)) for name, arr in arrays.items() if name not in mapped}
    return mapped, folded


def rewrite_weights(pkg: Path, built: Built, arrays: Mapping[str, np.ndarray]) -> int:
    """Overwrite the constants of the mapped initializers in ``arrays``; returns bytes written.

    Constants in the weight file are overwritten where they are (the file keeps its size);
    inline ones are changed in the program, which is written to a temporary file and
    renamed over ``model.mlmodel``. The caller has checked that no folded initializer changed.
    """
    coremltools = ct()
    spec = coremltools.utils.load_spec(str(pkg))
    blobs = _blob_consts(spec)
    inline_ops = {op.outputs[0].name: op for op in _main_ops(spec) if op.type == "const"}
    written, spec_changed = 0, False
    with open(pkg / WEIGHT_FILE, "r+b") as f:
        for init, consts in built.weights.items():
            if init not in arrays:
                continue
            arr = np.asarray(arrays[init])
            for name, tag, place in consts:
                moved = np.ascontiguousarray(_TRANSFORMS[tag](arr))
                if place == "inline":
                    written += _set_inline(inline_ops[name], moved, pkg, init)
                    spec_changed = True
                    continue
                f.seek(blobs[name])
                dtype, size, start = read_record(f.read(_RECORD.size), 0)
                if dtype is None or size != arr.size * dtype.itemsize:
                    raise CoreMLError(f"constant {name} of initializer {init!r} has {size} bytes, the new array "
                                      f"needs {arr.size * (dtype.itemsize if dtype else 0)}", where=str(pkg),
                                      fix="build the package again (the weights do not fit this graph)")
                f.seek(start)
                with np.errstate(over="ignore"):  # fp16 saturates to inf exactly as coremltools' cast does
                    f.write(moved.astype(dtype).tobytes())
                written += size
    if spec_changed:
        target = pkg / PROGRAM_FILE
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(spec.SerializeToString())
        os.replace(tmp, target)
    return written


def _set_inline(op: Any, arr: np.ndarray, pkg: Path, init: str) -> int:
    tensor = op.attributes["val"].immediateValue.tensor
    if tensor.WhichOneof("value") == "floats":
        if len(tensor.floats.values) != arr.size:
            raise CoreMLError(f"inline constant {op.outputs[0].name} of initializer {init!r} holds "
                              f"{len(tensor.floats.values)} values, the new array {arr.size}", where=str(pkg),
                              fix="build the package again (the weights do not fit this graph)")
        tensor.floats.values[:] = arr.reshape(-1).astype(np.float32).tolist()
        return arr.size * 4
    with np.errstate(over="ignore"):
        raw = arr.reshape(-1).astype(np.float16).tobytes()
    if len(raw) != len(tensor.bytes.values):
        raise CoreMLError(f"inline constant {op.outputs[0].name} of initializer {init!r} holds "
                          f"{len(tensor.bytes.values)} bytes, the new array {len(raw)}", where=str(pkg),
                          fix="build the package again (the weights do not fit this graph)")
    tensor.bytes.values = raw
    return len(raw)
