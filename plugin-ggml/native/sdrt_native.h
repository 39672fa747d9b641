/* sdrt-ggml native kernels: shared declarations.
 *
 * Plain C11, no dependency. The kernels are ggml custom ops (ggml_custom_4d): ggml's CPU
 * backend calls them as fun(dst, ith, nth, userdata) on each of its threads. ggml-python
 * installs no headers, so a tensor's fields are read through byte offsets that Python
 * passes in at load time (sdrt_set_tensor_layout, taken from ggml-python's ctypes
 * structure and checked there against ggml's own API before any kernel runs).
 *
 * Compiler support: GCC and Clang (per-function target attributes, __builtin_cpu_supports),
 * MSVC (intrinsics need no target attribute; CPUID for dispatch). Every ISA-specific
 * kernel is behind a compile-time guard, so a compiler or CPU with only some of them
 * still builds and runs the portable C path.
 */
#ifndef SDRT_NATIVE_H
#define SDRT_NATIVE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SDRT_EXPORT __declspec(dllexport)
#else
#define SDRT_EXPORT __attribute__((visibility("default")))
#endif

#if defined(_MSC_VER)
#define SDRT_RESTRICT __restrict
#define SDRT_ALIGN(n) __declspec(align(n))
#define SDRT_THREAD_LOCAL __declspec(thread)
#define SDRT_INLINE static __forceinline
#else
#define SDRT_RESTRICT restrict
#define SDRT_ALIGN(n) __attribute__((aligned(n)))
#define SDRT_THREAD_LOCAL _Thread_local
#define SDRT_INLINE static inline __attribute__((always_inline))
#endif

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#define SDRT_X86 1
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#define SDRT_ARM64 1
#endif

/* ISA ids (also the values of SDRT_GGML_GEMM_ISA / sdrt_gemm_set_isa) */
enum { SDRT_ISA_AUTO = -1, SDRT_ISA_PORTABLE = 0, SDRT_ISA_AVX2 = 1, SDRT_ISA_AVX512 = 2, SDRT_ISA_NEON = 3,
       SDRT_ISA_COUNT = 4 };

/* ---- ggml_tensor access through offsets (tensor.c) ---------------------------------- */
typedef struct {
    const int64_t *ne;
    const size_t *nb;
    char *data;
} sdrt_view;

/* the fields of a ggml_tensor* as a view; src(i) of a tensor */
sdrt_view sdrt_tensor_view(const void *tensor);
const void *sdrt_tensor_src(const void *tensor, int i);

/* row r of a tensor of ne (n0, ne[1], ne[2], ne[3]), counted over dims 1-3, as its indices */
typedef struct {
    int64_t i1, i2, i3;
} row_ix;

static inline row_ix row_ix_of(const int64_t *ne, int64_t r) {
    row_ix ix = {r % ne[1], r / ne[1] % ne[2], r / (ne[1] * ne[2])};
    return ix;
}

/* the first float of that row in view v (any strides) */
static inline float *row_at(sdrt_view v, row_ix ix) {
    return (float *)(v.data + (size_t)ix.i1 * v.nb[1] + (size_t)ix.i2 * v.nb[2] + (size_t)ix.i3 * v.nb[3]);
}

/* ---- the ops' thread pool (pool.c) ------------------------------------------------------------ */
typedef void (*sdrt_op_fn)(void *dst, int ith, int nth, void *userdata);
/* the calling thread's width (0 inside the pool's workers) */
int sdrt_pool_width(void);
/* the tasks an op of a fixed split (SDRT_POOLED) is cut into at `width`: width x SDRT_GGML_TASKS (4) */
int sdrt_pool_tasks(int width);
/* the tasks of an op whose threads share a counter (SDRT_POOLED_SHARED): width x SDRT_GGML_SHARED_TASKS (1) */
int sdrt_pool_shared_tasks(int width);
/* fn(dst, i, ntasks, userdata) for every i < ntasks, on the pool and the calling thread */
void sdrt_pool_run(sdrt_op_fn fn, void *dst, void *userdata, int ntasks);
/* An op's first line: where ggml calls it on one thread (nth 1) and the calling thread has a width
 * above one (sdrt_pool_set_width), the op's tasks run on the pool instead, and the op returns.
 * SDRT_POOLED: an op that splits its work by ith of nth, cut into several tasks per thread so that
 * a thread the OS holds back leaves only a small share that the others cannot take over.
 * SDRT_POOLED_SHARED: an op whose threads take units from a shared counter (GEMM, convs): one task
 * per thread (its nth sizes the units). */
