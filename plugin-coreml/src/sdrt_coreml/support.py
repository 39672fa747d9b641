"""Fail early: find every node the lowering cannot handle before any work starts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sdrt.errors import UnsupportedGraph

from .ops import FOLD_ONLY, TABLE


def unsupported_nodes(nodes: Iterable[Any]) -> dict[str, list[str]]:
    """Op type (with the reason for attribute problems) -> names of the nodes that use it."""
    return TABLE.unsupported_nodes(nodes)


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
