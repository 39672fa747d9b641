/* Depthwise 2-D convolution (groups = channels) straight from NCHW, a ggml custom op.
 *
 *   out[n, c, oy, ox] = act(bias[c] + sum_{i,j} W[c, i, j] . x[n, c, oy sh + i dh - ph, ox sw + j dw - pw])
 *
 * ggml's own depthwise kernel is vectorised only over channels, so the lowering used to lay the
 * input out channels-last and the result back (two copies per conv: MobileNets have dozens).
 * Here the outputs are one vector loop (simd_dw.h, per ISA) over the whole plane: each input plane is
 * copied once into zero-padded phase planes, one per (row, column) residue of the strides (one
 * plane at stride 1, four at stride 2), so that output position q = oy Wq + ox reads tap (i, j) at
 * a fixed offset of its phase plane: every tap is a contiguous, unconditional vector load, and the
 * few columns past a row's output (ox >= OW) are computed and dropped. The pads are zeroed once
 * per call (each plane rewrites only the image's positions). The bias and the activation (ReLU,
 * clip, hardswish, SiLU: sdrt_epilogue) are applied as the outputs are stored. The threads take
 * channel planes in turn.
 *
 * With AVX-512 (dilation 1, equal strides 1 or 2, kernels up to 8 wide) the planes are not copied at all: dw_rows
 * (simd_dw.h) reads each tap's 16 columns from the unpadded input with a masked load (zeros outside the image) and
 * writes the output rows in place; 3x3 and 5x5 keep their weights in registers. The phase planes and their two row
 * copies had cost more than the taps on MobileNets' small maps (7x7 to 28x28).
 */
#include "sdrt_ops.h"

#include <string.h>

/* params[] of sdrt_dwconv_op */
enum { DW_KH, DW_KW, DW_SH, DW_SW, DW_DH, DW_DW, DW_PH, DW_PW, DW_ACT, DW_LO, DW_HI, DW_PAIRS, DW_TOP, DW_LEFT, DW_COUNT };

/* one call's geometry and scratch: the phase planes (zero pads), the outputs with their dropped columns */
typedef struct {
    int W, H, OH, OW, KH, KW, ph, sh, sw, nt, pw, Wq, nq, is3x3, whole;
    size_t psize, ev_off, od_off;
    const int32_t *off, *rowoff;
    float *buf, *evens, *odds;
    const sdrt_epilogue *ep;
    sdrt_dw_flat_fn flat_fn;
    sdrt_dw_3x3_fn k3x3;
    sdrt_split2_fn split2;
    sdrt_copy_rows_fn copy_rows;
    sdrt_dw_rows_fn rows; /* straight from the input, no phase planes (NULL: this ISA or this geometry has none) */
} dw_call;

/* one channel plane xp (H x W) through taps wc and bias bc to tmp (OH rows Wq floats apart) */
static void dw_plane(const dw_call *k, const float *xp, const float *wc, float bc, float *tmp) {
    const int W = k->W, H = k->H, sw = k->sw, pw = k->pw;
    if (k->rows) {
        k->rows(xp, H, W, k->KH, k->KW, sw, k->ph, pw, wc, bc, k->ep, tmp, k->OH, k->OW, k->Wq);
        return;
    }
    float *buf = k->buf;
    /* the input rows of one residue j of the row stride lie Wq floats apart in their phase plane: one copy each */
    const int sh = k->sh;
    if (sw == 1) { /* the image's positions; the pads stay zero */
        for (int j = 0; j < sh && j < H; j++)
            k->copy_rows((H - j + sh - 1) / sh, W, xp + (size_t)j * W, (ptrdiff_t)sh * W, buf + k->rowoff[j] + pw,
                         k->Wq);
    } else if (k->whole) {
        const int hw = W / 2;
        k->split2(H * hw, xp, k->evens, k->odds);
        for (int j = 0; j < sh && j < H; j++) {
            const int rows = (H - j + sh - 1) / sh;
            k->copy_rows(rows, hw, k->evens + (size_t)j * hw, (ptrdiff_t)sh * hw, buf + k->rowoff[j] + k->ev_off, k->Wq);
            k->copy_rows(rows, hw, k->odds + (size_t)j * hw, (ptrdiff_t)sh * hw, buf + k->rowoff[j] + k->od_off, k->Wq);
        }
    } else if (sw == 2) {
        for (int y = 0; y < H; y++) {
            const float *src = xp + (size_t)y * W;
            float *prow = buf + k->rowoff[y];
            k->split2(W / 2, src, prow + k->ev_off, prow + k->od_off);
            if (W % 2)
                prow[k->ev_off + W / 2] = src[W - 1];
        }
    } else {
        for (int y = 0; y < H; y++) {
            float *prow = buf + k->rowoff[y];
            const float *src = xp + (size_t)y * W;
            for (int x = 0; x < W; x++)
                prow[(size_t)((x + pw) % sw) * k->psize + (x + pw) / sw] = src[x];
        }
    }
    if (k->is3x3)
        k->k3x3(k->OH, k->Wq, buf, wc, bc, k->ep, tmp);
    else
        k->flat_fn(k->nq, k->nt, buf, k->off, wc, bc, k->ep, tmp);
}

