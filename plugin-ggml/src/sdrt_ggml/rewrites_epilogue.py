"""Fusions into the native conv's and GEMM's epilogues (``conv_epilogue``), matched while lowering.

A native conv (``ops.conv_kernels.conv_emit``) or GEMM (``ops.op_matmul.gemm_emit``) stores each
tile with its bias added; these rewrites let it also add what the next node adds and apply what
the next node applies, so that the node itself emits nothing and the output is written once:

- ``Add`` of a runtime per-channel bias (N, C, 1, 1) to a conv: the UNet ResNet's time embedding;
- ``Add`` of a constant of N values to a GEMM: a Linear layer's bias (MatMul + Add);
- ``Add`` of a runtime tensor shaped as the output: a residual (ResNet, transformer, MobileNet
  blocks);
- ``Relu``, ``Clip`` (constant bounds, ReLU6), ``HardSwish``: the activation, last (also into the
  native depthwise conv, which takes no additions).

The value must have no other reader, and nothing is fused after the activation. The op is
emitted again with the larger epilogue; the earlier one is left unreferenced, so ggml never
computes it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .ops._common import GTensor, Value, attrs, cont, ggml_lib, scalar_of
from .ops.conv_kernels import ConvSpec, conv_emit, conv_spec_of
from .ops.op_matmul import gemm_emit, gemm_spec_of
from .rewrites import rewrite


def _fusable(lowering: Any, name: str) -> ConvSpec | None:
    """The spec of the native conv that produced ``name``, when its epilogue can take more."""
    spec = conv_spec_of(lowering, lowering.values.get(name))
    if spec is None or spec.act is not None or lowering.n_uses(name) != 1 or name in lowering.output_names:
        return None
    return spec


def _gemm_add(lowering: Any, node: Any) -> list[Value] | None:
    """MatMul + Add: a constant bias of N values (before any residual), or a residual."""
    for i in (0, 1):
        name = node.input[i]
        spec = gemm_spec_of(lowering, lowering.values.get(name))
        if spec is None or lowering.n_uses(name) != 1 or name in lowering.output_names:
            continue
        other = lowering.values.get(node.input[1 - i])
        out_shape = spec.batch + (spec.m, spec.n)
        if isinstance(other, np.ndarray) and other.dtype.kind == "f" and spec.bias is None and spec.res is None:
            if other.size == spec.n and other.shape[-1:] == (spec.n,) and len(other.shape) <= len(out_shape):
                b = lowering.const(other, transform=lambda v: np.asarray(v, np.float32).reshape(-1), tag="gemm_bias")
                return [gemm_emit(lowering, replace(spec, bias=b.ptr))]
        if isinstance(other, GTensor) and other.dtype == "float32" and other.shape == out_shape and spec.res is None:
            return [gemm_emit(lowering, replace(spec, res=cont(lowering, other).ptr))]
    return None


@rewrite("conv_epilogue", "Add")
def match_conv_add(lowering: Any, node: Any) -> list[Value] | None:
    fused = _gemm_add(lowering, node)
    if fused is not None:
        return fused
    g = ggml_lib()
    for i in (0, 1):
        spec = _fusable(lowering, node.input[i])
        other = lowering.values.get(node.input[1 - i])
        if spec is None or spec.depthwise or not isinstance(other, GTensor) or other.dtype != "float32":
            continue
        n, oc, oh, ow = spec.out_shape
        if other.shape == spec.out_shape and spec.res is None:
            return [conv_emit(lowering, replace(spec, res=cont(lowering, other).ptr))]
        per_channel = (1,) * (4 - other.rank) + other.shape if other.rank <= 4 else None
        if per_channel in ((n, oc, 1, 1), (1, oc, 1, 1)) and spec.rbias is None and spec.res is None:
            if per_channel[0] != n:  # one bias for every batch item: the op reads (OC, N)
                if n != 1:
                    continue
            rb = g.ggml_reshape_2d(lowering.ctx, cont(lowering, other).ptr, oc, n)
            return [conv_emit(lowering, replace(spec, rbias=rb))]
    return None


def _act(lowering: Any, node: Any, act: str, lo: float = 0.0, hi: float = 0.0) -> list[Value] | None:
    spec = _fusable(lowering, node.input[0])
    if spec is None:
        return None
    return [conv_emit(lowering, replace(spec, act=act, lo=lo, hi=hi))]


@rewrite("conv_epilogue", "Relu")
def match_conv_relu(lowering: Any, node: Any) -> list[Value] | None:
    return _act(lowering, node, "relu")


@rewrite("conv_epilogue", "HardSwish")
def match_conv_hardswish(lowering: Any, node: Any) -> list[Value] | None:
    return _act(lowering, node, "hardswish")


@rewrite("conv_epilogue", "Clip")
def match_conv_clip(lowering: Any, node: Any) -> list[Value] | None:
    a = attrs(node)
    lo, hi = a.get("min", -np.inf), a.get("max", np.inf)  # opset < 11
    if len(node.input) > 1 and node.input[1]:
        lo = scalar_of(lowering.values.get(node.input[1]))
    if len(node.input) > 2 and node.input[2]:
        hi = scalar_of(lowering.values.get(node.input[2]))
    if lo is None or hi is None:
        return None  # bounds computed at run time
    f32 = np.finfo(np.float32)
    return _act(lowering, node, "clip", float(max(lo, f32.min)), float(min(hi, f32.max)))


@rewrite("conv_epilogue", "Conv")
def match_conv_channel_scale(lowering: Any, node: Any) -> list[Value] | None:
    """Conv(x * s), s a runtime (N, C, 1, 1) gate (MobileNetV3's squeeze-excitation): the native
    implicit GEMM scales each column as it packs it, so the Mul (and its broadcast) emit nothing."""
    from .ops.op_conv import _conv_params, conv2d

    mul = lowering.producer(node.input[0])
    w = lowering.values.get(node.input[1])
    if mul is None or mul.op_type != "Mul" or lowering.n_uses(node.input[0]) != 1 or not isinstance(w, np.ndarray):
        return None
    if w.ndim != 4 or int(attrs(node).get("group", 1)) != 1:
        return None
    for i in (0, 1):
        x0, s = lowering.values.get(mul.input[i]), lowering.values.get(mul.input[1 - i])
        if not isinstance(x0, GTensor) or not isinstance(s, GTensor) or x0.rank != 4 or s.rank != 4:
            continue
        n, c = x0.shape[:2]
        if x0.dtype != "float32" or s.dtype != "float32" or s.shape not in ((n, c, 1, 1), (1, c, 1, 1)) or (
                s.shape[0] != n and n != 1):
            continue
        bias = lowering.values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        strides, dil, pads = _conv_params(node, 2, w.shape[2:], x0.shape[2:])
        gate = ggml_lib().ggml_reshape_2d(lowering.ctx, cont(lowering, s).ptr, c, n)
        x0 = replace(x0, pairs=None)  # x0 has the Mul as a reader
        y = conv2d(lowering, x0, w, bias, strides, dil, [pads[0], pads[1], pads[2], pads[3]], 1, cscale=gate)
        return None if y is None else [y]
    return None
