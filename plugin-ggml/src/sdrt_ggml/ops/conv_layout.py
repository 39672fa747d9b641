"""Helpers shared by the conv strategies: the conv GEMM, channels-last copies, zeroed blocks, valid ranges."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import native
from ._common import K_ALIGN, GTensor, dense_copy, ggml_lib
from .op_shape import slice_axis


def conv_gemm(lowering: Any, cols: Any, w: np.ndarray, order: tuple[int, int, int, int], tag: str, *,
              trans: bool = True, bias: np.ndarray | None = None) -> Any:
    """The GEMM of a conv: ``cols`` (ne (K, M): one row of K = C*KH*KW values per output pixel,
    rows may overlap) times the kernel ``w`` (OC, C, KH, KW) laid out in ``order`` (the order of
    each row of ``cols``). Returns ne (M, OC), pixels innermost (NCHW), or ne (OC, M) when not
    ``trans`` (channels-last).

    On the CPU it is the native GEMM with the kernel packed once at build time, adding the constant
    ``bias`` (OC floats) as it stores; elsewhere ``ggml_mul_mat`` (no ``bias`` there)."""
    g = ggml_lib()
    oc = int(w.shape[0])
    k = int(np.prod(w.shape[1:]))
    m = int(cols.contents.ne[1])
    nat = native.for_lowering(lowering)
    if nat is not None:
        bf16 = native.bf16_for(lowering)  # bf16 panels (half.py)
        if bf16:
            wp = native.packed_bf16(lowering, w, lambda a: a.transpose(order).reshape(oc, k), tag)
        else:
            wp = native.packed_f32(lowering, w, lambda a: a.transpose(order).reshape(oc, k), f"{tag}P32")
        b = None if bias is None else lowering.const(np.asarray(bias, np.float32).reshape(-1)).ptr
        return native.gemm_op(nat, g, lowering.ctx, cols, wp.ptr, b, m=m, n=oc, trans=trans, packed=True,
                              state=native.lowering_state(lowering), bf16=bf16)
    assert bias is None, "ggml_mul_mat adds no bias"
    wt = lowering.const(w, transform=lambda a: np.ascontiguousarray(a.transpose(order)), tag=tag)
    w2 = g.ggml_reshape_2d(lowering.ctx, wt.ptr, k, oc)
    return g.ggml_mul_mat(lowering.ctx, cols, w2) if trans else g.ggml_mul_mat(lowering.ctx, w2, cols)


def channels_last(lowering: Any, x: Any) -> Any:
    """A contiguous (C, W, H, N)-ordered copy of an NCHW tensor (ggml ne (W, H, C, N)).

    ``ggml_cont`` of the permuted view reads with a stride of a whole channel plane
    per element; ``transpose="write"`` copies into a permuted view of the target
    instead (contiguous reads, writes with a stride of C floats); ``ggml_cont`` is the
    default (docs/ggml.md, "Measured choices").
    """
    g = ggml_lib()
    if lowering.options.get("transpose", "cont") != "write":
        return dense_copy(lowering, g.ggml_permute(lowering.ctx, x, 1, 2, 0, 3))
    ne = x.contents.ne
    target = lowering.scratch([ne[2], ne[0], ne[1], ne[3]], after=x)
    done = g.ggml_cpy(lowering.ctx, x, g.ggml_permute(lowering.ctx, target, 2, 0, 1, 3))
    return g.ggml_permute(lowering.ctx, done, 1, 2, 0, 3)  # back to ne (C, W, H, N), contiguous memory


def clear_blocks(lowering: Any, buf: Any, blocks: list[tuple[int, ...]]) -> Any:
    """Zero the strided blocks (ne0, ne1, ne2, nb1, nb2, nb3, byte offset) of a scratch tensor, each run,
    from one constant of zeros; empty blocks are skipped. Returns the last in-place result."""
    g = ggml_lib()
    blocks = [b for b in blocks if b[0] * b[1] * b[2] > 0]
    if not blocks:
        return buf
    zero = lowering.const(np.zeros(max(b[0] * b[1] * b[2] for b in blocks), np.float32))
    for ne0, ne1, ne2, nb1, nb2, nb3, offset in blocks:
        src = g.ggml_view_3d(lowering.ctx, zero.ptr, ne0, ne1, ne2, ne0 * 4, ne0 * ne1 * 4, 0)
        buf = g.ggml_set_inplace(lowering.ctx, buf, src, nb1, nb2, nb3, offset)
    return buf


def valid_range(n_out: int, n_in: int, stride: int, offset: int) -> tuple[int, int]:
    """Output positions o in [lo, hi) whose input o*stride + offset lies inside [0, n_in)."""
    lo = max(0, -(offset // stride) if offset < 0 else 0)
    while lo < n_out and lo * stride + offset < 0:
        lo += 1
    hi = lo
    while hi < n_out and hi * stride + offset < n_in:
        hi += 1
    return lo, hi


def aligned_channels(c: int, taps: int) -> int:
    cp = c
    while (cp * taps) % K_ALIGN:
        cp += 1
    return cp


def channel_view(lowering: Any, x: GTensor, start: int, count: int, axis: int = 1) -> GTensor:
    return slice_axis(lowering, x, axis, start, start + count, 1)
