"""Fail early: find every node the lowering cannot handle before any work starts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sdrt.errors import UnsupportedGraph

from .ops import CHECKS, FOLD_ONLY, supported_ops


def unsupported_nodes(nodes: Iterable[Any]) -> dict[str, list[str]]:
    """Op type (with the reason for attribute problems) -> names of the nodes that use it."""
    ops = supported_ops()
    found: dict[str, list[str]] = {}
    for i, node in enumerate(nodes):
        name = node.name or f"#{i} {node.op_type}"
        key: str | None = None
        if node.domain not in ("", "ai.onnx"):
            key = f"{node.domain}.{node.op_type}"
        elif node.op_type not in ops:
            key = node.op_type
        elif node.op_type in CHECKS:
            why = CHECKS[node.op_type](node)
            if why:
                key = f"{node.op_type} ({why})"
        if key is not None:
            found.setdefault(key, []).append(name)
    return found


def check_graph(nodes: Iterable[Any], where: str) -> None:
    """Raise ``UnsupportedGraph`` listing every unsupported op and attribute combination."""
    found = unsupported_nodes(nodes)
    if found:
        raise UnsupportedGraph(
            "the coreml backend cannot lower this graph to a Core ML program",
            unsupported=found,
            where=where,
            fix="run it on another backend (openvino, ggml, reference), or re-export the model without these ops; "
            f"ops that work only on constants: {', '.join(sorted(FOLD_ONLY)[:6])}, ...",
        )
