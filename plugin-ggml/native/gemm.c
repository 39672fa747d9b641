/* Packed float32 GEMM for ggml (a ggml custom op), BLIS/MLAS style.
 *
 *   C (M x N) = A (M x K) . B (K x N) [+ bias (N)]
 *
 * A is read in place: K contiguous floats per row, any row stride (rows may overlap, as the
 * window conv's do). B is packed into panels of 32 columns, [panel][k][32]: constant weights
 * once when the session is built (Python does it, sdrt_ggml/native.py), runtime operands per
 * thread as the threads reach them. C is written row-major, or transposed (c[n*ldc + m]),
 * which gives a conv its NCHW output without a transpose copy.
 *
 * Threads: ggml calls the op on each of its nth threads with no barrier in between, so the
 * work is split statically. A unit is (batch, group of B panels, tile of A rows); a thread
 * takes a contiguous range of units, so it keeps one group of B panels (sized to stay in L2)
 * while it sweeps over A's row tiles, and each row tile (in L1) meets every panel of the
 * group before the next tile is read.
 */
#include "sdrt_native.h"

#include <stdlib.h>
#include <string.h>

#ifndef L2_PANEL_BYTES
#define L2_PANEL_BYTES (384 * 1024)
#endif
/* the longest block of K per kernel call: mr_max rows of A (14 x 384 floats: 21 KB) stay in L1 */
#ifndef KC_MAX
#define KC_MAX 384
#endif

/* ---- ISA dispatch ------------------------------------------------------------------ */
static const sdrt_isa_kernels *kernels_of(int isa) {
    switch (isa) {
    case SDRT_ISA_PORTABLE:
        return sdrt_kernels_portable();
    case SDRT_ISA_AVX2:
        return sdrt_kernels_avx2();
    case SDRT_ISA_AVX512:
        return sdrt_kernels_avx512();
    case SDRT_ISA_NEON:
        return sdrt_kernels_neon();
    default:
        return NULL;
    }
}

static int best_isa(void) {
    const int order[] = {SDRT_ISA_AVX512, SDRT_ISA_AVX2, SDRT_ISA_NEON};
    for (int i = 0; i < 3; i++)
        if (kernels_of(order[i]))
            return order[i];
    return SDRT_ISA_PORTABLE;
}

static int active_isa = SDRT_ISA_AUTO;

/* Whether this build and this CPU can run ISA ``isa`` (0 portable, 1 AVX2+FMA, 2 AVX-512F, 3 NEON). */
SDRT_EXPORT int sdrt_gemm_isa_available(int isa) { return kernels_of(isa) != NULL; }

/* Pick the ISA the custom ops use (-1: the best this CPU has). Returns the ISA now active, or
 * -1 when the one asked for is not available (the active one is left as it was). */
SDRT_EXPORT int sdrt_gemm_set_isa(int isa) {
    if (isa == SDRT_ISA_AUTO)
        isa = best_isa();
    if (!kernels_of(isa))
        return -1;
    active_isa = isa;
    return isa;
}

SDRT_EXPORT const char *sdrt_gemm_isa_name(int isa) {
    const sdrt_isa_kernels *k = kernels_of(isa);
    return k ? k->name : "unavailable";
}

SDRT_EXPORT int sdrt_gemm_active_isa(void) {
    if (active_isa == SDRT_ISA_AUTO)
        active_isa = best_isa();
    return active_isa;
}

const sdrt_isa_kernels *sdrt_active_kernels(void) { return kernels_of(sdrt_gemm_active_isa()); }

/* ---- problem and packing ----------------------------------------------------------- */
typedef struct {
    int M, N, K;
    const float *a;
    ptrdiff_t lda;
    const float *b; /* unpacked: b[k*sbk + n*sbn]; packed: panels [p][k][32] */
    ptrdiff_t sbk, sbn;
    int b_packed;
    const float *bias;
    float *c;
    ptrdiff_t ldc;
    int trans;
} gemm2d;

/* columns n0 .. n0+31 of B, rows k0 .. k1-1, as one panel [k][32] (zero columns past N) */
static void pack_panel(const gemm2d *p, int n0, int k0, int k1, float *dst) {
    const int nv = p->N - n0 < SDRT_NR ? p->N - n0 : SDRT_NR;
    if (p->sbn == 1) {
        for (int k = k0; k < k1; k++) {
            float *d = dst + (ptrdiff_t)(k - k0) * SDRT_NR;
            memcpy(d, p->b + k * p->sbk + n0, (size_t)nv * sizeof(float));
            if (nv < SDRT_NR)
                memset(d + nv, 0, (size_t)(SDRT_NR - nv) * sizeof(float));
        }
        return;
    }
    for (int j = 0; j < nv; j++) {
        const float *src = p->b + (ptrdiff_t)(n0 + j) * p->sbn;
        for (int k = k0; k < k1; k++)
            dst[(ptrdiff_t)(k - k0) * SDRT_NR + j] = src[k * p->sbk];
    }
    for (int j = nv; j < SDRT_NR; j++)
        for (int k = k0; k < k1; k++)
            dst[(ptrdiff_t)(k - k0) * SDRT_NR + j] = 0.0f;
}

