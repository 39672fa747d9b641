/* 2-D convolution (group 1) straight from NCHW as an implicit GEMM, a ggml custom op.
 *
 *   out[n, oc, p] = sum_k W[oc, k] . X_n[k, p] (+ bias[oc]),   k = (c, i, j), p = (y, x)
 *
 * A is the kernel W itself (OC rows of K = C*KH*KW floats, OIHW order, read in place; Python
 * pads the row stride when rows would alias in L1). B, the column matrix, is never built:
 * each thread packs 32-pixel panels of it straight from the NCHW input (a run of 32 output
 * pixels of one tap reads a run of input pixels: contiguous at stride 1), one block of K
 * at a time, and the GEMM micro-kernels of gemm_kernels.c write C rows = output channels,
 * which is NCHW. No channels-last copy, no stacked input, no scratch tensor.
 *
 * A unit of work is one group of pixel panels with every output channel, so a group is
 * packed once; the op's threads take units from a shared counter (as sdrt_gemm_op).
 */
#include "sdrt_native.h"

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

/* Pack rows k0..k1-1 of the column matrix for output pixels p0 .. p0+31 (zeros past the end and
 * in the padding) as one panel [k][32]. The panel's pixels are cut into runs along output rows:
 * at stride 1, a run of one tap reads a contiguous run of one input row (a copy, clipped at the
 * row's ends); other strides gather. */
static void pack_conv_panel(const conv_shape *s, const float *x, int p0, int k0, int k1, float *dst) {
    const int np = s->OH * s->OW;
    const int nv = np - p0 < SDRT_NR ? np - p0 : SDRT_NR;
    for (int k = k0; k < k1; k++) {
        const int c = k / (s->KH * s->KW), r = k % (s->KH * s->KW), i = r / s->KW, j = r % s->KW;
        float *d = dst + (ptrdiff_t)(k - k0) * SDRT_NR;
        const float *plane = x + (ptrdiff_t)c * s->H * s->W;
        int q = 0, y = p0 / s->OW, xo = p0 % s->OW;
        while (q < nv) {
            const int run = s->OW - xo < nv - q ? s->OW - xo : nv - q;
            const int iy = y * s->sh + i * s->dh - s->ph, ix0 = xo * s->sw + j * s->dw - s->pw;
            float *dr = d + q;
            if (iy < 0 || iy >= s->H) {
                memset(dr, 0, (size_t)run * sizeof(float));
            } else if (s->sw == 1) {
                const float *row = plane + (ptrdiff_t)iy * s->W;
                const int lo = ix0 < 0 ? (-ix0 < run ? -ix0 : run) : 0; /* first pixel inside the row */
                int hi = s->W - ix0 < run ? s->W - ix0 : run;           /* one past the last */
                hi = hi < lo ? lo : hi;
                if (lo > 0)
                    memset(dr, 0, (size_t)lo * sizeof(float));
                if (hi > lo)
                    memcpy(dr + lo, row + ix0 + lo, (size_t)(hi - lo) * sizeof(float));
                if (hi < run)
                    memset(dr + hi, 0, (size_t)(run - hi) * sizeof(float));
            } else {
                const float *row = plane + (ptrdiff_t)iy * s->W;
                for (int t = 0; t < run; t++) {
                    const int ix = ix0 + t * s->sw;
                    dr[t] = ix >= 0 && ix < s->W ? row[ix] : 0.0f;
                }
            }
            q += run;
            xo = 0;
            y++;
        }
        if (nv < SDRT_NR)
            memset(d + nv, 0, (size_t)(SDRT_NR - nv) * sizeof(float));
    }
}

/* one unit: panels [pan0, pan1) of batch item n, every output channel, all of K. For each block
 * of K the unit's panels are packed once, then every block of output channels (an L2-sized block
 * of W's rows) runs over them (sdrt_block: each panel slice stays in L1 over the W tiles). */
static int conv_unit(const conv_shape *s, const sdrt_isa_kernels *kk, const float *x, const float *w,
                     const float *bias, float *out, int pan0, int pan1) {
    const int np = s->OH * s->OW;
    const int kblocks = (s->K + kk->kc - 1) / kk->kc;
    const int kc_max = (s->K + kblocks - 1) / kblocks;
    int mc = (int)(CONV_A_BYTES / ((size_t)kc_max * sizeof(float))) / kk->mr_max * kk->mr_max;
    mc = mc < kk->mr_max ? kk->mr_max : mc;
    const int mblocks = (s->OC + mc - 1) / mc;
    float *buf = sdrt_thread_buffer(2, (size_t)(pan1 - pan0) * kc_max * SDRT_NR * sizeof(float));
    if (!buf)
        return -1;
    for (int kb = 0; kb < kblocks; kb++) {
        const int k0 = (int)((long)kb * s->K / kblocks), k1 = (int)((long)(kb + 1) * s->K / kblocks);
        const ptrdiff_t pstride = (ptrdiff_t)(k1 - k0) * SDRT_NR;
        for (int q = pan0; q < pan1; q++)
            pack_conv_panel(s, x, q * SDRT_NR, k0, k1, buf + (ptrdiff_t)(q - pan0) * pstride);
        for (int mb = 0; mb < mblocks; mb++) {
            const int m0 = (int)((long)mb * s->OC / mblocks), m1 = (int)((long)(mb + 1) * s->OC / mblocks);
            sdrt_block_out o;
            o.c = out + (ptrdiff_t)m0 * np + pan0 * SDRT_NR;
            o.ldc = np;
            o.trans = 0;
            o.n = np - pan0 * SDRT_NR;
            o.bias = NULL;
            o.rbias = bias ? bias + m0 : NULL;
            sdrt_block(kk, m1 - m0, k1 - k0, w + (ptrdiff_t)m0 * s->ldw + k0, s->ldw, buf, pstride, pan1 - pan0, &o,
                       kb > 0);
        }
    }
    return 0;
}

