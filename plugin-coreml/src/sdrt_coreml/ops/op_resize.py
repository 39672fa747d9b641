"""Resize (nearest and linear) on NCHW tensors, and Upsample."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import check, op
from ._common import Value, attrs, mb, shape, var

#: nearest picks that equal floor(i / s) for integer scales s (see docs/coreml.md)
_NEAREST_OK = {("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("half_pixel", "round_prefer_ceil"),
               ("pytorch_half_pixel", "round_prefer_floor"), ("pytorch_half_pixel", "round_prefer_ceil"),
               ("half_pixel", "floor"), ("pytorch_half_pixel", "floor")}
_LINEAR = {"half_pixel": (False, True), "pytorch_half_pixel": (False, True), "align_corners": (True, False),
           "asymmetric": (False, False)}


@check("Resize", "Upsample")
def check_resize(node: Any) -> str | None:
    a = attrs(node)
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel" if node.op_type == "Resize" else "asymmetric")
    if mode == "nearest":
        pick = a.get("nearest_mode", "round_prefer_floor" if node.op_type == "Resize" else "floor")
        if node.op_type == "Upsample":
            return None
        return None if (ctm, pick) in _NEAREST_OK else f"nearest with {ctm}/{pick}"
    if mode in ("linear", "bilinear"):
        if a.get("antialias", 0):
            return "linear with antialias"
        return None if ctm in _LINEAR else f"linear with {ctm}"
    return f"mode={mode}"


def _scales(x: Any, node: Any, inputs: list[Value]) -> tuple[float, float]:
    s = shape(x)
    if len(s) != 4:
        raise ValueError(f"{node.op_type} of a rank-{len(s)} tensor (NCHW only)")
    scales = inputs[2] if len(inputs) > 2 else None
    sizes = inputs[3] if len(inputs) > 3 else None
    if node.op_type == "Upsample":
        scales = inputs[1] if len(inputs) > 1 else np.asarray(attrs(node)["scales"], np.float32)
    if isinstance(sizes, np.ndarray) and sizes.size:
        out = [int(v) for v in sizes.reshape(-1)]
        f = [o / i for o, i in zip(out, s)]
    elif isinstance(scales, np.ndarray) and scales.size:
        f = [float(v) for v in scales.reshape(-1)]
    else:
        raise ValueError(f"{node.op_type} needs constant scales or sizes")
    if f[0] != 1 or f[1] != 1:
        raise ValueError("resizing the batch or channel axis")
    return f[2], f[3]


@op("Resize", "Upsample")
def op_resize(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    fh, fw = _scales(x, node, inputs)
    if a.get("mode", "nearest") == "nearest":
        if fh != int(fh) or fw != int(fw) or fh < 1 or fw < 1:
            raise ValueError(f"nearest resize by {fh}x{fw} (only whole upscale factors)")
        return [mb().upsample_nearest_neighbor(x=x, scale_factor_height=int(fh), scale_factor_width=int(fw))]
    ctm = a.get("coordinate_transformation_mode", "half_pixel" if node.op_type == "Resize" else "asymmetric")
    align, half = _LINEAR[ctm]
    kw = {"half_pixel_centers": half} if lw.opset_mil >= 16 else {}
    if half and lw.opset_mil < 16:
        raise ValueError("half-pixel linear resize needs a macOS13/iOS16 target or newer")
    return [mb().upsample_bilinear(x=x, scale_factor_height=float(fh), scale_factor_width=float(fw),
                                   align_corners=align, **kw)]
