/* float32 GEMM micro-kernels: C tile (mr x NR) = A rows (mr x K) . B slice (K x NR).
 *
 * Outer-product register tiles, as in BLIS and MLAS: for each k, the NR B values are loaded once
 * as vectors, each A value is broadcast once, and every accumulator gets one FMA. A is read in
 * place (row stride lda, rows may overlap: the window conv). One kernel per tile height mr
 * (1 .. mr_max), so the edge rows of a matrix need no padding; edge columns are masked.
 *
 * Two ways to find B's rows, one kernel family each:
 *   kern   row k of a packed panel's half at b + 16 k, and (NR 32) of its second half at b + bh + 16 k
 *          (GEMM, packed conv, Winograd);
 *   ikern  row k at b + off[k]: rows read where they lie (the direct conv: its padded input).
 *
 * The epilogue adds a per-column or per-row bias, or (acc) what C holds; with the last block of
 * K it also adds a residual tile and applies an activation (sdrt_epilogue).
 *
 *   AVX-512F        mr <= 14, NR 32: 28 zmm accumulators, 2 for B; direct masked stores, or a
 *                   16x16 in-register transpose for transposed output.
 *   AVX2 + FMA      mr <= 6, NR 16: 12 ymm accumulators; direct masked stores.
 *   NEON (AArch64)  mr <= 6, NR 16: 16 q accumulators, stored through a tile.
 *   portable C      mr <= 4, NR 32, loops the compiler vectorizes for the baseline ISA.
 *
 * NR and the K block (kc) of each ISA are in its table: the driver (gemm.c, sdrt_block) keeps a
 * kc x NR slice of B in L1 while every A tile of a block meets it.
 */
#include "sdrt_native.h"

#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
#define SDRT_UNROLL _Pragma("GCC unroll 16")
#elif defined(__clang__)
#define SDRT_UNROLL _Pragma("unroll")
#else
#define SDRT_UNROLL
#endif

/* ---- shared scalar tile store ------------------------------------------------------ */
/* C (+)= tile, with the biases, and with the last block of K the residual and the activation */
void sdrt_store_tile(const float *tile, int ld_tile, const sdrt_tile_out *o) {
    const int m = o->m, n = o->n;
    const sdrt_epilogue *ep = o->last ? o->ep : NULL;
    const float *res = o->last ? o->res : NULL;
    for (int i = 0; i < m; i++) {
        const float ri = o->rbias && !o->acc ? o->rbias[i] : 0.0f;
        for (int j = 0; j < n; j++) {
            float *c = o->trans ? o->c + j * o->ldc + i : o->c + i * o->ldc + j;
            float v = tile[(ptrdiff_t)i * ld_tile + j];
            v += o->acc ? *c : (o->bias ? o->bias[j] : 0.0f) + ri;
            if (res)
                v += o->trans ? res[j * o->ldres + i] : res[i * o->ldres + j];
            *c = sdrt_act(ep, v);
        }
    }
}

/* ---- portable C ------------------------------------------------------------------- */
/* B row k: columns 0-15 at lo, 16-31 at hi (packed: the panel's two halves; by offsets: one row) */
SDRT_INLINE void kport(int MR, int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, const int32_t *off,
                       const sdrt_tile_out *o) {
    float acc[4][SDRT_NR];
    memset(acc, 0, sizeof(acc));
    for (int k = 0; k < K; k++) {
        const float *lo = off ? b + off[k] : b + (ptrdiff_t)k * SDRT_HALF;
        const float *hi = off ? lo + SDRT_HALF : lo + bh;
        for (int i = 0; i < MR; i++) {
            const float ai = a[i * lda + k];
            for (int j = 0; j < SDRT_HALF; j++) {
                acc[i][j] += ai * lo[j];
                acc[i][SDRT_HALF + j] += ai * hi[j];
            }
        }
    }
    sdrt_store_tile(&acc[0][0], SDRT_NR, o);
}

#define KPORT(MR) \
    static void kport_##MR(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, const sdrt_tile_out *o, \
                           const float *pf) { \
        (void)pf; \
        kport(MR, K, a, lda, b, bh, NULL, o); \
    } \
    static void kporti_##MR(int K, const float *a, ptrdiff_t lda, const float *b, const int32_t *off, \
                            const sdrt_tile_out *o, const float *pf) { \
        (void)pf; \
        kport(MR, K, a, lda, b, 0, off, o); \
    }
KPORT(1)
KPORT(2)
KPORT(3)
KPORT(4)

static const sdrt_isa_kernels portable = {"portable", 4, 32, 256, {NULL, kport_1, kport_2, kport_3, kport_4},
                                          {NULL, kporti_1, kporti_2, kporti_3, kporti_4},
                                          {NULL},
                                          0,
                                          {NULL}};

const sdrt_isa_kernels *sdrt_kernels_portable(void) { return &portable; }

/* ---- x86: AVX2 + FMA, AVX-512F ------------------------------------------------------ */
#if defined(SDRT_X86) && (defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER))
#include <immintrin.h>

#if defined(__GNUC__) || defined(__clang__)
#define TARGET_AVX2 __attribute__((target("avx2,fma")))
#define INLINE_AVX2 static inline __attribute__((always_inline, target("avx2,fma")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define INLINE_AVX512 static inline __attribute__((always_inline, target("avx512f,avx2,fma")))
#else
#define TARGET_AVX2
#define INLINE_AVX2 static __forceinline
#define TARGET_AVX512
#define INLINE_AVX512 static __forceinline
#endif

/* lanes 0 .. n-1 of 8 (n clipped to 0..8) as a maskstore/maskload mask */
static const int32_t mask_src[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define MASK8(n) _mm256_loadu_si256((const __m256i *)(mask_src + 8 - ((n) < 0 ? 0 : (n) > 8 ? 8 : (n))))

/* a row bias of zeros, for tiles without one (AVX2 and AVX-512) */
static const float zero_rows[16] = {0.0f};

/* the activation of an epilogue, as vectors */
typedef struct {
    int act;
    __m256 lo, hi;
} act256;

INLINE_AVX2 act256 act256_of(const sdrt_tile_out *o) {
    act256 e;
    const sdrt_epilogue *ep = o->last ? o->ep : NULL;
    e.act = ep ? ep->act : SDRT_ACT_NONE;
    e.lo = _mm256_set1_ps(ep ? ep->lo : 0.0f);
    e.hi = _mm256_set1_ps(ep ? ep->hi : 0.0f);
    return e;
}

/* exp(x) for x <= 88 (below -87.3: ~1e-38): Cody-Waite reduction, degree-6 polynomial (relative
 * error below 2e-7, as the ops' vexp), 2^n through the exponent bits */
INLINE_AVX2 __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 m = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n = _mm256_sub_ps(m, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(m), _mm256_castps_si256(magic));
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(ni, 23)));
}

