"""Binary elementwise ops with numpy broadcasting: Add, Sub, Mul, Div, Pow, Where."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import op
from ._common import T, Value, binary, cont, expand_to, gg, reshape, scalar_of, to_tensor


def _scale_bias(lw: Any, x: T, s: float, b: float) -> T:
    x = cont(lw, x)
    g = gg()
    if b == 0.0:
        return T(g.ggml_scale(lw.ctx, x.ptr, s), x.shape)
    return T(g.ggml_scale_bias(lw.ctx, x.ptr, s, b), x.shape)


def _runtime_float(node: Any, *vals: Value) -> None:
    for v in vals:
        if isinstance(v, T) and v.dtype != "float32":
            raise ValueError(f"{node.op_type} on an integer runtime tensor")


def _with_scalar(lw: Any, a: Value, b: Value, kind: str) -> T | None:
    """Fast paths where one side is a constant scalar and the other a runtime tensor."""
    sa, sb = scalar_of(a), scalar_of(b)
    if isinstance(a, T) and sb is not None and np.broadcast_shapes(a.shape, np.shape(b)) == a.shape:
        if kind == "add":
            return _scale_bias(lw, a, 1.0, sb)
        if kind == "sub":
            return _scale_bias(lw, a, 1.0, -sb)
        if kind == "mul":
            return _scale_bias(lw, a, sb, 0.0)
        if kind == "div":
            return _scale_bias(lw, a, 1.0 / sb, 0.0)
    if isinstance(b, T) and sa is not None and np.broadcast_shapes(b.shape, np.shape(a)) == b.shape:
        if kind == "add":
            return _scale_bias(lw, b, 1.0, sa)
        if kind == "sub":
            return _scale_bias(lw, b, -1.0, sa)
        if kind == "mul":
            return _scale_bias(lw, b, sa, 0.0)
    return None


def _per_channel(v: Value, c: int) -> bool:
    shape = tuple(np.shape(v)) if isinstance(v, np.ndarray) else v.shape
    return shape in ((1, c, 1, 1), (c, 1, 1))


def _channels_last_twin(lw: Any, fn: str, a: Value, b: Value, commutative: bool, out: T) -> Any:
    """The op applied to channels-last twins: both operands have one, or one has and the other
    is per channel (a row broadcast in that layout). None when neither applies."""
    g = gg()
    if isinstance(b, T) and b.cl is not None and not (isinstance(a, T) and a.cl is not None) and commutative:
        a, b = b, a
    if not isinstance(a, T) or a.cl is None or a.shape != out.shape or a.rank != 4:
        return None
    if isinstance(b, T) and b.cl is not None and b.shape == a.shape:
        return getattr(g, fn)(lw.ctx, a.cl, b.cl)
    c = a.shape[1]
    if _per_channel(b, c):
        row = reshape(lw, to_tensor(lw, b), (c,))
        return getattr(g, fn)(lw.ctx, a.cl, row.ptr)
    return None


def _binary_op(kind: str, fn: str, commutative: bool) -> Any:
    def lower(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
        a, b = inputs[0], inputs[1]
        _runtime_float(node, a, b)
        fast = _with_scalar(lw, a, b, kind)
        if fast is not None:
            return [fast]
        out = binary(lw, fn, a, b, commutative)
        out.cl = _channels_last_twin(lw, fn, a, b, commutative, out)
        return [out]

    lower.__name__ = f"op_{kind}"
    return lower


op("Add")(_binary_op("add", "ggml_add", True))
op("Sub")(_binary_op("sub", "ggml_sub", False))
op("Mul")(_binary_op("mul", "ggml_mul", True))
op("Div")(_binary_op("div", "ggml_div", False))


@op("Pow")
def op_pow(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x, e = inputs
    ev = scalar_of(e)
    if not isinstance(x, T) or ev is None:
        raise ValueError("Pow needs a runtime base and a constant scalar exponent")
    x = cont(lw, x)
    g = gg()
    if ev == 2.0:
        return [T(g.ggml_sqr(lw.ctx, x.ptr), x.shape)]
    if ev == 0.5:
        return [T(g.ggml_sqrt(lw.ctx, x.ptr), x.shape)]
    if ev == 1.0:
        return [x]
    if ev == 3.0:
        return [T(g.ggml_mul(lw.ctx, g.ggml_sqr(lw.ctx, x.ptr), x.ptr), x.shape)]
    if ev == -1.0:
        one = lw.const(np.ones((1,), np.float32), tag="one")
        return [binary(lw, "ggml_div", one, x, False)]
    raise ValueError(f"Pow with exponent {ev} (supported: 0.5, 1, 2, 3, -1)")


@op("Where")
def op_where(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """Where with a constant condition: select = x*c + y*(1-c), or a masked fill for infinities."""
    c, x, y = inputs
    if not isinstance(c, np.ndarray):
        raise ValueError("Where with a runtime condition")
    cond = c.astype(bool)
    if isinstance(y, np.ndarray) and y.size == 1 and isinstance(x, T) and np.all(cond):
        return [expand_to(lw, x, np.broadcast_shapes(x.shape, cond.shape, y.shape))]
    if isinstance(x, np.ndarray) and x.size == 1 and isinstance(y, T) and not np.any(cond):
        return [expand_to(lw, y, np.broadcast_shapes(y.shape, cond.shape, x.shape))]
    # general constant condition: x*mask + y*(1-mask), with non-finite fills added as constants
    mask = cond.astype(np.float32)
    terms: list[T] = []
    for v, m in ((x, mask), (y, 1.0 - mask)):
        if isinstance(v, np.ndarray):
            arr = np.where(m.astype(bool), v, 0).astype(np.float32)
            terms.append(to_tensor(lw, arr))
        else:
            terms.append(binary(lw, "ggml_mul", v, m, True))
    return [binary(lw, "ggml_add", terms[0], terms[1], True)]


@op("Sum")
def op_sum(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    vals = [v for v in inputs if v is not None]
    y = vals[0] if isinstance(vals[0], T) else to_tensor(lw, vals[0])
    for v in vals[1:]:
        y = binary(lw, "ggml_add", y, v, True)
    return [y]
