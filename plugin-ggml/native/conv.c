/* 2-D convolution (group 1) straight from NCHW as an implicit GEMM, a ggml custom op.
 *
 *   out[n, oc, p] = act(sum_k W[oc, k] . X_n[k, p] + bias[oc] + rbias[n, oc] + res[n, oc, p]),
 *   k = (c, i, j), p = (y, x)
 *
 * A is the kernel W itself (OC rows of K = C*KH*KW floats, OIHW order, read in place; Python
 * pads the row stride when rows would alias in L1). The column matrix B is never built. Two
 * routes write C rows = output channels, which is NCHW:
 *
 *   direct  (stride 1, output rows at least about one kernel width long): the input comes
 *           padded (sdrt_pad_op, a node before this one), so row k of B for the output pixels
 *           (oy, ox0 .. ox0+NR-1) is the contiguous run xp[c, oy + i dh, ox0 + j dw ...]: the
 *           micro-kernels read it where it lies, through a table of K offsets (ikern). No
 *           packing at all; a slice of NR pixels never crosses an output row, so C is stored
 *           straight (masked at a row's end).
 *   packed  (strides, narrow maps): each thread packs 32-pixel panels of B from the input, one
 *           block of K at a time (a run of output pixels of one tap reads a run of one input
 *           row: a copy at stride 1, a gather otherwise; clipped at the image's edges).
 *
 * and a third, for float32 pointwise convs (params[P_DIRECT] 2), computes out^T = X^T W^T:
 *
 *   cols    pixels as the tile's rows (the input read in place, a pixel's channels np apart), 32 output channels
 *           along the vectors (W^T packed once at load), each tile stored transposed (cols_unit).
 *
 * The epilogue (sdrt_epilogue) adds the bias, a runtime per-channel bias (the UNet's time
 * embedding), a residual (ResNet and MobileNet blocks) and an activation (ReLU, clip, hardswish)
 * as the tile is stored. A unit of work is a group of pixel slices/panels of one batch item
 * with every output channel; the op's threads take units from a shared counter (as the GEMM).
 */
#include "sdrt_ops.h"

#include <stdlib.h>
#include <string.h>

/* bytes of L2 for a block of W's rows (mc x kc) and for a unit's packed panels (group x kc x 32) */
#define CONV_A_BYTES (192 * 1024)
#define CONV_GROUP_BYTES (192 * 1024)

typedef struct {
    int N, C, H, W, OC, KH, KW, OH, OW;
    int sh, sw, dh, dw, ph, pw;
    int K;
    ptrdiff_t ldw; /* floats between rows of W (>= K) */
} conv_shape;

/* what every tile of one batch item adds on the way out (and the scale its input channels get) */
typedef struct {
    const float *rbias; /* per output channel (the bias, plus the runtime one), or NULL */
    const float *res;   /* the batch item's residual, NCHW, or NULL */
    const sdrt_epilogue *ep;
    const float *cscale; /* per input channel, applied as the columns are packed, or NULL */
} conv_out;

/* ---- the packed route ----------------------------------------------------------------- */
/* the pixels of a panel along one output row: output row oy, columns ox0 .. ox0+len-1, at
 * column q of the panel */
typedef struct {
    int oy, ox0, len, q;
} pix_run;

/* a row k of the column matrix: the input plane's offset and the tap's row and column shifts */
typedef struct {
    ptrdiff_t plane;
    int di, dj;
} conv_tap;

/* the runs of the panel of output pixels p0 .. p0+31, each within one half of the panel (at most
 * 34: rows of one pixel, and one more where a row crosses the halves); returns the count, and the
 * panel's valid width in *nv */
static int panel_runs(const conv_shape *s, int p0, pix_run *runs, int *nv) {
    const int np = s->OH * s->OW;
    const int n = np - p0 < SDRT_NR ? np - p0 : SDRT_NR;
    int count = 0, q = 0, y = p0 / s->OW, xo = p0 % s->OW;
    while (q < n) {
        const int end = q < SDRT_HALF && n > SDRT_HALF ? SDRT_HALF : n; /* this half's end */
        const int len = s->OW - xo < end - q ? s->OW - xo : end - q;
        runs[count++] = (pix_run){y, xo, len, q};
        q += len;
        xo += len;
        if (xo == s->OW) {
            xo = 0;
            y++;
        }
    }
    *nv = n;
    return count;
}

/* len floats of an input row from column ix0 on, zeros outside the row's columns [0, W) */
static inline void copy_clipped(float *dst, const float *row, int ix0, int len, int W) {
    if (ix0 >= 0 && ix0 + len <= W) {
        if (len == SDRT_HALF)
            memcpy(dst, row + ix0, SDRT_HALF * sizeof(float)); /* a constant size: inlined moves */
        else
            memcpy(dst, row + ix0, (size_t)len * sizeof(float));
        return;
    }
    const int lo = ix0 < 0 ? (-ix0 < len ? -ix0 : len) : 0; /* first pixel inside the row */
    int hi = W - ix0 < len ? W - ix0 : len;                  /* one past the last */
    hi = hi < lo ? lo : hi;
    for (int t = 0; t < lo; t++)
        dst[t] = 0.0f;
    if (hi > lo)
        memcpy(dst + lo, row + ix0 + lo, (size_t)(hi - lo) * sizeof(float));
    for (int t = hi; t < len; t++)
        dst[t] = 0.0f;
}

/* the pixels u of a run of len, dst[u] = row[ix0 + u sw], that lie inside the row's columns [0, W):
 * u0 <= u < u1 */