/* activation `act` (a constant where the caller's switch made it one: then this folds to one case) */
INLINE_AVX2 __m256 act256_k(int act, const act256 *e, __m256 v) {
    switch (act) {
    case SDRT_ACT_RELU:
        return _mm256_max_ps(v, _mm256_setzero_ps());
    case SDRT_ACT_CLIP:
        return _mm256_min_ps(_mm256_max_ps(v, e->lo), e->hi);
    case SDRT_ACT_HARDSWISH: {
        const __m256 g = _mm256_fmadd_ps(v, _mm256_set1_ps(1.0f / 6.0f), _mm256_set1_ps(0.5f));
        return _mm256_mul_ps(v, _mm256_min_ps(_mm256_max_ps(g, _mm256_setzero_ps()), _mm256_set1_ps(1.0f)));
    }
    case SDRT_ACT_SILU: { /* v / (1 + exp(-lo v)), exp's argument clamped at 88 */
        const __m256 z = _mm256_min_ps(_mm256_mul_ps(v, _mm256_sub_ps(_mm256_setzero_ps(), e->lo)), _mm256_set1_ps(88.0f));
        return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(z)));
    }
    case SDRT_ACT_GELU_TANH: { /* v / (1 + exp(v (-G1 - G3 v^2))), exp's argument clamped at 88 */
        const __m256 q = _mm256_fnmadd_ps(_mm256_mul_ps(v, v), _mm256_set1_ps(SDRT_GELU_G3), _mm256_set1_ps(-SDRT_GELU_G1));
        const __m256 z = _mm256_min_ps(_mm256_mul_ps(v, q), _mm256_set1_ps(88.0f));
        return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(z)));
    }
    default:
        return v;
    }
}

INLINE_AVX2 __m256 act256_apply(const act256 *e, __m256 v) { return act256_k(e->act, e, v); }

/* r[i] = row i of an 8 x 8 block on entry, column i on return */
INLINE_AVX2 void transpose8(__m256 *r) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* lanes 0 .. m-1 (m < 8) of v to p by plain 16-, 8- and 4-byte stores, no masked store */
INLINE_AVX2 void store_lanes(float *p, __m256 v, int m) {
    __m128 q = _mm256_castps256_ps128(v);
    if (m >= 4) {
        _mm_storeu_ps(p, q);
        q = _mm256_extractf128_ps(v, 1);
        p += 4;
        m -= 4;
    }
    if (m & 2) {
        _mm_storel_pi((__m64 *)(void *)p, q);
        q = _mm_movehl_ps(q, q);
        p += 2;
    }
    if (m & 1)
        _mm_store_ss(p, q);
}

/* one row's 8 columns to C (full vector, or masked at the edge): + C (acc), else + the bias;
 * then, with the last block of K, + the residual and the activation */
INLINE_AVX2 void st8(float *p, const float *res, __m256 v, int nv, __m256 add, const sdrt_tile_out *o,
                     const act256 *e) {
    if (nv >= 8) {
        v = _mm256_add_ps(v, o->acc ? _mm256_loadu_ps(p) : add);
        if (res)
            v = _mm256_add_ps(v, _mm256_loadu_ps(res));
        _mm256_storeu_ps(p, act256_apply(e, v));
    } else if (nv > 0) {
        const __m256i m = MASK8(nv);
        v = _mm256_add_ps(v, o->acc ? _mm256_maskload_ps(p, m) : add);
        if (res)
            v = _mm256_add_ps(v, _mm256_maskload_ps(res, m));
        _mm256_maskstore_ps(p, m, act256_apply(e, v));
    }
}

/* rows as named variables (not arrays: GCC kept array accumulators on the stack, with a store
 * per FMA, at half speed); rows i >= MR are dead code */
#define R256_DECL(i) __m256 c0_##i = _mm256_setzero_ps(), c1_##i = _mm256_setzero_ps();
#define R256_STEP(i) \
    if (mr_ > i) { \
        const __m256 ai = _mm256_broadcast_ss(a + i * lda + k); \
        c0_##i = _mm256_fmadd_ps(ai, b0, c0_##i); \
        c1_##i = _mm256_fmadd_ps(ai, b1, c1_##i); \
    }
/* the same for a slice whose valid columns all lie in its first 8 (o->n <= 8: the last slice of
 * a 49-pixel map, 3 x 16 + 1): half the multiply-adds; c1 stays zero and is never stored */
#define R256_STEP_HALF(i) \
    if (mr_ > i) \
        c0_##i = _mm256_fmadd_ps(_mm256_broadcast_ss(a + i * lda + k), b0, c0_##i);
#define R256_PREFETCH(i) \
    if (mr_ > i) \
        _mm_prefetch((const char *)(pf + i * lda + k), _MM_HINT_T0);
