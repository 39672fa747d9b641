/* Packed float32 GEMM for ggml (a ggml custom op), BLIS/MLAS style.
 *
 *   C (M x N) = A (M x K) . B (K x N) [+ bias (N)]
 *
 * A is read in place: K contiguous floats per row, any row stride (rows may overlap, as the
 * window conv's do). B is packed into panels of 32 columns, [panel][half][k][16] (sdrt_native.h,
 * SDRT_HALF): constant weights
 * once when the session is built (Python does it, sdrt_ggml/native.py), runtime operands per
 * unit of work. C is written row-major, or transposed (c[n*ldc + m]).
 *
 * Blocking (Goto / BLIS): K in blocks of kc (per ISA), M in blocks of mc rows (an A block of
 * mc x kc floats stays in L2), N in groups of panels. A unit of work is (M block, panel group),
 * all of K: for each K block, for each panel of the group, for each nr-column slice of it
 * (in L1), every MR tile of the A block (from L2) runs the micro-kernel (sdrt_block). So the
 * larger operand that a kernel call reads per k, the B slice, comes from L1, and the A tiles
 * stream from L2.
 *
 * Threads: ggml calls the op on each of its nth threads with no barrier in between; the threads
 * take units from a counter they share (the op's state tensor), so a thread the OS holds back
 * does not hold the others at ggml's barrier after the op.
 */
#include "sdrt_native.h"

#include <stdlib.h>
#include <string.h>

/* bytes of L2 for the A block (mc x kc floats) and for a unit's B panels (group x kc x 32 floats) */
#ifndef L2_A_BYTES
#define L2_A_BYTES (192 * 1024)
#endif
#ifndef L2_B_BYTES
#define L2_B_BYTES (192 * 1024)
#endif
/* a packed B (weights) above this is likely read from memory on every run (a model holds many, and
 * each was last read one run ago): its panels are prefetched */
#ifndef PREFETCH_B_BYTES
#define PREFETCH_B_BYTES (512 * 1024)
#endif
/* products with at least this K take half the AVX-512 kernels' K block (split_of) */
#ifndef LARGE_K
#define LARGE_K 8192
#endif
/* K blocks up to this run many slices a kernel call where the ISA has such kernels (sdrt_block) */
#ifndef MKERN_MAX_K
#define MKERN_MAX_K 128
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

/* columns a kernel call of ISA ``isa`` computes (the direct conv's slice width), 0 if unavailable */
SDRT_EXPORT int sdrt_gemm_isa_nr(int isa) {
    const sdrt_isa_kernels *k = kernels_of(isa);
    return k ? k->nr : 0;
}

/* whether bf16 products run on bf16 kernels now (1: AMX tiles or vdpbf16ps), or widen the bf16 operand to float32 (0) */
SDRT_EXPORT int sdrt_bf16_active(void) { return sdrt_kernels_bf16() != NULL; }

/* the bf16 products' kernels now: "amx-bf16" (AMX tiles), "avx512bf16" (vdpbf16ps), or "none" (widened to float32) */
SDRT_EXPORT const char *sdrt_bf16_kernel_name(void) {
    const sdrt_bf16_kernels *bk = sdrt_kernels_bf16();
    return bk ? bk->name : "none";
}

SDRT_EXPORT int sdrt_gemm_active_isa(void) {
    if (active_isa == SDRT_ISA_AUTO)
        active_isa = best_isa();
    return active_isa;
}

const sdrt_isa_kernels *sdrt_active_kernels(void) { return kernels_of(sdrt_gemm_active_isa()); }

/* ---- per-thread scratch ---------------------------------------------------------------- */
static SDRT_THREAD_LOCAL char *tl_raw[SDRT_THREAD_BUFFERS];
static SDRT_THREAD_LOCAL size_t tl_cap[SDRT_THREAD_BUFFERS];

float *sdrt_thread_buffer(int slot, size_t bytes) {
    if (bytes > tl_cap[slot]) {
        free(tl_raw[slot]);
        tl_raw[slot] = (char *)malloc(bytes + 64);
        tl_cap[slot] = tl_raw[slot] ? bytes : 0;
        if (!tl_raw[slot])
            return NULL;
    }
    return (float *)(((uintptr_t)tl_raw[slot] + 63) & ~(uintptr_t)63);
}

