/* sdrt-ggml native kernels: attention and GELU (ops.c, with one body per ISA in simd_body.h). */
#ifndef SDRT_OPS_H
#define SDRT_OPS_H

#include "sdrt_native.h"


/* one head's packed operands, in a thread's scratch */
typedef struct {
    int D, Dv, dvp; /* head widths; dvp: Dv padded to a multiple of the kernel's vector */
    int nk, n_kv;   /* keys padded to a multiple of two vectors, and real */
    int kb;         /* keys per block (a multiple of two vectors): K^T and V of a block stay in L1 */
    const float *kt; /* K transposed in key blocks: block j at kt + j kb D is D x kb, columns past n_kv
                      * zero (blocks, not one D x nk matrix: rows nk floats apart shared L1 sets) */
    const float *v;  /* nk x dvp: V, columns past Dv and rows past n_kv zero */
} sdrt_attn_job;

/* userdata of sdrt_attention_op */
typedef struct {
    float scale;  /* of Q K^T */
    int32_t bf16; /* 1: the products may run on bf16-rounded operands (precision bf16): AMX tiles where there are
                   * (amx_attention.c), else float32 as with 0 */
} sdrt_attn_params;

/* sdrt_attention_op's tasks ith of nth (query rows in blocks of 32) on AMX tiles at bf16, without a mask: 0 done
 * (rows NaN where there was no memory for the scratch), -1 no AMX here (nothing done) */
int sdrt_amx_attention(sdrt_view q, sdrt_view k, sdrt_view v, sdrt_view o, float scale, int ith, int nth);

/* a dense stride-1 conv on bf16 channel pairs (amx_conv.c): the input from sdrt_pair_pad_op, W as [OC][tap][C2][2] */
typedef struct {
    const uint16_t *x;  /* item 0's pair planes, xp[C2][Hp][Wp][2] */
    ptrdiff_t x_item;   /* uint16 from one item's planes to the next's */
    int C2, Hp, Wp;     /* pairs (a multiple of 16), the padded plane */
    const uint16_t *w;  /* rows of ceil(OC / 16) 16 output channels */
    ptrdiff_t ldw;      /* uint16 between W's rows (KH KW C2 2) */
    int N, OC, KH, KW, dh, dw, OH, OW;
    float *out;         /* NCHW */
    ptrdiff_t out_item; /* floats */
    const char *res;    /* a residual shaped as out, or NULL */
    ptrdiff_t res_item; /* bytes */
    const sdrt_epilogue *ep;
} sdrt_conv_pairs;
/* the conv of `a` plus bias (OC floats or NULL) and rbias (ne (OC, N) or NULL), on AMX tiles where they are on (else a
 * scalar loop); the op's threads take units from state */
void sdrt_conv_pairs_run(const sdrt_conv_pairs *a, const float *bias, const float *rbias, int32_t *state, int nth);

/* a pad op's operands (sdrt_pad_op, sdrt_pair_pad_op): src[0] x ne (W, H, C, N), src[1] int32 [top, left], dst
 * ne (Wp per, Hp, ...) */
typedef struct {
    sdrt_view X, D;
    int top, left, W, H, Wp, Hp;
    long planes; /* dst's ne[2] ne[3] */
} sdrt_pad_job;
/* 0 with *j filled where the image fits in dst at (top, left), else -1 (conv.c) */
int sdrt_pad_job_of(void *dst, int per, sdrt_pad_job *j);

/* rows x n floats of two channel planes (a1 NULL: zeros) as bf16 pairs side by side (amx_conv.c): row r of a0 and
 * a1 at a0 + r lda, a1 + r lda, of d at d + r ldd (uint16, 2 n of them a row). AVX-512-BF16 where the CPU has
 * AMX, else a scalar loop; both round to nearest even */
void sdrt_pair_rows(const float *a0, const float *a1, ptrdiff_t lda, int rows, int n, uint16_t *d, ptrdiff_t ldd);

/* the zeros of a pair plane of Hp x Wp pairs around a W x H image at (top, left) (all of it where `all`) */
void sdrt_pair_plane_borders(uint16_t *d, int top, int left, int W, int H, int Wp, int Hp, int all);

/* floats of scratch that an attention of `rows` query rows needs (sdrt_attn_fn's work) */
static inline size_t sdrt_attn_work_floats(const sdrt_attn_job *job, int rows) {
    return 8 * (size_t)job->kb + (size_t)rows * job->dvp + 2 * (size_t)rows + (size_t)rows * job->D;
}

