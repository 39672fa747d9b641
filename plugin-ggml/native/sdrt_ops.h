/* sdrt-ggml native kernels: attention and GELU (ops.c, with one body per ISA in simd_body.h). */
#ifndef SDRT_OPS_H
#define SDRT_OPS_H

#include "sdrt_native.h"

/* keys padded to a multiple of this (two vectors of the widest ISA) */
#define SDRT_ATTN_KPAD 32
/* query rows per task (a multiple of the 4-row micro-kernel) */
#define SDRT_ATTN_QB 64

/* one head's packed operands, in a thread's scratch */
typedef struct {
    int D, Dv, nk, n_kv;
    const float *kt; /* D x nk: K transposed, columns past n_kv zero */
    const float *vt; /* Dv x nk: V transposed, columns past n_kv zero */
    float *S;        /* 4 x nk scores */
} sdrt_attn_job;

/* up to 4 query rows: out[r][0..Dv) = softmax(qs[r] K^T + mask[r]) V (qs already scaled) */
typedef void (*sdrt_attn_rows_fn)(const sdrt_attn_job *job, int R, const float *qs, const float *const *mask,
                                  float *const *out);
/* y[i] = gelu_erf(x[i]) (* g[i] when g is not NULL) */
typedef void (*sdrt_gelu_fn)(int64_t n, const float *x, const float *g, float *y);

/* userdata of the group-norm ops */
typedef struct {
    int32_t groups;
    int32_t silu; /* apply x * sigmoid(x) after the affine */
    int32_t cl;   /* write channels-last (ne (C, H*W), batch 1) instead of (H*W, C, N) */
    float eps;
} sdrt_gn_params;

typedef double (*sdrt_sum_fn)(int64_t n, const float *x);
typedef double (*sdrt_sqdev_fn)(int64_t n, const float *x, float m);
typedef void (*sdrt_affine_row_fn)(int64_t n, const float *x, float m, float a, float b, int silu, float *y);
typedef void (*sdrt_affine_cl_fn)(int64_t hw, int C, const float *x, const float *m, const float *a, const float *b,
                                  int silu, int64_t p0, int64_t p1, float *y);

#endif
