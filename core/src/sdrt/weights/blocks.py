"""``BlockMatrix``: a 2-D weight kept in a ggml block type (a GGUF file's Q8_0, Q4_K...) instead of float32.

A GGUF file stores a ``Linear`` weight as PyTorch does, [out, in], in rows of blocks along ``in``: exactly the
first operand of ggml's ``mul_mat``. When a checkpoint binds such a tensor onto a graph's matmul weight (a
``MatMul`` whose second input is the initializer laid out [in, out], or a ``Gemm`` with ``transB=1`` and the
initializer [out, in]), the ``TensorRef`` carries, beside its float32 reader, a ``blocks`` reader that gives a
``BlockMatrix``: the file's rows of blocks as they are (a view of the mapped file, nothing decoded) and whether
the initializer is their transpose. A backend that runs these types itself (``Backend.weight_blocks``) receives
the ``BlockMatrix`` in place of the array from ``resolve_weights``; every other backend, and every tensor that
is not a matmul weight, gets the float32 values as before (``np.asarray(block_matrix)`` dequantizes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class BlockMatrix:
    """``rows`` x ``cols`` values stored as ggml blocks along ``cols``; the initializer is that matrix, or its
    transpose when ``transposed`` (a ``MatMul`` weight [in, out] from a [out, in] tensor)."""

    ggml_type: str
    #: (rows, bytes per row) uint8: the stored blocks, usually a read-only view of the mapped file
    data: np.ndarray
    rows: int
    cols: int
    transposed: bool = False
    #: where the blocks come from, for messages and logs ("file.gguf: double_blocks.0.img_attn.qkv.weight")
    source: str = ""

    dtype = np.dtype(np.float32)
    ndim = 2

    @property
    def shape(self) -> tuple[int, int]:
        """The initializer's shape: (cols, rows) when transposed."""
        return (self.cols, self.rows) if self.transposed else (self.rows, self.cols)

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def nbytes(self) -> int:
        """Bytes of the stored blocks (not of the float32 values)."""
        return int(self.data.nbytes)

    @property
    def T(self) -> BlockMatrix:  # noqa: N802 - numpy's name
        return replace(self, transposed=not self.transposed)

    def row_range(self, lo: int, hi: int) -> BlockMatrix:
        """Stored rows ``lo:hi`` (a fused qkv's thirds, Flux's ``linear1`` split): a view, no copy."""
        hi = min(hi, self.rows)
        return replace(self, data=self.data[lo:hi], rows=hi - lo)

    def swap_halves(self) -> BlockMatrix:
        """The two halves of the stored rows exchanged (an adaLN's shift, scale as diffusers' scale, shift)."""
        half = self.rows // 2
        return replace(self, data=np.ascontiguousarray(np.concatenate([self.data[half:], self.data[:half]])))

    def dequantize(self) -> np.ndarray:
        """The initializer's float32 values (gguf's dequantizer, ``gguf.quants.dequantize``)."""
        vals = dequantize_rows(self.data, self.ggml_type, self.cols)
        return np.ascontiguousarray(vals.T) if self.transposed else vals

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.dequantize()
        return arr if dtype is None else arr.astype(dtype)

    def same(self, other: Any) -> bool:
        """Whether ``other`` is a ``BlockMatrix`` holding the same blocks in the same layout."""
        if not isinstance(other, BlockMatrix):
            return False
        if (self.ggml_type, self.rows, self.cols, self.transposed) != (
                other.ggml_type, other.rows, other.cols, other.transposed):
            return False
        a, b = self.data, other.data
        if a.ctypes.data == b.ctypes.data and a.shape == b.shape:
            return True
        return bool(np.array_equal(a, b))

    def __repr__(self) -> str:
        return (f"BlockMatrix({self.ggml_type}, {list(self.shape)}{' (transposed blocks)' if self.transposed else ''}, "
                f"{self.nbytes / 2**20:.2f} MiB{', ' + self.source if self.source else ''})")


def dequantize_rows(data: np.ndarray, type_name: str, cols: int) -> np.ndarray:
    """float32 values of rows of ggml blocks (``(rows, bytes per row)`` uint8) of type ``type_name``: Q8_0 and
    Q4_0 here (the blocks sdrt's own int8/int4 weights take, where ``gguf`` may not be installed), every other
    type by the ``gguf`` package's dequantizer (a GGUF file was read with it, so it is installed)."""
    if type_name in ("Q8_0", "Q4_0"):
        blocks = np.asarray(data).reshape(-1, 34 if type_name == "Q8_0" else 18)
        d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(np.float32)  # (blocks, 1)
        if type_name == "Q8_0":
            q = blocks[:, 2:].view(np.int8).astype(np.float32)
        else:  # low nibbles hold values 0-15 of a block, high nibbles 16-31, each stored as q + 8
            nib = blocks[:, 2:]
            q = np.concatenate([nib & 0x0F, nib >> 4], axis=1).astype(np.float32) - 8
        q *= d
        return q.reshape(-1, cols)
    import gguf
    from gguf import quants

    out = quants.dequantize(np.asarray(data), gguf.GGMLQuantizationType[type_name])
    return np.ascontiguousarray(out.reshape(-1, cols), dtype=np.float32)


__all__ = ["BlockMatrix", "dequantize_rows"]
