"""The values of the nodes that constant folding meets most, computed with numpy alone, as ONNX defines them.

Constants, shapes and shape arithmetic are nearly all of what a torch export folds (the full-size SD 1.5 text
encoder's ggml lowering folded 884 nodes, 805 of them Constant, Identity, Shape, Gather, Unsqueeze, Concat or Cast).
onnx's reference evaluator computes any node, but importing it takes 12 MiB and 0.3 s of a process, and building
one per node cost the SD 1.5 graphs 0.15-0.2 s of pinning: ``numpy_fold`` answers these first, and returns None
for the rest (another op, an attribute form or dtype not handled here), which the caller leaves to the evaluator.
``Graph.fold_constants`` (``fold``) and the plugins' lowering (``sdrt.lowering.fold_node``) both use it.
"""

from __future__ import annotations

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


def _shape(node: Any, args: list[np.ndarray | None], attrs: dict[str, Any]) -> np.ndarray | None:
    """Shape (``start`` and ``end`` as opset 15 has them: negative from the end, clamped to the rank, as a
    Python slice reads them) and Size."""
    if len(args) != 1 or args[0] is None:
        return None
    if node.op_type == "Size":
        return None if attrs else np.array(args[0].size, np.int64)
    if set(attrs) - {"start", "end"}:
        return None
    start = int(attrs["start"].i) if "start" in attrs else 0
    end = int(attrs["end"].i) if "end" in attrs else None
    return np.array(args[0].shape[start:end], np.int64)


def _arith(node: Any, args: list[np.ndarray | None], attrs: dict[str, Any], opset: int) -> np.ndarray | None:
    op = node.op_type
    if op == "Unsqueeze" and args:
        if opset >= 13:
            if len(args) != 2 or args[1] is None or "axes" in attrs:
                return None
            axes = [int(a) for a in np.asarray(args[1]).reshape(-1)]
        else:
            if len(args) != 1 or "axes" not in attrs:
                return None
            axes = list(attrs["axes"].ints)
        if args[0] is None:
            return None
        rank = args[0].ndim + len(axes)
        norm = sorted(a + rank if a < 0 else a for a in axes)
        if len(set(norm)) != len(norm) or any(not 0 <= a < rank for a in norm):
            return None
        out = args[0]
        for a in norm:
            out = np.expand_dims(out, a)
        return out
    if op == "Concat" and args and all(a is not None for a in args) and "axis" in attrs:
        if len({a.dtype for a in args}) != 1 or len({a.ndim for a in args}) != 1 or args[0].ndim == 0:
            return None
        axis = int(attrs["axis"].i)
        if not -args[0].ndim <= axis < args[0].ndim:
            return None
        return np.concatenate(args, axis=axis)
    if op == "Gather" and len(args) == 2 and all(a is not None for a in args) and set(attrs) <= {"axis"}:
        data, idx = args
        axis = int(attrs["axis"].i) if "axis" in attrs else 0
        if data.ndim == 0 or idx.dtype.kind not in "iu" or not -data.ndim <= axis < data.ndim:
            return None
        size = data.shape[axis]
        if idx.size and (int(idx.min()) < -size or int(idx.max()) >= size):
            return None
        return np.take(data, idx, axis=axis)
    if op == "Cast" and len(args) == 1 and args[0] is not None and set(attrs) == {"to"}:
        try:
            to = onnxfile.np_dtype(int(attrs["to"].i))
        except (ModelError, ValueError, TypeError):
            return None
        # integer and bool values into integer, bool or float types: exact where the value fits, as ONNX casts
        if args[0].dtype.kind not in "iub" or to.kind not in "iubf":
            return None
        if to.kind in "iu" and args[0].size and args[0].dtype.kind != "b":
            info = np.iinfo(to)
            if int(args[0].min()) < info.min or int(args[0].max()) > info.max:
                return None
        with np.errstate(all="ignore"):  # an integer cast to float16 past its range: inf, as the runtime gives
            return args[0].astype(to)
    return None


def numpy_fold(node: Any, args: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """The value of each of ``node``'s outputs, from its constant inputs ``args`` (None for an input left out),
    for Constant, Identity, Shape, Size, Unsqueeze, Concat, Gather and Cast of integers; None where the node is
    another op or a form of one not handled here (the caller asks onnx's reference evaluator)."""
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1 or not node.output[0]:
        return None
    op = node.op_type
    if op == "Constant":
        value = _constant(node)
    elif op == "Identity":
        value = args[0].copy() if len(args) == 1 and isinstance(args[0], np.ndarray) else None
    else:
        attrs = {a.name: a for a in node.attribute}
        value = _shape(node, args, attrs) if op in ("Shape", "Size") else _arith(node, args, attrs, opset)
    return None if value is None else [np.asarray(value)]


__all__ = ["numpy_fold"]