#define SDRT_POOLED_N(fn, ntasks_of)                                                                   \
    do {                                                                                               \
        if (nth == 1) {                                                                                \
            const int pool_w_ = sdrt_pool_width();                                                     \
            if (pool_w_ > 1) {                                                                         \
                sdrt_pool_run((fn), dst, userdata, ntasks_of(pool_w_));                                \
                return;                                                                                \
            }                                                                                          \
        }                                                                                              \
    } while (0)
#define SDRT_POOLED(fn) SDRT_POOLED_N(fn, sdrt_pool_tasks)
#define SDRT_POOLED_SHARED(fn) SDRT_POOLED_N(fn, sdrt_pool_shared_tasks)

/* ---- GEMM (gemm.c, gemm_kernels.c) ------------------------------------------------- */
/* B panels are always NR = 32 columns wide, for every ISA, so packed weights do not depend
 * on which kernel runs them. A panel of k rows holds its columns as two halves of 16, one after
 * the other: [half][k][16], the second half 16 k floats on (half its size). So a 16-column
 * kernel's slice of B is k x 16 contiguous floats, which fill every L1 set and stream as one
 * run; in a [k][32] panel the rows of a half are 128 bytes apart, use half of the L1 sets,
 * and interleave with the other half's lines (3.5% of the CLIP text encoder's time on AVX2). */
#define SDRT_NR 32
#define SDRT_HALF 16
/* the row stride (floats) of gemm.c's copy of an A block of k <= 128 and k <= 256 columns: 64 bytes past a multiple
 * of 64, so that the rows of a tile fall in different L1 sets; the AVX-512 kernels have these two built in */
#define SDRT_LDA_COPY128 144
#define SDRT_LDA_COPY256 272
static inline ptrdiff_t sdrt_copy_lda(int k) {
    return k <= 128 ? SDRT_LDA_COPY128 : k <= 256 ? SDRT_LDA_COPY256 : (ptrdiff_t)((k + 15) & ~15) + 16;
}
/* the floats from a panel's first element to element (k, j), for a panel of `rows` rows */
static inline ptrdiff_t sdrt_panel_at(int rows, int k, int j) {
    return (j >= SDRT_HALF ? (ptrdiff_t)rows * SDRT_HALF : 0) + (ptrdiff_t)k * SDRT_HALF + j % SDRT_HALF;
}

/* what a product's last block of K does to each value v (after the biases): v += res, then an
 * activation */
enum { SDRT_ACT_NONE = 0, SDRT_ACT_RELU = 1, SDRT_ACT_CLIP = 2, SDRT_ACT_HARDSWISH = 3, SDRT_ACT_SILU = 4,
       SDRT_ACT_GELU_TANH = 5 };
/* GELU (tanh form): 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))) = v sigmoid(2 sqrt(2/pi) (v + 0.044715 v^3)),
 * computed as v / (1 + exp(v (-G1 - G3 v^2))), exp's argument clamped at 88 */
#define SDRT_GELU_G1 1.5957691216057308f  /* 2 sqrt(2/pi) */
#define SDRT_GELU_G3 0.07135481627159023f /* 2 sqrt(2/pi) 0.044715 */
typedef struct {
    int act;         /* SDRT_ACT_* */
    float lo, hi;    /* SDRT_ACT_CLIP's bounds; SDRT_ACT_SILU: v sigmoid(lo v) (lo = 1.702: CLIP's quick GELU) */
} sdrt_epilogue;

