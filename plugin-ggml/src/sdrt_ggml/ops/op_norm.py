"""Normalizations: LayerNormalization, GroupNormalization, InstanceNormalization."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sdrt.lowering import check_batch_norm, check_layer_norm

from . import check, op
from ._common import GTensor, Value, attrs, binary, ggml_lib, norm_axis, reshape


def affine(lowering: Any, y: GTensor, scale: Value | None, bias: Value | None, shape: tuple[int, ...]) -> GTensor:
    """y * scale + bias, with scale/bias reshaped to ``shape`` (broadcastable against y)."""
    if scale is not None:
        s = lowering.const(scale) if isinstance(scale, np.ndarray) else scale
        if not (isinstance(scale, np.ndarray) and np.all(scale == 1)):
            y = binary(lowering, "ggml_mul", y, reshape(lowering, s, shape), True)
    if bias is not None:
        if not (isinstance(bias, np.ndarray) and not np.any(bias)):
            b = lowering.const(bias) if isinstance(bias, np.ndarray) else bias
            y = binary(lowering, "ggml_add", y, reshape(lowering, b, shape), True)
    return y


check("LayerNormalization")(check_layer_norm)


@op("LayerNormalization")
def op_layer_norm(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    a = attrs(node)
    axis = norm_axis(int(a.get("axis", -1)), x.rank)
    eps = float(a.get("epsilon", 1e-5))
    rows, cols = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    x2 = reshape(lowering, x, (rows, cols))
    scale, bias = inputs[1], inputs[2] if len(inputs) > 2 else None
    y = _native_layer_norm(lowering, x2, scale, bias, x.shape[axis:], eps)
    if y is None:
        y = GTensor(ggml_lib().ggml_norm(lowering.ctx, x2.ptr, eps), (rows, cols))
        y = affine(lowering, y, scale, bias, (1, cols))
    return [reshape(lowering, y, x.shape)]


def _native_layer_norm(lowering: Any, x2: GTensor, scale: Value, bias: Value | None, norm_shape: tuple[int, ...],
                       eps: float) -> GTensor | None:
    """The layer norm, scale and bias in one native op (native/ops.c) on the CPU when the native kernels
    loaded and the scale and bias are constants; None otherwise (ggml_norm, then a multiply and an add)."""
    if not lowering.on_cpu or not isinstance(scale, np.ndarray) or not (bias is None or isinstance(bias, np.ndarray)):
        return None
    from ..native_ops import layer_norm, native_ops

    ops = native_ops()
    if ops is None:
        return None

    def per_column(v: np.ndarray) -> np.ndarray:  # broadcast over the normalised dims, one value a column
        return np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.float32), norm_shape).reshape(-1))

    g = lowering.const(scale, transform=per_column, tag="ln")
    b = lowering.const(bias if bias is not None else np.zeros(1, np.float32), transform=per_column, tag="ln")
    return GTensor(layer_norm(ops, ggml_lib(), lowering.ctx, x2.ptr, g.ptr, b.ptr, eps), x2.shape)


def group_norm(lowering: Any, x: GTensor, groups: int, eps: float, scale: Value | None, bias: Value | None) -> GTensor:
    """ggml_group_norm over (N, C, ...) with per-channel scale and bias."""
    n, c = x.shape[0], x.shape[1]
    spatial = math.prod(x.shape[2:])
    x4 = reshape(lowering, x, (n, c, 1, spatial))
    y = GTensor(ggml_lib().ggml_group_norm(lowering.ctx, x4.ptr, groups, eps), x4.shape)
    y = affine(lowering, y, scale, bias, (1, c, 1, 1))
    return reshape(lowering, y, x.shape)


def _per_channel(v: Value | None, c: int) -> Value | None:
    if isinstance(v, np.ndarray) and v.size != c:
        return np.repeat(v.reshape(-1), c // v.size)  # opset 18: one value per group
    return v


@op("GroupNormalization")
def op_group_norm(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    a = attrs(node)
    c = x.shape[1]
    return [group_norm(lowering, x, int(a["num_groups"]), float(a.get("epsilon", 1e-5)),
                       _per_channel(inputs[1], c), _per_channel(inputs[2], c))]


@op("InstanceNormalization")
def op_instance_norm(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """Normalize each (n, c) over the spatial dims: ggml_norm on rows of the flattened tensor."""
    x = inputs[0]
    assert isinstance(x, GTensor)
    eps = float(attrs(node).get("epsilon", 1e-5))
    n, c = x.shape[0], x.shape[1]
    spatial = math.prod(x.shape[2:])
    x3 = reshape(lowering, x, (n, c, spatial))
    y = GTensor(ggml_lib().ggml_norm(lowering.ctx, x3.ptr, eps), x3.shape)
    y = affine(lowering, y, inputs[1], inputs[2], (1, c, 1))
    return [reshape(lowering, y, x.shape)]


check("BatchNormalization")(check_batch_norm)


@op("BatchNormalization")
def op_batch_norm(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """Inference BatchNorm as one per-channel multiply-add with folded constants."""
    x, scale, bias, mean, var = inputs[:5]
    assert isinstance(x, GTensor)
    if not all(isinstance(v, np.ndarray) for v in (scale, bias, mean, var)):
        raise ValueError("BatchNormalization with runtime statistics")
    eps = float(attrs(node).get("epsilon", 1e-5))
    mul = (scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)).astype(np.float32)
    add = (bias.astype(np.float64) - mean.astype(np.float64) * mul).astype(np.float32)
    c = x.shape[1]
    shape = (1, c) + (1,) * (x.rank - 2)
    y = binary(lowering, "ggml_mul", x, reshape(lowering, lowering.const(mul), shape), True)
    return [binary(lowering, "ggml_add", y, reshape(lowering, lowering.const(add), shape), True)]
