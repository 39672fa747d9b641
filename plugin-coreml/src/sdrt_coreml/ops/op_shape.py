"""Layout ops: Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Split, Slice, Expand, Tile, Pad."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import check, op
from ._common import Value, attrs, ints, mb, norm_axis, np_dtype, rank, shape, var


def target_shape(src: tuple[int, ...], spec: list[int], allowzero: bool) -> list[int]:
    """ONNX Reshape's shape input resolved against ``src`` (0 copies a dim, -1 is inferred)."""
    out = [src[i] if d == 0 and not allowzero else d for i, d in enumerate(spec)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(src) // max(known, 1)
    if math.prod(out) != math.prod(src):
        raise ValueError(f"cannot reshape {list(src)} to {spec}")
    return out


def reshape(x: Any, new_shape: list[int] | tuple[int, ...]) -> Any:
    if shape(x) == tuple(new_shape):
        return x
    return mb().reshape(x=x, shape=list(new_shape))


@op("Shape", "Size")
def op_shape(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """Shapes are static in a Core ML program: Shape and Size of a runtime tensor are constants."""
    s = shape(inputs[0])
    if node.op_type == "Size":
        return [np.asarray(math.prod(s), np.int64)]
    a = attrs(node)
    r = len(s)
    start = int(a.get("start", 0))
    end = int(a.get("end", r))
    return [np.asarray(s[slice(start, end)], np.int64)]


@op("Reshape")
def op_reshape(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    return [reshape(x, target_shape(shape(x), ints(inputs[1], "Reshape's shape"),
                                    bool(attrs(node).get("allowzero", 0))))]


@op("Flatten")
def op_flatten(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    s = shape(x)
    axis = norm_axis(int(attrs(node).get("axis", 1)), len(s) + 1)
    return [reshape(x, [math.prod(s[:axis]), math.prod(s[axis:])])]


def _axes(node: Any, inputs: list[Value], lw: Any) -> list[int] | None:
    if len(inputs) > 1 and inputs[1] is not None:
        return ints(inputs[1], f"{node.op_type}'s axes")
    a = attrs(node).get("axes")
    return None if a is None else [int(v) for v in a]


@op("Squeeze")
def op_squeeze(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    s = shape(x)
    axes = _axes(node, inputs, lw)
    drop = {norm_axis(a, len(s)) for a in axes} if axes is not None else {i for i, d in enumerate(s) if d == 1}
    return [reshape(x, [d for i, d in enumerate(s) if i not in drop])]


@op("Unsqueeze")
def op_unsqueeze(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    axes = _axes(node, inputs, lw) or []
    out = list(shape(x))
    r = len(out) + len(axes)
    for a in sorted(norm_axis(a, r) for a in axes):
        out.insert(a, 1)
    return [reshape(x, out)]


@op("Transpose")
def op_transpose(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    perm = [int(p) for p in attrs(node).get("perm", list(range(rank(x)))[::-1])]
    if perm == list(range(rank(x))):
        return [x]
    return [mb().transpose(x=x, perm=perm)]


@op("Concat")
def op_concat(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    present = [v for v in inputs if v is not None and math.prod(v.shape) > 0]
    like = next(v for v in present if not isinstance(v, np.ndarray))
    axis = norm_axis(int(attrs(node)["axis"]), rank(like))
    if len(present) == 1:
        return [var(lw, present[0], like=like)]
    return [mb().concat(values=[var(lw, v, like=like) for v in present], axis=axis)]


@op("Split")
def op_split(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    axis = norm_axis(int(a.get("axis", 0)), rank(x))
    if len(inputs) > 1 and inputs[1] is not None:
        sizes = ints(inputs[1], "Split's sizes")
    elif "split" in a:
        sizes = [int(v) for v in a["split"]]
    else:
        n = int(a.get("num_outputs", len(node.output)))
        dim = shape(x)[axis]
        step = -(-dim // n)
        sizes = [min(step, dim - i * step) for i in range(n)]
    if len(sizes) == 1:
        return [x]
    outs = mb().split(x=x, split_sizes=sizes, axis=axis)
    return list(outs)


@op("Slice")
def op_slice(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    s = shape(x)
    starts = ints(inputs[1], "Slice's starts")
    ends = ints(inputs[2], "Slice's ends")
    axes = ints(inputs[3], "Slice's axes") if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
    steps = ints(inputs[4], "Slice's steps") if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    begin, end, stride = [0] * len(s), list(s), [1] * len(s)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = norm_axis(ax, len(s))
        if sp < 0:
            raise ValueError("Slice with a negative step")
        lo, hi, _ = slice(st, en, sp).indices(s[ax])
        begin[ax], end[ax], stride[ax] = lo, max(lo, hi), sp
    if begin == [0] * len(s) and end == list(s) and stride == [1] * len(s):
        return [x]
    return [mb().slice_by_index(x=x, begin=begin, end=end, stride=stride)]


@op("Expand")
def op_expand(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    want = ints(inputs[1], "Expand's shape")
    s = list(shape(x))
    out = list(np.broadcast_shapes(tuple(s), tuple(want)))
    s = [1] * (len(out) - len(s)) + s
    x = reshape(x, s)
    reps = [o // d for o, d in zip(out, s)]
    return [x if all(r == 1 for r in reps) else mb().tile(x=x, reps=reps)]


@op("Tile")
def op_tile(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [mb().tile(x=var(lw, inputs[0]), reps=ints(inputs[1], "Tile's repeats"))]


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


@check("Pad")
def check_pad(node: Any) -> str | None:
    mode = attrs(node).get("mode", "constant")
    return None if mode in _PAD_MODES else f"mode={mode}"


@op("Pad")
def op_pad(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    r = rank(x)
    pads = ints(inputs[1], "Pad's pads") if len(inputs) > 1 and inputs[1] is not None else list(a.get("pads", []))
    value = 0.0
    if len(inputs) > 2 and inputs[2] is not None:
        value = float(np.asarray(inputs[2]).reshape(-1)[0]) if isinstance(inputs[2], np.ndarray) else None
        if value is None:
            raise ValueError("Pad with a runtime constant value")
    axes = ints(inputs[3], "Pad's axes") if len(inputs) > 3 and inputs[3] is not None else list(range(r))
    full = [0] * (2 * r)
    n = len(axes)
    for i, ax in enumerate(axes):
        ax = norm_axis(ax, r)
        full[2 * ax], full[2 * ax + 1] = pads[i], pads[i + n]
    if any(p < 0 for p in full):
        raise ValueError("Pad with negative pads (cropping)")
    if not any(full):
        return [x]
    return [mb().pad(x=x, pad=full, mode=_PAD_MODES[a.get("mode", "constant")],
                     constant_val=np_dtype(x).type(value))]
