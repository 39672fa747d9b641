"""Conv (1-D and 2-D, groups, strides, pads, dilations) and ConvTranspose.

Conv lowers to one matrix multiply (ggml's fast path on every backend) over a
column matrix: on the CPU, stride-1 kxk convs read overlapping windows of a
row-stacked copy of the input (``conv_window``); other kxk convs at batch 1
build the columns by row copies (``conv_rowcopy``); the rest use ggml's
im2col. With batch 1 the product comes out directly in NCHW order, so no
permute copy is needed. Depthwise convs (groups == channels) use ggml's
depthwise kernel; other groups are split into per-group convolutions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .. import half, native
from . import check, op
from ._common import GTensor, Value, aligned, attrs, binary, cont, ggml_lib, reshape, want_pad
from .conv_copy import conv_rowcopy, conv_taps, conv_window, rowcopy_wanted, taps_ok, window_ok
from .conv_kernels import (
    conv_dense,
    conv_depthwise,
    conv_half,
    conv_implicit,
    conv_pointwise,
    conv_winograd,
    dw_native_ok,
    implicit_ok,
    winograd_ok,
)
from .conv_layout import aligned_channels, channel_view


def _conv_params(node: Any, spatial: int, kshape: tuple[int, ...], in_hw: tuple[int, ...]) -> tuple[list[int], ...]:
    a = attrs(node)
    strides = list(a.get("strides", [1] * spatial))
    dil = list(a.get("dilations", [1] * spatial))
    pads = list(a.get("pads", [0] * (2 * spatial)))
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * spatial)
        for i in range(spatial):
            out = -(-in_hw[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kshape[i] - 1) * dil[i] + 1 - in_hw[i])
            small, big = total // 2, total - total // 2
            pads[i], pads[i + spatial] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * spatial)
    return strides, dil, pads


@check("Conv")
def check_conv(node: Any) -> str | None:
    ks = attrs(node).get("kernel_shape")
    if ks is not None and len(ks) not in (1, 2):
        return f"Conv with {len(ks)} spatial dims (1 and 2 are supported)"
    return None


def _pad_input(lowering: Any, x: GTensor, pads: list[int]) -> tuple[GTensor, int, int]:
    """Pad asymmetric pads explicitly; return the tensor and the symmetric (ph, pw) left for the kernel."""
    top, left, bottom, right = pads
    if top == bottom and left == right:
        return x, top, left
    g = ggml_lib()
    x = cont(lowering, x)
    y = g.ggml_pad_ext(lowering.ctx, x.ptr, left, right, top, bottom, 0, 0, 0, 0)
    n, c, h, w = x.shape
    return GTensor(y, (n, c, h + top + bottom, w + left + right)), 0, 0


def conv2d(lowering: Any, x: GTensor, w: np.ndarray | GTensor, bias: Value | None, strides: list[int], dil: list[int],
           pads: list[int], group: int, cscale: Any = None) -> GTensor | None:
    """The conv; with ``cscale`` (a runtime scale per input channel, ne (C, N)) only through the native
    implicit GEMM, which applies it as it packs its columns: None when that route does not take it."""
    g = ggml_lib()
    x, ph, pw = _pad_input(lowering, x, pads)
    n, c, h, wd = x.shape
    oc, icg, kh, kw = (int(d) for d in (w.shape if isinstance(w, np.ndarray) else w.shape))
    depthwise = group == c > 1 and icg == 1 and oc == c  # group 1 with one channel is a plain conv
    cp = c
    nat = native.for_lowering(lowering)  # the native GEMM takes any K: no channel padding
    if (nat is None and group == 1 and isinstance(w, np.ndarray) and kh * kw > 1 and want_pad(lowering, c * kh * kw)
            and half.kind(lowering) is None):
        # zero channels in input and kernel: same sums, aligned K. Only when the padded input
        # (copied by ggml's scalar pad) stays small against the im2col it feeds (not 1x1 convs)
        cp = aligned_channels(c, kh * kw)
        if cp > c * 1.25:
            cp = c
    def kernel() -> GTensor:
        """The kernel as a weights-buffer tensor, made only for the routes that read it: the Winograd, implicit
        GEMM, tap, window and row-copy routes make their own transformed copy, and an unused plain one held
        every such conv's kernel twice (float32 SD 1.5 UNet: 2.36 GB of 3.4)."""
        if cp != c:
            threads = native.threads_of(lowering)
            return lowering.const(w, transform=lambda a: native.aligned_pad(a, (0, cp - c, 0, 0), threads),
                                  tag=f"c{cp}")
        return lowering.const(w)

    oh = (h + 2 * ph - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + 2 * pw - dil[1] * (kw - 1) - 1) // strides[1] + 1
    x = cont(lowering, x)
    # a 1x1 conv as one GEMM over the channels-last input, in both layouts: where a producer made
    # that input for free (x.cl), or without the native conv, which takes NCHW as it is
    pointwise = (group == 1 and isinstance(w, np.ndarray) and n == 1 and kh == kw == 1 and strides == [1, 1]
                 and ph == pw == 0 and lowering.options.get("layouts", True)
                 and (x.cl is not None or not implicit_ok(lowering, w, group)))
    # bf16/fp16 kernels on ggml's mul_mat (conv_half); at bf16 with the native kernels, the native routes below
    # take bf16 kernels themselves (native.bf16_for)
    halved = (half.kind(lowering) is not None and group == 1 and isinstance(w, np.ndarray)
              and not (native.bf16_for(lowering) and implicit_ok(lowering, w, group)))
    if cscale is not None:
        if halved or not implicit_ok(lowering, w, group) or lowering.options.get("conv_impl", "auto") == "winograd":
            return None
        fused = isinstance(bias, np.ndarray)
        y = conv_implicit(lowering, x, w, bias if fused else None, strides, dil, ph, pw, (n, oc, oh, ow), cscale)
        bias = None if fused else bias
    elif halved:  # a bf16/fp16 kernel (half.py): ggml's mixed mul_mat
        y = conv_half(lowering, x, w, strides, dil, ph, pw, (n, oc, oh, ow))
    elif pointwise:
        kp = c
        if nat is None and want_pad(lowering, c) and oh * ow * c * oc >= 2_000_000:
            # aligned K for the fast GEMM, only for large products (docs/ggml.md, "Measured choices")
            kp = aligned(c)
            threads = native.threads_of(lowering)
            wt = lowering.const(w, transform=lambda a: native.aligned_pad(a, (0, kp - c, 0, 0), threads), tag=f"c{kp}")
        else:
            wt = kernel() if nat is None else None  # the native GEMM packs ``w`` itself
        fused = isinstance(bias, np.ndarray) and nat is not None  # the native GEMM adds it as it stores
        y = conv_pointwise(lowering, x, wt, (n, oc, oh, ow), kp, w, bias if fused else None)
        bias = None if fused else bias
    elif implicit_ok(lowering, w, group) and winograd_ok(lowering, w, strides, dil, oh * ow):
        fused = isinstance(bias, np.ndarray)
        y = conv_winograd(lowering, x, w, bias if fused else None, ph, pw, (n, oc, oh, ow))
        bias = None if fused else bias
    elif implicit_ok(lowering, w, group):
        fused = isinstance(bias, np.ndarray)
        y = conv_implicit(lowering, x, w, bias if fused else None, strides, dil, ph, pw, (n, oc, oh, ow))
        bias = None if fused else bias
    elif group == 1 and taps_ok(lowering, w, n, strides, dil, kh, kw):
        y = conv_taps(lowering, x, w, ph, pw, (n, oc, oh, ow))
    elif group == 1 and isinstance(w, np.ndarray) and n == 1 and window_ok(lowering, c, kh, kw, strides, dil):
        y = conv_window(lowering, x, w, bias, ph, pw, (n, oc, oh, ow))
        bias = None  # added by conv_window, which also crops
    elif group == 1 and isinstance(w, np.ndarray) and n == 1 and rowcopy_wanted(lowering, kh * kw):
        y = conv_rowcopy(lowering, x, w, strides, dil, ph, pw, (n, oc, oh, ow))
    elif group == 1:
        if cp != c:
            x = GTensor(g.ggml_pad(lowering.ctx, x.ptr, 0, 0, cp - c, 0), (n, cp, h, wd))
        wt = kernel() if isinstance(w, np.ndarray) else cont(lowering, w)
        y = conv_dense(lowering, x, wt, strides, dil, ph, pw, (n, oc, oh, ow), w if isinstance(w, np.ndarray) else None)
    elif depthwise:
        fused = isinstance(bias, np.ndarray) and dw_native_ok(lowering, w, strides)
        y = conv_depthwise(lowering, x, w, None if isinstance(w, np.ndarray) else cont(lowering, w), strides, dil, ph,
                           pw, (n, oc, oh, ow), bias if fused else None)
        bias = None if fused else bias
    else:
        ocg = oc // group
        wt = kernel() if isinstance(w, np.ndarray) else cont(lowering, w)
        parts = []
        for gi in range(group):
            xs = channel_view(lowering, x, gi * icg, icg)
            ws = channel_view(lowering, wt, gi * ocg, ocg, axis=0)
            parts.append(conv_dense(lowering, cont(lowering, xs), cont(lowering, ws), strides, dil, ph, pw, (n, ocg, oh, ow)))
        y = parts[0]
        for p in parts[1:]:
            y = GTensor(g.ggml_concat(lowering.ctx, y.ptr, p.ptr, 2), (n, y.shape[1] + p.shape[1], oh, ow))
    if bias is not None:
        b = lowering.const(bias) if isinstance(bias, np.ndarray) else bias
        y_cl = y.cl
        y = binary(lowering, "ggml_add", y, reshape(lowering, b, (1, -1, 1, 1)), True)
        if y_cl is not None:
            y.cl = g.ggml_add(lowering.ctx, y_cl, reshape(lowering, b, (oc,)).ptr)  # a row broadcast: the fast path
    return y


