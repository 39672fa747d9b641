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
 */
#include "sdrt_ops.h"

#include <string.h>

/* dst[i] = src[i] for i < n: the rows of a depthwise conv's planes are short (7 to 112 floats a
 * row in MobileNets), so they are copied in constant-size pieces that the compiler inlines as
 * vector moves; memcpy's call and size dispatch cost as much as such a copy */
static inline void copy_row(float *SDRT_RESTRICT dst, const float *SDRT_RESTRICT src, int n) {
    for (; n >= 16; n -= 16, dst += 16, src += 16)
        memcpy(dst, src, 16 * sizeof(float));
    if (n & 8) {
        memcpy(dst, src, 8 * sizeof(float));
        dst += 8;
        src += 8;
    }
    if (n & 4) {
        memcpy(dst, src, 4 * sizeof(float));
        dst += 4;
        src += 4;
    }
    if (n & 2) {
        memcpy(dst, src, 2 * sizeof(float));
        dst += 2;
        src += 2;
    }
    if (n & 1)
        *dst = *src;
}

/* params[] of sdrt_dwconv_op */
enum { DW_KH, DW_KW, DW_SH, DW_SW, DW_DH, DW_DW, DW_PH, DW_PW, DW_ACT, DW_LO, DW_HI, DW_COUNT };

