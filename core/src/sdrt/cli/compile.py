"""``sdrt compile MODEL --backend B --target T -o FILE``: an ahead-of-time build for hardware that need not be here.

The command is the core's; a backend offers it through ``Backend.targets()`` and
``Backend.build(graph, weights, target, path, **options)``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from ..errors import InputError, SdrtError

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("compile", help="build a model ahead of time for a target device (e.g. a TensorRT-RTX engine)")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--backend", "-b", required=True, help="the backend that builds it (e.g. trt)")
    p.add_argument("--target", "-t", default=None,
                   help="the hardware target, e.g. sm86; --list-targets shows the backend's targets")
    p.add_argument("--output", "-o", default=None, help="the file to write")
    p.add_argument("--weights", action="append", default=None, help="a .safetensors file; repeat for several")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DxDxD",
                   help="pin an input's shape (or a symbolic dim: batch=2); repeat for each")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a backend build option (VALUE is read as JSON when it parses, else as a string)")
    p.add_argument("--list-targets", action="store_true", help="print the backend's targets and exit")
    return p


def parse_shapes(specs: list[str]) -> dict[str, Any]:
    shapes: dict[str, Any] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            values = [int(d) for d in dims.lower().split("x")] if sep and name and dims else None
        except ValueError:
            values = None
        if values is None or any(v < 1 for v in values):
            raise SdrtError(f"bad --shape {spec!r}", where="--shape",
                            fix="write it as NAME=1x4x64x64 for an input, or DIM=2 for a symbolic dim")
        if name in shapes:  # the last one won in silence
            raise InputError(f"--shape {name!r} is given twice", where=f"--shape {spec}",
                             fix=f"give one --shape {name}=...")
        shapes[name] = values[0] if len(values) == 1 and "x" not in dims.lower() else values
    return shapes


def parse_options(specs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key:
            raise SdrtError(f"bad --option {spec!r}", where="--option", fix="write it as KEY=VALUE")
        if key in options:  # the last one won in silence
            raise InputError(f"--option {key!r} is given twice", where=f"--option {spec}",
                             fix=f"give one --option {key}=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def check_output(arg: str) -> None:
    """-o before the build, which takes minutes for a large model: an existing folder, device, FIFO or socket, a
    dangling symlink, a missing or unwritable folder or a read-only file is refused now. A backend found it only
    after the build, or wrote into it (``-o /dev/null`` printed "wrote /dev/null  0 bytes"; ``-o DIR`` and a
    dangling link ended in an OSError traceback). The rules are the image outputs' (``png.output_target``); only
    the folder's refusal is compile's own, since Core ML's build makes a new .mlpackage folder."""
    from ..pipelines.png import PngError, output_target

    if os.path.isdir(arg):  # output_target refuses a dangling symlink too, before anything is built
        raise InputError(f"-o {arg} is a folder that exists; sdrt compile writes a new file (or a new .mlpackage "
                         "folder)", where="-o", fix=f"give a file name, such as {Path(arg) / 'model.engine'}")
    try:
        output_target(arg, "output", ".engine")
    except PngError as exc:  # in the flag this command's other refusals name
        raise InputError(exc.what, where="-o", fix=exc.fix) from None


def run(args: argparse.Namespace) -> int:
    from ..graph import Graph
    from ..plugins import get_registry
    from ..runtime import _named_backend, _open_weights

    if args.list_targets:  # it builds nothing: a build flag beside it was ignored in silence
        given = [flag for flag, value in (("--target", args.target), ("--output", args.output),
                                          ("--weights", args.weights), ("--shape", args.shape),
                                          ("--option", args.option)) if value]
        if given:
            raise InputError(f"--list-targets prints the backend's targets and builds nothing, so "
                             f"{' and '.join(given)} would be ignored", where="--list-targets",
                             fix=f"drop {' and '.join(given)}, or drop --list-targets to build")
    backend = _named_backend(get_registry(), args.backend)
    targets = backend.targets()
    if args.list_targets:
        print(f"{backend.name}: {', '.join(targets) if targets else 'no ahead-of-time targets'}")
        return 0
    if not targets:
        raise SdrtError(f"backend {backend.name!r} has no ahead-of-time build", where="sdrt compile",
                        fix="pick a backend that lists targets (sdrt compile MODEL --backend B --list-targets)")
    if args.target is None or args.output is None:
        raise SdrtError("sdrt compile needs --target and --output", where="sdrt compile",
                        fix=f"pass --target (one of {', '.join(targets)}) and -o FILE")
    options = parse_options(args.option)
    if args.shape:
        if "shapes" in options:  # --shape replaced it in silence
            raise InputError("--shape and --option shapes=... both pin the input shapes", where="--shape",
                             fix="give the shapes one way: --shape NAME=DxD (repeatable), or --option shapes=JSON")
        options["shapes"] = parse_shapes(args.shape)
    from .paths import check_writes, refuse_stdout, weights_once

    refuse_stdout(args.output, "compile", "")
    check_output(args.output)
    check_writes({"-o": args.output}, {"MODEL": args.model, "--weights": args.weights})
    weights_once(args.weights)
    graph = Graph.load(args.model)
    if "DequantizeLinear" in graph.op_counts():  # quantized weights: as sdrt.load gives them to this backend
        from ..quantization import for_backend

        graph = for_backend(graph, backend)
    graph = graph.without_contrib_ops(backend.contrib_ops, backend.name)  # onnxruntime's contrib ops, as compile does
    weights = _open_weights(args.weights)
    start = time.perf_counter()
    path = Path(backend.build(graph, weights, args.target, args.output, **options))
    seconds = time.perf_counter() - start
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
    from ..errors import printable

    print(printable(f"wrote {path}  {size:,} bytes  ({backend.name} {args.target}, {seconds:.1f} s)"))
    return 0
