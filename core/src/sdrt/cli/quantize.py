"""``sdrt quantize MODEL.onnx --to int8|int4|fp8 [--block-size 32] [-o OUT.onnx]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import counted, printable

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("quantize", help="store a model's matmul and conv weights as int8, int4 or fp8")
    p.add_argument("model", help="path to an .onnx file (external data is read from its folder)")
    p.add_argument("--to", required=True, help="int8 (per output channel), int4 (in blocks) or fp8")
    p.add_argument("--block-size", type=int, default=None, help="int4 block size: 16, 32, 64 or 128 (default 32)")
    p.add_argument("-o", "--output", default=None, help="the graph to write (default: MODEL.<--to>.onnx next to MODEL: unet.int8.onnx, unet.int4.onnx, unet.fp8.onnx)")
    p.add_argument("--plan", action="store_true", help="list which weights would be quantized and which kept, "
                                                       "and why; write nothing")
    return p


def run(args: argparse.Namespace) -> int:
    from .. import quantization as q
    from ..errors import SdrtError
    from ..graph import Graph
    from ..graph.strip import check_outputs, input_files
    from .paths import check_writes

    scheme = q.scheme_of(args.to, where="sdrt quantize", arg="--to")
    if args.block_size is not None and scheme != "int4":  # int8 and fp8 scale per output channel: no blocks
        raise SdrtError(f"--block-size applies to int4, and --to {args.to} scales per output channel",
                        where="--block-size", fix="leave --block-size out, or pass --to int4")
    block_size = 32 if args.block_size is None else args.block_size
    if args.plan and args.output is not None:  # --plan writes nothing: -o was ignored in silence
        raise SdrtError("--plan lists the weights and writes nothing, so -o would be ignored", where="-o",
                        fix="drop -o to see the plan, or drop --plan to write the graph")
    src = Path(args.model)
    from .paths import check_suffix, refuse_stdout

    refuse_stdout(args.output, "quantize", ".onnx")
    out = Path(args.output) if args.output else src.with_name(f"{src.stem}.{scheme}.onnx")
    _not_a_checkpoint(src, scheme)
    # a given -o's folder exists (as generate's -o): nothing is created; the default sits beside MODEL
    # (check_outputs below refuses an output that is one of the model's files, its external data included)
    check_writes({"-o": out if args.output else None}, {})
    from .paths import check_links

    check_links({"-o": out})  # it quantized the whole graph, then failed to write ("check free disk space")
    graph = Graph.load(src)
    inputs = input_files(graph)
    data_out = out.with_name(f"{out.name}_data")  # written beside -o for a graph above 2 GB
    check_outputs({"-o": out}, inputs)
    check_outputs({f"-o's external data file {data_out.name}": data_out}, inputs)
    if args.output:  # after check_outputs: an output that would destroy an input is named so first
        check_suffix(args.output, ".onnx")
    planned = q.plan(graph, scheme, block_size=block_size)
    if args.plan:
        for reason, names in planned.items():
            print(f"{reason}: {len(names)}")
            for n in names:
                print(f"  {n}")
        return 0
    if not planned["quantized"]:  # a copy with nothing quantized, a file larger than the model, helps no one
        _nothing_to_quantize(graph, planned, src, scheme)
    original = sum(p.stat().st_size for p in inputs)  # measured before anything is written (its data files too)
    result = q.quantize(graph, scheme, block_size=block_size)
    q.save(result, out)
    written = sum(p.stat().st_size for p in (out, data_out) if p.is_file())
    print(printable(f"{out}  {written:,} bytes ({counted(len(planned['quantized']), 'weight')} as {scheme}; "
                    f"the model: {original:,} bytes)"))
    return 0


def _not_a_checkpoint(src: Path, scheme: str) -> None:
    """Refuse a checkpoint file in sdrt quantize's words (Graph.load's refusal says to pass it as weights, an argument quantize has not)."""
    from ..errors import ModelError
    from ..formats import weights_kind

    kind = weights_kind(src)
    if kind is None:
        return
    fix = ("a GGUF file is quantized already: run it as it is (sdrt generate FILE)" if "GGUF" in kind else
           f"pass the model's .onnx graph; a checkpoint file is quantized as it loads: "
           f"pipelines.load(FILE, quantize={scheme!r}) in the Python API")
    raise ModelError(f"{src.name} is {kind}, and sdrt quantize rewrites the weights of an ONNX graph", where=str(src),
                     fix=fix)


def _nothing_to_quantize(graph: object, planned: dict[str, list[str]], src: Path, scheme: str) -> None:
    """Refuse a graph none of whose weights would be quantized, saying why."""
    from .. import quantization as q
    from ..errors import ModelError

    elsewhere = q.quantized_elsewhere(graph)  # type: ignore[arg-type]
    if elsewhere:
        raise ModelError(f"the graph is already quantized ({elsewhere}) and holds no float32 matmul or conv weight "
                         "left to quantize", where=str(src), fix="quantize the float32 model, or use this one as it is")
    reasons = "; ".join(f"{len(v)} {k}" for k, v in planned.items() if k != "quantized" and v)
    raise ModelError("no weight to quantize: " + (reasons or "the graph has no MatMul, Gemm or Conv weight"),
                     where=str(src), fix=f"sdrt quantize {src} --to {scheme} --plan lists every weight and why it is kept"
                     if reasons else "quantize a graph with matmul or conv weights (a UNet, a text encoder, a VAE)")
