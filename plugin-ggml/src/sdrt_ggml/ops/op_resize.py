"""Resize (and Upsample): nearest (asymmetric/floor) and bilinear over the last two axes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import check, op
from ._common import GTensor, Value, attrs, cont, ggml_lib, ne_of

_NEAREST_OK = {("asymmetric", "floor")}
_LINEAR_OK = {"half_pixel", "pytorch_half_pixel", "align_corners"}


@check("Resize", "Upsample")
def check_resize(node: Any) -> str | None:
    a = attrs(node)
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel" if node.op_type == "Resize" else "asymmetric")
    if node.op_type == "Upsample":
        ctm = "asymmetric"
    if mode == "nearest":
        nm = a.get("nearest_mode", "round_prefer_floor" if node.op_type == "Resize" else "floor")
        if node.op_type == "Upsample":
            nm = "floor"
        if (ctm, nm) not in _NEAREST_OK:
            return f"Resize nearest with coordinate_transformation_mode={ctm!r}, nearest_mode={nm!r}"
    elif mode == "linear":
        if ctm not in _LINEAR_OK:
            return f"Resize linear with coordinate_transformation_mode={ctm!r}"
        if a.get("antialias", 0):
            return "Resize linear with antialias"
    else:
        return f"Resize mode {mode!r}"
    if a.get("axes") is not None:
        return "Resize with axes"
    return None


@op("Resize", "Upsample")
def op_resize(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    a = attrs(node)
    if node.op_type == "Upsample":
        scales, sizes = inputs[1], None
    else:
        scales = inputs[2] if len(inputs) > 2 else None
        sizes = inputs[3] if len(inputs) > 3 else None
    if isinstance(scales, GTensor) or isinstance(sizes, GTensor):
        raise ValueError("Resize with runtime scales or sizes")
    if sizes is not None and np.size(sizes):
        out = tuple(int(s) for s in np.asarray(sizes).reshape(-1))
    elif scales is not None and np.size(scales):
        sc = np.asarray(scales, dtype=np.float64).reshape(-1)
        out = tuple(int(math.floor(d * s)) for d, s in zip(x.shape, sc))
    else:
        raise ValueError("Resize without scales or sizes")
    if x.rank > 2 and out[:-2] != x.shape[:-2] and a.get("mode", "nearest") == "linear":
        raise ValueError("linear Resize of other than the last two axes")
    g = ggml_lib()
    mode = g.GGML_SCALE_MODE_NEAREST
    if a.get("mode", "nearest") == "linear":
        mode = g.GGML_SCALE_MODE_BILINEAR
        if a.get("coordinate_transformation_mode", "half_pixel") == "align_corners":
            mode |= g.GGML_SCALE_FLAG_ALIGN_CORNERS
    x = cont(lowering, x)
    ne, xne = ne_of(out), ne_of(x.shape)
    if (mode == g.GGML_SCALE_MODE_NEAREST and lowering.on_cpu and x.dtype == "float32" and ne[2:] == xne[2:]
            and min(xne) > 0 and ne[0] % xne[0] == 0 and ne[1] % xne[1] == 0):
        from ..native_ops import native_ops, upscale

        ops = native_ops()
        if ops is not None:  # whole factors: sdrt's row copies (native/copy.c), on the ops' pool
            return [GTensor(upscale(ops, g, lowering.ctx, x.ptr, tuple(ne)), out)]
    return [GTensor(g.ggml_interpolate(lowering.ctx, x.ptr, *ne, mode), out)]
