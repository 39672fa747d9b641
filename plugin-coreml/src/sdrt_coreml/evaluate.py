"""Numbers without a Mac: evaluate a lowering in numpy through the MIL ops' own ``value_inference``.

The graph is lowered with its inputs as MIL constants; coremltools' builder then
runs each op's ``value_inference`` as the op is added (constant propagation),
so the outputs come out as numpy arrays computed with coremltools' own op
semantics -- sdrt adds no interpreter of its own. coremltools 9 gives no
``value_inference`` to ``conv``, ``conv_transpose``, the pools, ``instance_norm``,
``batch_norm``, ``upsample_*``/``resize_*`` or ``silu``: past the first such op
nothing has a value. Given ``reference`` values of the ONNX graph's
intermediates (onnxruntime's, say), such an op's output is taken from them
after its shape is checked, and the walk goes on: every other op is then
still checked by value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sdrt import resolve_weights

from .errors import ct
from .lower import Lowering
from .options import TARGETS


@dataclass
class Evaluation:
    outputs: dict[str, np.ndarray | None]
    #: MIL op type -> how many had no value inference (their output came from ``reference``)
    stand_ins: dict[str, int]
    n_ops: int
    fused_attention: int


def evaluate(graph: Any, feeds: Mapping[str, np.ndarray], *, target: str = "macOS14", weights: Any = None,
             reference: Mapping[str, np.ndarray] | None = None, shapes: Mapping[str, Any] | None = None
             ) -> Evaluation:
    """Lower ``graph`` with ``feeds`` as constants and return what MIL computed (``shapes`` pins dynamic dims)."""
    ct()
    static = graph.with_shapes(dict(shapes or {})).fold_constants()
    arrays = resolve_weights(static, weights)
    opset = TARGETS[target]
    lw = Lowering(static.model, arrays, static.inputs, opset_mil=opset, sdpa=opset >= 18, feeds=feeds,
                  oracle=reference)
    with _quiet():  # layer_norm's value inference computes in float64 and warns when it narrows
        out = lw.lower()
    return Evaluation(out.values, out.no_value, out.n_ops, out.fused_attention)


def evaluate_package(path: Any, feeds: Mapping[str, np.ndarray]) -> Evaluation:
    """Evaluate a saved ``.mlpackage`` (after coremltools' passes, in its own precision) by value inference.

    coremltools reads the package back into a MIL program (its ``milproto`` frontend);
    each op is then added again to a program whose inputs are the feeds as constants,
    so MIL's ``value_inference`` computes it; a compressed constant (``constexpr_*``) is expanded by its op's own
    ``materialized_val_inference``, what coremltools decompresses it with. Nothing stands in for ops without one:
    their outputs, and everything after them, stay None.
    """
    from pathlib import Path

    from . import package

    coremltools = ct()
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load
    from coremltools.converters.mil.mil import Function

    pkg = Path(path)
    built = package.load(pkg)
    spec = coremltools.utils.load_spec(str(pkg))
    prog = milproto_load(spec, spec.specificationVersion, str(pkg / package.WEIGHT_FILE.parent))
    func = prog.functions["main"]
    by_mil = {mil: name for name, mil, _, _ in built.io["inputs"]}
    env: dict[int, Any] = {}
    missing: dict[str, int] = {}
    with _quiet(), Function({}, opset_version=func.opset_version):
        for mil, v in func.inputs.items():
            arr = np.asarray(feeds[by_mil[mil]])
            env[id(v)] = mb.const(val=arr.astype(np.int32) if arr.dtype == np.int64 else arr)
        for op in func.operations:
            if op.op_type == "const":
                env[id(op.outputs[0])] = mb.const(val=op.outputs[0].val)
                continue
            if op.op_type.startswith("constexpr_"):  # compressed weights: expanded by the op's own decompression
                env[id(op.outputs[0])] = mb.const(val=op.materialized_val_inference())
                continue
            kw = {k: tuple(env[id(x)] for x in v) if isinstance(v, (list, tuple)) else env[id(v)]
                  for k, v in op.inputs.items()}
            res = getattr(mb, op.op_type)(**kw)
            outs = list(res) if isinstance(res, (list, tuple)) else [res]
            known = all(x.val is not None for v in kw.values() for x in (v if isinstance(v, tuple) else (v,)))
            if known and any(o.val is None for o in outs):
                missing[op.op_type] = missing.get(op.op_type, 0) + 1
            for old, new in zip(op.outputs, outs):
                env[id(old)] = new
        values = {}
        for (name, _, dtype, _), o in zip(built.io["outputs"], func.outputs):
            val = env[id(o)].val
            values[name] = None if val is None else np.asarray(val).astype(dtype)
    return Evaluation(values, missing, built.n_ops, 0)


class _quiet:
    """coremltools warns each time value inference narrows a float64 result; keep that quiet."""

    def __enter__(self) -> None:
        import logging

        self._logger = logging.getLogger("coremltools")
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        self._logger.setLevel(self._level)
