"""Conv strategies that build the GEMM operand with copies instead of ggml's im2col: per-tap
GEMMs (``taps``), row copies (``rowcopy``) and overlapping windows (``window``, CPU only)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import native
from ._common import K_ALIGN, GTensor, Value, dense_copy, ggml_lib
from .conv_layout import channels_last, clear_blocks, conv_gemm, valid_range


def taps_ok(lowering: Any, w: Any, n: int, strides: list[int], dil: list[int], kh: int, kw: int) -> bool:
    return (lowering.options.get("conv_impl", "auto") == "taps" and isinstance(w, np.ndarray) and n == 1
            and strides == [1, 1] and dil == [1, 1] and kh * kw > 1)


def conv_taps(lowering: Any, x: GTensor, w: np.ndarray, ph: int, pw: int, out_shape: tuple[int, int, int, int]) -> GTensor:
    """Stride-1 conv as one GEMM per kernel tap over a channels-last padded input.

    With the padded image flattened to rows of C channels, the input seen by tap
    (i, j) is one contiguous block of rows starting at i*Wp + j, so every tap is a
    plain matrix product (no im2col); the outputs are summed, the padded columns
    cropped, and the result transposed back to NCHW.
    """
    g = ggml_lib()
    _, oc, oh, ow = out_shape
    c, wd = x.shape[1], x.shape[3]
    kh, kw = w.shape[2], w.shape[3]
    wp = wd + 2 * pw  # padded below by one spare row: the last taps read past the bottom edge
    xp = g.ggml_pad_ext(lowering.ctx, x.ptr, pw, pw, ph, ph + 1, 0, 0, 0, 0)  # ne (Wp, Hp, C, 1)
    xt = dense_copy(lowering, g.ggml_permute(lowering.ctx, xp, 1, 2, 0, 3))  # ne (C, Wp, Hp, 1): channels-last
    rows = oh * wp
    acc = None
    for i in range(kh):
        for j in range(kw):
            wk = lowering.const(w, transform=lambda a, i=i, j=j: np.ascontiguousarray(a[:, :, i, j]), tag=f"tap{i},{j}")
            view = g.ggml_view_2d(lowering.ctx, xt, c, rows, c * 4, (i * wp + j) * c * 4)
            y = g.ggml_mul_mat(lowering.ctx, wk.ptr, view)  # ne (OC, OH*Wp)
            acc = y if acc is None else g.ggml_add(lowering.ctx, acc, y)
    full = g.ggml_view_3d(lowering.ctx, acc, oc, ow, oh, oc * 4, wp * oc * 4, 0)  # crop the padded columns
    out = dense_copy(lowering, g.ggml_permute(lowering.ctx, full, 2, 0, 1, 3))  # ne (OW, OH, OC)
    return GTensor(g.ggml_reshape_4d(lowering.ctx, out, ow, oh, oc, 1), out_shape)


def rowcopy_wanted(lowering: Any, taps: int) -> bool:
    """The default on the CPU for kxk convs at batch 1 that the window conv does not take (strided,
    dilated, unaligned K); 1x1 convs keep im2col (there it is a plain transpose). Not on GPUs: their
    ``ggml_set`` takes only a contiguous source (CUDA asserts it), and ggml's im2col runs there."""
    impl = lowering.options.get("conv_impl", "auto")
    return impl == "rowcopy" or (impl == "auto" and taps > 1 and lowering.on_cpu)


def conv_rowcopy(lowering: Any, x: GTensor, w: np.ndarray, strides: list[int], dil: list[int], ph: int, pw: int,
                  out_shape: tuple[int, int, int, int]) -> GTensor:
    """im2col built from a channels-last copy of the input: strided row copies per kernel tap.

    ggml's im2col walks every output pixel across all channel planes; here each
    tap copies the in-bounds block of rows (C contiguous channels each) into its
    slot of the column matrix with ``ggml_set``, and writes zeros where the tap
    falls in the padding. The kernel is reordered to (OC, KH, KW, C) on upload.
    """
    g = ggml_lib()
    lowering.used("conv rowcopy")
    _, oc, oh, ow = out_shape
    c, h, wd = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = w.shape[2], w.shape[3]
    k, f = c * kh * kw, 4
    xt = x.cl if x.cl is not None else channels_last(lowering, x.ptr)  # ne (C, W, H, 1)
    col = lowering.scratch([k, ow, oh, 1], after=xt)
    nb1, nb2, nb3 = k * f, ow * k * f, oh * ow * k * f
    zeros = []  # per tap: the strips of outputs around the in-bounds block, which read padding
    for i in range(kh):
        y0, y1 = valid_range(oh, h, strides[0], i * dil[0] - ph)
        for j in range(kw):
            x0, x1 = valid_range(ow, wd, strides[1], j * dil[1] - pw)
            tap = i * kw + j
            strips = [(y0, ow, 0, 0), (oh - y1, ow, y1, 0), (y1 - y0, x0, y0, 0), (y1 - y0, ow - x1, y0, x1)]
            zeros += [(c, nx, ny, nb1, nb2, nb3, ((oy * ow + ox) * k + tap * c) * f) for ny, nx, oy, ox in strips]
            if y1 > y0 and x1 > x0:
                iy, ix = y0 * strides[0] + i * dil[0] - ph, x0 * strides[1] + j * dil[1] - pw
                src = g.ggml_view_3d(lowering.ctx, xt, c, x1 - x0, y1 - y0, strides[1] * c * f, strides[0] * wd * c * f,
                                     (iy * wd + ix) * c * f)
                if not lowering.on_cpu:  # a GPU's ggml_set takes only a contiguous source
                    src = g.ggml_cont(lowering.ctx, src)
                col = g.ggml_set_inplace(lowering.ctx, col, src, nb1, nb2, nb3, ((y0 * ow + x0) * k + tap * c) * f)
    col = clear_blocks(lowering, col, zeros)
    y = conv_gemm(lowering, g.ggml_reshape_2d(lowering.ctx, col, k, ow * oh), w, (0, 2, 3, 1), "ohwi")  # ne (OW*OH, OC)
    return GTensor(g.ggml_reshape_4d(lowering.ctx, y, ow, oh, oc, 1), out_shape)