/* ---- the blocked product ---------------------------------------------------------------- */
void sdrt_block(const sdrt_isa_kernels *kk, int m, int k, const float *a, ptrdiff_t lda, const float *b,
                ptrdiff_t pstride, int panels, const sdrt_block_out *out, int acc, int last) {
    const int mr = kk->mr_max, nr = kk->nr;
    const int tiles = (m + mr - 1) / mr;
    if (k <= MKERN_MAX_K && kk->mkern[1] && !out->prefetch_b) {
        /* small K: each A tile meets every slice of the panels in one call (the panels, k x 32
         * floats each, stay in L1 or L2), so a call's fixed cost (zeroing, the epilogue's set-up,
         * the call) is paid once a tile instead of once a slice */
        const int cols = panels * SDRT_NR < out->n ? panels * SDRT_NR : out->n;
        const int slices = (cols + nr - 1) / nr;
        sdrt_tile_out o = sdrt_tile_out_cols(out, 0, cols, acc, last);
        sdrt_split ts = sdrt_split_of(m, tiles);
        for (int t = 0, m1 = 0; t < tiles; t++) {
            const int m0 = m1;
            m1 = sdrt_split_next(&ts);
            sdrt_tile_out_rows(&o, out, 0, m0, m1);
            const float *pf = t + 1 < tiles ? a + (ptrdiff_t)m1 * lda : a;
            kk->mkern[o.m](k, a + (ptrdiff_t)m0 * lda, lda, b, pstride, slices, &o, pf);
        }
        return;
    }
    const ptrdiff_t half = pstride / 2;
    for (int q = 0; q < panels; q++) {
        /* the next panel's rows, a share of them prefetched into L2 during each kernel call (by the
         * kernel, a few every 16 steps of k, where the ISA's kernels do: spread_pf; else as a burst
         * before the call): B from memory (weights far larger than the caches, at small M) streams
         * while the tiles compute, instead of stalling the first tile of each slice. The shares'
         * bounds step without a division */
        const float *next = out->prefetch_b && q + 1 < panels ? b + (ptrdiff_t)(q + 1) * pstride : NULL;
        sdrt_split rows = sdrt_split_of(k, tiles * (SDRT_NR / nr));
        int r0 = 0;
        for (int h = 0; h < SDRT_NR; h += nr) {
            const int n0 = q * SDRT_NR + h;
            if (n0 >= out->n)
                return;
            const float *bs = b + (ptrdiff_t)q * pstride + (h ? half : 0);
            sdrt_tile_out o = sdrt_tile_out_cols(out, n0, nr, acc, last);
            sdrt_split ts = sdrt_split_of(m, tiles);
            int m1 = 0, m2 = sdrt_split_next(&ts);
            for (int t = 0; t < tiles; t++) {
                const int m0 = m1;
                m1 = m2;
                m2 = t + 1 < tiles ? sdrt_split_next(&ts) : m1;
                if (next) { /* this call's share of the next panel's rows: a cache line in each half */
                    const int r1 = sdrt_split_next(&rows);
                    if (kk->spread_pf) { /* the kernel prefetches them a few at a time */
                        o.pfb = (const char *)(next + (ptrdiff_t)r0 * SDRT_HALF);
                        o.pfb_half = half * (ptrdiff_t)sizeof(float);
                        o.pfb_rows = r1 - r0;
                    } else
                        for (int r = r0; r < r1; r++) {
                            SDRT_PREFETCH_L2(next + (ptrdiff_t)r * SDRT_HALF);
                            SDRT_PREFETCH_L2(next + half + (ptrdiff_t)r * SDRT_HALF);
                        }
                    r0 = r1;
                }
                sdrt_tile_out_rows(&o, out, n0, m0, m1);
                /* prefetch the next tile's rows (the first tile's for the last: the next slice's) */
                const float *pf = t + 1 < tiles && m2 > m1 ? a + (ptrdiff_t)m1 * lda : a;
                kk->kern[o.m](k, a + (ptrdiff_t)m0 * lda, lda, bs, half, &o, pf);
            }
        }
    }
}