static inline void strided_bounds(int ix0, int len, int sw, int W, int *u0, int *u1) {
    if (ix0 >= 0 && ix0 + (len - 1) * sw <= W - 1) { /* all inside (most runs): no division */
        *u0 = 0;
        *u1 = len;
        return;
    }
    int a = ix0 >= 0 ? 0 : (-ix0 + sw - 1) / sw;       /* the first pixel inside */
    int b = ix0 <= W - 1 ? (W - 1 - ix0) / sw + 1 : 0; /* one past the last */
    a = a < len ? a : len;
    b = b < len ? b : len;
    *u0 = a;
    *u1 = b < a ? a : b;
}

/* dst[u] = src[u sw] for u0 <= u < u1, zeros for the other u < len (stride 2, the common one, a loop
 * the compiler vectorises) */
static inline void strided_fill(float *SDRT_RESTRICT dst, const float *SDRT_RESTRICT src, int u0, int u1, int len,
                                int sw) {
    if (sw == 2 && len == SDRT_HALF && u0 <= 0 && u1 >= SDRT_HALF) { /* a whole half: a fixed loop */
        for (int u = 0; u < SDRT_HALF; u++)
            dst[u] = src[2 * u];
        return;
    }
    u0 = u0 < 0 ? 0 : u0 > len ? len : u0;
    u1 = u1 < u0 ? u0 : u1 > len ? len : u1;
    for (int u = 0; u < u0; u++)
        dst[u] = 0.0f;
    if (sw == 2) {
        const int n = u1 - u0;
        float *SDRT_RESTRICT d = dst + u0;
        const float *SDRT_RESTRICT p = src + 2 * u0;
        for (int u = 0; u < n; u++)
            d[u] = p[2 * u];
    } else {
        for (int u = u0; u < u1; u++)
            dst[u] = src[u * sw];
    }
    for (int u = u1; u < len; u++)
        dst[u] = 0.0f;
}

/* dst[u] = row[ix0 + u sw] for u < len, zeros outside the row's columns [0, W): the pixels inside
 * copied without a test each */
static inline void copy_strided(float *dst, const float *row, int ix0, int len, int sw, int W) {
    int u0, u1;
    strided_bounds(ix0, len, sw, W, &u0, &u1);
    strided_fill(dst, row + ix0, u0, u1, len, sw);
}

/* Pack rows k0..k1-1 of the column matrix (taps[0 .. nk)) for output pixels p0 .. p0+31 as one
 * packed panel of nk rows (zero columns past the end). */
static void pack_conv_panel(const conv_shape *s, const float *x, const conv_tap *taps, int p0, int nk,
                            const float *cscale, int k0, float *dst) {
    pix_run runs[SDRT_NR + 2];
    int nv;
    const int nruns = panel_runs(s, p0, runs, &nv);
    const int nv0 = nv < SDRT_HALF ? nv : SDRT_HALF, nv1 = nv - nv0; /* valid columns of each half */
    /* 32 pixels of one output row (most panels; a pointwise conv's, nearly all): each K row is one
     * run of the input row, copied as two halves without the runs' loop (a strided run's bounds,
     * two divisions, found once) */
    const int one_run = nruns == 2 && nv == SDRT_NR && runs[1].oy == runs[0].oy;
    for (int kk = 0; kk < nk; kk++) {
        const conv_tap t = taps[kk];
        float *d0 = dst + sdrt_panel_at(nk, kk, 0), *d1 = dst + sdrt_panel_at(nk, kk, SDRT_HALF);
        if (one_run) {
            const int iy = runs[0].oy * s->sh + t.di, ix0 = runs[0].ox0 * s->sw + t.dj;
            if (iy < 0 || iy >= s->H) {
                memset(d0, 0, SDRT_HALF * sizeof(float));
                memset(d1, 0, SDRT_HALF * sizeof(float));
            } else if (s->sw == 1) {
                const float *row = x + t.plane + (ptrdiff_t)iy * s->W;
                copy_clipped(d0, row, ix0, SDRT_HALF, s->W);
                copy_clipped(d1, row, ix0 + SDRT_HALF, SDRT_HALF, s->W);
            } else {
                const float *src = x + t.plane + (ptrdiff_t)iy * s->W + ix0;
                int u0, u1;
                strided_bounds(ix0, SDRT_NR, s->sw, s->W, &u0, &u1);
                strided_fill(d0, src, u0, u1, SDRT_HALF, s->sw);
                strided_fill(d1, src + SDRT_HALF * s->sw, u0 - SDRT_HALF, u1 - SDRT_HALF, SDRT_HALF, s->sw);
            }
        } else {
            for (int r = 0; r < nruns; r++) {
                const pix_run run = runs[r];
                const int iy = run.oy * s->sh + t.di, ix0 = run.ox0 * s->sw + t.dj;
                float *dr = run.q < SDRT_HALF ? d0 + run.q : d1 + (run.q - SDRT_HALF);
                if (iy < 0 || iy >= s->H) {
                    memset(dr, 0, (size_t)run.len * sizeof(float));
                    continue;
                }
                const float *row = x + t.plane + (ptrdiff_t)iy * s->W;
                if (s->sw == 1) {
                    copy_clipped(dr, row, ix0, run.len, s->W);
                } else {
                    copy_strided(dr, row, ix0, run.len, s->sw, s->W);
                }
            }
        }
        if (nv0 < SDRT_HALF)
            memset(d0 + nv0, 0, (size_t)(SDRT_HALF - nv0) * sizeof(float));
        if (nv1 < SDRT_HALF)
            memset(d1 + nv1, 0, (size_t)(SDRT_HALF - nv1) * sizeof(float));
        if (cscale) { /* the input channel's runtime scale (a squeeze-excitation gate) */
            const float sc = cscale[(k0 + kk) / (s->KH * s->KW)];
            for (int j = 0; j < nv0; j++)
                d0[j] *= sc;
            for (int j = 0; j < nv1; j++)
                d1[j] *= sc;
        }
    }
}

