"""Refusing a graph that MIGraphX's ONNX parser cannot take, before any long work.

The op list is MIGraphX's own: ``migraphx.get_onnx_operators()`` where the
module is installed, else ``onnx_ops.ONNX_OPERATORS``, which
``tools/extract_onnx_ops.py`` derived from MIGraphX's ``src/onnx/parse_*.cpp``.
The parser matches nodes by op type alone, whatever their domain, so this
check does too. Inputs and outputs must be tensors of a type that MIGraphX's
Python API can take and return.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

from sdrt.errors import UnsupportedGraph

from .onnx_ops import ONNX_OPERATORS, SOURCE_COMMIT

#: ops whose output size depends on the input values: MIGraphX compiles static shapes and pads their
#: outputs to the largest size (NonZero's [rank, numel]), so later ops and the user see padding as data
DATA_DEPENDENT = frozenset({"NonZero", "NonMaxSuppression"})

#: numpy dtypes MIGraphX parameters and results carry through its Python API
IO_DTYPES = frozenset({"float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                       "uint32", "uint64", "bool"})


def supported_ops(mod: ModuleType | None) -> tuple[frozenset[str], str]:
    """(op types, where the list came from)."""
    if mod is not None:
        try:
            return frozenset(str(op) for op in mod.get_onnx_operators()), "migraphx.get_onnx_operators()"
        except Exception:  # noqa: BLE001 - an old build without the call: fall back to the derived list
            pass
    return ONNX_OPERATORS, f"MIGraphX's src/onnx/parse_*.cpp at {SOURCE_COMMIT[:12]}"


def nodes(graph_proto: Any, prefix: str = "") -> Iterable[tuple[str, str]]:
    """(op type, node label) of every node, in subgraphs (If/Loop/Scan bodies) too."""
    for i, node in enumerate(graph_proto.node):
        label = prefix + (node.name or f"#{i} {node.op_type}")
        yield node.op_type, label
        for attr in node.attribute:
            subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            for sub in subs:
                yield from nodes(sub, f"{label}/{attr.name}/")


def unsupported_ops(graph_proto: Any, supported: Iterable[str]) -> dict[str, list[str]]:
    """``{op type: [node labels]}`` for every node whose op type is not in ``supported``."""
    ok = set(supported)
    bad: dict[str, list[str]] = {}
    for op, label in nodes(graph_proto):
        if op not in ok:
            bad.setdefault(op, []).append(label)
    return bad


def check(graph: Any, mod: ModuleType | None) -> None:
    """Raise ``UnsupportedGraph`` listing every op MIGraphX rejects and every input/output it cannot carry."""
    ops, source = supported_ops(mod)
    bad = unsupported_ops(graph.model.graph, ops)
    if bad:
        raise UnsupportedGraph(
            f"MIGraphX's ONNX parser has no parser for {len(bad)} op type(s) of this graph",
            unsupported=bad, where=f"{graph.name} (op list from {source})",
            fix="export the model without these ops (another opset, or decomposed), or use another backend "
                "(sdrt-ggml, or the reference backend)")
    padded = unsupported_ops(graph.model.graph, ops - DATA_DEPENDENT)  # every other op passed above
    if padded:
        raise UnsupportedGraph(
            "the output size of these ops depends on the data, and MIGraphX, compiling static shapes, pads it to "
            "the largest size: the padding would read as results", unsupported=padded, where=graph.name,
            fix="run this graph on another backend, or cut it before these ops and finish on the CPU")
    odd: dict[str, list[str]] = {}
    for kind, infos in (("input", graph.inputs), ("output", graph.outputs)):
        for info in infos:
            if info.dtype not in IO_DTYPES:
                odd.setdefault(f"{info.dtype} {kind}", []).append(info.name)
    if odd:
        raise UnsupportedGraph(
            "MIGraphX takes and returns only numeric and bool tensors", unsupported=odd, where=graph.name,
            fix=f"use inputs and outputs of {', '.join(sorted(IO_DTYPES))}, or another backend for this graph")
