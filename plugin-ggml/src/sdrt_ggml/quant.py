"""ONNX quantized weights as ggml's own block types, for ggml's quantized matmuls.

A ``DequantizeLinear`` whose inputs are all initializers is folded while lowering by ``fold``. A 2-D
weight whose layout maps onto ggml's blocks becomes a ``BlockMatrix``, the form a GGUF file's weights
take, so the lowering treats both alike: a MatMul or Gemm reading it along its blocks runs ggml's
quantized mul_mat on them, a Transpose flips a flag, and any other op reads its float32 values
(``Lowering.dequantized``). The float32 values of such a weight are never made otherwise; they used to
be, for every weight (the whole model's float32 copy, and most of a quantized model's load time).

- ``Q8_0`` (blocks of 32 int8 with one fp16 scale): int8 per output channel (each block takes its
  channel's scale) or int8 in blocks of a multiple of 32;
- ``Q4_0`` (blocks of 32 4-bit values, ``(q + 8)`` nibbles, one fp16 scale): int4 in blocks of a
  multiple of 32 along the reduction axis.

The reduction axis is the quantization's own: per-channel scales run along the output channels (the
other axis is K), blocks along K. sdrt's quantizer rounds scales to fp16 values, so both are exact; a
scale that fp16 cannot hold, a zero point, or a layout that does not map (K not whole blocks of 32)
folds to float32 values (in numpy, one pass). ggml's quantized matmul quantizes the activations to
8-bit blocks on the fly (``vec_dot_q4_0_q8_0``: as llama.cpp and stable-diffusion.cpp run), so its
results match the reference within that rounding, not bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sdrt.quantization import dequantize_array
from sdrt.weights.blocks import BlockMatrix

QK = 32
_FLOAT = 1  # TensorProto.FLOAT


def fold(node: Any, ins: list[Any]) -> BlockMatrix | np.ndarray | None:
    """The constant ``DequantizeLinear`` ``node`` on ``ins``: ggml blocks when they hold its values exactly,
    else its float32 values; None where onnx's reference op should fold it (another output type)."""
    at = {a.name: a.i for a in node.attribute}
    q = np.asarray(ins[0])
    scale = np.asarray(ins[1])
    zp = ins[2] if len(ins) > 2 else None
    if scale.dtype != np.float32 or at.get("output_dtype", _FLOAT) != _FLOAT:
        return None
    if q.dtype.kind not in "iu" and q.dtype.name not in ("int4", "uint4"):
        return None  # float8 / float4 storage
    axis = int(at.get("axis", 1)) % max(q.ndim, 1)
    block = int(at.get("block_size", 0))
    if zp is None or not np.any(np.asarray(zp).astype(np.int64)):
        bm = _blocks(q, scale, axis, block, node.name)
        if bm is not None:
            return bm
    return dequantize_array(q, scale, axis, block, None if zp is None else np.asarray(zp))


def _blocks(q: np.ndarray, s: np.ndarray, axis: int, block: int, source: str) -> BlockMatrix | None:
    """``q`` (2-D int8 or int4) times ``s`` as rows of Q8_0 / Q4_0 blocks, or None when they cannot hold it."""
    if q.ndim != 2 or q.dtype.name not in ("int8", "int4"):
        return None
    if block:
        k_axis = axis
        if block % QK or s.shape[k_axis] * block != q.shape[k_axis]:
            return None
        per_k = np.repeat(s, block // QK, axis=k_axis)  # one scale per 32 along K
        d = per_k if k_axis == 1 else per_k.T  # (N, K/32)
    else:
        k_axis = 1 - axis
        if s.shape != (q.shape[axis],):
            return None  # per tensor: no axis says which is K
        d = np.repeat(s[:, None], q.shape[k_axis] // QK, axis=1)
    k = q.shape[k_axis]
    if k % QK:
        return None
    d16 = d.astype(np.float16)
    if not np.array_equal(d16.astype(np.float32), d):
        return None  # not exact in fp16
    rows = (q if k_axis == 1 else q.T).astype(np.int8)  # (N, K): the weight as ggml_mul_mat reads it
    n = rows.shape[0]
    vals = rows.reshape(n, k // QK, QK)
    head = np.ascontiguousarray(d16).view(np.uint8).reshape(n, k // QK, 2)
    if q.dtype.name == "int8":
        body, kind = vals.view(np.uint8), "Q8_0"
    else:
        nib = (vals + 8).astype(np.uint8)
        body, kind = nib[..., :16] | (nib[..., 16:] << 4), "Q4_0"
    data = np.ascontiguousarray(np.concatenate([head, body], axis=2).reshape(n, -1))
    return BlockMatrix(kind, data, n, k, transposed=k_axis == 0, source=f"DequantizeLinear {source}".strip())


# -- GGUF block types kept as stored ------------------------------------------------------------------
#: plain (not block) types: never passed as blocks
_PLAIN = frozenset({"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"})


def gguf_types() -> frozenset[str]:
    """The ggml block types this ggml build's CPU ``mul_mat`` takes as its weight: every type whose CPU traits
    have a ``vec_dot`` (it quantizes the activations to that type's ``vec_dot_type``, Q8_0/Q8_1/Q8_K)."""
    global _GGUF_TYPES
    if _GGUF_TYPES is None:
        import ctypes
        import sys

        from .bindings import ggml_lib

        g = ggml_lib()
        found = set()
        for name in dir(sys.modules["ggml"]):
            if not name.startswith("GGML_TYPE_") or name == "GGML_TYPE_COUNT" or name[10:] in _PLAIN:
                continue
            traits = g.ggml_get_type_traits_cpu(getattr(g, name))
            if traits and ctypes.cast(traits.contents.vec_dot, ctypes.c_void_p).value:
                found.add(name[10:])
        _GGUF_TYPES = frozenset(found)
    return _GGUF_TYPES


_GGUF_TYPES: frozenset[str] | None = None


def takes_blocks(bm: Any, k_axis: int) -> bool:
    """Whether the ``BlockMatrix`` ``bm`` is a 2-D weight whose reduction axis (``k_axis`` of the initializer) is
    the axis its blocks run along, so its stored rows are ggml_mul_mat's first operand as they are."""
    return k_axis == (0 if bm.transposed else 1)