/* dst = depthwise conv(x, W) + bias, then the activation, as ggml_custom_4d's callback.
 *   src[0] x:      ne (W, H, C, N), contiguous
 *   src[1] W:      ne (KH*KW, C), contiguous: the taps of one channel in (i, j) order
 *   src[2] params: int32 [KH, KW, sh, sw, dh, dw, ph, pw, act, lo, hi] (lo, hi: float bits; strides 1 to 4)
 *   src[3] bias:   C floats, or NULL
 *   dst:           ne (OW, OH, C, N), contiguous */
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
    const int OW = (int)O.ne[0], OH = (int)O.ne[1];
    const int KH = pr[DW_KH], KW = pr[DW_KW], sh = pr[DW_SH], sw = pr[DW_SW], dh = pr[DW_DH], dw = pr[DW_DW];
    const int ph = pr[DW_PH], pw = pr[DW_PW];
    sdrt_epilogue ep = {pr[DW_ACT], 0.0f, 0.0f};
    memcpy(&ep.lo, pr + DW_LO, sizeof(float));
    memcpy(&ep.hi, pr + DW_HI, sizeof(float));
    if (KH < 1 || KW < 1 || KH * KW > 256 || sw < 1 || sw > 4 || sh < 1 || sh > 4 || (int)O.ne[2] != C ||
        (int)Wt.ne[1] != C || (int)Wt.ne[0] != KH * KW || ph < 0 || pw < 0 || dh < 1 || dw < 1 || OH < 1 || OW < 1 ||
        (OH - 1) * sh + (KH - 1) * dh >= H + 2 * ph || (OW - 1) * sw + (KW - 1) * dw >= W + 2 * pw)
        return; /* the taps of the last output would reach past the padded input */
    const sdrt_dw_flat_fn flat_fn = sdrt_ops_dw_flat();
    const sdrt_dw_3x3_fn k3x3 = sdrt_ops_dw_3x3();
    const sdrt_split2_fn split2 = sdrt_ops_split2();
    const int nt = KH * KW, Hp = H + 2 * ph, Wp = W + 2 * pw;
    /* 3x3 at stride 1: four output rows a call (dw_3x3), so four rows of slack. Not for padded rows
     * under 16 floats: dw_3x3 rounds each row up to whole vectors and the rows up to four, so a 7x7
     * map (rows of 9) computed 16 vectors for 49 outputs where the flat run over the plane takes 8
     * (960 channels, 1 thread: 198 -> 155 us; at 14x14, rows of 16, dw_3x3 stays faster: 211 against
     * 233 us) */
    const int is3x3 = KH == 3 && KW == 3 && sh == 1 && sw == 1 && dh == 1 && dw == 1 && Wp >= 16;
    /* sh x sw phase planes of Hq rows of Wq floats: padded row r, column x lie in plane
     * (r % sh, x % sw) at (r / sh, x / sw); tap (i, j) of output (oy, ox) is at (oy, ox) plus the
     * tap's shift in its plane */
    const int Hq = (Hp + sh - 1) / sh, Wq = (Wp + sw - 1) / sw, nq = OH * Wq;
    const size_t psize = (size_t)Hq * Wq, slack = (size_t)KW * dw + 4 * 16 + (is3x3 ? 4 * (size_t)Wq : 0);
    const size_t planes = (size_t)sh * sw * psize + slack, outs = (size_t)nq + 4 * 16 + (is3x3 ? 4 * (size_t)Wq : 0);
    /* at stride 2 on short even rows (under 32 floats: 28, 14, 10 in MobileNets), the whole plane is
     * split into its even and odd columns at once and the halves copied row by row: split row by
     * row, a 14-float row is all scalar tail (576 channels at 14x14: the split took twice the
     * convolution's multiply-adds) */
    const int whole = sw == 2 && W % 2 == 0 && W < 32;
    const size_t halves = whole ? (size_t)H * W : 0;
    float *buf = sdrt_thread_buffer(3, (planes + outs + halves) * sizeof(float) + ((size_t)nt + H) * sizeof(int32_t));
    if (!buf)
        return;
    float *tmp = buf + planes; /* the outputs with their dropped columns */
    float *evens = tmp + outs, *odds = evens + halves / 2;
    int32_t *off = (int32_t *)(evens + halves), *rowoff = off + nt;
    for (int i = 0; i < KH; i++)
        for (int j = 0; j < KW; j++) {
            const int r = i * dh, x = j * dw;
            off[i * KW + j] = (int32_t)(((size_t)(r % sh) * sw + x % sw) * psize + (size_t)(r / sh) * Wq + x / sw);
        }
    /* where input row y starts in its phase plane: the divisions once a call, not once a row of
     * every plane (an integer division costs as much as copying a short row) */
    for (int y = 0; y < H; y++) {
        const int r = y + ph;
        rowoff[y] = (int32_t)((size_t)(r % sh) * sw * psize + (size_t)(r / sh) * Wq);
    }
    /* at stride 2: even x to the plane of pw's parity, odd x to the other */
    const size_t ev_off = (size_t)(pw % 2) * psize + pw / 2, od_off = (size_t)((pw + 1) % 2) * psize + (pw + 1) / 2;
    memset(buf, 0, planes * sizeof(float));
    const sdrt_epilogue *epp = ep.act ? &ep : NULL;
    int n = ith / C, c = ith % C; /* plane ith, then every nth */
    for (long pl = ith; pl < (long)N * C; pl += nth) {
        const float *xp = (const float *)(X.data + (size_t)n * X.nb[3] + (size_t)c * X.nb[2]);
        float *op = (float *)(O.data + (size_t)n * O.nb[3] + (size_t)c * O.nb[2]);
        const float *wc = (const float *)(Wt.data + (size_t)c * Wt.nb[1]);
        const float bc = bias ? bias[c] : 0.0f;
        for (c += nth; c >= C; c -= C)
            n++;
        if (sw == 1) { /* the image's positions; the pads stay zero */
            for (int y = 0; y < H; y++)
                copy_row(buf + rowoff[y] + pw, xp + (size_t)y * W, W);
        } else if (whole) {
            const int hw = W / 2;
            split2(H * hw, xp, evens, odds);
            for (int y = 0; y < H; y++) {
                float *prow = buf + rowoff[y];
                copy_row(prow + ev_off, evens + (size_t)y * hw, hw);
                copy_row(prow + od_off, odds + (size_t)y * hw, hw);
            }
        } else if (sw == 2) {
            for (int y = 0; y < H; y++) {
                const float *src = xp + (size_t)y * W;
                float *prow = buf + rowoff[y];
                split2(W / 2, src, prow + ev_off, prow + od_off);
                if (W % 2)
                    prow[ev_off + W / 2] = src[W - 1];
            }
        } else {
            for (int y = 0; y < H; y++) {
                float *prow = buf + rowoff[y];
                const float *src = xp + (size_t)y * W;
                for (int x = 0; x < W; x++)
                    prow[(size_t)((x + pw) % sw) * psize + (x + pw) / sw] = src[x];
            }
        }
        if (is3x3)
            k3x3(OH, Wq, buf, wc, bc, epp, tmp);
        else
            flat_fn(nq, nt, buf, off, wc, bc, epp, tmp);
        for (int oy = 0; oy < OH; oy++)
            copy_row(op + (size_t)oy * OW, tmp + (size_t)oy * Wq, OW);
    }
}