/* where a tile's results go: c[i*ldc + j] (rows of M), or transposed c[j*ldc + i] */
typedef struct {
    float *c;
    ptrdiff_t ldc;
    int trans;
    int m;              /* valid rows (<= the kernel's MR) */
    int n;              /* valid columns (<= the kernel's NR) */
    const float *bias;  /* per column j, already offset to the tile's first column; NULL for none */
    const float *rbias; /* per row i, already offset to the tile's first row; NULL for none */
    int acc;            /* add to what C holds (a later block of K) instead of overwriting it */
    int last;           /* the last block of K: apply res and ep */
    const float *res;   /* residual, laid out as C (res[i*ldres + j], or transposed), or NULL */
    ptrdiff_t ldres;
    const sdrt_epilogue *ep; /* NULL: none */
    const char *pfb;    /* rows of B (64 bytes each) to prefetch into L2 during the call, spread over its k steps; NULL: none */
    ptrdiff_t pfb_half; /* bytes from a row to its twin in the other half (also prefetched) */
    int pfb_rows;       /* how many */
} sdrt_tile_out;

/* the same with B rows found through offsets: row k of the B slice at b + off[k] (the direct
 * conv reads them from its padded input) */
typedef void (*sdrt_ikernel_fn)(int K, const float *a, ptrdiff_t lda, const float *b, const int32_t *off,
                                const sdrt_tile_out *o, const float *pf);

/* C tile (mr x NR) = A rows (mr x K, a[i*lda + k]) . B slice (K x NR): NR columns of a packed
 * panel, columns 0-15 at b[k*16 + j] and (NR = 32) columns 16-31 at b[bh + k*16 + j - 16] (bh: the
 * panel's half size; 16-column kernels ignore it). pf: the A rows the next call reads (same lda),
 * prefetched into L1 while this one computes */
typedef void (*sdrt_kernel_fn)(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t bh,
                               const sdrt_tile_out *o, const float *pf);

/* `slices` C tiles in one call (16-column kernels): the halves j = 0, 1, ... of consecutive packed
 * panels (half j at b + (j / 2) pstride + (j % 2) pstride / 2), all against the same A rows; o describes
 * slice 0 (c, res and bias advance by nr columns a slice; n counts the valid columns from slice
 * 0). For small K, where a call's fixed cost is a large share of its K products. */
typedef void (*sdrt_mkernel_fn)(int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t pstride, int slices,
                                const sdrt_tile_out *o, const float *pf);

typedef struct {
    const char *name;
    int mr_max;
    int nr; /* columns per call (16 or 32): a 32-column panel takes 32 / nr calls */
    int kc; /* longest block of K: a kc x nr slice of B stays in L1 over the A tiles */
    sdrt_kernel_fn kern[17]; /* kern[mr] for mr in 1..mr_max */
    sdrt_ikernel_fn ikern[17]; /* the same with B rows by offsets (NULL: this ISA has none) */
    sdrt_mkernel_fn mkern[17]; /* many slices a call (NULL: this ISA has none) */
    int spread_pf; /* kern prefetches the B rows sdrt_tile_out.pfb names over its k steps (0: the caller does) */
    /* kern's product with A stored by columns: A(i, k) = a[k*lda + i] (NULL: this ISA has none) */
    sdrt_kernel_fn ckern[17];
} sdrt_isa_kernels;

/* the kernel table of an ISA, or NULL when this build or this CPU lacks it */
const sdrt_isa_kernels *sdrt_kernels_portable(void);
const sdrt_isa_kernels *sdrt_kernels_avx2(void);
const sdrt_isa_kernels *sdrt_kernels_avx512(void);
const sdrt_isa_kernels *sdrt_kernels_neon(void);
int sdrt_cpu_has(int isa);
/* the kernels of the ISA the custom ops use now (gemm.c) */
const sdrt_isa_kernels *sdrt_active_kernels(void);

