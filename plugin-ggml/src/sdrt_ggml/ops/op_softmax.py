"""Softmax and LogSoftmax over one axis (ggml works on the innermost one)."""

from __future__ import annotations

import math
from typing import Any

from . import op
from ._common import T, Value, attrs, cont, gg, norm_axis, permute, reshape


def _on_last_axis(lw: Any, x: T, axis: int, fn: Any) -> T:
    axis = norm_axis(axis, x.rank)
    if axis == x.rank - 1:
        x = cont(lw, x)
        return T(fn(x), x.shape)
    perm = list(range(x.rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    xt = cont(lw, permute(lw, x, perm))
    y = T(fn(xt), xt.shape)
    return permute(lw, y, perm)


def _softmax(lw: Any, node: Any, x: T, fn: Any) -> T:
    if lw.opsets.get("", 17) >= 13:
        return _on_last_axis(lw, x, int(attrs(node).get("axis", -1)), fn)
    # before opset 13: the input is flattened to 2-D at ``axis`` (default 1), softmax over the second dim
    axis = norm_axis(int(attrs(node).get("axis", 1)), x.rank)
    flat = reshape(lw, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return reshape(lw, _on_last_axis(lw, flat, -1, fn), x.shape)


@op("Softmax")
def op_softmax(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, T)
    g = gg()
    return [_softmax(lw, node, x, lambda t: g.ggml_soft_max(lw.ctx, t.ptr))]


@op("LogSoftmax")
def op_log_softmax(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, T)
    g = gg()
    return [_softmax(lw, node, x, lambda t: g.ggml_log(lw.ctx, g.ggml_soft_max(lw.ctx, t.ptr)))]