/* per-thread buffers (0: runtime-packed B panels, 1: copied A rows), kept for the thread's life */
static SDRT_THREAD_LOCAL char *tl_raw[2];
static SDRT_THREAD_LOCAL size_t tl_cap[2];

static float *thread_buffer(int slot, size_t bytes) {
    if (bytes > tl_cap[slot]) {
        free(tl_raw[slot]);
        tl_raw[slot] = (char *)malloc(bytes + 64);
        tl_cap[slot] = tl_raw[slot] ? bytes : 0;
        if (!tl_raw[slot])
            return NULL;
    }
    return (float *)(((uintptr_t)tl_raw[slot] + 63) & ~(uintptr_t)63);
}

/* Whether the kernel's rows of A, lda floats apart, crowd into few L1 sets: with a row stride
 * near a multiple of 4 KiB (K = 1024, 2048, 3072...) the mr lines read at each k all map to
 * the same set of an 8-way L1 and evict each other. Such tiles are copied with a padded stride. */
static int a_aliases(ptrdiff_t lda, int mr) {
    int count[64] = {0};
    for (int i = 0; i < mr; i++) {
        const int set = (int)(((uint64_t)(i * lda) * sizeof(float) / 64) % 64);
        if (++count[set] > 4)
            return 1;
    }
    return 0;
}

typedef struct {
    int tiles_m, panels, group, groups, kblocks, copy_a;
} split;

static split split_of(const gemm2d *p, int mr_max) {
    split s;
    s.tiles_m = (p->M + mr_max - 1) / mr_max;
    s.panels = (p->N + SDRT_NR - 1) / SDRT_NR;
    s.kblocks = (p->K + KC_MAX - 1) / KC_MAX;
    const size_t panel_bytes = (size_t)p->K * SDRT_NR * sizeof(float);
    int g = (int)(L2_PANEL_BYTES / (panel_bytes ? panel_bytes : 1));
    s.group = g < 1 ? 1 : (g > s.panels ? s.panels : g);
    s.groups = (s.panels + s.group - 1) / s.group;
    s.copy_a = a_aliases(p->lda, mr_max);
    return s;
}

/* where a thread keeps the B panels it packed at run time, and for which (op call, batch, group) */
typedef struct {
    const void *owner;
    int epoch;
    long batch;
    int group;
} pack_key;
static SDRT_THREAD_LOCAL pack_key tl_packed;

/* One unit: the C tile of rows [m0, m1) and the panels of one group, over all of K in blocks
 * (each tile's slice of A, mr x KC floats, stays in L1 while it meets the group's panels; the
 * group's panels, K x 32 x group floats, stay in L2 while the thread's next tiles come). */
