"""``sdrt compile MODEL --backend B --target T -o FILE``: an ahead-of-time build for hardware that need not be here.

The command is the core's; a backend offers it through ``Backend.targets()`` and
``Backend.build(graph, weights, target, path, **options)``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ..errors import SdrtError

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
            raise SdrtError(f"bad --shape {spec!r}", where="sdrt compile",
                            fix="write it as NAME=1x4x64x64 for an input, or DIM=2 for a symbolic dim")
        shapes[name] = values[0] if len(values) == 1 and "x" not in dims.lower() else values
    return shapes


def parse_options(specs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key:
            raise SdrtError(f"bad --option {spec!r}", where="sdrt compile", fix="write it as KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def run(args: argparse.Namespace) -> int:
    from ..graph import Graph
    from ..plugins import get_registry
    from ..runtime import _named_backend, _open_weights

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
        options["shapes"] = parse_shapes(args.shape)
    from .paths import check_writes, refuse_stdout

    refuse_stdout(args.output, "compile", "")
    check_writes({"-o": args.output}, {"MODEL": args.model, "--weights": args.weights})
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
