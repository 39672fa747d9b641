"""Feeds MIGraphX must get in a form it handles: reduce axes and reshape shapes given at run time.

Since opset 18 (13 for ReduceSum) a Reduce* op takes its axes as an input, and
a graph may feed that input at run time. MIGraphX 2.16 compiles such a reduce
for run-time axes but does not wrap negative ones: on ``ref`` it returns the
input unreduced, or reads out of bounds and aborts the process
(``free(): invalid pointer``, a segfault). The plugin knows each reduce's input
rank from the graph, so it turns negative axes into positive ones before
``program.run``.

Likewise a Reshape fed its shape at run time: MIGraphX takes ``-1`` and ``0``
(infer, copy) as sizes and fails (``std::bad_alloc``, "number of elements must
match"). Where the data's shape is static the plugin resolves them first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sdrt.errors import InputError, UnsupportedGraph

#: the ops whose input 1 is ``axes`` (from opset 18; ReduceSum from opset 13)
REDUCE_OPS = frozenset({"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
                        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"})


def _shapes(model: Any) -> dict[str, list[int | None]]:
    """Shape (None for an unknown size) of every tensor the graph declares or onnx's shape inference finds."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is best effort; the declared shapes still count
        pass
    g = model.graph
    return {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
            for vi in [*g.input, *g.value_info, *g.output]
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}


def _runtime_inputs(graph: Any) -> set[str]:
    g = graph.model.graph
    return {i.name for i in g.input} - {t.name for t in g.initializer}


def runtime_reshapes(graph: Any) -> dict[str, tuple[tuple[int, ...], bool]]:
    """``{graph input: (data shape, allowzero)}`` for each graph input that is a Reshape's shape, data static."""
    inputs = _runtime_inputs(graph)
    users = [n for n in graph.model.graph.node if n.op_type == "Reshape" and len(n.input) > 1 and n.input[1] in inputs]
    if not users:
        return {}
    shapes = _shapes(graph.model)
    out: dict[str, tuple[tuple[int, ...], bool]] = {}
    for node in users:
        dims = shapes.get(node.input[0])
        if dims is not None and all(d is not None for d in dims):
            allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
            out[node.input[1]] = (tuple(int(d) for d in dims if d is not None), allowzero)
    return out


def resolve_shape(shape: np.ndarray, data: tuple[int, ...], allowzero: bool) -> np.ndarray:
    """ONNX Reshape's ``0`` (copy the data's size, unless ``allowzero``) and ``-1`` (infer) resolved."""
    dims = [int(d) for d in shape.reshape(-1)]
    if not allowzero:
        dims = [data[i] if d == 0 and i < len(data) else d for i, d in enumerate(dims)]
    if dims.count(-1) == 1:
        known = int(np.prod([d for d in dims if d != -1]))
        total = int(np.prod(data))
        if known > 0 and total % known == 0:
            dims[dims.index(-1)] = total // known
    return np.array(dims, dtype=shape.dtype).reshape(shape.shape)


def runtime_axes(graph: Any) -> dict[str, int]:
    """``{graph input: rank}`` for each graph input that is the axes of a Reduce* op: the rank to wrap by.

    Raises ``UnsupportedGraph`` when that rank is unknown, or differs between two reduces fed the same axes.
    """
    inputs = _runtime_inputs(graph)
    users = [n for n in graph.model.graph.node
             if n.op_type in REDUCE_OPS and len(n.input) > 1 and n.input[1] in inputs]
    if not users:
        return {}
    shapes = _shapes(graph.model)
    out: dict[str, int] = {}
    bad: dict[str, list[str]] = {}
    for node in users:
        axes = node.input[1]
        rank = len(shapes[node.input[0]]) if node.input[0] in shapes else None
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


def fix(feeds: Mapping[str, np.ndarray], axes_ranks: Mapping[str, int], where: str,
        reshapes: Mapping[str, tuple[tuple[int, ...], bool]] | None = None) -> dict[str, np.ndarray]:
    """``feeds`` with run-time reduce axes wrapped by their rank and run-time reshape shapes resolved.

    Raises ``InputError`` for an axis outside ``[-rank, rank)``, which MIGraphX would read out of bounds.
    """
    out = dict(feeds)
    for name, (data, allowzero) in (reshapes or {}).items():
        if name in out:
            out[name] = resolve_shape(out[name], data, allowzero)
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
