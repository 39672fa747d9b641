"""MatMul and Gemm: sdrt-ggml's packed GEMM on the CPU, ggml_mul_mat elsewhere.

At ``precision="fp16"`` (and ``"bf16"`` off the native kernels) a constant B is stored half and multiplied by
``ggml_mul_mat`` (``half.py``); at ``"bf16"`` with them, bf16 panels of the native GEMM
(``native.packed_bf16``); otherwise, on the CPU device (``native.for_lowering``), ``A @ B`` is one
``sdrt_gemm_op`` custom op
(native/gemm.c): A is read in place (its rows K-contiguous), a constant B is packed into
32-column panels once when the session is built (``native.pack_b``, through the weight's
transform, so ``update_weights`` packs new weights the same way), a runtime B is read
through its strides and packed per thread; Gemm's constant bias (times beta) is added by the
kernel, and alpha is folded into a constant B. No K padding is needed.

Otherwise ``ggml_mul_mat(a, b)`` computes ``b @ a^T`` over the two innermost ggml dims:
with ``a`` of ONNX shape (N, K) and ``b`` of shape (M, K) it gives (M, N). So
``A @ B`` is ``ggml_mul_mat(B^T, A)``; a constant ``B`` is transposed once on
upload, a runtime one through a view (free when it already is a transpose).
ggml broadcasts ``a`` over the batch dims of ``b``, not the other way.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from sdrt.weights.blocks import BlockMatrix

from .. import half, native
from . import op
from ._common import (
    GTensor,
    Value,
    aligned,
    attrs,
    binary,
    broadcast_shape,
    cont,
    expand_to,
    ggml_lib,
    ne_of,
    pad_k,
    permute,
    reshape,
    want_pad,
)


def _swap_last(rank: int) -> list[int]:
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return perm


def _weight_t(lowering: Any, b: Value) -> GTensor:
    """B^T (shape (..., N, K)) as a tensor usable as ggml_mul_mat's first operand."""
    if isinstance(b, np.ndarray):
        return lowering.const(b, transform=lambda w: np.swapaxes(w, -1, -2), tag="T")
    bt = permute(lowering, b, _swap_last(b.rank))
    return cont(lowering, bt)


def _pad_last(v: np.ndarray, pad: int) -> np.ndarray:
    return native.aligned_pad(v, (0,) * (v.ndim - 1) + (pad,))


def k_rows(lowering: Any, a: GTensor) -> GTensor:
    """``a`` with unit stride along its last (K) axis, as the native GEMM reads A; other strides stay."""
    if int(a.ptr.contents.nb[0]) == 4:
        return a
    return cont(lowering, a)


@dataclass(frozen=True)
class GemmSpec:
    """A native GEMM as emitted: the epilogue fusions (rewrites_epilogue.py) emit it again with a
    constant bias or a residual added."""

    a: Any  # ggml tensors
    w: Any
    m: int
    n: int
    packed: bool
    batch: tuple[int, ...]
    bias: Any = None
    res: Any = None
    act: str | None = None
    act_arg: float = 0.0
    bf16: bool = False  # w is bf16 panels (half.packed_bf16)


def gemm_emit(lowering: Any, spec: GemmSpec) -> GTensor:
    """The GEMM op of ``spec``; remembered so that a following Add can fuse into its epilogue."""
    d = ne_of(spec.batch + (spec.m, 1))
    act = lowering.const(native.act_params(spec.act, spec.act_arg)).ptr if spec.act else None
    out = native.gemm_op(native.for_lowering(lowering), ggml_lib(), lowering.ctx, spec.a, spec.w, spec.bias,
                         m=spec.m, n=spec.n, packed=spec.packed, batch=(d[2], d[3]),
                         state=native.lowering_state(lowering), res=spec.res, act=act, bf16=spec.bf16)
    lowering.gemm_specs[ctypes.cast(out, ctypes.c_void_p).value] = spec
    return GTensor(out, spec.batch + (spec.m, spec.n))