static int run_unit(const gemm2d *p, const sdrt_isa_kernels *kk, const split *s, long u, const pack_key *key) {
    const int g = (int)(u / s->tiles_m), t = (int)(u % s->tiles_m);
    const int m0 = (int)((long)t * p->M / s->tiles_m), m1 = (int)((long)(t + 1) * p->M / s->tiles_m);
    const int pan0 = g * s->group, pan1 = pan0 + s->group < s->panels ? pan0 + s->group : s->panels;
    const float *packed;
    if (p->b_packed) {
        packed = p->b + (ptrdiff_t)pan0 * p->K * SDRT_NR;
    } else {
        float *buf = thread_buffer(0, (size_t)(pan1 - pan0) * p->K * SDRT_NR * sizeof(float));
        if (!buf)
            return -1;
        if (!key || tl_packed.owner != key->owner || tl_packed.epoch != key->epoch || tl_packed.batch != key->batch ||
            tl_packed.group != g) {
            for (int q = pan0; q < pan1; q++)
                pack_panel(p, q * SDRT_NR, 0, p->K, buf + (ptrdiff_t)(q - pan0) * p->K * SDRT_NR);
            tl_packed = key ? *key : (pack_key){NULL, 0, 0, -1};
            tl_packed.group = key ? g : -1;
        }
        packed = buf;
    }
    /* the A rows of the next tile (likely this thread's or the other's next unit) */
    const int t_next = t + 1 < s->tiles_m ? t + 1 : t;
    const float *a_next = p->a + (ptrdiff_t)((long)t_next * p->M / s->tiles_m) * p->lda;
    for (int kb = 0; kb < s->kblocks; kb++) {
        const int k0 = (int)((long)kb * p->K / s->kblocks), k1 = (int)((long)(kb + 1) * p->K / s->kblocks);
        const float *a = p->a + (ptrdiff_t)m0 * p->lda + k0;
        ptrdiff_t lda = p->lda;
        const float *pf_last = kb + 1 < s->kblocks ? a + (k1 - k0) : a_next;
        if (s->copy_a) {
            const ptrdiff_t ld = ((k1 - k0 + 15) & ~15) + 16; /* 64 bytes past a multiple of 64 */
            float *buf = thread_buffer(1, (size_t)(m1 - m0) * ld * sizeof(float));
            if (!buf)
                return -1;
            for (int i = 0; i < m1 - m0; i++)
                memcpy(buf + i * ld, a + i * p->lda, (size_t)(k1 - k0) * sizeof(float));
            a = buf;
            lda = ld;
            pf_last = buf;
        }
        for (int q = pan0; q < pan1; q++) {
            const int n0 = q * SDRT_NR;
            sdrt_tile_out o;
            o.ldc = p->ldc;
            o.trans = p->trans;
            o.m = m1 - m0;
            o.n = p->N - n0 < SDRT_NR ? p->N - n0 : SDRT_NR;
            o.bias = p->bias ? p->bias + n0 : NULL;
            o.acc = kb > 0;
            o.c = p->trans ? p->c + (ptrdiff_t)n0 * p->ldc + m0 : p->c + (ptrdiff_t)m0 * p->ldc + n0;
            kk->kern[o.m](k1 - k0, a, lda, packed + ((ptrdiff_t)(q - pan0) * p->K + k0) * SDRT_NR, &o,
                          q + 1 < pan1 ? a : pf_last);
        }
    }
    return 0;
}

/* an empty sum (K = 0): zeros, plus the bias */
static void run_empty(const gemm2d *p, int ith, int nth) {
    for (int i = ith; i < p->M; i += nth)
        for (int j = 0; j < p->N; j++)
            *(p->trans ? p->c + (ptrdiff_t)j * p->ldc + i : p->c + (ptrdiff_t)i * p->ldc + j) = p->bias ? p->bias[j] : 0.0f;
}

static void run_2d(const gemm2d *p, const sdrt_isa_kernels *kk, int ith, int nth) {
    if (p->M <= 0 || p->N <= 0)
        return;
    if (p->K <= 0) {
        run_empty(p, ith, nth);
        return;
    }
    const split s = split_of(p, kk->mr_max);
    const long units = (long)s.groups * s.tiles_m;
    for (long u = units * ith / nth; u < units * (ith + 1) / nth; u++)
        if (run_unit(p, kk, &s, u, NULL))
            return;
}

/* Direct entry (tests, benchmarks): one thread's share (ith of nth) of C = A . B [+ bias].
 * isa -1 uses the active ISA. b_packed: b holds ceil(N/32) panels [p][k][32]. Returns 0, or -1
 * when the ISA is not available here. */
SDRT_EXPORT int sdrt_gemm(int isa, int M, int N, int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t sbk,
                          ptrdiff_t sbn, int b_packed, const float *bias, float *c, ptrdiff_t ldc, int trans, int ith,
                          int nth) {
    const sdrt_isa_kernels *kk = kernels_of(isa == SDRT_ISA_AUTO ? sdrt_gemm_active_isa() : isa);
    if (!kk || nth < 1 || ith < 0 || ith >= nth)
        return -1;
    gemm2d p = {M, N, K, a, lda, b, sbk, sbn, b_packed, bias, c, ldc, trans};
    run_2d(&p, kk, ith, nth);
    return 0;
}

/* ---- the ggml custom op ------------------------------------------------------------ */
/* userdata bits */
#define OP_TRANS 1u
#define OP_PACKED 2u
#define OP_BIAS 4u
#define OP_SHARED 8u

#if defined(_MSC_VER)
#include <intrin.h>
#define ATOMIC_ADD(p, v) _InterlockedExchangeAdd((volatile long *)(p), (long)(v))
#define ATOMIC_STORE(p, v) _InterlockedExchange((volatile long *)(p), (long)(v))
#else
#define ATOMIC_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_ACQ_REL)
#define ATOMIC_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#endif