/* ---- bf16 products (AVX-512-BF16 vdpbf16ps; gemm_kernels.c) ----------------------------------
 * Operands rounded to bf16 (round to nearest even), products accumulated in float32. K goes in
 * pairs: A rows hold bf16 pairs (k, k + 1) as one uint32 each; a bf16 B panel is
 * [half][K2][16][2] (K2 = ceil(K / 2) pairs, the pair of each column side by side, as vdpbf16ps
 * takes them): row pair p of a half is 32 uint16 (one vector), and a half is K2 x 32 uint16. An odd
 * K ends with a zero pair element. vdpbf16ps treats denormal inputs as zero and flushes denormal
 * results (below 1.2e-38: nothing an image notices). */
#define SDRT_BF16_NR 32
/* C tile (mr x 32) = A pairs (mr x K2, a[i*lda + p]) . B slice (the K2 pairs of a bf16 panel; its
 * second half bh uint16 on) */
typedef void (*sdrt_bkernel_fn)(int K2, const uint32_t *a, ptrdiff_t lda, const uint16_t *b, ptrdiff_t bh,
                                const sdrt_tile_out *o);
struct sdrt_block_out_;
typedef struct sdrt_bf16_kernels_ {
    const char *name;
    int mr_max;
    int kc2; /* longest block of K, in pairs */
    sdrt_bkernel_fn kern[17];
    /* rows m of float A (k floats each, row stride lda) -> bf16 pairs dst[i*ld2 + p], p < ceil(k / 2) */
    void (*cvt_rows)(int m, int k, const float *a, ptrdiff_t lda, uint32_t *dst, ptrdiff_t ld2);
    /* a float panel of `rows` rows ([half][rows][16]) -> ceil(rows / 2) pair rows of a bf16 panel, its first half
     * at dst, its second dst_half uint16 on */
    void (*cvt_panel)(int rows, const float *src, uint16_t *dst, ptrdiff_t dst_half);
    /* the whole blocked product (sdrt_block_bf16's arguments) where the ISA has its own (AMX tiles, amx.c);
     * NULL: sdrt_block_bf16 runs kern[] tile by tile */
    void (*block)(const struct sdrt_bf16_kernels_ *bk, int m, int k2, const uint32_t *a, ptrdiff_t lda,
                  const uint16_t *b, ptrdiff_t pstride, int panels, const struct sdrt_block_out_ *out, int acc,
                  int last);
} sdrt_bf16_kernels;
/* the bf16 kernels, or NULL when this build or this CPU lacks AVX-512-BF16, or the active float32
 * ISA is not AVX-512 (SDRT_GGML_GEMM_ISA pins another: the products then widen bf16 to float32) */
const sdrt_bf16_kernels *sdrt_kernels_bf16(void);
int sdrt_cpu_has_bf16(void);
/* float32 -> bf16 bits, round to nearest even (a NaN kept a NaN); a select, not a branch, so that loops of it
 * vectorize (native/pack.c) */
