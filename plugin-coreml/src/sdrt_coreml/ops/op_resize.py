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
#: ONNX Resize's source coordinate of output index i (float32, as onnxruntime computes it): in size n, out size m,
#: scale s; and its nearest-mode rounding
_SOURCE = {
    "half_pixel": lambda i, n, m, s: (i + 0.5) / s - 0.5,
    "pytorch_half_pixel": lambda i, n, m, s: (i + 0.5) / s - 0.5 if m > 1 else np.zeros_like(i),
    "asymmetric": lambda i, n, m, s: i / s,
    "align_corners": lambda i, n, m, s: i * np.float32(n - 1) / np.float32(m - 1) if m > 1 else np.zeros_like(i),
    "tf_half_pixel_for_nn": lambda i, n, m, s: (i + 0.5) / s,
}
_ROUND = {
    "floor": np.floor, "ceil": np.ceil,
    "round_prefer_floor": lambda x: np.where(x - np.floor(x) == 0.5, np.floor(x), np.round(x)),
    "round_prefer_ceil": lambda x: np.where(x - np.floor(x) == 0.5, np.ceil(x), np.round(x)),
}
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
        return None if ctm in _SOURCE and pick in _ROUND else f"nearest with {ctm}/{pick}"
    if mode in ("linear", "bilinear"):
        if a.get("antialias", 0):
            return "linear with antialias"
        return None if ctm in _LINEAR else f"linear with {ctm}"
    return f"mode={mode}"


def _scales(x: Any, node: Any, inputs: list[Value]) -> tuple[tuple[float, int, np.float32], ...]:
    """Per spatial axis (H, W): the factor, the output's size, and the factor in float32 as onnxruntime takes it
    (``float(out) / float(in)`` from sizes) for the source coordinates."""
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
        f32 = [np.float32(o) / np.float32(i) for o, i in zip(out, s)]
    elif isinstance(scales, np.ndarray) and scales.size:
        f32 = [np.float32(v) for v in scales.reshape(-1)]
        f = [float(v) for v in f32]
        out = [int(np.floor(i * v)) for i, v in zip(s, f)]
    else:
        raise ValueError(f"{node.op_type} needs constant scales or sizes")
    if f[0] != 1 or f[1] != 1:
        raise ValueError("resizing the batch or channel axis")
    return (f[2], out[2], f32[2]), (f[3], out[3], f32[3])


def _nearest_indices(n: int, m: int, f: np.float32, ctm: str, pick: str) -> np.ndarray:
    """The source index of each of the ``m`` outputs of a nearest resize of a side of ``n`` by ``f``, as ONNX
    defines it (in float32, as onnxruntime computes it)."""
    i = np.arange(m, dtype=np.float32)
    x = _SOURCE[ctm](i, n, m, f).astype(np.float32)
    return np.clip(_ROUND[pick](x), 0, n - 1).astype(np.int32)


@op("Resize", "Upsample")
def op_resize(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    (fh, oh, fh32), (fw, ow, fw32) = _scales(x, node, inputs)
    ctm = a.get("coordinate_transformation_mode", "half_pixel" if node.op_type == "Resize" else "asymmetric")
    if a.get("mode", "nearest") == "nearest":
        pick = a.get("nearest_mode", "round_prefer_floor" if node.op_type == "Resize" else "floor")
        whole = fh == int(fh) and fw == int(fw) and fh >= 1 and fw >= 1
        if whole and (node.op_type == "Upsample" or (ctm, pick) in _NEAREST_OK):
            return [mb().upsample_nearest_neighbor(x=x, scale_factor_height=int(fh), scale_factor_width=int(fw))]
        # any other factor (a UNet's upsampler at a side that is not a multiple of 64: 12 -> 23) or rounding: pick
        # the source rows, then columns, by constant indices; gather is exact and has a value inference
        for axis, f, m in ((2, fh32, oh), (3, fw32, ow)):
            idx = _nearest_indices(shape(x)[axis], m, f, ctm, pick)
            x = mb().gather(x=x, indices=idx, axis=axis)
        return [x]
    align, half = _LINEAR[ctm]
    kw = {"half_pixel_centers": half} if lw.opset_mil >= 16 else {}
    if half and lw.opset_mil < 16:
        raise ValueError("half-pixel linear resize needs a macOS13/iOS16 target or newer")
    return [mb().upsample_bilinear(x=x, scale_factor_height=float(fh), scale_factor_width=float(fw),
                                   align_corners=align, **kw)]
