"""ggml's graph-building preconditions, checked in Python before each call.

ggml checks its preconditions with ``GGML_ASSERT``, which calls ``abort()``: no
``except`` catches it and the host process dies. ``checked(lib)`` wraps the
bindings so that every graph-building function listed in ``CHECKS`` first checks
what ggml would assert (the asserts of ggml.c in ggml-python 0.0.45) and raises
``GgmlPrecondition`` instead. The lowering turns that into ``UnsupportedGraph``
naming the node, so a graph ggml cannot build fails like any other unsupported one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

MAX_DIMS = 4
#: bytes per element of ggml's non-block types: F32, F16, I32, I8, I16, BF16 (the half weights, half.py); a
#: block type (Q8_0, Q4_0: quant.py) falls back to its nb[0], and guards see it only as mul_mat's weight
_TYPE_SIZE = {0: 4, 1: 2, 26: 4, 24: 1, 25: 2, 30: 2}


class GgmlPrecondition(ValueError):
    """A ggml call would fail one of ggml's asserts (and abort the process)."""


def ne(t: Any) -> list[int]:
    return [int(t.contents.ne[i]) for i in range(MAX_DIMS)]


def nb(t: Any) -> list[int]:
    return [int(t.contents.nb[i]) for i in range(MAX_DIMS)]


def type_size(t: Any) -> int:
    return _TYPE_SIZE.get(int(t.contents.type), 0) or int(t.contents.nb[0])


def nbytes(t: Any) -> int:
    """ggml_nbytes for non-block types: the last byte a strided tensor touches, plus one."""
    n, b = ne(t), nb(t)
    if any(d == 0 for d in n):
        return 0
    return type_size(t) + sum((n[i] - 1) * b[i] for i in range(MAX_DIMS))


def is_contiguous(t: Any) -> bool:
    """ggml_is_contiguous: dense rows, size-1 dims may have any stride."""
    n, b = ne(t), nb(t)
    expect = type_size(t)
    for i in range(MAX_DIMS):
        if n[i] != 1:
            if b[i] != expect:
                return False
            expect *= n[i]
    return True


def is_packed(t: Any) -> bool:
    """Every stride exactly that of a dense tensor (what ``ggml_is_padded_1d`` and friends want)."""
    n, b = ne(t), nb(t)
    expect = type_size(t)
    for i in range(MAX_DIMS):
        if b[i] != expect:
            return False
        expect *= n[i]
    return True


def _fail(fn: str, why: str, *tensors: Any) -> None:
    shapes = ", ".join(f"ne={ne(t)} nb={nb(t)}" for t in tensors)
    raise GgmlPrecondition(f"{fn}: {why} ({shapes})")


def _can_repeat(t0: Any, t1: Any) -> bool:
    a, b = ne(t0), ne(t1)
    if 0 in a:
        return 0 in b
    return all(b[i] % a[i] == 0 for i in range(MAX_DIMS))


def _binary(fn: str) -> Callable[..., None]:
    def check(_ctx: Any, a: Any, b: Any) -> None:
        if not _can_repeat(b, a):
            _fail(fn, "the second operand does not tile the first", a, b)

    return check


def _mul_mat(_ctx: Any, a: Any, b: Any) -> None:
    x, y = ne(a), ne(b)
    if x[0] != y[0] or y[2] % x[2] or y[3] % x[3]:
        _fail("ggml_mul_mat", "inner dims differ or batch dims do not broadcast", a, b)
    if nb(a)[0] > nb(a)[1]:
        _fail("ggml_mul_mat", "the first operand is transposed", a, b)


def _padded_1d(fn: str) -> Callable[..., None]:
    def check(_ctx: Any, a: Any, *_args: Any) -> None:
        b, n = nb(a), ne(a)
        if b[0] != type_size(a) or b[2] != b[1] * n[1] or b[3] != b[2] * n[2]:
            _fail(fn, "the operand is not densely strided (ggml_is_padded_1d)", a)

    return check


def _reshape(fn: str) -> Callable[..., None]:
    def check(_ctx: Any, a: Any, *dims: Any) -> None:
        if not is_contiguous(a):
            _fail(fn, "the operand is not contiguous", a)
        if math.prod(ne(a)) != math.prod(int(d) for d in dims):
            _fail(fn, f"{math.prod(ne(a))} elements cannot take the shape {[int(d) for d in dims]}", a)

    return check


def _view(n_dims: int) -> Callable[..., None]:
    def check(_ctx: Any, a: Any, *args: Any) -> None:
        dims = [int(d) for d in args[:n_dims]]
        offset = int(args[-1])
        size = type_size(a) * math.prod(dims)  # ggml sizes a view as if it were dense
        total = type_size(a) * math.prod(ne(a)) if is_contiguous(a) else nbytes(a)
        if ne(a)[0] > 1 and nb(a)[0] != type_size(a):
            _fail(f"ggml_view_{n_dims}d", "the source's innermost dim is strided (a view would read it as dense)", a)
        if any(d < 0 for d in dims) or offset < 0:
            _fail(f"ggml_view_{n_dims}d", f"negative size or offset {dims} @ {offset}", a)
        if size and size + offset > max(total, nbytes(a)):
            _fail(f"ggml_view_{n_dims}d", f"a view of {dims} at byte {offset} reaches past the tensor", a)

    return check


