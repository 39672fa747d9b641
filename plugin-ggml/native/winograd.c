/* 3x3 stride-1 convolution (group 1) by Winograd's F(2x2, 3x3), a ggml custom op.
 *
 * Each 2x2 block of outputs (a tile) is computed from the 4x4 input patch around it with 16
 * multiplications per (output channel, input channel) instead of 36:
 *
 *   V = B^T d B    (per input channel and tile: the input transform, simd_wino.h)
 *   M[k] = U[k] V[k] for k < 16, U = G g G^T the transformed kernels (Python makes them once)
 *   Y = A^T M A   (per output channel and tile: the output transform, then the epilogue)
 *
 * so the 36 products of a direct 3x3 conv become 16 GEMMs of OC x C by C x tiles: 2.25 times
 * fewer multiply-adds. The 16 GEMMs run on the packed GEMM's micro-kernels (sdrt_block): the input
 * transform writes V straight into packed panels of 32 tiles, and the products go to a buffer that
 * the output transform reads. The transforms add and subtract only (F(2x2, 3x3)'s points 0, 1, -1),
 * so the results stay within a few float32 roundings of a direct conv's.
 *
 * A unit of work is a group of tiles (whole panels of 32) of one batch item, every channel: its
 * V and M fit the L2/L3 budget below, and the U matrices stream through once per unit. A small map
 * has fewer such groups than the threads need (an 8x8 map is 16 tiles, one group): then each group
 * is split further by blocks of output channels, each unit computing the group's V again (a few
 * percent of its work) and its own rows of M. The op's threads take units from a shared counter.
 * The input comes zero-padded (sdrt_pad_op or a group norm that writes it so), with room for the
 * last tile row and column.
 */
#include "sdrt_ops.h"

#include <string.h>

/* bytes of a unit's V and M together (per thread): L2/L3 */
#define WINO_UNIT_BYTES (2 * 1024 * 1024)

typedef struct {
    int C, OC, OH, OW, TH, TW, Wp, Hp, top, left;
    ptrdiff_t ldu; /* floats between rows of a U matrix (>= C) */
} wino_shape;

/* one unit: tiles [t0, t1) of the batch item's padded input xp, output channels [oc0, oc1), into
 * out (NCHW) */