/* dst = depthwise conv(x, W) + bias, then the activation, as ggml_custom_4d's callback.
 *   src[0] x:      ne (W, H, C, N), contiguous
 *   src[1] W:      ne (KH*KW, C), contiguous: the taps of one channel in (i, j) order
 *   src[2] params: int32 [KH, KW, sh, sw, dh, dw, ph, pw, act, lo, hi, pairs, top, left] (lo, hi: float bits;
 *                  strides 1 to 4)
 *   src[3] bias:   C floats, or NULL
 *   dst:           pairs 0: ne (OW, OH, C, N) float32, contiguous;
 *                  pairs 1: ne (2 Wp, Hp, C2, N) 16-bit, the input of the AMX conv's "pairs" case as
 *                  sdrt_pair_pad_op writes it (bf16 channel pairs, the image at (top, left), zeros around it and
 *                  past C): the pair pad of the output without the float32 output in between. The threads take
 *                  pair planes (both channels of a pair) in turn, the two outputs kept until they are paired. */
SDRT_EXPORT void sdrt_dwconv_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_dwconv_op);
    (void)userdata;
    const void *tx = sdrt_tensor_src(dst, 0), *tw = sdrt_tensor_src(dst, 1), *tp = sdrt_tensor_src(dst, 2),
               *tb = sdrt_tensor_src(dst, 3);
    if (!tx || !tw || !tp)
        return;
    const sdrt_view X = sdrt_tensor_view(tx), Wt = sdrt_tensor_view(tw), O = sdrt_tensor_view(dst);
    const int32_t *pr = (const int32_t *)sdrt_tensor_view(tp).data;
    const float *bias = tb ? (const float *)sdrt_tensor_view(tb).data : NULL;
    const int W = (int)X.ne[0], H = (int)X.ne[1], C = (int)X.ne[2], N = (int)X.ne[3];
    const int KH = pr[DW_KH], KW = pr[DW_KW], sh = pr[DW_SH], sw = pr[DW_SW], dh = pr[DW_DH], dw = pr[DW_DW];
    const int ph = pr[DW_PH], pw = pr[DW_PW], pairs = pr[DW_PAIRS], top = pr[DW_TOP], left = pr[DW_LEFT];
    sdrt_epilogue ep = {pr[DW_ACT], 0.0f, 0.0f};
    memcpy(&ep.lo, pr + DW_LO, sizeof(float));
    memcpy(&ep.hi, pr + DW_HI, sizeof(float));
    if (KH < 1 || KW < 1 || KH * KW > 256 || sw < 1 || sw > 4 || sh < 1 || sh > 4 || ph < 0 || pw < 0 || dh < 1 ||
        dw < 1 || (int)Wt.ne[1] != C || (int)Wt.ne[0] != KH * KW || H + 2 * ph < (KH - 1) * dh + 1 ||
        W + 2 * pw < (KW - 1) * dw + 1)
        return;
    /* the output's size: its own shape, or the conv's arithmetic where it is written as pairs */
    const int OW = pairs ? (W + 2 * pw - (KW - 1) * dw - 1) / sw + 1 : (int)O.ne[0];
    const int OH = pairs ? (H + 2 * ph - (KH - 1) * dh - 1) / sh + 1 : (int)O.ne[1];
    const int Wp2 = (int)O.ne[0] / 2, Hp2 = (int)O.ne[1];
    if (pairs ? (pairs != 1 || O.nb[0] != 2 || top < 0 || left < 0 || left + OW > Wp2 || top + OH > Hp2 ||
                 2 * O.ne[2] < C || O.ne[3] != N)
              : ((int)O.ne[2] != C || OH < 1 || OW < 1 || (OH - 1) * sh + (KH - 1) * dh >= H + 2 * ph ||
                 (OW - 1) * sw + (KW - 1) * dw >= W + 2 * pw))
        return; /* the taps of the last output would reach past the padded input, or the pairs would not fit */
    dw_call k = {.W = W, .H = H, .OH = OH, .OW = OW, .KH = KH, .KW = KW, .ph = ph, .sh = sh, .sw = sw, .nt = KH * KW, .pw = pw,
                 .flat_fn = sdrt_ops_dw_flat(), .k3x3 = sdrt_ops_dw_3x3(), .split2 = sdrt_ops_split2(),
                 .copy_rows = sdrt_ops_copy_rows(),
                 .ep = ep.act ? &ep : NULL};
    /* dilation 1, equal strides 1 or 2: straight from the input where the ISA has masked loads (dw_rows) */
    if (dh == 1 && dw == 1 && sh == sw && sh <= 2 && KW <= 8)
        k.rows = sdrt_ops_dw_rows();
    if (k.rows && !pairs) { /* into the output itself: no phase planes, no scratch */
        int n = ith / C, c = ith % C; /* plane ith, then every nth */
        for (long pl = ith; pl < (long)N * C; pl += nth) {
            k.rows((const float *)(X.data + (size_t)n * X.nb[3] + (size_t)c * X.nb[2]), H, W, KH, KW, sw, ph, pw,
                   (const float *)(Wt.data + (size_t)c * Wt.nb[1]), bias ? bias[c] : 0.0f, k.ep,
                   (float *)(O.data + (size_t)n * O.nb[3] + (size_t)c * O.nb[2]), OH, OW, OW);
            for (c += nth; c >= C; c -= C)
                n++;
        }
        return;
    }
    const int Hp = H + 2 * ph, Wp = W + 2 * pw;
    /* 3x3 at stride 1: four output rows a call (dw_3x3), so four rows of slack. Not for padded rows
     * under 16 floats: dw_3x3 rounds each row up to whole vectors and the rows up to four, so a 7x7
     * map (rows of 9) computed 16 vectors for 49 outputs where the flat run over the plane takes 8
     * (960 channels, 1 thread: 198 -> 155 us; at 14x14, rows of 16, dw_3x3 stays faster: 211 against
     * 233 us) */
    k.is3x3 = KH == 3 && KW == 3 && sh == 1 && sw == 1 && dh == 1 && dw == 1 && Wp >= 16;
    /* sh x sw phase planes of Hq rows of Wq floats: padded row r, column x lie in plane
     * (r % sh, x % sw) at (r / sh, x / sw); tap (i, j) of output (oy, ox) is at (oy, ox) plus the
     * tap's shift in its plane */
    const int Hq = (Hp + sh - 1) / sh;
    k.Wq = (Wp + sw - 1) / sw;
    k.nq = OH * k.Wq;
    k.psize = (size_t)Hq * k.Wq;
    const size_t slack = (size_t)KW * dw + 4 * 16 + (k.is3x3 ? 4 * (size_t)k.Wq : 0);
    const size_t planes = (size_t)sh * sw * k.psize + slack, outs = (size_t)k.nq + 4 * 16 + (k.is3x3 ? 4 * (size_t)k.Wq : 0);
    /* at stride 2 on short even rows (under 32 floats: 28, 14, 10 in MobileNets), the whole plane is
     * split into its even and odd columns at once and the halves copied row by row: split row by
     * row, a 14-float row is all scalar tail (576 channels at 14x14: the split took twice the
     * convolution's multiply-adds) */
    k.whole = sw == 2 && W % 2 == 0 && W < 32;
    const size_t halves = k.whole ? (size_t)H * W : 0, nouts = pairs ? 2 : 1;
    float *buf = sdrt_thread_buffer(3, (planes + nouts * outs + halves) * sizeof(float) +
                                           ((size_t)k.nt + H) * sizeof(int32_t));
    if (!buf)
        return;
    k.buf = buf;
    float *tmp = buf + planes, *tmp1 = tmp + (nouts - 1) * outs; /* the outputs with their dropped columns */
    k.evens = tmp + nouts * outs;
    k.odds = k.evens + halves / 2;
    int32_t *off = (int32_t *)(k.evens + halves), *rowoff = off + k.nt;
    k.off = off;
    k.rowoff = rowoff;
    for (int i = 0; i < KH; i++)
        for (int j = 0; j < KW; j++) {
            const int r = i * dh, x = j * dw;
            off[i * KW + j] = (int32_t)(((size_t)(r % sh) * sw + x % sw) * k.psize + (size_t)(r / sh) * k.Wq + x / sw);
        }
    /* where input row y starts in its phase plane: the divisions once a call, not once a row of
     * every plane (an integer division costs as much as copying a short row) */
    for (int y = 0; y < H; y++) {
        const int r = y + ph;
        rowoff[y] = (int32_t)((size_t)(r % sh) * sw * k.psize + (size_t)(r / sh) * k.Wq);
    }
    /* at stride 2: even x to the plane of pw's parity, odd x to the other */
    k.ev_off = (size_t)(pw % 2) * k.psize + pw / 2;
    k.od_off = (size_t)((pw + 1) % 2) * k.psize + (pw + 1) / 2;
    memset(buf, 0, planes * sizeof(float));
    if (pairs) {
        const long C2 = (long)O.ne[2];
        for (long pl = ith; pl < (long)N * C2; pl += nth) {
            const int n = (int)(pl / C2), cp = (int)(pl % C2), c0 = 2 * cp;
            uint16_t *d = (uint16_t *)(void *)(O.data + (size_t)n * O.nb[3] + (size_t)cp * O.nb[2]);
            sdrt_pair_plane_borders(d, top, left, OW, OH, Wp2, Hp2, c0 >= C);
            if (c0 >= C)
                continue;
            for (int c = c0; c < c0 + 2 && c < C; c++)
                dw_plane(&k, (const float *)(const void *)(X.data + (size_t)n * X.nb[3] + (size_t)c * X.nb[2]),
                         (const float *)(const void *)(Wt.data + (size_t)c * Wt.nb[1]), bias ? bias[c] : 0.0f,
                         c == c0 ? tmp : tmp1);
            sdrt_pair_rows(tmp, c0 + 1 < C ? tmp1 : NULL, k.Wq, OH, OW, d + ((ptrdiff_t)top * Wp2 + left) * 2,
                           (ptrdiff_t)Wp2 * 2);
        }
        return;
    }
    int n = ith / C, c = ith % C; /* plane ith, then every nth */
    for (long pl = ith; pl < (long)N * C; pl += nth) {
        const float *xp = (const float *)(X.data + (size_t)n * X.nb[3] + (size_t)c * X.nb[2]);
        float *op = (float *)(O.data + (size_t)n * O.nb[3] + (size_t)c * O.nb[2]);
        dw_plane(&k, xp, (const float *)(Wt.data + (size_t)c * Wt.nb[1]), bias ? bias[c] : 0.0f, tmp);
        for (c += nth; c >= C; c -= C)
            n++;
        k.copy_rows(OH, OW, tmp, k.Wq, op, OW);
    }
}