/* ---- the blocked bf16 product ------------------------------------------------------------ */
void sdrt_block_bf16(const sdrt_bf16_kernels *bk, int m, int k2, const uint32_t *a, ptrdiff_t lda, const uint16_t *b,
                     ptrdiff_t pstride, int panels, const sdrt_block_out *out, int acc, int last) {
    if (bk->block) {
        bk->block(bk, m, k2, a, lda, b, pstride, panels, out, acc, last);
        return;
    }
    const int mr = bk->mr_max, tiles = (m + mr - 1) / mr;
    const ptrdiff_t half = pstride / 2;
    for (int q = 0; q < panels; q++) {
        const int n0 = q * SDRT_BF16_NR;
        if (n0 >= out->n)
            return;
        /* as sdrt_block: a share of the next panel's pair rows (a cache line each, per half) prefetched
         * into L2 by each kernel call, where the weights stream from memory */
        const uint16_t *next = out->prefetch_b && q + 1 < panels ? b + (ptrdiff_t)(q + 1) * pstride : NULL;
        sdrt_split rows = sdrt_split_of(k2, tiles);
        int r0 = 0;
        const uint16_t *bs = b + (ptrdiff_t)q * pstride;
        sdrt_tile_out o = sdrt_tile_out_cols(out, n0, SDRT_BF16_NR, acc, last);
        sdrt_split ts = sdrt_split_of(m, tiles);
        for (int t = 0, m1 = 0; t < tiles; t++) {
            const int m0 = m1;
            m1 = sdrt_split_next(&ts);
            if (next) { /* the kernel prefetches them a few at a time */
                const int r1 = sdrt_split_next(&rows);
                o.pfb = (const char *)(next + (ptrdiff_t)r0 * SDRT_BF16_NR);
                o.pfb_half = half * (ptrdiff_t)sizeof(uint16_t);
                o.pfb_rows = r1 - r0;
                r0 = r1;
            }
            sdrt_tile_out_rows(&o, out, n0, m0, m1);
            bk->kern[o.m](k2, a + (ptrdiff_t)m0 * lda, lda, bs, half, &o);
        }
    }
}

void sdrt_widen_panels(const uint16_t *b, ptrdiff_t pstride, int k2, int panels, float *dst) {
    const ptrdiff_t fstride = (ptrdiff_t)4 * k2 * SDRT_HALF; /* 2 halves of 2 k2 rows of 16 */
    for (int q = 0; q < panels; q++)
        for (int h = 0; h < 2; h++) {
            const uint16_t *src = b + (ptrdiff_t)q * pstride + h * (pstride / 2);
            float *d = dst + (ptrdiff_t)q * fstride + (ptrdiff_t)h * 2 * k2 * SDRT_HALF;
            for (int p = 0; p < k2; p++, src += SDRT_BF16_NR, d += 2 * SDRT_HALF)
                for (int j = 0; j < SDRT_HALF; j++) {
                    d[j] = sdrt_bf16_to_f32(src[2 * j]);
                    d[SDRT_HALF + j] = sdrt_bf16_to_f32(src[2 * j + 1]);
                }
        }
}

/* ---- problem and packing ----------------------------------------------------------- */
typedef struct {
    int M, N, K;
    const float *a;
    ptrdiff_t lda;
    const float *b; /* unpacked: b[k*sbk + n*sbn]; packed: panels [p][half][K][16] */
    ptrdiff_t sbk, sbn;
    int b_packed;
    int b_bf16; /* b is bf16 panels [p][half][ceil(K/2)][16][2] (sdrt_native.h), packed */
    const float *bias;
    float *c;
    ptrdiff_t ldc;
    int trans;
    const float *res; /* a residual laid out as C (row stride ldres), added with the last block of K */
    ptrdiff_t ldres;
    const sdrt_epilogue *ep; /* an activation after it, or NULL */
} gemm2d;

