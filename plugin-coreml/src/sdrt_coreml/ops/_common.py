"""Shared helpers of the op lowerings: attributes, constants, dtypes, axes."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdrt.errors import UnsupportedGraph
from sdrt.lowering import norm_axis  # noqa: F401  (the ops import it from here)

Value = Any  # a MIL Var, a numpy constant, or None


def mb() -> Any:
    """coremltools' MIL builder (imported on first use: coremltools is heavy)."""
    from coremltools.converters.mil import Builder

    return Builder


def attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def is_const(v: Value) -> bool:
    return isinstance(v, np.ndarray)


def np_dtype(v: Value) -> np.dtype:
    """The numpy dtype of a constant or of a Var (MIL's builtin type mapped back)."""
    if isinstance(v, np.ndarray):
        return v.dtype
    from coremltools.converters.mil.mil import types

    return np.dtype(types.nptype_from_builtin(v.dtype))


def shape(v: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in v.shape)


def rank(v: Value) -> int:
    return len(v.shape)


def mil_array(arr: np.ndarray) -> np.ndarray:
    """A constant in a dtype MIL holds: int64 -> int32, float64 -> float32."""
    arr = np.asarray(arr)
    if arr.dtype == np.int64 or arr.dtype == np.uint64:
        return arr.astype(np.int32)
    if arr.dtype == np.float64:
        return arr.astype(np.float32)
    return arr


def var(lw: Any, v: Value, like: Value = None, source: np.ndarray | None = None) -> Any:
    """``v`` as a MIL Var; a constant is cast to the dtype of ``like`` when one is given.

    ``source`` names the initializer a reshaped constant came from, so it keeps its name.
    """
    if isinstance(v, np.ndarray):
        src = source if source is not None else v
        if like is not None and v.dtype != np_dtype(like):
            v = v.astype(np_dtype(like))
        return lw.const(v, source=src)
    return v


def pair(lw: Any, a: Value, b: Value) -> tuple[Any, Any]:
    """Both operands as Vars of one dtype (a constant takes the dtype of the runtime side)."""
    if isinstance(a, np.ndarray):
        return var(lw, a, like=b), b
    if isinstance(b, np.ndarray):
        return a, var(lw, b, like=a)
    return a, b


def scalar_or_var(lw: Any, v: Value, like: Value) -> Any:
    """A size-1 constant as a plain scalar of ``like``'s dtype (MIL folds it into the op), else a Var."""
    if isinstance(v, np.ndarray) and v.size == 1 and v.ndim == 0:
        return np_dtype(like).type(v.reshape(()))
    return var(lw, v, like=like)


def ints(v: Value, what: str) -> list[int]:
    """A constant integer list (shapes, axes, pads); runtime values are refused."""
    if not isinstance(v, np.ndarray):
        raise ValueError(f"{what} must be a constant (the coreml backend needs static shapes)")
    return [int(x) for x in v.reshape(-1)]


def unsupported(node: Any, why: str) -> UnsupportedGraph:
    return UnsupportedGraph(
        f"the coreml backend cannot lower node {node.name or node.op_type!r} ({why})",
        unsupported={node.op_type: [node.name or node.op_type]},
        where=f"node {node.name or node.op_type!r}",
        fix="run this graph on another backend (openvino, ggml, reference), or re-export it without this op",
    )
