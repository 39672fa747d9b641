"""Normalizations. MIL has no group norm: GroupNorm (torch's Reshape -> InstanceNormalization ->
Reshape -> Mul -> Add pattern, and ONNX's GroupNormalization) becomes a reshape to
(N, groups, -1), ``layer_norm`` over the last axis, a reshape back and a per-channel affine.
InstanceNormalization is ``layer_norm`` over the spatial axes, so the torch pattern needs no
rewrite: each of its nodes lowers to what a fused group norm would emit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sdrt.lowering import check_batch_norm, check_layer_norm

from . import check, op
from ._common import Value, attrs, mb, norm_axis, np_dtype, rank, shape, var


def affine(lw: Any, y: Any, scale: Value, bias: Value, bshape: tuple[int, ...]) -> Any:
    """y * scale + bias with scale/bias reshaped to ``bshape``; identity scale and zero bias are skipped."""
    if scale is not None and not (isinstance(scale, np.ndarray) and np.all(scale == 1)):
        s = scale.reshape(bshape) if isinstance(scale, np.ndarray) else mb().reshape(x=scale, shape=list(bshape))
        y = mb().mul(x=y, y=var(lw, s, like=y, source=scale if isinstance(scale, np.ndarray) else None))
    if bias is not None and not (isinstance(bias, np.ndarray) and not np.any(bias)):
        b = bias.reshape(bshape) if isinstance(bias, np.ndarray) else mb().reshape(x=bias, shape=list(bshape))
        y = mb().add(x=y, y=var(lw, b, like=y, source=bias if isinstance(bias, np.ndarray) else None))
    return y


def group_norm(lw: Any, x: Any, groups: int, eps: float, scale: Value, bias: Value) -> Any:
    n, c, *rest = shape(x)
    if c % groups:
        raise ValueError(f"{c} channels do not split into {groups} groups")
    g = mb().reshape(x=x, shape=[n, groups, (c // groups) * math.prod(rest)])
    g = mb().layer_norm(x=g, axes=[-1], epsilon=np_dtype(x).type(eps))
    y = mb().reshape(x=g, shape=[n, c, *rest])
    return affine(lw, y, scale, bias, (c,) + (1,) * len(rest))


@op("InstanceNormalization")
def op_instance_norm(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    r = rank(x)
    if r < 3:
        raise ValueError(f"InstanceNormalization of a rank-{r} tensor")
    eps = float(attrs(node).get("epsilon", 1e-5))
    y = mb().layer_norm(x=x, axes=list(range(2, r)), epsilon=np_dtype(x).type(eps))
    return [affine(lw, y, inputs[1], inputs[2], (shape(x)[1],) + (1,) * (r - 2))]


@op("GroupNormalization")
def op_group_norm(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    groups, c = int(a["num_groups"]), shape(x)[1]
    scale, bias = inputs[1], inputs[2]
    if lw.opset < 21:  # opset 18: one scale and bias per group
        scale, bias = (np.repeat(v.reshape(-1), c // v.size) if isinstance(v, np.ndarray) and v.size != c else v
                       for v in (scale, bias))
    return [group_norm(lw, x, groups, float(a.get("epsilon", 1e-5)), scale, bias)]


check("LayerNormalization")(check_layer_norm)


@op("LayerNormalization")
def op_layer_norm(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    r = rank(x)
    axis = norm_axis(int(a.get("axis", -1)), r)
    eps = np_dtype(x).type(float(a.get("epsilon", 1e-5)))
    norm_shape = shape(x)[axis:]
    scale, bias = inputs[1], inputs[2] if len(inputs) > 2 else None
    consts = all(v is None or (isinstance(v, np.ndarray) and v.size == math.prod(norm_shape)) for v in (scale, bias))
    if consts:  # gamma and beta inside the op: one named constant each
        kw: dict[str, Any] = {}
        if scale is not None:
            kw["gamma"] = var(lw, scale.reshape(norm_shape), like=x, source=scale)
        if bias is not None:
            kw["beta"] = var(lw, bias.reshape(norm_shape), like=x, source=bias)
        return [mb().layer_norm(x=x, axes=list(range(axis, r)), epsilon=eps, **kw)]
    y = mb().layer_norm(x=x, axes=list(range(axis, r)), epsilon=eps)
    return [affine(lw, y, scale, bias, norm_shape)]


check("BatchNormalization")(check_batch_norm)


@op("BatchNormalization")
def op_batch_norm(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """Inference BatchNorm as one per-channel multiply-add (Core ML fuses it into the conv before it)."""
    x = var(lw, inputs[0])
    scale, bias, mean, variance = inputs[1:5]
    if not all(isinstance(v, np.ndarray) for v in (scale, bias, mean, variance)):
        raise ValueError("BatchNormalization with runtime statistics")
    eps = float(attrs(node).get("epsilon", 1e-5))
    mul = scale.astype(np.float64) / np.sqrt(variance.astype(np.float64) + eps)
    add = bias.astype(np.float64) - mean.astype(np.float64) * mul
    bshape = (shape(x)[1],) + (1,) * (rank(x) - 2)
    y = mb().mul(x=x, y=var(lw, mul.reshape(bshape), like=x))
    return [mb().add(x=y, y=var(lw, add.reshape(bshape), like=x))]