/* rows of W per block (an L2-sized block of mc x kc floats), a multiple of the tile height */
static int w_block_rows(const sdrt_isa_kernels *kk, int kc) {
    int mc = (int)(CONV_A_BYTES / ((size_t)kc * sizeof(float))) / kk->mr_max * kk->mr_max;
    return mc < kk->mr_max ? kk->mr_max : mc;
}

/* The output of one block of W's rows (m0...) over the panels from pan0 on: rows of the output image. The
 * panels were just packed, so they are in L2: no prefetch of B. */
static sdrt_block_out conv_block_out(const conv_out *co, float *out, int np, int m0, int pan0) {
    sdrt_block_out o;
    o.c = out + (ptrdiff_t)m0 * np + pan0 * SDRT_NR;
    o.ldc = np;
    o.trans = 0;
    o.n = np - pan0 * SDRT_NR;
    o.bias = NULL;
    o.rbias = co->rbias ? co->rbias + m0 : NULL;
    o.res = co->res ? co->res + (ptrdiff_t)m0 * np + pan0 * SDRT_NR : NULL;
    o.ldres = np;
    o.ep = co->ep;
    o.prefetch_b = 0;
    return o;
}

/* one unit of the packed route: panels [pan0, pan1) of one batch item, every output channel, all
 * of K. For each block of K the unit's panels are packed once, then every block of output
 * channels runs over them (sdrt_block: each panel slice stays in L1 over the W tiles). */
static int conv_unit(const conv_shape *s, const sdrt_isa_kernels *kk, const float *x, const float *w,
                     const conv_out *co, float *out, int pan0, int pan1) {
    const int np = s->OH * s->OW;
    const int kblocks = (s->K + kk->kc - 1) / kk->kc;
    const int kc_max = (s->K + kblocks - 1) / kblocks;
    const int mc = w_block_rows(kk, kc_max), mblocks = (s->OC + mc - 1) / mc;
    float *buf = sdrt_thread_buffer(2, (size_t)(pan1 - pan0) * kc_max * SDRT_NR * sizeof(float));
    conv_tap *taps = (conv_tap *)sdrt_thread_buffer(3, (size_t)kc_max * sizeof(conv_tap));
    if (!buf || !taps)
        return -1;
    const int khw = s->KH * s->KW;
    for (int kb = 0; kb < kblocks; kb++) {
        const int k0 = (int)((long)kb * s->K / kblocks), k1 = (int)((long)(kb + 1) * s->K / kblocks);
        const ptrdiff_t pstride = (ptrdiff_t)(k1 - k0) * SDRT_NR;
        for (int k = k0, c = k0 / khw, r = k0 % khw; k < k1; k++) {
            taps[k - k0] = (conv_tap){(ptrdiff_t)c * s->H * s->W, (r / s->KW) * s->dh - s->ph, (r % s->KW) * s->dw - s->pw};
            if (++r == khw) {
                r = 0;
                c++;
            }
        }
        for (int q = pan0; q < pan1; q++)
            pack_conv_panel(s, x, taps, q * SDRT_NR, k1 - k0, co->cscale, k0, buf + (ptrdiff_t)(q - pan0) * pstride);
        for (int mb = 0; mb < mblocks; mb++) {
            const int m0 = (int)((long)mb * s->OC / mblocks), m1 = (int)((long)(mb + 1) * s->OC / mblocks);
            const sdrt_block_out o = conv_block_out(co, out, np, m0, pan0);
            sdrt_block(kk, m1 - m0, k1 - k0, w + (ptrdiff_t)m0 * s->ldw + k0, s->ldw, buf, pstride, pan1 - pan0, &o,
                       kb > 0, kb + 1 == kblocks);
        }
    }
    return 0;
}

/* K rows of a column panel packed as float32 at a time before their conversion to bf16 (an even count): 8 KB */
#define CVT_ROWS 64

/* conv_unit with bf16 W rows (w16: ldw uint16 between rows, an even count; a row's K values, then zeros):
 * blocks of K in pairs. With the bf16 kernels, each block's column panels are packed CVT_ROWS rows at a time and
 * converted to bf16 panels (thread buffer 0) and W's rows read in place as pairs (vdpbf16ps or AMX tiles: packing
 * the whole block first, then converting it, wrote and read a float panel of up to 64 KB through L2: 5-15% more
 * time on the VAE decoder's 3x3 convs on AMX); without them, each block of
 * W's rows is widened to float32 (thread buffer 1) for the float32 kernels. */