/* columns n0 .. n0+31 of B, rows k0 .. k1-1, as one packed panel (zero columns past N) */
static void pack_panel(const gemm2d *p, int n0, int k0, int k1, float *dst) {
    const int nv = p->N - n0 < SDRT_NR ? p->N - n0 : SDRT_NR, rows = k1 - k0;
    for (int h = 0; h < SDRT_NR; h += SDRT_HALF) {
        const int nh = nv - h < 0 ? 0 : nv - h > SDRT_HALF ? SDRT_HALF : nv - h; /* valid columns of the half */
        float *d = dst + sdrt_panel_at(rows, 0, h);
        if (p->sbn == 1) {
            for (int k = k0; k < k1; k++, d += SDRT_HALF) {
                memcpy(d, p->b + k * p->sbk + n0 + h, (size_t)nh * sizeof(float));
                memset(d + nh, 0, (size_t)(SDRT_HALF - nh) * sizeof(float));
            }
            continue;
        }
        for (int j = 0; j < nh; j++) {
            const float *src = p->b + (ptrdiff_t)(n0 + h + j) * p->sbn;
            for (int k = k0; k < k1; k++)
                d[(ptrdiff_t)(k - k0) * SDRT_HALF + j] = src[k * p->sbk];
        }
        for (int j = nh; j < SDRT_HALF; j++)
            for (int k = 0; k < rows; k++)
                d[(ptrdiff_t)k * SDRT_HALF + j] = 0.0f;
    }
}

/* Whether the kernel's rows of A, lda floats apart, crowd into few L1 sets: with a row stride
 * near a multiple of 4 KiB (K = 1024, 2048, 3072...) the mr lines read at each k all map to
 * the same set of an 8-way L1 and evict each other. Such blocks are copied with a padded stride. */
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
    int kblocks, tiles_m, mblocks, panels, group, groups, copy_a;
    int whole16; /* M blocks of whole 16-row tiles (AMX: no partial tile but the last): tiles_m counts them */
} split;

/* the blocking of one product for nth threads (see the top of this file) */
static split split_of(const gemm2d *p, const sdrt_isa_kernels *kk, int nth, long batches) {
    split s;
    /* large K on AVX-512: half the ISA's K block. A 256 x 32 slice of B (32 KB) and a 14 x 256 tile of A
     * (14 KB) nearly fill a 48 KB L1; at 128 the pair takes half of it. Measured on Zen 5 (one thread, CPU
     * time, M = 2048): K = 15360 x N = 3072 0.90-0.93x the time; at K = 3072 no difference, so the other
     * products keep their blocking */
    const int kc_isa = p->K >= LARGE_K && kk == sdrt_kernels_avx512() ? kk->kc / 2 : kk->kc;
    s.kblocks = (p->K + kc_isa - 1) / kc_isa;
    const int kc = (p->K + s.kblocks - 1) / s.kblocks;
    const sdrt_bf16_kernels *bk = p->b_bf16 ? sdrt_kernels_bf16() : NULL;
    s.whole16 = bk && bk->block;
    const int mr = s.whole16 ? 16 : kk->mr_max;
    s.tiles_m = (p->M + mr - 1) / mr;
    int mc_tiles = (int)(L2_A_BYTES / ((size_t)kc * sizeof(float) * (size_t)mr));
    mc_tiles = mc_tiles < 1 ? 1 : mc_tiles;
    s.mblocks = (s.tiles_m + mc_tiles - 1) / mc_tiles;
    s.panels = (p->N + SDRT_NR - 1) / SDRT_NR;
    int g = (int)(L2_B_BYTES / ((size_t)kc * SDRT_NR * sizeof(float)));
    /* at least 4 units a thread where the panels allow it, for the shared counter to balance */
    const int want = (int)(((long)s.panels * s.mblocks * batches) / (4L * (nth > 0 ? nth : 1)));
    g = g > want ? want : g;
    if (s.mblocks == 1 && batches == 1) {
        /* one block of A rows: each B slice meets every A tile as soon as it is read, so the group
         * need not stay in L2; fewer, larger units read (or copy) A fewer times. Two a thread. */
        const int per = (s.panels + 2 * nth - 1) / (2 * (nth > 0 ? nth : 1));
        g = per > g ? per : g;
    }
    s.group = g < 1 ? 1 : (g > s.panels ? s.panels : g);
    s.groups = (s.panels + s.group - 1) / s.group;
    s.copy_a = a_aliases(p->lda, kk->mr_max);
    return s;
}

/* run_unit's bf16 weights: with the bf16 kernels, each block of K of the unit's A rows converted to bf16
 * pairs once (thread buffer 1) and multiplied by vdpbf16ps; without them (no AVX-512-BF16, or another
 * ISA pinned), the block's panels widened to float32 (thread buffer 0) for the float32 kernels, A as it
 * is: the same bf16 weights, float32 activations. */
