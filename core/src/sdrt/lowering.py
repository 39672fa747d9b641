"""Shared support for backends that lower ONNX op by op (ggml, Core ML): the op table and constant folding.

A backend keeps one small function per ONNX op in ``ops/op_*.py`` and registers
it on its ``OpTable``::

    TABLE = OpTable(__name__, ("op_elementwise", "op_conv"), fold_only={"Range", "Shape"})

    @TABLE.op("Add", "Sub")
    def _binary(lowering, node, inputs): ...

    @TABLE.check("Conv")
    def _conv_attrs(node):          # a reason when an attribute combination is not supported
        ...

``TABLE.unsupported_nodes(graph.model.graph.node)`` finds every node the table
cannot lower before any long work (for ``UnsupportedGraph``), and
``fold_node`` evaluates a node whose inputs are all constants with onnx's
reference implementation, so shape arithmetic never reaches the device.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any

import numpy as np

from .errors import UnsupportedGraph

Lowering = Callable[..., list[Any]]
Check = Callable[[Any], "str | None"]


class OpTable:
    """ONNX op type -> lowering function, attribute checks, and ops supported only on constants."""

    def __init__(self, package: str, modules: Sequence[str], fold_only: Iterable[str] = ()) -> None:
        self.package = package
        self.modules = tuple(modules)
        self.registry: dict[str, Lowering] = {}
        self.checks: dict[str, Check] = {}
        #: ops supported only when every input is a compile-time constant (evaluated by ``fold_node``)
        self.fold_only: set[str] = fold_only if isinstance(fold_only, set) else set(fold_only)

    def op(self, *names: str) -> Callable[[Lowering], Lowering]:
        def deco(fn: Lowering) -> Lowering:
            for n in names:
                self.registry[n] = fn
            return fn

        return deco

    def check(self, *names: str) -> Callable[[Check], Check]:
        def deco(fn: Check) -> Check:
            for n in names:
                self.checks[n] = fn
            return fn

        return deco

    def load_all(self) -> dict[str, Lowering]:
        """Import every ``op_*`` module (they register themselves) and return the table."""
        for m in self.modules:
            importlib.import_module(f"{self.package}.{m}")
        return self.registry

    def supported_ops(self) -> set[str]:
        self.load_all()
        return set(self.registry) | self.fold_only

    def check_graph(self, nodes: Iterable[Any], where: str, what: str, others: str) -> None:
        """Raise ``UnsupportedGraph`` (``what``: "the ggml backend cannot run this graph") listing every
        unsupported op and attribute combination; ``others`` names the backends to use instead."""
        found = self.unsupported_nodes(nodes)
        if found:
            raise UnsupportedGraph(
                what, unsupported=found, where=where,
                fix=f"run it on another backend ({others}), or re-export the model without these ops; "
                    f"ops that work only on constants: {', '.join(sorted(self.fold_only)[:6])}, ...")

    def unsupported_nodes(self, nodes: Iterable[Any]) -> dict[str, list[str]]:
        """Op type (with the reason for attribute problems) -> names of the nodes that use it."""
        ops = self.supported_ops()
        found: dict[str, list[str]] = {}
        for i, node in enumerate(nodes):
            name = node.name or f"#{i} {node.op_type}"
            key: str | None = None
            if node.domain not in ("", "ai.onnx"):
                key = f"{node.domain}.{node.op_type}"
            elif node.op_type not in ops:
                key = node.op_type
            elif node.op_type in self.checks:
                why = self.checks[node.op_type](node)
                if why:
                    key = f"{node.op_type} ({why})"
            if key is not None:
                found.setdefault(key, []).append(name)
        return found


def unsorted_input(node: Any, name: str) -> Exception:
    """The error for a node input that no earlier node produced (an unsorted graph, a subgraph value)."""
    return UnsupportedGraph(
        f"input {name!r} of node {node.name!r} is not produced before it (the graph is not sorted, or uses "
        "a subgraph value)", unsupported={node.op_type: [node.name or node.op_type]},
        where=f"node {node.name!r}", fix="sort the graph topologically (onnx.utils) or re-export it")


def norm_axis(axis: int, rank: int) -> int:
    """ONNX ``axis`` (negative counts from the end) as an index into ``rank`` dims; ValueError when out of range
    (a lowering turns it into ``UnsupportedGraph``). Rank 0 takes axis 0, as ONNX's scalar reductions do."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def node_inputs(node: Any, values: dict[str, Any]) -> list[Any]:
    """The values of ``node``'s inputs (None for an omitted optional input), or ``unsorted_input``'s error."""
    ins: list[Any] = []
    for n in node.input:
        if not n:
            ins.append(None)
        elif n in values:
            ins.append(values[n])
        else:
            raise unsorted_input(node, n)
    return ins


def check_batch_norm(node: Any) -> str | None:
    """Only inference BatchNormalization is lowered: no training mode, no running-statistics outputs."""
    training = next((a.i for a in node.attribute if a.name == "training_mode"), 0)
    if training or (len(node.output) > 1 and any(node.output[1:])):
        return "BatchNormalization in training mode"
    return None


def check_layer_norm(node: Any) -> str | None:
    """LayerNormalization's optional Mean/InvStdDev outputs are not lowered by any backend."""
    if len(node.output) > 1 and any(node.output[1:]):
        return "LayerNormalization with Mean/InvStdDev outputs"
    return None


def check_gelu(node: Any) -> str | None:
    """Gelu's ``approximate`` must be ``none`` or ``tanh``."""
    approx = next((a.s.decode() for a in node.attribute if a.name == "approximate"), "none")
    return None if approx in ("none", "tanh") else f"approximate={approx!r}"


def producers_and_uses(nodes: Iterable[Any], outputs: Iterable[str], *,
                       output_uses: int = 1) -> tuple[dict[str, Any], dict[str, int]]:
    """``{value: the node that makes it}`` and ``{value: how many nodes read it}``.

    Each graph output counts ``output_uses`` more reads, so a fusion that needs a value to be
    read once only never swallows an output.
    """
    producer: dict[str, Any] = {}
    uses: dict[str, int] = {}
    for nd in nodes:
        for o in nd.output:
            producer[o] = nd
        for i in nd.input:
            uses[i] = uses.get(i, 0) + 1
    for o in outputs:
        uses[o] = uses.get(o, 0) + output_uses
    return producer, uses


@cache
def _op_class(domain: str, op_type: str, version: int) -> Any:
    from onnx.reference.ops import load_op

    return load_op(domain, op_type, version)


def _log(*args: Any) -> None:
    return None


def fold_node(node: Any, inputs: list[np.ndarray | None], opsets: dict[str, int]) -> list[np.ndarray]:
    """Evaluate ``node`` on constant ``inputs``: with numpy for constants and shape arithmetic
    (``sdrt.graph.arith``), else with onnx's reference op; one array per output."""
    from .graph.arith import numpy_fold

    known = numpy_fold(node, inputs, opsets.get(node.domain or "", 17))
    if known is not None:
        return known
    cls = _op_class(node.domain or "", node.op_type, opsets.get(node.domain or "", 17))
    inst = cls(node, {"log": _log, "opsets": opsets, "verbose": 0, "new_ops": None, "evaluator_cls": None})
    with np.errstate(all="ignore"):  # the graph's own arithmetic (a NaN the graph masks later): computed as the
        results = inst.run(*inputs)  # runtime computes it, without numpy's warnings on the user's stderr
    if not isinstance(results, tuple):
        results = (results,)
    return [np.asarray(r) for r in results]


__all__ = ["Check", "Lowering", "OpTable", "fold_node", "norm_axis", "producers_and_uses"]