static int wino_unit(const wino_shape *s, const sdrt_isa_kernels *kk, const float *xp, const float *u,
                     const float *rbias, const float *res, const sdrt_epilogue *ep, float *out, int t0, int t1,
                     int oc0, int oc1) {
    const int nt = t1 - t0, P = (nt + SDRT_NR - 1) / SDRT_NR, G = P * SDRT_NR, noc = oc1 - oc0;
    const ptrdiff_t ldv = (ptrdiff_t)P * s->C * SDRT_NR; /* floats between V[k] and V[k+1] */
    float *v = sdrt_thread_buffer(2, (size_t)16 * ldv * sizeof(float));
    float *m = sdrt_thread_buffer(6, ((size_t)16 * noc * G + 64) * sizeof(float)); /* + the last vector's reach */
    float *split = sdrt_thread_buffer(7, (size_t)8 * (s->TW + 32) * sizeof(float));
    if (!v || !m || !split)
        return -1;
    const sdrt_wino_in_fn wino_in = sdrt_ops_wino_in();
    const sdrt_wino_out_fn wino_out = sdrt_ops_wino_out();
    const sdrt_split2_fn split2 = sdrt_ops_split2();
    const int ew = s->TW + 32; /* floats of one split row buffer */
    /* 1. V into packed panels (C rows each): V[k] of tile j of channel c at
     * v + k ldv + (j / 32) C 32 + sdrt_panel_at(C, c, j % 32). Runs of tiles along one tile row that
     * stay inside one panel, split once more where they cross its halves. */
    for (int c = 0; c < s->C; c++) {
        const float *plane = xp + (size_t)c * s->Hp * s->Wp;
        for (int t = t0; t < t1;) {
            const int ty = t / s->TW, tx = t % s->TW, j = t - t0;
            int n = s->TW - tx;
            n = n < t1 - t ? n : t1 - t;
            n = n < SDRT_NR - j % SDRT_NR ? n : SDRT_NR - j % SDRT_NR;
            const float *e[4], *o[4];
            for (int r = 0; r < 4; r++) {
                float *er = split + (size_t)(2 * r) * ew, *orow = er + ew;
                split2(n + 1, plane + (size_t)(2 * ty + r) * s->Wp + 2 * tx, er, orow);
                e[r] = er;
                o[r] = orow;
            }
            float *dst = v + (size_t)(j / SDRT_NR) * s->C * SDRT_NR;
            for (int i = 0; i < n;) { /* the run's part in each half */
                const int jj = (j + i) % SDRT_NR, room = SDRT_HALF - jj % SDRT_HALF; /* left in this half */
                const int part = n - i < room ? n - i : room;
                const float *ei[4] = {e[0] + i, e[1] + i, e[2] + i, e[3] + i};
                const float *oi[4] = {o[0] + i, o[1] + i, o[2] + i, o[3] + i};
                wino_in(part, ei, oi, dst + sdrt_panel_at(s->C, c, jj), ldv);
                i += part;
            }
            t += n;
        }
    }
    /* 2. the 16 products M[k] (noc x G) = U[k] (rows oc0 .. oc1 - 1, C) V[k] (C x G), in blocks of C */
    const int kblocks = (s->C + kk->kc - 1) / kk->kc;
    for (int k = 0; k < 16; k++) {
        for (int kb = 0; kb < kblocks; kb++) {
            const int c0 = (int)((long)kb * s->C / kblocks), c1 = (int)((long)(kb + 1) * s->C / kblocks);
            sdrt_block_out o;
            memset(&o, 0, sizeof o);
            o.c = m + (size_t)k * noc * G;
            o.ldc = G;
            o.n = nt;
            sdrt_block(kk, noc, c1 - c0, u + ((size_t)k * s->OC + oc0) * s->ldu + c0, s->ldu,
                       v + (size_t)k * ldv + (size_t)c0 * SDRT_HALF, (ptrdiff_t)s->C * SDRT_NR, P, &o, kb > 0,
                       kb + 1 == kblocks);
        }
    }
    /* 3. Y = A^T M A per output channel and tile row, with the epilogue, into NCHW */
    const ptrdiff_t ldm = (ptrdiff_t)noc * G;
    const size_t np = (size_t)s->OH * s->OW;
    for (int oc = oc0; oc < oc1; oc++) {
        const float b = rbias ? rbias[oc] : 0.0f;
        for (int t = t0; t < t1;) {
            const int ty = t / s->TW, tx = t % s->TW;
            const int n = s->TW - tx < t1 - t ? s->TW - tx : t1 - t;
            const int oy = 2 * ty, ox = 2 * tx;
            const int cols = 2 * n < s->OW - ox ? 2 * n : s->OW - ox;
            float *row0 = out + (size_t)oc * np + (size_t)oy * s->OW + ox;
            float *row1 = oy + 1 < s->OH ? row0 + s->OW : NULL;
            const float *r0 = res ? res + (size_t)oc * np + (size_t)oy * s->OW + ox : NULL;
            const float *r1 = res && row1 ? r0 + s->OW : NULL;
            wino_out(n, cols, m + (size_t)(oc - oc0) * G + (t - t0), ldm, b, r0, r1, ep, row0, row1);
            t += n;
        }
    }
    return 0;
}

/* params[] of sdrt_winograd_op */
enum { WG_TOP, WG_LEFT, WG_ACT, WG_LO, WG_HI, WG_COUNT };

/* dst = conv3x3(x) by Winograd F(2x2, 3x3) with the epilogue, as ggml_custom_4d's callback.
 *   src[0] xp:     the zero-padded input ne (Wp, Hp, C, N): the image at (top, left), and
 *                  Hp >= 2 ceil(OH/2) + 2, Wp >= 2 ceil(OW/2) + 2 (zeros past the image)
 *   src[1] U:      ne (ldu, OC, 16): U[k] = (G g G^T)[k / 4][k % 4] per (oc, c), rows ldu apart
 *   src[2] params: int32 [top, left, act, lo, hi] (lo, hi: float bits)
 *   src[3] state:  int32[4] zeros, the threads' shared work counter
 *   src[4] bias:   OC floats, or NULL
 *   src[5] rbias:  a runtime per-channel bias ne (OC, N), or NULL
 *   src[6] res:    a residual shaped as dst, contiguous, or NULL
 *   dst:           ne (OW, OH, OC, N), contiguous (NCHW) */