static int run_unit_bf16(const gemm2d *p, const sdrt_isa_kernels *kk, const split *s, const sdrt_block_out *out,
                         int m0, int m1, int pan0, int pan1) {
    const sdrt_bf16_kernels *bk = sdrt_kernels_bf16();
    const int K2 = (p->K + 1) / 2;
    const ptrdiff_t pstride = (ptrdiff_t)K2 * 2 * SDRT_BF16_NR; /* uint16 per panel */
    const uint16_t *w = (const uint16_t *)(const void *)p->b + (ptrdiff_t)pan0 * pstride;
    const int kc2 = bk ? bk->kc2 : kk->kc / 2;
    const int kblocks = (K2 + kc2 - 1) / kc2;
    for (int kb = 0; kb < kblocks; kb++) {
        const int p0 = (int)((long)kb * K2 / kblocks), p1 = (int)((long)(kb + 1) * K2 / kblocks);
        const int k0 = 2 * p0, k1 = 2 * p1 < p->K ? 2 * p1 : p->K;
        const float *a = p->a + (ptrdiff_t)m0 * p->lda + k0;
        if (bk) {
            const ptrdiff_t ld2 = ((p1 - p0 + 15) & ~15) + 16; /* 64 bytes past a multiple of 64 */
            uint32_t *abuf = (uint32_t *)sdrt_thread_buffer(1, (size_t)(m1 - m0) * ld2 * sizeof(uint32_t));
            if (!abuf)
                return -1;
            bk->cvt_rows(m1 - m0, k1 - k0, a, p->lda, abuf, ld2);
            sdrt_block_bf16(bk, m1 - m0, p1 - p0, abuf, ld2, w + (ptrdiff_t)p0 * SDRT_BF16_NR, pstride, pan1 - pan0,
                            out, kb > 0, kb + 1 == kblocks);
            continue;
        }
        ptrdiff_t lda = p->lda;
        if (s->copy_a) {
            const ptrdiff_t ld = sdrt_copy_lda(k1 - k0);
            float *buf = sdrt_thread_buffer(1, (size_t)(m1 - m0) * ld * sizeof(float));
            if (!buf)
                return -1;
            for (int i = 0; i < m1 - m0; i++)
                memcpy(buf + i * ld, a + i * p->lda, (size_t)(k1 - k0) * sizeof(float));
            a = buf;
            lda = ld;
        }
        const ptrdiff_t fstride = (ptrdiff_t)4 * (p1 - p0) * SDRT_HALF;
        float *bw = sdrt_thread_buffer(0, (size_t)(pan1 - pan0) * fstride * sizeof(float));
        if (!bw)
            return -1;
        sdrt_widen_panels(w + (ptrdiff_t)p0 * SDRT_BF16_NR, pstride, p1 - p0, pan1 - pan0, bw);
        sdrt_block_out o = *out;
        o.prefetch_b = 0; /* just widened: in L2 */
        sdrt_block(kk, m1 - m0, k1 - k0, a, lda, bw, fstride, pan1 - pan0, &o, kb > 0, kb + 1 == kblocks);
    }
    return 0;
}

