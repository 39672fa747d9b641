"""Ops on values of more than four dims (``_common.wide``), lowered on a view with fewer dims.

ggml holds at most four dims. An op that treats some adjacent axes alike may instead run on a view of the
same dense values with those axes merged, and its result takes the full shape back:

- an elementwise op (unary, or binary/ternary with numpy broadcasting): adjacent output axes along which
  every operand either spans the axis or broadcasts over it the same way merge into one; size-1 axes drop.
  Flux's rotary embedding as the original implementation writes it multiplies ``[B, H, S, D/2, 1, 2]``
  pairs by ``[B, 1, S, D/2, 2, 2]`` rotations: (B), (H), (S, D/2), (1), (2) -> four dims.
- Slice, Split and a constant-index Gather: the axes they cut stay, each run of axes between them merges
  (``_common.fold_shape``); a fused qkv ``[B, S, 3, H, D]`` split on axis 2 is ``(B S, 3, H D)``.
- Concat does the same itself (``op_shape.op_concat``): (before, axis, after).

When the merged view still has more than four dims the op is refused (``UnsupportedGraph``), as before.
Rewrites (fused kernels) are not tried on such values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ._common import MAX_DIMS, GTensor, HostValue, Value, attrs, fold_shape, norm_axis, reshape, view_as

#: elementwise ops (numpy broadcasting across their operands) that run on a merged view
ELEMENTWISE = {
    "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Softplus", "Sin", "Cos", "Floor", "Ceil",
    "Reciprocal", "LeakyRelu", "Elu", "Gelu", "Clip", "HardSigmoid", "Erf", "HardSwish", "Cast",
    "Add", "Sub", "Mul", "Div", "Pow", "Where", "Sum",
}
#: ops that cut along some axes and run on a view with the other axes merged
CUTTING = {"Slice", "Split", "Gather"}
FOLDABLE = ELEMENTWISE | CUTTING

#: ops whose inputs past the first are scalar parameters, not broadcast operands
_SCALAR_PARAMS = {"Clip", "Pow"}


def _shape(v: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in (v.shape if isinstance(v, GTensor) else np.shape(v)))


def _elementwise(lowering: Any, node: Any, ins: list[Value | None], fn: Callable[..., list[Value]]) -> list[Value]:
    n_operands = 1 if node.op_type in _SCALAR_PARAMS else len(ins)
    operands = [(k, _shape(v)) for k, v in enumerate(ins[:n_operands]) if v is not None]
    out = tuple(int(d) for d in np.broadcast_shapes(*(s for _, s in operands)))
    r = len(out)
    padded = {k: (1,) * (r - len(s)) + s for k, s in operands}
    groups: list[tuple[tuple[bool, ...], list[int]]] = []
    for i, d in enumerate(out):
        if d == 1:
            continue
        pattern = tuple(padded[k][i] != 1 for k, _ in operands)
        if groups and groups[-1][0] == pattern:
            groups[-1][1].append(i)
        else:
            groups.append((pattern, [i]))
    if len(groups) > MAX_DIMS:
        raise ValueError(f"{node.op_type} on values of shapes {[s for _, s in operands]}: their broadcast "
                         f"has more than {MAX_DIMS} distinct axis groups")
    folded = list(ins)
    for k, s in padded.items():
        folded[k] = view_as(lowering, ins[k], [math.prod(s[i] for i in axes) for _, axes in groups] or [1])
    outs = fn(lowering, node, folded)
    return [reshape(lowering, y, out) if isinstance(y, GTensor) else y for y in outs]


def _ints(v: Value | None, what: str) -> list[int] | None:
    if v is None:
        return None
    if not isinstance(v, np.ndarray):
        raise ValueError(f"a runtime {what} on a value of more than {MAX_DIMS} dimensions")
    return [int(i) for i in v.reshape(-1)]


def _cuts(node: Any, ins: list[Value | None], x: GTensor) -> list[tuple[int, int, int, int]]:
    """(axis, start, stop, step) of every cut the Slice/Split/Gather ``node`` makes on ``x``."""
    from .op_shape import split_sizes

    if node.op_type == "Slice":
        starts = _ints(ins[1], "starts") or []
        ends = _ints(ins[2], "ends") or []
        axes = (_ints(ins[3], "axes") if len(ins) > 3 else None) or list(range(len(starts)))
        steps = (_ints(ins[4], "steps") if len(ins) > 4 else None) or [1] * len(starts)
        return [(norm_axis(ax, x.rank), s, e, st) for s, e, ax, st in zip(starts, ends, axes, steps)]
    axis = norm_axis(int(attrs(node).get("axis", 0)), x.rank)
    if node.op_type == "Split":
        cuts, pos = [], 0
        for size in split_sizes(node, ins, x.shape[axis]):
            cuts.append((axis, pos, pos + size, 1))
            pos += size
        return cuts
    return [(axis, 0, x.shape[axis], 1)]  # Gather: the axis stays whole, the indices pick from it


def _cutting(lowering: Any, node: Any, ins: list[Value | None]) -> list[Value]:
    from .op_gather import select
    from .op_shape import slice_axis

    x = ins[0]
    if not isinstance(x, GTensor):
        raise ValueError(f"{node.op_type} of a constant by a runtime value of more than {MAX_DIMS} dimensions")
    if node.op_type == "Gather" and not isinstance(ins[1], np.ndarray):
        raise ValueError(f"Gather with runtime indices on a value of more than {MAX_DIMS} dimensions")
    cuts = _cuts(node, ins, x)
    shape, where = fold_shape(x.shape, [axis for axis, *_ in cuts])
    if len(shape) > MAX_DIMS:
        raise ValueError(f"{node.op_type} cuts shape {x.shape} along too many axes apart "
                         f"({len(shape)} dims after merging the others)")
    y = reshape(lowering, x, shape)
    if node.op_type == "Gather":
        axis, idx = cuts[0][0], ins[1]
        assert isinstance(idx, np.ndarray)
        out = x.shape[:axis] + tuple(np.shape(idx)) + x.shape[axis + 1:]
        return [reshape(lowering, select(lowering, y, where[axis], idx.reshape(-1)), out)]

    def full(part: GTensor) -> GTensor:  # the cut view back in the input's axes
        out = list(x.shape)
        for axis, *_ in cuts:
            out[axis] = part.shape[where[axis]]
        return reshape(lowering, part, out)

    if node.op_type == "Split":
        return [full(slice_axis(lowering, y, where[axis], start, stop, 1)) for axis, start, stop, _ in cuts]
    for axis, start, stop, step in cuts:  # a Slice's cuts apply one after another
        y = slice_axis(lowering, y, where[axis], start, stop, step)
    return [full(y)]


def lower_folded(lowering: Any, node: Any, ins: list[Value | None], fn: Callable[..., list[Value]]) -> list[Value]:
    """``node`` (one of ``FOLDABLE``) whose inputs include a value of more than four dims, on merged views."""
    if any(isinstance(v, HostValue) for v in ins):
        raise ValueError(f"{node.op_type} of a host-computed value and one of more than {MAX_DIMS} dimensions")
    if node.op_type in ELEMENTWISE:
        return _elementwise(lowering, node, ins, fn)
    return _cutting(lowering, node, ins)
