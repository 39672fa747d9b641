"""``sdrt run MODEL --input name=file.npy ... --output out.npz``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..errors import InputError
from . import precision
from .paths import check_writes, output_file, refuse_stdout, weights_once

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="run a model once on .npy inputs and save the outputs as .npz")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="one graph input; repeat for each")
    p.add_argument("--output", "-o", required=True, help="where to write the outputs (.npz)")
    p.add_argument("--weights", action="append", default=None, help="a .safetensors file; repeat for several")
    p.add_argument("--backend", default="auto", help="a backend `sdrt info` lists (default: auto, the one sdrt picks here)")
    p.add_argument("--device", default=None, help="a device id as `sdrt info` lists it (default: the one sdrt picks for the backend)")
    precision.add_flag(p, "the model (fp32 to compare with a float32 reference)")
    return p


def parse_inputs(specs: list[str]) -> dict[str, Any]:
    import numpy as np

    feeds = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise InputError(f"bad --input {spec!r}", where="--input", fix="write it as NAME=FILE.npy, e.g. -i x=x.npy")
        if name in feeds:
            raise InputError(f"--input {name!r} is given twice", where=f"-i {spec}",
                             fix=f"give one -i {name}=FILE.npy")
        path = Path(file)
        if os.path.isdir(path):
            raise InputError(f"the file for {name!r} is a folder", where=f"-i {spec}",
                             fix="pass the .npy file itself")
        if not os.path.isfile(path):
            raise InputError(f"input file for {name!r} does not exist", where=str(path),
                             fix="save the array with numpy.save first")
        try:
            with open(path, "rb") as f:
                magic = f.read(6)
        except OSError as exc:
            raise InputError(f"cannot read the file for {name!r} ({exc.strerror or exc})", where=f"-i {spec}",
                             fix="check the file's permissions") from exc
        if magic != b"\x93NUMPY":  # numpy would call a PNG "pickled (object) data"
            raise InputError(f"the file for {name!r} is not a .npy file (an .npz, an image or text is not one)",
                             where=f"-i {spec}", fix="save the array with numpy.save(FILE.npy, array)")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except Exception as exc:
            raise InputError(f"cannot read {name!r} as a .npy array ({exc})", where=str(path),
                             fix="save the array with numpy.save") from exc
    return feeds


def check_inputs(graph: Any, feeds: dict[str, Any], specs: list[str]) -> None:
    """The -i files against the graph's inputs, before anything compiles, in this command's words (the
    session's own check speaks the API: Session.run feeds, array.astype)."""
    from ..backend import _DTYPE_ALIASES, NON_TENSOR

    files = {spec.partition("=")[0]: spec.partition("=")[2] for spec in specs}
    expected = {i.name: i for i in graph.inputs}
    for v in graph.model.graph.input:  # a .npy holds one tensor: a sequence, optional or map input cannot come from one
        kind = v.type.WhichOneof("value")
        if kind == "optional_type" and v.type.optional_type.elem_type.WhichOneof("value") == "tensor_type":
            continue  # an optional tensor: the .npy is its value
        if v.name in expected and kind != "tensor_type":
            what = {"sequence_type": "a sequence of tensors", "optional_type": "an optional sequence",
                    "map_type": "a map"}.get(kind or "", "not a tensor")
            raise InputError(f"input {v.name!r} is {what}, and sdrt run feeds tensors only (one .npy file each)",
                             where=f"the graph's input {v.name!r}",
                             fix=f"run it from Python: sdrt.load(MODEL, backend='reference').run({{{v.name!r}: ...}})")
    missing = [n for n in expected if n not in feeds]
    unknown = [n for n in feeds if n not in expected]
    if missing or unknown:
        what = "; ".join(x for x in (f"no -i for {', '.join(map(repr, missing))}" if missing else "",
                                     f"the graph has no input {', '.join(map(repr, unknown))}" if unknown else "")
                         if x)
        raise InputError(what, where="--input",
                         fix="pass -i NAME=FILE.npy for each input of the graph: "
                             + ", ".join(str(i) for i in graph.inputs))
    unranked = _unranked(graph)
    for name, info in expected.items():
        if info.dtype == NON_TENSOR:
            continue
        arr, want = feeds[name], _DTYPE_ALIASES.get(info.dtype, info.dtype)
        if want == "bfloat16" and (arr.dtype.name == "float32" or (arr.dtype.kind == "V" and arr.dtype.itemsize == 2)):
            import ml_dtypes  # onnx's own dependency

            # numpy has no bfloat16: a float32 file is rounded to it, ml_dtypes' own .npy loads as 2-byte voids
            feeds[name] = arr = arr.astype(ml_dtypes.bfloat16) if arr.dtype.kind == "f" else arr.view(ml_dtypes.bfloat16)
        if want == "object" and arr.dtype.kind in "US":  # strings: a str array saves without pickling
            continue
        if arr.dtype.name != want:
            how = {"object": "a numpy array of str: numpy.save(FILE, numpy.array(['text', ...]))",
                   "bfloat16": "float32 (rounded to bfloat16 here): numpy.save(FILE, array.astype(numpy.float32))"}
            raise InputError(f"input {name!r} is {arr.dtype} in {files[name]}, and the graph takes "
                             + ("strings" if want == "object" else want),
                             where=f"-i {name}={files[name]}",
                             fix=f"save it as {how[want]}" if want in how else
                             f"save it as {want}: numpy.save({files[name]!r}, array.astype(numpy.{want}))")
        if 0 in arr.shape:  # shape inference would fail on every node after the first, in many lines
            raise InputError(f"input {name!r} is empty: its shape {tuple(arr.shape)} in {files[name]} has a 0",
                             where=f"-i {name}={files[name]}", fix="save an array with at least one element per dim")
        if name in unranked:  # the graph declares no shape at all: any rank will do
            continue
        if arr.ndim != len(info.shape) or any(isinstance(d, int) and d != a for d, a in zip(info.shape, arr.shape)):
            raise InputError(f"input {name!r} has shape {tuple(arr.shape)} in {files[name]}, and the graph takes "
                             f"{info}", where=f"-i {name}={files[name]}",
                             fix="save an array of the graph's shape (a dim given by name takes any size)")


def _unranked(graph: Any) -> set[str]:
    """The graph's tensor inputs that declare no shape, not even a rank (their TensorInfo reads as a scalar's)."""
    return {v.name for v in graph.model.graph.input
            if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")}


def pins(graph: Any, feeds: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The feeds' shapes for the graph's dynamic inputs, the feeds checked first (``check_inputs``: names, ranks,
    fixed dims). A run is one call, so every backend compiles the graph static (ggml and Core ML need it;
    OpenVINO runs it faster)."""
    out: dict[str, tuple[int, ...]] = {}
    sizes: dict[str, tuple[int, str]] = {}
    unranked = _unranked(graph)
    for info in graph.inputs:
        if info.name in unranked and info.name in feeds:  # no shape declared (TensorInfo shows it as a scalar's)
            out[info.name] = tuple(int(s) for s in feeds[info.name].shape)
            continue
        if info.is_static:
            continue
        arr = feeds[info.name]
        for d, s in zip(info.shape, arr.shape):
            if isinstance(d, str):
                seen = sizes.setdefault(d, (int(s), info.name))
                if seen[0] != s:
                    raise InputError(f"inputs {seen[1]!r} and {info.name!r} give the graph's dim {d!r} the sizes "
                                     f"{seen[0]} and {s}", where="sdrt run --input",
                                     fix=f"give {d!r} one size on every input ({info})")
        out[info.name] = tuple(int(s) for s in arr.shape)
    return out


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..graph import Graph
    from ..runtime import load

    refuse_stdout(args.output, "run", ".npz")
    output = output_file(args.output, ".npz")  # before compiling: a bad path fails at once
    check_writes({"-o": output}, {"MODEL": args.model, "--input": [s.partition("=")[2] for s in args.input],
                                  "--weights": args.weights})
    weights_once(args.weights)
    feeds = parse_inputs(args.input)
    graph = Graph.load(args.model)
    check_inputs(graph, feeds, args.input)
    options = precision.option(args.precision, args.backend, args.device)
    with load(graph, weights=args.weights, backend=args.backend, device=args.device,
              shapes=pins(graph, feeds), **options) as session:
        outputs = session.run(feeds)
    import io

    from ..pipelines.png import write_file

    arrays: dict[str, Any] = {}
    notes = []
    for name, value in outputs.items():
        if value is None:  # an empty optional
            notes.append(f"{name}: an empty optional, not saved")
        elif isinstance(value, (list, tuple)):  # a sequence: one array per element, NAME[0], NAME[1], ...
            arrays.update((f"{name}[{i}]", _savable(v)) for i, v in enumerate(value))
            notes.append(f"{name}: a sequence of {len(value)}, saved as {name}[0] ... {name}[{len(value) - 1}]"
                         if value else f"{name}: an empty sequence, not saved")
        elif isinstance(value, dict):  # a map: one array per key
            arrays.update((f"{name}[{k}]", _savable(v)) for k, v in value.items())
            notes.append(f"{name}: a map of {len(value)}, saved as {name}[KEY]")
        else:
            arrays[name] = _savable(value)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_file(output, buf.getbuffer())  # atomically (no half .npz), and without a second copy of the outputs
    for name, value in arrays.items():
        print(f"{name}: {value.dtype}{list(value.shape)}")
    for note in notes:
        print(note)
    from ..errors import printable

    print(printable(f"wrote {output}"))
    return 0


def _savable(value: Any) -> Any:
    """``value`` as an array ``np.load`` reads without pickles: strings (object arrays of str) as a str array."""
    import numpy as np

    value = np.asarray(value)
    if value.dtype == object and all(isinstance(x, str) for x in value.flat):
        return value.astype(str)
    return value