#define R256_STORE(i) \
    if (mr_ > i && i < o->m) { \
        float *cr = o->c + i * o->ldc; \
        const float *rr = res ? res + i * o->ldres : NULL; \
        const __m256 ri = o->rbias && !o->acc ? _mm256_set1_ps(o->rbias[i]) : zero; \
        st8(cr, rr, c0_##i, o->n, _mm256_add_ps(bv0, ri), o, &e); \
        st8(cr + 8, rr ? rr + 8 : NULL, c1_##i, o->n - 8, _mm256_add_ps(bv1, ri), o, &e); \
    }
#define R256_TILE(i) \
    if (mr_ > i) { \
        _mm256_store_ps(tile + i * 16, c0_##i); \
        _mm256_store_ps(tile + i * 16 + 8, c1_##i); \
    }
#define R256_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5)

/* the epilogue of a 16-column tile: row-major C from the registers, transposed C through a tile */
#define R256_EPILOGUE \
    if (o->trans) { \
        SDRT_ALIGN(32) float tile[mr_ * 16]; \
        R256_ALL(R256_TILE) \
        sdrt_store_tile(tile, 16, o); \
        return; \
    } \
    R256_EPILOGUE_ROWS

/* one full row of 16 columns: + C (a later block of K) or + the biases, then with the last
 * block of K + the residual and the activation ACT_ (a constant in each case of the switch below) */
#define R256_STORE_FULL(i) \
    if (mr_ > i && i < o->m) { \
        float *cr = o->c + i * o->ldc; \
        __m256 v0, v1; \
        if (acc_) { \
            v0 = _mm256_add_ps(c0_##i, _mm256_loadu_ps(cr)); \
            v1 = _mm256_add_ps(c1_##i, _mm256_loadu_ps(cr + 8)); \
        } else { \
            const __m256 ri = _mm256_broadcast_ss(rb_ + i); \
            v0 = _mm256_add_ps(c0_##i, _mm256_add_ps(bv0, ri)); \
            v1 = _mm256_add_ps(c1_##i, _mm256_add_ps(bv1, ri)); \
        } \
        if (res) { \
            v0 = _mm256_add_ps(v0, _mm256_loadu_ps(res + i * o->ldres)); \
            v1 = _mm256_add_ps(v1, _mm256_loadu_ps(res + i * o->ldres + 8)); \
        } \
        _mm256_storeu_ps(cr, act256_k(ACT_, &e, v0)); \
        _mm256_storeu_ps(cr + 8, act256_k(ACT_, &e, v1)); \
    }
#define R256_ROWS_ACT(A) \
    case A: { \
        enum { ACT_ = A }; \
        R256_ALL(R256_STORE_FULL) \
        break; \
    }

/* the row-major epilogue alone. A full-width tile (nearly every tile) takes the short path: the
 * activation chosen once a tile, not once a vector, and no masks (the general path's tests cost as
 * much as 10 k steps a call: a small-K call ran at 75-80% of the kernel's speed) */
#define R256_EPILOGUE_ROWS \
    if (o->n >= 16) { \
        const int acc_ = o->acc; \
        const float *rb_ = o->rbias ? o->rbias : zero_rows; \
        const __m256 bv0 = o->bias && !o->acc ? _mm256_loadu_ps(o->bias) : _mm256_setzero_ps(); \
        const __m256 bv1 = o->bias && !o->acc ? _mm256_loadu_ps(o->bias + 8) : _mm256_setzero_ps(); \
        const act256 e = act256_of(o); \
        const float *res = o->last ? o->res : NULL; \
        switch (e.act) { \
            R256_ROWS_ACT(SDRT_ACT_RELU) \
            R256_ROWS_ACT(SDRT_ACT_CLIP) \
            R256_ROWS_ACT(SDRT_ACT_HARDSWISH) \
            R256_ROWS_ACT(SDRT_ACT_SILU) \
            R256_ROWS_ACT(SDRT_ACT_GELU_TANH) \
            default: { \
                enum { ACT_ = SDRT_ACT_NONE }; \
                R256_ALL(R256_STORE_FULL) \
            } \
        } \
    } else { \
        R256_EPILOGUE_ROWS_ALL \
    }

#define R256_EPILOGUE_ROWS_ALL \
    const __m256 zero = _mm256_setzero_ps(); \
    __m256 bv0 = zero, bv1 = zero; \
    if (o->bias && !o->acc) { \
        bv0 = _mm256_maskload_ps(o->bias, MASK8(o->n)); \
        bv1 = _mm256_maskload_ps(o->bias + 8, MASK8(o->n - 8)); \
    } \
    const act256 e = act256_of(o); \
    const float *res = o->last ? o->res : NULL; \
    R256_ALL(R256_STORE)

/* an mr x 16 tile (c0: columns 0-7, c1: 8-15; mr <= 6) stored transposed, column j of the tile to C's row j (the
 * cols route: pixels along the tile's rows, NCHW out): two 8 x 8 transposes, then each of the n rows of C its m
 * pixels with the epilogue (a scalar store per value cost as much as the products at K = 16: MobileNetV2's 16 -> 96
 * conv at 112 x 112 ran 12x slower) */
INLINE_AVX2 void store256_trans(const __m256 *c0, const __m256 *c1, int MR, const sdrt_tile_out *o) {
    const int m = o->m < MR ? o->m : MR;
    const act256 e = act256_of(o);
    const float *res = o->last ? o->res : NULL;
    const __m256i rows = MASK8(m);
    const __m256 zero = _mm256_setzero_ps();
    const __m256 rb = o->rbias && !o->acc ? _mm256_maskload_ps(o->rbias, rows) : zero;
    for (int h = 0; h < 2 && 8 * h < o->n; h++) {
        __m256 r[8];
        for (int i = 0; i < 8; i++)
            r[i] = i < MR ? (h ? c1[i] : c0[i]) : zero;
        transpose8(r);
        const int nh = o->n - 8 * h < 8 ? o->n - 8 * h : 8;
        for (int j = 0; j < nh; j++) {
            __m256 v = r[j];
            float *c = o->c + (8 * h + j) * o->ldc;
            if (o->acc)
                v = _mm256_add_ps(v, _mm256_maskload_ps(c, rows));
            else
                v = _mm256_add_ps(v, o->bias ? _mm256_add_ps(rb, _mm256_set1_ps(o->bias[8 * h + j])) : rb);
            if (res)
                v = _mm256_add_ps(v, _mm256_maskload_ps(res + (8 * h + j) * o->ldres, rows));
            store_lanes(c, act256_apply(&e, v), m);
        }
    }
}

/* The B rows o->pfb names (weights read from memory: the next panel's share for this call), prefetched into
 * L2 a few at a time every 16 steps of k. Issued as one burst before the call, they queued behind each other's
 * misses: on Zen 5, one thread, weights from memory, CLIP's 77-row products ran at 175-185 GFLOPS that way and
 * 215-230 spread (docs/ggml.md). */
#define PFB_DECL(STEPS) \
    const char *pfb_ = o->pfb; \
    int pfb_left_ = o->pfb ? o->pfb_rows : 0; \
    const int pfb_steps_ = (STEPS) >= 16 ? (STEPS) / 16 : 1; /* the loop's prefetch points (at least) */ \
    const int pfb_per_ = (pfb_left_ + pfb_steps_ - 1) / pfb_steps_;
#define PFB_STEP \
    for (int j_ = 0; j_ < pfb_per_ && pfb_left_ > 0; j_++, pfb_left_--, pfb_ += 64) { \
        _mm_prefetch(pfb_, _MM_HINT_T1); \
        _mm_prefetch(pfb_ + o->pfb_half, _MM_HINT_T1); \
    }
/* the k loop over a packed half-panel (row k at b + 16 k) with STEP per row of A; PF (the next
 * tile's A rows prefetched) once per 16 k, no test per k. b1 goes unused (and unloaded) in the
 * half-width STEP. */
#define R256_KLOOP(STEP, PF) \
    int k = 0; \
    for (; k + 16 <= K;) { \
        PF \
        for (const int k1 = k + 16; k < k1; k++) { \
            const __m256 b0 = _mm256_loadu_ps(b + (ptrdiff_t)k * SDRT_HALF); \
            const __m256 b1 = _mm256_loadu_ps(b + (ptrdiff_t)k * SDRT_HALF + 8); \
            (void)b1; \
            R256_ALL(STEP) \
        } \
    } \
    for (; k < K; k++) { \
        const __m256 b0 = _mm256_loadu_ps(b + (ptrdiff_t)k * SDRT_HALF); \
        const __m256 b1 = _mm256_loadu_ps(b + (ptrdiff_t)k * SDRT_HALF + 8); \
        (void)b1; \
        R256_ALL(STEP) \
    }
/* the same with B's rows by offsets (row k at b + off[k]) */
#define R256_ILOOP(STEP) \
    for (int k = 0; k < K; k++) { \
        const float *bk = b + off[k]; \
        const __m256 b0 = _mm256_loadu_ps(bk); \
        const __m256 b1 = _mm256_loadu_ps(bk + 8); \
        (void)b1; \
        if ((k & 15) == 0) { \
            R256_ALL(R256_PREFETCH) \
        } \
        R256_ALL(STEP) \
    }

/* A stored by columns (k256c, the cols route's 16-column half panels: A(i, k) = a[k lda + i], as k512c) */
#define R256C_AHEAD 8
#define R256C_SAVE(i) \
    if (mr_ > i) { \
        c0[i] = c0_##i; \
        c1[i] = c1_##i; \
    }
#define R256C_STEP(i) \
    if (mr_ > i) { \
        const __m256 ai = _mm256_broadcast_ss(ap + i); \
        c0_##i = _mm256_fmadd_ps(ai, b0, c0_##i); \
        c1_##i = _mm256_fmadd_ps(ai, b1, c1_##i); \
    }

/* 16 columns (12 accumulators), B rows packed (one half of a panel: row k at b + 16 k), by offsets, or (k256c) with
 * A by columns */
#define K256(MR) \
    static TARGET_AVX2 void k256_##MR(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, \
                                      const sdrt_tile_out *o, const float *pf) { \
        enum { mr_ = MR }; \
        (void)bh; \
        R256_ALL(R256_DECL) \
        PFB_DECL(K) \
        if (o->n <= 8) { \
            R256_KLOOP(R256_STEP_HALF, R256_ALL(R256_PREFETCH) PFB_STEP) \
        } else { \
            R256_KLOOP(R256_STEP, R256_ALL(R256_PREFETCH) PFB_STEP) \
        } \
        R256_EPILOGUE \
    } \
    static TARGET_AVX2 void k256m_##MR(int K, const float *a, ptrdiff_t lda, const float *bp, ptrdiff_t pstride, \
                                       int slices, const sdrt_tile_out *o_, const float *pf) { \
        enum { mr_ = MR }; \
        sdrt_tile_out ol = *o_; \
        const sdrt_tile_out *o = &ol; \
        const ptrdiff_t cstep = ol.trans ? 16 * ol.ldc : 16, rstep = ol.trans ? 16 * ol.ldres : 16; \
        for (int sl = 0; sl < slices && ol.n > 0; sl++) { \
            const float *b = bp + (ptrdiff_t)(sl >> 1) * pstride + (sl & 1) * (pstride / 2); \
            R256_ALL(R256_DECL) \
            if (ol.n <= 8) { \
                R256_KLOOP(R256_STEP_HALF, if (sl == 0) { R256_ALL(R256_PREFETCH) }) \
            } else { \
                R256_KLOOP(R256_STEP, if (sl == 0) { R256_ALL(R256_PREFETCH) }) \
            } \
            const int left = ol.n; \
            ol.n = left < 16 ? left : 16; \
            if (ol.trans) { \
                SDRT_ALIGN(32) float tile[mr_ * 16]; \
                R256_ALL(R256_TILE) \
                sdrt_store_tile(tile, 16, o); \
            } else { \
                R256_EPILOGUE_ROWS \
            } \
            ol.n = left - 16; \
            ol.c += cstep; \
            ol.res = ol.res ? ol.res + rstep : NULL; \
            ol.bias = ol.bias ? ol.bias + 16 : NULL; \
        } \
    } \
    static TARGET_AVX2 void k256i_##MR(int K, const float *a, ptrdiff_t lda, const float *b, const int32_t *off, \
                                       const sdrt_tile_out *o, const float *pf) { \
        enum { mr_ = MR }; \
        R256_ALL(R256_DECL) \
        if (o->n <= 8) { \
            R256_ILOOP(R256_STEP_HALF) \
        } else { \
            R256_ILOOP(R256_STEP) \
        } \
        R256_EPILOGUE \
    } \
    static TARGET_AVX2 void k256c_##MR(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, \
                                       const sdrt_tile_out *o, const float *pf) { \
        enum { mr_ = MR }; \
        (void)bh; \
        (void)pf; \
        R256_ALL(R256_DECL) \
        const float *ap = a; \
        for (int k = 0; k < K; k++, ap += lda) { \
            const __m256 b0 = _mm256_loadu_ps(b + (ptrdiff_t)k * SDRT_HALF); \
            const __m256 b1 = _mm256_loadu_ps(b + (ptrdiff_t)k * SDRT_HALF + 8); \
            _mm_prefetch((const char *)(ap + R256C_AHEAD * lda), _MM_HINT_T0); \
            _mm_prefetch((const char *)(ap + R256C_AHEAD * lda + mr_ - 1), _MM_HINT_T0); \
            R256_ALL(R256C_STEP) \
        } \
        __m256 c0[MR], c1[MR]; \
        R256_ALL(R256C_SAVE) \
        store256_trans(c0, c1, MR, o); \
    }
K256(1)
K256(2)
K256(3)
K256(4)
K256(5)
K256(6)

static const sdrt_isa_kernels avx2 = {"avx2", 6, 16, 384, {NULL, k256_1, k256_2, k256_3, k256_4, k256_5, k256_6},
                                      {NULL, k256i_1, k256i_2, k256i_3, k256i_4, k256i_5, k256i_6},
                                      {NULL, k256m_1, k256m_2, k256m_3, k256m_4, k256m_5, k256m_6},
                                      1,
                                      {NULL, k256c_1, k256c_2, k256c_3, k256c_4, k256c_5, k256c_6}};

/* 16x16 transpose in registers: r[i] holds row i on entry, column i on return */
INLINE_AVX512 void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* r[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c */
    for (int c = 0; c < 4; c++) {
        const __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
        const __m512 u2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
        const __m512 u3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
        t[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
        t[8 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
    }
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

INLINE_AVX512 __mmask16 mask16(int n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u); }

INLINE_AVX512 __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 m = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 n = _mm512_sub_ps(m, magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(m), _mm512_castps_si512(magic));
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(ni, 23)));
}

/* activation `act` with ep's bounds (a constant act folds to one case) */
INLINE_AVX512 __m512 act512_k(int act, const sdrt_epilogue *ep, __m512 v) {
    switch (act) {
    case SDRT_ACT_RELU:
        return _mm512_max_ps(v, _mm512_setzero_ps());
    case SDRT_ACT_CLIP:
        return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(ep->lo)), _mm512_set1_ps(ep->hi));
    case SDRT_ACT_HARDSWISH: {
        const __m512 g = _mm512_fmadd_ps(v, _mm512_set1_ps(1.0f / 6.0f), _mm512_set1_ps(0.5f));
        return _mm512_mul_ps(v, _mm512_min_ps(_mm512_max_ps(g, _mm512_setzero_ps()), _mm512_set1_ps(1.0f)));
    }
    case SDRT_ACT_SILU: {
        const __m512 z = _mm512_min_ps(_mm512_mul_ps(v, _mm512_set1_ps(-ep->lo)), _mm512_set1_ps(88.0f));
        return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(z)));
    }
    case SDRT_ACT_GELU_TANH: {
        const __m512 q = _mm512_fnmadd_ps(_mm512_mul_ps(v, v), _mm512_set1_ps(SDRT_GELU_G3), _mm512_set1_ps(-SDRT_GELU_G1));
        const __m512 z = _mm512_min_ps(_mm512_mul_ps(v, q), _mm512_set1_ps(88.0f));
        return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(z)));
    }
    default:
        return v;
    }
}