def _rows_contiguous(fn: str) -> Callable[..., None]:
    def check(_ctx: Any, a: Any, *_args: Any) -> None:
        if ne(a)[0] != 1 and nb(a)[0] != type_size(a):
            _fail(fn, "the operand's rows are not contiguous", a)

    return check


def _concat(_ctx: Any, a: Any, b: Any, dim: int) -> None:
    if not 0 <= int(dim) < MAX_DIMS:
        _fail("ggml_concat", f"dim {dim} out of range", a, b)
    if int(a.contents.type) != int(b.contents.type):
        _fail("ggml_concat", "operand types differ", a, b)
    x, y = ne(a), ne(b)
    if any(x[d] != y[d] for d in range(MAX_DIMS) if d != int(dim)):
        _fail("ggml_concat", f"shapes differ outside dim {dim}", a, b)


def _repeat_4d(_ctx: Any, a: Any, *dims: Any) -> None:
    x = ne(a)
    want = [int(d) for d in dims]
    if (0 in x and 0 not in want) or any(x[i] and want[i] % x[i] for i in range(MAX_DIMS)):
        _fail("ggml_repeat_4d", f"cannot tile to {want}", a)


def _same_count(fn: str) -> Callable[..., None]:
    def check(_ctx: Any, a: Any, b: Any, *_args: Any) -> None:
        if math.prod(ne(a)) != math.prod(ne(b)):
            _fail(fn, "element counts differ", a, b)

    return check


def _permute(_ctx: Any, a: Any, *axes: Any) -> None:
    if sorted(int(x) for x in axes) != list(range(MAX_DIMS)):
        _fail("ggml_permute", f"axes {list(axes)} are not a permutation of 0..3", a)


def _get_rows(_ctx: Any, a: Any, b: Any) -> None:
    x, y = ne(a), ne(b)
    if x[2] != y[1] or x[3] != y[2] or y[3] != 1 or int(b.contents.type) != 26:
        _fail("ggml_get_rows", "indices must be int32 with ne[1:3] matching the table's ne[2:4]", a, b)


def _set(_ctx: Any, a: Any, b: Any, *args: Any) -> None:
    if math.prod(ne(a)) < math.prod(ne(b)):
        _fail("ggml_set", "the source is larger than the destination", a, b)
    if int(args[-1]) >= 1 << 30:
        _fail("ggml_set", f"offset {args[-1]} is 1 GiB or more", a, b)


def _soft_max(fn: str) -> Callable[..., None]:
    def check(_ctx: Any, a: Any, mask: Any = None, *_args: Any) -> None:
        if not is_contiguous(a):
            _fail(fn, "the operand is not contiguous", a)
        if mask:
            x, m = ne(a), ne(mask)
            if not is_contiguous(mask) or m[0] != x[0] or m[1] < x[1] or x[2] % m[2] or x[3] % m[3]:
                _fail(fn, "the mask does not fit the scores", a, mask)

    return check


def _im2col(_ctx: Any, a: Any, b: Any, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int, is_2d: bool,
            *_args: Any) -> None:
    k, x = ne(a), ne(b)
    if is_2d:
        if k[2] != x[2]:
            _fail("ggml_im2col", "kernel and input channels differ", a, b)
        oh = (x[1] + 2 * p1 - d1 * (k[1] - 1) - 1) // s1 + 1
        if oh <= 0:
            _fail("ggml_im2col", "the input is smaller than the kernel", a, b)
    else:
        if k[1] != x[1] or x[3] != 1:
            _fail("ggml_im2col", "kernel and input channels differ", a, b)
    ow = (x[0] + 2 * p0 - d0 * (k[0] - 1) - 1) // s0 + 1
    if ow <= 0:
        _fail("ggml_im2col", "the input is smaller than the kernel", a, b)


def _conv_dw(_ctx: Any, a: Any, b: Any, *_args: Any) -> None:
    k, x = ne(a), ne(b)
    if k[2] != 1 or k[3] != x[2]:
        _fail("ggml_conv_2d_dw_direct", "the kernel is not (KW, KH, 1, C) for C input channels", a, b)
    if not is_contiguous(b):  # the CPU kernel aborts on any layout but these two
        sb, sk = nb(b), nb(a)
        if not (sb[0] > sb[2] and sb[1] > sb[0] and sb[2] == type_size(b)):
            _fail("ggml_conv_2d_dw_direct", "the input is neither contiguous nor channels-contiguous", a, b)
        if not (sk[0] >= sk[2] and sk[1] >= sk[0]):
            _fail("ggml_conv_2d_dw_direct", "a channels-last input needs a channels-last kernel", a, b)


