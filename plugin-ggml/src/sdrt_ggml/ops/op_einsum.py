"""Einsum, for the equations diffusion transformers export: a pure axis permutation (SD3's unpatchify,
``nhwpqc->nchpwq``) and an outer product (Flux's and Chroma's rotary angles, ``i,j->ij``).

Contractions (a letter summed over) are refused up front: exporters write them as MatMul.
"""

from __future__ import annotations

from typing import Any

from . import check, op
from ._common import GTensor, Value, attrs, binary, permute, reshape, to_tensor


def _parse(node: Any) -> tuple[list[str], str] | None:
    eq = attrs(node).get("equation")
    if isinstance(eq, bytes):
        eq = eq.decode()
    if not isinstance(eq, str) or "->" not in eq or "." in eq:
        return None
    lhs, out = eq.replace(" ", "").split("->")
    ins = lhs.split(",")
    if any(len(set(t)) != len(t) for t in [*ins, out]) or not all(t.isalpha() for t in [*ins, out] if t):
        return None
    return ins, out


def _kind(node: Any) -> str | None:
    parsed = _parse(node)
    if parsed is None:
        return None
    ins, out = parsed
    if len(ins) == 1 and sorted(ins[0]) == sorted(out):
        return "permute"
    if len(ins) == 2 and not set(ins[0]) & set(ins[1]) and out == ins[0] + ins[1]:
        return "outer"
    return None


@check("Einsum")
def check_einsum(node: Any) -> str | None:
    if _kind(node) is None:
        eq = attrs(node).get("equation")
        eq = eq.decode() if isinstance(eq, bytes) else eq
        return f"equation {eq!r}: only axis permutations and outer products"
    return None


@op("Einsum")
def op_einsum(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    ins, out = _parse(node)  # type: ignore[misc]  # check_einsum ran first
    if _kind(node) == "permute":
        x = to_tensor(lowering, inputs[0])
        return [permute(lowering, x, [ins[0].index(c) for c in out])]
    a, b = to_tensor(lowering, inputs[0]), to_tensor(lowering, inputs[1])
    if a.dtype != "float32" or b.dtype != "float32":
        raise ValueError("Einsum on integer tensors")
    a = reshape(lowering, a, a.shape + (1,) * b.rank)
    return [GTensor(binary(lowering, "ggml_mul", a, b, True).ptr, a.shape[: a.rank - b.rank] + b.shape)]
