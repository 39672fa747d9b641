"""Compile-time evaluation of nodes whose inputs are all constants (onnx's reference ops).

The core's ``Graph.fold_constants`` has already folded what it could; what is
left constant here is mostly shape arithmetic that became constant once the
shapes were pinned. Folding it keeps the MIL program to real tensor work.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np


@cache
def _op_class(domain: str, op_type: str, version: int) -> Any:
    from onnx.reference.ops import load_op

    return load_op(domain, op_type, version)


def _log(*args: Any) -> None:
    return None


def fold_node(node: Any, inputs: list[np.ndarray | None], opsets: dict[str, int]) -> list[np.ndarray]:
    """Evaluate ``node`` on constant ``inputs``; returns one array per output."""
    cls = _op_class(node.domain or "", node.op_type, opsets.get(node.domain or "", 17))
    inst = cls(node, {"log": _log, "opsets": opsets, "verbose": 0, "new_ops": None, "evaluator_cls": None})
    results = inst.run(*inputs)
    if not isinstance(results, tuple):
        results = (results,)
    return [np.asarray(r) for r in results]
