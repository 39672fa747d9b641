"""Rewrites that reach ggml's fused kernels, matched while lowering.

Each rewrite is anchored at the *last* node of its pattern. When the anchor is
lowered, the matcher looks back through the producers; if the pattern holds
it emits the fused op from the pattern's original inputs. The ops already
emitted for the unfused intermediates stay unreferenced, and ggml only
computes what the outputs depend on, so they cost nothing. An intermediate
used elsewhere is still computed for that use, so a match is always correct.

- ``gelu``: x * 0.5 * (1 + erf(x / sqrt 2)) -> ggml_gelu_erf (always on: ggml has no erf kernel)
- ``geglu``: hidden * gelu(gate) -> one native kernel reading both (sliced) halves in place
- ``conv_epilogue`` (here, the GELU-tanh part): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) of a native
  GEMM's output -> that GEMM with the tanh GELU in its epilogue (ggml's TANH is one scalar tanhf an element)
- ``silu``: x * sigmoid(x) -> ggml_silu, and x * sigmoid(1.702 x) (quick GELU) -> silu(1.702 x) / 1.702
- ``attention``: softmax(Q K^T * s [+ mask]) V -> ggml_flash_attn_ext
- ``groupnorm``: Reshape(N, G, -1) -> InstanceNormalization -> Reshape -> sdrt-ggml's group norm
  (statistics, then one pass that also applies the following per-channel Mul/Add and SiLU and
  writes the channels-last twin a conv reads), or ggml_group_norm without the native library
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .ops._common import GTensor, Value, aligned, attrs, cont, ggml_lib, ne_of, pad_k, permute, scalar_of, want_pad
from .ops.op_matmul import fuse_gemm_act, fuse_gemm_silu

Matcher = Callable[[Any, Any], "list[Value] | None"]
#: anchor op type -> [(rewrite name, matcher)]
REWRITES: dict[str, list[tuple[str, Matcher]]] = {}
#: rewrites that can be switched off (``rewrites=`` option); gelu is needed for correctness
OPTIONAL = ("silu", "attention", "groupnorm", "geglu", "conv_epilogue", "rmsnorm", "rope")


def rewrite(name: str, anchor: str) -> Callable[[Matcher], Matcher]:
    def deco(fn: Matcher) -> Matcher:
        REWRITES.setdefault(anchor, []).append((name, fn))
        return fn

    return deco


def _close(v: float | None, want: float, tol: float = 1e-3) -> bool:
    return v is not None and abs(v - want) <= tol * abs(want)


def _mul_factors(lowering: Any, name: str, depth: int = 2) -> list[str]:
    """Flatten a tree of Mul nodes (single-use intermediates) into factor value names."""
    node = lowering.producer(name)
    if depth and node is not None and node.op_type == "Mul" and lowering.n_uses(name) <= 1:
        return _mul_factors(lowering, node.input[0], depth - 1) + _mul_factors(lowering, node.input[1], depth - 1)
    return [name]


def _erf_arg(lowering: Any, name: str) -> str | None:
    """x when ``name`` is 1 + erf(x / sqrt 2) (or erf(x * 1/sqrt 2) + 1)."""
    add = lowering.producer(name)
    if add is None or add.op_type != "Add":
        return None
    for i in (0, 1):
        if _close(scalar_of(lowering.values.get(add.input[1 - i])), 1.0, 1e-6):
            erf = lowering.producer(add.input[i])
            if erf is None or erf.op_type != "Erf":
                return None
            scale = lowering.producer(erf.input[0])
            if scale is None:
                return None
            c = scalar_of(lowering.values.get(scale.input[1]))
            if scale.op_type == "Div" and _close(c, float(np.sqrt(2.0)), 1e-4):
                return str(scale.input[0])
            if scale.op_type == "Mul" and _close(c, float(1 / np.sqrt(2.0)), 1e-4):
                return str(scale.input[0])
    return None


def _gelu_x(lowering: Any, node: Any) -> str | None:
    """x when ``node`` (a Mul) ends x * 0.5 * (1 + erf(x / sqrt 2)), in either association order."""
    factors = _mul_factors(lowering, node.input[0]) + _mul_factors(lowering, node.input[1])
    consts = [f for f in factors if isinstance(lowering.values.get(f), np.ndarray)]
    runtime = [f for f in factors if f not in consts]
    if len(consts) != 1 or len(runtime) != 2 or not _close(scalar_of(lowering.values[consts[0]]), 0.5, 1e-6):
        return None
    for i in (0, 1):
        x = _erf_arg(lowering, runtime[i])
        if x is not None and x == runtime[1 - i]:
            return x
    return None


@rewrite("gelu", "Mul")
def match_gelu(lowering: Any, node: Any) -> list[Value] | None:
    x = _gelu_x(lowering, node)
    xv = lowering.values.get(x) if x is not None else None
    if not isinstance(xv, GTensor):
        return None
    ops = _native(lowering, "gelu")
    if ops is not None:
        from .native_ops import gelu_erf

        xv = _rows_dense(lowering, xv)
        lowering.used("gelu native")
        return [GTensor(gelu_erf(ops, ggml_lib(), lowering.ctx, xv.ptr), xv.shape)]
    xv = cont(lowering, xv)
    lowering.used("gelu ggml")
    return [GTensor(ggml_lib().ggml_gelu_erf(lowering.ctx, xv.ptr), xv.shape)]


def _factors(lowering: Any, name: str, nodes: list[Any], depth: int = 3) -> list[str]:
    """Flatten a tree of single-use Mul nodes (and x^3 as Pow(x, 3)) into factor names; the nodes go to ``nodes``."""
    node = lowering.producer(name)
    if depth and node is not None and lowering.n_uses(name) <= 1:
        if node.op_type == "Mul":
            nodes.append(node)
            return (_factors(lowering, node.input[0], nodes, depth - 1)
                    + _factors(lowering, node.input[1], nodes, depth - 1))
        if node.op_type == "Pow" and _close(scalar_of(lowering.values.get(node.input[1])), 3.0, 0.0):
            nodes.append(node)
            return [str(node.input[0])] * 3
    return [name]


def _split_consts(lowering: Any, factors: list[str]) -> tuple[float | None, list[str]]:
    """(the product of the constant scalar factors, or None if one is not a scalar; the runtime factors)."""
    c = 1.0
    runtime = []
    for f in factors:
        v = lowering.values.get(f)
        if isinstance(v, np.ndarray):
            s = scalar_of(v)
            if s is None:
                return None, runtime
            c *= float(s)
        else:
            runtime.append(f)
    return c, runtime


def _gelu_tanh_x(lowering: Any, node: Any) -> tuple[str, int] | None:
    """(x, the number of the pattern's inputs that read x) when ``node`` (a Mul) ends
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as torch exports GELU(approximate='tanh'), in any
    association order of the products."""
    nodes: list[Any] = [node]
    c, runtime = _split_consts(lowering, _factors(lowering, node.input[0], nodes)
                               + _factors(lowering, node.input[1], nodes))
    if len(runtime) != 2 or not _close(c, 0.5, 1e-6):
        return None
    for i in (0, 1):
        x, add = runtime[i], lowering.producer(runtime[1 - i])
        if add is None or add.op_type != "Add" or lowering.n_uses(runtime[1 - i]) != 1:
            continue
        for j in (0, 1):
            tanh = lowering.producer(add.input[j])
            if not _close(scalar_of(lowering.values.get(add.input[1 - j])), 1.0, 1e-6) or tanh is None:
                continue
            if tanh.op_type != "Tanh" or lowering.n_uses(add.input[j]) != 1:
                continue
            found = [add, tanh]
            k, inner = _split_consts(lowering, _factors(lowering, tanh.input[0], found))
            if len(inner) != 1 or not _close(k, float(np.sqrt(2.0 / np.pi)), 1e-5):
                continue
            add2 = lowering.producer(inner[0])
            if add2 is None or add2.op_type != "Add" or lowering.n_uses(inner[0]) != 1:
                continue
            found.append(add2)
            for t in (0, 1):
                if add2.input[t] != x:
                    continue
                a, cube = _split_consts(lowering, _factors(lowering, add2.input[1 - t], found))
                if cube == [x, x, x] and _close(a, 0.044715, 1e-5):
                    reads = sum(list(n.input).count(x) for n in nodes + found)
                    return x, reads
    return None


@rewrite("conv_epilogue", "Mul")
def match_gemm_gelu_tanh(lowering: Any, node: Any) -> list[Value] | None:
    """GELU (tanh form) of a native GEMM's output -> the GEMM with it in its epilogue."""
    hit = _gelu_tanh_x(lowering, node)
    if hit is None:
        return None
    gemm = fuse_gemm_act(lowering, hit[0], hit[1], "gelu_tanh", count=False)  # the lowering counts this match
    return None if gemm is None else [gemm]


@rewrite("geglu", "Mul")
def match_geglu(lowering: Any, node: Any) -> list[Value] | None:
    """hidden * gelu(gate) (diffusers' GEGLU: both halves of one projection, sliced) -> one native
    kernel that reads both halves in place: no copies of the slices, no separate Mul."""
    ops = _native(lowering, "gelu")
    if ops is None:
        return None
    from .native_ops import gelu_erf

    for i in (0, 1):
        gl = lowering.producer(node.input[i])
        if gl is None or gl.op_type != "Mul" or lowering.n_uses(node.input[i]) != 1:
            continue
        x = _gelu_x(lowering, gl)
        xv, hv = lowering.values.get(x) if x else None, lowering.values.get(node.input[1 - i])
        if not isinstance(xv, GTensor) or not isinstance(hv, GTensor) or xv.shape != hv.shape:
            continue
        if xv.dtype != "float32" or hv.dtype != "float32":
            continue
        xv, hv = _rows_dense(lowering, xv), _rows_dense(lowering, hv)
        lowering.used("geglu native")
        return [GTensor(gelu_erf(ops, ggml_lib(), lowering.ctx, xv.ptr, hv.ptr), xv.shape)]
    return None


def _rows_dense(lowering: Any, x: GTensor) -> GTensor:
    """``x`` itself when its rows are dense (what the native elementwise kernels read), else a copy."""
    return x if int(x.ptr.contents.nb[0]) == 4 else cont(lowering, x)


@rewrite("silu", "Mul")
def match_silu(lowering: Any, node: Any) -> list[Value] | None:
    """x * sigmoid(x) -> silu(x); x * sigmoid(c*x) (CLIP's quick GELU) -> silu(c*x) / c."""
    g = ggml_lib()
    for i in (0, 1):
        sig = lowering.producer(node.input[1 - i])
        if sig is None or sig.op_type != "Sigmoid":
            continue
        x = lowering.values[node.input[i]]
        if not isinstance(x, GTensor) or x.dtype != "float32":
            continue
        if sig.input[0] == node.input[i]:
            fused = _gn_silu(lowering, node, str(node.input[i]))
            if fused is not None:
                return fused
            gemm = fuse_gemm_silu(lowering, str(node.input[i]), 2, 1.0)
            if gemm is not None:
                return [gemm]
            x = cont(lowering, x)
            return [GTensor(g.ggml_silu(lowering.ctx, x.ptr), x.shape)]
        src, c = _unscale(lowering, sig.input[0])
        if src == node.input[i] and c not in (0.0, 1.0):
            # the scaled product c x has its own reader (the Sigmoid's input): x is read by it and the Mul
            gemm = fuse_gemm_silu(lowering, str(node.input[i]), 2, c)
            if gemm is not None:
                return [gemm]
            x = cont(lowering, x)
            y = g.ggml_silu(lowering.ctx, g.ggml_scale(lowering.ctx, x.ptr, c))
            return [GTensor(g.ggml_scale(lowering.ctx, y, 1.0 / c), x.shape)]
    return None


def _unscale(lowering: Any, name: str) -> tuple[str, float]:
    """Strip a Mul/Div by a constant scalar: (source name, factor)."""
    node = lowering.producer(name)
    if node is not None and node.op_type in ("Mul", "Div"):
        for i in (0, 1):
            c = scalar_of(lowering.values.get(node.input[1 - i]))
            if c is not None and isinstance(lowering.values.get(node.input[i]), GTensor):
                if node.op_type == "Div":
                    if i == 0 and c != 0:
                        return str(node.input[0]), 1.0 / c
                    continue
                return str(node.input[i]), c
    return name, 1.0


def _mask_f16(mask: np.ndarray, n_q: int, n_kv: int) -> np.ndarray | None:
    """The additive mask as (n_q, n_kv) float16, when it is exact in float16 and per (q, kv) only."""
    m = np.asarray(mask, dtype=np.float32)
    if m.ndim > 2 and any(d != 1 for d in m.shape[:-2]):
        return None
    m = np.broadcast_to(m.reshape(m.shape[-2:] if m.ndim >= 2 else (1,) + m.shape), (n_q, n_kv))
    m = np.where(m <= -65504.0, -np.inf, m)  # e.g. finfo(float32).min: exp() of it is 0 either way
    finite = np.isfinite(m)
    if np.any(finite & (m != 0)) and not np.all(m[finite] == m[finite].astype(np.float16).astype(np.float32)):
        return None
    return np.ascontiguousarray(np.where(finite, m, -np.inf).astype(np.float16))


def guarded_softmax(lowering: Any, node: Any) -> str | None:
    """S when ``node`` is ``Where(IsNaN(S), c, S)`` on S = Softmax(scores [+ constant mask]) and the mask
    leaves every row at least one finite entry, so that no row of S can be NaN from the mask.

    torch's export of scaled_dot_product_attention writes this guard (as transformers 5.17's CLIP does)
    to zero the rows a mask hides entirely; ggml has no NaN test. With a constant mask that hides no
    whole row the guard never fires, and S is its value."""
    if node is None or node.op_type != "Where" or len(node.input) != 3:
        return None
    test, s_name = lowering.producer(node.input[0]), node.input[2]
    if test is None or test.op_type != "IsNaN" or test.input[0] != s_name:
        return None
    sm = lowering.producer(s_name)
    if sm is None or sm.op_type != "Softmax" or not _constant(lowering, node.input[1]):
        return None
    scores, _ = _unscale(lowering, sm.input[0])
    add = lowering.producer(scores)
    if add is not None and add.op_type == "Add":
        for name in add.input:
            mask = lowering.values.get(name)
            if isinstance(mask, np.ndarray):
                axis = int(attrs(sm).get("axis", -1))
                if mask.ndim and not np.isfinite(mask).any(axis=axis).all():
                    return None  # a row the mask hides entirely: the guard matters
    return s_name


def _constant(lowering: Any, name: str) -> bool:
    """``name`` is a constant: folded already, an initializer, or a Constant node's (maybe not yet lowered)."""
    made = lowering.producer(name)
    return isinstance(lowering.values.get(name), np.ndarray) or name in lowering.inits or (
        made is not None and made.op_type == "Constant")


@rewrite("nan_guard", "Where")
def match_nan_guard(lowering: Any, node: Any) -> list[Value] | None:
    """Where(IsNaN(S), c, S) -> S for a softmax whose mask hides no whole row (see ``guarded_softmax``)."""
    s_name = guarded_softmax(lowering, node)
    return None if s_name is None else [lowering.values[s_name]]


@rewrite("attention", "MatMul")
def match_attention(lowering: Any, node: Any) -> list[Value] | None:
    if not lowering.supports_flash_attn:
        return None
    sm = lowering.producer(node.input[0])
    guarded = guarded_softmax(lowering, sm)
    if guarded is not None:  # attention written with torch's NaN guard after the softmax
        sm = lowering.producer(guarded)
    v = lowering.values.get(node.input[1])
    if sm is None or sm.op_type != "Softmax" or not isinstance(v, GTensor) or v.rank not in (3, 4):
        return None
    if int(attrs(sm).get("axis", -1)) not in (-1, v.rank - 1):
        return None
    scores, scale = _unscale(lowering, sm.input[0])
    mask = None
    add = lowering.producer(scores)
    if add is not None and add.op_type == "Add":
        for i in (0, 1):
            if isinstance(lowering.values.get(add.input[1 - i]), np.ndarray):
                mask, scores = lowering.values[add.input[1 - i]], add.input[i]
                break
        scores, s2 = _unscale(lowering, scores)
        scale *= s2
    qk = lowering.producer(scores)
    if qk is None or qk.op_type != "MatMul":
        return None
    qname, sq = _unscale(lowering, qk.input[0])
    ktname, sk = _unscale(lowering, qk.input[1])
    scale *= sq * sk
    q, kt = lowering.values.get(qname), lowering.values.get(ktname)
    if not isinstance(q, GTensor) or not isinstance(kt, GTensor) or q.rank != v.rank or kt.rank != v.rank:
        return None
    perm = list(range(v.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    k = permute(lowering, kt, perm)
    n_q, d = q.shape[-2], q.shape[-1]
    n_kv = k.shape[-2]
    if k.shape[-1] != d or v.shape[-2] != n_kv or q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        return None
    g = ggml_lib()
    ops = _native(lowering, "attention")
    if ops is not None:
        return _native_attention(lowering, ops, q, k, v, mask, scale)
    mask_t = None
    if mask is not None:
        m16 = _mask_f16(mask, n_q, n_kv)
        if m16 is None:
            return None
        mask_t = lowering.const(m16, dtype="float16", tag="fa_mask").ptr
    dv = v.shape[-1]
    # ggml's tiled (vectorised) CPU kernel needs head dims that are a multiple of the SIMD
    # width; zero padding keeps every dot product and weighted sum the same
    dp = aligned(d) if want_pad(lowering, d) else d
    dvp = aligned(dv) if want_pad(lowering, dv) else dv
    q4, k4 = (pad_k(lowering, cont(lowering, t), dp) for t in (q, k))
    v4 = pad_k(lowering, cont(lowering, v), dvp)
    y = g.ggml_flash_attn_ext(lowering.ctx, q4.ptr, k4.ptr, v4.ptr, mask_t, float(scale), 0.0, 0.0)
    g.ggml_flash_attn_ext_set_prec(y, g.GGML_PREC_F32)
    if lowering.device_backend is not None and not g.ggml_backend_supports_op(lowering.device_backend, y):
        # the device's flash attention does not take this one (CUDA's: head dims 40-256 but not 160, SD 1.5's deepest
        # blocks): lowered the plain way it stays on the device, where ggml's scheduler would run it on the CPU (the
        # nodes made for the question stay unused in the context; a mask constant made for it stays in the weights)
        return None
    if dvp != dv:
        nb = y.contents.nb
        y = g.ggml_view_4d(lowering.ctx, y, dv, y.contents.ne[1], y.contents.ne[2], y.contents.ne[3],
                           nb[1], nb[2], nb[3], 0)
    if v.rank == 4:
        b, h = q.shape[0], q.shape[1]
        out = GTensor(y, (b, n_q, h, dv))  # ggml result: ne (Dv, H, n_q, B)
        return [permute(lowering, out, [0, 2, 1, 3])]
    bh = q.shape[0]
    out = GTensor(y, (n_q, bh, dv))
    return [permute(lowering, out, [1, 0, 2])]


def _native(lowering: Any, what: str) -> Any:
    """sdrt-ggml's own kernel for ``what`` (option ``what``: "native", the default, or "ggml"),
    when the graph runs on the CPU and the native library loaded; else None."""
    if not lowering.on_cpu or lowering.options.get(what, "native") != "native":
        return None
    from .native_ops import native_ops

    return native_ops()


def _attention_out(lowering: Any, y: Any, q: GTensor, dv: int) -> list[Value]:
    """The ONNX value of an attention result laid out as ggml_flash_attn_ext's: ne (Dv, H, n_q, B)."""
    n_q = q.shape[-2]
    if q.rank == 4:
        out = GTensor(y, (q.shape[0], n_q, q.shape[1], dv))
        return [permute(lowering, out, [0, 2, 1, 3])]
    return [permute(lowering, GTensor(y, (n_q, q.shape[0], dv)), [1, 0, 2])]


def _native_attention(lowering: Any, ops: Any, q: GTensor, k: GTensor, v: GTensor, mask: np.ndarray | None,
                      scale: float) -> list[Value] | None:
    """softmax(Q K^T s + mask) V by sdrt-ggml's kernel: Q, K and V are read through their strides
    (no copies, no head-dim padding); the mask must be per (query, key)."""
    from .native_ops import attention

    n_q, n_kv = q.shape[-2], k.shape[-2]
    mask_t = None
    if mask is not None:
        m = np.asarray(mask, dtype=np.float32)
        if m.ndim > 2 and any(d != 1 for d in m.shape[:-2]):
            return None
        m2 = m.reshape(m.shape[-2:] if m.ndim >= 2 else (1,) + m.shape)
        if m2.shape[0] not in (1, n_q) or m2.shape[1] not in (1, n_kv):
            return None
        m2 = np.ascontiguousarray(np.broadcast_to(m2, (m2.shape[0], n_kv)))
        mask_t = lowering.const(m2, tag="attn_mask").ptr
    lowering.used("attention native")
    from .native import bf16_for

    bf16 = mask is None and bf16_for(lowering)
    if bf16:
        lowering.used("attention bf16")
    y = attention(ops, ggml_lib(), lowering.ctx, q.ptr, k.ptr, v.ptr, mask_t, scale, bf16=bf16)
    return _attention_out(lowering, y, q, v.shape[-1])


@rewrite("groupnorm", "Reshape")
def match_group_norm(lowering: Any, node: Any) -> list[Value] | None:
    from .ops.op_norm import group_norm

    inorm = lowering.producer(node.input[0])
    if inorm is None or inorm.op_type != "InstanceNormalization":
        return None
    pre = lowering.producer(inorm.input[0])
    if pre is None or pre.op_type != "Reshape":
        return None
    x = lowering.values.get(pre.input[0])
    grouped = lowering.values.get(inorm.input[0])
    scale, bias = lowering.values.get(inorm.input[1]), lowering.values.get(inorm.input[2])
    if not isinstance(x, GTensor) or not isinstance(grouped, GTensor) or x.rank < 3 or grouped.rank != 3:
        return None
    if not isinstance(scale, np.ndarray) or not isinstance(bias, np.ndarray):
        return None
    if not (np.all(scale == 1) and not np.any(bias)):
        return None
    n, groups = grouped.shape[0], grouped.shape[1]
    if n != x.shape[0] or x.shape[1] % groups:
        return None
    target = lowering.values.get(node.input[1])
    if not isinstance(target, np.ndarray):
        return None
    want = [x.shape[i] if (d == 0) else int(d) for i, d in enumerate(target.reshape(-1))]
    if -1 in want:
        want[want.index(-1)] = x.size // max(1, int(np.prod([w for w in want if w != -1])))
    if tuple(want) != x.shape:
        return None
    eps = float(attrs(inorm).get("epsilon", 1e-5))
    ops = _native(lowering, "groupnorm")
    if ops is not None:
        stats_x = cont(lowering, x)
        spec = GnSpec(stats_x, _gn_stats(lowering, ops, stats_x, groups, eps), groups)
        return [_gn_emit(lowering, ops, spec, str(node.output[0]))]
    return [group_norm(lowering, x, groups, eps, None, None)]


@dataclass(frozen=True)
class GnSpec:
    """A native group norm and what has been fused into it so far."""

    x: GTensor  # the dense NCHW input
    stats: Any  # the ggml tensor of (mean, rstd) per group
    groups: int
    gamma: Any = None  # ggml tensors of C floats
    beta: Any = None
    silu: bool = False


def _gn_stats(lowering: Any, ops: Any, x: GTensor, groups: int, eps: float) -> Any:
    from .native_ops import gn_stats

    n, c = x.shape[0], x.shape[1]
    x3 = ggml_lib().ggml_reshape_3d(lowering.ctx, x.ptr, x.size // (n * c), c, n)
    return gn_stats(ops, ggml_lib(), lowering.ctx, x3, groups, eps)


def _gn_emit(lowering: Any, ops: Any, spec: GnSpec, name: str) -> GTensor:
    """The group norm ``spec`` as an ONNX value: NCHW, with a channels-last twin for batch 1
    (ggml computes only the layouts that consumers read)."""
    from .native_ops import gn_apply

    g, ctx, x = ggml_lib(), lowering.ctx, spec.x
    n, c = x.shape[0], x.shape[1]
    hw = x.size // (n * c)
    x3 = g.ggml_reshape_3d(ctx, x.ptr, hw, c, n)
    y = gn_apply(ops, g, ctx, x3, spec.stats, spec.gamma, spec.beta, spec.groups, silu=spec.silu, cl=False)
    out = GTensor(g.ggml_reshape_4d(ctx, y, *ne_of(x.shape)), x.shape)
    if x.rank == 4:  # a direct conv next reads the values zero-padded: written so, not copied after
        out.padded = lambda top, left, wp, hp: gn_apply(ops, g, ctx, x3, spec.stats, spec.gamma, spec.beta, spec.groups,
                                                        silu=spec.silu, cl=False,
                                                        pad=(x.shape[3], top, left, wp, hp))
    if n == 1 and x.rank == 4:
        ycl = gn_apply(ops, g, ctx, x3, spec.stats, spec.gamma, spec.beta, spec.groups, silu=spec.silu, cl=True)
        out.cl = g.ggml_reshape_4d(ctx, ycl, c, x.shape[3], x.shape[2], 1)
    lowering.gn_specs[name] = spec
    lowering.used("groupnorm native" + (" +affine" if spec.gamma is not None or spec.beta is not None else "")
                  + (" +silu" if spec.silu else ""))
    return out


def _gn_operand(lowering: Any, node: Any) -> tuple[GnSpec, np.ndarray] | None:
    """(the native group norm, the per-channel constant) when ``node`` combines the two, and the
    group norm's value is used only here."""
    specs = getattr(lowering, "gn_specs", {})
    for i in (0, 1):
        spec = specs.get(node.input[i])
        other = lowering.values.get(node.input[1 - i])
        if spec is None or lowering.n_uses(node.input[i]) != 1 or not isinstance(other, np.ndarray):
            continue
        c, rank = spec.x.shape[1], spec.x.rank
        if other.ndim > rank or other.dtype.kind != "f":
            continue
        shape = (1,) * (rank - other.ndim) + other.shape  # numpy broadcasting, right-aligned
        if shape[1] == c and all(d == 1 for i, d in enumerate(shape) if i != 1):
            return spec, other
    return None


@rewrite("groupnorm", "Mul")
def match_gn_scale(lowering: Any, node: Any) -> list[Value] | None:
    """native group norm * gamma (per channel) -> the same kernel with gamma."""
    ops = _native(lowering, "groupnorm")
    hit = _gn_operand(lowering, node) if ops is not None else None
    if hit is None or hit[0].gamma is not None or hit[0].beta is not None or hit[0].silu:
        return None
    spec, gamma = hit
    t = lowering.const(gamma, transform=lambda a: a.reshape(-1), tag="gn_gamma").ptr
    return [_gn_emit(lowering, ops, replace(spec, gamma=t), str(node.output[0]))]


@rewrite("groupnorm", "Add")
def match_gn_shift(lowering: Any, node: Any) -> list[Value] | None:
    """native group norm [* gamma] + beta (per channel) -> the same kernel with beta."""
    ops = _native(lowering, "groupnorm")
    hit = _gn_operand(lowering, node) if ops is not None else None
    if hit is None or hit[0].beta is not None or hit[0].silu:
        return None
    spec, beta = hit
    t = lowering.const(beta, transform=lambda a: a.reshape(-1), tag="gn_beta").ptr
    return [_gn_emit(lowering, ops, replace(spec, beta=t), str(node.output[0]))]


def _gn_silu(lowering: Any, node: Any, x_name: str) -> list[Value] | None:
    """silu of a native group norm's value (its only consumers: the Sigmoid and this Mul)."""
    spec = getattr(lowering, "gn_specs", {}).get(x_name)
    ops = _native(lowering, "groupnorm")
    if spec is None or ops is None or spec.silu or lowering.n_uses(x_name) != 2:
        return None
    return [_gn_emit(lowering, ops, replace(spec, silu=True), str(node.output[0]))]
