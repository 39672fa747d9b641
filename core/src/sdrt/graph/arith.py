"""The values of the nodes that constant folding meets, computed with numpy alone, as ONNX defines them.

Constants, shapes and shape arithmetic are nearly all of what a torch export folds (the full-size SD 1.5 text
encoder's ggml lowering folded 884 nodes, 805 of them Constant, Identity, Shape, Gather, Unsqueeze, Concat or Cast);
the rest of an SD pipeline's folds are the attention scale (Sqrt, Div, Cast of a float), the causal mask (Trilu,
Equal, Where, Expand), Slice, Reshape, ConstantOfShape, integer Add/Mul/Div, Range and ArgMax; T5's relative
position buckets (Abs, Neg, Min, Log, Cast, Transpose) and Flux's and Chroma's (Mod, Squeeze, Pow, Sin, Cos, And,
Not) add a few more. onnx's reference evaluator computes any node, but importing it takes 12 MiB and 0.3 s of a
process, and building one per node cost the SD 1.5 graphs 0.15-0.2 s of pinning: ``numpy_fold`` answers these, and
returns None for the rest (another op, an attribute form, dtype or value not handled here: a float Range, an
integer divided by 0), which the caller leaves to the evaluator. ``Graph.fold_constants`` (``fold``) and the
plugins' lowering (``sdrt.lowering.fold_node``) both use it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ..errors import ModelError
from . import onnxfile

#: Constant's value attributes read without an evaluator
_CONSTANT_VALUES = {"value_int": lambda a: np.array(a.i, np.int64),
                    "value_ints": lambda a: np.array(list(a.ints), np.int64),
                    "value_float": lambda a: np.array(a.f, np.float32),
                    "value_floats": lambda a: np.array(list(a.floats), np.float32)}


def _constant(node: Any) -> np.ndarray | None:
    """A Constant node's value, or None where the evaluator must read it (sparse, strings, external data)."""
    from onnx import TensorProto, numpy_helper

    if len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value" and attr.t.data_location != TensorProto.EXTERNAL and attr.t.data_type != TensorProto.STRING:
        return numpy_helper.to_array(attr.t)
    read = _CONSTANT_VALUES.get(attr.name)
    return read(attr) if read is not None else None


def _shape(op: str, args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    """Shape (``start`` and ``end`` as opset 15 has them: negative from the end, clamped to the rank, as a
    Python slice reads them) and Size."""
    if len(args) != 1 or args[0] is None:
        return None
    if op == "Size":
        return None if attrs else np.array(args[0].size, np.int64)
    if set(attrs) - {"start", "end"}:
        return None
    start = int(attrs["start"].i) if "start" in attrs else 0
    end = int(attrs["end"].i) if "end" in attrs else None
    return np.array(args[0].shape[start:end], np.int64)


def _axes_of(values: Any, rank: int) -> list[int] | None:
    """Axes as ONNX gives them (negative from the end), each once and within ``rank``; None otherwise."""
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(values).reshape(-1)]
    return axes if len(set(axes)) == len(axes) and all(0 <= a < rank for a in axes) else None


def _float(dtype: np.dtype) -> bool:
    """float16, float32 or float64: the float8s (numpy kind f too) and bfloat16 are the evaluator's."""
    return dtype.kind == "f" and dtype.itemsize in (2, 4, 8)


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape ``shapes`` broadcast to, ONNX's multidirectional broadcasting being numpy's; None where they do not."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return None


def _ints(value: np.ndarray | None) -> list[int] | None:
    """A 1-D integer tensor's values (shapes, starts, axes), or None for another kind of input."""
    if value is None or value.dtype.kind not in "iu" or value.ndim != 1:
        return None
    return [int(v) for v in value]


