"""Conv (1-D and 2-D, groups, strides, pads, dilations) and ConvTranspose.

Conv lowers to one matrix multiply (ggml's fast path on every backend) over a
column matrix: on the CPU, stride-1 kxk convs read overlapping windows of a
row-stacked copy of the input (``_conv_window``); other kxk convs at batch 1
build the columns by row copies (``_conv_rowcopy``); the rest use ggml's
im2col. With batch 1 the product comes out directly in NCHW order, so no
permute copy is needed. Depthwise convs (groups == channels) use ggml's
depthwise kernel; other groups are split into per-group convolutions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import check, op
from ._common import K_ALIGN, GTensor, Value, aligned, attrs, binary, cont, ggml_lib, reshape, want_pad


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
           pads: list[int], group: int) -> GTensor:
    g = ggml_lib()
    x, ph, pw = _pad_input(lowering, x, pads)
    n, c, h, wd = x.shape
    oc, icg, kh, kw = (int(d) for d in (w.shape if isinstance(w, np.ndarray) else w.shape))
    depthwise = group == c and icg == 1 and oc == c
    cp = c
    if group == 1 and isinstance(w, np.ndarray) and kh * kw > 1 and want_pad(lowering, c * kh * kw):
        # zero channels in input and kernel: same sums, aligned K. Only when the padded input
        # (copied by ggml's scalar pad) stays small against the im2col it feeds; for 1x1 convs
        # the copy costs what the aligned GEMM saves (MobileNetV2: 0.95x without it)
        cp = _aligned_channels(c, kh * kw)
        if cp > c * 1.25:
            cp = c
    if not isinstance(w, np.ndarray):
        wt = cont(lowering, w)
    elif depthwise:
        wt = None  # type: ignore[assignment]
    elif cp != c:
        wt = lowering.const(w, transform=lambda a: np.pad(a, [(0, 0), (0, cp - c), (0, 0), (0, 0)]), tag=f"c{cp}")
    else:
        wt = lowering.const(w)
    oh = (h + 2 * ph - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + 2 * pw - dil[1] * (kw - 1) - 1) // strides[1] + 1
    x = cont(lowering, x)
    pointwise = (group == 1 and isinstance(w, np.ndarray) and n == 1 and kh == kw == 1 and strides == [1, 1]
                 and ph == pw == 0 and lowering.options.get("layouts", True))
    if pointwise:
        kp = c
        if want_pad(lowering, c) and oh * ow * c * oc >= 2_000_000:
            # aligned K for the fast GEMM; padding the small products costs more than it saves
            # (1x1 conv GEMMs, one thread: 3136x40x120 1.9 vs 6.8 ms, 784x72x24 0.36 vs 0.22 ms)
            kp = aligned(c)
            wt = lowering.const(w, transform=lambda a: np.pad(a, [(0, 0), (0, kp - c), (0, 0), (0, 0)]), tag=f"c{kp}")
        y = _conv_pointwise(lowering, x, wt, (n, oc, oh, ow), kp)
    elif group == 1 and _taps_ok(lowering, w, n, strides, dil, kh, kw):
        y = _conv_taps(lowering, x, w, ph, pw, (n, oc, oh, ow))
    elif group == 1 and isinstance(w, np.ndarray) and n == 1 and _window_ok(lowering, c, kh, kw, strides, dil):
        y = _conv_window(lowering, x, w, bias, ph, pw, (n, oc, oh, ow))
        bias = None  # added by _conv_window, which also crops
    elif group == 1 and isinstance(w, np.ndarray) and n == 1 and _rowcopy_wanted(lowering, kh * kw):
        y = _conv_rowcopy(lowering, x, w, strides, dil, ph, pw, (n, oc, oh, ow))
    elif group == 1:
        if cp != c:
            x = GTensor(g.ggml_pad(lowering.ctx, x.ptr, 0, 0, cp - c, 0), (n, cp, h, wd))
        y = _conv_dense(lowering, x, wt, strides, dil, ph, pw, (n, oc, oh, ow))
    elif depthwise:
        y = _conv_depthwise(lowering, x, w, wt, strides, dil, ph, pw, (n, oc, oh, ow))
    else:
        ocg = oc // group
        parts = []
        for gi in range(group):
            xs = _channel_view(lowering, x, gi * icg, icg)
            ws = _channel_view(lowering, wt, gi * ocg, ocg, axis=0)
            parts.append(_conv_dense(lowering, cont(lowering, xs), cont(lowering, ws), strides, dil, ph, pw, (n, ocg, oh, ow)))
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


def _conv_pointwise(lowering: Any, x: GTensor, wt: GTensor, out_shape: tuple[int, int, int, int], kp: int) -> GTensor:
    """1x1 conv at batch 1 in both layouts from one column matrix (ggml computes the one used).

    The column matrix of a 1x1 conv is the input channels-last: taken as is when the
    producer made it, else one transpose copy. NCHW comes out of the product
    one way round, channels-last the other.
    """
    g = ggml_lib()
    _, oc, oh, ow = out_shape
    c = x.shape[1]
    w2 = g.ggml_reshape_2d(lowering.ctx, wt.ptr, kp, oc)
    if x.cl is not None:
        col = g.ggml_reshape_2d(lowering.ctx, x.cl, c, ow * oh)
    else:
        col = g.ggml_reshape_2d(lowering.ctx, channels_last(lowering, x.ptr), c, ow * oh)  # = im2col of a 1x1 conv
    if kp != c:
        col = g.ggml_pad(lowering.ctx, col, kp - c, 0, 0, 0)
    nchw = g.ggml_reshape_4d(lowering.ctx, g.ggml_mul_mat(lowering.ctx, col, w2), ow, oh, oc, 1)
    cl = g.ggml_reshape_4d(lowering.ctx, g.ggml_mul_mat(lowering.ctx, w2, col), oc, ow, oh, 1)
    return GTensor(nchw, out_shape, cl=cl)


def _taps_ok(lowering: Any, w: Any, n: int, strides: list[int], dil: list[int], kh: int, kw: int) -> bool:
    return (lowering.options.get("conv_impl", "auto") == "taps" and isinstance(w, np.ndarray) and n == 1
            and strides == [1, 1] and dil == [1, 1] and kh * kw > 1)


def _conv_taps(lowering: Any, x: GTensor, w: np.ndarray, ph: int, pw: int, out_shape: tuple[int, int, int, int]) -> GTensor:
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
    xt = g.ggml_cont(lowering.ctx, g.ggml_permute(lowering.ctx, xp, 1, 2, 0, 3))  # ne (C, Wp, Hp, 1): channels-last
    rows = oh * wp
    acc = None
    for i in range(kh):
        for j in range(kw):
            wk = lowering.const(w, transform=lambda a, i=i, j=j: np.ascontiguousarray(a[:, :, i, j]), tag=f"tap{i},{j}")
            view = g.ggml_view_2d(lowering.ctx, xt, c, rows, c * 4, (i * wp + j) * c * 4)
            y = g.ggml_mul_mat(lowering.ctx, wk.ptr, view)  # ne (OC, OH*Wp)
            acc = y if acc is None else g.ggml_add(lowering.ctx, acc, y)
    full = g.ggml_view_3d(lowering.ctx, acc, oc, ow, oh, oc * 4, wp * oc * 4, 0)  # crop the padded columns
    out = g.ggml_cont(lowering.ctx, g.ggml_permute(lowering.ctx, full, 2, 0, 1, 3))  # ne (OW, OH, OC)
    return GTensor(g.ggml_reshape_4d(lowering.ctx, out, ow, oh, oc, 1), out_shape)


def channels_last(lowering: Any, x: Any) -> Any:
    """A contiguous (C, W, H, N)-ordered copy of an NCHW tensor (ggml ne (W, H, C, N)).

    ``ggml_cont`` of the permuted view reads with a stride of a whole channel plane
    per element; ``transpose="write"`` copies into a permuted view of the target
    instead (contiguous reads, writes with a stride of C floats). Predicted faster,
    measured mixed: VAE 0.95x with 2 threads but 1.08x with one, MobileNetV2
    1.06-1.18x; so ``ggml_cont`` stays the default.
    """
    g = ggml_lib()
    if lowering.options.get("transpose", "cont") != "write":
        return g.ggml_cont(lowering.ctx, g.ggml_permute(lowering.ctx, x, 1, 2, 0, 3))
    ne = x.contents.ne
    target = lowering.scratch([ne[2], ne[0], ne[1], ne[3]], after=x)
    done = g.ggml_cpy(lowering.ctx, x, g.ggml_permute(lowering.ctx, target, 2, 0, 1, 3))
    return g.ggml_permute(lowering.ctx, done, 1, 2, 0, 3)  # back to ne (C, W, H, N), contiguous memory


def _clear(lowering: Any, buf: Any, blocks: list[tuple[int, ...]]) -> Any:
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


def _rowcopy_wanted(lowering: Any, taps: int) -> bool:
    """The default for kxk convs at batch 1 that the window conv does not take (strided, dilated,
    unaligned K, not on the CPU): 0.89-0.93x the time of ggml's im2col on the UNet and VAE
    benches. 1x1 convs keep im2col (there it is a plain transpose)."""
    impl = lowering.options.get("conv_impl", "auto")
    return impl == "rowcopy" or (impl == "auto" and taps > 1)


def _valid_range(n_out: int, n_in: int, stride: int, offset: int) -> tuple[int, int]:
    """Output positions o in [lo, hi) whose input o*stride + offset lies inside [0, n_in)."""
    lo = max(0, -(offset // stride) if offset < 0 else 0)
    while lo < n_out and lo * stride + offset < 0:
        lo += 1
    hi = lo
    while hi < n_out and hi * stride + offset < n_in:
        hi += 1
    return lo, hi


def _conv_rowcopy(lowering: Any, x: GTensor, w: np.ndarray, strides: list[int], dil: list[int], ph: int, pw: int,
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
        y0, y1 = _valid_range(oh, h, strides[0], i * dil[0] - ph)
        for j in range(kw):
            x0, x1 = _valid_range(ow, wd, strides[1], j * dil[1] - pw)
            tap = i * kw + j
            strips = [(y0, ow, 0, 0), (oh - y1, ow, y1, 0), (y1 - y0, x0, y0, 0), (y1 - y0, ow - x1, y0, x1)]
            zeros += [(c, nx, ny, nb1, nb2, nb3, ((oy * ow + ox) * k + tap * c) * f) for ny, nx, oy, ox in strips]
            if y1 > y0 and x1 > x0:
                iy, ix = y0 * strides[0] + i * dil[0] - ph, x0 * strides[1] + j * dil[1] - pw
                src = g.ggml_view_3d(lowering.ctx, xt, c, x1 - x0, y1 - y0, strides[1] * c * f, strides[0] * wd * c * f,
                                     (iy * wd + ix) * c * f)
                col = g.ggml_set_inplace(lowering.ctx, col, src, nb1, nb2, nb3, ((y0 * ow + x0) * k + tap * c) * f)
    col = _clear(lowering, col, zeros)
    wt = lowering.const(w, transform=lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1)), tag="ohwi")
    w2 = g.ggml_reshape_2d(lowering.ctx, wt.ptr, k, oc)
    y = g.ggml_mul_mat(lowering.ctx, g.ggml_reshape_2d(lowering.ctx, col, k, ow * oh), w2)  # ne (OW*OH, OC)
    return GTensor(g.ggml_reshape_4d(lowering.ctx, y, ow, oh, oc, 1), out_shape)


def _window_ok(lowering: Any, c: int, kh: int, kw: int, strides: list[int], dil: list[int]) -> bool:
    """The default for stride-1 kxk convs on the CPU whose K (C*KH*KW) is aligned for the fast GEMM
    (other backends may not take a GEMM operand with overlapping rows)."""
    impl = lowering.options.get("conv_impl", "auto")
    fits = strides == [1, 1] and dil == [1, 1] and kh * kw > 1 and (c * kh * kw) % K_ALIGN == 0
    return fits and lowering.on_cpu and impl in ("auto", "window")


def _conv_window(lowering: Any, x: GTensor, w: np.ndarray, bias: Value | None, ph: int, pw: int,
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
        lo, hi = _valid_range(oh, h, 1, i - ph)
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
    buf = _clear(lowering, buf, zeros)
    windows = g.ggml_view_2d(lowering.ctx, buf, k, m, nb1, 0)  # overlapping rows: the KH x KW windows
    wt = lowering.const(w, transform=lambda a: np.ascontiguousarray(a.transpose(0, 3, 2, 1)), tag="owhi")
    y = g.ggml_mul_mat(lowering.ctx, windows, g.ggml_reshape_2d(lowering.ctx, wt.ptr, k, oc))  # ne (M, OC)
    crop = g.ggml_view_4d(lowering.ctx, y, ow, oh, oc, 1, wp * f, m * f, m * oc * f, 0)
    if bias is None:
        return GTensor(g.ggml_cont(lowering.ctx, crop), out_shape)
    b = lowering.const(bias) if isinstance(bias, np.ndarray) else bias
    rows = g.ggml_repeat_4d(lowering.ctx, g.ggml_reshape_4d(lowering.ctx, b.ptr, 1, 1, oc, 1), ow, 1, oc, 1)
    return GTensor(g.ggml_add(lowering.ctx, crop, rows), out_shape)  # bias rows broadcast; the add also crops


def _aligned_channels(c: int, taps: int) -> int:
    cp = c
    while (cp * taps) % K_ALIGN:
        cp += 1
    return cp


def _conv_depthwise(lowering: Any, x: GTensor, w: np.ndarray | GTensor, wt: GTensor | None, strides: list[int], dil: list[int], ph: int, pw: int,
                    out_shape: tuple[int, int, int, int]) -> GTensor:
    """Depthwise conv. ggml's kernel is vectorized over channels only when channels are the
    innermost dim in memory, so the input is laid out channels-last first (one copy) and
    the result copied back to NCHW, unless ``dw_layout="nchw"``."""
    g = ggml_lib()
    args = (strides[1], strides[0], pw, ph, dil[1], dil[0])
    if lowering.options.get("dw_layout", "nhwc") == "nchw" or not isinstance(w, np.ndarray):
        wt = wt or lowering.const(w)
        return GTensor(g.ggml_conv_2d_dw_direct(lowering.ctx, wt.ptr, x.ptr, *args), out_shape)
    # kernel as (KH, KW, 1, C) memory, viewed with ne (KW, KH, 1, C): channels innermost
    kc = lowering.const(w, transform=lambda a: np.ascontiguousarray(a[:, 0].transpose(1, 2, 0))[:, :, None, :], tag="hwc")
    kv = g.ggml_permute(lowering.ctx, kc.ptr, 3, 2, 0, 1)
    xc = x.cl if x.cl is not None else channels_last(lowering, x.ptr)  # memory (N, H, W, C)
    xv = g.ggml_permute(lowering.ctx, xc, 2, 0, 1, 3)  # ne (W, H, C, N) over channels-last memory
    y = g.ggml_conv_2d_dw_direct(lowering.ctx, kv, xv, *args)
    cl = g.ggml_permute(lowering.ctx, y, 1, 2, 0, 3) if out_shape[0] == 1 and lowering.options.get("layouts", True) else None
    return GTensor(g.ggml_cont(lowering.ctx, y), out_shape, cl=cl)


def _channel_view(lowering: Any, x: GTensor, start: int, count: int, axis: int = 1) -> GTensor:
    from .op_shape import slice_axis

    return slice_axis(lowering, x, axis, start, start + count, 1)


def _conv_dense(lowering: Any, x: GTensor, wt: GTensor, strides: list[int], dil: list[int], ph: int, pw: int,
                out_shape: tuple[int, int, int, int]) -> GTensor:
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
    if impl in ("im2col", "auto") and (ow * oh * n) % 4 and oc % 4 == 0:
        impl = "im2col_nhwc"  # the GEMM's fast path needs its first operand's rows to be a multiple of 4
    if impl == "im2col_nhwc":
        y = g.ggml_mul_mat(lowering.ctx, w2, col2)  # ne: [OC, OW*OH*N]: channels-last, then one transpose copy
        y = g.ggml_cont(lowering.ctx, g.ggml_transpose(lowering.ctx, y))
    else:
        y = g.ggml_mul_mat(lowering.ctx, col2, w2)  # ne: [OW*OH*N, OC]
    if n == 1:
        return GTensor(g.ggml_reshape_4d(lowering.ctx, y, ow, oh, oc, 1), out_shape)
    y = g.ggml_reshape_4d(lowering.ctx, y, ow, oh, n, oc)
    y = g.ggml_cont(lowering.ctx, g.ggml_permute(lowering.ctx, y, 0, 1, 3, 2))
    return GTensor(y, out_shape)


@op("Conv")
def op_conv(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if not isinstance(x, GTensor):
        raise ValueError("Conv on a constant input")
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
    y = GTensor(g.ggml_conv_transpose_2d_p0(lowering.ctx, wt.ptr, x.ptr, s), (n, oc, fh, fw))
    if opad[0] or opad[1]:
        y = GTensor(g.ggml_pad_ext(lowering.ctx, y.ptr, 0, opad[1], 0, opad[0], 0, 0, 0, 0), (n, oc, fh + opad[0], fw + opad[1]))
    y = slice_axis(lowering, y, 2, pads[0], y.shape[2] - pads[2], 1)
    y = slice_axis(lowering, y, 3, pads[1], y.shape[3] - pads[3], 1)
    if bias is not None:
        y = binary(lowering, "ggml_add", cont(lowering, y), reshape(lowering, lowering.const(bias), (1, -1, 1, 1)), True)
    return [y]
