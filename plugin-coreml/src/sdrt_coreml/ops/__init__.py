"""The lowering table: ONNX op type -> one small function that emits MIL ops.

Each ``op_*.py`` module registers its functions with ``@op("OpType")``. A
lowering has the signature ``fn(lw, node, inputs) -> list[Value]``: ``inputs``
holds a MIL ``Var`` (a runtime value), a numpy array (a compile-time constant)
or None for an omitted optional input. An optional ``@check("OpType")`` inspects
a node before any lowering and returns a reason when its attributes are not
supported; ``TABLE.check_graph`` (``sdrt.lowering``) collects every reason at once.
"""

from __future__ import annotations

from sdrt.lowering import Check, Lowering, OpTable

#: ops that are supported only when every input is a compile-time constant: they are
#: evaluated with onnx's reference implementation while lowering (shape arithmetic, masks)
FOLD_ONLY: set[str] = {
    "Constant", "ConstantOfShape", "Range", "NonZero", "ScatterND", "Trilu", "CumSum",
    "OneHot", "Mod", "ReduceProd", "Xor", "EyeLike",
    "DequantizeLinear",  # on constant weights only: lower.py writes Core ML's compressed constants for them
}

_MODULES = (
    "op_elementwise", "op_unary", "op_matmul", "op_conv", "op_norm", "op_shape", "op_gather", "op_resize",
    "op_reduce", "op_pool",
)

#: the table every ``op_*`` module registers on (``sdrt.lowering.OpTable``)
TABLE = OpTable(__name__, _MODULES, FOLD_ONLY)
REGISTRY, CHECKS, op, check, load_all, supported_ops = (TABLE.registry, TABLE.checks, TABLE.op, TABLE.check,
                                                        TABLE.load_all, TABLE.supported_ops)

__all__ = ["CHECKS", "FOLD_ONLY", "REGISTRY", "TABLE", "Check", "Lowering", "check", "load_all", "op", "supported_ops"]
