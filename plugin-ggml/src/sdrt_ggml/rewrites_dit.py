"""Rewrites for the diffusion transformers' blocks (Flux, SD3.5), matched while lowering:

- ``rmsnorm``: ``x / sqrt(mean(x^2, last axis) + eps)`` as torch exports RMSNorm (Pow or Mul for the square,
  ReduceMean, Add, Sqrt, then Div(1, .) and Mul, Reciprocal and Mul, or one Div) -> ``ggml_rms_norm`` (one
  op; the unfused graph broadcast the per-row scale back with a REPEAT and multiplied elementwise);
- ``rope``: the rotary embedding of interleaved pairs as diffusers' ``apply_rotary_emb`` exports it
  (``x cos + reshape(concat(-x[..., 1::2], x[..., 0::2])) sin``: two strided Slices, Neg, two Unsqueezes, a
  Concat, a Reshape, two Muls and an Add; float32 -> float32 Casts of ``x.float()`` in between are no-ops) -> sdrt-ggml's native rope op, one pass (native/ops.c).

Anchored at the pattern's last node; the ops already emitted for the intermediates stay unreferenced.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ops._common import GTensor, Value, attrs, ggml_lib, scalar_of
from .rewrites import _close, _native, _rows_dense, rewrite


def _const(lowering: Any, name: str) -> np.ndarray | None:
    v = lowering.values.get(name)
    return v if isinstance(v, np.ndarray) else None


def _is_last_axis(axes: Any, rank: int) -> bool:
    a = np.asarray(axes).reshape(-1) if axes is not None else None
    return a is not None and a.size == 1 and int(a[0]) in (-1, rank - 1)


def _single(lowering: Any, name: str, op_type: str | tuple[str, ...]) -> Any:
    """The producer of ``name`` when it is an ``op_type`` node and ``name`` has no other reader."""
    node = lowering.producer(name)
    types = (op_type,) if isinstance(op_type, str) else op_type
    if node is None or node.op_type not in types or lowering.n_uses(name) != 1:
        return None
    return node


def _rms_x(lowering: Any, std: str) -> tuple[str, float] | None:
    """(x, eps) when ``std`` is sqrt(mean(x^2 over the last axis) + eps)."""
    sqrt = _single(lowering, std, "Sqrt")
    add = sqrt and _single(lowering, sqrt.input[0], "Add")
    if add is None:
        return None
    for i in (0, 1):
        eps = scalar_of(_const(lowering, add.input[1 - i]))
        mean = _single(lowering, add.input[i], "ReduceMean")
        if eps is None or mean is None or int(attrs(mean).get("keepdims", 1)) != 1:
            continue
        axes = mean.input[1] if len(mean.input) > 1 and mean.input[1] else None
        sq = _single(lowering, mean.input[0], ("Pow", "Mul"))
        if sq is None:
            continue
        x = str(sq.input[0])
        xv = lowering.values.get(x)
        if not isinstance(xv, GTensor):
            continue
        if not _is_last_axis(_const(lowering, axes) if axes else attrs(mean).get("axes"), xv.rank):
            continue
        if sq.op_type == "Pow" and not _close(scalar_of(_const(lowering, sq.input[1])), 2.0, 0.0):
            continue
        if sq.op_type == "Mul" and sq.input[1] != x:
            continue
        return x, float(eps)
    return None


def _rms_norm(lowering: Any, x: str, eps: float) -> list[Value] | None:
    xv = lowering.values[x]
    if xv.dtype != "float32" or eps < 0:
        return None
    xv = _rows_dense(lowering, xv)
    return [GTensor(ggml_lib().ggml_rms_norm(lowering.ctx, xv.ptr, eps), xv.shape)]


@rewrite("rmsnorm", "Mul")
def match_rms_norm_mul(lowering: Any, node: Any) -> list[Value] | None:
    """x * (1 / std) or x * Reciprocal(std)."""
    for i in (0, 1):
        inv = lowering.producer(node.input[1 - i])
        if inv is None or lowering.n_uses(node.input[1 - i]) != 1:
            continue
        if inv.op_type == "Div" and _close(scalar_of(_const(lowering, inv.input[0])), 1.0, 0.0):
            std = inv.input[1]
        elif inv.op_type == "Reciprocal":
            std = inv.input[0]
        else:
            continue
        hit = _rms_x(lowering, std)
        if hit is not None and hit[0] == node.input[i]:
            return _rms_norm(lowering, *hit)
    return None


@rewrite("rmsnorm", "Div")
def match_rms_norm_div(lowering: Any, node: Any) -> list[Value] | None:
    """x / std."""
    hit = _rms_x(lowering, node.input[1])
    return _rms_norm(lowering, *hit) if hit is not None and hit[0] == node.input[0] else None


def _uncast(lowering: Any, name: str) -> str:
    """``name`` without the float32 -> float32 Casts before it (diffusers' ``x.float()``, a no-op in float32)."""
    node = lowering.producer(name)
    while node is not None and node.op_type == "Cast" and int(attrs(node).get("to", 0)) == 1:
        src = lowering.values.get(node.input[0])
        if not isinstance(src, GTensor) or src.dtype != "float32" or lowering.n_uses(name) != 1:
            break
        name = str(node.input[0])
        node = lowering.producer(name)
    return name


def _value_readers(lowering: Any, name: str) -> int:
    """The readers of ``name`` that need its values: a Shape node only reads its (static) shape, which the
    lowering folds at compile time (torch's export computes the Reshape target from the Concat's Shape)."""
    shape_reads = sum(1 for n in lowering.nodes if n.op_type == "Shape" and name in n.input)
    return lowering.n_uses(name) - shape_reads


def _strided_half(lowering: Any, node: Any, rank: int) -> tuple[str, int] | None:
    """(data, start) when ``node`` is Slice(data, start in {0, 1}, to the end, last axis, step 2)."""
    if node is None or node.op_type != "Slice" or len(node.input) < 5:
        return None
    starts, ends, axes, steps = (_const(lowering, n) for n in node.input[1:5])
    if any(v is None or v.size != 1 for v in (starts, ends, axes, steps)):
        return None
    if int(steps.reshape(-1)[0]) != 2 or not _is_last_axis(axes, rank) or int(ends.reshape(-1)[0]) < 1 << 30:
        return None
    start = int(starts.reshape(-1)[0])
    return (str(node.input[0]), start) if start in (0, 1) else None


def _rotated(lowering: Any, name: str) -> str | None:
    """x when ``name`` is reshape(concat(unsqueeze(-x[..., 1::2]), unsqueeze(x[..., 0::2]), -1), x's shape)."""
    reshape = _single(lowering, name, "Reshape")
    cat = reshape and lowering.producer(reshape.input[0])
    if cat is None or cat.op_type != "Concat" or len(cat.input) != 2 or _value_readers(lowering, reshape.input[0]) != 1:
        return None
    out = lowering.values.get(name)
    if not isinstance(out, GTensor) or int(attrs(cat).get("axis", 0)) not in (-1, out.rank):
        return None
    parts = []
    for i in (0, 1):
        un = _single(lowering, cat.input[i], "Unsqueeze")
        if un is None or not _is_last_axis(_const(lowering, un.input[1]) if len(un.input) > 1 else attrs(un).get(
                "axes"), out.rank + 1):
            return None
        parts.append(un.input[0])
    neg = _single(lowering, parts[0], "Neg")
    imag = neg and _strided_half(lowering, _single(lowering, neg.input[0], "Slice"), out.rank)
    real = _strided_half(lowering, _single(lowering, parts[1], "Slice"), out.rank)
    if not imag or not real or imag[1] != 1 or real[1] != 0 or imag[0] != real[0]:
        return None
    x = lowering.values.get(imag[0])
    return imag[0] if isinstance(x, GTensor) and x.shape == out.shape else None


def _table(lowering: Any, v: Any, x: GTensor) -> Any:
    """``v`` (cos or sin) as a ggml tensor that broadcasts to ``x`` per dim (ne0 equal, dense rows), or None.
    ggml's ne run from the last ONNX dim, so a table of lower rank lines up with ``x`` as numpy broadcasts."""
    from .ops._common import cont

    if isinstance(v, np.ndarray):
        if v.dtype.kind != "f":
            return None
        v = lowering.const(np.asarray(v, np.float32), tag="rope_table")
    if not isinstance(v, GTensor) or v.dtype != "float32" or v.rank > x.rank or v.shape[-1:] != x.shape[-1:]:
        return None
    shape = (1,) * (x.rank - v.rank) + v.shape
    if any(a not in (1, b) for a, b in zip(shape, x.shape)) or len(shape) > 4:
        return None
    return cont(lowering, v).ptr


@rewrite("rope", "Add")
def match_rope(lowering: Any, node: Any) -> list[Value] | None:
    ops = _native(lowering, "rope")
    if ops is None:
        return None
    for i in (0, 1):
        m1 = _single(lowering, node.input[i], "Mul")
        m2 = _single(lowering, node.input[1 - i], "Mul")
        if m1 is None or m2 is None:
            continue
        for j in (0, 1):
            x = _rotated(lowering, _uncast(lowering, m2.input[j]))
            if x is None:
                continue
            sin = lowering.values.get(m2.input[1 - j])
            for t in (0, 1):
                if _uncast(lowering, m1.input[t]) != x:
                    continue
                xv = lowering.values[x]
                if xv.rank > 4 or xv.shape[-1] % 2 or xv.dtype != "float32":
                    return None
                cos_t, sin_t = _table(lowering, lowering.values.get(m1.input[1 - t]), xv), _table(lowering, sin, xv)
                if cos_t is None or sin_t is None:
                    return None
                from .native_ops import rope

                lowering.used("rope native")
                xd = _rows_dense(lowering, xv)  # the op reads dense rows through any row strides
                return [GTensor(rope(ops, ggml_lib(), lowering.ctx, xd.ptr, cos_t, sin_t), xv.shape)]
    return None