INLINE_AVX512 __m512 act512(const sdrt_epilogue *ep, __m512 v) { return ep ? act512_k(ep->act, ep, v) : v; }

/* the rows of a full-width (32-column) row-major tile: + C (a later block of K) or + the biases,
 * then + the residual and activation `act` (a constant in each call below). The general store's
 * tests and masks per row cost as much as several k steps a call (measured on AVX2, whose kernels
 * have the same short path) */
INLINE_AVX512 void store512_full(const __m512 *c0, const __m512 *c1, int MR, const sdrt_tile_out *o, int act,
                                 const sdrt_epilogue *ep, const float *res) {
    const int acc = o->acc;
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (o->bias && !acc) {
        b0 = _mm512_loadu_ps(o->bias);
        b1 = _mm512_loadu_ps(o->bias + 16);
    }
    const float *rb = o->rbias && !acc ? o->rbias : zero_rows;
    for (int i = 0; i < MR && i < o->m; i++) {
        float *c = o->c + i * o->ldc;
        __m512 v0, v1;
        if (acc) {
            v0 = _mm512_add_ps(c0[i], _mm512_loadu_ps(c));
            v1 = _mm512_add_ps(c1[i], _mm512_loadu_ps(c + 16));
        } else {
            const __m512 ri = _mm512_set1_ps(rb[i]);
            v0 = _mm512_add_ps(c0[i], _mm512_add_ps(b0, ri));
            v1 = _mm512_add_ps(c1[i], _mm512_add_ps(b1, ri));
        }
        if (res) {
            v0 = _mm512_add_ps(v0, _mm512_loadu_ps(res + i * o->ldres));
            v1 = _mm512_add_ps(v1, _mm512_loadu_ps(res + i * o->ldres + 16));
        }
        _mm512_storeu_ps(c, act512_k(act, ep, v0));
        _mm512_storeu_ps(c + 16, act512_k(act, ep, v1));
    }
}