static inline uint16_t sdrt_f32_to_bf16(float f) {
    union {
        uint32_t u;
        float f;
    } v;
    v.f = f;
    const uint32_t rounded = (v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16;
    return (uint16_t)((v.u & 0x7FFFFFFFu) > 0x7F800000u ? (v.u >> 16) | 0x40u : rounded);
}
/* bf16 bits -> float32 (exact) */
static inline float sdrt_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
/* `panels` bf16 panels (k2 pair rows each, pstride uint16 apart) -> float panels of 2 k2 rows
 * (pstride floats apart, [half][2 k2][16]): the float32 kernels' operand where there are no bf16 ones */
void sdrt_widen_panels(const uint16_t *b, ptrdiff_t pstride, int k2, int panels, float *dst);

/* the scalar tile store shared by kernels that compute into a temporary tile */
void sdrt_store_tile(const float *tile, int ld_tile, const sdrt_tile_out *o);

/* ---- the blocked product over packed panels (gemm.c; the GEMM op and the conv use it) ------ */
typedef struct sdrt_block_out_ {
    float *c;           /* C at (row 0, column 0) of the block */
    ptrdiff_t ldc;
    int trans;          /* c[j*ldc + i] instead of c[i*ldc + j] */
    int n;              /* valid columns from the first panel's column 0 */
    const float *bias;  /* per column from column 0, or NULL */
    const float *rbias; /* per row from row 0, or NULL */
    const float *res;   /* residual at (row 0, column 0), laid out as C with ldres, or NULL */
    ptrdiff_t ldres;
    const sdrt_epilogue *ep; /* with the last block of K, or NULL */
    int prefetch_b;     /* B streams from memory: prefetch each next slice into L2 while the tiles compute */
} sdrt_block_out;

/* C[0:m, the panels' columns] (+)= A[0:m, 0:k] . B, B as k rows of `panels` packed panels,
 * pstride floats apart, each with its second half pstride / 2 floats after its first (the rows may
 * be a block of K of larger panels: b then points at row k0 of the first half). For each panel,
 * for each nr-column slice of it, every MR tile of A meets the slice while it is in L1 (the A
 * tiles stream from L2). acc: add to C (a later block of K);
 * else C = product + bias. */
void sdrt_block(const sdrt_isa_kernels *kk, int m, int k, const float *a, ptrdiff_t lda, const float *b,
                ptrdiff_t pstride, int panels, const sdrt_block_out *out, int acc, int last);

/* the blocked bf16 product, as sdrt_block: A as pairs (lda uint32 between rows), B as k2 pair rows of
 * `panels` bf16 panels pstride uint16 apart (second half pstride / 2 on) */
void sdrt_block_bf16(const sdrt_bf16_kernels *bk, int m, int k2, const uint32_t *a, ptrdiff_t lda, const uint16_t *b,
                     ptrdiff_t pstride, int panels, const sdrt_block_out *out, int acc, int last);

/* A kernel call's output, columns n0.. (at most nr of them) of the block's: what every row tile shares */
static inline sdrt_tile_out sdrt_tile_out_cols(const sdrt_block_out *out, int n0, int nr, int acc, int last) {
    sdrt_tile_out o;
    o.ldc = out->ldc;
    o.trans = out->trans;
    o.n = out->n - n0 < nr ? out->n - n0 : nr;
    o.bias = out->bias ? out->bias + n0 : NULL;
    o.acc = acc;
    o.last = last;
    o.ldres = out->ldres;
    o.ep = out->ep;
    o.pfb = NULL;
    o.pfb_half = 0;
    o.pfb_rows = 0;
    return o;
}

/* ... and its rows m0..m1: where they land in C (and the residual), and their row bias */
static inline void sdrt_tile_out_rows(sdrt_tile_out *o, const sdrt_block_out *out, int n0, int m0, int m1) {
    o->m = m1 - m0;
    o->rbias = out->rbias ? out->rbias + m0 : NULL;
    o->c = out->trans ? out->c + (ptrdiff_t)n0 * out->ldc + m0 : out->c + (ptrdiff_t)m0 * out->ldc + n0;
    o->res = !out->res ? NULL
             : out->trans ? out->res + (ptrdiff_t)n0 * out->ldres + m0
                          : out->res + (ptrdiff_t)m0 * out->ldres + n0;
}

/* ---- AMX-BF16 tiles (amx.c) --------------------------------------------------------------------
 * The bf16 products on AMX (tdpbf16ps: a 16 x 16 float32 tile += 16 rows of 16 A pairs . 16 pair rows of B,
 * 16 x 16 x 32 multiply-adds an instruction). The bf16 operands need no other layout: a pair row of a bf16 panel's
 * half (64 bytes) is a B tile's row, and A's pair rows (lda uint32 apart) are an A tile's rows. Built with GCC 11 /
 * Clang 12 on, on x86-64 Linux (the OS grants the tile state to a process that asks: arch_prctl). */
#if defined(SDRT_X86) && defined(__x86_64__) && defined(__linux__) &&                                        \
    ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12))
