"""Gather (embedding lookups, index picks) and ArgMax/ArgMin."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import op
from ._common import Value, attrs, mb, mil_array, norm_axis, np_dtype, rank, shape, var


@op("Gather")
def op_gather(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    data, idx = inputs
    axis = norm_axis(int(attrs(node).get("axis", 0)), len(data.shape))
    if isinstance(idx, np.ndarray):
        idx = mil_array(np.where(idx < 0, idx + data.shape[axis], idx))
        if idx.ndim == 0:  # a scalar pick drops the axis: slice it, then reshape
            x = var(lw, data)
            s = shape(x)
            begin = [0] * len(s)
            end = list(s)
            begin[axis], end[axis] = int(idx), int(idx) + 1
            y = mb().slice_by_index(x=x, begin=begin, end=end)
            return [mb().reshape(x=y, shape=[d for i, d in enumerate(s) if i != axis])]
    iv = var(lw, idx)
    if np_dtype(iv) != np.int32:
        iv = mb().cast(x=iv, dtype="int32")
    return [mb().gather(x=var(lw, data), indices=iv, axis=axis)]


@op("GatherND")
def op_gather_nd(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """torch's dynamo export picks CLIP's pooled token with it."""
    data, idx = inputs
    batch_dims = int(attrs(node).get("batch_dims", 0))
    iv = var(lw, mil_array(idx) if isinstance(idx, np.ndarray) else idx)
    if np_dtype(iv) != np.int32:
        iv = mb().cast(x=iv, dtype="int32")
    kw = {"batch_dims": batch_dims} if batch_dims else {}
    if batch_dims and lw.opset_mil < 16:
        raise ValueError("GatherND with batch_dims needs a macOS13/iOS16 target or newer")
    return [mb().gather_nd(x=var(lw, data), indices=iv, **kw)]


@op("ArgMax", "ArgMin")
def op_argmax(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    if a.get("select_last_index", 0):
        raise ValueError("ArgMax/ArgMin with select_last_index")
    axis = norm_axis(int(a.get("axis", 0)), rank(x))
    fn = mb().reduce_argmax if node.op_type == "ArgMax" else mb().reduce_argmin
    return [fn(x=x, axis=axis, keep_dims=bool(a.get("keepdims", 1)))]
