"""Attention: the decomposed pattern as torch exports it, lowered to Core ML's fused
``scaled_dot_product_attention`` when the target has it (iOS18/macOS15), op by op otherwise.

The pattern, ending at the second MatMul::

    S0 = MatMul(Q, Kt)          # Kt: keys with the last two axes swapped
    S1 = Mul(S0, c) | Div(S0, c)    (optional; c a scalar constant)
    S  = Add(S1, mask)              (optional; either operand order)
    P  = Softmax(S, axis=-1)
    P' = Where(IsNaN(P), 0, P)      (optional: torch's dynamo export guards fully masked rows)
    O  = MatMul(P | P', V)

Every interior value must be used once (P twice under the guard). MIL's op scales by 1/sqrt(E)
(E: Q's last axis), so Q is multiplied by c * sqrt(E) first unless that is 1. The NaN guard only
matters for a row masked entirely with -inf; it is fused only when the mask is absent or a
constant with finite values (sdrt saturates masks to float16's range), where it changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._common import attrs, mb, np_dtype, rank, var


@dataclass(frozen=True)
class Match:
    q: str
    kt: str
    v: str
    scale: float
    mask: str | None
    interior: tuple[int, ...]  # ids of the nodes the fused op replaces (not the last MatMul)


def _scalar(lw: Any, name: str) -> float | None:
    value = lw.constant(name)
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(()))


def match(lw: Any, last: Any) -> Match | None:
    """The attention pattern ending at MatMul ``last``, or None."""
    if last.op_type != "MatMul":
        return None
    p_node = lw.sole_producer(last.input[0])
    guard = _nan_guard(lw, p_node)
    if guard:
        p_node = lw.node_of(p_node.input[2])
    if p_node is None or p_node.op_type != "Softmax":
        return None
    a = attrs(p_node)
    if int(a.get("axis", -1)) != -1 and lw.opset >= 13:
        rank_p = lw.rank_of(p_node.output[0])
        if rank_p is None or int(a["axis"]) != rank_p - 1:
            return None
    interior = [p_node, *guard]
    s = p_node.input[0]
    node = lw.sole_producer(s)
    mask = None
    if node is not None and node.op_type == "Add":
        l0, l1 = (lw.sole_producer(n) for n in node.input)
        first = 0 if (l0 is not None and l0.op_type in ("Mul", "Div", "MatMul")) else 1
        if (l0 if first == 0 else l1) is None:
            return None
        mask = node.input[1 - first]
        interior.append(node)
        node = l0 if first == 0 else l1
    scale = 1.0
    if node is not None and node.op_type in ("Mul", "Div"):
        c = _scalar(lw, node.input[1])
        if c is None or c == 0:
            return None
        scale = c if node.op_type == "Mul" else 1.0 / c
        interior.append(node)
        node = lw.sole_producer(node.input[0])
    if node is None or node.op_type != "MatMul":
        return None
    if guard and mask is not None:
        value = lw.constant(mask)
        if value is None or not np.all(np.isfinite(value)):
            return None  # a runtime or -inf mask may mask a whole row: keep the guard's semantics
    interior.append(node)
    q, kt = node.input
    if lw.constant(q) is not None or lw.constant(kt) is not None or lw.constant(last.input[1]) is not None:
        return None
    return Match(q, kt, last.input[1], scale, mask, tuple(id(n) for n in interior))


def _nan_guard(lw: Any, node: Any) -> list[Any]:
    """[Where, IsNaN] when ``node`` is ``Where(IsNaN(P), 0, P)`` with P used by exactly those two."""
    if node is None or node.op_type != "Where" or len(node.input) != 3:
        return []
    cond = lw.sole_producer(node.input[0])
    zero = lw.constant(node.input[1])
    p = node.input[2]
    if cond is None or cond.op_type != "IsNaN" or cond.input[0] != p or lw.n_uses(p) != 2:
        return []
    if zero is None or np.any(zero != 0):
        return []
    return [node, cond]


def lower(lw: Any, m: Match) -> Any:
    q, kt, v = lw.values[m.q], lw.values[m.kt], lw.values[m.v]
    r = rank(q)
    if r < 3 or rank(kt) != r or rank(v) != r:
        raise ValueError("attention on tensors of rank < 3")
    e = int(q.shape[-1])
    fix = m.scale * math.sqrt(e)
    if abs(fix - 1.0) > 1e-6:
        q = mb().mul(x=q, y=np_dtype(q).type(fix))
    perm = list(range(r - 2)) + [r - 1, r - 2]
    k = mb().transpose(x=kt, perm=perm)
    kw: dict[str, Any] = {}
    if m.mask is not None:
        mask = lw.values[m.mask]
        kw["attn_mask"] = var(lw, mask, like=q) if isinstance(mask, np.ndarray) else mask
    return mb().scaled_dot_product_attention(query=q, key=k, value=v, **kw)

