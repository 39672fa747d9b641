"""ReduceMean and ReduceSum over any axes (ReduceMax and ReduceMin: constant inputs only, ops.FOLD_ONLY).

ggml reduces the innermost dim (ggml_mean / ggml_sum_rows), so the reduced
axes are moved last and flattened first.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import op
from ._common import GTensor, Value, attrs, cont, ggml_lib, norm_axis, permute, reshape


def _reduce(lowering: Any, node: Any, inputs: list[Value], fn: str) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    a = attrs(node)
    axes = a.get("axes")
    if axes is None and len(inputs) > 1 and inputs[1] is not None:
        if not isinstance(inputs[1], np.ndarray):
            raise ValueError(f"{node.op_type} with runtime axes")
        axes = [int(i) for i in inputs[1].reshape(-1)]
    keep = int(a.get("keepdims", 1))
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.rank))
    red = sorted(norm_axis(i, x.rank) for i in axes)
    rest = [i for i in range(x.rank) if i not in red]
    y = permute(lowering, x, rest + red) if rest + red != list(range(x.rank)) else x
    outer = math.prod(x.shape[i] for i in rest)
    inner = math.prod(x.shape[i] for i in red)
    y = reshape(lowering, cont(lowering, y), (outer, inner))
    r = GTensor(_mean(lowering, y.ptr) if fn == "ggml_mean" else getattr(ggml_lib(), fn)(lowering.ctx, y.ptr),
                (outer, 1))
    if keep:
        shape = tuple(1 if i in red else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(x.shape[i] for i in rest)
    return [reshape(lowering, r, shape)]


@op("ReduceMean")
def op_reduce_mean(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return _reduce(lowering, node, inputs, "ggml_mean")


@op("ReduceSum")
def op_reduce_sum(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return _reduce(lowering, node, inputs, "ggml_sum_rows")


@op("GlobalAveragePool")
def op_global_average_pool(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    n, c = x.shape[0], x.shape[1]
    y = reshape(lowering, x, (n * c, math.prod(x.shape[2:])))
    r = GTensor(_mean(lowering, y.ptr), (n * c, 1))
    return [reshape(lowering, r, (n, c) + (1,) * (x.rank - 2))]


def _mean(lowering: Any, rows: Any) -> Any:
    """The mean of each row (ne0 floats): sdrt-ggml's multithreaded, vectorised op on the CPU when the
    native kernels loaded, else ggml_mean."""
    if lowering.on_cpu:
        from ..native_ops import native_ops, rowmean

        ops = native_ops()
        if ops is not None:
            return rowmean(ops, ggml_lib(), lowering.ctx, rows)
    return ggml_lib().ggml_mean(lowering.ctx, rows)