def gemm_spec_of(lowering: Any, v: Any) -> GemmSpec | None:
    """The spec of a native GEMM's value (None for any other value)."""
    if not isinstance(v, GTensor):
        return None
    return lowering.gemm_specs.get(ctypes.cast(v.ptr, ctypes.c_void_p).value)


def fuse_gemm_silu(lowering: Any, name: str, uses: int, c: float) -> GTensor | None:
    """``x * sigmoid(c x)`` of the native GEMM that produced ``name`` (read only by the Sigmoid and the
    Mul: ``uses`` readers) as that GEMM with the activation in its epilogue; None when it cannot."""
    return fuse_gemm_act(lowering, name, uses, "silu", c)


def fuse_gemm_act(lowering: Any, name: str, uses: int, act: str, arg: float = 0.0, *,
                  count: bool = True) -> GTensor | None:
    """The native GEMM that produced ``name`` (read by ``uses`` inputs of the pattern's nodes and nothing
    else) again, with activation ``act`` (``native.ACTS``) in its epilogue; None when it cannot."""
    from dataclasses import replace

    spec = gemm_spec_of(lowering, lowering.values.get(name))
    if spec is None or spec.act or lowering.n_uses(name) != uses or name in lowering.output_names:
        return None
    if "conv_epilogue" not in lowering.rewrites_on:
        return None
    if count:  # a match of another rewrite (silu) that fused into the GEMM's epilogue
        lowering.rewrite_hits["conv_epilogue"] = lowering.rewrite_hits.get("conv_epilogue", 0) + 1
    return gemm_emit(lowering, replace(spec, act=act, act_arg=float(arg)))


def native_matmul(lowering: Any, nat: Any, a: GTensor, b: Value, batch: tuple[int, ...]) -> GTensor:
    """``a @ b`` (a: (..., M, K) runtime; b: (..., K, N)) by the native GEMM; batch dims broadcast."""
    m = a.shape[-2]
    if a.shape[:-2] != batch:
        a = expand_to(lowering, a, batch + a.shape[-2:])
    a = k_rows(lowering, a)
    packed = isinstance(b, np.ndarray) and b.ndim == 2
    if packed and native.bf16_for(lowering):  # bf16 panels: vdpbf16ps, or widened (half.py)
        w = native.packed_bf16(lowering, b, lambda v: np.swapaxes(v, -1, -2), "T")
        return gemm_emit(lowering, GemmSpec(a.ptr, w.ptr, m, int(np.shape(b)[-1]), True, batch, bf16=True))
    if packed:
        w = native.packed_f32(lowering, b, lambda v: np.swapaxes(v, -1, -2), "P32")
        n = int(np.shape(b)[-1])
    else:
        w = lowering.const(b) if isinstance(b, np.ndarray) else b  # ne (N, K, e2, e3), any strides
        n = w.shape[-1]
    return gemm_emit(lowering, GemmSpec(a.ptr, w.ptr, m, n, packed, batch))


def blocks_mul_mat(lowering: Any, a: GTensor, bm: BlockMatrix) -> GTensor:
    """``a @ W`` for a GGUF block weight (``BlockMatrix``) whose stored rows are W's columns (lowering checked
    it: ``Lowering._mul_mat_blocks``): ggml's quantized mul_mat on the file's blocks, a: (..., M, K)."""
    w = lowering.const_blocks(bm, bm.ggml_type, bm.data, bm.cols)
    return GTensor(ggml_lib().ggml_mul_mat(lowering.ctx, w.ptr, cont(lowering, a).ptr), a.shape[:-1] + (bm.rows,))


