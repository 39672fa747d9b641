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

from .compat import resolve_weights
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
             reference: Mapping[str, np.ndarray] | None = None) -> Evaluation:
    """Lower ``graph`` (static shapes) with ``feeds`` as constants and return what MIL computed."""
    ct()
    static = graph.with_shapes().fold_constants()
    arrays = resolve_weights(static, weights)
    opset = TARGETS[target]
    lw = Lowering(static.model, arrays, static.inputs, opset_mil=opset, sdpa=opset >= 18, feeds=feeds,
                  oracle=reference)
    out = lw.lower()
    return Evaluation(out.values, out.no_value, out.n_ops, out.fused_attention)
