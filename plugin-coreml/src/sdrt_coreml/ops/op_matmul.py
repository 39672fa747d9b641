"""MatMul and Gemm. A constant weight stays one named constant (update_weights rewrites it in the package)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import op
from ._common import Value, attrs, mb, np_dtype, var


@op("MatMul")
def op_matmul(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    a, b = inputs
    like = b if isinstance(a, np.ndarray) else a
    return [mb().matmul(x=var(lw, a, like=like), y=var(lw, b, like=like))]


@op("Gemm")
def op_gemm(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    at = attrs(node)
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    trans_a, trans_b = bool(at.get("transA", 0)), bool(at.get("transB", 0))
    like = b if isinstance(a, np.ndarray) else a
    x, w = var(lw, a, like=like), var(lw, b, like=like)
    if (not trans_a and trans_b and alpha == 1.0 and beta == 1.0 and isinstance(b, np.ndarray)
            and (c is None or (isinstance(c, np.ndarray) and c.size == b.shape[0]))):
        # torch's nn.Linear: y = x W^T + b, which is MIL's linear with W as stored
        bias = None if c is None else var(lw, c.reshape(-1), like=like, source=c)
        return [mb().linear(x=x, weight=w, bias=bias) if bias is not None else mb().linear(x=x, weight=w)]
    y = mb().matmul(x=x, y=w, transpose_x=trans_a, transpose_y=trans_b)
    if alpha != 1.0:
        y = mb().mul(x=y, y=np_dtype(like).type(alpha))
    if c is not None:
        cv = var(lw, c, like=like)
        if beta != 1.0:
            cv = mb().mul(x=cv, y=np_dtype(like).type(beta))
        y = mb().add(x=y, y=cv)
    return [y]