static int conv_unit_bf16(const conv_shape *s, const sdrt_isa_kernels *kk, const float *x, const uint16_t *w16,
                          const conv_out *co, float *out, int pan0, int pan1) {
    const sdrt_bf16_kernels *bk = sdrt_kernels_bf16();
    const int np = s->OH * s->OW, K2 = (s->K + 1) / 2;
    const int kc2 = bk ? bk->kc2 : kk->kc / 2;
    const int kblocks = (K2 + kc2 - 1) / kc2;
    const int kc2_max = (K2 + kblocks - 1) / kblocks;
    const int mc = w_block_rows(kk, 2 * kc2_max), mblocks = (s->OC + mc - 1) / mc;
    const size_t fpanel = (size_t)2 * kc2_max * SDRT_NR; /* floats of a packed panel of the longest block */
    /* the float panels of a block (without the bf16 kernels), or one panel's CVT_ROWS rows (with them) */
    float *buf = sdrt_thread_buffer(2, (bk ? (size_t)CVT_ROWS * SDRT_NR : (size_t)(pan1 - pan0) * fpanel) * sizeof(float));
    conv_tap *taps = (conv_tap *)sdrt_thread_buffer(3, (size_t)2 * kc2_max * sizeof(conv_tap));
    uint16_t *bbuf = bk ? (uint16_t *)sdrt_thread_buffer(0, (size_t)(pan1 - pan0) * fpanel * sizeof(uint16_t)) : NULL;
    const ptrdiff_t wld = ((2 * kc2_max + 15) & ~15) + 16;
    float *wbuf = bk ? NULL : sdrt_thread_buffer(1, (size_t)mc * wld * sizeof(float));
    if (!buf || !taps || (bk ? !bbuf : !wbuf))
        return -1;
    const int khw = s->KH * s->KW;
    for (int kb = 0; kb < kblocks; kb++) {
        const int p0 = (int)((long)kb * K2 / kblocks), p1 = (int)((long)(kb + 1) * K2 / kblocks);
        const int k0 = 2 * p0, k1 = 2 * p1 < s->K ? 2 * p1 : s->K, nk = k1 - k0;
        const ptrdiff_t pstride = (ptrdiff_t)nk * SDRT_NR, bstride = (ptrdiff_t)(p1 - p0) * 2 * SDRT_BF16_NR;
        for (int k = k0, c = k0 / khw, r = k0 % khw; k < k1; k++) {
            taps[k - k0] = (conv_tap){(ptrdiff_t)c * s->H * s->W, (r / s->KW) * s->dh - s->ph, (r % s->KW) * s->dw - s->pw};
            if (++r == khw) {
                r = 0;
                c++;
            }
        }
        for (int q = pan0; q < pan1; q++) {
            if (!bk) {
                pack_conv_panel(s, x, taps, q * SDRT_NR, nk, co->cscale, k0, buf + (ptrdiff_t)(q - pan0) * pstride);
                continue;
            }
            /* a few K rows at a time through a float panel that stays in L1, converted to the panel's pair rows */
            for (int r0 = 0; r0 < nk; r0 += CVT_ROWS) {
                const int rn = nk - r0 < CVT_ROWS ? nk - r0 : CVT_ROWS;
                pack_conv_panel(s, x, taps + r0, q * SDRT_NR, rn, co->cscale, k0 + r0, buf);
                bk->cvt_panel(rn, buf, bbuf + (ptrdiff_t)(q - pan0) * bstride + (ptrdiff_t)(r0 / 2) * SDRT_BF16_NR,
                              bstride / 2);
            }
        }
        for (int mb = 0; mb < mblocks; mb++) {
            const int m0 = (int)((long)mb * s->OC / mblocks), m1 = (int)((long)(mb + 1) * s->OC / mblocks);
            const sdrt_block_out o = conv_block_out(co, out, np, m0, pan0);
            const uint16_t *wr = w16 + (ptrdiff_t)m0 * s->ldw + k0;
            if (bk) {
                sdrt_block_bf16(bk, m1 - m0, p1 - p0, (const uint32_t *)(const void *)wr, s->ldw / 2, bbuf, bstride,
                                pan1 - pan0, &o, kb > 0, kb + 1 == kblocks);
                continue;
            }
            for (int i = 0; i < m1 - m0; i++)
                for (int k = 0; k < nk; k++)
                    wbuf[i * wld + k] = sdrt_bf16_to_f32(wr[(ptrdiff_t)i * s->ldw + k]);
            sdrt_block(kk, m1 - m0, nk, wbuf, wld, buf, pstride, pan1 - pan0, &o, kb > 0, kb + 1 == kblocks);
        }
    }
    return 0;
}

/* ---- the direct route ----------------------------------------------------------------- */
/* The offsets of B's rows in the padded input (Hp x Wp planes): row k = (c, i, j) at
 * c Hp Wp + i dh Wp + j dw. Kept per thread while the shape stays the same. */
static SDRT_THREAD_LOCAL struct {
    int K, KH, KW, dh, dw, Hp, Wp;
} dir_key;

static const int32_t *direct_offsets(const conv_shape *s, int Hp, int Wp) {
    int32_t *off = (int32_t *)sdrt_thread_buffer(4, (size_t)s->K * sizeof(int32_t));
    if (!off)
        return NULL;
    if (dir_key.K == s->K && dir_key.KH == s->KH && dir_key.KW == s->KW && dir_key.dh == s->dh &&
        dir_key.dw == s->dw && dir_key.Hp == Hp && dir_key.Wp == Wp)
        return off;
    const int khw = s->KH * s->KW;
    for (int k = 0; k < s->K; k++) {
        const int c = k / khw, r = k % khw;
        off[k] = (int32_t)((ptrdiff_t)c * Hp * Wp + (ptrdiff_t)(r / s->KW) * s->dh * Wp + (r % s->KW) * s->dw);
    }
    dir_key.K = s->K;
    dir_key.KH = s->KH;
    dir_key.KW = s->KW;
    dir_key.dh = s->dh;
    dir_key.dw = s->dw;
    dir_key.Hp = Hp;
    dir_key.Wp = Wp;
    return off;
}

/* one unit of the direct route: slices [sl0, sl1) (spr slices of nr pixels per output row) of one
 * batch item, every output channel, all of K; xp is the item's padded input */
