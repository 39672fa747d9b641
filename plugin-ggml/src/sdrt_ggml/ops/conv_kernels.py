"""Conv strategies: the native conv's routes (implicit GEMM, direct, cols, Winograd, AMX pairs), ggml's own
kernels (the 1x1 GEMM in both layouts, im2col (or direct) + GEMM), and the depthwise kernels."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import half, native
from ._common import GTensor, dense_copy, ggml_lib
from .conv_layout import channels_last, conv_gemm


def conv_pointwise(lowering: Any, x: GTensor, wt: GTensor | None, out_shape: tuple[int, int, int, int], kp: int,
                   w: np.ndarray | None = None, bias: np.ndarray | None = None) -> GTensor:
    """1x1 conv at batch 1 in both layouts from one column matrix (ggml computes the one used).

    The column matrix of a 1x1 conv is the input channels-last: taken as is when the
    producer made it, else one transpose copy. NCHW comes out of the product
    one way round, channels-last the other (with the native GEMM: the same product, stored
    transposed or not, from one packed kernel ``w``, both adding the constant ``bias`` as they store;
    ``bias`` is for the native GEMM only).
    """
    g = ggml_lib()
    _, oc, oh, ow = out_shape
    c = x.shape[1]
    if x.cl is not None:
        col = g.ggml_reshape_2d(lowering.ctx, x.cl, c, ow * oh)
    else:
        col = g.ggml_reshape_2d(lowering.ctx, channels_last(lowering, x.ptr), c, ow * oh)  # = im2col of a 1x1 conv
    if w is not None and native.for_lowering(lowering) is not None:
        nchw = g.ggml_reshape_4d(lowering.ctx, conv_gemm(lowering, col, w, (0, 1, 2, 3), "oihw", bias=bias), ow, oh, oc, 1)
        cl = g.ggml_reshape_4d(lowering.ctx, conv_gemm(lowering, col, w, (0, 1, 2, 3), "oihw", trans=False, bias=bias),
                               oc, ow, oh, 1)
        return GTensor(nchw, out_shape, cl=cl)
    assert bias is None and wt is not None, "ggml_mul_mat adds no bias, and takes the kernel as a tensor"
    w2 = g.ggml_reshape_2d(lowering.ctx, wt.ptr, kp, oc)
    if kp != c:
        col = g.ggml_pad(lowering.ctx, col, kp - c, 0, 0, 0)
    nchw = g.ggml_reshape_4d(lowering.ctx, g.ggml_mul_mat(lowering.ctx, col, w2), ow, oh, oc, 1)
    cl = g.ggml_reshape_4d(lowering.ctx, g.ggml_mul_mat(lowering.ctx, w2, col), oc, ow, oh, 1)
    return GTensor(nchw, out_shape, cl=cl)


def conv_half(lowering: Any, x: GTensor, w: np.ndarray, strides: list[int], dil: list[int], ph: int, pw: int,
              out_shape: tuple[int, int, int, int]) -> GTensor:
    """A group-1 conv whose constant kernel is stored bf16/fp16 (``half.py``): float32 columns (ggml's im2col;
    a 1x1 conv at batch 1 takes the channels-last input as they are) times the half kernel by one
    ``ggml_mul_mat`` with the kernel as its first operand (ggml converts each column to the kernel's type).
    That product is channels-last (kept as ``cl`` at batch 1); NCHW is one transpose copy."""
    g = ggml_lib()
    n, oc, oh, ow = out_shape
    c, kh, kw = (int(d) for d in w.shape[1:])
    wt = half.weight(lowering, w)  # ne (KW, KH, C, OC): im2col reads its kernel dims
    if n == 1 and kh == kw == 1 and strides == [1, 1] and ph == pw == 0:
        col = g.ggml_reshape_2d(lowering.ctx, x.cl if x.cl is not None else channels_last(lowering, x.ptr), c, ow * oh)
    else:
        col = g.ggml_im2col(lowering.ctx, wt.ptr, x.ptr, strides[1], strides[0], pw, ph, dil[1], dil[0], True,
                            g.GGML_TYPE_F32)  # ne: [K, OW, OH, N]
        col = g.ggml_reshape_2d(lowering.ctx, col, c * kh * kw, ow * oh * n)
    w2 = g.ggml_reshape_2d(lowering.ctx, wt.ptr, c * kh * kw, oc)
    y = g.ggml_mul_mat(lowering.ctx, w2, col)  # ne: [OC, OW*OH*N], channels-last
    y4 = g.ggml_reshape_4d(lowering.ctx, y, oc, ow, oh, n)
    nchw = dense_copy(lowering, g.ggml_permute(lowering.ctx, y4, 2, 0, 1, 3))  # ne (OW, OH, OC, N)
    return GTensor(nchw, out_shape, cl=y4 if n == 1 and lowering.options.get("layouts", True) else None)


def dw_native_ok(lowering: Any, w: Any, strides: list[int]) -> bool:
    """sdrt-ggml's depthwise kernel (native/dwconv.c): constant taps (at most 16 rows), strides 1 to 4,
    on the CPU with the native kernels loaded, unless ``dw_layout`` asks for ggml's."""
    if (not isinstance(w, np.ndarray) or not all(1 <= s <= 4 for s in strides) or w.shape[2] > 16
            or w.shape[2] * w.shape[3] > 256 or not lowering.on_cpu):
        return False
    if lowering.options.get("dw_layout", "native") != "native":
        return False
    from ..native_ops import native_ops

    return native_ops() is not None


def conv_depthwise(lowering: Any, x: GTensor, w: np.ndarray | GTensor, wt: GTensor | None, strides: list[int],
                   dil: list[int], ph: int, pw: int, out_shape: tuple[int, int, int, int], bias: Any = None) -> GTensor:
    """Depthwise conv: sdrt-ggml's NCHW kernel (bias added, activations fused by rewrites_epilogue), or
    ggml's, which is vectorized over channels only when channels are the innermost dim in memory:
    then the input is laid out channels-last first (one copy) and the result copied back to NCHW,
    unless ``dw_layout="nchw"``."""
    g = ggml_lib()
    if dw_native_ok(lowering, w, strides):
        n, c, oh, ow = out_shape
        kh, kw = int(w.shape[2]), int(w.shape[3])
        wt_taps = lowering.const(w, transform=lambda a: a.reshape(a.shape[0], -1), tag="dw_taps")
        b = lowering.const(np.asarray(bias, np.float32).reshape(-1)) if bias is not None else None
        lowering.used("conv depthwise native")
        spec = ConvSpec(x.ptr, wt_taps.ptr, (kh, kw, tuple(strides), tuple(dil), ph, pw, False), out_shape,
                        bias=b.ptr if b is not None else None, depthwise=True)
        return conv_emit(lowering, spec)
    args = (strides[1], strides[0], pw, ph, dil[1], dil[0])
    # ggml's channels-last kernel needs strides nb[1] > nb[0] > nb[2] (W > 1 and C > 1), else it aborts
    cl_ok = x.shape[1] > 1 and x.shape[3] > 1
    if lowering.options.get("dw_layout", "native") == "nchw" or not isinstance(w, np.ndarray) or not cl_ok:
        wt = wt or lowering.const(w)
        return GTensor(g.ggml_conv_2d_dw_direct(lowering.ctx, wt.ptr, x.ptr, *args), out_shape)
    # kernel as (KH, KW, 1, C) memory, viewed with ne (KW, KH, 1, C): channels innermost
    kc = lowering.const(w, transform=lambda a: np.ascontiguousarray(a[:, 0].transpose(1, 2, 0))[:, :, None, :], tag="hwc")
    kv = g.ggml_permute(lowering.ctx, kc.ptr, 3, 2, 0, 1)
    xc = x.cl if x.cl is not None else channels_last(lowering, x.ptr)  # memory (N, H, W, C)
    xv = g.ggml_permute(lowering.ctx, xc, 2, 0, 1, 3)  # ne (W, H, C, N) over channels-last memory
    y = g.ggml_conv_2d_dw_direct(lowering.ctx, kv, xv, *args)
    cl = g.ggml_permute(lowering.ctx, y, 1, 2, 0, 3) if out_shape[0] == 1 and lowering.options.get("layouts", True) else None
    return GTensor(dense_copy(lowering, y), out_shape, cl=cl)


def conv_dense(lowering: Any, x: GTensor, wt: GTensor, strides: list[int], dil: list[int], ph: int, pw: int,
               out_shape: tuple[int, int, int, int], w: np.ndarray | None = None) -> GTensor:
    """im2col (ggml's) and one GEMM; ``w`` is the constant kernel when there is one."""
    g = ggml_lib()
    n, oc, oh, ow = out_shape
    if lowering.options.get("conv_impl", "auto") == "direct":
        return GTensor(g.ggml_conv_2d_direct(lowering.ctx, wt.ptr, x.ptr, strides[1], strides[0], pw, ph, dil[1], dil[0]),
                 out_shape)
    kdim = wt.shape[1] * wt.shape[2] * wt.shape[3]
    col = g.ggml_im2col(lowering.ctx, wt.ptr, x.ptr, strides[1], strides[0], pw, ph, dil[1], dil[0], True,
                        g.GGML_TYPE_F32)  # ne: [K, OW, OH, N]
    col2 = g.ggml_reshape_2d(lowering.ctx, col, kdim, ow * oh * n)
    w2 = g.ggml_reshape_2d(lowering.ctx, wt.ptr, kdim, oc)
    impl = lowering.options.get("conv_impl", "auto")
    nat = native.for_lowering(lowering)
    if nat is not None and impl in ("im2col", "auto"):
        if w is not None and w.shape[1] == wt.shape[1]:  # a constant kernel (not channel-padded): packed once
            y = conv_gemm(lowering, col2, w, (0, 1, 2, 3), "oihw")
        else:  # the kernel as B (N = OC, K) through a transposed view, packed per run
            y = native.gemm_op(nat, g, lowering.ctx, col2, g.ggml_transpose(lowering.ctx, w2), m=ow * oh * n, n=oc,
                               trans=True, state=native.lowering_state(lowering))
        impl = "native"
    elif impl in ("im2col", "auto") and (ow * oh * n) % 4 and oc % 4 == 0:
        impl = "im2col_nhwc"  # the GEMM's fast path needs its first operand's rows to be a multiple of 4
    if impl == "native":
        pass
    elif impl == "im2col_nhwc":
        y = g.ggml_mul_mat(lowering.ctx, w2, col2)  # ne: [OC, OW*OH*N]: channels-last, then one transpose copy
        y = dense_copy(lowering, g.ggml_transpose(lowering.ctx, y))
    else:
        y = g.ggml_mul_mat(lowering.ctx, col2, w2)  # ne: [OW*OH*N, OC]
    if n == 1:
        return GTensor(g.ggml_reshape_4d(lowering.ctx, y, ow, oh, oc, 1), out_shape)
    y = g.ggml_reshape_4d(lowering.ctx, y, ow, oh, n, oc)
    y = dense_copy(lowering, g.ggml_permute(lowering.ctx, y, 0, 1, 3, 2))
    return GTensor(y, out_shape)


def implicit_ok(lowering: Any, w: Any, group: int) -> bool:
    """sdrt-ggml's implicit-GEMM conv (native/conv.c): group-1 convs with a constant kernel on the
    CPU, when the native kernels loaded (op_conv asks after the pointwise route, which serves
    stride-1 1x1 convs at batch 1 in both layouts)."""
    impl = lowering.options.get("conv_impl", "auto")
    return (impl in ("auto", "implicit", "igemm", "winograd", "cols") and group == 1 and isinstance(w, np.ndarray)
            and native.for_lowering(lowering) is not None)


#: output channels below which a conv keeps float32 weights at bf16 (the float32 direct and Winograd routes): with
#: fewer than one 16-row tile of them, packing and converting the columns costs far more than the bf16 products save
#: (the SD VAE decoder's last conv, 3 output channels at 128 x 128: 2.0 ms packed bf16 on AMX or vdpbf16ps against
#: 0.3 ms float32 direct on a Xeon (Sapphire Rapids); docs/ggml.md, "AMX")
BF16_MIN_OC = 16


def bf16_conv(lowering: Any, oc: int) -> bool:
    """Whether a dense conv of ``oc`` output channels takes bf16 rows (the packed route's bf16 products)."""
    return native.bf16_for(lowering) and oc >= BF16_MIN_OC


#: output channels above which the packed route wins: packing a column costs a copy per K row,
#: which about 4 x OC cycles of products use up, while the direct route's B rows come unaligned from
#: C planes (measured, 1 thread, 3x3: direct 12% faster at OC 32, 7% at 64, even at 128, packed 5-15%
#: faster at 256 and 512; docs/ggml.md, "Measured choices")
DIRECT_MAX_OC = 128


def direct_ok(lowering: Any, nat: Any, strides: list[int], ow: int, oc: int) -> bool:
    """The direct route of the native conv (no packing: B read from a padded input) for a stride-1
    conv with at most DIRECT_MAX_OC output channels whose output rows fill most of a kernel call's
    columns (16 with AVX2, 32 with AVX-512); the others pack their columns, as every conv does
    with ``conv_impl="implicit"``."""
    return (lowering.options.get("conv_impl", "auto") != "implicit" and list(strides) == [1, 1]
            and ow * 4 >= 3 * nat.nr and oc <= DIRECT_MAX_OC and not bf16_conv(lowering, oc))


#: ``ConvSpec.geometry``'s ``padded`` (``sdrt_conv_op``'s params[P_DIRECT]) for the cols route
COLS = 2

#: input channels from which a float32 pointwise conv takes the cols route where the AVX-512 kernels run (no packing
#: of the input's K x np values a call); with fewer, only where it replaces the direct route's short kernel calls and
#: fills whole panels; never under COLS_MIN_OC output channels (a panel of 32 half empty or a quarter: the
#: packed route's columns are pixels). Measured per node: docs/ggml.md, "A fourth pass"
COLS_MIN_C = 64
COLS_MIN_OC = 32


def cols_ok(lowering: Any, nat: Any, w: Any, strides: list[int], ph: int, pw: int, pixels: int) -> bool:
    """The cols route of the native conv (native/conv.c: output channels along the vectors, the input read in place,
    W^T packed once) for a float32 stride-1 1x1 conv of 2 or more pixels, by default with the AVX-512 kernels and,
    where it saves the packed route's copy, the AVX2 ones; ``conv_impl="cols"`` forces it (on other ISAs a scalar loop
    runs it)."""
    impl = lowering.options.get("conv_impl", "auto")
    if tuple(w.shape[2:]) != (1, 1) or list(strides) != [1, 1] or ph or pw or pixels < 2:
        return False
    if impl == "cols":
        return True
    oc, c = int(w.shape[0]), int(w.shape[1])
    if impl != "auto" or oc < COLS_MIN_OC:
        return False
    if nat.isa == "avx2":
        # 6 x 16 tiles, each stored through two 8 x 8 transposes: ahead of the packed route only where few output
        # channels share its copy of the K x np inputs, and never in place of the direct route (whole 16-pixel
        # slices). Measured per node on Zen 3: docs/ggml.md, "The cols route on AVX2"
        return c >= COLS_MIN_C and oc <= DIRECT_MAX_OC and pixels % nat.nr != 0
    return nat.isa == "avx512" and (c >= COLS_MIN_C or (oc <= DIRECT_MAX_OC and oc % 32 == 0))


#: output pixels up to which a float32 kxk conv (or a strided or padded 1x1 one) takes the cols route over its
#: patches (native/im2col.c) where the AVX-512 kernels run: on maps this small the pixel-panel routes fill a
#: fraction of their 32 columns (Winograd's 2x2 tiles: 4 of them at 4x4). Measured: docs/ggml.md, "A fifth pass"
COLS_KXK_MAX_PIXELS = 64


def cols_kxk_ok(lowering: Any, nat: Any, w: Any, pixels: int) -> bool:
    """The cols route over the input's patches for a float32 group-1 conv with a constant kernel that ``cols_ok`` does
    not take (a caller leaves out convs with a runtime input-channel scale): on maps of at most COLS_KXK_MAX_PIXELS
    output pixels and COLS_MIN_OC output channels with the AVX-512 kernels, and for every such conv with
    ``conv_impl="cols"`` (no size bound: a 3x3 conv of 128 channels at 512 x 512 writes 1.2 GB of patches)."""
    impl = lowering.options.get("conv_impl", "auto")
    if not isinstance(w, np.ndarray) or nat is None or bf16_conv(lowering, int(w.shape[0])):
        return False
    if impl == "cols":
        return True
    return (impl == "auto" and nat.isa == "avx512" and int(w.shape[0]) >= COLS_MIN_OC
            and pixels <= COLS_KXK_MAX_PIXELS)


@dataclass(frozen=True)
class ConvSpec:
    """A native conv as emitted, and what its epilogue does: the fusion rewrites (rewrites_epilogue.py)
    emit it again with a runtime per-channel bias, a residual or an activation added. ``depthwise``:
    the native depthwise conv (activation only)."""

    src: Any  # the input the op reads (padded for the direct route)
    wt: Any  # W rows (depthwise: the taps of each channel)
    geometry: tuple[int, int, tuple[int, ...], tuple[int, ...], int, int, int]  # kh, kw, strides, dil, ph, pw, padded
    out_shape: tuple[int, int, int, int]
    bias: Any = None  # constant, OC floats
    rbias: Any = None  # runtime, ne (OC, N)
    res: Any = None  # runtime, shaped as the output, contiguous
    act: str | None = None
    lo: float = 0.0
    hi: float = 0.0
    depthwise: bool = False
    winograd: bool = False  # src padded for the Winograd conv; geometry's ph, pw: where the image sits in it
    cscale: Any = None  # runtime, ne (C, N): the input channels' scale (the packed route applies it)
    bf16: bool = False  # wt is bf16 rows (half.rows_bf16): the packed route's bf16 products
    pairs: bool = False  # src is pair_pad_op's, wt pairs_weights: the AMX conv without packing (native/amx_conv.c)


def conv_emit(lowering: Any, spec: ConvSpec) -> GTensor:
    """The conv op of ``spec``; remembered so that a following node can fuse into its epilogue."""
    g = ggml_lib()
    kh, kw, strides, dil, ph, pw, padded = spec.geometry
    n, oc, oh, ow = spec.out_shape
    as_pairs: Any = None  # the depthwise conv's offer to write its output as an AMX conv's bf16 channel pairs
    if spec.winograd:
        nat = native.for_lowering(lowering)
        params = lowering.const(native.winograd_params(ph, pw, act=spec.act, lo=spec.lo, hi=spec.hi))
        y = native.winograd_op(nat, g, lowering.ctx, spec.src, spec.wt, params.ptr, native.lowering_state(lowering),
                               spec.bias, spec.rbias, spec.res, out_ne=(ow, oh, oc, n))
    elif spec.depthwise:
        from ..native_ops import dw_params, dwconv, native_ops

        params = lowering.const(dw_params(kh, kw, strides, dil, ph, pw, act=spec.act, lo=spec.lo, hi=spec.hi))
        y = dwconv(native_ops(), g, lowering.ctx, spec.src, spec.wt, params.ptr, spec.bias, out_ne=(ow, oh, oc, n))

        def dw_pairs(top: int, left: int, wp: int, hp: int, c2: int) -> Any:
            prm = lowering.const(dw_params(kh, kw, strides, dil, ph, pw, act=spec.act, lo=spec.lo, hi=spec.hi,
                                           pairs=(top, left)))
            return dwconv(native_ops(), g, lowering.ctx, spec.src, spec.wt, prm.ptr, spec.bias,
                          out_ne=(2 * wp, hp, c2, n), pairs=True)

        as_pairs = dw_pairs
    else:
        nat = native.for_lowering(lowering)
        params = lowering.const(native.conv_params(kh, kw, strides, dil, ph, pw, padded=padded, act=spec.act,
                                                   lo=spec.lo, hi=spec.hi, bf16=2 if spec.pairs else int(spec.bf16)))
        y = native.conv_op(nat, g, lowering.ctx, spec.src, spec.wt, params.ptr, native.lowering_state(lowering),
                           spec.bias, spec.rbias, spec.res, spec.cscale, out_ne=(ow, oh, oc, n))
    lowering.conv_specs[ctypes.cast(y, ctypes.c_void_p).value] = spec
    return GTensor(y, spec.out_shape, pairs=as_pairs)


def conv_spec_of(lowering: Any, v: Any) -> ConvSpec | None:
    """The spec of a native conv's value (None for any other value)."""
    if not isinstance(v, GTensor):
        return None
    return lowering.conv_specs.get(ctypes.cast(v.ptr, ctypes.c_void_p).value)


#: the smallest channel counts at which the Winograd conv beats the implicit GEMM (measured, docs/ggml.md)
WINOGRAD_MIN_C = 32
WINOGRAD_MIN_OC = 32
#: the fewest output pixels at which Winograd takes a conv the cols route does not: on smaller maps its 2 x 2 tiles
#: are mostly padding and the conv streams its 16/9-sized kernels from memory (Zen 3, 2 threads, 1280 channels, ms:
#: 4 x 4 16.8 against the packed implicit GEMM's 6.8, 5 x 5 20.9 / 12.8, 6 x 6 25.4 / 26.4, 8 x 8 25.5 / 35.0).
#: An 8 x 8 map is left to the implicit GEMM all the same, for memory: the UNet's 1280-channel kernels there are the
#: largest, and held transformed they took 0.56 GiB of the float32 SD 1.5 pipeline's peak at 256 px (5.17 -> 4.61
#: GiB, level with diffusers'), 0.72 at 512 px, and a few seconds of its first image's compile, for about 10% of a
#: warm step at 256 px (docs/ggml.md, "Measured choices"); the AVX-512 kernels' cols route takes these maps anyway
WINOGRAD_MIN_PIXELS = 65


def winograd_ok(lowering: Any, w: Any, strides: list[int], dil: list[int], pixels: int) -> bool:
    """Winograd F(2x2, 3x3) (native/winograd.c) for 3x3 stride-1 convs with enough channels on both
    sides, at least WINOGRAD_MIN_PIXELS output pixels and more than the cols route takes, unless ``conv_impl``
    names another route (``"winograd"`` forces it for any channel count and map)."""
    impl = lowering.options.get("conv_impl", "auto")
    if impl not in ("auto", "winograd") or not isinstance(w, np.ndarray) or w.shape[2:] != (3, 3):
        return False
    nat = native.for_lowering(lowering)
    if list(strides) != [1, 1] or list(dil) != [1, 1] or nat is None:
        return False
    if impl == "auto" and cols_kxk_ok(lowering, nat, w, pixels):
        return False
    if bf16_conv(lowering, int(w.shape[0])):
        return False  # float32 only: the implicit GEMM's bf16 products instead
    return impl == "winograd" or (w.shape[1] >= WINOGRAD_MIN_C and w.shape[0] >= WINOGRAD_MIN_OC
                                  and pixels >= WINOGRAD_MIN_PIXELS)


#: input channels from which a bf16 conv takes the AMX route without packing (a step of 16 pairs a tile)
PAIRS_MIN_C = 32


def pairs_ok(lowering: Any, nat: Any, c: int, oc: int, strides: list[int], cscale: Any) -> bool:
    """The AMX conv without packing (native/amx_conv.c) for a stride-1 bf16 conv of at least PAIRS_MIN_C input and
    BF16_MIN_OC output channels, when the bf16 products run on AMX tiles (``conv_impl="implicit"``: the packed
    route instead)."""
    return (lowering.options.get("conv_impl", "auto") == "auto" and list(strides) == [1, 1] and cscale is None
            and c >= PAIRS_MIN_C and bf16_conv(lowering, oc) and nat.bf16_kernel_name == "amx-bf16")


def conv_pairs(lowering: Any, x: GTensor, w: np.ndarray, b: Any, dil: list[int], ph: int, pw: int,
               out_shape: tuple[int, int, int, int]) -> GTensor:
    """A stride-1 bf16 conv on AMX tiles without packing: the input converted once to bf16 channel pairs,
    zero-padded (rows past the padded image too, so that the tiles of the last pixels stay inside it), the kernel
    as ``pairs_weights``."""
    nat = native.for_lowering(lowering)
    n, c, h, wd = x.shape
    kh, kw = int(w.shape[2]), int(w.shape[3])
    wp = wd + 2 * pw
    hp = h + 2 * ph + -(-16 // wp)
    if x.pairs is not None:  # the depthwise conv before it writes its output so
        lowering.used("conv input as pairs by its producer")
        src = x.pairs(ph, pw, wp, hp, native.pairs_count(c))
    else:
        top_left = lowering.const(np.array([ph, pw], np.int32))
        src = native.pair_pad_op(nat, ggml_lib(), lowering.ctx, x.ptr, top_left.ptr, wp=wp, hp=hp,
                                 c2=native.pairs_count(c), n=n)
    wt = native.pairs_rows(lowering, w)
    spec = ConvSpec(src, wt.ptr, (kh, kw, (1, 1), tuple(dil), ph, pw, True), out_shape, bias=b.ptr if b is not None else None,
                    pairs=True)
    return conv_emit(lowering, spec)


def padded_input(lowering: Any, x: GTensor, ph: int, pw: int, wp: int, hp: int) -> Any:
    """``x`` zero-padded to ne (wp, hp, C, N) with the image at (ph, pw): written so by its producer
    where it can (a group norm), else by the pad op; ``x`` itself when no padding is needed."""
    n, c, h, wd = x.shape
    if (wp, hp) == (wd, h):
        return x.ptr
    if x.padded is not None:
        lowering.used("conv input padded by its producer")
        return x.padded(ph, pw, wp, hp)
    nat = native.for_lowering(lowering)
    top_left = lowering.const(np.array([ph, pw], np.int32))
    return native.pad_op(nat, ggml_lib(), lowering.ctx, x.ptr, top_left.ptr, out_ne=(wp, hp, c, n))


def conv_winograd(lowering: Any, x: GTensor, w: np.ndarray, bias: Any, ph: int, pw: int,
                  out_shape: tuple[int, int, int, int]) -> GTensor:
    """A 3x3 stride-1 conv by Winograd F(2x2, 3x3): the kernel transformed once into 16 matrices,
    the input zero-padded (by its producer where it can), the bias added by the op."""
    n, oc, oh, ow = out_shape
    _, c, h, wd = x.shape
    ld = native.row_stride(c)
    u = native.winograd_const(lowering, w, ld)
    b = lowering.const(np.asarray(bias, np.float32).reshape(-1)) if bias is not None else None
    th, tw = -(-oh // 2), -(-ow // 2)
    src = padded_input(lowering, x, ph, pw, max(wd + 2 * pw, 2 * tw + 2), max(h + 2 * ph, 2 * th + 2))
    lowering.used("conv winograd")
    spec = ConvSpec(src, u.ptr, (3, 3, (1, 1), (1, 1), ph, pw, True), out_shape,
                    bias=b.ptr if b is not None else None, winograd=True)
    return conv_emit(lowering, spec)


def conv_implicit(lowering: Any, x: GTensor, w: np.ndarray, bias: Any, strides: list[int], dil: list[int], ph: int,
                  pw: int, out_shape: tuple[int, int, int, int], cscale: Any = None) -> GTensor:
    """Conv straight from NCHW by the native implicit GEMM: the kernel's rows are A (row stride
    padded where rows would alias in L1), the bias is added by the op. Stride-1 convs with rows
    wide enough read B where it lies in a zero-padded copy of the input (the pad op; none when the
    rows already fill whole kernel calls and need no pads); the others pack B panel by panel inside
    the op. No channels-last copy, no scratch."""
    nat = native.for_lowering(lowering)
    n, oc, oh, ow = out_shape
    _, c, h, wd = x.shape
    kh, kw = int(w.shape[2]), int(w.shape[3])
    k = int(np.prod(w.shape[1:]))
    b = lowering.const(np.asarray(bias, np.float32).reshape(-1)) if bias is not None else None
    if pairs_ok(lowering, nat, c, oc, strides, cscale):
        return conv_pairs(lowering, x, w, b, dil, ph, pw, out_shape)
    bf16 = bf16_conv(lowering, oc)
    pointwise = kh == kw == 1 and ph == pw == 0 and list(strides) == [1, 1]
    # the cols route, on the input itself (a pointwise conv) or on its patches (a 1x1 conv of K channels on the
    # output map; no runtime channel scale, which the patches' K rows do not have)
    patches = not bf16 and cscale is None and not pointwise and cols_kxk_ok(lowering, nat, w, oh * ow)
    if patches or (not bf16 and cols_ok(lowering, nat, w, strides, ph, pw, oh * ow)):
        # W^T as pack_b's panels (shared with the pointwise GEMM's, conv_layout.conv_gemm)
        wt = native.packed_f32(lowering, w, lambda a: a.reshape(oc, k), "oihwP32")
        src = x.ptr
        if patches:
            prm = lowering.const(np.array([kh, kw, *strides, *dil, ph, pw], np.int32))
            src = native.im2col_op(nat, ggml_lib(), lowering.ctx, x.ptr, prm.ptr, out_ne=(ow, oh, k, n))
        lowering.used("conv cols over patches" if patches else "conv cols")
        spec = ConvSpec(src, wt.ptr, (1, 1, (1, 1), (1, 1), 0, 0, COLS), out_shape,
                        bias=b.ptr if b is not None else None, cscale=cscale)
        return conv_emit(lowering, spec)
    if bf16:  # bf16 rows, the packed route (native/conv.c, conv_unit_bf16)
        wt = native.rows_bf16(lowering, w, lambda a: a.reshape(oc, k), "")
    else:
        ld, threads = native.row_stride(k), native.threads_of(lowering)
        if ld == k:  # the kernel's own rows: mapped from the model's file where it lies aligned there
            wt = lowering.const(w, transform=lambda a: a.reshape(oc, k), tag=f"rows{ld}", view=True)
        else:
            wt = lowering.const(w, transform=lambda a: native.aligned_pad(a.reshape(oc, k), (0, ld - k), threads),
                                tag=f"rows{ld}")
    src = x.ptr
    # a pointwise conv runs its plane as one row (native/conv.c): slices of it need no pads
    padded = direct_ok(lowering, nat, strides, oh * ow if pointwise else ow, oc) and cscale is None
    if padded and pointwise and (oh * ow) % nat.nr:
        padded = False  # the last slice would need a pad op that only copies the input, as packing it does
    if padded and pointwise:
        lowering.used("conv direct")
    elif padded:
        nr = nat.nr
        src = padded_input(lowering, x, ph, pw, max(wd + 2 * pw, -(-ow // nr) * nr + (kw - 1) * dil[1]), h + 2 * ph)
        lowering.used("conv direct")
    else:
        lowering.used("conv implicit")
    spec = ConvSpec(src, wt.ptr, (kh, kw, tuple(strides), tuple(dil), ph, pw, padded), out_shape,
                    bias=b.ptr if b is not None else None, cscale=cscale, bf16=bf16)
    return conv_emit(lowering, spec)
