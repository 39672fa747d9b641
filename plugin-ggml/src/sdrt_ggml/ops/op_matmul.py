"""MatMul and Gemm through ggml_mul_mat.

``ggml_mul_mat(a, b)`` computes ``b @ a^T`` over the two innermost ggml dims:
with ``a`` of ONNX shape (N, K) and ``b`` of shape (M, K) it gives (M, N). So
``A @ B`` is ``ggml_mul_mat(B^T, A)``; a constant ``B`` is transposed once on
upload, a runtime one through a view (free when it already is a transpose).
ggml broadcasts ``a`` over the batch dims of ``b``, not the other way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import op
from ._common import (
    GTensor,
    Value,
    aligned,
    attrs,
    binary,
    broadcast_shape,
    cont,
    expand_to,
    ggml_lib,
    pad_k,
    permute,
    reshape,
    want_pad,
)


def _swap_last(rank: int) -> list[int]:
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return perm


def _weight_t(lowering: Any, b: Value) -> GTensor:
    """B^T (shape (..., N, K)) as a tensor usable as ggml_mul_mat's first operand."""
    if isinstance(b, np.ndarray):
        return lowering.const(b, transform=lambda w: np.swapaxes(w, -1, -2), tag="T")
    bt = permute(lowering, b, _swap_last(b.rank))
    return cont(lowering, bt)


def _pad_last(v: np.ndarray, pad: int) -> np.ndarray:
    return np.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, pad)])


def matmul(lowering: Any, a: Value, b: Value) -> GTensor:
    """ONNX MatMul semantics (numpy matmul) for rank >= 1."""
    if isinstance(a, np.ndarray):
        a = lowering.const(a)
    assert isinstance(a, GTensor)
    squeeze_a = a.rank == 1
    squeeze_b = np.ndim(b) == 1 if isinstance(b, np.ndarray) else b.rank == 1
    if squeeze_a:
        a = reshape(lowering, a, (1,) + a.shape)
    if squeeze_b:
        b = b.reshape(-1, 1) if isinstance(b, np.ndarray) else reshape(lowering, b, b.shape + (1,))
    bshape = tuple(np.shape(b)) if isinstance(b, np.ndarray) else b.shape
    m, n = a.shape[-2], bshape[-1]
    batch = broadcast_shape(a.shape[:-2], bshape[:-2])
    k = a.shape[-1]
    kp = aligned(k) if want_pad(lowering, k) else k
    if isinstance(b, np.ndarray) and kp != k:
        pad = kp - k
        w = lowering.const(b, transform=lambda v: _pad_last(np.swapaxes(v, -1, -2), pad), tag=f"Tp{kp}")
    else:
        w = pad_k(lowering, _weight_t(lowering, b), kp)  # (..., N, Kp)
    if a.shape[:-2] != batch:
        a = expand_to(lowering, a, batch + a.shape[-2:])
    a = pad_k(lowering, cont(lowering, a), kp)
    rank = len(batch) + 2
    if w.rank < rank:
        w = reshape(lowering, w, (1,) * (rank - w.rank) + w.shape)
    if a.rank < rank:
        a = reshape(lowering, a, (1,) * (rank - a.rank) + a.shape)
    g = ggml_lib()
    out = GTensor(g.ggml_mul_mat(lowering.ctx, w.ptr, a.ptr), batch + (m, n))
    if squeeze_a:
        out = reshape(lowering, out, batch + (n,))
        m = None
    if squeeze_b:
        out = reshape(lowering, out, out.shape[:-1])
    return out


@op("MatMul")
def op_matmul(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [matmul(lowering, inputs[0], inputs[1])]


@op("Gemm")
def op_gemm(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    a_, b_, c_ = (list(inputs) + [None])[:3]
    at = attrs(node)
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    if at.get("transA", 0):
        a_ = a_.T if isinstance(a_, np.ndarray) else permute(lowering, a_, [1, 0])
    g = ggml_lib()
    if at.get("transB", 0):
        a = cont(lowering, lowering.const(a_) if isinstance(a_, np.ndarray) else a_)
        k = a.shape[1]
        kp = aligned(k) if want_pad(lowering, k) else k
        if isinstance(b_, np.ndarray):  # already (N, K)
            w = lowering.const(b_, transform=(lambda v: _pad_last(v, kp - k)) if kp != k else None, tag=f"p{kp}")
        else:
            w = pad_k(lowering, cont(lowering, b_), kp)
        a = pad_k(lowering, a, kp)
        y = GTensor(g.ggml_mul_mat(lowering.ctx, w.ptr, a.ptr), (a.shape[0], w.shape[0]))
    else:
        y = matmul(lowering, a_, b_)
    if alpha != 1.0:
        y = GTensor(g.ggml_scale(lowering.ctx, y.ptr, alpha), y.shape)
    if c_ is not None and beta != 0.0:
        c = c_ * np.float32(beta) if isinstance(c_, np.ndarray) and beta != 1.0 else c_
        if isinstance(c, GTensor) and beta != 1.0:
            c = GTensor(g.ggml_scale(lowering.ctx, cont(lowering, c).ptr, beta), c.shape)
        if isinstance(c, np.ndarray):
            c = c.astype(np.float32)
        y = binary(lowering, "ggml_add", y, c, True)
    return [y]
