"""Pad: constant zero padding (any axes) and reflect padding of the innermost axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import op
from ._common import GTensor, Value, attrs, cont, gdim, ggml_lib, scalar_of


@op("Pad")
def op_pad(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    a = attrs(node)
    mode = a.get("mode", "constant")
    if len(inputs) > 1 and inputs[1] is not None:
        if not isinstance(inputs[1], np.ndarray):
            raise ValueError("Pad with runtime pads")
        pads = [int(p) for p in inputs[1].reshape(-1)]
    else:
        pads = list(a.get("pads", []))
    value = scalar_of(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else float(a.get("value", 0.0))
    axes = list(range(x.rank))
    if len(inputs) > 3 and inputs[3] is not None:
        axes = [int(i) % x.rank for i in np.asarray(inputs[3]).reshape(-1)]
    k = len(axes)
    lr = [[0, 0] for _ in range(4)]
    shape = list(x.shape)
    for i, ax in enumerate(axes):
        lo, hi = pads[i], pads[i + k]
        if lo < 0 or hi < 0:
            raise ValueError("Pad with negative pads")
        lr[gdim(ax, x.rank)] = [lo, hi]
        shape[ax] += lo + hi
    g = ggml_lib()
    x = cont(lowering, x)
    if mode == "constant":
        if value not in (0.0, None):
            raise ValueError(f"Pad with constant value {value}")
        y = g.ggml_pad_ext(lowering.ctx, x.ptr, *lr[0], *lr[1], *lr[2], *lr[3])
        return [GTensor(y, tuple(shape))]
    if mode == "reflect" and all(v == [0, 0] for v in lr[1:]):
        return [GTensor(g.ggml_pad_reflect_1d(lowering.ctx, x.ptr, *lr[0]), tuple(shape))]
    raise ValueError(f"Pad mode {mode!r} on these axes")
