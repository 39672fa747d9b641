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

#endif
