"""Softmax and LogSoftmax over one axis (ggml works on the innermost one)."""

from __future__ import annotations

import math
from typing import Any

from . import op
from ._common import GTensor, Value, attrs, cont, ggml_lib, norm_axis, permute, reshape


def _on_last_axis(lowering: Any, x: GTensor, axis: int, fn: Any) -> GTensor:
    axis = norm_axis(axis, x.rank)
    if axis == x.rank - 1:
        x = cont(lowering, x)
        return GTensor(fn(x), x.shape)
    perm = list(range(x.rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    xt = cont(lowering, permute(lowering, x, perm))
    y = GTensor(fn(xt), xt.shape)
    return permute(lowering, y, perm)


def _softmax(lowering: Any, node: Any, x: GTensor, fn: Any) -> GTensor:
    if lowering.opsets.get("", 17) >= 13:
        return _on_last_axis(lowering, x, int(attrs(node).get("axis", -1)), fn)
    # before opset 13: the input is flattened to 2-D at ``axis`` (default 1), softmax over the second dim
    axis = norm_axis(int(attrs(node).get("axis", 1)), x.rank)
    flat = reshape(lowering, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return reshape(lowering, _on_last_axis(lowering, flat, -1, fn), x.shape)


@op("Softmax")
def op_softmax(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    g = ggml_lib()
    return [_softmax(lowering, node, x, lambda t: g.ggml_soft_max(lowering.ctx, t.ptr))]


@op("LogSoftmax")
def op_log_softmax(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    g = ggml_lib()
    return [_softmax(lowering, node, x, lambda t: g.ggml_log(lowering.ctx, g.ggml_soft_max(lowering.ctx, t.ptr)))]