#define SDRT_HAVE_AMX 1
/* the target of every function with tile instructions (amx.c, amx_attention.c, amx_conv.c) */
#define SDRT_TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
/* GCC's tile intrinsics are asm statements that do not say which memory a tile load reads: a barrier after the
 * buffers they read are written */
#define SDRT_AMX_BARRIER() __asm__ volatile("" ::: "memory")
/* the blocked bf16 product on tiles (sdrt_block_bf16's arguments; bk unused) */
void sdrt_amx_block_bf16(const sdrt_bf16_kernels *bk, int m, int k2, const uint32_t *a, ptrdiff_t lda,
                         const uint16_t *b, ptrdiff_t pstride, int panels, const sdrt_block_out *out, int acc, int last);
/* a 16 x 32 float tile (rows of columns 0-15 at c0 + 16 i, of 16-31 at c1 + 16 i, 64-byte aligned) to its place
 * in C through the AVX-512 kernels' epilogue (gemm_kernels.c) */
void sdrt_store512_16(const float *c0, const float *c1, const sdrt_tile_out *o);
/* the tile configuration (64 bytes: palette, rows and bytes a row of each tile) */
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} sdrt_amx_config;
/* tiles 0-7 configured as 16 rows of 64 bytes, the caller's configuration (palette 0: none) saved to *prev */
void sdrt_amx_tiles_begin(sdrt_amx_config *prev);
/* as sdrt_amx_tiles_begin, with cfg (palette 1: tiles of other shapes) loaded instead */
void sdrt_amx_tiles_load(const sdrt_amx_config *cfg, sdrt_amx_config *prev);
/* cfg filled as sdrt_amx_tiles_begin loads it: palette 1, tiles 0-7 of 16 rows of 64 bytes */
void sdrt_amx_config_default(sdrt_amx_config *cfg);
/* the caller's configuration loaded again, or the tiles released where there was none */
void sdrt_amx_tiles_end(const sdrt_amx_config *prev);
/* a run of n (<= 16) columns of a C tile's first `rows` rows: row r's floats v[16 r ..] (+ bias[r] where bias is not
 * NULL, + res[r ldc + i] where res is not NULL, then ep's activation) to c[r ldc ..] */
void sdrt_store512_run(float *c, ptrdiff_t ldc, const float *v, int rows, int n, const float *bias, const float *res,
                       const sdrt_epilogue *ep);
#endif
/* whether the CPU and the OS have AMX-BF16 tiles for this process (asking the OS for them the first time) */
int sdrt_amx_available(void);
/* whether the bf16 products use them now: available, and not turned off (SDRT_GGML_AMX=0, sdrt_amx_set) */
int sdrt_amx_enabled(void);

/* the scalar epilogue of one value (sdrt_store_tile and the scalar paths) */
static inline float sdrt_act(const sdrt_epilogue *ep, float v) {
    if (!ep)
        return v;
    switch (ep->act) {
    case SDRT_ACT_RELU:
        return v > 0.0f ? v : 0.0f;
    case SDRT_ACT_CLIP:
        return v < ep->lo ? ep->lo : v > ep->hi ? ep->hi : v;
    case SDRT_ACT_HARDSWISH: {
        const float g = v * (1.0f / 6.0f) + 0.5f;
        return v * (g < 0.0f ? 0.0f : g > 1.0f ? 1.0f : g);
    }
    case SDRT_ACT_SILU: {
        const float z = -ep->lo * v;
        return v / (1.0f + expf(z < 88.0f ? z : 88.0f));
    }
    case SDRT_ACT_GELU_TANH: {
        const float z = v * (-SDRT_GELU_G1 - SDRT_GELU_G3 * v * v);
        return v / (1.0f + expf(z < 88.0f ? z : 88.0f));
    }
    default:
        return v;
    }
}

