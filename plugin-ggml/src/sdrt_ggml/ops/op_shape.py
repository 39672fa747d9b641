"""Layout ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand, Concat, Slice, Split, Shape, Size.

Transpose and Slice are views (no copy); ops that need contiguous data make
one copy when given a view.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import guards
from . import op
from ._common import (
    MAX_DIMS,
    GTensor,
    Value,
    attrs,
    concat_ptr,
    cont,
    expand_to,
    fold_shape,
    gdim,
    ggml_lib,
    ne_of,
    norm_axis,
    permute,
    reshape,
    view_as,
)


def _ints(v: Value | None, node: Any, what: str) -> list[int] | None:
    if v is None:
        return None
    if not isinstance(v, np.ndarray):
        raise ValueError(f"{node.op_type} with a runtime {what}")
    return [int(i) for i in v.reshape(-1)]


@op("Reshape")
def op_reshape(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    shape = _ints(inputs[1], node, "shape") or []
    allowzero = int(attrs(node).get("allowzero", 0))
    out = [x.shape[i] if (d == 0 and not allowzero) else d for i, d in enumerate(shape)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = x.size // max(known, 1)
    return [reshape(lowering, x, out)]


@op("Flatten")
def op_flatten(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    axis = norm_axis(int(attrs(node).get("axis", 1)), x.rank)
    return [reshape(lowering, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


def _axes(node: Any, inputs: list[Value]) -> list[int] | None:
    if len(inputs) > 1 and inputs[1] is not None:
        return _ints(inputs[1], node, "axes")
    a = attrs(node).get("axes")
    return list(a) if a is not None else None


@op("Squeeze")
def op_squeeze(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    axes = _axes(node, inputs)
    if axes is None:
        shape = [d for d in x.shape if d != 1]
    else:
        drop = {norm_axis(a, x.rank) for a in axes}
        shape = [d for i, d in enumerate(x.shape) if i not in drop]
    return [reshape(lowering, x, shape)]


@op("Unsqueeze")
def op_unsqueeze(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    axes = _axes(node, inputs) or []
    rank = x.rank + len(axes)
    ins = sorted(norm_axis(a, rank) for a in axes)
    shape = list(x.shape)
    for a in ins:
        shape.insert(a, 1)
    return [reshape(lowering, x, shape)]


@op("Transpose")
def op_transpose(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    perm = attrs(node).get("perm") or list(reversed(range(x.rank)))
    return [permute(lowering, x, perm)]


@op("Expand")
def op_expand(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    shape = _ints(inputs[1], node, "shape") or []
    out = tuple(int(d) for d in np.broadcast_shapes(x.shape, tuple(shape)))
    return [expand_to(lowering, cont(lowering, x), out)]


@op("Tile")
def op_tile(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    reps = _ints(inputs[1], node, "repeats") or []
    out = tuple(d * r for d, r in zip(x.shape, reps))
    x = cont(lowering, x)
    return [GTensor(ggml_lib().ggml_repeat_4d(lowering.ctx, x.ptr, *ne_of(out)), out, x.dtype)]


@op("Shape")
def op_shape(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    shape = np.array(np.shape(x) if isinstance(x, np.ndarray) else x.shape, dtype=np.int64)
    a = attrs(node)
    start, end = a.get("start", 0), a.get("end")
    return [shape[start:end]]


@op("Size")
def op_size(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    return [np.array(np.size(x) if isinstance(x, np.ndarray) else x.size, dtype=np.int64)]


def slice_axis(lowering: Any, x: GTensor, axis: int, start: int, stop: int, step: int) -> GTensor:
    """A view of ``x[..., start:stop:step, ...]`` along ONNX ``axis`` (positive step)."""
    axis = norm_axis(axis, x.rank)
    dim = x.shape[axis]
    start, stop, step = slice(start, stop, step).indices(dim)
    count = max(0, -(-(stop - start) // step))
    if start == 0 and count == dim and step == 1:
        return x
    if step < 1:
        raise ValueError("Slice with a negative step")
    g = ggml_lib()
    gd = gdim(axis, x.rank)
    if gd == 0 and step != 1:  # ggml views cannot stride the innermost dim: make the axis an outer one first
        if x.rank == 1:
            y = slice_axis(lowering, reshape(lowering, x, (dim, 1)), 0, start, stop, step)
            return reshape(lowering, cont(lowering, y), (count,))
        perm = list(range(x.rank))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        y = slice_axis(lowering, permute(lowering, x, perm), x.rank - 2, start, stop, step)
        return permute(lowering, y, perm)
    if x.ptr.contents.nb[0] != guards.type_size(x.ptr) and x.ptr.contents.ne[0] > 1:
        x = cont(lowering, x)  # a ggml view always takes a dense innermost dim: a permuted source is copied
    t = x.ptr.contents
    ne = list(t.ne)
    nb = list(t.nb)
    offset = start * nb[gd]
    ne[gd] = count
    nb[gd] = nb[gd] * step
    shape = list(x.shape)
    shape[axis] = count
    v = g.ggml_view_4d(lowering.ctx, x.ptr, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], offset)
    return GTensor(v, tuple(shape), x.dtype)


@op("Slice")
def op_slice(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    starts = _ints(inputs[1], node, "starts") or []
    ends = _ints(inputs[2], node, "ends") or []
    axes = _ints(inputs[3], node, "axes") if len(inputs) > 3 else None
    steps = _ints(inputs[4], node, "steps") if len(inputs) > 4 else None
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        x = slice_axis(lowering, x, a, s, e, st)
    return [x]


def split_sizes(node: Any, inputs: list[Value | None], dim: int) -> list[int]:
    """The part sizes a Split ``node`` cuts an axis of size ``dim`` into."""
    sizes = _ints(inputs[1], node, "split") if len(inputs) > 1 else None
    if sizes is None:
        sizes = attrs(node).get("split")
    if sizes:
        return [int(s) for s in sizes]
    n = len(node.output)
    chunk = -(-dim // n)
    return [min(chunk, dim - i * chunk) for i in range(n)]


@op("Split")
def op_split(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    axis = norm_axis(int(attrs(node).get("axis", 0)), x.rank)
    sizes = split_sizes(node, inputs, x.shape[axis])
    outs: list[Value] = []
    pos = 0
    for s in sizes:
        outs.append(slice_axis(lowering, x, axis, pos, pos + s, 1))
        pos += s
    return outs


@op("Concat")
def op_concat(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    vals = [v for v in inputs if v is not None and np.size(v if isinstance(v, np.ndarray) else 1) != 0
            and (not isinstance(v, GTensor) or v.size)]
    rank = vals[0].rank if isinstance(vals[0], GTensor) else np.ndim(vals[0])
    axis = norm_axis(int(attrs(node)["axis"]), rank)
    full = list(np.shape(vals[0]) if isinstance(vals[0], np.ndarray) else vals[0].shape)
    full[axis] = sum(int(np.shape(v)[axis] if isinstance(v, np.ndarray) else v.shape[axis]) for v in vals)
    if rank > MAX_DIMS and any(d != 1 for d in full[: rank - MAX_DIMS]):
        # more than ggml's four dims: join (before, axis, after) views, the axes either side merged
        folded = [fold_shape(np.shape(v) if isinstance(v, np.ndarray) else v.shape, [axis]) for v in vals]
        axis = folded[0][1][axis]
        vals = [view_as(lowering, v, f) for v, (f, _) in zip(vals, folded)]
        rank = len(folded[0][0])
    parts = [cont(lowering, lowering.const(v) if isinstance(v, np.ndarray) else v) for v in vals]
    y = parts[0]
    for p in parts[1:]:
        shape = list(y.shape)
        shape[axis] += p.shape[axis]
        y = GTensor(concat_ptr(lowering, y.ptr, p.ptr, gdim(axis, rank)), tuple(shape), y.dtype)
    return [reshape(lowering, y, full) if len(full) != rank else y]