static int direct_unit(const conv_shape *s, const sdrt_isa_kernels *kk, const float *xp, int Wp,
                       const int32_t *off, const float *w, const conv_out *co, float *out, int sl0, int sl1, int spr) {
    const int np = s->OH * s->OW, nr = kk->nr, mr = kk->mr_max;
    const int kblocks = (s->K + kk->kc - 1) / kk->kc;
    const int mc = w_block_rows(kk, (s->K + kblocks - 1) / kblocks), mblocks = (s->OC + mc - 1) / mc;
    for (int kb = 0; kb < kblocks; kb++) {
        const int k0 = (int)((long)kb * s->K / kblocks), k1 = (int)((long)(kb + 1) * s->K / kblocks);
        for (int sl = sl0; sl < sl1; sl++) {
            const int oy = sl / spr, ox0 = (sl % spr) * nr;
            const float *b = xp + (ptrdiff_t)oy * Wp + ox0;
            sdrt_tile_out o;
            o.ldc = np;
            o.trans = 0;
            o.n = s->OW - ox0 < nr ? s->OW - ox0 : nr;
            o.bias = NULL;
            o.acc = kb > 0;
            o.last = kb + 1 == kblocks;
            o.ldres = np;
            o.ep = co->ep;
            o.pfb = NULL;
            o.pfb_half = 0;
            o.pfb_rows = 0;
            for (int mb = 0; mb < mblocks; mb++) {
                const int m0 = (int)((long)mb * s->OC / mblocks), m1 = (int)((long)(mb + 1) * s->OC / mblocks);
                const int tiles = (m1 - m0 + mr - 1) / mr;
                sdrt_split ts = sdrt_split_of(m1 - m0, tiles);
                for (int t = 0, r1 = m0; t < tiles; t++) {
                    const int r0 = r1;
                    r1 = m0 + sdrt_split_next(&ts);
                    const ptrdiff_t at = (ptrdiff_t)r0 * np + (ptrdiff_t)oy * s->OW + ox0;
                    o.m = r1 - r0;
                    o.c = out + at;
                    o.rbias = co->rbias ? co->rbias + r0 : NULL;
                    o.res = co->res ? co->res + at : NULL;
                    const float *a = w + (ptrdiff_t)r0 * s->ldw + k0;
                    kk->ikern[o.m](k1 - k0, a, s->ldw, b, off + k0, &o, t + 1 < tiles ? a + (ptrdiff_t)(r1 - r0) * s->ldw : a);
                }
            }
        }
    }
    return 0;
}

/* ---- the cols route: a pointwise conv with output channels along the vectors ---------- */
/* ckern's product for an ISA without one (the library's ISA pinned after the lowering chose the route) */
static void cols_tile_scalar(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, const sdrt_tile_out *o) {
    float t[16 * SDRT_NR];
    for (int i = 0; i < o->m; i++)
        for (int j = 0; j < SDRT_NR; j++) {
            const float *bj = j < SDRT_HALF ? b + j : b + bh + (j - SDRT_HALF);
            float v = 0.0f;
            for (int k = 0; k < K; k++)
                v += a[(ptrdiff_t)k * lda + i] * bj[(ptrdiff_t)k * SDRT_HALF];
            t[i * SDRT_NR + j] = v;
        }
    sdrt_store_tile(t, SDRT_NR, o);
}

/* A float32 1x1 conv as out^T = X^T W^T: tiles of up to MR pixels (A: the input read in place by
 * columns, a pixel's input channels np floats apart) against panels of 32 output channels (B: W^T packed once at
 * load, pack_b's panels), the tile stored transposed (NCHW) through the kernel's epilogue. Nothing is packed per
 * call, and a plane of 49 pixels computes 49 columns, not two 32-pixel panels' 64 (the packed route packs the
 * input's K x np values a call: on 7x7 and 14x14 planes with hundreds of input channels, 1.5-1.9x onnxruntime's
 * time at one thread, docs/ggml.md). One unit: panels [q0, q1) against the pixel tiles [t0, t1) of T, each block of
 * K in turn; the block's B rows stay in L1 over the tiles (with a runtime channel scale, a scaled copy of them). */
static int cols_unit(const conv_shape *s, const sdrt_isa_kernels *kk, const float *x, const float *wp, int T,
                     const conv_out *co, float *out, int q0, int q1, int t0, int t1) {
    const int np = s->OW, K = s->K;
    const int kblocks = (K + kk->kc - 1) / kk->kc;
    const ptrdiff_t pstride = (ptrdiff_t)2 * K * SDRT_HALF; /* floats a panel of W^T */
    float *sb = co->cscale ? sdrt_thread_buffer(2, (size_t)2 * ((K + kblocks - 1) / kblocks) * SDRT_HALF * sizeof(float))
                           : NULL;
    if (co->cscale && !sb)
        return -1;
    sdrt_tile_out o = {.ldc = np, .trans = 1, .ldres = np, .ep = co->ep}; /* no row bias, no B prefetch */
    /* columns a call: a 16-column kernel (AVX2) takes a panel's halves in turn, each half's K rows in L1 over the tiles */
    const int cw = kk->ckern[1] && kk->nr < SDRT_NR ? SDRT_HALF : SDRT_NR;
    for (int kb = 0; kb < kblocks; kb++) {
        const int k0 = (int)((long)kb * K / kblocks), k1 = (int)((long)(kb + 1) * K / kblocks), nk = k1 - k0;
        o.acc = kb > 0;
        o.last = kb + 1 == kblocks;
        for (int q = q0; q < q1; q++) {
            const float *b = wp + q * pstride + (ptrdiff_t)k0 * SDRT_HALF;
            ptrdiff_t bh = (ptrdiff_t)K * SDRT_HALF;
            if (sb) { /* B's rows times the input channel's scale (a squeeze-excitation gate) */
                for (int k = 0; k < nk; k++) {
                    const float sc = co->cscale[k0 + k];
                    for (int j = 0; j < SDRT_HALF; j++) {
                        sb[k * SDRT_HALF + j] = b[k * SDRT_HALF + j] * sc;
                        sb[(nk + k) * SDRT_HALF + j] = b[bh + k * SDRT_HALF + j] * sc;
                    }
                }
                b = sb;
                bh = (ptrdiff_t)nk * SDRT_HALF;
            }
            const int n = s->OC - q * SDRT_NR < SDRT_NR ? s->OC - q * SDRT_NR : SDRT_NR;
            for (int j0 = 0; j0 < n; j0 += cw) {
                const int ch0 = q * SDRT_NR + j0;
                const float *bk = j0 ? b + bh : b;
                o.n = n - j0 < cw ? n - j0 : cw;
                o.bias = co->rbias ? co->rbias + ch0 : NULL;
                for (int t = t0; t < t1; t++) {
                    const int p0 = (int)((long)t * np / T), p1 = (int)((long)(t + 1) * np / T);
                    const ptrdiff_t at = (ptrdiff_t)ch0 * np + p0;
                    o.m = p1 - p0;
                    o.c = out + at;
                    o.res = co->res ? co->res + at : NULL;
                    if (kk->ckern[1])
                        kk->ckern[o.m](nk, x + (ptrdiff_t)k0 * np + p0, np, bk, bh, &o, NULL);
                    else
                        cols_tile_scalar(nk, x + (ptrdiff_t)k0 * np + p0, np, b, bh, &o);
                }
            }
        }
    }
    return 0;
}