/* dst = A . B [+ bias] over ggml tensors, as ggml_custom_4d's callback.
 *   src[0] A:    ne (K, M, d2, d3), nb0 = 4 (rows may overlap)
 *   src[1] B:    packed: ne (32, K, panels, 1), contiguous; else ne (N, K, e2, e3), any strides,
 *                broadcast over A's batch dims (d2 % e2 == 0, d3 % e3 == 0), as ggml_mul_mat does
 *   src[2] bias: ne0 = N, contiguous (with OP_BIAS)
 *   next src     int32[4] zeros, shared by the op's threads (with OP_SHARED): a work counter
 *   dst:         ne (N, M, d2, d3), or with OP_TRANS ne (M, N, d2, d3); rows of dst may be padded
 *
 * With OP_SHARED the threads take units one at a time from the shared counter, so a thread that
 * the OS holds back (a busy machine) does not hold the others at ggml's barrier after the op:
 * the last thread to find no work left resets the counter for the next run (ggml runs the next
 * node only after every thread has returned from this one). Without it, each thread takes a
 * fixed share. */
SDRT_EXPORT void sdrt_gemm_op(void *dst, int ith, int nth, void *userdata) {
    const unsigned flags = (unsigned)(uintptr_t)userdata;
    const sdrt_isa_kernels *kk = kernels_of(sdrt_gemm_active_isa());
    const void *ta = sdrt_tensor_src(dst, 0), *tb = sdrt_tensor_src(dst, 1);
    if (!kk || !ta || !tb)
        return;
    const sdrt_view A = sdrt_tensor_view(ta), B = sdrt_tensor_view(tb), C = sdrt_tensor_view(dst);
    const int trans = (flags & OP_TRANS) != 0, packed = (flags & OP_PACKED) != 0;
    const int K = (int)A.ne[0], M = (int)A.ne[1];
    const int N = (int)(trans ? C.ne[1] : C.ne[0]);
    const float *bias = NULL;
    int next_src = 2;
    if (flags & OP_BIAS) {
        const void *tbias = sdrt_tensor_src(dst, next_src++);
        if (!tbias)
            return;
        bias = (const float *)sdrt_tensor_view(tbias).data;
    }
    int32_t *state = NULL;
    if (flags & OP_SHARED) {
        const void *tstate = sdrt_tensor_src(dst, next_src++);
        if (!tstate)
            return;
        state = (int32_t *)sdrt_tensor_view(tstate).data;
    }
    const long d2 = (long)A.ne[2], d3 = (long)A.ne[3];
    const long e2 = packed ? 1 : (long)B.ne[2], e3 = packed ? 1 : (long)B.ne[3];
    if (d2 <= 0 || d3 <= 0 || e2 <= 0 || e3 <= 0 || d2 % e2 || d3 % e3)
        return;
    gemm2d p;
    p.M = M;
    p.N = N;
    p.K = K;
    p.lda = (ptrdiff_t)(A.nb[1] / sizeof(float));
    p.b_packed = packed;
    p.sbk = packed ? SDRT_NR : (ptrdiff_t)(B.nb[1] / sizeof(float));
    p.sbn = packed ? 1 : (ptrdiff_t)(B.nb[0] / sizeof(float));
    p.bias = bias;
    p.ldc = (ptrdiff_t)(C.nb[1] / sizeof(float));
    p.trans = trans;
    const long batches = d2 * d3;
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        for (long bt = 0; bt < batches; bt++) {
            p.c = (float *)(C.data + (bt % d2) * C.nb[2] + (bt / d2) * C.nb[3]);
            run_empty(&p, ith, nth);
        }
        return;
    }
    const split s = split_of(&p, kk->mr_max);
    const long per = (long)s.groups * s.tiles_m, units = per * batches;
    pack_key key = {state ? (const void *)state : dst, state ? state[2] : 0, -1, -1};
    long u = 0, u_end = units;
    if (!state) { /* a fixed share */
        u = units * ith / nth;
        u_end = units * (ith + 1) / nth;
    }
    long bt_set = -1;
    for (;;) {
        if (state)
            u = ATOMIC_ADD(&state[0], 1);
        if (u >= u_end)
            break;
        const long bt = u / per;
        if (bt != bt_set) {
            const long i2 = bt % d2, i3 = bt / d2;
            p.a = (const float *)(A.data + i2 * A.nb[2] + i3 * A.nb[3]);
            p.b = (const float *)(B.data + (i2 / (d2 / e2)) * B.nb[2] + (i3 / (d3 / e3)) * B.nb[3]);
            p.c = (float *)(C.data + i2 * C.nb[2] + i3 * C.nb[3]);
            bt_set = bt;
        }
        key.batch = bt;
        if (run_unit(&p, kk, &s, u % per, &key))
            break;
        if (!state)
            u++;
    }
    if (state && ATOMIC_ADD(&state[1], 1) == nth - 1) {
        ATOMIC_STORE(&state[2], state[2] + 1); /* a new epoch: runtime-packed B is stale */
        ATOMIC_STORE(&state[0], 0);
        ATOMIC_STORE(&state[1], 0);
    }
}