def _conv_direct(_ctx: Any, a: Any, b: Any, *_args: Any) -> None:
    if ne(a)[2] != ne(b)[2]:
        _fail("ggml_conv_2d_direct", "kernel and input channels differ", a, b)


def _conv_t(_ctx: Any, a: Any, b: Any, *_args: Any) -> None:
    if ne(a)[3] != ne(b)[2]:
        _fail("ggml_conv_transpose_2d_p0", "kernel and input channels differ", a, b)


def _pool_2d(_ctx: Any, a: Any, _op: int, k0: int, k1: int, s0: int, s1: int, p0: float, p1: float) -> None:
    x = ne(a)
    if (x[0] + 2 * p0 - k0) // s0 + 1 <= 0 or (x[1] + 2 * p1 - k1) // s1 + 1 <= 0:
        _fail("ggml_pool_2d", "the window is larger than the padded input", a)


def _pad_reflect(_ctx: Any, a: Any, p0: int, p1: int) -> None:
    if p0 < 0 or p1 < 0 or p0 >= ne(a)[0] or p1 >= ne(a)[0] or not is_contiguous(a):
        _fail("ggml_pad_reflect_1d", f"reflect pads ({p0}, {p1}) need a contiguous input wider than each pad", a)


def _flash_attn(_ctx: Any, q: Any, k: Any, v: Any, mask: Any, *_args: Any) -> None:
    x, y, z = ne(q), ne(k), ne(v)
    if y[0] != x[0] or x[2] % y[2] or x[3] % y[3] or x[3] != y[3] or x[3] != z[3]:
        _fail("ggml_flash_attn_ext", "q, k and v do not fit", q, k, v)
    if mask:
        m = ne(mask)
        if int(mask.contents.type) != 1 or not is_contiguous(mask) or x[2] % m[2] or x[3] % m[3]:
            _fail("ggml_flash_attn_ext", "the mask must be contiguous float16 and broadcast over heads", q, mask)


def _cont_4d(_ctx: Any, a: Any, *dims: Any) -> None:
    if math.prod(ne(a)) != math.prod(int(d) for d in dims):
        _fail("ggml_cont_4d", "element counts differ", a)


#: ggml function name -> its precondition check (called with the same arguments)
CHECKS: dict[str, Callable[..., None]] = {
    **{f"ggml_{op}": _binary(f"ggml_{op}") for op in ("add", "sub", "mul", "div")},
    **{f"ggml_{op}_inplace": _binary(f"ggml_{op}_inplace") for op in ("add", "sub", "mul", "div")},
    "ggml_mul_mat": _mul_mat,
    "ggml_scale": _padded_1d("ggml_scale"),
    "ggml_scale_bias": _padded_1d("ggml_scale_bias"),
    "ggml_scale_inplace": _padded_1d("ggml_scale_inplace"),
    "ggml_reshape_1d": _reshape("ggml_reshape_1d"),
    "ggml_reshape_2d": _reshape("ggml_reshape_2d"),
    "ggml_reshape_3d": _reshape("ggml_reshape_3d"),
    "ggml_reshape_4d": _reshape("ggml_reshape_4d"),
    "ggml_view_1d": _view(1),
    "ggml_view_2d": _view(2),
    "ggml_view_3d": _view(3),
    "ggml_view_4d": _view(4),
    "ggml_concat": _concat,
    "ggml_repeat_4d": _repeat_4d,
    "ggml_cpy": _same_count("ggml_cpy"),
    "ggml_cont_4d": _cont_4d,
    "ggml_permute": _permute,
    "ggml_get_rows": _get_rows,
    "ggml_set_inplace": _set,
    "ggml_set": _set,
    "ggml_soft_max": _soft_max("ggml_soft_max"),
    "ggml_soft_max_ext": _soft_max("ggml_soft_max_ext"),
    "ggml_im2col": _im2col,
    "ggml_conv_2d_dw_direct": _conv_dw,
    "ggml_conv_2d_direct": _conv_direct,
    "ggml_conv_transpose_2d_p0": _conv_t,
    "ggml_pool_2d": _pool_2d,
    "ggml_pad_reflect_1d": _pad_reflect,
    "ggml_flash_attn_ext": _flash_attn,
    **{f"ggml_{op}": _rows_contiguous(f"ggml_{op}") for op in (
        "relu", "gelu", "gelu_erf", "gelu_quick", "silu", "sigmoid", "tanh", "elu", "neg", "abs", "sgn", "step",
        "exp", "hardswish", "hardsigmoid")},
    **{f"ggml_{op}": _rows_contiguous(f"ggml_{op}") for op in ("norm", "group_norm", "rms_norm")},
}


class CheckedGgml:
    """The ggml bindings with ``CHECKS`` run before the calls they cover; everything else passes through."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._lib, name)
        check = CHECKS.get(name)
        if check is not None:
            raw = attr

            def attr(*args: Any) -> Any:
                check(*args)
                return raw(*args)

            attr.__name__ = name
        setattr(self, name, attr)  # later lookups skip __getattr__
        return attr