def matmul(lowering: Any, a: Value, b: Value) -> GTensor:
    """ONNX MatMul semantics (numpy matmul) for rank >= 1."""
    if isinstance(a, np.ndarray):
        a = lowering.const(a)
    assert isinstance(a, GTensor)
    if isinstance(b, BlockMatrix):  # a GGUF file's or a quantized weight's blocks, kept (lower.py decided)
        return blocks_mul_mat(lowering, a, b)
    squeeze_a = a.rank == 1
    squeeze_b = np.ndim(b) == 1 if isinstance(b, np.ndarray) else b.rank == 1
    if squeeze_a:
        a = reshape(lowering, a, (1,) + a.shape)
    if squeeze_b:
        b = b.reshape(-1, 1) if isinstance(b, np.ndarray) else reshape(lowering, b, b.shape + (1,))
    bshape = tuple(np.shape(b)) if isinstance(b, np.ndarray) else b.shape
    m, n = a.shape[-2], bshape[-1]
    batch = broadcast_shape(a.shape[:-2], bshape[:-2])
    k = a.shape[-1]
    nat = native.for_lowering(lowering)
    halved = half.kind(lowering) is not None and isinstance(b, np.ndarray) and a.dtype == "float32"
    if halved and b.ndim == 2 and native.bf16_for(lowering):
        halved = False  # bf16 panels of the native GEMM (native_matmul)
    # a float16 weight matrix (float16 exports, onnxruntime's and Olive's float16 folders) packs like a float32 one
    f16_weight = isinstance(b, np.ndarray) and b.ndim == 2 and b.dtype == np.float16
    if (nat is not None and not halved and len(batch) <= 2 and a.dtype == "float32"
            and (getattr(b, "dtype", "float32") == "float32" or f16_weight)):
        out = native_matmul(lowering, nat, a, b, batch)
        if squeeze_a:
            out = reshape(lowering, out, batch + (n,))
        if squeeze_b:
            out = reshape(lowering, out, out.shape[:-1])
        return out
    kp = aligned(k) if want_pad(lowering, k) and not halved else k
    if halved:  # a bf16/fp16 weight: ggml's mixed kernels (half.py)
        w = half.weight(lowering, b, lambda v: np.swapaxes(v, -1, -2), "T")
    elif isinstance(b, np.ndarray) and kp != k:
        pad = kp - k
        w = lowering.const(b, transform=lambda v: _pad_last(np.swapaxes(v, -1, -2), pad), tag=f"Tp{kp}")
    else:
        w = pad_k(lowering, _weight_t(lowering, b), kp)  # (..., N, Kp)
    if a.shape[:-2] != batch:
        a = expand_to(lowering, a, batch + a.shape[-2:])
    a = pad_k(lowering, cont(lowering, a), kp)
    rank = len(batch) + 2
    if w.rank < rank:
        w = reshape(lowering, w, (1,) * (rank - w.rank) + w.shape)
    if a.rank < rank:
        a = reshape(lowering, a, (1,) * (rank - a.rank) + a.shape)
    g = ggml_lib()
    out = GTensor(g.ggml_mul_mat(lowering.ctx, w.ptr, a.ptr), batch + (m, n))
    if squeeze_a:
        out = reshape(lowering, out, batch + (n,))
        m = None
    if squeeze_b:
        out = reshape(lowering, out, out.shape[:-1])
    return out


