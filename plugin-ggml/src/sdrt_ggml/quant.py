"""ONNX quantized weights as ggml's own block types, for ggml's quantized matmuls.

A ``DequantizeLinear`` whose inputs are all initializers is folded while lowering (its float32
values stay available to any op); ``tag`` keeps the stored integers and scales beside that array.
When the folded weight is the B of a MatMul (or Gemm), ``blocks`` re-packs it without loss as:

- ``Q8_0`` (blocks of 32 int8 with one fp16 scale): int8 per output channel (each block takes its
  channel's scale) or int8 in blocks of a multiple of 32;
- ``Q4_0`` (blocks of 32 4-bit values, ``(q + 8)`` nibbles, one fp16 scale): int4 in blocks of a
  multiple of 32 along the reduction axis.

sdrt's quantizer rounds scales to fp16 values, so both are exact; a scale that fp16 cannot hold, a
zero point, or a layout that does not map (the reduction axis not whole blocks of 32) leaves the
float32 weight in place. ggml's quantized matmul quantizes the activations to 8-bit blocks on the fly
(``vec_dot_q4_0_q8_0``: as llama.cpp and stable-diffusion.cpp run), so its results match the
reference within that rounding, not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

QK = 32


class QuantArray(np.ndarray):
    """A folded DequantizeLinear's float32 values, with the quantized form they came from."""

    quant: Quantized | None = None


@dataclass(frozen=True)
class Quantized:
    values: np.ndarray  # int8 or ml_dtypes.int4
    scale: np.ndarray  # float32
    axis: int
    block_size: int


def tag(out: np.ndarray, node: Any, ins: list[Any]) -> np.ndarray:
    """``out`` (the folded value) carrying the quantized inputs of ``node``, when ggml could use them."""
    if len(ins) > 2 and ins[2] is not None and np.any(np.asarray(ins[2]).astype(np.int64) != 0):
        return out  # zero points: not a symmetric block type
    q, scale = np.asarray(ins[0]), np.asarray(ins[1], np.float32)
    if q.ndim != 2 or q.dtype.name not in ("int8", "int4") or out.dtype != np.float32:
        return out
    at = {a.name: a.i for a in node.attribute}
    arr = np.asarray(out).view(QuantArray)
    arr.quant = Quantized(q, scale, int(at.get("axis", 1)) % 2, int(at.get("block_size", 0)))
    return arr


def transposed(out: np.ndarray, node: Any, src: Any) -> np.ndarray:
    """``out``, a folded 2-D ``Transpose`` of the tagged weight ``src``, carrying ``src``'s quantized form read the
    other way (a linear weight in torch's [out, in] layout that the graph transposes for its MatMul)."""
    qz = getattr(src, "quant", None)
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
    if qz is None or np.ndim(out) != 2 or perm != [1, 0] or out.dtype != np.float32:
        return out
    arr = np.asarray(out).view(QuantArray)
    arr.quant = Quantized(qz.values.T, qz.scale.T if qz.block_size else qz.scale, 1 - qz.axis, qz.block_size)
    return arr


def blocks(w: Any, k_axis: int) -> tuple[str, np.ndarray] | None:
    """(ggml type name, rows of blocks: (N, K/32 * bytes per block) uint8) for the 2-D weight ``w`` whose
    reduction axis is ``k_axis``, or None when it is not a quantized weight that maps exactly."""
    qz = getattr(w, "quant", None)
    if qz is None:
        return None
    q = qz.values
    k = q.shape[k_axis]
    if k % QK:
        return None
    n_axis = 1 - k_axis
    s = qz.scale
    if qz.block_size:
        if qz.axis != k_axis or qz.block_size % QK:
            return None
        per_k = np.repeat(s, qz.block_size // QK, axis=k_axis)  # one scale per 32 along K
        d = per_k if k_axis == 1 else per_k.T  # (N, K/32)
    else:
        if qz.axis != n_axis or s.shape != (q.shape[n_axis],):
            return None
        d = np.repeat(s[:, None], k // QK, axis=1)
    d16 = d.astype(np.float16)
    if not np.array_equal(d16.astype(np.float32), d):
        return None  # not exact in fp16
    rows = (q if k_axis == 1 else q.T).astype(np.int8)  # (N, K): the weight as ggml_mul_mat reads it
    n = rows.shape[0]
    vals = rows.reshape(n, k // QK, QK)
    head = np.ascontiguousarray(d16).view(np.uint8).reshape(n, k // QK, 2)
    if q.dtype.name == "int8":
        body = vals.view(np.uint8)
        kind = "Q8_0"
    else:
        nib = (vals + 8).astype(np.uint8)
        body = nib[..., :16] | (nib[..., 16:] << 4)
        kind = "Q4_0"
    return kind, np.ascontiguousarray(np.concatenate([head, body], axis=2).reshape(n, -1))


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
