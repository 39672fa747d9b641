"""Binary elementwise ops with numpy broadcasting: Add, Sub, Mul, Div, Pow, Where."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import op
from ._common import GTensor, HostValue, Value, binary, cont, expand_to, ggml_lib, reshape, scalar_of, to_tensor


def _scale_bias(lowering: Any, x: GTensor, s: float, b: float) -> GTensor:
    x = cont(lowering, x)
    g = ggml_lib()
    if b == 0.0:
        return GTensor(g.ggml_scale(lowering.ctx, x.ptr, s), x.shape)
    return GTensor(g.ggml_scale_bias(lowering.ctx, x.ptr, s, b), x.shape)


def _runtime_float(node: Any, *vals: Value) -> None:
    for v in vals:
        if isinstance(v, GTensor) and v.dtype != "float32":
            raise ValueError(f"{node.op_type if node is not None else 'Where'} on an integer runtime tensor")


def _with_scalar(lowering: Any, a: Value, b: Value, kind: str) -> GTensor | None:
    """Fast paths where one side is a constant scalar and the other a runtime tensor."""
    sa, sb = scalar_of(a), scalar_of(b)
    if isinstance(a, GTensor) and sb is not None and np.broadcast_shapes(a.shape, np.shape(b)) == a.shape:
        if kind == "add":
            return _scale_bias(lowering, a, 1.0, sb)
        if kind == "sub":
            return _scale_bias(lowering, a, 1.0, -sb)
        if kind == "mul":
            return _scale_bias(lowering, a, sb, 0.0)
        if kind == "div":
            return _scale_bias(lowering, a, 1.0 / sb, 0.0)
    if isinstance(b, GTensor) and sa is not None and np.broadcast_shapes(b.shape, np.shape(a)) == b.shape:
        if kind == "add":
            return _scale_bias(lowering, b, 1.0, sa)
        if kind == "sub":
            return _scale_bias(lowering, b, -1.0, sa)
        if kind == "mul":
            return _scale_bias(lowering, b, sa, 0.0)
    return None


def _per_channel(v: Value, c: int) -> bool:
    shape = tuple(np.shape(v)) if isinstance(v, np.ndarray) else v.shape
    return shape in ((1, c, 1, 1), (c, 1, 1))


def _channels_last_twin(lowering: Any, fn: str, a: Value, b: Value, commutative: bool, out: GTensor) -> Any:
    """The op applied to channels-last twins: both operands have one, or one has and the other
    is per channel (a row broadcast in that layout). None when neither applies."""
    g = ggml_lib()
    if isinstance(b, GTensor) and b.cl is not None and not (isinstance(a, GTensor) and a.cl is not None) and commutative:
        a, b = b, a
    if not isinstance(a, GTensor) or a.cl is None or a.shape != out.shape or a.rank != 4:
        return None
    if isinstance(b, GTensor) and b.cl is not None and b.shape == a.shape:
        return getattr(g, fn)(lowering.ctx, a.cl, b.cl)
    c = a.shape[1]
    if _per_channel(b, c):
        row = reshape(lowering, to_tensor(lowering, b), (c,))
        return getattr(g, fn)(lowering.ctx, a.cl, row.ptr)
    return None


def _binary_op(kind: str, fn: str, commutative: bool) -> Any:
    def lower(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
        a, b = inputs[0], inputs[1]
        _runtime_float(node, a, b)
        fast = _with_scalar(lowering, a, b, kind)
        if fast is not None:
            return [fast]
        out = binary(lowering, fn, a, b, commutative)
        out.cl = _channels_last_twin(lowering, fn, a, b, commutative, out)
        return [out]

    lower.__name__ = f"op_{kind}"
    return lower


op("Add")(_binary_op("add", "ggml_add", True))
op("Sub")(_binary_op("sub", "ggml_sub", False))
op("Mul")(_binary_op("mul", "ggml_mul", True))
op("Div")(_binary_op("div", "ggml_div", False))


@op("Pow")
def op_pow(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x, e = inputs
    ev = scalar_of(e)
    if not isinstance(x, GTensor) or ev is None:
        raise ValueError("Pow needs a runtime base and a constant scalar exponent")
    x = cont(lowering, x)
    g = ggml_lib()
    if ev == 2.0:
        return [GTensor(g.ggml_sqr(lowering.ctx, x.ptr), x.shape)]
    if ev == 0.5:
        return [GTensor(g.ggml_sqrt(lowering.ctx, x.ptr), x.shape)]
    if ev == 1.0:
        return [x]
    if ev == 3.0:
        return [GTensor(g.ggml_mul(lowering.ctx, g.ggml_sqr(lowering.ctx, x.ptr), x.ptr), x.shape)]
    if ev == -1.0:
        one = lowering.const(np.ones((1,), np.float32), tag="one")
        return [binary(lowering, "ggml_div", one, x, False)]
    raise ValueError(f"Pow with exponent {ev} (supported: 0.5, 1, 2, 3, -1)")


def _where_host(lowering: Any, c: HostValue, x: Value, y: Value) -> GTensor:
    """Where with a condition computed on the host from integer/bool graph inputs (Chroma's attention mask):
    x*c + y*(1-c) on a float copy of it. Infinite fills are refused (inf * 0 is NaN)."""
    for v in (x, y):
        if isinstance(v, np.ndarray) and not np.all(np.isfinite(v)):
            raise ValueError("Where with a runtime condition and an infinite fill")
    x, y = (lowering._materialize(v) if isinstance(v, HostValue) else v for v in (x, y))
    _runtime_float(None, x, y)
    m = lowering._materialize(lowering.host_map(c, lambda a: a.astype(np.float32), "f32"))
    inv = lowering._materialize(lowering.host_map(c, lambda a: 1.0 - a.astype(np.float32), "f32_not"))
    terms = [binary(lowering, "ggml_mul", v, mask, True) for v, mask in ((x, m), (y, inv))]
    return binary(lowering, "ggml_add", terms[0], terms[1], True)


@op("Where")
def op_where(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """Where with a constant condition: select = x*c + y*(1-c), or a masked fill for infinities; with a
    condition computed on the host, the same select on a float copy of it."""
    c, x, y = inputs
    if isinstance(c, HostValue):
        return [_where_host(lowering, c, x, y)]
    x, y = (lowering._materialize(v) if isinstance(v, HostValue) else v for v in (x, y))
    if not isinstance(c, np.ndarray):
        raise ValueError("Where with a runtime condition")
    cond = c.astype(bool)
    if isinstance(y, np.ndarray) and y.size == 1 and isinstance(x, GTensor) and np.all(cond):
        return [expand_to(lowering, x, np.broadcast_shapes(x.shape, cond.shape, y.shape))]
    if isinstance(x, np.ndarray) and x.size == 1 and isinstance(y, GTensor) and not np.any(cond):
        return [expand_to(lowering, y, np.broadcast_shapes(y.shape, cond.shape, x.shape))]
    # general constant condition: x*mask + y*(1-mask), with non-finite fills added as constants
    mask = cond.astype(np.float32)
    terms: list[GTensor] = []
    for v, m in ((x, mask), (y, 1.0 - mask)):
        if isinstance(v, np.ndarray):
            arr = np.where(m.astype(bool), v, 0).astype(np.float32)
            terms.append(to_tensor(lowering, arr))
        else:
            terms.append(binary(lowering, "ggml_mul", v, m, True))
    return [binary(lowering, "ggml_add", terms[0], terms[1], True)]


@op("Sum")
def op_sum(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    vals = [v for v in inputs if v is not None]
    y = vals[0] if isinstance(vals[0], GTensor) else to_tensor(lowering, vals[0])
    for v in vals[1:]:
        y = binary(lowering, "ggml_add", y, v, True)
    return [y]
