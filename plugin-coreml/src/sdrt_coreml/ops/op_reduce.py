"""Reductions over axes, and the global pools (a mean or max over the spatial axes)."""

from __future__ import annotations

from typing import Any

from . import op
from ._common import Value, attrs, ints, mb, norm_axis, rank, var

_REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max",
           "ReduceMin": "reduce_min", "ReduceSumSquare": "reduce_sum_square", "ReduceL2": "reduce_l2_norm",
           "ReduceL1": "reduce_l1_norm", "ReduceLogSumExp": "reduce_log_sum_exp"}


@op(*_REDUCE)
def op_reduce(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    r = rank(x)
    if len(inputs) > 1 and inputs[1] is not None:
        axes = ints(inputs[1], f"{node.op_type}'s axes")
    else:
        axes = [int(v) for v in a.get("axes", [])]
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(r))
    axes = sorted(norm_axis(v, r) for v in axes)
    return [getattr(mb(), _REDUCE[node.op_type])(x=x, axes=axes, keep_dims=bool(a.get("keepdims", 1)))]


@op("GlobalAveragePool", "GlobalMaxPool")
def op_global_pool(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    fn = mb().reduce_mean if node.op_type == "GlobalAveragePool" else mb().reduce_max
    return [fn(x=x, axes=list(range(2, rank(x))), keep_dims=True)]