/* ---- one pixel: a matrix-vector product ----------------------------------------------- */
/* one unit of a 1x1 conv of a 1x1 map (a squeeze-excitation's): output channels [r0, r1) of one
 * batch item as dot products of W's rows with the item's C inputs, then the epilogue. The panel
 * routes would compute 16 or 32 columns for the one pixel. */
static int vector_unit(const conv_shape *s, const float *xn, const float *w, const conv_out *co, float *on, int r0,
                       int r1) {
    const float *xv = xn;
    if (co->cscale) {
        float *xs = sdrt_thread_buffer(2, (size_t)s->C * sizeof(float));
        if (!xs)
            return -1;
        for (int c = 0; c < s->C; c++)
            xs[c] = xn[c] * co->cscale[c];
        xv = xs;
    }
    sdrt_ops_dot_rows()(r1 - r0, s->K, w + (ptrdiff_t)r0 * s->ldw, s->ldw, xv, on + r0);
    for (int oc = r0; oc < r1; oc++)
        on[oc] = sdrt_act(co->ep, on[oc] + (co->rbias ? co->rbias[oc] : 0.0f) + (co->res ? co->res[oc] : 0.0f));
    return 0;
}

/* params[] of sdrt_conv_op */
enum { P_KH, P_KW, P_SH, P_SW, P_DH, P_DW, P_PH, P_PW, P_DIRECT, P_ACT, P_LO, P_HI, P_BF16, P_COUNT };

/* dst = conv(x, W) with the epilogue, as ggml_custom_4d's callback.
 *   src[0] x:      ne (W, H, C, N), contiguous (NCHW); with params[P_DIRECT] the padded input
 *                  ne (Wp, Hp, C, N) of sdrt_pad_op (the pads already in it)
 *   src[1] W:      ne (ldw, OC), contiguous; the first K = C*KH*KW floats of a row are the kernel
 *                  of one output channel in (c, i, j) order; with params[P_BF16] bf16 bit patterns
 *                  (uint16, ldw even, zeros after K): the packed route, bf16 products (conv_unit_bf16); with
 *                  params[P_BF16] 2 the "pairs" case (amx_conv.c, stride 1): x is sdrt_pair_pad_op's output, W
 *                  ne (KH KW C2 2, 16 ceil(OC / 16)) bf16 rows [tap][C2][2] (zero rows past OC); with
 *                  params[P_DIRECT] 2 (float32, 1x1, stride 1, no pads) the cols route: W^T as pack_b's panels,
 *                  ne (16, K, 2, ceil(OC / 32))
 *   src[2] params: int32 [KH, KW, sh, sw, dh, dw, ph, pw, direct, act, lo, hi(, bf16)] (symmetric pads; direct 1:
 *                  x padded, 2: the cols route;
 *                  lo and hi are the float bits of SDRT_ACT_CLIP's bounds; bf16 optional, 0 if absent)
 *   src[3] state:  int32[4] zeros, the threads' shared work counter
 *   src[4] bias:   OC floats, or NULL
 *   src[5] rbias:  a runtime per-channel bias, ne (OC, N) contiguous, or NULL
 *   src[6] res:    a residual shaped as dst, contiguous, or NULL
 *   src[7] cscale: a runtime scale per input channel, ne (C, N) contiguous, or NULL (the packed route
 *                  multiplies each column as it packs it: a squeeze-excitation gate before the conv)
 *   dst:           ne (OW, OH, OC, N), contiguous (NCHW) */
