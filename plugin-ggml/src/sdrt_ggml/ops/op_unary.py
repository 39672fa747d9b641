"""Unary elementwise ops: activations and math functions."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdrt.lowering import check_gelu

from . import check, op
from ._common import GTensor, Value, attrs, binary, cont, ggml_lib, scalar_of


def _unary(fn: str) -> Any:
    def lower(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
        x = inputs[0]
        if not isinstance(x, GTensor) or x.dtype != "float32":
            raise ValueError(f"{node.op_type} on a non-float tensor")
        x = cont(lowering, x)
        f = getattr(ggml_lib(), fn)
        return [GTensor(f(lowering.ctx, x.ptr), x.shape, cl=f(lowering.ctx, x.cl) if x.cl is not None else None)]

    lower.__name__ = "op_" + fn.removeprefix("ggml_")
    return lower


for _name, _fn in {
    "Relu": "ggml_relu", "Sigmoid": "ggml_sigmoid", "Tanh": "ggml_tanh", "Exp": "ggml_exp",
    "Log": "ggml_log", "Sqrt": "ggml_sqrt", "Neg": "ggml_neg", "Abs": "ggml_abs", "Softplus": "ggml_softplus",
    "Sin": "ggml_sin", "Cos": "ggml_cos", "Floor": "ggml_floor",
    "Ceil": "ggml_ceil",
}.items():
    op(_name)(_unary(_fn))


@op("Identity")
def op_identity(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [inputs[0]]


@op("Dropout")
def op_dropout(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """Inference: identity. Training mode (a true or runtime training_mode input) is not supported."""
    training = inputs[2] if len(inputs) > 2 else None
    if training is not None and (not isinstance(training, np.ndarray) or bool(training.reshape(-1)[0])):
        raise ValueError("Dropout in training mode")
    x = inputs[0]
    shape = x.shape if isinstance(x, GTensor) else np.shape(x)
    return [x, np.ones(shape, dtype=bool)]  # inference: nothing dropped, the mask is all true


@op("Cast")
def op_cast(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    from onnx import TensorProto

    x = inputs[0]
    to = attrs(node)["to"]
    assert isinstance(x, GTensor)
    if to in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16):
        if x.dtype == "float32":
            return [x]  # computation stays in float32 throughout
        if x.dtype != "int32":  # a small integer carried exactly in float32
            return [GTensor(x.ptr, x.shape, "float32")]
        x = cont(lowering, x)
        g = ggml_lib()
        return [GTensor(g.ggml_cast(lowering.ctx, x.ptr, g.GGML_TYPE_F32), x.shape)]
    if to in (TensorProto.INT64, TensorProto.INT32) and x.dtype == "int32":
        return [x]
    from onnx import helper

    if helper.tensor_dtype_to_np_dtype(to).name == x.dtype:
        return [x]
    raise ValueError(f"Cast of a runtime {x.dtype} tensor to ONNX type {to}")


@op("Reciprocal")
def op_reciprocal(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    one = lowering.const(np.ones((1,), np.float32), tag="one")
    return [binary(lowering, "ggml_div", one, inputs[0], False)]


@op("LeakyRelu")
def op_leaky_relu(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = cont(lowering, inputs[0])
    alpha = float(attrs(node).get("alpha", 0.01))
    return [GTensor(ggml_lib().ggml_leaky_relu(lowering.ctx, x.ptr, alpha, False), x.shape)]


@op("Elu")
def op_elu(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    if float(attrs(node).get("alpha", 1.0)) != 1.0:
        raise ValueError("Elu with alpha != 1")
    x = cont(lowering, inputs[0])
    return [GTensor(ggml_lib().ggml_elu(lowering.ctx, x.ptr), x.shape)]


check("Gelu")(check_gelu)


@op("Gelu")
def op_gelu(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    g = ggml_lib()
    if attrs(node).get("approximate", "none") != "tanh":
        x = cont(lowering, inputs[0])
        return [GTensor(g.ggml_gelu_erf(lowering.ctx, x.ptr), x.shape)]
    from .op_matmul import fuse_gemm_act

    fused = fuse_gemm_act(lowering, str(node.input[0]), 1, "gelu_tanh")  # into a native GEMM's epilogue
    if fused is not None:
        return [fused]
    x = cont(lowering, inputs[0])
    # ggml_gelu uses an fp16 table on the CPU: build the tanh form from exact ops instead
    x3 = g.ggml_mul(lowering.ctx, g.ggml_sqr(lowering.ctx, x.ptr), x.ptr)
    inner = g.ggml_add(lowering.ctx, x.ptr, g.ggml_scale(lowering.ctx, x3, 0.044715))
    t = g.ggml_tanh(lowering.ctx, g.ggml_scale(lowering.ctx, inner, float(np.sqrt(2.0 / np.pi))))
    half = g.ggml_scale_bias(lowering.ctx, t, 0.5, 0.5)
    return [GTensor(g.ggml_mul(lowering.ctx, x.ptr, half), x.shape)]


@op("Clip")
def op_clip(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = cont(lowering, inputs[0])
    a = attrs(node)
    lo = a.get("min", -np.inf) if len(inputs) < 2 or inputs[1] is None else scalar_of(inputs[1])
    hi = a.get("max", np.inf) if len(inputs) < 3 or inputs[2] is None else scalar_of(inputs[2])
    if lo is None or hi is None:
        raise ValueError("Clip with runtime bounds")
    lo = max(float(lo), -3.4e38)
    hi = min(float(hi), 3.4e38)
    g = ggml_lib()
    # ggml_clamp works in place: clamp a copy unless this node is the value's only reader
    shared = lowering.n_uses(node.input[0]) != 1 or lowering.producer(node.input[0]) is None or x.ptr.contents.view_src

    def clamp(t: Any) -> Any:
        return g.ggml_clamp(lowering.ctx, g.ggml_dup(lowering.ctx, t) if shared else t, lo, hi)

    return [GTensor(clamp(x.ptr), x.shape, cl=clamp(x.cl) if x.cl is not None else None)]


@op("HardSigmoid")
def op_hard_sigmoid(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = cont(lowering, inputs[0])
    a = attrs(node)
    alpha, beta = float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))
    g = ggml_lib()

    def hs(t: Any) -> Any:
        return g.ggml_clamp(lowering.ctx, g.ggml_scale_bias(lowering.ctx, t, alpha, beta), 0.0, 1.0)

    return [GTensor(hs(x.ptr), x.shape, cl=hs(x.cl) if x.cl is not None else None)]


@op("Erf")
def op_erf(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """erf(x) = 2 * gelu_erf(z) / z - 1 with z = sqrt(2) * x (ggml has gelu_erf, not erf).

    The GELU pattern x * 0.5 * (1 + erf(x / sqrt(2))) never reaches this: the
    rewrite in ``op_fused`` turns it into one ``ggml_gelu_erf``.
    """
    x = cont(lowering, inputs[0])
    g = ggml_lib()
    z = g.ggml_scale_bias(lowering.ctx, x.ptr, float(np.sqrt(2.0)), 1e-30)  # offset keeps z != 0 for x == 0
    phi = g.ggml_div(lowering.ctx, g.ggml_gelu_erf(lowering.ctx, z), z)
    return [GTensor(g.ggml_scale_bias(lowering.ctx, phi, 2.0, -1.0), x.shape)]


@op("HardSwish")
def op_hard_swish(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """x * clamp(x / 6 + 1/2, 0, 1) from vectorised ops: ggml's own hardswish is a scalar
    per-element loop (7x slower on a 96x56x56 map)."""
    x = cont(lowering, inputs[0])
    g = ggml_lib()

    def hs(t: Any) -> Any:
        return g.ggml_mul(lowering.ctx, t, g.ggml_clamp(lowering.ctx, g.ggml_scale_bias(lowering.ctx, t, 1.0 / 6.0, 0.5), 0.0, 1.0))

    return [GTensor(hs(x.ptr), x.shape, cl=hs(x.cl) if x.cl is not None else None)]


@op("PRelu")
def op_prelu(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """``relu(x) - slope * relu(-x)``, the slope broadcast as numpy's (per channel ``[C, 1, 1]`` in ArcFace's
    iResNet, InsightFace's ``w600k_r50.onnx``)."""
    x = inputs[0]
    if not isinstance(x, GTensor) or x.dtype != "float32":
        raise ValueError("PRelu on a non-float tensor")
    x = cont(lowering, x)
    g = ggml_lib()
    pos = GTensor(g.ggml_relu(lowering.ctx, x.ptr), x.shape)
    neg = GTensor(g.ggml_relu(lowering.ctx, g.ggml_neg(lowering.ctx, x.ptr)), x.shape)
    return [binary(lowering, "ggml_sub", pos, binary(lowering, "ggml_mul", neg, inputs[1], True), False)]