/* the accumulators of an mr x 32 tile (c0: columns 0-15, c1: 16-31) to their place in C */
INLINE_AVX512 void store512(const __m512 *c0, const __m512 *c1, int MR, const sdrt_tile_out *o) {
    const __mmask16 m0 = mask16(o->n), m1 = mask16(o->n - 16);
    const sdrt_epilogue *ep = o->last ? o->ep : NULL;
    const float *res = o->last ? o->res : NULL;
    if (!o->trans && o->n >= 32) {
        switch (ep ? ep->act : SDRT_ACT_NONE) {
        case SDRT_ACT_RELU:
            store512_full(c0, c1, MR, o, SDRT_ACT_RELU, ep, res);
            return;
        case SDRT_ACT_CLIP:
            store512_full(c0, c1, MR, o, SDRT_ACT_CLIP, ep, res);
            return;
        case SDRT_ACT_HARDSWISH:
            store512_full(c0, c1, MR, o, SDRT_ACT_HARDSWISH, ep, res);
            return;
        case SDRT_ACT_SILU:
            store512_full(c0, c1, MR, o, SDRT_ACT_SILU, ep, res);
            return;
        case SDRT_ACT_GELU_TANH:
            store512_full(c0, c1, MR, o, SDRT_ACT_GELU_TANH, ep, res);
            return;
        default:
            store512_full(c0, c1, MR, o, SDRT_ACT_NONE, ep, res);
            return;
        }
    }
    if (!o->trans) {
        __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
        if (o->bias && !o->acc) {
            b0 = _mm512_maskz_loadu_ps(m0, o->bias);
            b1 = _mm512_maskz_loadu_ps(m1, o->bias + 16);
        }
        for (int i = 0; i < MR && i < o->m; i++) {
            float *c = o->c + i * o->ldc;
            __m512 a0 = b0, a1 = b1;
            if (o->acc) {
                a0 = _mm512_maskz_loadu_ps(m0, c);
                a1 = _mm512_maskz_loadu_ps(m1, c + 16);
            } else if (o->rbias) {
                const __m512 ri = _mm512_set1_ps(o->rbias[i]);
                a0 = _mm512_add_ps(a0, ri);
                a1 = _mm512_add_ps(a1, ri);
            }
            __m512 v0 = _mm512_add_ps(c0[i], a0), v1 = _mm512_add_ps(c1[i], a1);
            if (res) {
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, res + i * o->ldres));
                v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, res + i * o->ldres + 16));
            }
            _mm512_mask_storeu_ps(c, m0, act512(ep, v0));
            if (m1)
                _mm512_mask_storeu_ps(c + 16, m1, act512(ep, v1));
        }
        return;
    }
    const __mmask16 rows = mask16(o->m);
    for (int h = 0; h < 2 && 16 * h < o->n; h++) {
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < MR ? (h ? c1[i] : c0[i]) : _mm512_setzero_ps();
        transpose16(r);
        const int nh = o->n - 16 * h < 16 ? o->n - 16 * h : 16;
        for (int j = 0; j < nh; j++) {
            __m512 v = r[j];
            float *c = o->c + (16 * h + j) * o->ldc;
            if (o->acc)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rows, c));
            else {
                if (o->bias)
                    v = _mm512_add_ps(v, _mm512_set1_ps(o->bias[16 * h + j]));
                if (o->rbias)
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rows, o->rbias));
            }
            if (res)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rows, res + (16 * h + j) * o->ldres));
            _mm512_mask_storeu_ps(c, rows, act512(ep, v));
        }
    }
}

#define FMA_BCAST(acc, b, p) (acc) = _mm512_fmadd_ps(_mm512_set1_ps(*(p)), (b), (acc))

/* rows as named variables (not arrays), so that the accumulators surely stay in registers;
 * rows i >= MR are dead code. (An FMA with an embedded {1to16} broadcast from memory, in inline
 * assembly, measured the same as the compiler's separate broadcast here.) */