SDRT_EXPORT void sdrt_conv_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED_SHARED(sdrt_conv_op);
    (void)ith;
    (void)userdata;
    const sdrt_isa_kernels *kk = sdrt_active_kernels();
    const void *tx = sdrt_tensor_src(dst, 0), *tw = sdrt_tensor_src(dst, 1), *tp = sdrt_tensor_src(dst, 2),
               *ts = sdrt_tensor_src(dst, 3), *tb = sdrt_tensor_src(dst, 4), *trb = sdrt_tensor_src(dst, 5),
               *tres = sdrt_tensor_src(dst, 6), *tcs = sdrt_tensor_src(dst, 7);
    if (!kk || !tx || !tw || !tp || !ts)
        return;
    const sdrt_view X = sdrt_tensor_view(tx), Wt = sdrt_tensor_view(tw), O = sdrt_tensor_view(dst);
    const float *cs = tcs ? (const float *)sdrt_tensor_view(tcs).data : NULL;
    const int32_t *pr = (const int32_t *)sdrt_tensor_view(tp).data;
    int32_t *state = (int32_t *)sdrt_tensor_view(ts).data;
    /* an input padded for the direct route (pr[P_DIRECT]) holds its pads: either route reads it
     * with no padding of its own. The direct route needs this ISA's offset kernels, stride 1, and
     * rows wide enough for the last slice of each output row (Python sizes them for the ISA
     * active when it lowered; the packed route serves any other case). */
    const int padded = pr[P_DIRECT] != 0;
    const int bf16 = sdrt_tensor_view(tp).ne[0] > P_BF16 && pr[P_BF16] != 0;
    sdrt_epilogue ep = {pr[P_ACT], 0.0f, 0.0f};
    memcpy(&ep.lo, pr + P_LO, sizeof(float));
    memcpy(&ep.hi, pr + P_HI, sizeof(float));
    if (bf16 && pr[P_BF16] == 2) { /* the input as bf16 channel pairs (sdrt_pair_pad_op), W as [OC][tap][C2][2] */
        if (X.ne[3] != O.ne[3] || Wt.ne[1] < (O.ne[2] + 15) / 16 * 16)
            goto done; /* not the lowering's operands: nothing read past them */
        const sdrt_conv_pairs a = {(const uint16_t *)(const void *)X.data, (ptrdiff_t)(X.nb[3] / 2), (int)X.ne[2],
                                   (int)X.ne[1], (int)(X.ne[0] / 2), (const uint16_t *)(const void *)Wt.data,
                                   (ptrdiff_t)(Wt.nb[1] / 2), (int)O.ne[3], (int)O.ne[2], pr[P_KH], pr[P_KW],
                                   pr[P_DH], pr[P_DW], (int)O.ne[1], (int)O.ne[0], (float *)(void *)O.data,
                                   (ptrdiff_t)(O.nb[3] / sizeof(float)), tres ? sdrt_tensor_view(tres).data : NULL,
                                   (ptrdiff_t)O.nb[3], ep.act ? &ep : NULL};
        sdrt_conv_pairs_run(&a, tb ? (const float *)sdrt_tensor_view(tb).data : NULL,
                            trb ? (const float *)sdrt_tensor_view(trb).data : NULL, state, nth);
        goto done;
    }
    conv_shape s;
    s.C = (int)X.ne[2];
    s.N = (int)X.ne[3];
    s.OW = (int)O.ne[0];
    s.OH = (int)O.ne[1];
    s.OC = (int)O.ne[2];
    s.KH = pr[P_KH];
    s.KW = pr[P_KW];
    s.sh = pr[P_SH];
    s.sw = pr[P_SW];
    s.dh = pr[P_DH];
    s.dw = pr[P_DW];
    s.ph = padded ? 0 : pr[P_PH];
    s.pw = padded ? 0 : pr[P_PW];
    s.W = (int)X.ne[0];
    s.H = (int)X.ne[1];
    s.K = s.C * s.KH * s.KW;
    s.ldw = (ptrdiff_t)(Wt.nb[1] / (bf16 ? sizeof(uint16_t) : sizeof(float))); /* in W's elements */
    if (s.KH == 1 && s.KW == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0 && s.OH == s.H && s.OW == s.W) {
        /* a pointwise conv: the whole plane is one row, so that panels and slices run across the
         * image's rows (a 32-pixel panel of a 14-wide map was three copies a K row) */
        s.W *= s.H;
        s.OW = s.W;
        s.H = s.OH = 1;
    }
    const float *bias = tb ? (const float *)sdrt_tensor_view(tb).data : NULL;
    const float *rb = trb ? (const float *)sdrt_tensor_view(trb).data : NULL;
    const char *res = tres ? sdrt_tensor_view(tres).data : NULL;
    const int np = s.OH * s.OW;
    /* the cols route (params[P_DIRECT] 2): a pointwise conv, W as pack_b's panels of W^T, ne (16, K, 2, panels) */
    const int cols = !bf16 && pr[P_DIRECT] == 2;
    if (cols && (s.H != 1 || s.KH != 1 || s.KW != 1 || s.sw != 1 || s.OW != s.W || Wt.ne[0] != SDRT_HALF ||
                 Wt.ne[1] != s.K || Wt.ne[2] != 2 || Wt.ne[3] * SDRT_NR < s.OC))
        goto done; /* not the lowering's operands: nothing read past them */
    if (np <= 0 || s.OC <= 0 || s.K <= 0 || (!cols && (int)Wt.ne[1] != s.OC))
        goto done;
    const int nr = kk->nr, spr = (s.OW + nr - 1) / nr;
    const int direct = !cols && !bf16 && padded && !cs && kk->ikern[1] != NULL && s.sh == 1 && s.sw == 1 &&
                       s.W >= spr * nr + (s.KW - 1) * s.dw && s.H >= s.OH + (s.KH - 1) * s.dh;
    /* one pixel in, one out, a 1x1 kernel: dot products, in blocks of output channels */
    const int vector = !cols && !bf16 && s.KH == 1 && s.KW == 1 && s.H == 1 && s.W == 1 && np == 1;
    /* the work: groups of pixel slices (direct) or panels (packed) of each batch item */
    const int items = vector ? s.OC : direct ? s.OH * spr : (np + SDRT_NR - 1) / SDRT_NR;
    int group;
    if (vector) {
        group = (s.OC / (4 * (nth > 0 ? nth : 1)) + 3) / 4 * 4;
        group = group < 16 ? 16 : group;
    } else if (direct) {
        group = items / (4 * (nth > 0 ? nth : 1));
        group = group < 1 ? 1 : group > 16 ? 16 : group;
    } else {
        const int kblocks = (s.K + kk->kc - 1) / kk->kc;
        group = (int)(CONV_GROUP_BYTES / ((size_t)((s.K + kblocks - 1) / kblocks) * SDRT_NR * sizeof(float)));
        const int most = items / (2 * (nth > 0 ? nth : 1)); /* at least two units a thread */
        group = group > most ? most : group;
        group = group < 1 ? 1 : group > items ? items : group;
    }
    int groups = (items + group - 1) / group;
    /* cols: units of panels x pixel tiles; tiles of the plane (up to MR pixels each) in groups whose K block of
     * input stays in L2, then the panels split until the threads have about four units each */
    const int tiles = cols ? (np + kk->mr_max - 1) / kk->mr_max : 0, panels = cols ? (s.OC + SDRT_NR - 1) / SDRT_NR : 0;
    int tgroups = 1, pgroups = 1;
    if (cols) {
        const int kblocks = (s.K + kk->kc - 1) / kk->kc;
        const long tile_bytes = (long)((s.K + kblocks - 1) / kblocks) * kk->mr_max * (long)sizeof(float);
        tgroups = (int)(((long)tiles * tile_bytes + CONV_GROUP_BYTES - 1) / CONV_GROUP_BYTES);
        tgroups = tgroups < 1 ? 1 : tgroups > tiles ? tiles : tgroups;
        const int want = 4 * (nth > 0 ? nth : 1);
        pgroups = (want + tgroups - 1) / tgroups;
        pgroups = pgroups > panels ? panels : pgroups < 1 ? 1 : pgroups;
        groups = tgroups * pgroups;
    }
    const long units = (long)groups * s.N;
    const int32_t *off = direct ? direct_offsets(&s, s.H, s.W) : NULL;
    if (direct && !off)
        goto done;
    int n_set = -1;
    conv_out co = {NULL, NULL, ep.act ? &ep : NULL, NULL};
    for (;;) {
        const long u = sdrt_work_take(state);
        if (u >= units)
            break;
        const int n = (int)(u / groups), g = (int)(u % groups);
        if (n != n_set) { /* this item's row biases: the constant bias plus the runtime one */
            co.rbias = rb ? sdrt_item_row_bias(5, rb, bias, n, s.OC) : bias;
            if (rb && !co.rbias)
                break;
            co.res = res ? (const float *)(res + n * O.nb[3]) : NULL;
            co.cscale = cs ? cs + (ptrdiff_t)n * s.C : NULL;
            n_set = n;
        }
        const int i0 = g * group, i1 = i0 + group < items ? i0 + group : items;
        const float *xn = (const float *)(X.data + n * X.nb[3]);
        float *on = (float *)(O.data + n * O.nb[3]);
        if (cols) {
            const int pg = g / tgroups, tg = g % tgroups;
            if (cols_unit(&s, kk, xn, (const float *)Wt.data, tiles, &co, on, (int)((long)pg * panels / pgroups),
                          (int)((long)(pg + 1) * panels / pgroups), (int)((long)tg * tiles / tgroups),
                          (int)((long)(tg + 1) * tiles / tgroups)))
                break;
            continue;
        }
        const int rc = vector ? vector_unit(&s, xn, (const float *)Wt.data, &co, on, i0, i1)
                       : direct ? direct_unit(&s, kk, xn, s.W, off, (const float *)Wt.data, &co, on, i0, i1, spr)
                       : bf16 ? conv_unit_bf16(&s, kk, xn, (const uint16_t *)(const void *)Wt.data, &co, on, i0, i1)
                              : conv_unit(&s, kk, xn, (const float *)Wt.data, &co, on, i0, i1);
        if (rc)
            break;
    }