/* One unit: the rows of M block `mb` times the panels of group `g`, over all of K. */
static int run_unit(const gemm2d *p, const sdrt_isa_kernels *kk, const split *s, long u) {
    const int mb = (int)(u / s->groups), g = (int)(u % s->groups);
    const int t0 = (int)((long)mb * s->tiles_m / s->mblocks), t1 = (int)((long)(mb + 1) * s->tiles_m / s->mblocks);
    int m0 = (int)((long)t0 * p->M / s->tiles_m), m1 = (int)((long)t1 * p->M / s->tiles_m);
    if (s->whole16) {
        m0 = 16 * t0 < p->M ? 16 * t0 : p->M;
        m1 = 16 * t1 < p->M ? 16 * t1 : p->M;
    }
    const int pan0 = g * s->group, pan1 = pan0 + s->group < s->panels ? pan0 + s->group : s->panels;
    if (m1 <= m0)
        return 0;
    sdrt_block_out out;
    out.ldc = p->ldc;
    out.trans = p->trans;
    out.n = p->N - pan0 * SDRT_NR;
    out.bias = p->bias ? p->bias + pan0 * SDRT_NR : NULL;
    out.rbias = NULL;
    /* weights come from memory on each run: prefetch them (not a B packed into L2 here) */
    out.prefetch_b = p->b_packed && (size_t)p->K * p->N * sizeof(float) > PREFETCH_B_BYTES;
    out.ldres = p->ldres;
    out.ep = p->ep;
    out.c = p->trans ? p->c + (ptrdiff_t)pan0 * SDRT_NR * p->ldc + m0 : p->c + (ptrdiff_t)m0 * p->ldc + pan0 * SDRT_NR;
    out.res = !p->res ? NULL
              : p->trans ? p->res + (ptrdiff_t)pan0 * SDRT_NR * p->ldres + m0
                         : p->res + (ptrdiff_t)m0 * p->ldres + pan0 * SDRT_NR;
    if (p->b_bf16)
        return run_unit_bf16(p, kk, s, &out, m0, m1, pan0, pan1);
    for (int kb = 0; kb < s->kblocks; kb++) {
        const int k0 = (int)((long)kb * p->K / s->kblocks), k1 = (int)((long)(kb + 1) * p->K / s->kblocks);
        const float *a = p->a + (ptrdiff_t)m0 * p->lda + k0;
        ptrdiff_t lda = p->lda;
        if (s->copy_a) {
            const ptrdiff_t ld = sdrt_copy_lda(k1 - k0); /* 64 bytes past a multiple of 64 */
            float *buf = sdrt_thread_buffer(1, (size_t)(m1 - m0) * ld * sizeof(float));
            if (!buf)
                return -1;
            for (int i = 0; i < m1 - m0; i++)
                memcpy(buf + i * ld, a + i * p->lda, (size_t)(k1 - k0) * sizeof(float));
            a = buf;
            lda = ld;
        }
        const float *b;
        ptrdiff_t pstride;
        if (p->b_packed) {
            b = p->b + (ptrdiff_t)pan0 * p->K * SDRT_NR + (ptrdiff_t)k0 * SDRT_HALF;
            pstride = (ptrdiff_t)p->K * SDRT_NR;
        } else {
            pstride = (ptrdiff_t)(k1 - k0) * SDRT_NR;
            float *buf = sdrt_thread_buffer(0, (size_t)(pan1 - pan0) * pstride * sizeof(float));
            if (!buf)
                return -1;
            for (int q = pan0; q < pan1; q++)
                pack_panel(p, q * SDRT_NR, k0, k1, buf + (ptrdiff_t)(q - pan0) * pstride);
            b = buf;
        }
        sdrt_block(kk, m1 - m0, k1 - k0, a, lda, b, pstride, pan1 - pan0, &out, kb > 0, kb + 1 == s->kblocks);
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
    const split s = split_of(p, kk, nth, 1);
    const long units = (long)s.mblocks * s.groups;
    for (long u = units * ith / nth; u < units * (ith + 1) / nth; u++)
        if (run_unit(p, kk, &s, u))
            return;
}

/* Direct entry (tests, benchmarks): one thread's share (ith of nth) of C = A . B [+ bias].
 * isa -1 uses the active ISA. b_packed: b holds ceil(N/32) panels [p][half][K][16]. Returns 0, or -1
 * when the ISA is not available here. */
SDRT_EXPORT int sdrt_gemm(int isa, int M, int N, int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t sbk,
                          ptrdiff_t sbn, int b_packed, const float *bias, float *c, ptrdiff_t ldc, int trans, int ith,
                          int nth) {
    const sdrt_isa_kernels *kk = kernels_of(isa == SDRT_ISA_AUTO ? sdrt_gemm_active_isa() : isa);
    if (!kk || nth < 1 || ith < 0 || ith >= nth)
        return -1;
    gemm2d p = {M, N, K, a, lda, b, sbk, sbn, b_packed, 0, bias, c, ldc, trans, NULL, 0, NULL};
    run_2d(&p, kk, ith, nth);
    return 0;
}

/* ---- the ggml custom op ------------------------------------------------------------ */
/* userdata bits */
#define OP_TRANS 1u
#define OP_PACKED 2u
#define OP_BIAS 4u
#define OP_SHARED 8u
#define OP_RES 16u
#define OP_ACT 32u
#define OP_BF16 64u

/* dst = A . B [+ bias] over ggml tensors, as ggml_custom_4d's callback.
 *   src[0] A:    ne (K, M, d2, d3), nb0 = 4 (rows may overlap)
 *   src[1] B:    packed: panels [p][half][K][16] (ne (16, K, 2, panels)), contiguous; with OP_BF16 (and
 *                packed) bf16 panels [p][half][ceil(K/2)][16][2] (sdrt_native.h; ne (32, K2, 2, panels)); else
 *                ne (N, K, e2, e3), any strides,
 *                broadcast over A's batch dims (d2 % e2 == 0, d3 % e3 == 0), as ggml_mul_mat does
 *   src[2] bias: ne0 = N, contiguous (with OP_BIAS)
 *   next src     a residual shaped and laid out as dst, any row stride (with OP_RES): added to the
 *                product (after the bias)
 *   next src     int32[3] [act, lo, hi] (with OP_ACT): an activation (sdrt_epilogue; lo, hi as float
 *                bits) applied last
 *   next src     int32[4] zeros, shared by the op's threads (with OP_SHARED): a work counter
 *   dst:         ne (N, M, d2, d3), or with OP_TRANS ne (M, N, d2, d3); rows of dst may be padded
 *
 * With OP_SHARED the threads take units one at a time from the shared counter, so a thread that
 * the OS holds back (a busy machine) does not hold the others at ggml's barrier after the op:
 * the last thread to find no work left resets the counter for the next run (ggml runs the next
 * node only after every thread has returned from this one). Without it, each thread takes a
 * fixed share. */
SDRT_EXPORT void sdrt_gemm_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED_SHARED(sdrt_gemm_op);
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
    const void *tres = NULL;
    if (flags & OP_RES) {
        tres = sdrt_tensor_src(dst, next_src++);
        if (!tres)
            return;
    }
    sdrt_epilogue ep = {SDRT_ACT_NONE, 0.0f, 0.0f};
    if (flags & OP_ACT) {
        const void *tact = sdrt_tensor_src(dst, next_src++);
        if (!tact)
            return;
        const int32_t *a = (const int32_t *)sdrt_tensor_view(tact).data;
        ep.act = a[0];
        memcpy(&ep.lo, a + 1, sizeof(float));
        memcpy(&ep.hi, a + 2, sizeof(float));
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
    p.b_bf16 = packed && (flags & OP_BF16) != 0;
    p.sbk = packed ? SDRT_NR : (ptrdiff_t)(B.nb[1] / sizeof(float));
    p.sbn = packed ? 1 : (ptrdiff_t)(B.nb[0] / sizeof(float));
    p.bias = bias;
    p.ldc = (ptrdiff_t)(C.nb[1] / sizeof(float));
    p.trans = trans;
    p.res = NULL;
    p.ep = ep.act ? &ep : NULL;
    const sdrt_view R = tres ? sdrt_tensor_view(tres) : C;
    p.ldres = (ptrdiff_t)(R.nb[1] / sizeof(float));
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
    const split s = split_of(&p, kk, nth, batches);
    const long per = (long)s.groups * s.mblocks, units = per * batches;
    long u = 0, u_end = units;
    if (!state) { /* a fixed share */
        u = units * ith / nth;
        u_end = units * (ith + 1) / nth;
    }
    long bt_set = -1;
    for (;;) {
        if (state)
            u = sdrt_work_take(state);
        if (u >= u_end)
            break;
        const long bt = u / per;
        if (bt != bt_set) {
            const long i2 = bt % d2, i3 = bt / d2;
            p.a = (const float *)(A.data + i2 * A.nb[2] + i3 * A.nb[3]);
            p.b = (const float *)(B.data + (i2 / (d2 / e2)) * B.nb[2] + (i3 / (d3 / e3)) * B.nb[3]);
            p.c = (float *)(C.data + i2 * C.nb[2] + i3 * C.nb[3]);
            p.res = tres ? (const float *)(R.data + i2 * R.nb[2] + i3 * R.nb[3]) : NULL;
            bt_set = bt;
        }
        if (run_unit(&p, kk, &s, u % per))
            break;
        if (!state)
            u++;
    }
    if (state)
        sdrt_work_done(state, nth);
}