#define R512_DECL(i) __m512 c0_##i = _mm512_setzero_ps(), c1_##i = _mm512_setzero_ps();
#define R512_STEP(i) \
    if (mr_ > i) { \
        FMA_BCAST(c0_##i, b0, a + i * lda + k); \
        FMA_BCAST(c1_##i, b1, a + i * lda + k); \
    }
#define R512_PREFETCH(i) \
    if (mr_ > i) \
        _mm_prefetch((const char *)(pf + i * lda + k), _MM_HINT_T0);
#define R512_SAVE(i) \
    if (mr_ > i) { \
        c0[i] = c0_##i; \
        c1[i] = c1_##i; \
    }
#define R512_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)

/* The kernel body for a run-time lda (A read in place): every row's element as base + index x scale, from three
 * base pointers (rows 0, 5 and 10) and the row strides r, 2r, 3r (r3), 4r, so one loop carries three pointer
 * increments. Written with a row pointer each (a + i * lda + k), GCC kept an induction variable a row and spilled
 * four of the fourteen to the stack, adding to them there on every k. The empty asm makes r and r3 opaque inside
 * the loop, so that GCC cannot strength-reduce the addresses back into per-row variables. */
#if defined(__GNUC__) || defined(__clang__)
#define SDRT_OPAQUE(x) __asm__("" : "+r"(x))
#else
#define SDRT_OPAQUE(x) ((void)0)
#endif
#define R512R_OFF(j) ((j) == 0 ? (ptrdiff_t)0 : (j) == 1 ? r : (j) == 2 ? 2 * r : (j) == 3 ? r3 : 4 * r)
#define R512R_ROW(i) (((i) < 5 ? q0 : (i) < 10 ? q1 : q2) + R512R_OFF((i) % 5))
#define R512R_ELEM(i) (*(const float *)R512R_ROW(i))
/* the base pointers (elements of `esz` bytes, rows `lda_` elements apart), and their step to the next k, which
 * also makes the strides opaque for the next iteration */
#define R512R_ROWS(lda_, esz) \
    ptrdiff_t r = (lda_) * (ptrdiff_t)(esz), r3 = 3 * r; \
    const char *q0 = (const char *)a, *q1 = q0 + 5 * r, *q2 = q0 + 10 * r;
#define R512R_NEXT(esz) \
    q0 += (esz); \
    q1 += (esz); \
    q2 += (esz); \
    SDRT_OPAQUE(r); \
    SDRT_OPAQUE(r3);
#define R512R_STEP(i) \
    if (mr_ > i) { \
        const __m512 ab_ = _mm512_set1_ps(R512R_ELEM(i)); \
        c0_##i = _mm512_fmadd_ps(ab_, b0, c0_##i); \
        c1_##i = _mm512_fmadd_ps(ab_, b1, c1_##i); \
    }

/* The body of a kernel that reads A in place (rows addressed as R512R_STEP does), for a tile of MR rows: b0 and b1,
 * the two 16-column halves of B's row for step k, are loaded from the addresses B0 and B1 (MR: the tile's rows) */
#define K512R_LOOP(MR, B0, B1) \
    enum { mr_ = MR }; \
    R512_ALL(R512_DECL) \
    PFB_DECL(K) \
    R512R_ROWS(lda, sizeof(float)) \
    for (int k = 0; k < K; k++) { \
        const __m512 b0 = _mm512_loadu_ps(B0); \
        const __m512 b1 = _mm512_loadu_ps(B1); \
        if ((k & 15) == 0) { \
            R512_ALL(R512_PREFETCH) \
            PFB_STEP \
        } \
        R512_ALL(R512R_STEP) \
        R512R_NEXT(sizeof(float)) \
    } \
    __m512 c0[MR], c1[MR]; \
    R512_ALL(R512_SAVE) \
    store512(c0, c1, MR, o);

/* A stored by columns (k512c: A(i, k) = a[k lda + i], a NCHW plane's pixels i of input channel k, read in place by
 * the pointwise conv's cols route, native/conv.c): a k step's MR broadcasts are consecutive floats, fixed
 * displacements from one pointer that steps lda floats a k; the rows R512C_AHEAD k steps on are prefetched (one or
 * two lines a step, lda apart: a stride the hardware's prefetchers may not follow across pages), and B's two lines
 * 16 k steps on (a kxk conv's patches on a small map: B, the weights, streams from L3 once a call; 0.90 of the
 * time for a 512 -> 256 3x3 conv at 4 x 4, neutral on the MobileNets' pointwise convs). */
#define R512C_AHEAD 8
#define R512C_STEP(i) \
    if (mr_ > i) { \
        const __m512 ab_ = _mm512_set1_ps(ap[i]); \
        c0_##i = _mm512_fmadd_ps(ab_, b0, c0_##i); \
        c1_##i = _mm512_fmadd_ps(ab_, b1, c1_##i); \
    }

/* The kernel body for a given lda: inlined into k512_MR once with each padded stride that gemm.c's copy of an
 * A block uses (SDRT_LDA_COPY128 / 256, compile-time constants: each row's broadcast is then a fixed
 * displacement from one pointer). Any other lda (A read in place) goes to k512r_MR (K512R_LOOP). */
#define K512(MR) \
    INLINE_AVX512 void k512b_##MR(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, \
                                  const sdrt_tile_out *o, const float *pf) { \
        enum { mr_ = MR }; \
        R512_ALL(R512_DECL) \
        PFB_DECL(K) \
        for (int k = 0; k < K; k++) { \
            const __m512 b0 = _mm512_loadu_ps(b + (ptrdiff_t)k * SDRT_HALF); \
            const __m512 b1 = _mm512_loadu_ps(b + bh + (ptrdiff_t)k * SDRT_HALF); \
            if ((k & 15) == 0) { \
                R512_ALL(R512_PREFETCH) \
                PFB_STEP \
            } \
            R512_ALL(R512_STEP) \
        } \
        __m512 c0[MR], c1[MR]; \
        R512_ALL(R512_SAVE) \
        store512(c0, c1, MR, o); \
    } \
    INLINE_AVX512 void k512r_##MR(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, \
                                  const sdrt_tile_out *o, const float *pf) { \
        K512R_LOOP(MR, b + (ptrdiff_t)k * SDRT_HALF, b + bh + (ptrdiff_t)k * SDRT_HALF) \
    } \
    static TARGET_AVX512 void k512_##MR(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, \
                                        const sdrt_tile_out *o, const float *pf) { \
        if (lda == SDRT_LDA_COPY256) \
            k512b_##MR(K, a, SDRT_LDA_COPY256, b, bh, o, pf); \
        else if (lda == SDRT_LDA_COPY128) \
            k512b_##MR(K, a, SDRT_LDA_COPY128, b, bh, o, pf); \
        else \
            k512r_##MR(K, a, lda, b, bh, o, pf); \
    } \
    static TARGET_AVX512 void k512i_##MR(int K, const float *a, ptrdiff_t lda, const float *b, const int32_t *off, \
                                         const sdrt_tile_out *o, const float *pf) { \
        K512R_LOOP(MR, b + off[k], b + off[k] + 16) \
    } \
    static TARGET_AVX512 void k512c_##MR(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, \
                                         const sdrt_tile_out *o, const float *pf) { \
        enum { mr_ = MR }; \
        (void)pf; \
        R512_ALL(R512_DECL) \
        const float *ap = a; \
        for (int k = 0; k < K; k++, ap += lda) { \
            const __m512 b0 = _mm512_loadu_ps(b + (ptrdiff_t)k * SDRT_HALF); \
            const __m512 b1 = _mm512_loadu_ps(b + bh + (ptrdiff_t)k * SDRT_HALF); \
            _mm_prefetch((const char *)(ap + R512C_AHEAD * lda), _MM_HINT_T0); \
            _mm_prefetch((const char *)(ap + R512C_AHEAD * lda + mr_ - 1), _MM_HINT_T0); \
            _mm_prefetch((const char *)(b + (ptrdiff_t)(k + 16) * SDRT_HALF), _MM_HINT_T0); \
            _mm_prefetch((const char *)(b + bh + (ptrdiff_t)(k + 16) * SDRT_HALF), _MM_HINT_T0); \
            R512_ALL(R512C_STEP) \
        } \
        __m512 c0[MR], c1[MR]; \
        R512_ALL(R512_SAVE) \
        store512(c0, c1, MR, o); \
    }