done:
    sdrt_work_done(state, nth);
}

/* dst = src zero-padded: the padded input of a direct conv, as ggml_custom_4d's callback.
 *   src[0] x:      ne (W, H, C, N), contiguous
 *   src[1] params: int32 [top, left]
 *   dst:           ne (Wp, Hp, C, N) with Wp >= W + left, Hp >= H + top: x at (top, left), zeros
 *                  around it
 * The threads take planes in turn. */
int sdrt_pad_job_of(void *dst, int per, sdrt_pad_job *j) {
    const void *tx = sdrt_tensor_src(dst, 0), *tp = sdrt_tensor_src(dst, 1);
    if (!tx || !tp)
        return -1;
    j->X = sdrt_tensor_view(tx);
    j->D = sdrt_tensor_view(dst);
    const int32_t *pr = (const int32_t *)sdrt_tensor_view(tp).data;
    j->top = pr[0];
    j->left = pr[1];
    j->W = (int)j->X.ne[0];
    j->H = (int)j->X.ne[1];
    j->Wp = (int)j->D.ne[0] / per;
    j->Hp = (int)j->D.ne[1];
    j->planes = (long)j->D.ne[2] * j->D.ne[3];
    return j->top < 0 || j->left < 0 || j->W + j->left > j->Wp || j->H + j->top > j->Hp ? -1 : 0;
}

SDRT_EXPORT void sdrt_pad_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_pad_op);
    (void)userdata;
    sdrt_pad_job j;
    if (sdrt_pad_job_of(dst, 1, &j) || j.X.ne[2] * j.X.ne[3] != j.planes)
        return;
    const sdrt_view X = j.X, D = j.D;
    const int top = j.top, left = j.left, W = j.W, H = j.H, Wp = j.Wp, Hp = j.Hp;
    const long planes = j.planes;
    for (long p = ith; p < planes; p += nth) {
        const float *src = (const float *)(X.data + (p % X.ne[2]) * X.nb[2] + (p / X.ne[2]) * X.nb[3]);
        float *d = (float *)(D.data + (p % D.ne[2]) * D.nb[2] + (p / D.ne[2]) * D.nb[3]);
        memset(d, 0, (size_t)top * Wp * sizeof(float));
        for (int y = 0; y < H; y++) {
            float *row = d + (ptrdiff_t)(y + top) * Wp;
            memset(row, 0, (size_t)left * sizeof(float));
            memcpy(row + left, src + (ptrdiff_t)y * W, (size_t)W * sizeof(float));
            memset(row + left + W, 0, (size_t)(Wp - left - W) * sizeof(float));
        }
        memset(d + (ptrdiff_t)(top + H) * Wp, 0, (size_t)(Hp - top - H) * Wp * sizeof(float));
    }
}
