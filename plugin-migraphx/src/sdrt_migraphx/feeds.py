"""Feeds MIGraphX must get in a form it handles: negative reduce axes given at run time.

Since opset 18 (13 for ReduceSum) a Reduce* op takes its axes as an input, and
a graph may feed that input at run time. MIGraphX 2.16 compiles such a reduce
for run-time axes but does not wrap negative ones: on ``ref`` it returns the
input unreduced, or reads out of bounds and aborts the process
(``free(): invalid pointer``, a segfault). The plugin knows each reduce's input
rank from the graph, so it turns negative axes into positive ones before
``program.run``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sdrt.errors import InputError, UnsupportedGraph

#: the ops whose input 1 is ``axes`` (from opset 18; ReduceSum from opset 13)
REDUCE_OPS = frozenset({"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
                        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"})


def _ranks(model: Any) -> dict[str, int]:
    """Rank of every tensor whose shape the graph declares or onnx's shape inference finds."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is best effort; the declared shapes still count
        pass
    g = model.graph
    return {vi.name: len(vi.type.tensor_type.shape.dim) for vi in [*g.input, *g.value_info, *g.output]
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}


def runtime_axes(graph: Any) -> dict[str, int]:
    """``{graph input: rank}`` for each graph input that is the axes of a Reduce* op: the rank to wrap by.

    Raises ``UnsupportedGraph`` when that rank is unknown, or differs between two reduces fed the same axes.
    """
    g = graph.model.graph
    inputs = {i.name for i in g.input} - {t.name for t in g.initializer}
    users = [n for n in g.node if n.op_type in REDUCE_OPS and len(n.input) > 1 and n.input[1] in inputs]
    if not users:
        return {}
    ranks = _ranks(graph.model)
    out: dict[str, int] = {}
    bad: dict[str, list[str]] = {}
    for node in users:
        axes, rank = node.input[1], ranks.get(node.input[0])
        label = node.name or f"{node.op_type} -> {node.output[0]}"
        if rank is None or out.get(axes, rank) != rank:
            bad.setdefault(f"{node.op_type} with run-time axes of unknown or mixed rank", []).append(label)
        else:
            out[axes] = rank
    if bad:
        raise UnsupportedGraph(
            "MIGraphX does not wrap negative run-time reduce axes, and the plugin cannot tell the rank to wrap by",
            unsupported=bad, where=graph.name,
            fix="give the reduce's axes as a constant (an initializer), or declare its input's shape")
    return out


def fix(feeds: Mapping[str, np.ndarray], axes_ranks: Mapping[str, int], where: str) -> dict[str, np.ndarray]:
    """``feeds`` with each run-time reduce axes input's negative values wrapped by its rank.

    Raises ``InputError`` for an axis outside ``[-rank, rank)``, which MIGraphX would read out of bounds.
    """
    out = dict(feeds)
    for name, rank in axes_ranks.items():
        axes = out.get(name)
        if axes is None or not axes.size:
            continue
        if ((axes < -rank) | (axes >= rank)).any():
            raise InputError(f"reduce axes {axes.tolist()} are out of range for a rank-{rank} input",
                             where=f"input {name!r} of {where}", fix=f"pass axes in [{-rank}, {rank - 1}]")
        if (axes < 0).any():
            out[name] = np.where(axes < 0, axes + rank, axes).astype(axes.dtype)
    return out