/* out[r][0..Dv) = softmax(qs[r] K^T + mask[r]) V for `rows` query rows of one head (qs scaled,
 * rows x D; mask[r] the row's n_kv mask values or NULL) */
typedef void (*sdrt_attn_fn)(const sdrt_attn_job *job, int rows, const float *qs, const float *const *mask,
                             float *const *out, float *work);
/* y[i] = gelu_erf(x[i]) (* g[i] when g is not NULL) */
typedef void (*sdrt_gelu_fn)(int64_t n, const float *x, const float *g, float *y);

/* userdata of the group-norm ops */
typedef struct {
    int32_t groups;
    int32_t silu; /* apply x * sigmoid(x) after the affine */
    int32_t cl;   /* write channels-last (ne (C, H*W), batch 1) instead of (H*W, C, N) */
    float eps;
    /* pad > 0: write each plane's W-wide rows at (top, left) of a zero-padded ne (Wp, Hp, C, N)
     * output, the input a direct conv reads (no pad op after the group norm) */
    int32_t pad, W, top, left;
} sdrt_gn_params;

typedef double (*sdrt_sum_fn)(int64_t n, const float *x);
typedef double (*sdrt_sqdev_fn)(int64_t n, const float *x, float m);
typedef void (*sdrt_affine_row_fn)(int64_t n, const float *x, float m, float a, float b, int silu, float *y);
typedef void (*sdrt_ln_row_fn)(int64_t n, const float *x, float m, float a, const float *g, const float *b, float *y);
typedef void (*sdrt_affine_cl_fn)(int64_t hw, int C, const float *x, const float *m, const float *a, const float *b,
                                  int silu, int64_t p0, int64_t p1, float *y);

/* a depthwise conv's outputs along one run of positions in its padded planes (simd_dw.h); it reads
 * and writes up to two vectors past the run */
typedef void (*sdrt_dw_flat_fn)(int nq, int nt, const float *base, const int32_t *off, const float *w, float bias,
                                const sdrt_epilogue *ep, float *out);
/* a 3x3 stride-1 depthwise conv over one padded plane, four output rows at a time (simd_dw.h) */
typedef void (*sdrt_dw_3x3_fn)(int rows, int Wq, const float *P, const float *w, float bias, const sdrt_epilogue *ep,
                               float *out);
/* even[t] = src[2t], odd[t] = src[2t + 1] for t < n (simd_dw.h); src must not overlap even or odd */
typedef void (*sdrt_split2_fn)(int n, const float *src, float *even, float *odd);
/* dst[r ld + i] = src[r ls + i] for r < rows, i < n (simd_dw.h): rows copied with the ISA's moves, nothing written
 * past n */
typedef void (*sdrt_copy_rows_fn)(int rows, int n, const float *src, ptrdiff_t ls, float *dst, ptrdiff_t ld);
/* a depthwise conv of one plane straight from its unpadded input (stride 1 or 2, dilation 1, KW <= 8) to output rows ldo
 * floats apart (simd_dw.h; AVX-512 only, NULL elsewhere) */
typedef void (*sdrt_dw_rows_fn)(const float *x, int H, int W, int KH, int KW, int s, int ph, int pw, const float *w,
                                float bias, const sdrt_epilogue *ep, float *out, int OH, int OW, ptrdiff_t ldo);
/* Winograd F(2x2, 3x3) transforms along a row of tiles (simd_wino.h) */
typedef void (*sdrt_wino_in_fn)(int n, const float *const *e, const float *const *o, float *dst, ptrdiff_t ld);
typedef void (*sdrt_wino_out_fn)(int n, int cols, const float *m, ptrdiff_t ld, float bias, const float *res0,
                                 const float *res1, const sdrt_epilogue *ep, float *row0, float *row1);
/* y[r] = w[r ldw ..] . x for r < rows, K floats each: a matrix-vector product (simd_body.h) */
typedef void (*sdrt_dot_rows_fn)(int rows, int K, const float *w, ptrdiff_t ldw, const float *x, float *y);
/* the active ISA's (ops.c) */
sdrt_dw_flat_fn sdrt_ops_dw_flat(void);
sdrt_dw_3x3_fn sdrt_ops_dw_3x3(void);
sdrt_dot_rows_fn sdrt_ops_dot_rows(void);
sdrt_split2_fn sdrt_ops_split2(void);
sdrt_copy_rows_fn sdrt_ops_copy_rows(void);
sdrt_dw_rows_fn sdrt_ops_dw_rows(void);
sdrt_wino_in_fn sdrt_ops_wino_in(void);
sdrt_wino_out_fn sdrt_ops_wino_out(void);

#endif