/* a 64-byte aligned per-thread scratch buffer, kept for the thread's life; NULL when out of memory.
 * Slots: 0 the GEMM's runtime B panels, 1 its copied A rows, 2 packed panels (the conv's columns,
 * the Winograd conv's transformed input), 3 small scratch (the conv's taps, the depthwise conv's
 * padded plane, the Winograd conv's row biases), 4 the direct conv's row offsets, which stay valid
 * from one call to the next (no other op may use slot 4), 5 the conv's row biases, 6 the Winograd
 * conv's products, 7 its split input rows, 8 the AMX product's zero-padded A tails */
#define SDRT_THREAD_BUFFERS 9
/* The bounds floor(t n / parts) of n split into `parts` near-equal parts, t = 0, 1, ...: one step
 * per part without a division (a 64-bit division per tile cost as much as a small-K tile's work). */
typedef struct {
    int q, r, parts, acc, at;
} sdrt_split;
static inline sdrt_split sdrt_split_of(int n, int parts) {
    sdrt_split s = {n / parts, n % parts, parts, 0, 0};
    return s;
}
/* the next bound: floor((t + 1) n / parts) after floor(t n / parts) */
static inline int sdrt_split_next(sdrt_split *s) {
    s->acc += s->r;
    s->at += s->q;
    if (s->acc >= s->parts) {
        s->acc -= s->parts;
        s->at++;
    }
    return s->at;
}

/* prefetch the cache line at p into L2 (a hint: nothing where the compiler has no intrinsic) */
#if defined(__GNUC__) || defined(__clang__)
#define SDRT_PREFETCH_L2(p) __builtin_prefetch((p), 0, 2)
#elif defined(_MSC_VER) && defined(SDRT_X86)
#include <xmmintrin.h>
#define SDRT_PREFETCH_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#else
#define SDRT_PREFETCH_L2(p) ((void)(p))
#endif

float *sdrt_thread_buffer(int slot, size_t bytes);

/* The row biases of batch item n of a conv: the constant bias (OC floats, or NULL) plus the runtime
 * per-channel one (rb, OC floats an item), in thread buffer `slot`; NULL when out of memory. */
static inline const float *sdrt_item_row_bias(int slot, const float *rb, const float *bias, int n, int oc) {
    float *comb = sdrt_thread_buffer(slot, (size_t)oc * sizeof(float));
    if (comb)
        for (int i = 0; i < oc; i++)
            comb[i] = rb[(ptrdiff_t)n * oc + i] + (bias ? bias[i] : 0.0f);
    return comb;
}

/* ---- the ops' shared work counter --------------------------------------------------------------
 * An op's int32[4] state tensor, zeros at first: its threads take units from state[0] as they come
 * (a thread that the OS holds back does not hold the others at ggml's barrier after the op), and
 * the last thread to finish resets both counters for the next run (ggml runs the next node only
 * after every thread has returned from this one). */
#if defined(_MSC_VER)
#include <intrin.h>
#define SDRT_ATOMIC_ADD(p, v) _InterlockedExchangeAdd((volatile long *)(p), (long)(v))
#define SDRT_ATOMIC_STORE(p, v) _InterlockedExchange((volatile long *)(p), (long)(v))
#else
#define SDRT_ATOMIC_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_ACQ_REL)
#define SDRT_ATOMIC_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#endif

/* the next unit of work for this thread */
static inline long sdrt_work_take(int32_t *state) { return SDRT_ATOMIC_ADD(&state[0], 1); }

/* this thread is done with the op: the last one out resets the counter */
static inline void sdrt_work_done(int32_t *state, int nth) {
    if (SDRT_ATOMIC_ADD(&state[1], 1) == nth - 1) {
        SDRT_ATOMIC_STORE(&state[0], 0);
        SDRT_ATOMIC_STORE(&state[1], 0);
    }
}

#endif
