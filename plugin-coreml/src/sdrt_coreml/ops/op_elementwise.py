"""Binary elementwise ops (numpy broadcasting in both ONNX and MIL) and Where."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import op
from ._common import Value, mb, np_dtype, pair, var

_ARITH = {"Add": "add", "Sub": "sub", "Mul": "mul", "Pow": "pow", "Max": "maximum", "Min": "minimum"}
_COMPARE = {"Equal": "equal", "Greater": "greater", "Less": "less", "GreaterOrEqual": "greater_equal",
            "LessOrEqual": "less_equal"}
_LOGIC = {"And": "logical_and", "Or": "logical_or"}


def _binary(lw: Any, name: str, a: Value, b: Value) -> Any:
    x, y = pair(lw, a, b)
    return getattr(mb(), name)(x=x, y=y)


@op(*_ARITH)
def op_arith(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    out = inputs[0]
    for other in inputs[1:]:  # Max and Min are variadic
        out = _binary(lw, _ARITH[node.op_type], out, other)
    return [out]


@op("Div")
def op_div(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    a, b = inputs
    kind = np_dtype(b if isinstance(a, np.ndarray) else a).kind
    if kind == "f" and isinstance(b, np.ndarray) and b.size == 1:  # x / c -> x * (1/c): what Core ML runs best
        return [_binary(lw, "mul", a, np.asarray(1.0 / b.astype(np.float64), dtype=b.dtype).reshape(b.shape))]
    return [_binary(lw, "real_div" if kind == "f" else "floor_div", a, b)]


@op(*_COMPARE)
def op_compare(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [_binary(lw, _COMPARE[node.op_type], inputs[0], inputs[1])]


@op(*_LOGIC)
def op_logic(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [_binary(lw, _LOGIC[node.op_type], inputs[0], inputs[1])]


@op("Not")
def op_not(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [mb().logical_not(x=var(lw, inputs[0]))]


@op("Where")
def op_where(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    cond, a, b = inputs
    a, b = pair(lw, a, b)
    return [mb().select(cond=var(lw, cond), a=a, b=b)]