@op("MatMul")
def op_matmul(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    return [matmul(lowering, inputs[0], inputs[1])]


@op("Gemm")
def op_gemm(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    a_, b_, c_ = (list(inputs) + [None])[:3]
    at = attrs(node)
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    if at.get("transA", 0):
        a_ = a_.T if isinstance(a_, np.ndarray) else permute(lowering, a_, [1, 0])
    g = ggml_lib()
    nat = native.for_lowering(lowering)
    trans_b = bool(at.get("transB", 0))
    if isinstance(b_, BlockMatrix):  # a GGUF file's or a quantized weight's blocks, kept (lower.py decided)
        y = blocks_mul_mat(lowering, a_, b_)
    elif (half.kind(lowering) and isinstance(b_, np.ndarray) and b_.ndim == 2
          and not native.bf16_for(lowering)):  # bf16/fp16 weights on ggml's mul_mat (half.py)
        a = cont(lowering, lowering.const(a_) if isinstance(a_, np.ndarray) else a_)
        w = half.weight(lowering, b_, None if trans_b else (lambda v: v.T), "" if trans_b else "T")
        y = GTensor(g.ggml_mul_mat(lowering.ctx, w.ptr, a.ptr), (a.shape[0], w.shape[0]))
    elif nat is not None and isinstance(b_, np.ndarray):
        return [_native_gemm(lowering, nat, a_, b_, c_, alpha, beta, trans_b)]
    elif at.get("transB", 0):
        a = cont(lowering, lowering.const(a_) if isinstance(a_, np.ndarray) else a_)
        k = a.shape[1]
        kp = aligned(k) if want_pad(lowering, k) else k
        if isinstance(b_, np.ndarray):  # already (N, K)
            w = lowering.const(b_, transform=(lambda v: _pad_last(v, kp - k)) if kp != k else None, tag=f"p{kp}")
        else:
            w = pad_k(lowering, cont(lowering, b_), kp)
        a = pad_k(lowering, a, kp)
        y = GTensor(g.ggml_mul_mat(lowering.ctx, w.ptr, a.ptr), (a.shape[0], w.shape[0]))
    else:
        y = matmul(lowering, a_, b_)
    if alpha != 1.0:
        y = GTensor(g.ggml_scale(lowering.ctx, y.ptr, alpha), y.shape)
    if c_ is not None and beta != 0.0:
        c = c_ * np.float32(beta) if isinstance(c_, np.ndarray) and beta != 1.0 else c_
        if isinstance(c, GTensor) and beta != 1.0:
            c = GTensor(g.ggml_scale(lowering.ctx, cont(lowering, c).ptr, beta), c.shape)
        if isinstance(c, np.ndarray):
            c = c if c.dtype == np.float32 else c.astype(np.float32)  # the initializer itself: update_weights finds it
        y = binary(lowering, "ggml_add", y, c, True)
    return [y]


def _native_gemm(lowering: Any, nat: Any, a_: Value, b_: np.ndarray, c_: Value | None, alpha: float, beta: float,
                 trans_b: bool) -> GTensor:
    """Gemm with a constant B by the native GEMM: alpha folded into the packed B, a constant bias
    of N values (times beta) added by the kernel; any other C is added after."""
    g = ggml_lib()
    a = k_rows(lowering, lowering.const(a_) if isinstance(a_, np.ndarray) else a_)
    m, n = a.shape[0], int(b_.shape[0] if trans_b else b_.shape[1])

    def rows(v: np.ndarray) -> np.ndarray:  # (N, K), alpha folded in
        v = v if trans_b else v.T
        return v * np.float32(alpha) if alpha != 1.0 else v

    tag = f"{'t' if trans_b else ''}{alpha if alpha != 1.0 else ''}"
    bf16 = native.bf16_for(lowering)  # bf16 panels (half.py)
    w = (native.packed_bf16(lowering, b_, rows, tag) if bf16 else
         native.packed_f32(lowering, b_, rows, f"P32{tag}"))
    bias = None
    if isinstance(c_, np.ndarray) and beta != 0.0 and c_.size == n and (c_.ndim == 1 or c_.shape == (1, n)):
        bias = lowering.const(c_, transform=lambda v: (np.asarray(v, np.float32) * np.float32(beta)).reshape(-1),
                              tag=f"bias{beta}")
    out = native.gemm_op(nat, g, lowering.ctx, a.ptr, w.ptr, bias.ptr if bias is not None else None, m=m, n=n,
                         packed=True, state=native.lowering_state(lowering), bf16=bf16)
    y = GTensor(out, (m, n))
    if c_ is not None and beta != 0.0 and bias is None:
        c = c_ * np.float32(beta) if isinstance(c_, np.ndarray) and beta != 1.0 else c_
        if isinstance(c, GTensor) and beta != 1.0:
            c = GTensor(g.ggml_scale(lowering.ctx, cont(lowering, c).ptr, beta), c.shape)
        if isinstance(c, np.ndarray):
            c = c if c.dtype == np.float32 else c.astype(np.float32)  # the initializer itself: update_weights finds it
        y = binary(lowering, "ggml_add", y, c, True)
    return y
