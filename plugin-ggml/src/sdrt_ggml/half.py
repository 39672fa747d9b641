"""bf16 and fp16 weights for ggml's mixed matmuls (``precision="bf16"`` / ``"fp16"``).

At a half precision the constant weight of every MatMul, Gemm and dense 2-D Conv (group 1) is stored as
``GGML_TYPE_BF16`` or ``GGML_TYPE_F16`` and multiplied by ``ggml_mul_mat``, whose CPU kernels convert each
activation row to the weight's type (its ``vec_dot_type``) and accumulate in float32: ``vdpbf16ps`` on
AVX-512-BF16 CPUs, AVX-512F/AVX2 widening loads otherwise (ggml-cpu's ``ggml_vec_dot_bf16``); F16C/NEON
fp16 loads for fp16 (``ggml_vec_dot_f16``); on GPUs ggml's own half GEMMs. The weights take half the memory.

Everything else stays float32, as ``sdrt.precision.to_half`` keeps it elsewhere: biases (added after the
product, in float32), norms and their scales (a variance in bf16 loses the image), softmax and attention
(sdrt-ggml's float32 kernels; their operands are activations, not weights), depthwise and grouped convs
(sdrt-ggml's float32 depthwise kernel; few weights), and MatMuls of two activations. sdrt-ggml's native
float32 GEMM and conv kernels are bypassed for the weights stored half: ggml's kernels read them.

At bf16 on the CPU device with sdrt-ggml's native kernels loaded, the weights of MatMul, Gemm
and dense convs instead go to the native GEMM and implicit-GEMM conv as bf16 panels and rows
(``native.pack_b_bf16``, ``native.bf16_rows``; ``native.bf16_for`` says when): ``vdpbf16ps`` with each activation block rounded to bf16 where
the CPU has AVX-512-BF16, else the bf16 weights widened to float32 block by block for the float32 kernels (bf16
weights' values and memory, float32 activations, the float32 kernels' speed). The Winograd conv stays float32
(its transformed weights are not the model's); 3x3 convs take the implicit GEMM at bf16.

The roundings are round-to-nearest-even, as numpy's float16 and ggml's ``ggml_fp32_to_bf16_row`` do (NaN stays
NaN); a finite weight beyond fp16's range is clipped to +-65504 at fp16, as ``sdrt.precision.to_half`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: precision -> (numpy storage dtype, ggml type name)
KINDS = {"bf16": ("uint16", "GGML_TYPE_BF16"), "fp16": ("float16", "GGML_TYPE_F16")}


def kind(lowering: Any) -> str | None:
    """``"bf16"`` or ``"fp16"`` when the lowering stores weights half, else None (float32)."""
    p = lowering.options.get("precision")
    return p if p in KINDS else None


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    out = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def round_to(precision: str, a: np.ndarray) -> np.ndarray:
    """``a`` rounded to ``precision`` (bf16 or fp16) and back to float32: what the half weight holds."""
    if precision == "bf16":
        return (bf16_bits(a).astype(np.uint32) << np.uint32(16)).view(np.float32)
    if precision == "fp16":
        return encode("fp16", a).astype(np.float32)
    raise ValueError(f"not a half precision: {precision!r}")


def encode(precision: str, a: np.ndarray) -> np.ndarray:
    """``a`` as the array ggml's half type holds: bf16 bit patterns (uint16), or float16 with finite values
    beyond its range clipped to +-65504 (``sdrt.precision.half_array``, as ``to_half`` stores weights)."""
    if precision == "bf16":
        return bf16_bits(a)
    from sdrt.precision import half_array

    return half_array(a, "float16")


def weight(lowering: Any, arr: np.ndarray, transform: Callable[[np.ndarray], np.ndarray] | None = None,
           tag: str = "") -> Any:
    """A weights tensor of the lowering's half type holding ``transform(arr)`` (ggml_mul_mat's first operand
    when ``transform`` gives (..., N, K)); ``update_weights`` encodes new values the same way."""
    p = kind(lowering)
    assert p is not None
    storage, gtype = KINDS[p]

    def to_half(v: np.ndarray) -> np.ndarray:
        return encode(p, np.asarray(transform(v) if transform is not None else v, np.float32))

    lowering.used(f"mul_mat {p}")
    return lowering.const(arr, transform=to_half, tag=f"{p}{tag}", dtype=storage, ggml_type=gtype)