SDRT_EXPORT void sdrt_winograd_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED_SHARED(sdrt_winograd_op);
    (void)ith;
    (void)userdata;
    const sdrt_isa_kernels *kk = sdrt_active_kernels();
    const void *tx = sdrt_tensor_src(dst, 0), *tu = sdrt_tensor_src(dst, 1), *tp = sdrt_tensor_src(dst, 2),
               *ts = sdrt_tensor_src(dst, 3), *tb = sdrt_tensor_src(dst, 4), *trb = sdrt_tensor_src(dst, 5),
               *tres = sdrt_tensor_src(dst, 6);
    if (!kk || !tx || !tu || !tp || !ts)
        return;
    const sdrt_view X = sdrt_tensor_view(tx), U = sdrt_tensor_view(tu), O = sdrt_tensor_view(dst);
    const int32_t *pr = (const int32_t *)sdrt_tensor_view(tp).data;
    int32_t *state = (int32_t *)sdrt_tensor_view(ts).data;
    wino_shape s;
    s.Wp = (int)X.ne[0];
    s.Hp = (int)X.ne[1];
    s.C = (int)X.ne[2];
    s.OW = (int)O.ne[0];
    s.OH = (int)O.ne[1];
    s.OC = (int)O.ne[2];
    s.TH = (s.OH + 1) / 2;
    s.TW = (s.OW + 1) / 2;
    s.top = pr[WG_TOP];
    s.left = pr[WG_LEFT];
    s.ldu = (ptrdiff_t)(U.nb[1] / sizeof(float));
    const int N = (int)X.ne[3];
    sdrt_epilogue ep = {pr[WG_ACT], 0.0f, 0.0f};
    memcpy(&ep.lo, pr + WG_LO, sizeof(float));
    memcpy(&ep.hi, pr + WG_HI, sizeof(float));
    const float *bias = tb ? (const float *)sdrt_tensor_view(tb).data : NULL;
    const float *rb = trb ? (const float *)sdrt_tensor_view(trb).data : NULL;
    const sdrt_view R = tres ? sdrt_tensor_view(tres) : O;
    const char *res = tres ? R.data : NULL;
    if (s.OC <= 0 || s.C <= 0 || (int)U.ne[1] != s.OC || U.ne[2] != 16 || U.ne[0] < s.C || s.Hp < 2 * s.TH + 2 ||
        s.Wp < 2 * s.TW + 2 || (int)O.ne[3] != N)
        goto done;
    {
        /* tiles per unit: whole panels, V and M within the budget, two units a thread at least */
        const int tiles = s.TH * s.TW;
        int panels = (int)(WINO_UNIT_BYTES / ((size_t)16 * (s.C + s.OC) * SDRT_NR * sizeof(float)));
        const int most = (tiles + SDRT_NR - 1) / SDRT_NR / (2 * (nth > 0 ? nth : 1));
        panels = panels > most ? most : panels;
        panels = panels < 1 ? 1 : panels > 8 ? 8 : panels;
        const int G = panels * SDRT_NR, groups = (tiles + G - 1) / G;
        /* blocks of output channels where the tile groups are too few for two units a thread (a
         * whole 8x8 map ran on one thread, 1.2-2.4 ms, the other waiting at ggml's barrier) */
        const long tg = (long)groups * N;
        int ocb = nth > 1 && tg < 2L * nth ? (int)((2L * nth + tg - 1) / tg) : 1;
        const int mr = kk->mr_max, rows = (s.OC + mr - 1) / mr; /* blocks of whole MR tiles */
        ocb = ocb > rows ? rows : ocb;
        const long units = tg * ocb;
        int n_set = -1;
        const float *rbias = bias;
        for (;;) {
            const long uidx = sdrt_work_take(state);
            if (uidx >= units)
                break;
            const int b = (int)(uidx % ocb), n = (int)(uidx / ocb / groups), g = (int)(uidx / ocb % groups);
            const int oc0 = (int)((long)b * rows / ocb) * mr, oc1b = (int)((long)(b + 1) * rows / ocb) * mr;
            const int oc1 = oc1b < s.OC ? oc1b : s.OC;
            if (n != n_set && rb) { /* this item's row biases: the constant bias plus the runtime one */
                rbias = sdrt_item_row_bias(3, rb, bias, n, s.OC);
                if (!rbias)
                    break;
                n_set = n;
            }
            const int t0 = g * G, t1 = t0 + G < tiles ? t0 + G : tiles;
            if (wino_unit(&s, kk, (const float *)(X.data + (size_t)n * X.nb[3]), (const float *)U.data, rbias,
                          res ? (const float *)(res + (size_t)n * R.nb[3]) : NULL, ep.act ? &ep : NULL,
                          (float *)(O.data + (size_t)n * O.nb[3]), t0, t1, oc0, oc1))
                break;
        }
    }
done:
    sdrt_work_done(state, nth);
}
