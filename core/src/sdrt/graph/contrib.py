"""onnxruntime's contrib ops (domain ``com.microsoft``) rewritten into standard ONNX ops.

Stable Diffusion folders optimized by Olive, by ``onnxruntime.transformers.optimizer`` (its
``models/stable_diffusion/optimize_pipeline``) or by ``optimum-cli export onnx --optimize O2/O3`` hold fused
ops that only onnxruntime defines: MultiHeadAttention, Attention, GroupNorm, SkipGroupNorm, BiasSplitGelu,
BiasAdd, Gelu, FastGelu, BiasGelu, QuickGelu, SkipLayerNormalization, (Skip)SimplifiedLayerNormalization,
NhwcConv, FusedConv and FusedMatMul. ``rewrite_contrib`` replaces each node by the standard ops that compute the
same thing, in the forms the usual exporters write (so that a backend's own pattern matchers for attention,
group norm and GELU still fire), at the graph's opset (nothing here needs more than the opset the exporter
used: LayerNormalization is written only at opset 17 and above, decomposed below). Weights are untouched: new
constants are ``Constant`` nodes, and no initializer is added or removed. The Transposes that NHWC ops leave
between each other cancel, and Resize scales that onnxruntime's float16 converter made float16 are cast back.

A node whose attributes or inputs this module does not handle (past key/value caches, unusual mask formats) is
left as it is, so the backend names it in its usual ``UnsupportedGraph`` refusal; so is every op not listed in
``REWRITES``. Rotary attention (``Attention`` with ``do_rotary=1``) is a ``ModelError`` here instead: OpenVINO
converts that node and silently runs it without the rotation. A node whose attributes onnxruntime's schema does not allow
(``num_heads`` or ``groups`` missing or below 1, an attribute of the wrong type) is a ``ModelError`` naming it.

One small function per op (``_op_<name>``), registered in ``REWRITES``; shared helpers below.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import onnx

log = logging.getLogger("sdrt.graph.contrib")

MS = "com.microsoft"

#: (domain, op type) -> the rewrite (registered by ``@_rewrite``): the new nodes' outputs, or None to keep the node
REWRITES: dict[tuple[str, str], Callable[[_Emit, Any], list[str] | None]] = {}

_FLOAT = 1  # TensorProto.FLOAT
_FLOAT16 = 10
_INT64 = 7
_FLOATS = (_FLOAT, _FLOAT16, 11, 16)  # float, float16, double, bfloat16
#: ops whose output has the rank of their (broadcast) inputs
_SAME_RANK = {"Add", "Sub", "Mul", "Div", "Transpose", "Identity", "Sigmoid", "Erf", "Tanh", "Pow", "Cast", "Conv",
              "InstanceNormalization", "Softmax", "Where", "Sqrt"}


def _rewrite(*names: str, domain: str = MS) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for n in names:
            REWRITES[(domain, n)] = fn
        return fn

    return deco


def is_contrib(node: Any) -> bool:
    """Whether ``node`` is an op that ``rewrite_contrib`` can rewrite (by its domain and type)."""
    return ((node.domain or ""), node.op_type) in REWRITES


@dataclass
class _Emit:
    """Builds the replacement nodes of one contrib node: fresh names, constants, the graph's opset and types."""

    node: Any
    opset: int
    types: dict[str, int]
    ranks: dict[str, int]
    nodes: list[Any] = field(default_factory=list)
    k: int = 0
    #: whether the node's mean / inv_std_var outputs (normalizations) are read
    uses_stats: bool = False

    # -- naming and nodes ------------------------------------------------------
    def fresh(self, what: str) -> str:
        self.k += 1
        base = self.node.name or f"{self.node.op_type}_{self.node.output[0]}"
        return f"{base}/sdrt_{what}_{self.k}"

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, outputs: list[str] | None = None,
           **attrs: Any) -> list[str]:
        from onnx import helper

        outs = outputs or [self.fresh(op_type) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.fresh(op_type + "_node"), **attrs))
        # what later steps of this rewrite ask of the new values: their element type and rank
        elem = attrs["to"] if op_type == "Cast" else _INT64 if op_type in ("Shape", "Range") else \
            next((self.types[i] for i in inputs if i in self.types and self.types[i] in _FLOATS), None)
        ranks = [self.ranks[i] for i in inputs if i in self.ranks]
        for o in outs:
            if elem is not None:
                self.types.setdefault(o, elem)
            if op_type in _SAME_RANK and ranks:
                self.ranks.setdefault(o, max(ranks))
        return outs

    def one(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        return self.op(op_type, inputs, outputs=[out] if out else None, **attrs)[0]

    def const(self, value: Any, elem: int | None = None) -> str:
        """A Constant node of ``value`` (float values in ``elem``'s type, by default float32)."""
        from onnx import helper, numpy_helper

        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            arr = arr.astype(helper.tensor_dtype_to_np_dtype(elem or _FLOAT))
        name = self.fresh("const")
        self.nodes.append(helper.make_node("Constant", [], [name], name=name + "_node",
                                           value=numpy_helper.from_array(arr, name)))
        return name

    def ints(self, values: Iterable[int]) -> str:
        return self.const(np.asarray(list(values), np.int64))

    # -- types ---------------------------------------------------------------
    def elem(self, *names: str) -> int:
        """The element type of the first of ``names`` whose type is known (float32 if none is)."""
        for n in names:
            if n and n in self.types:
                return self.types[n]
        return _FLOAT

    def like(self, name: str, elem: int) -> str:
        """``name`` cast to ``elem`` when its type is known to differ (an fp32 gamma in an fp16 graph)."""
        if name in self.types and self.types[name] != elem:
            return self.one("Cast", [name], to=elem)
        return name

    # -- shared pieces ---------------------------------------------------------
    def reduce_mean(self, x: str, axes: list[int]) -> str:
        if self.opset >= 18:
            return self.one("ReduceMean", [x, self.ints(axes)], keepdims=1)
        return self.one("ReduceMean", [x], axes=axes, keepdims=1)

    def split2(self, x: str, axis: int) -> list[str]:
        if self.opset >= 18:
            return self.op("Split", [x], 2, axis=axis, num_outputs=2)
        return self.op("Split", [x], 2, axis=axis)

    def gelu(self, x: str, out: str | None = None) -> str:
        """x * 0.5 * (1 + erf(x / sqrt 2)), as torch exports it."""
        e = self.elem(x)
        t = self.one("Div", [x, self.const(math.sqrt(2.0), e)])
        a = self.one("Add", [self.one("Erf", [t]), self.const(1.0, e)])
        return self.one("Mul", [self.one("Mul", [x, a]), self.const(0.5, e)], out)

    def gelu_tanh(self, x: str, out: str | None = None) -> str:
        """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch exports gelu(approximate='tanh')."""
        e = self.elem(x)
        cube = self.one("Pow", [x, self.const(3.0, e)])
        inner = self.one("Add", [x, self.one("Mul", [cube, self.const(0.044715, e)])])
        t = self.one("Tanh", [self.one("Mul", [inner, self.const(math.sqrt(2.0 / math.pi), e)])])
        a = self.one("Add", [t, self.const(1.0, e)])
        return self.one("Mul", [self.one("Mul", [x, self.const(0.5, e)]), a], out)

    def silu(self, x: str, out: str | None = None) -> str:
        return self.one("Mul", [x, self.one("Sigmoid", [x])], out)

    def layer_norm(self, x: str, gamma: str, beta: str | None, eps: float, out: str | None = None) -> str:
        e = self.elem(x)
        gamma = self.like(gamma, e)
        beta = self.like(beta, e) if beta else None
        if self.opset >= 17:
            return self.one("LayerNormalization", [x, gamma] + ([beta] if beta else []), out, axis=-1, epsilon=eps)
        d = self.one("Sub", [x, self.reduce_mean(x, [-1])])
        var = self.reduce_mean(self.one("Mul", [d, d]), [-1])
        y = self.one("Div", [d, self.one("Sqrt", [self.one("Add", [var, self.const(eps, e)])])])
        return self.one("Add", [self.one("Mul", [y, gamma]), beta], out) if beta else self.one("Mul", [y, gamma], out)

    def rms_norm(self, x: str, gamma: str, eps: float, out: str | None = None) -> str:
        e = self.elem(x)
        ms = self.reduce_mean(self.one("Mul", [x, x]), [-1])
        y = self.one("Div", [x, self.one("Sqrt", [self.one("Add", [ms, self.const(eps, e)])])])
        return self.one("Mul", [y, self.like(gamma, e)], out)

    def group_norm(self, x: str, gamma: str, beta: str, groups: int, eps: float, out: str | None = None) -> str:
        """GroupNorm of NCHW ``x`` as torch exports it: Reshape (N, G, -1), InstanceNormalization with unit scale,
        Reshape back, then the per-channel scale and shift."""
        e = self.elem(x)
        g = self.one("Reshape", [x, self.ints([0, groups, -1])])
        n = self.one("InstanceNormalization", [g, self.const(np.ones(groups), e), self.const(np.zeros(groups), e)],
                     epsilon=eps)
        y = self.one("Reshape", [n, self.one("Shape", [x])])
        rank = self.ranks.get(x, 4)
        gshape = self.ints([-1] + [1] * (rank - 2))
        scaled = self.one("Mul", [y, self.one("Reshape", [self.like(gamma, e), gshape])])
        return self.one("Add", [scaled, self.one("Reshape", [self.like(beta, e), gshape])], out)

    def attention(self, q: str, k: str, v: str, heads: int, scale: float | None, *, bias_add: str | None = None,
                  packed: str = "", out: str | None = None) -> str:
        """softmax(Q K^T scale + bias_add) V over ``heads`` heads, as exporters write it (Reshape to heads,
        Transpose, MatMul, Mul, Softmax, MatMul) so that a backend's attention matcher sees it.

        ``packed``: "" (q, k, v are (B, S, D)), "qkv" (q is (B, S, N, 3, H)), "kv" (k is (B, L, N, 2, H)),
        "bnsh" (k and v are (B, N, L, H) already)."""
        e = self.elem(q, k, v)
        if packed == "qkv":
            q, k, v = (self.one("Gather", [q, self.const(np.int64(i))], axis=3) for i in range(3))  # (B, S, N, H)
        elif packed == "kv":
            k, v = (self.one("Gather", [k, self.const(np.int64(i))], axis=3) for i in range(2))
        heads4 = self.ints([0, 0, heads, -1])
        if packed != "qkv":
            q = self.one("Reshape", [q, heads4])
        qh = self.one("Transpose", [q], perm=[0, 2, 1, 3])                         # (B, N, S, H)
        if packed == "bnsh":
            kt = self.one("Transpose", [k], perm=[0, 1, 3, 2])
            vh = v
        else:
            if packed not in ("qkv", "kv"):
                k, v = self.one("Reshape", [k, heads4]), self.one("Reshape", [v, heads4])
            kt = self.one("Transpose", [k], perm=[0, 2, 3, 1])                     # (B, N, H, L)
            vh = self.one("Transpose", [v], perm=[0, 2, 1, 3])                     # (B, N, L, H)
        scores = self.one("MatMul", [qh, kt])
        if scale is None:  # 1/sqrt(head size), from the shape (a constant once shapes are known)
            h = self.one("Cast", [self.one("Gather", [self.one("Shape", [qh]), self.const(np.int64(3))])], to=e)
            s = self.one("Div", [self.const(1.0, e), self.one("Sqrt", [h])])
        else:
            s = self.const(scale, e)
        scores = self.one("Mul", [scores, s])
        if bias_add:
            scores = self.one("Add", [scores, bias_add])
        y = self.one("MatMul", [self.one("Softmax", [scores], axis=-1), vh])       # (B, N, S, Hv)
        y = self.one("Transpose", [y], perm=[0, 2, 1, 3])
        return self.one("Reshape", [y, self.ints([0, 0, -1])], out)

    def causal_mask(self, s: str, n: str, elem: int, fill: float) -> str:
        """An additive (S, L) mask from the scalars ``s`` and ``n`` (L): ``fill`` where key j comes after query i
        (j > i + L - S), 0 elsewhere (a constant once shapes are known). Opset 11 ops only."""
        one, zero = self.const(np.int64(1)), self.const(np.int64(0))
        r = self.one("Range", [zero, s, one])
        rows = self.one("Unsqueeze", [r], axes=[1]) if self.opset < 13 else self.one("Unsqueeze", [r, self.ints([1])])
        cols = self.one("Range", [zero, n, one])
        later = self.one("Greater", [cols, self.one("Add", [rows, self.one("Sub", [n, s])])])
        return self.one("Where", [later, self.const(fill, elem), self.const(0.0, elem)])


class _Skip(Exception):
    """Raised by a rewrite that finds attributes it does not handle: the node stays as it is."""


class _Dropped(Exception):
    """A node whose meaning rests on an attribute sdrt does not rewrite and a backend converting the op itself
    ignores (OpenVINO runs com.microsoft.Attention with ``do_rotary=1`` as without it): refused, not left."""


class _Malformed(Exception):
    """Raised by a rewrite that finds an attribute onnxruntime's schema does not allow (a required one missing, a
    count below 1): the graph is refused naming the node, where leaving it to the backend gave a backend's own
    unclear message, or a graph that computes something else (``num_heads=0`` reshapes to the width unchanged)."""


def _count(a: dict[str, Any], name: str) -> int:
    """The required positive integer attribute ``name`` (``num_heads``, ``groups``)."""
    if name not in a:
        raise _Malformed(f"has no {name} attribute, which onnxruntime requires")
    value = a[name]
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise _Malformed(f"has {name}={value!r:.40}; it must be a whole number of 1 or more")
    return int(value)


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _inp(node: Any, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _used(node: Any, i: int, uses: dict[str, int]) -> bool:
    return len(node.output) > i and bool(node.output[i]) and uses.get(node.output[i], 0) > 0


# -- activations ---------------------------------------------------------------------------------------
@_rewrite("Gelu")
def _op_gelu(em: _Emit, node: Any) -> list[str] | None:
    return [em.gelu(node.input[0], node.output[0])]


@_rewrite("BiasGelu")
def _op_bias_gelu(em: _Emit, node: Any) -> list[str] | None:
    return [em.gelu(em.one("Add", [node.input[0], node.input[1]]), node.output[0])]


@_rewrite("FastGelu")
def _op_fast_gelu(em: _Emit, node: Any) -> list[str] | None:
    x = em.one("Add", [node.input[0], node.input[1]]) if _inp(node, 1) else node.input[0]
    return [em.gelu_tanh(x, node.output[0])]


@_rewrite("QuickGelu")
def _op_quick_gelu(em: _Emit, node: Any) -> list[str] | None:
    x, alpha = node.input[0], float(_attrs(node).get("alpha", 1.702))
    sig = em.one("Sigmoid", [em.one("Mul", [x, em.const(alpha, em.elem(x))])])
    return [em.one("Mul", [x, sig], node.output[0])]


@_rewrite("BiasAdd")
def _op_bias_add(em: _Emit, node: Any) -> list[str] | None:
    return [em.one("Add", [em.one("Add", [node.input[0], node.input[1]]), node.input[2]], node.output[0])]


@_rewrite("BiasSplitGelu")
def _op_bias_split_gelu(em: _Emit, node: Any) -> list[str] | None:
    left, right = em.split2(em.one("Add", [node.input[0], node.input[1]]), -1)
    return [em.one("Mul", [left, em.gelu(right)], node.output[0])]


# -- normalizations --------------------------------------------------------------------------------------
@_rewrite("SkipLayerNormalization")
def _op_skip_layer_norm(em: _Emit, node: Any) -> list[str] | None:
    if em.uses_stats:  # the mean / inv_std_var outputs: no exporter's graph reads them
        return None
    s = em.one("Add", [node.input[0], node.input[1]])
    if _inp(node, 4):
        s = em.one("Add", [s, node.input[4]])
    if len(node.output) > 3 and node.output[3]:
        s = em.one("Identity", [s], node.output[3])
    eps = float(_attrs(node).get("epsilon", 1e-12))
    return [em.layer_norm(s, node.input[2], _inp(node, 3) or None, eps, node.output[0])]


@_rewrite("SkipSimplifiedLayerNormalization")
def _op_skip_simplified_layer_norm(em: _Emit, node: Any) -> list[str] | None:
    if em.uses_stats:
        return None
    s = em.one("Add", [node.input[0], node.input[1]])
    if _inp(node, 3):
        s = em.one("Add", [s, node.input[3]])
    if len(node.output) > 3 and node.output[3]:
        s = em.one("Identity", [s], node.output[3])
    return [em.rms_norm(s, node.input[2], float(_attrs(node).get("epsilon", 1e-12)), node.output[0])]


@_rewrite("SimplifiedLayerNormalization", domain="")
@_rewrite("SimplifiedLayerNormalization")
def _op_simplified_layer_norm(em: _Emit, node: Any) -> list[str] | None:
    a = _attrs(node)
    if em.uses_stats or int(a.get("axis", -1)) != -1:
        return None
    return [em.rms_norm(node.input[0], node.input[1], float(a.get("epsilon", 1e-5)), node.output[0])]


def _group_norm(em: _Emit, node: Any, x: str, out: str, *, nchw: bool = False) -> str:
    """GroupNorm / SkipGroupNorm's normalization of ``x`` (channels-first already when ``nchw``) into ``out``."""
    a = _attrs(node)
    act = int(a.get("activation", 0))
    if act not in (0, 1):
        raise _Skip
    rank = em.ranks.get(x, 4)
    last = int(a.get("channels_last", 1))
    if last and not nchw:
        x = em.one("Transpose", [x], perm=[0, rank - 1, *range(1, rank - 1)])
        em.ranks[x] = rank
    y = em.group_norm(x, node.input[1], node.input[2], _count(a, "groups"), float(a.get("epsilon", 1e-5)),
                      None if (last or act) else out)
    if act:
        y = em.silu(y, None if last else out)
    if last:
        y = em.one("Transpose", [y], out, perm=[0, *range(2, rank), 1])
    return y


@_rewrite("GroupNorm")
def _op_group_norm(em: _Emit, node: Any) -> list[str] | None:
    return [_group_norm(em, node, node.input[0], node.output[0])]


@_rewrite("SkipGroupNorm")
def _op_skip_group_norm(em: _Emit, node: Any) -> list[str] | None:
    # the sum is taken channels-first, so that the Transposes around it cancel with those of the NhwcConvs that
    # feed it and of the ops that read its sum
    x, skip, rank = node.input[0], node.input[3], em.ranks.get(node.input[0], 4)
    last = int(_attrs(node).get("channels_last", 1))
    if last:
        to_first = [0, rank - 1, *range(1, rank - 1)]
        x, skip = (em.one("Transpose", [v], perm=to_first) for v in (x, skip))  # skip may be (N, 1, 1, C)
    s = em.one("Add", [x, skip])
    if _inp(node, 4):
        bias = em.like(node.input[4], em.elem(node.input[0]))
        s = em.one("Add", [s, em.one("Reshape", [bias, em.ints([-1] + [1] * (rank - 2))])])
    em.ranks[s] = rank
    if len(node.output) > 1 and node.output[1]:
        if last:
            em.one("Transpose", [s], node.output[1], perm=[0, *range(2, rank), 1])
        else:
            em.one("Identity", [s], node.output[1])
    return [_group_norm(em, node, s, node.output[0], nchw=True)]


# -- convolutions and matmuls ----------------------------------------------------------------------------
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@_rewrite("NhwcConv")
def _op_nhwc_conv(em: _Emit, node: Any) -> list[str] | None:
    a = {k: v for k, v in _attrs(node).items() if k in _CONV_ATTRS}
    rank = em.ranks.get(node.input[0], 4)
    to_first = [0, rank - 1, *range(1, rank - 1)]
    x = em.one("Transpose", [node.input[0]], perm=to_first)
    w = em.one("Transpose", [node.input[1]], perm=to_first)  # the weight is channels-last too: (M, kH, kW, C/g)
    y = em.one("Conv", [x, w, *node.input[2:]], **a)
    return [em.one("Transpose", [y], node.output[0], perm=[0, *range(2, rank), 1])]


_ACTS = {"Relu": (), "Tanh": (), "Sigmoid": (), "LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"),
         "Clip": ()}


@_rewrite("FusedConv")
def _op_fused_conv(em: _Emit, node: Any) -> list[str] | None:
    a = _attrs(node)
    act = a.get("activation", b"")
    act = act.decode() if isinstance(act, bytes) else str(act)
    params = list(a.get("activation_params", []))
    if act and act not in _ACTS:
        return None
    y = em.one("Conv", [i for i in node.input[:3]], **{k: v for k, v in a.items() if k in _CONV_ATTRS})
    if _inp(node, 3):
        y = em.one("Add", [y, node.input[3]])
    out = node.output[0]
    if not act:
        return [em.one("Identity", [y], out)]
    if act == "Clip":
        e = em.elem(node.input[0], node.input[1])
        lo, hi = (params + [-np.inf, np.inf])[:2] if params else (-np.inf, np.inf)
        if em.opset >= 11:
            return [em.one("Clip", [y, em.const(lo, e), em.const(hi, e)], out)]
        return [em.one("Clip", [y], out, min=float(lo), max=float(hi))]
    kw = {name: float(v) for name, v in zip(_ACTS[act], params)}
    return [em.one(act, [y], out, **kw)]


@_rewrite("FusedMatMul")
def _op_fused_matmul(em: _Emit, node: Any) -> list[str] | None:
    a = _attrs(node)
    if int(a.get("transBatchA", 0)) or int(a.get("transBatchB", 0)):
        return None
    ins = []
    for i, flag in ((0, "transA"), (1, "transB")):
        x = node.input[i]
        if int(a.get(flag, 0)):
            rank = em.ranks.get(x)
            if rank is None or rank < 2:
                return None
            x = em.one("Transpose", [x], perm=[*range(rank - 2), rank - 1, rank - 2])
        ins.append(x)
    alpha = float(a.get("alpha", 1.0))
    if alpha == 1.0:
        return [em.one("MatMul", ins, node.output[0])]
    y = em.one("MatMul", ins)
    return [em.one("Mul", [y, em.const(alpha, em.elem(node.input[0], node.input[1]))], node.output[0])]


# -- attention -------------------------------------------------------------------------------------------
def _mask_and_bias(em: _Emit, node: Any, mask_at: int, elem: int, fill: float) -> tuple[str | None, bool]:
    """An attention node's additive bias: its key padding mask (input ``mask_at``) as a bias, plus its attention
    bias (input 5); ``(None, True)`` with neither, ``(None, False)`` for a mask format not rewritten."""
    extra = None
    if _inp(node, mask_at):
        extra = _mask_to_bias(em, node.input[mask_at], elem, fill)
        if extra is None:
            return None, False
    if _inp(node, 5):
        extra = em.one("Add", [extra, node.input[5]]) if extra else node.input[5]
    return extra, True


def _mask_to_bias(em: _Emit, mask: str, elem: int, fill: float) -> str | None:
    """A (B, L) 0/1 key padding mask as an additive (B, 1, 1, L) bias; None for other mask formats."""
    if em.ranks.get(mask) != 2:
        return None
    m = em.one("Cast", [mask], to=elem)
    bias = em.one("Mul", [em.one("Sub", [em.const(1.0, elem), m]), em.const(fill, elem)])
    return em.one("Reshape", [bias, em.ints([0, 1, 1, -1])])


@_rewrite("MultiHeadAttention")
def _op_multi_head_attention(em: _Emit, node: Any) -> list[str] | None:
    a = _attrs(node)
    if int(a.get("unidirectional", 0)) or len(node.output) > 1 and any(node.output[1:]):
        return None
    if any(_inp(node, i) for i in range(6, len(node.input))):  # past key/value, cache indirection
        return None
    heads = _count(a, "num_heads")
    q, k, v, bias = _inp(node, 0), _inp(node, 1), _inp(node, 2), _inp(node, 3)
    e = em.elem(q, k, v)
    if not k and not v:
        packed = "qkv"
    elif k and not v:
        packed = "kv"
    elif em.ranks.get(k) == 4 and em.ranks.get(v) == 4:
        packed = "bnsh"
    else:
        packed = ""
    if em.ranks.get(q) == 5 and packed != "qkv" or packed == "qkv" and em.ranks.get(q, 5) != 5:
        return None
    if bias:
        if packed:
            return None
        bq, bk, bv = em.op("Split", [bias], 3, axis=0, **({"num_outputs": 3} if em.opset >= 18 else {}))
        q, k, v = em.one("Add", [q, bq]), em.one("Add", [k, bk]), em.one("Add", [v, bv])
    fill = float(a.get("mask_filter_value", -10000.0))
    extra, ok = _mask_and_bias(em, node, 4, e, fill)
    if not ok:
        return None
    scale = a.get("scale")
    return [em.attention(q, k, v, heads, float(scale) if scale else None, bias_add=extra, packed=packed,
                         out=node.output[0])]


@_rewrite("Attention")
def _op_attention(em: _Emit, node: Any) -> list[str] | None:
    a = _attrs(node)
    if int(a.get("do_rotary", 0)):
        raise _Dropped("has do_rotary=1 (rotary position embedding inside the attention), which sdrt does not "
                       "rewrite and OpenVINO would run without the rotation")
    if int(a.get("past_present_share_buffer", 0)):
        return None
    if _inp(node, 4) or len(node.output) > 1 and any(node.output[1:]):  # past / present
        return None
    if any(_inp(node, i) for i in range(6, len(node.input))):
        return None
    heads = _count(a, "num_heads")
    x, w, b = node.input[0], node.input[1], _inp(node, 2)
    e = em.elem(x, w)
    qkv = em.one("MatMul", [x, w])
    if b:
        qkv = em.one("Add", [qkv, b])
    sizes = [int(s) for s in a.get("qkv_hidden_sizes", [])]
    if sizes:
        q, k, v = em.op("Split", [qkv, em.ints(sizes)] if em.opset >= 13 else [qkv], 3, axis=-1,
                        **({} if em.opset >= 13 else {"split": sizes}))
    else:
        q, k, v = em.op("Split", [qkv], 3, axis=-1, **({"num_outputs": 3} if em.opset >= 18 else {}))
    fill = float(a.get("mask_filter_value", -10000.0))
    extra, ok = _mask_and_bias(em, node, 3, e, fill)
    if not ok:
        return None
    scale = a.get("scale")
    if int(a.get("unidirectional", 0)):  # query i sees keys 0..i (no past here)
        s = em.one("Gather", [em.one("Shape", [x]), em.const(np.int64(1))])
        causal = em.causal_mask(s, s, e, fill)
        extra = em.one("Add", [extra, causal]) if extra else causal
    return [em.attention(q, k, v, heads, float(scale) if scale else None, bias_add=extra, out=node.output[0])]


# -- the pass ----------------------------------------------------------------------------------------------
@dataclass
class Rewritten:
    """What ``rewrite_contrib`` did."""

    model: Any
    #: "domain.Op" -> how many nodes were rewritten
    rewritten: dict[str, int]
    #: "domain.Op" -> names of the contrib nodes left as they are (attributes or inputs not handled)
    kept: dict[str, list[str]]

    def summary(self) -> str:
        return ", ".join(f"{k.split('.')[-1]} x{n}" for k, n in sorted(self.rewritten.items()))


def _types_and_ranks(model: Any, where: str) -> tuple[dict[str, int], dict[str, int]]:
    """Element types and ranks of the graph's values: from shape inference (``protos.infer``, best effort),
    initializers and Constant nodes, then each node's untyped outputs take its first typed input's type."""
    from . import protos

    types: dict[str, int] = {}
    ranks: dict[str, int] = {}
    try:
        inferred = protos.infer(model, where).graph
        infos = list(inferred.input) + list(inferred.value_info) + list(inferred.output)
    except Exception:  # noqa: BLE001 - inference is a help here, not a requirement
        g = model.graph
        infos = list(g.input) + list(g.value_info) + list(g.output)
    for v in infos:
        tt = v.type.tensor_type
        if v.type.HasField("tensor_type") and tt.elem_type:
            types[v.name] = tt.elem_type
            if tt.HasField("shape"):
                ranks[v.name] = len(tt.shape.dim)
    for t in model.graph.initializer:
        types[t.name] = t.data_type
        ranks[t.name] = len(t.dims)
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
                    ranks[n.output[0]] = len(a.t.dims)
        elif n.op_type == "Cast":
            for a in n.attribute:
                if a.name == "to":
                    types.setdefault(n.output[0], a.i)
        elif n.op_type in ("Shape", "Size"):
            types.setdefault(n.output[0], _INT64)
        first = next((types[i] for i in n.input if i in types and types[i] in _FLOATS), None)
        for o in n.output:
            if o and o not in types and first is not None:
                types[o] = first
    return types, ranks


def rewrite_contrib(model: onnx.ModelProto, keep: Iterable[str] = (), *, where: str = "<graph>") -> Rewritten:
    """A copy of ``model`` whose contrib ops (``REWRITES``) are standard ONNX ops, except those named in ``keep``
    (``"com.microsoft.GroupNorm"`` or ``"GroupNorm"``: ops the backend runs itself). ``model`` is not changed;
    when nothing is rewritten the result's ``model`` is ``model`` itself."""
    from .protos import copy_model

    keep = set(keep)
    todo = [n for n in model.graph.node if is_contrib(n) and n.op_type not in keep
            and f"{n.domain}.{n.op_type}" not in keep]
    if not todo:
        return Rewritten(model, {}, {})
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    types, ranks = _types_and_ranks(model, where)
    uses: Counter[str] = Counter(i for n in model.graph.node for i in n.input)
    uses.update(o.name for o in model.graph.output)
    nodes: list[Any] = []
    done: Counter[str] = Counter()
    kept: dict[str, list[str]] = {}
    for i, n in enumerate(model.graph.node):
        key = f"{n.domain}.{n.op_type}" if n.domain else n.op_type
        if n.op_type == "Resize" and not n.domain and len(n.input) > 2 and types.get(n.input[2]) == _FLOAT16:
            # onnxruntime's float16 converter turns Resize's scales float16 as well; ONNX (and shape inference)
            # takes them only as float32
            em = _Emit(n, opset, types, ranks)
            fixed = type(n).FromString(n.SerializeToString())
            fixed.input[2] = em.one("Cast", [n.input[2]], to=_FLOAT)
            nodes.extend([*em.nodes, fixed])
            done["Resize (float16 scales)"] += 1
            continue
        if not (is_contrib(n) and n.op_type not in keep and key not in keep):
            nodes.append(n)
            continue
        em = _Emit(n, opset, types, ranks)
        em.uses_stats = _used(n, 1, uses) or _used(n, 2, uses)
        try:
            outs = REWRITES[((n.domain or ""), n.op_type)](em, n)
        except _Skip:
            outs = None
        except _Dropped as exc:
            from ..errors import ModelError

            raise ModelError(f"the {key} node {n.name or f'#{i}'!r} {exc}", where=where,
                             fix="use the model as exported before onnxruntime's optimizer fused it (or optimize "
                                 "it without rotary fusion)") from None
        except (_Malformed, KeyError, ValueError, TypeError, IndexError) as exc:
            # an attribute of the wrong type (QuickGelu's alpha a string) was a traceback from float()
            why = str(exc) if isinstance(exc, _Malformed) else (
                f"has an attribute or input onnxruntime's schema does not allow ({type(exc).__name__}: {exc})")
            from ..errors import ModelError

            raise ModelError(f"the {key} node {n.name or f'#{i}'!r} {why}", where=where,
                             fix="re-export or re-optimize the model (onnxruntime's optimizer writes valid "
                                 "attributes), or use the model as exported before optimization") from None
        if outs is None:
            nodes.append(n)
            kept.setdefault(key, []).append(n.name or f"#{i} {n.op_type}")
            continue
        nodes.extend(em.nodes)
        done[key] += 1
    out = copy_model(model, initializers=False, value_info=False)
    out.graph.initializer.extend(model.graph.initializer)
    del out.graph.node[:]
    out.graph.node.extend(_cancel_transposes(nodes, {o.name for o in model.graph.output}, types))
    if not any(n.domain == MS for n in nodes):
        keep_ops = [o for o in out.opset_import if o.domain != MS]
        del out.opset_import[:]
        out.opset_import.extend(keep_ops)
    return Rewritten(out, dict(done), kept)


def _cancel_transposes(nodes: list[Any], outputs: set[str], types: dict[str, int]) -> list[Any]:
    """Readers of Transpose(Transpose(x, p), q) with q undoing p read x instead, also through Identity and Casts to
    the type a value has already (onnxruntime's optimizer leaves such Casts between its NHWC ops); Transposes (and
    those Casts) nobody reads go: what NhwcConv and channels-last GroupNorm leave between each other. Nodes are
    copied before any change."""
    producer = {o: n for n in nodes for o in n.output}

    def transparent(n: Any) -> bool:
        if n.domain or n.op_type not in ("Identity", "Cast"):
            return False
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        return n.op_type == "Identity" or (to is not None and types.get(n.input[0]) == to)

    def perm(n: Any) -> list[int] | None:
        p = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
        return p or None

    alias: dict[str, str] = {}
    for n in nodes:
        if n.op_type != "Transpose" or n.domain or n.output[0] in outputs:
            continue
        first = producer.get(n.input[0])
        while first is not None and transparent(first):
            first = producer.get(first.input[0])
        if first is None or first.op_type != "Transpose" or first.domain:
            continue
        p, q = perm(first), perm(n)
        if p is None or q is None or len(p) != len(q) or any(p[q[j]] != j for j in range(len(q))):
            continue
        alias[n.output[0]] = alias.get(first.input[0], first.input[0])
    if not alias:
        return nodes
    import onnx

    for k, n in enumerate(nodes):
        if any(name in alias for name in n.input):
            n = nodes[k] = onnx.NodeProto.FromString(n.SerializeToString())  # the caller's node stays as it was
            for j, name in enumerate(n.input):
                if name in alias:
                    n.input[j] = alias[name]
    read = Counter(i for n in nodes for i in n.input)
    keep = []
    for n in reversed(nodes):  # drop Transposes nobody reads any more (and chains of them)
        if (n.op_type == "Transpose" and not n.domain or transparent(n)) and not read[n.output[0]] \
                and n.output[0] not in outputs:
            for i in n.input:
                read[i] -= 1
            continue
        keep.append(n)
    return keep[::-1]


def rewrite_graph(graph: Any, keep: Iterable[str] = (), backend: str = "") -> Any:
    """``graph`` with its contrib ops rewritten (``rewrite_contrib``), as a new Graph, and a log line saying
    what was rewritten; ``graph`` itself when it has none."""
    if not any(is_contrib(n) for n in graph.model.graph.node):
        return graph
    r = rewrite_contrib(graph.model, keep, where=graph.name)
    if not r.rewritten:
        return graph
    # a backend's compile says it (info); the cost model's costing of the same ops does not need to (debug)
    log.log(logging.INFO if backend else logging.DEBUG, "%s: rewrote onnxruntime contrib ops into standard ONNX ops%s: "
            "%s", graph.name, f" for {backend}" if backend else "", r.summary())
    return graph.derive(r.model)


__all__ = ["REWRITES", "Rewritten", "is_contrib", "rewrite_contrib", "rewrite_graph"]
