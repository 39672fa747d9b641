"""Shared helpers for the op lowerings: tensors, layout, broadcasting.

ggml orders dimensions the other way round from ONNX: ``ne[0]`` is the
innermost (fastest) dimension. An ONNX shape ``(N, C, H, W)`` is ggml
``ne = (W, H, C, N)``. A C-contiguous numpy array has the same bytes as a
contiguous ggml tensor of the reversed shape, so data moves without copies.
ggml has at most 4 dimensions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sdrt.errors import UnsupportedGraph
from sdrt.lowering import norm_axis  # noqa: F401  (the ops import it from here)

from .. import guards
from ..bindings import ggml_lib, import_tolerant  # noqa: F401 - the ops reach the bindings through here

log = logging.getLogger("sdrt.ggml")

if TYPE_CHECKING:  # pragma: no cover
    from onnx import NodeProto

    from ..lower import Lowering

MAX_DIMS = 4


@dataclass
class GTensor:
    """A runtime tensor in the ggml graph: the ggml pointer, its ONNX shape and dtype."""

    ptr: Any
    shape: tuple[int, ...]
    dtype: str = "float32"  # "float32" or "int32" (indices)
    #: the same (N=1, C, H, W) values laid out channels-last (ggml ne (C, W, H, 1), contiguous),
    #: when an op produced it for free; ggml computes whichever layout a consumer uses
    cl: Any = None
    #: for an (N, C, H, W) value whose producer can write it zero-padded (the native group norm):
    #: ``padded(top, left, Wp, Hp)`` -> a ggml tensor ne (Wp, Hp, C, N) with the values at
    #: (top, left), what a direct conv reads; None otherwise
    padded: Any = None
    #: for an (N, C, H, W) value whose producer can write it as bf16 channel pairs (the native depthwise conv):
    #: ``pairs(top, left, Wp, Hp, C2)`` -> a ggml tensor ne (2 Wp, Hp, C2, N) as the pair pad op writes it, what
    #: the AMX conv reads; None otherwise (and where the value has other readers)
    pairs: Any = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))


@dataclass
class HostValue:
    """A value computed on the host at run time: integer/bool arithmetic on integer graph
    inputs (token ids -> ArgMax -> pooled-output indices, ...), evaluated with onnx's
    reference ops before each run. ``example`` is its value for all-zero inputs (shape, dtype)."""

    name: str
    example: np.ndarray


Value = GTensor | np.ndarray | HostValue


def unsupported(node: NodeProto, why: str) -> UnsupportedGraph:
    name = node.name or f"<{node.op_type} -> {', '.join(node.output)}>"
    return UnsupportedGraph(
        f"the ggml backend cannot lower this node ({why})",
        unsupported={node.op_type: [name]},
        where=f"node {name!r} ({node.op_type})",
        fix="run the model on another backend (for example openvino or reference), or re-export it without this construct",
    )


def attrs(node: NodeProto) -> dict[str, Any]:
    from onnx import helper

    out: dict[str, Any] = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def ne_of(shape: Sequence[int]) -> list[int]:
    """ggml ne (4 entries) of an ONNX shape."""
    if len(shape) > MAX_DIMS:
        extra = shape[: len(shape) - MAX_DIMS]
        if any(d != 1 for d in extra):
            raise ValueError(f"shape {tuple(shape)} has more than {MAX_DIMS} dimensions")
        shape = shape[len(shape) - MAX_DIMS :]
    ne = [int(d) for d in reversed(shape)]
    return ne + [1] * (MAX_DIMS - len(ne))


def gdim(axis: int, rank: int) -> int:
    """ggml dimension index of ONNX ``axis`` in a tensor of ``rank``."""
    return rank - 1 - norm_axis(axis, rank)


def is_contiguous(x: GTensor) -> bool:
    """Dense and densely strided: ggml's own ``ggml_is_contiguous`` lets a size-1 dim keep any
    stride, which ops that assert ``ggml_is_padded_1d`` (ggml_scale) then reject."""
    return guards.is_packed(x.ptr)


def cont(lowering: Lowering, x: GTensor) -> GTensor:
    """``x`` densely strided: a free reshape view when only size-1 dims have odd strides, else a copy."""
    if guards.is_packed(x.ptr):
        return x
    lib = ggml_lib()
    if guards.is_contiguous(x.ptr):
        return GTensor(lib.ggml_reshape_4d(lowering.ctx, x.ptr, *guards.ne(x.ptr)), x.shape, x.dtype)
    return GTensor(dense_copy(lowering, x.ptr), x.shape, x.dtype)


def dense_copy(lowering: Lowering, x: Any) -> Any:
    """A dense copy of the ggml tensor ``x``: sdrt's copy op (native/copy.c) for a float32 on the
    CPU where the native kernels loaded (it runs on the ops' pool, and transposes in tiles), else
    ``ggml_cont``."""
    lib = ggml_lib()
    if lowering.on_cpu and x.contents.type == lib.GGML_TYPE_F32:
        from ..native_ops import copy, native_ops

        ops = native_ops()
        if ops is not None:
            return copy(ops, lib, lowering.ctx, x)
    return lib.ggml_cont(lowering.ctx, x)


def concat_ptr(lowering: Lowering, a: Any, b: Any, dim: int) -> Any:
    """``a`` and ``b`` joined along ggml dim ``dim``: sdrt's concat op (native/copy.c, whole rows, on the
    ops' pool) for float32 on the CPU where the native kernels loaded, else ``ggml_concat``."""
    lib = ggml_lib()
    f32 = lib.GGML_TYPE_F32
    same = all(a.contents.ne[i] == b.contents.ne[i] for i in range(4) if i != dim)  # else ggml's guard says why
    if lowering.on_cpu and a.contents.type == f32 and b.contents.type == f32 and same and 0 <= dim < 4:
        from ..native_ops import concat, native_ops

        ops = native_ops()
        if ops is not None:
            return concat(ops, lib, lowering.ctx, a, b, dim)
    return lib.ggml_concat(lowering.ctx, a, b, dim)


def ne_merged(shape: Sequence[int]) -> list[int]:
    """ggml ne of an ONNX shape, with the dims past ggml's four merged into the outermost one: the dense
    storage of a wide-rank value (``wide``) that only reshapes and permutations read."""
    if len(shape) <= MAX_DIMS:
        return ne_of(shape)
    lead = math.prod(int(d) for d in shape[: len(shape) - MAX_DIMS + 1])
    return ne_of((lead, *shape[len(shape) - MAX_DIMS + 1 :]))


def wide(x: GTensor) -> bool:
    """A value of more than four dims (not all leading ones): stored dense with merged outer dims; only
    Reshape, Flatten, Transpose and a permuting Einsum may read it (``lower.WIDE_OPS``)."""
    return x.rank > MAX_DIMS and any(d != 1 for d in x.shape[: x.rank - MAX_DIMS])


def fold_shape(shape: Sequence[int], keep: Sequence[int]) -> tuple[tuple[int, ...], dict[int, int]]:
    """``shape`` with each run of axes between the ``keep`` axes merged into one: the same dense values
    seen with fewer dims, for an op that treats the merged axes alike (a Concat's axes other than its
    own, a Slice's unsliced ones). Returns the folded shape and where each kept axis went; runs of
    size 1 are dropped."""
    kept = {norm_axis(a, len(shape)) for a in keep}
    out: list[int] = []
    where: dict[int, int] = {}
    run = 1
    for i, d in enumerate(shape):
        if i in kept:
            if run != 1:
                out.append(run)
            where[i] = len(out)
            out.append(int(d))
            run = 1
        else:
            run *= int(d)
    if run != 1 or not out:
        out.append(run)
    return tuple(out), where


def reshape(lowering: Lowering, x: GTensor, shape: Sequence[int]) -> GTensor:
    shape = tuple(int(d) for d in shape)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape = tuple(x.size // max(known, 1) if d == -1 else d for d in shape)
    if math.prod(shape) != x.size:
        raise ValueError(f"cannot reshape {x.shape} to {shape}")
    if shape == x.shape and is_contiguous(x):
        return x
    x = cont(lowering, x)
    ne = ne_merged(shape)
    return GTensor(ggml_lib().ggml_reshape_4d(lowering.ctx, x.ptr, *ne), shape, x.dtype)


def view_as(lowering: Lowering, v: Value, shape: Sequence[int]) -> Value:
    """``v`` (a runtime tensor or a constant) seen as ``shape``, the same values in the same dense order. A
    reshaped initializer is a new array: it is recorded as folded, so that a change to it lowers the graph
    again instead of missing the copy."""
    if isinstance(v, GTensor):
        return reshape(lowering, v, shape)
    name = lowering.init_name(v)
    if name is not None:
        lowering.out.folded_inits.add(name)
    return np.reshape(v, tuple(int(d) for d in shape))


def _permute_wide(lowering: Lowering, x: GTensor, perm: list[int]) -> GTensor:
    """A permutation of more than four dims, as moves of one axis at a time: moving axis ``i`` to ``j < i``
    is the rank-4 swap (A, B, C, D) -> (A, C, B, D) of the merged groups before ``j``, ``j..i``, ``i`` and
    after ``i``; each move makes one dense copy."""
    order = list(range(x.rank))  # order[k]: the input axis now at position k
    shape = list(x.shape)
    for j, want in enumerate(perm):
        i = order.index(want)
        if i == j:
            continue
        a, b, c, d = (math.prod(shape[:j]), math.prod(shape[j:i]), shape[i], math.prod(shape[i + 1 :]))
        x = reshape(lowering, x, (a, b, c, d))
        x = cont(lowering, permute(lowering, x, (0, 2, 1, 3)))
        order.insert(j, order.pop(i))
        shape.insert(j, shape.pop(i))
    return reshape(lowering, x, tuple(shape))


def permute(lowering: Lowering, x: GTensor, perm: Sequence[int]) -> GTensor:
    """A view of ``x`` with ONNX axes permuted as numpy.transpose(x, perm)."""
    r = x.rank
    perm = [norm_axis(p, r) for p in perm]
    if perm == list(range(r)):
        return x
    if r > MAX_DIMS:
        return _permute_wide(lowering, x, perm)
    axes = list(range(MAX_DIMS))
    for j, p in enumerate(perm):
        axes[r - 1 - p] = r - 1 - j
    shape = tuple(x.shape[p] for p in perm)
    return GTensor(ggml_lib().ggml_permute(lowering.ctx, x.ptr, *axes), shape, x.dtype)


def to_tensor(lowering: Lowering, v: Value) -> GTensor:
    """A runtime tensor for ``v``; constants become weights-buffer tensors."""
    if isinstance(v, GTensor):
        return v
    return lowering.const(v)


def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in np.broadcast_shapes(tuple(a), tuple(b)))


def expand_to(lowering: Lowering, x: GTensor, shape: Sequence[int]) -> GTensor:
    """``x`` broadcast (numpy rules) to ``shape``, materialized with ggml_repeat."""
    shape = tuple(int(d) for d in shape)
    if x.shape == shape:
        return x
    xr = (1,) * (len(shape) - x.rank) + x.shape
    x = reshape(lowering, x, xr)
    return GTensor(ggml_lib().ggml_repeat_4d(lowering.ctx, x.ptr, *ne_of(shape)), shape, x.dtype)


def binary(lowering: Lowering, fn_name: str, a: Value, b: Value, commutative: bool) -> GTensor:
    """Apply a ggml binary op with numpy broadcasting.

    ggml broadcasts only the second operand (it must tile the first), so the
    operands are swapped (when the op commutes) or the first is repeated.
    """
    ga, gb = to_tensor(lowering, a), to_tensor(lowering, b)
    out = broadcast_shape(ga.shape, gb.shape)
    if ga.shape != out and gb.shape == out and commutative:
        ga, gb = gb, ga
    if ga.shape != out:
        ga = expand_to(lowering, ga, out)
    ga = cont(lowering, ga)
    gb = cont(lowering, gb)
    if gb.rank < len(out):
        gb = reshape(lowering, gb, (1,) * (len(out) - gb.rank) + gb.shape)
    if ga.rank != len(out):
        ga = reshape(lowering, ga, out)
    g = ggml_lib()
    gb_ne0 = gb.shape[-1] if gb.shape else 1
    ga_ne0 = out[-1] if out else 1
    if gb_ne0 == 1 and ga_ne0 >= 8 and gb.size < ga.size:
        # ggml's CPU kernels loop element by element when the second operand's rows have
        # length 1 (a per-channel bias on NCHW): repeat it along the innermost dim first
        ne = ne_of(gb.shape)
        ne[0] = ga_ne0
        gb = GTensor(g.ggml_repeat_4d(lowering.ctx, gb.ptr, *ne), gb.shape[:-1] + (ga_ne0,), gb.dtype)
    fn = getattr(g, fn_name)
    return GTensor(fn(lowering.ctx, ga.ptr, gb.ptr), out)


def scalar_of(v: Value) -> float | None:
    """The single value of a constant with one element, else None."""
    if isinstance(v, np.ndarray) and v.size == 1:
        return float(v.reshape(-1)[0])
    return None


def f32(v: Value) -> Value:
    if isinstance(v, np.ndarray) and v.dtype != np.float32 and v.dtype.kind == "f":
        return v.astype(np.float32)
    return v


#: ggml's fast float32 GEMM (llamafile tinyBLAS) needs the contraction dim to be a multiple of
#: the SIMD width (16 floats with AVX-512, 8 with AVX2, 4 with NEON); padding it with zeros
#: leaves every dot product unchanged and avoids the scalar fallback.
K_ALIGN = 16


def aligned(k: int) -> int:
    return -(-k // K_ALIGN) * K_ALIGN


def pad_k(lowering: Lowering, x: GTensor, kp: int) -> GTensor:
    """``x`` zero-padded along its innermost (ONNX last) axis to ``kp``."""
    k = x.shape[-1]
    if kp == k:
        return x
    x = cont(lowering, x)
    return GTensor(ggml_lib().ggml_pad(lowering.ctx, x.ptr, kp - k, 0, 0, 0), x.shape[:-1] + (kp,), x.dtype)


def want_pad(lowering: Lowering, k: int) -> bool:
    return bool(lowering.options.get("pad_k", True)) and k % K_ALIGN != 0
