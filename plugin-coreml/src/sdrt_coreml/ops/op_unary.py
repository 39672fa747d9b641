"""Unary ops and activations, Cast, Identity, Softmax."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdrt.lowering import check_gelu

from . import check, op
from ._common import Value, attrs, mb, norm_axis, np_dtype, rank, var

_SIMPLE = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Sqrt": "sqrt", "Erf": "erf",
           "Sin": "sin", "Cos": "cos", "Abs": "abs", "Floor": "floor", "Ceil": "ceil", "Round": "round",
           "Sign": "sign", "Softsign": "softsign", "Softplus": "softplus", "Atan": "atan", "Asin": "asin",
           "Acos": "acos", "Sinh": "sinh", "Cosh": "cosh", "Tan": "tan"}
_MIL_DTYPES = {"float32": "fp32", "float16": "fp16", "float64": "fp32", "int32": "int32", "int64": "int32",
               "int16": "int32", "int8": "int32", "uint8": "int32", "uint16": "int32", "uint32": "int32",
               "bool": "bool"}


def _scalar(x: Any, value: float) -> Any:
    return np_dtype(x).type(value)


@op(*_SIMPLE)
def op_simple(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [getattr(mb(), _SIMPLE[node.op_type])(x=var(lw, inputs[0]))]


@op("Log")
def op_log(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [mb().log(x=var(lw, inputs[0]), epsilon=0.0)]


@op("Neg")
def op_neg(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    return [mb().mul(x=x, y=_scalar(x, -1))]


@op("Reciprocal")
def op_reciprocal(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])  # not MIL's inverse: it adds an epsilon of 1e-4
    return [mb().real_div(x=_scalar(x, 1.0), y=x)]


@op("IsNaN")
def op_isnan(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """x != x (MIL has no isnan); torch's dynamo export guards masked softmax rows with it."""
    x = var(lw, inputs[0])
    return [mb().not_equal(x=x, y=x)]


@check("IsInf")
def check_isinf(node: Any) -> str | None:
    a = attrs(node)
    return None if a.get("detect_negative", 1) and a.get("detect_positive", 1) else "IsInf of one sign"


@op("IsInf")
def op_isinf(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    return [mb().equal(x=mb().abs(x=x), y=_scalar(x, np.inf))]


@op("LeakyRelu")
def op_leaky_relu(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [mb().leaky_relu(x=var(lw, inputs[0]), alpha=float(attrs(node).get("alpha", 0.01)))]


@op("Elu")
def op_elu(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [mb().elu(x=var(lw, inputs[0]), alpha=float(attrs(node).get("alpha", 1.0)))]


@op("HardSigmoid")
def op_hard_sigmoid(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    a = attrs(node)
    return [mb().sigmoid_hard(x=var(lw, inputs[0]), alpha=float(a.get("alpha", 0.2)), beta=float(a.get("beta", 0.5)))]


@op("HardSwish")
def op_hard_swish(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    return [mb().mul(x=x, y=mb().sigmoid_hard(x=x, alpha=1.0 / 6, beta=0.5))]


check("Gelu")(check_gelu)


@op("Gelu")
def op_gelu(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    mode = "TANH_APPROXIMATION" if attrs(node).get("approximate", "none") == "tanh" else "EXACT"
    return [mb().gelu(x=var(lw, inputs[0]), mode=mode)]


@op("Clip")
def op_clip(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    lo = inputs[1] if len(inputs) > 1 and inputs[1] is not None else a.get("min")
    hi = inputs[2] if len(inputs) > 2 and inputs[2] is not None else a.get("max")
    for bound in (lo, hi):
        if bound is not None and not isinstance(bound, (float, int, np.ndarray)):
            raise ValueError("Clip with runtime bounds")
    lo = None if lo is None else float(np.asarray(lo).reshape(()))
    hi = None if hi is None else float(np.asarray(hi).reshape(()))
    if lo is not None and hi is not None:
        return [mb().clip(x=x, alpha=_scalar(x, lo), beta=_scalar(x, hi))]
    if lo is not None:
        return [mb().maximum(x=x, y=_scalar(x, lo))]
    if hi is not None:
        return [mb().minimum(x=x, y=_scalar(x, hi))]
    return [x]


@check("Cast", "CastLike")
def check_cast(node: Any) -> str | None:
    if node.op_type == "CastLike":
        return None
    from onnx import helper

    to = helper.tensor_dtype_to_np_dtype(int(attrs(node)["to"])).name
    return None if to in _MIL_DTYPES else f"to {to}"


@op("Cast", "CastLike")
def op_cast(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    from onnx import helper

    x = var(lw, inputs[0])
    to = (np_dtype(inputs[1]).name if node.op_type == "CastLike"
          else helper.tensor_dtype_to_np_dtype(int(attrs(node)["to"])).name)
    want = _MIL_DTYPES.get(to)
    if want is None:
        raise ValueError(f"Cast to {to}")
    if _MIL_DTYPES.get(np_dtype(x).name) == want:
        return [x]
    return [mb().cast(x=x, dtype=want)]


@op("Identity", "Dropout")
def op_identity(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [inputs[0]] + [None] * (len(node.output) - 1)


@op("Softmax", "LogSoftmax")
def op_softmax(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    r = rank(x)
    axis = norm_axis(int(attrs(node).get("axis", -1 if lw.opset >= 13 else 1)), r)
    if lw.opset < 13 and axis != r - 1:
        raise ValueError("Softmax before opset 13 over more than the last axis")
    y = mb().softmax(x=x, axis=axis)
    return [mb().log(x=y, epsilon=0.0) if node.op_type == "LogSoftmax" else y]