@op("Conv")
def op_conv(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if not isinstance(x, GTensor):
        raise ValueError("Conv on a constant input")
    if x.pairs is not None and (lowering.n_uses(node.input[0]) != 1 or node.input[0] in lowering.output_names):
        x = replace(x, pairs=None)  # others read the float32 value: no second conv writing it as pairs
    wshape = tuple(np.shape(w)) if isinstance(w, np.ndarray) else w.shape
    spatial = len(wshape) - 2
    group = int(attrs(node).get("group", 1))
    strides, dil, pads = _conv_params(node, spatial, wshape[2:], x.shape[2:])
    if spatial == 1:
        x4 = reshape(lowering, x, x.shape[:2] + (1, x.shape[2]))
        w4 = reshape(lowering, lowering.const(w) if isinstance(w, np.ndarray) else w, wshape[:2] + (1, wshape[2]))
        y = conv2d(lowering, x4, w4, bias, [1, strides[0]], [1, dil[0]], [0, pads[0], 0, pads[1]], group)
        return [reshape(lowering, y, (y.shape[0], y.shape[1], y.shape[3]))]
    if spatial != 2:
        raise ValueError(f"Conv with {spatial} spatial dims")
    return [conv2d(lowering, x, w, bias, strides, dil, [pads[0], pads[1], pads[2], pads[3]], group)]


@check("ConvTranspose")
def check_conv_transpose(node: Any) -> str | None:
    a = attrs(node)
    ks = a.get("kernel_shape")
    if ks is not None and len(ks) != 2:
        return "ConvTranspose with other than 2 spatial dims"
    if int(a.get("group", 1)) != 1:
        return "ConvTranspose with groups"
    if any(d != 1 for d in a.get("dilations", [1, 1])):
        return "ConvTranspose with dilations"
    s = a.get("strides", [1, 1])
    if len(set(s)) != 1:
        return "ConvTranspose with different strides per axis"
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return "ConvTranspose with auto_pad SAME"
    return None


@op("ConvTranspose")
def op_conv_transpose(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """ggml_conv_transpose_2d_p0 (zero padding, one stride) then crop the pads, add output_padding."""
    from .op_shape import slice_axis

    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if not isinstance(x, GTensor) or not isinstance(w, np.ndarray):
        raise ValueError("ConvTranspose needs a runtime input and constant weights")
    a = attrs(node)
    s = int(a.get("strides", [1, 1])[0])
    pads = list(a.get("pads", [0, 0, 0, 0]))
    opad = list(a.get("output_padding", [0, 0]))
    g = ggml_lib()
    wt = lowering.const(w)  # (IC, OC, KH, KW) -> ne (KW, KH, OC, IC), as ggml expects
    x = cont(lowering, x)
    n, c, h, wd = x.shape
    _, oc, kh, kw = w.shape
    fh, fw = (h - 1) * s + kh, (wd - 1) * s + kw
    # ggml's CPU kernel computes batch item 0 only: one call per item, joined along N
    parts = [g.ggml_conv_transpose_2d_p0(lowering.ctx, wt.ptr, cont(lowering, slice_axis(lowering, x, 0, b, b + 1, 1)).ptr, s)
             for b in range(n)] if n > 1 else [g.ggml_conv_transpose_2d_p0(lowering.ctx, wt.ptr, x.ptr, s)]
    joined = parts[0]
    for part in parts[1:]:
        joined = g.ggml_concat(lowering.ctx, joined, part, 3)
    y = GTensor(joined, (n, oc, fh, fw))
    if opad[0] or opad[1]:
        y = GTensor(g.ggml_pad_ext(lowering.ctx, y.ptr, 0, opad[1], 0, opad[0], 0, 0, 0, 0), (n, oc, fh + opad[0], fw + opad[1]))
    y = slice_axis(lowering, y, 2, pads[0], y.shape[2] - pads[2], 1)
    y = slice_axis(lowering, y, 3, pads[1], y.shape[3] - pads[3], 1)
    if bias is not None:
        y = binary(lowering, "ggml_add", cont(lowering, y), reshape(lowering, lowering.const(bias), (1, -1, 1, 1)), True)
    return [y]
