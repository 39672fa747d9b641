"""Softmax and LogSoftmax over one axis (ggml works on the innermost one)."""

from __future__ import annotations

from typing import Any

from . import op
from ._common import T, Value, attrs, cont, gg, norm_axis, permute


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


@op("Softmax")
def op_softmax(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, T)
    axis = int(attrs(node).get("axis", -1))
    g = gg()
    return [_on_last_axis(lw, x, axis, lambda t: g.ggml_soft_max(lw.ctx, t.ptr))]


@op("LogSoftmax")
def op_log_softmax(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, T)
    axis = int(attrs(node).get("axis", -1))
    g = gg()
    return [_on_last_axis(lw, x, axis, lambda t: g.ggml_log(lw.ctx, g.ggml_soft_max(lw.ctx, t.ptr)))]
