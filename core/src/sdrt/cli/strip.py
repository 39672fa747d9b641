"""``sdrt strip MODEL.onnx [-o OUT.onnx] [--weights OUT.safetensors]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import InputError, counted, printable

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("strip", help="split a model into a weight-free graph and a .safetensors of its initializers")
    p.add_argument("model", help="path to an .onnx file (external data is read from its folder)")
    p.add_argument("-o", "--output", default=None,
                   help="the stripped graph to write (default: MODEL.stripped.onnx next to MODEL)")
    p.add_argument("--weights", default=None,
                   help="the weights file to write, in the output's folder (default: OUTPUT with .safetensors)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..graph import Graph
    from ..graph.strip import check_outputs, input_files
    from .paths import check_writes

    src = Path(args.model)
    from .paths import check_suffix, refuse_stdout

    refuse_stdout(args.output, "strip", ".onnx")
    out = Path(args.output) if args.output else src.with_name(src.stem + ".stripped.onnx")
    weights = Path(args.weights) if args.weights else out.with_suffix(".safetensors")
    if args.weights and weights.name == args.weights:  # a bare file name: in the output's folder, as the help says
        weights = out.parent / weights
    from ..errors import ModelError
    from ..formats import weights_kind

    kind = weights_kind(src)
    if kind is not None:  # Graph.load's refusal says to pass it as weights; strip's --weights names its output
        raise ModelError(f"{src.name} is {kind}: it holds weights only, and sdrt strip splits an ONNX graph from its "
                         "weights", where=str(src), fix="pass an .onnx file (a .safetensors file is what strip writes "
                                                        "beside the weight-free graph)")
    # given paths' folders exist (as generate's -o): nothing is created; the defaults sit beside MODEL or -o
    # (check_outputs below refuses an output that is one of the model's files, its external data included)
    check_writes({"-o": out if args.output else None, "--weights": weights if args.weights else None}, {})
    from .paths import check_links

    check_links({"-o" if args.output else "the default -o": out,
                 "--weights" if args.weights else "the default --weights (-o with .safetensors)": weights})
    graph = Graph.load(src, load_external=False)
    inputs = input_files(graph)
    check_outputs({"-o" if args.output else "the default -o": out,
                   "--weights" if args.weights else "the default --weights (-o with .safetensors)": weights}, inputs)
    if args.output:  # after check_outputs: an output that would destroy an input is named so first
        check_suffix(args.output, ".onnx")
    if args.weights:
        check_suffix(args.weights, ".safetensors", "--weights")
    _check_beside(out, weights, args)
    original = sum(p.stat().st_size for p in inputs)  # measured before anything is written
    res = graph.strip(out, weights)
    print(printable(f"graph:   {res.graph_path}  {res.graph_bytes:,} bytes"))
    print(printable(f"weights: {res.weights_path}  {res.weights_bytes:,} bytes ({counted(res.tensors, 'tensor')})"))
    print(f"original: {original:,} bytes")
    return 0


def _check_beside(out: Path, weights: Path, args: argparse.Namespace) -> None:
    """The weights inside the graph's folder (the graph names them by a path relative to its own folder), in the
    command's words: graph.strip's refusal named no flag, and not the symlink that moved -o's folder."""
    folder = out.resolve().parent
    if folder in weights.resolve().parents:
        return
    moved = f" (-o is a symlink to {out.resolve()})" if out.is_symlink() else ""
    flag = "--weights" if args.weights else "-o"
    raise InputError(f"the weights file {weights} is not in the folder of the stripped graph {out}{moved}, and an "
                     "ONNX graph finds its external data only in its own folder (or below it)", where=flag,
                     fix=f"pass -o the link's target itself, or --weights a path in its folder ({folder})" if moved
                     else "pass --weights a file name in the graph's folder (a bare name goes there)")