def _data_and_axes(args: list[Any], attrs: dict[str, Any], opset: int) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Squeeze's and Unsqueeze's data and axes (an input from opset 13, the attribute before; None where not given),
    or None for another form."""
    if not args or args[0] is None:
        return None
    if opset >= 13:
        if len(args) > 2 or attrs:
            return None
        return args[0], (np.asarray(args[1]) if len(args) == 2 and args[1] is not None else None)
    if len(args) != 1 or set(attrs) - {"axes"}:
        return None
    return args[0], (np.array(list(attrs["axes"].ints), np.int64) if "axes" in attrs else None)


def _unsqueeze(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    given = _data_and_axes(args, attrs, opset)
    if given is None or given[1] is None:
        return None
    out, axes_in = given
    norm = _axes_of(axes_in, out.ndim + axes_in.size)
    if norm is None:
        return None
    for a in sorted(norm):
        out = np.expand_dims(out, a)
    return out


def _concat(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    if not args or any(a is None for a in args) or "axis" not in attrs:
        return None
    if len({a.dtype for a in args}) != 1 or len({a.ndim for a in args}) != 1 or args[0].ndim == 0:
        return None
    axis = int(attrs["axis"].i)
    if not -args[0].ndim <= axis < args[0].ndim:
        return None
    return np.concatenate(args, axis=axis)


def _gather(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    if len(args) != 2 or any(a is None for a in args) or set(attrs) - {"axis"}:
        return None
    data, idx = args
    axis = int(attrs["axis"].i) if "axis" in attrs else 0
    if data.ndim == 0 or idx.dtype.kind not in "iu" or not -data.ndim <= axis < data.ndim:
        return None
    size = data.shape[axis]
    if idx.size and (int(idx.min()) < -size or int(idx.max()) >= size):
        return None
    return np.take(data, idx, axis=axis)


def _cast(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    if len(args) != 1 or args[0] is None or set(attrs) != {"to"}:
        return None
    x = args[0]
    try:
        to = onnxfile.np_dtype(int(attrs["to"].i))
    except (ModelError, ValueError, TypeError):
        return None
    if any(d.kind not in "iub" and not _float(d) for d in (x.dtype, to)):
        return None  # strings, bfloat16, the float8s (saturating) and float4: the evaluator's own conversions
    if to.kind in "iu" and x.size and x.dtype.kind in "iu":  # an integer into a narrower one: where it fits
        info = np.iinfo(to)
        if int(x.min()) < info.min or int(x.max()) > info.max:
            return None
    # a float into an integer truncates toward zero, as C's cast; NaN, inf and values past the range (T5's log of a
    # 0 position, masked off later) become what the CPU's conversion gives, as in the runtimes and the evaluator;
    # past float16's range: inf
    with np.errstate(all="ignore"):
        return x.astype(to)


def _slice(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    """Slice from opset 10 (starts, ends, axes and steps as inputs), each index clamped as ONNX says."""
    if opset < 10 or attrs or not 3 <= len(args) <= 5 or args[0] is None or args[0].ndim == 0:
        return None
    data = args[0]
    starts, ends = _ints(args[1]), _ints(args[2])
    if starts is None or ends is None or len(starts) != len(ends):
        return None
    axes_in = args[3] if len(args) > 3 and args[3] is not None else np.arange(len(starts))
    steps = _ints(args[4]) if len(args) > 4 and args[4] is not None else [1] * len(starts)
    axes = _axes_of(axes_in, data.ndim) if np.asarray(axes_in).dtype.kind in "iu" else None
    if axes is None or steps is None or len(axes) != len(starts) or len(steps) != len(starts) or 0 in steps:
        return None
    index: list[slice] = [slice(None)] * data.ndim
    for axis, start, end, step in zip(axes, starts, ends, steps):
        dim = data.shape[axis]
        start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:  # from start down to just past end; -1 there means through index 0, which a Python slice says as None
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        index[axis] = slice(start, None if end < 0 else end, step)
    return data[tuple(index)].copy()


def _expand(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    shape = _ints(args[1]) if len(args) == 2 else None
    if args[0] is None or shape is None or attrs or any(d < 0 for d in shape):
        return None
    out_shape = _broadcast(args[0].shape, tuple(shape))
    return None if out_shape is None else np.broadcast_to(args[0], out_shape).copy()


def _reshape(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    shape = _ints(args[1]) if len(args) == 2 else None
    if args[0] is None or shape is None or set(attrs) - {"allowzero"}:
        return None
    allowzero = int(attrs["allowzero"].i) if "allowzero" in attrs else 0
    if allowzero and 0 in shape and -1 in shape:
        return None  # invalid in ONNX
    if not allowzero:
        if any(d == 0 and k >= args[0].ndim for k, d in enumerate(shape)):
            return None
        shape = [args[0].shape[k] if d == 0 else d for k, d in enumerate(shape)]
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        return None
    try:
        return args[0].reshape(shape).copy()
    except ValueError:
        return None


def _constant_of_shape(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    from onnx import numpy_helper

    shape = _ints(args[0]) if len(args) == 1 else None
    if shape is None or any(d < 0 for d in shape) or set(attrs) - {"value"}:
        return None
    value = numpy_helper.to_array(attrs["value"].t) if "value" in attrs else np.zeros(1, np.float32)
    if value.size != 1 or value.dtype.kind not in "iubf":
        return None
    return np.full(shape, value.reshape(-1)[0], dtype=value.dtype)


def _range(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    """Range of integers (floats accumulate as the runtime does: left to the evaluator)."""
    if len(args) != 3 or attrs or any(a is None or a.size != 1 or a.dtype.kind not in "iu" for a in args):
        return None
    if len({a.dtype for a in args}) != 1:
        return None
    start, limit, delta = (int(a.reshape(-1)[0]) for a in args)
    if delta == 0:
        return None
    count = max(-((start - limit) // delta), 0)  # ceil((limit - start) / delta), exactly
    return (start + np.arange(count, dtype=np.int64) * delta).astype(args[0].dtype)


def _trilu(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    if not 1 <= len(args) <= 2 or args[0] is None or args[0].ndim < 2 or set(attrs) - {"upper"}:
        return None
    k = 0
    if len(args) == 2 and args[1] is not None:
        if args[1].size != 1 or args[1].dtype.kind not in "iu":
            return None
        k = int(args[1].reshape(-1)[0])
    upper = int(attrs["upper"].i) if "upper" in attrs else 1
    return np.triu(args[0], k) if upper else np.tril(args[0], k)


def _argmax(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    if len(args) != 1 or args[0] is None or args[0].ndim == 0 or set(attrs) - {"axis", "keepdims", "select_last_index"}:
        return None
    x = args[0]
    if x.dtype.kind not in "iuf" or x.size == 0:
        return None
    axis = int(attrs["axis"].i) if "axis" in attrs else 0
    if not -x.ndim <= axis < x.ndim:
        return None
    keep = bool(attrs["keepdims"].i) if "keepdims" in attrs else True
    if "select_last_index" in attrs and attrs["select_last_index"].i:
        idx = x.shape[axis] - 1 - np.argmax(np.flip(x, axis), axis=axis, keepdims=keep)
    else:
        idx = np.argmax(x, axis=axis, keepdims=keep)
    return np.asarray(idx, np.int64)


_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Min": np.minimum,
           "Max": np.maximum, "Pow": np.power, "Equal": np.equal, "Less": np.less, "Greater": np.greater,
           "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal, "And": np.logical_and,
           "Or": np.logical_or, "Xor": np.logical_xor}
_COMPARE = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")


def _binary_kinds(op: str, dtype: np.dtype, fmod: int) -> bool:
    """Whether ``op`` folds on ``dtype`` here: logic on bools, Pow on floats, Mod on integers (and on floats with
    ``fmod=1``, the only form ONNX allows them), the rest on floats and integers (Equal on bools too)."""
    if op in ("And", "Or", "Xor"):
        return dtype.kind == "b"
    if op == "Pow":
        return _float(dtype)
    if op == "Mod":
        return dtype.kind in "iu" or (bool(fmod) and _float(dtype))
    return _float(dtype) or dtype.kind in "iu" or (dtype.kind == "b" and op == "Equal")


def _binary(op: str, args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    """Two tensors of one type, broadcast as numpy does (ONNX's multidirectional broadcasting): arithmetic,
    comparisons and logic; integers wrap as the runtimes' do, an integer Div truncates toward zero, and Mod takes the
    divisor's sign (``fmod=0``) or the dividend's (``fmod=1``)."""
    if len(args) != 2 or any(a is None for a in args) or args[0].dtype != args[1].dtype:
        return None
    a, b = args
    if set(attrs) - ({"fmod"} if op == "Mod" else set()):
        return None
    fmod = int(attrs["fmod"].i) if "fmod" in attrs else 0
    if not _binary_kinds(op, a.dtype, fmod):
        return None
    if _broadcast(a.shape, b.shape) is None:
        return None
    with np.errstate(all="ignore"):  # a float's inf and NaN, an integer's wrap: what the runtime computes
        if op in ("Div", "Mod") and a.dtype.kind in "iu":
            if (b == 0).any():
                return None
            if op == "Mod":
                return np.asarray(np.fmod(a, b) if fmod else np.mod(a, b), a.dtype)
            q = np.floor_divide(a, b)
            return np.where((q < 0) & (q * b != a), q + 1, q).astype(a.dtype)  # toward zero, exactly
        out = np.fmod(a, b) if op == "Mod" else _BINARY[op](a, b)
    return np.asarray(out) if op in _COMPARE or a.dtype.kind == "b" else np.asarray(out, a.dtype)


def _where(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    if len(args) != 3 or any(a is None for a in args) or attrs or args[0].dtype != np.bool_:
        return None
    if args[1].dtype != args[2].dtype or _broadcast(*(a.shape for a in args)) is None:
        return None
    return np.where(*args).astype(args[1].dtype)


_UNARY = {"Sqrt": np.sqrt, "Log": np.log, "Exp": np.exp, "Sin": np.sin, "Cos": np.cos, "Floor": np.floor,
          "Ceil": np.ceil, "Reciprocal": np.reciprocal, "Neg": np.negative, "Abs": np.abs, "Not": np.logical_not}


def _unary(op: str, args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    """One tensor: Not of bools, Neg and Abs of floats and integers, the rest of floats."""
    if len(args) != 1 or args[0] is None or attrs:
        return None
    x = args[0]
    kinds = "b" if op == "Not" else "iuf" if op in ("Neg", "Abs") else "f"
    if x.dtype.kind not in kinds or (x.dtype.kind == "f" and not _float(x.dtype)) or (op == "Neg" and x.dtype.kind == "u"):
        return None
    with np.errstate(all="ignore"):  # the log of 0, the square root of a negative: -inf, NaN, as the runtime gives
        return np.asarray(_UNARY[op](x), x.dtype)


def _squeeze(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    read = _data_and_axes(args, attrs, opset)
    if read is None:
        return None
    x, given = read
    if given is None:
        return x.reshape([d for d in x.shape if d != 1]).copy()
    axes = _axes_of(given, x.ndim) if given.size and given.dtype.kind in "iu" else None
    if axes is None or any(x.shape[a] != 1 for a in axes):
        return None
    return x.reshape([d for k, d in enumerate(x.shape) if k not in axes]).copy()


def _transpose(args: list[Any], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    if len(args) != 1 or args[0] is None or set(attrs) - {"perm"}:
        return None
    perm = list(attrs["perm"].ints) if "perm" in attrs else list(range(args[0].ndim))[::-1]
    if sorted(perm) != list(range(args[0].ndim)):
        return None
    return np.ascontiguousarray(np.transpose(args[0], perm))


_OPS = {"Unsqueeze": _unsqueeze, "Concat": _concat, "Gather": _gather, "Cast": _cast, "Slice": _slice,
        "Expand": _expand, "Reshape": _reshape, "ConstantOfShape": _constant_of_shape, "Range": _range,
        "Trilu": _trilu, "ArgMax": _argmax, "Where": _where, "Squeeze": _squeeze, "Transpose": _transpose}
_OPS.update({op: partial(_binary, op) for op in (*_BINARY, "Mod")})
_OPS.update({op: partial(_unary, op) for op in _UNARY})
_OPS.update({op: partial(_shape, op) for op in ("Shape", "Size")})


def numpy_fold(node: Any, args: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """The value of each of ``node``'s outputs, from its constant inputs ``args`` (None for an input left out),
    for Constant, Identity and the ops of ``_OPS``; None where the node is another op or a form of one
    not handled here (the caller asks onnx's reference evaluator)."""
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1 or not node.output[0]:
        return None
    op = node.op_type
    if op == "Constant":
        value = _constant(node)
    elif op == "Identity":
        value = args[0].copy() if len(args) == 1 and isinstance(args[0], np.ndarray) else None
    else:
        fold = _OPS.get(op)
        value = fold(args, {a.name: a for a in node.attribute}, opset) if fold is not None else None
    return None if value is None else [np.asarray(value)]


__all__ = ["numpy_fold"]
