"""MatMul and Gemm. A constant weight stays one named constant (update_weights rewrites it in the package)."""

from __future__ import annotations

import math
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



def _einsum_plan(eq: str) -> tuple[str, str, str]:
    if "..." in eq or "->" not in eq:
        raise ValueError(f"Einsum {eq!r} (ellipsis or implicit output)")
    ins, out = eq.split("->")
    terms = ins.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in (*terms, out)):
        raise ValueError(f"Einsum {eq!r} (two operands without repeated indices only)")
    return terms[0], terms[1], out


def _einsum_permute(lw: Any, node: Any, x: Value) -> Any:
    """One operand, every index kept once (SD3's unpatchify ``nhwpqc->nchpwq``): a transpose."""
    eq = str(attrs(node)["equation"]).replace(" ", "")
    if "..." in eq or "->" not in eq:
        raise ValueError(f"Einsum {eq!r} (ellipsis or implicit output)")
    term, out = eq.split("->")
    if len(set(term)) != len(term) or sorted(term) != sorted(out):
        raise ValueError(f"Einsum {eq!r} (one operand: only axis permutations)")
    perm = [term.index(c) for c in out]
    v = var(lw, x)
    return v if perm == list(range(len(perm))) else mb().transpose(x=v, perm=perm)


@op("Einsum")
def op_einsum(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """Two-operand Einsum as a batched matmul: transpose each operand to (batch, free, contracted)
    and (batch, contracted, free), reshape to rank 3, ``matmul``, reshape and transpose to the output.
    (MIL's own ``einsum`` takes only ``nchw,nwhu->nchu``.)"""
    if len(inputs) == 1:
        return [_einsum_permute(lw, node, inputs[0])]
    if len(inputs) != 2:
        raise ValueError(f"Einsum with {len(inputs)} operands (one or two are supported)")
    ta, tb, to = _einsum_plan(str(attrs(node)["equation"]).replace(" ", ""))
    like = inputs[1] if isinstance(inputs[0], np.ndarray) else inputs[0]
    a, b = var(lw, inputs[0], like=like), var(lw, inputs[1], like=like)
    if any(c not in ta + tb for c in to) or any(c not in tb + to for c in ta) or any(c not in ta + to for c in tb):
        raise ValueError(f"Einsum {ta},{tb}->{to} (an index summed within one operand)")
    size = {c: int(d) for t, x in ((ta, a), (tb, b)) for c, d in zip(t, x.shape)}
    batch = [c for c in to if c in ta and c in tb]
    free_a = [c for c in ta if c in to and c not in tb]
    free_b = [c for c in tb if c in to and c not in ta]
    contr = [c for c in ta if c in tb and c not in to]

    def arrange(x: Any, term: str, order: list[str], dims: list[int]) -> Any:
        perm = [term.index(c) for c in order]
        if perm != list(range(len(perm))):
            x = mb().transpose(x=x, perm=perm)
        return mb().reshape(x=x, shape=dims)

    nb = math.prod(size[c] for c in batch)
    fa, fb, k = (math.prod(size[c] for c in g) for g in (free_a, free_b, contr))
    x = arrange(a, ta, batch + free_a + contr, [nb, fa, k])
    y = arrange(b, tb, batch + contr + free_b, [nb, k, fb])
    z = mb().reshape(x=mb().matmul(x=x, y=y), shape=[size[c] for c in batch + free_a + free_b])
    perm = [(batch + free_a + free_b).index(c) for c in to]
    return [z if perm == list(range(len(perm))) else mb().transpose(x=z, perm=perm)]