K512(1)
K512(2)
K512(3)
K512(4)
K512(5)
K512(6)
K512(7)
K512(8)
K512(9)
K512(10)
K512(11)
K512(12)
K512(13)
K512(14)

#ifndef SDRT_KC512
#define SDRT_KC512 256
#endif
static const sdrt_isa_kernels avx512 = {
    "avx512", 14, 32, SDRT_KC512,
    {NULL, k512_1, k512_2, k512_3, k512_4, k512_5, k512_6, k512_7, k512_8, k512_9, k512_10, k512_11, k512_12,
     k512_13, k512_14},
    {NULL, k512i_1, k512i_2, k512i_3, k512i_4, k512i_5, k512i_6, k512i_7, k512i_8, k512i_9, k512i_10, k512i_11,
     k512i_12, k512i_13, k512i_14},
    {NULL},
    1,
    {NULL, k512c_1, k512c_2, k512c_3, k512c_4, k512c_5, k512c_6, k512c_7, k512c_8, k512c_9, k512c_10, k512c_11,
     k512c_12, k512c_13, k512c_14}};

/* ---- AVX-512-BF16: vdpbf16ps ----------------------------------------------------------
 * The same register tile as the float32 AVX-512 kernel (mr <= 14, 28 accumulators), one vdpbf16ps
 * per accumulator a pair of K: 2 multiply-adds a lane an instruction where vfmadd231ps does 1, and B
 * half the bytes. A's pair (k, k + 1) is broadcast as one 32-bit value; B's pair row of a half is
 * one vector. GCC 10 and Clang 9 on have the intrinsics (MSVC: the float32 kernels widen bf16). */
#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10) || (defined(__clang__) && __clang_major__ >= 9)
#define SDRT_HAVE_BF16 1
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define AS_BH(v) ((__m512bh)(v))
#define AS_SI(v) ((__m512i)(v))

#define RBF_DECL(i) __m512 c0_##i = _mm512_setzero_ps(), c1_##i = _mm512_setzero_ps();
#define RBF_STEP(i) \
    if (mr_ > i) { \
        const __m512bh ai = AS_BH(_mm512_set1_epi32(*(const int *)R512R_ROW(i))); \
        c0_##i = _mm512_dpbf16_ps(c0_##i, ai, b0); \
        c1_##i = _mm512_dpbf16_ps(c1_##i, ai, b1); \
    }
#define RBF_PREFETCH(i) \
    if (mr_ > i) \
        _mm_prefetch((const char *)(a + i * lda + p + 16), _MM_HINT_T0);

#define KBF(MR) \
    static TARGET_BF16 void kbf_##MR(int K2, const uint32_t *a, ptrdiff_t lda, const uint16_t *b, ptrdiff_t bh, \
                                     const sdrt_tile_out *o) { \
        enum { mr_ = MR }; \
        R512_ALL(RBF_DECL) \
        R512R_ROWS(lda, sizeof(uint32_t)) \
        PFB_DECL(K2) \
        for (int p = 0; p < K2; p++) { \
            const __m512bh b0 = AS_BH(_mm512_loadu_si512((const void *)(b + (ptrdiff_t)p * SDRT_BF16_NR))); \
            const __m512bh b1 = AS_BH(_mm512_loadu_si512((const void *)(b + bh + (ptrdiff_t)p * SDRT_BF16_NR))); \
            if ((p & 15) == 0) { \
                R512_ALL(RBF_PREFETCH) \
                PFB_STEP \
            } \
            R512_ALL(RBF_STEP) \
            R512R_NEXT(sizeof(uint32_t)) \
        } \
        __m512 c0[MR], c1[MR]; \
        R512_ALL(R512_SAVE) \
        store512(c0, c1, MR, o); \
    }
KBF(1)
KBF(2)
KBF(3)
KBF(4)
KBF(5)
KBF(6)
KBF(7)
KBF(8)
KBF(9)
KBF(10)
KBF(11)
KBF(12)
KBF(13)
KBF(14)

/* rows of float A -> bf16 pairs: 32 floats a step (vcvtne2ps2bf16 keeps their order), a masked tail
 * (its missing floats zeros: an odd k's last pair ends in 0) */
static TARGET_BF16 void cvt_rows_bf16(int m, int k, const float *a, ptrdiff_t lda, uint32_t *dst, ptrdiff_t ld2) {
    for (int i = 0; i < m; i++) {
        const float *src = a + (ptrdiff_t)i * lda;
        uint16_t *d = (uint16_t *)(dst + (ptrdiff_t)i * ld2);
        int j = 0;
        for (; j + 32 <= k; j += 32) {
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + j + 16), _mm512_loadu_ps(src + j));
            _mm512_storeu_si512((void *)(d + j), AS_SI(v));
        }
        if (j < k) {
            const int left = k - j, pairs = (left + 1) / 2;
            const __m512 lo = _mm512_maskz_loadu_ps(mask16(left), src + j);
            const __m512 hi = _mm512_maskz_loadu_ps(mask16(left - 16), src + j + 16);
            const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
            _mm512_mask_storeu_epi16(d + j, (__mmask32)(pairs >= 16 ? 0xFFFFFFFFu : (1u << (2 * pairs)) - 1u), AS_SI(v));
        }
    }
}

