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

#define CONV_KC 384
#define CONV_GROUP_BYTES (256 * 1024)

typedef struct {
    int N, C, H, W, OC, KH, KW, OH, OW;
    int sh, sw, dh, dw, ph, pw;
    int K;
    ptrdiff_t ldw; /* floats between rows of W (>= K) */
} conv_shape;

/* per-thread buffers: 0 the packed panels, 1 the row offsets of a panel */
static SDRT_THREAD_LOCAL char *cv_raw;
static SDRT_THREAD_LOCAL size_t cv_cap;

static float *conv_buffer(size_t bytes) {
    if (bytes > cv_cap) {
        free(cv_raw);
        cv_raw = (char *)malloc(bytes + 64);
        cv_cap = cv_raw ? bytes : 0;
        if (!cv_raw)
            return NULL;
    }
    return (float *)(((uintptr_t)cv_raw + 63) & ~(uintptr_t)63);
}

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

/* one unit: panels [pan0, pan1) of batch item n, every output channel, all of K */
static int conv_unit(const conv_shape *s, const sdrt_isa_kernels *kk, const float *x, const float *w,
                     const float *bias, float *out, int pan0, int pan1) {
    const int np = s->OH * s->OW, tiles = (s->OC + kk->mr_max - 1) / kk->mr_max;
    const int kblocks = (s->K + CONV_KC - 1) / CONV_KC;
    const int kc_max = (s->K + kblocks - 1) / kblocks;
    float *buf = conv_buffer((size_t)(pan1 - pan0) * kc_max * SDRT_NR * sizeof(float));
    if (!buf)
        return -1;
    if (bias) /* C starts as the bias, and every block of K adds to it */
        for (int oc = 0; oc < s->OC; oc++) {
            float *row = out + (ptrdiff_t)oc * np;
            const int a = pan0 * SDRT_NR, b = pan1 * SDRT_NR < np ? pan1 * SDRT_NR : np;
            for (int p = a; p < b; p++)
                row[p] = bias[oc];
        }
    for (int kb = 0; kb < kblocks; kb++) {
        const int k0 = (int)((long)kb * s->K / kblocks), k1 = (int)((long)(kb + 1) * s->K / kblocks);
        for (int q = pan0; q < pan1; q++)
            pack_conv_panel(s, x, q * SDRT_NR, k0, k1, buf + (ptrdiff_t)(q - pan0) * (k1 - k0) * SDRT_NR);
        for (int t = 0; t < tiles; t++) {
            const int m0 = (int)((long)t * s->OC / tiles), m1 = (int)((long)(t + 1) * s->OC / tiles);
            const float *a = w + (ptrdiff_t)m0 * s->ldw + k0;
            const int t_next = t + 1 < tiles ? t + 1 : t;
            const float *a_next = w + (ptrdiff_t)((long)t_next * s->OC / tiles) * s->ldw + k0;
            for (int q = pan0; q < pan1; q++) {
                const int p0 = q * SDRT_NR;
                sdrt_tile_out o;
                o.c = out + (ptrdiff_t)m0 * np + p0;
                o.ldc = np;
                o.trans = 0;
                o.m = m1 - m0;
                o.n = np - p0 < SDRT_NR ? np - p0 : SDRT_NR;
                o.bias = NULL;
                o.acc = bias != NULL || kb > 0;
                kk->kern[o.m](k1 - k0, a, s->ldw, buf + (ptrdiff_t)(q - pan0) * (k1 - k0) * SDRT_NR, &o,
                              q + 1 < pan1 ? a : a_next);
            }
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
    const int kblocks = (s.K + CONV_KC - 1) / CONV_KC;
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
