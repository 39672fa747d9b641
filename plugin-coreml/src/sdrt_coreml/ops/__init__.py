"""The lowering table: ONNX op type -> one small function that emits MIL ops.

Each ``op_*.py`` module registers its functions with ``@op("OpType")``. A
lowering has the signature ``fn(lw, node, inputs) -> list[Value]``: ``inputs``
holds a MIL ``Var`` (a runtime value), a numpy array (a compile-time constant)
or None for an omitted optional input. An optional ``@check("OpType")`` inspects
a node before any lowering and returns a reason when its attributes are not
supported; ``support.check_graph`` collects every reason at once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

Lowering = Callable[..., list[Any]]
Check = Callable[[Any], "str | None"]

REGISTRY: dict[str, Lowering] = {}
CHECKS: dict[str, Check] = {}
#: ops that are supported only when every input is a compile-time constant: they are
#: evaluated with onnx's reference implementation while lowering (shape arithmetic, masks)
FOLD_ONLY: set[str] = {
    "Constant", "ConstantOfShape", "Range", "NonZero", "ScatterND", "Trilu", "CumSum",
    "OneHot", "Mod", "ReduceProd", "Xor", "EyeLike",
}

_MODULES = (
    "op_elementwise", "op_unary", "op_matmul", "op_conv", "op_norm", "op_shape", "op_gather", "op_resize",
    "op_reduce", "op_pool",
)


def op(*names: str) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        for n in names:
            REGISTRY[n] = fn
        return fn

    return deco


def check(*names: str) -> Callable[[Check], Check]:
    def deco(fn: Check) -> Check:
        for n in names:
            CHECKS[n] = fn
        return fn

    return deco


def load_all() -> dict[str, Lowering]:
    for m in _MODULES:
        importlib.import_module(f"{__name__}.{m}")
    return REGISTRY


def supported_ops() -> set[str]:
    load_all()
    return set(REGISTRY) | FOLD_ONLY


__all__ = ["CHECKS", "FOLD_ONLY", "REGISTRY", "check", "load_all", "op", "supported_ops"]
