"""The lowering table: ONNX op type -> one small function that emits ggml ops.

Each ``op_*.py`` module registers its functions with ``@op("OpType")``. A
lowering has the signature ``fn(lowering, node, inputs) -> list[Value]`` where
``inputs`` holds a runtime tensor (``T``), a numpy constant, or None for an
omitted optional input. An optional ``@check("OpType")`` function inspects a
node before any lowering and returns a reason when an attribute combination is
not supported (``TABLE.check_graph``, ``sdrt.lowering``, collects them all).
"""

from __future__ import annotations

from sdrt.lowering import Check, Lowering, OpTable

#: ops that are only supported when every input is a compile-time constant
#: (they are evaluated with onnx's reference implementation while lowering)
FOLD_ONLY: set[str] = {
    "Constant", "ConstantOfShape", "Range", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
    "Not", "And", "Or", "Xor", "NonZero", "Floor", "Ceil", "Round", "Mod", "Max", "Min", "ReduceProd",
    "ScatterND", "Trilu", "CumSum", "OneHot", "ArgMax", "ArgMin", "Sign", "Abs", "IsNaN", "IsInf",
    "ReduceMax", "ReduceMin",  # Optimum's Flux transformer: max over a ConstantOfShape of the ids' length
    "DequantizeLinear",  # quantized weights: folded, and kept as ggml blocks for matmuls (quant.py)
}

_MODULES = (
    "op_elementwise", "op_unary", "op_matmul", "op_conv", "op_norm", "op_softmax", "op_shape",
    "op_gather", "op_resize", "op_reduce", "op_pool", "op_pad", "op_einsum",
)

#: the table every ``op_*`` module registers on (``sdrt.lowering.OpTable``)
TABLE = OpTable(__name__, _MODULES, FOLD_ONLY)
REGISTRY, CHECKS, op, check, load_all, supported_ops = (TABLE.registry, TABLE.checks, TABLE.op, TABLE.check,
                                                        TABLE.load_all, TABLE.supported_ops)

__all__ = ["CHECKS", "FOLD_ONLY", "REGISTRY", "TABLE", "Check", "Lowering", "check", "load_all", "op", "supported_ops"]