def window_ok(lowering: Any, c: int, kh: int, kw: int, strides: list[int], dil: list[int]) -> bool:
    """The default for stride-1 kxk convs on the CPU (other backends may not take a GEMM operand with
    overlapping rows); with ggml's mul_mat only when K (C*KH*KW) is aligned for its fast path, the
    native GEMM takes any K."""
    impl = lowering.options.get("conv_impl", "auto")
    k_ok = (c * kh * kw) % K_ALIGN == 0 or native.for_lowering(lowering) is not None
    fits = strides == [1, 1] and dil == [1, 1] and kh * kw > 1 and k_ok
    return fits and lowering.on_cpu and impl in ("auto", "window")


def conv_window(lowering: Any, x: GTensor, w: np.ndarray, bias: Value | None, ph: int, pw: int,
                 out_shape: tuple[int, int, int, int]) -> GTensor:
    """Stride-1 conv as one GEMM over overlapping windows of a row-stacked input; no im2col.

    Each pixel of the padded, channels-last input gets the C channels of the KH pixels
    below it (one slot per kernel row; zeros where a row falls in the padding), so the
    KH x KW window of an output pixel is KW consecutive pixels: KH*KW*C contiguous floats.
    The GEMM reads them through a view whose rows overlap (row stride KH*C), so the
    input is copied KH times instead of the KH*KW times an im2col needs. Outputs are
    computed for every pixel of each padded row (row width W + 2*pw, the extra columns are
    cropped) and for M rows rounded up to 16, which ggml's fast GEMM wants. ggml sizes a
    view as if it were contiguous, so the scratch holds K*M floats (the im2col size).
    The kernel is reordered to (OC, KW, KH, C) on upload.
    """
    g = ggml_lib()
    lowering.used("conv window")
    _, oc, oh, ow = out_shape
    c, h, wd = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = w.shape[2], w.shape[3]
    wp, slot = wd + 2 * pw, kh * c  # padded row width; floats per stacked pixel
    k, f = kw * slot, 4
    m = -(-(oh * wp) // K_ALIGN) * K_ALIGN
    xt = x.cl if x.cl is not None else channels_last(lowering, x.ptr)  # ne (C, W, H, 1)
    buf = lowering.scratch([k * m, 1, 1, 1], after=xt)
    nb1, nb2 = slot * f, wp * slot * f
    zeros = []  # blocks that read padding, cleared each run

    for i in range(kh):
        lo, hi = valid_range(oh, h, 1, i - ph)
        for y0, y1 in ((0, lo), (hi, oh)):
            zeros.append((c, wd, y1 - y0, nb1, nb2, 0, ((y0 * wp + pw) * slot + i * c) * f))
        if hi > lo:
            src = g.ggml_view_3d(lowering.ctx, xt, c, wd, hi - lo, c * f, wd * c * f, (lo + i - ph) * wd * c * f)
            buf = g.ggml_set_inplace(lowering.ctx, buf, src, nb1, nb2, 0, ((lo * wp + pw) * slot + i * c) * f)
    if pw:
        # the right pad of row y and the left pad of row y + 1 are adjacent: 2*pw pixels
        zeros.append((pw * slot, 1, 1, nb1, nb2, 0, 0))
        zeros.append((2 * pw * slot, oh - 1, 1, nb2, nb2, 0, (pw + wd) * slot * f))
        zeros.append((pw * slot, 1, 1, nb1, nb2, 0, ((oh - 1) * wp + pw + wd) * slot * f))
    buf = clear_blocks(lowering, buf, zeros)
    windows = g.ggml_view_2d(lowering.ctx, buf, k, m, nb1, 0)  # overlapping rows: the KH x KW windows
    y = conv_gemm(lowering, windows, w, (0, 3, 2, 1), "owhi")  # ne (M, OC)
    crop = g.ggml_view_4d(lowering.ctx, y, ow, oh, oc, 1, wp * f, m * f, m * oc * f, 0)
    if bias is None:
        return GTensor(dense_copy(lowering, crop), out_shape)
    b = lowering.const(bias) if isinstance(bias, np.ndarray) else bias
    rows = g.ggml_repeat_4d(lowering.ctx, g.ggml_reshape_4d(lowering.ctx, b.ptr, 1, 1, oc, 1), ow, 1, oc, 1)
    return GTensor(g.ggml_add(lowering.ctx, crop, rows), out_shape)  # bias rows broadcast; the add also crops