/* a float panel [half][rows][16] -> bf16 [half][ceil(rows / 2)][16][2]: two rows a step converted
 * together, then their columns interleaved (the pair of each column side by side) */
static TARGET_BF16 void cvt_panel_bf16(int rows, const float *src, uint16_t *dst, ptrdiff_t dst_half) {
    static const uint16_t inter[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_loadu_si512((const void *)inter);
    const int k2 = (rows + 1) / 2;
    for (int h = 0; h < 2; h++) {
        const float *s = src + (ptrdiff_t)h * rows * SDRT_HALF;
        uint16_t *d = dst + h * dst_half;
        for (int p = 0; p < k2; p++) {
            const __m512 r0 = _mm512_loadu_ps(s + (ptrdiff_t)2 * p * SDRT_HALF);
            const __m512 r1 = 2 * p + 1 < rows ? _mm512_loadu_ps(s + (ptrdiff_t)(2 * p + 1) * SDRT_HALF) : _mm512_setzero_ps();
            const __m512i v = AS_SI(_mm512_cvtne2ps_pbh(r1, r0));
            _mm512_storeu_si512((void *)(d + (ptrdiff_t)p * SDRT_BF16_NR), _mm512_permutexvar_epi16(idx, v));
        }
    }
}

#define KBF_ALL {NULL, kbf_1, kbf_2, kbf_3, kbf_4, kbf_5, kbf_6, kbf_7, kbf_8, kbf_9, kbf_10, kbf_11, kbf_12, kbf_13, kbf_14}
static const sdrt_bf16_kernels bf16k = {"avx512bf16", 14, 256, KBF_ALL, cvt_rows_bf16, cvt_panel_bf16, NULL};

#if defined(SDRT_HAVE_AMX)
/* AMX: the same conversions; the products on tiles (amx.c), whose epilogue is store512's */
static const sdrt_bf16_kernels amxk = {"amx-bf16", 14, 256, KBF_ALL, cvt_rows_bf16, cvt_panel_bf16,
                                       sdrt_amx_block_bf16};

void TARGET_AVX512 sdrt_store512_16(const float *c0, const float *c1, const sdrt_tile_out *o) {
    store512((const __m512 *)(const void *)c0, (const __m512 *)(const void *)c1, 16, o);
}

void TARGET_AVX512 sdrt_store512_run(float *c, ptrdiff_t ldc, const float *v, int rows, int n, const float *bias,
                                     const float *res, const sdrt_epilogue *ep) {
    const __mmask16 m = mask16(n);
    for (int r = 0; r < rows; r++, c += ldc, v += 16) {
        __m512 x = _mm512_maskz_loadu_ps(m, v);
        if (bias)
            x = _mm512_add_ps(x, _mm512_set1_ps(bias[r]));
        if (res) {
            x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, res));
            res += ldc;
        }
        _mm512_mask_storeu_ps(c, m, act512(ep, x));
    }
}
#endif
#endif

const sdrt_bf16_kernels *sdrt_kernels_bf16(void) {
#if defined(SDRT_HAVE_BF16)
    static int has = -1;
    if (has < 0)
        has = sdrt_cpu_has(SDRT_ISA_AVX512) && sdrt_cpu_has_bf16();
    if (!has || sdrt_active_kernels() != &avx512)
        return NULL;
#if defined(SDRT_HAVE_AMX)
    if (sdrt_amx_enabled())
        return &amxk;
#endif
    return &bf16k;
#else
    return NULL;
#endif
}

const sdrt_isa_kernels *sdrt_kernels_avx2(void) { return sdrt_cpu_has(SDRT_ISA_AVX2) ? &avx2 : NULL; }
const sdrt_isa_kernels *sdrt_kernels_avx512(void) { return sdrt_cpu_has(SDRT_ISA_AVX512) ? &avx512 : NULL; }
#else
const sdrt_isa_kernels *sdrt_kernels_avx2(void) { return NULL; }
const sdrt_isa_kernels *sdrt_kernels_avx512(void) { return NULL; }
const sdrt_bf16_kernels *sdrt_kernels_bf16(void) { return NULL; }
#endif

/* ---- AArch64 NEON ------------------------------------------------------------------- */
#if defined(SDRT_ARM64)
#include <arm_neon.h>

SDRT_INLINE void kneon(int MR, int K, const float *a, ptrdiff_t lda, const float *b, const int32_t *off,
                       const sdrt_tile_out *o) {
    float tile[6 * 16];
    float32x4_t c[6][4];
    for (int i = 0; i < 6; i++)
        for (int q = 0; q < 4; q++)
            c[i][q] = vdupq_n_f32(0.0f);
    for (int k = 0; k < K; k++) {
        const float *bk = off ? b + off[k] : b + (ptrdiff_t)k * SDRT_HALF;
        const float32x4_t b0 = vld1q_f32(bk), b1 = vld1q_f32(bk + 4), b2 = vld1q_f32(bk + 8), b3 = vld1q_f32(bk + 12);
        SDRT_UNROLL for (int i = 0; i < MR; i++) {
            const float32x4_t ai = vdupq_n_f32(a[i * lda + k]);
            c[i][0] = vfmaq_f32(c[i][0], b0, ai);
            c[i][1] = vfmaq_f32(c[i][1], b1, ai);
            c[i][2] = vfmaq_f32(c[i][2], b2, ai);
            c[i][3] = vfmaq_f32(c[i][3], b3, ai);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int q = 0; q < 4; q++)
            vst1q_f32(tile + i * 16 + 4 * q, c[i][q]);
    sdrt_store_tile(tile, 16, o);
}

#define KNEON(MR) \
    static void kneon_##MR(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh, const sdrt_tile_out *o, \
                           const float *pf) { \
        (void)pf; \
        (void)bh; \
        kneon(MR, K, a, lda, b, NULL, o); \
    } \
    static void kneoni_##MR(int K, const float *a, ptrdiff_t lda, const float *b, const int32_t *off, \
                            const sdrt_tile_out *o, const float *pf) { \
        (void)pf; \
        kneon(MR, K, a, lda, b, off, o); \
    }
KNEON(1)
KNEON(2)
KNEON(3)
KNEON(4)
KNEON(5)
KNEON(6)

static const sdrt_isa_kernels neon = {"neon", 6, 16, 256, {NULL, kneon_1, kneon_2, kneon_3, kneon_4, kneon_5, kneon_6},
                                      {NULL, kneoni_1, kneoni_2, kneoni_3, kneoni_4, kneoni_5, kneoni_6},
                                      {NULL},
                                      0,
                                      {NULL}};
const sdrt_isa_kernels *sdrt_kernels_neon(void) { return &neon; }
#else
const sdrt_isa_kernels *sdrt_kernels_neon(void) { return NULL; }
#endif