#if defined(_MSC_VER)
#include <intrin.h>
#define CV_ATOMIC_ADD(p, v) _InterlockedExchangeAdd((volatile long *)(p), (long)(v))
#define CV_ATOMIC_STORE(p, v) _InterlockedExchange((volatile long *)(p), (long)(v))
#else
#define CV_ATOMIC_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_ACQ_REL)
#define CV_ATOMIC_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#endif

/* dst = conv(x, W) [+ bias] as ggml_custom_4d's callback.
 *   src[0] x:      ne (W, H, C, N), contiguous (NCHW)
 *   src[1] W:      ne (ldw, OC), contiguous; the first K = C*KH*KW floats of a row are the kernel
 *                  of one output channel in (c, i, j) order
 *   src[2] params: int32 [KH, KW, sh, sw, dh, dw, ph, pw] (symmetric pads)
 *   src[3] state:  int32[4] zeros, the threads' shared work counter
 *   src[4] bias:   OC floats (optional)
 *   dst:           ne (OW, OH, OC, N), contiguous (NCHW) */
SDRT_EXPORT void sdrt_conv_op(void *dst, int ith, int nth, void *userdata) {
    (void)ith;
    (void)userdata;
    const sdrt_isa_kernels *kk = sdrt_active_kernels();
    const void *tx = sdrt_tensor_src(dst, 0), *tw = sdrt_tensor_src(dst, 1), *tp = sdrt_tensor_src(dst, 2),
               *ts = sdrt_tensor_src(dst, 3), *tb = sdrt_tensor_src(dst, 4);
    if (!kk || !tx || !tw || !tp || !ts)
        return;
    const sdrt_view X = sdrt_tensor_view(tx), Wt = sdrt_tensor_view(tw), O = sdrt_tensor_view(dst);
    const int32_t *pr = (const int32_t *)sdrt_tensor_view(tp).data;
    int32_t *state = (int32_t *)sdrt_tensor_view(ts).data;
    conv_shape s;
    s.W = (int)X.ne[0];
    s.H = (int)X.ne[1];
    s.C = (int)X.ne[2];
    s.N = (int)X.ne[3];
    s.OW = (int)O.ne[0];
    s.OH = (int)O.ne[1];
    s.OC = (int)O.ne[2];
    s.KH = pr[0];
    s.KW = pr[1];
    s.sh = pr[2];
    s.sw = pr[3];
    s.dh = pr[4];
    s.dw = pr[5];
    s.ph = pr[6];
    s.pw = pr[7];
    s.K = s.C * s.KH * s.KW;
    s.ldw = (ptrdiff_t)(Wt.nb[1] / sizeof(float));
    const float *bias = tb ? (const float *)sdrt_tensor_view(tb).data : NULL;
    const int np = s.OH * s.OW, panels = (np + SDRT_NR - 1) / SDRT_NR;
    if (np <= 0 || s.OC <= 0 || s.K <= 0 || (int)Wt.ne[1] != s.OC)
        goto done;
    const int kblocks = (s.K + kk->kc - 1) / kk->kc;
    const size_t slice = (size_t)((s.K + kblocks - 1) / kblocks) * SDRT_NR * sizeof(float);
    int group = (int)(CONV_GROUP_BYTES / slice);
    group = group < 1 ? 1 : group > panels ? panels : group;
    const int groups = (panels + group - 1) / group;
    const long units = (long)groups * s.N;
    for (;;) {
        const long u = CV_ATOMIC_ADD(&state[0], 1);
        if (u >= units)
            break;
        const int n = (int)(u / groups), g = (int)(u % groups);
        const int pan0 = g * group, pan1 = pan0 + group < panels ? pan0 + group : panels;
        if (conv_unit(&s, kk, (const float *)(X.data + n * X.nb[3]), (const float *)Wt.data, bias,
                      (float *)(O.data + n * O.nb[3]), pan0, pan1))
            break;
    }
done:
    if (CV_ATOMIC_ADD(&state[1], 1) == nth - 1) {
        CV_ATOMIC_STORE(&state[0], 0);
        CV_ATOMIC_STORE(&state[1], 0);
    }
}
