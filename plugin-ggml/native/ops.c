/* sdrt-ggml native kernels: attention and GELU (erf form) as ggml custom ops.
 *
 * sdrt_attention_op: softmax(Q K^T * scale + mask) V for every (batch, head), reading Q, K
 *   and V through their strides (no copies before it), writing the [Dv, H, n_q, B] layout of
 *   ggml_flash_attn_ext. Each thread takes a contiguous range of (head, 64-query block) tasks,
 *   packs that head's K^T and V^T once into its scratch (keys padded to 32 with zeros), and
 *   runs an 8-row (AVX-512) or 4-row micro-kernel: scores as 8 or 4 x 2-vector register tiles over
 *   the head dim, an exp-and-sum pass, then the weighted sum of V as dot products over the keys.
 * sdrt_gelu_erf_op: 0.5 x (1 + erf(x / sqrt 2)) [* g], vectorised (ggml's GELU_ERF calls
 *   erff once per element).
 *
 * The bodies (simd_body.h) use GCC/Clang vector extensions and are compiled once per ISA
 * (AVX-512, AVX2+FMA and the 4-wide SSE2/NEON baseline) with target pragmas, so the library
 * builds with no -march flag and picks the widest one this CPU has at run time. Compilers
 * without vector extensions (MSVC) get the scalar code at the end.
 */
#include "sdrt_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define SDRT_VECEXT 1
#endif
#if defined(SDRT_X86) && defined(SDRT_VECEXT)
#include <immintrin.h> /* simd_dw.h's masked loads (AVX-512) */
#endif

#ifdef SDRT_VECEXT
/* ISO C mode (-std=c11) turns off a*b+c -> fma contraction; the kernels are written for it */
#if defined(__clang__)
#pragma clang fp contract(fast)
#else
#pragma GCC optimize("fp-contract=fast")
#endif
#define VW 4
#define SFX(n) n##_v4
#include "simd_body.h"
#undef VW
#undef SFX

#if defined(SDRT_X86)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define VW 8
#define SFX(n) n##_avx2
#include "simd_body.h"
#undef VW
#undef SFX
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx2,fma"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma,prefer-vector-width=512")
#endif
#define VW 16
#define SFX(n) n##_avx512
#include "simd_body.h"
#undef VW
#undef SFX
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* SDRT_X86 */
#endif /* SDRT_VECEXT */

/* ---- scalar code (every compiler) --------------------------------------------------- */
static void attend_scalar(const sdrt_attn_job *job, int rows, const float *qs, const float *const *mask,
                          float *const *out, float *work) {
    const int D = job->D, nk = job->nk, n_kv = job->n_kv;
    float *s = work;
    for (int r = 0; r < rows; r++) {
        float m = -INFINITY;
        for (int k = 0; k < n_kv; k++) {
            const int j0 = k / job->kb * job->kb, kb = nk - j0 < job->kb ? nk - j0 : job->kb;
            float acc = 0.0f;
            for (int d = 0; d < D; d++)
                acc += qs[(size_t)r * D + d] * job->kt[(size_t)j0 * D + (size_t)d * kb + (k - j0)];
            s[k] = acc + (mask ? mask[r][k] : 0.0f);
            m = s[k] > m ? s[k] : m;
        }
        float sum = 0.0f;
        for (int k = 0; k < n_kv; k++) {
            s[k] = m == -INFINITY ? 0.0f : expf(s[k] - m);
            sum += s[k];
        }
        float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int dv = 0; dv < job->Dv; dv++) {
            float acc = 0.0f;
            for (int k = 0; k < n_kv; k++)
                acc += s[k] * job->v[(size_t)k * job->dvp + dv];
            out[r][dv] = acc * inv;
        }
    }
}

static void gelu_erf_scalar(int64_t n, const float *x, const float *g, float *y) {
    for (int64_t i = 0; i < n; i++) {
        float v = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
        y[i] = g ? v * g[i] : v;
    }
}

static double sum_scalar(int64_t n, const float *x) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += x[i];
    return s;
}

static double sqdev_scalar(int64_t n, const float *x, float m) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)(x[i] - m) * (x[i] - m);
    return s;
}

SDRT_INLINE float silu_scalar(float v) { return v / (1.0f + expf(-v < 88.0f ? -v : 88.0f)); }

static void affine_row_scalar(int64_t n, const float *x, float m, float a, float b, int silu, float *y) {
    for (int64_t i = 0; i < n; i++) {
        float v = (x[i] - m) * a + b;
        y[i] = silu ? silu_scalar(v) : v;
    }
}

static void ln_row_scalar(int64_t n, const float *x, float m, float a, const float *g, const float *b, float *y) {
    for (int64_t i = 0; i < n; i++)
        y[i] = (x[i] - m) * a * g[i] + b[i];
}

static void affine_cl_scalar(int64_t hw, int C, const float *x, const float *m, const float *a, const float *b,
                             int silu, int64_t p0, int64_t p1, float *y) {
    for (int64_t p = p0; p < p1; p++)
        for (int c = 0; c < C; c++) {
            float v = (x[(size_t)c * hw + p] - m[c]) * a[c] + b[c];
            y[(size_t)p * C + c] = silu ? silu_scalar(v) : v;
        }
}

static void dw_flat_scalar(int nq, int nt, const float *base, const int32_t *off, const float *w, float bias,
                           const sdrt_epilogue *ep, float *out) {
    for (int q = 0; q < nq; q++) {
        float acc = bias;
        for (int t = 0; t < nt; t++)
            acc += base[off[t] + q] * w[t];
        out[q] = sdrt_act(ep, acc);
    }
}

static void dw_3x3_scalar(int rows, int Wq, const float *P, const float *w, float bias, const sdrt_epilogue *ep,
                          float *out) {
    for (int oy = 0; oy < rows; oy++)
        for (int x = 0; x < Wq; x++) {
            float acc = bias;
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++)
                    acc += P[(ptrdiff_t)(oy + i) * Wq + x + j] * w[3 * i + j];
            out[(ptrdiff_t)oy * Wq + x] = sdrt_act(ep, acc);
        }
}

static void dot_rows_scalar(int rows, int K, const float *w, ptrdiff_t ldw, const float *x, float *y) {
    for (int r = 0; r < rows; r++) {
        float sum = 0.0f;
        for (int k = 0; k < K; k++)
            sum += w[(ptrdiff_t)r * ldw + k] * x[k];
        y[r] = sum;
    }
}

static void dw_copy_rows_scalar(int rows, int n, const float *src, ptrdiff_t ls, float *dst, ptrdiff_t ld) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++)
            dst[(ptrdiff_t)r * ld + i] = src[(ptrdiff_t)r * ls + i];
}

static void dw_split2_scalar(int n, const float *src, float *even, float *odd) {
    for (int t = 0; t < n; t++) {
        even[t] = src[2 * t];
        odd[t] = src[2 * t + 1];
    }
}

static void wino_in_scalar(int n, const float *const *e, const float *const *o, float *dst, ptrdiff_t ld) {
    for (int j = 0; j < n; j++) {
        float u[4][4];
        for (int r = 0; r < 4; r++) {
            u[r][0] = e[r][j] - e[r][j + 1];
            u[r][1] = o[r][j] + e[r][j + 1];
            u[r][2] = e[r][j + 1] - o[r][j];
            u[r][3] = o[r][j] - o[r][j + 1];
        }
        for (int c = 0; c < 4; c++) {
            dst[(0 + c) * ld + j] = u[0][c] - u[2][c];
            dst[(4 + c) * ld + j] = u[1][c] + u[2][c];
            dst[(8 + c) * ld + j] = u[2][c] - u[1][c];
            dst[(12 + c) * ld + j] = u[1][c] - u[3][c];
        }
    }
}

static void wino_out_scalar(int n, int cols, const float *m, ptrdiff_t ld, float bias, const float *res0,
                            const float *res1, const sdrt_epilogue *ep, float *row0, float *row1) {
    for (int j = 0; j < n; j++) {
        float s0[4], s1[4];
        for (int r = 0; r < 4; r++) {
            s0[r] = m[(4 * r) * ld + j] + m[(4 * r + 1) * ld + j] + m[(4 * r + 2) * ld + j];
            s1[r] = m[(4 * r + 1) * ld + j] - m[(4 * r + 2) * ld + j] - m[(4 * r + 3) * ld + j];
        }
        const float y[2][2] = {{s0[0] + s0[1] + s0[2], s1[0] + s1[1] + s1[2]},
                               {s0[1] - s0[2] - s0[3], s1[1] - s1[2] - s1[3]}};
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 2 && 2 * j + c < cols; c++) {
                float *row = h ? row1 : row0;
                const float *res = h ? res1 : res0;
                if (row)
                    row[2 * j + c] = sdrt_act(ep, y[h][c] + bias + (res ? res[2 * j + c] : 0.0f));
            }
    }
}

/* ---- dispatch ---------------------------------------------------------------------- */
typedef struct {
    sdrt_attn_fn attn;
    sdrt_gelu_fn gelu;
    sdrt_sum_fn sum;
    sdrt_sqdev_fn sqdev;
    sdrt_affine_row_fn affine_row;
    sdrt_ln_row_fn ln_row;
    sdrt_affine_cl_fn affine_cl;
    sdrt_dw_flat_fn dw_flat;
    sdrt_dw_3x3_fn dw_3x3;
    sdrt_split2_fn split2;
    sdrt_wino_in_fn wino_in;
    sdrt_wino_out_fn wino_out;
    sdrt_dot_rows_fn dot_rows;
    sdrt_copy_rows_fn copy_rows;
    sdrt_dw_rows_fn dw_rows;
} ops_table;

/* the ISAs without dw_rows (masked loads: AVX-512 only) */
#define dw_rows_scalar NULL
#define dw_rows_v4 NULL
#define dw_rows_avx2 NULL
#define SDRT_TABLE(s) {attend_##s, gelu_erf_##s, sum_##s, sqdev_##s, affine_row_##s, ln_row_##s, affine_cl_##s, dw_flat_##s, dw_3x3_##s, dw_split2_##s, wino_in_##s, wino_out_##s, dot_rows_##s, dw_copy_rows_##s, dw_rows_##s}

static ops_table table_for(int isa) {
    ops_table t = SDRT_TABLE(scalar);
#ifdef SDRT_VECEXT
#if defined(SDRT_X86)
    if (isa == SDRT_ISA_AVX512) {
        ops_table w = SDRT_TABLE(avx512);
        t = w;
    } else if (isa == SDRT_ISA_AVX2) {
        ops_table w = SDRT_TABLE(avx2);
        t = w;
    } else
#endif
    {
        ops_table w = SDRT_TABLE(v4); /* the 4-wide baseline: SSE2 on x86-64, NEON on arm64 */
        (void)isa;
        t = w;
    }
#endif
    return t;
}

static int ops_isa = SDRT_ISA_AUTO;
static ops_table ops = SDRT_TABLE(scalar);

/* Choose the kernels: an ISA id, or SDRT_ISA_AUTO for the widest this CPU runs.
 * Returns the ISA chosen, or -1 (nothing changed) when this build or CPU lacks it.
 * SDRT_ISA_COUNT selects the scalar code (the MSVC path) for tests. */
SDRT_EXPORT int sdrt_ops_set_isa(int isa) {
    if (isa == SDRT_ISA_COUNT) {
        ops_table w = SDRT_TABLE(scalar);
        ops = w;
        ops_isa = isa;
        return isa;
    }
    if (isa == SDRT_ISA_AUTO) {
        const int order[] = {SDRT_ISA_AVX512, SDRT_ISA_AVX2, SDRT_ISA_NEON, SDRT_ISA_PORTABLE};
        for (int i = 0; i < 4; i++)
            if (sdrt_ops_set_isa(order[i]) >= 0)
                return order[i];
        return -1;
    }
    if (isa < 0 || isa >= SDRT_ISA_COUNT || !sdrt_cpu_has(isa))
        return -1;
#if !defined(SDRT_X86) || !defined(SDRT_VECEXT)
    if (isa == SDRT_ISA_AVX2 || isa == SDRT_ISA_AVX512)
        return -1;
#endif
    ops = table_for(isa);
    ops_isa = isa;
    return isa;
}

SDRT_EXPORT int sdrt_ops_active_isa(void) { return ops_isa; }

sdrt_wino_in_fn sdrt_ops_wino_in(void) {
    if (ops_isa == SDRT_ISA_AUTO)
        sdrt_ops_set_isa(SDRT_ISA_AUTO);
    return ops.wino_in;
}

sdrt_wino_out_fn sdrt_ops_wino_out(void) {
    if (ops_isa == SDRT_ISA_AUTO)
        sdrt_ops_set_isa(SDRT_ISA_AUTO);
    return ops.wino_out;
}

sdrt_split2_fn sdrt_ops_split2(void) {
    if (ops_isa == SDRT_ISA_AUTO)
        sdrt_ops_set_isa(SDRT_ISA_AUTO);
    return ops.split2;
}

sdrt_dot_rows_fn sdrt_ops_dot_rows(void) {
    if (ops_isa == SDRT_ISA_AUTO)
        sdrt_ops_set_isa(SDRT_ISA_AUTO);
    return ops.dot_rows;
}

sdrt_dw_3x3_fn sdrt_ops_dw_3x3(void) {
    if (ops_isa == SDRT_ISA_AUTO)
        sdrt_ops_set_isa(SDRT_ISA_AUTO);
    return ops.dw_3x3;
}

sdrt_copy_rows_fn sdrt_ops_copy_rows(void) {
    if (ops_isa == SDRT_ISA_AUTO)
        sdrt_ops_set_isa(SDRT_ISA_AUTO);
    return ops.copy_rows;
}

sdrt_dw_rows_fn sdrt_ops_dw_rows(void) {
    if (ops_isa == SDRT_ISA_AUTO)
        sdrt_ops_set_isa(SDRT_ISA_AUTO);
    return ops.dw_rows;
}

sdrt_dw_flat_fn sdrt_ops_dw_flat(void) {
    if (ops_isa == SDRT_ISA_AUTO)
        sdrt_ops_set_isa(SDRT_ISA_AUTO);
    return ops.dw_flat;
}

/* ---- the custom ops ---------------------------------------------------------------- */
#define AT(v, i0, i1, i2, i3) \
    (*(const float *)((v).data + (size_t)(i0) * (v).nb[0] + (size_t)(i1) * (v).nb[1] + (size_t)(i2) * (v).nb[2] + \
                      (size_t)(i3) * (v).nb[3]))

/* floats per vector of the active kernel body (the scalar code takes 4, its padding is harmless) */
static int ops_vw(void) { return ops_isa == SDRT_ISA_AVX512 ? 16 : ops_isa == SDRT_ISA_AVX2 ? 8 : 4; }

/* keys per block: the block's K^T and V (D + dvp floats a key) within 32 KB (L1 holds most of it), 64 KB for the
 * AVX-512 body (its 8-row tiles stream the block from L2 at full rate, and the per-block work of the online softmax
 * — row maxima and sums, rescaling the accumulators — is spread over twice the keys: head dim 128, one thread,
 * 0.94x the time, 40-80 0.85-0.93x); a multiple of `pad` (two vectors) */
static int attn_key_block(int D, int dvp, int nk, int pad) {
    int kb = (pad == 32 ? 16384 : 8192) / (D + dvp) / pad * pad;
    kb = kb < pad ? pad : kb > 512 ? 512 : kb;
    return kb > nk ? nk : kb;
}

/* ggml custom op: dst [Dv, H, n_q, B] = attention(src0 Q [D, n_q, H, B], src1 K [D, n_kv, H, B],
 * src2 V [Dv, n_kv, H, B], src3 optional float32 mask [n_kv, n_q or 1]); userdata: sdrt_attn_params.
 * A task is (batch, head, block of query rows); each thread packs a head's K^T and V once for its
 * run of tasks, then runs the ISA's flash-attention body (simd_body.h, attend) over the block. */
SDRT_EXPORT void sdrt_attention_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_attention_op);
    const sdrt_attn_params *par = (const sdrt_attn_params *)userdata;
    const float scale = par->scale;
    sdrt_view o = sdrt_tensor_view(dst);
    sdrt_view q = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    sdrt_view k = sdrt_tensor_view(sdrt_tensor_src(dst, 1));
    sdrt_view v = sdrt_tensor_view(sdrt_tensor_src(dst, 2));
    const void *tm = sdrt_tensor_src(dst, 3);
    /* at bf16 without a mask: AMX tiles where there are (without memory for their scratch, NaN rows, as below); else
     * the float32 path, whose tasks split the same rows anew (the AMX path, refused alike on every thread, did
     * nothing) */
    if (par->bf16 && !tm && sdrt_amx_attention(q, k, v, o, scale, ith, nth) == 0)
        return;
    sdrt_view m = tm ? sdrt_tensor_view(tm) : o;
    const int D = (int)q.ne[0], n_q = (int)q.ne[1], H = (int)q.ne[2], B = (int)q.ne[3];
    const int n_kv = (int)k.ne[1], Dv = (int)v.ne[0];
    const int vw = ops_vw(), kpad = 2 * vw;
    const int nk = (n_kv + kpad - 1) / kpad * kpad;
    const int dvp = (Dv + vw - 1) / vw * vw;
    const int QB = dvp <= 64 ? 32 : 16; /* query rows per task: their accumulators stay in L1 */
    const int nqb = (n_q + QB - 1) / QB;
    const int64_t T = (int64_t)B * H * nqb;
    const int64_t t0 = T * ith / nth, t1 = T * (ith + 1) / nth;
    if (t0 >= t1)
        return;
    sdrt_attn_job job = {D, Dv, dvp, nk, n_kv, attn_key_block(D, dvp, nk, kpad), NULL, NULL};
    const size_t work = sdrt_attn_work_floats(&job, QB) > (size_t)nk ? sdrt_attn_work_floats(&job, QB) : (size_t)nk;
    float *kt = malloc(sizeof(float) * ((size_t)D * nk + (size_t)nk * dvp + (size_t)QB * D + work + 16));
    if (!kt) { /* no scratch: this thread's rows become NaN rather than the process aborting */
        for (int64_t t = t0; t < t1; t++) {
            int bh = (int)(t / nqb), qb = (int)(t % nqb), b = bh / H, h = bh % H;
            for (int row = qb * QB; row < n_q && row < (qb + 1) * QB; row++)
                for (int dv = 0; dv < Dv; dv++)
                    *(float *)(o.data + dv * o.nb[0] + h * o.nb[1] + row * o.nb[2] + b * o.nb[3]) = NAN;
        }
        return;
    }
    float *vp = kt + (size_t)D * nk, *qs = vp + (size_t)nk * dvp, *wk = qs + (size_t)QB * D;
    job.kt = kt;
    job.v = vp;
    const sdrt_attn_fn fn = ops.attn;
    const float *mrow[64];
    float *out[64];
    int last = -1;
    for (int64_t t = t0; t < t1; t++) {
        const int bh = (int)(t / nqb), qb = (int)(t % nqb), b = bh / H, h = bh % H;
        if (bh != last) { /* pack this head's K^T (in key blocks) and V, keys padded with zeros */
            const char *kh = k.data + (size_t)h * k.nb[2] + (size_t)b * k.nb[3];
            for (int j0 = 0; j0 < nk; j0 += job.kb) {
                const int kb = nk - j0 < job.kb ? nk - j0 : job.kb;
                float *blk = kt + (size_t)j0 * D;
                for (int j = 0; j < kb; j++) {
                    if (j0 + j >= n_kv) {
                        for (int d = 0; d < D; d++)
                            blk[(size_t)d * kb + j] = 0.0f;
                        continue;
                    }
                    const char *kr = kh + (size_t)(j0 + j) * k.nb[1];
                    for (int d = 0; d < D; d++)
                        blk[(size_t)d * kb + j] = *(const float *)(kr + (size_t)d * k.nb[0]);
                }
            }
            const char *vh = v.data + (size_t)h * v.nb[2] + (size_t)b * v.nb[3];
            for (int j = 0; j < nk; j++) {
                float *row = vp + (size_t)j * dvp;
                const char *vr = vh + (size_t)j * v.nb[1];
                if (j >= n_kv)
                    memset(row, 0, sizeof(float) * (size_t)Dv);
                else if (v.nb[0] == sizeof(float))
                    memcpy(row, vr, sizeof(float) * (size_t)Dv);
                else
                    for (int d = 0; d < Dv; d++)
                        row[d] = *(const float *)(vr + (size_t)d * v.nb[0]);
                memset(row + Dv, 0, sizeof(float) * (size_t)(dvp - Dv));
            }
            last = bh;
        }
        const int row0 = qb * QB, rows = n_q - row0 < QB ? n_q - row0 : QB;
        for (int r = 0; r < rows; r++) {
            const int row = row0 + r;
            const char *qr = q.data + (size_t)row * q.nb[1] + (size_t)h * q.nb[2] + (size_t)b * q.nb[3];
            for (int d = 0; d < D; d++)
                qs[(size_t)r * D + d] = *(const float *)(qr + (size_t)d * q.nb[0]) * scale;
            if (tm)
                mrow[r] = (const float *)(m.data + (size_t)(m.ne[1] == 1 ? 0 : row) * m.nb[1]);
            out[r] = (float *)(o.data + (size_t)h * o.nb[1] + (size_t)row * o.nb[2] + (size_t)b * o.nb[3]);
        }
        fn(&job, rows, qs, tm ? mrow : NULL, out, wk);
    }
    free(kt);
}

/* ggml custom op: dst = gelu_erf(src0) [* src1]: float32 of one shape, dst dense; the sources
 * need dense rows only (nb[0] = 4), so GEGLU's two halves of one projection are read in place. */
SDRT_EXPORT void sdrt_gelu_erf_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_gelu_erf_op);
    (void)userdata;
    sdrt_view o = sdrt_tensor_view(dst);
    sdrt_view x = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    const void *tg = sdrt_tensor_src(dst, 1);
    sdrt_view gv = tg ? sdrt_tensor_view(tg) : x;
    const int64_t ne0 = o.ne[0], rows = o.ne[1] * o.ne[2] * o.ne[3];
    const int dense = x.nb[1] == (size_t)ne0 * 4 && x.nb[2] == x.nb[1] * (size_t)x.ne[1] &&
                      x.nb[3] == x.nb[2] * (size_t)x.ne[2] && gv.nb[1] == x.nb[1] && gv.nb[2] == x.nb[2] &&
                      gv.nb[3] == x.nb[3];
    if (dense || rows < nth) { /* one flat range (or row by row when rows are few) split in cache lines */
        const int64_t n = dense ? ne0 * rows : ne0;
        const int64_t per = ((n + nth - 1) / nth + 63) / 64 * 64;
        const int64_t i0 = per * ith, i1 = i0 + per < n ? i0 + per : n;
        if (i0 >= i1)
            return;
        for (int64_t r = 0; r < (dense ? 1 : rows); r++) {
            const row_ix ix = row_ix_of(o.ne, r);
            ops.gelu(i1 - i0, row_at(x, ix) + i0, tg ? row_at(gv, ix) + i0 : NULL, row_at(o, ix) + i0);
        }
        return;
    }
    const int64_t r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        const row_ix ix = row_ix_of(o.ne, r);
        ops.gelu(ne0, row_at(x, ix), tg ? row_at(gv, ix) : NULL, row_at(o, ix));
    }
}

/* ggml custom op: group statistics. src0 x ne (HW, C, N) dense; dst ne (2, G, N): mean and
 * 1/sqrt(var + eps) of each group of C/G channels (two passes: mean, then squared deviations). */
SDRT_EXPORT void sdrt_gn_stats_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_gn_stats_op);
    const sdrt_gn_params *pr = (const sdrt_gn_params *)userdata;
    sdrt_view o = sdrt_tensor_view(dst);
    sdrt_view x = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    const int G = pr->groups;
    const int64_t hw = x.ne[0], C = x.ne[1], N = x.ne[2], per = hw * (C / G);
    const int64_t T = N * G, t0 = T * ith / nth, t1 = T * (ith + 1) / nth;
    for (int64_t t = t0; t < t1; t++) {
        const float *xs = (const float *)(x.data + (size_t)(t / G) * x.nb[2]) + (size_t)(t % G) * per;
        const float mean = (float)(ops.sum(per, xs) / (double)per);
        const double var = ops.sqdev(per, xs, mean) / (double)per;
        float *out = (float *)(o.data + (size_t)(t / G) * o.nb[2] + (size_t)(t % G) * o.nb[1]);
        out[0] = mean;
        out[1] = (float)(1.0 / sqrt(var + pr->eps));
    }
}

/* ggml custom op: y = act((x - mean) * rstd * gamma + beta). src0 x ne (HW, C, N) dense,
 * src1 the stats (sdrt_gn_stats_op), src2 gamma and src3 beta (C floats each, or NULL).
 * dst ne (HW, C, N), or with cl ne (C, HW) for N = 1 (what a channels-last conv reads). */
SDRT_EXPORT void sdrt_gn_apply_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_gn_apply_op);
    const sdrt_gn_params *pr = (const sdrt_gn_params *)userdata;
    sdrt_view o = sdrt_tensor_view(dst);
    sdrt_view x = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    sdrt_view st = sdrt_tensor_view(sdrt_tensor_src(dst, 1));
    const void *tgam = sdrt_tensor_src(dst, 2), *tbet = sdrt_tensor_src(dst, 3);
    const float *gam = tgam ? (const float *)sdrt_tensor_view(tgam).data : NULL;
    const float *bet = tbet ? (const float *)sdrt_tensor_view(tbet).data : NULL;
    const int G = pr->groups;
    const int64_t hw = x.ne[0], C = x.ne[1], N = x.ne[2], cg = C / G;
#define GN_COEF(n, c, m, a, b)                                                                       \
    do {                                                                                           \
        const float *s_ = (const float *)(st.data + (size_t)(n) * st.nb[2] + (size_t)((c) / cg) * st.nb[1]); \
        (m) = s_[0];                                                                               \
        (a) = s_[1] * (gam ? gam[c] : 1.0f);                                                       \
        (b) = bet ? bet[c] : 0.0f;                                                                 \
    } while (0)
    if (pr->pad) { /* each plane's rows into a zero-padded plane of dst */
        const int64_t W = pr->W, H = W > 0 ? hw / W : 0, Wp = o.ne[0], Hp = o.ne[1];
        if (W <= 0 || H * W != hw || pr->top + H > Hp || pr->left + W > Wp)
            return;
        const int64_t T = N * C, t0 = T * ith / nth, t1 = T * (ith + 1) / nth;
        for (int64_t t = t0; t < t1; t++) {
            const int64_t n = t / C, c = t % C;
            float m, a, b;
            GN_COEF(n, c, m, a, b);
            const float *xs = (const float *)(x.data + (size_t)n * x.nb[2] + (size_t)c * x.nb[1]);
            float *d = (float *)(o.data + (size_t)n * o.nb[3] + (size_t)c * o.nb[2]);
            memset(d, 0, sizeof(float) * (size_t)(pr->top * Wp + pr->left));
            for (int64_t y = 0; y < H; y++) {
                float *row = d + (size_t)(pr->top + y) * Wp + pr->left;
                ops.affine_row(W, xs + (size_t)y * W, m, a, b, pr->silu, row);
                /* the right pad of this row and the left pad of the next */
                memset(row + W, 0, sizeof(float) * (size_t)(y + 1 < H ? Wp - W : Wp - W - pr->left));
            }
            const int64_t done = (pr->top + H) * Wp;
            memset(d + done, 0, sizeof(float) * (size_t)(Hp * Wp - done));
        }
        return;
    }
    if (!pr->cl) {
        const int64_t T = N * C, t0 = T * ith / nth, t1 = T * (ith + 1) / nth;
        for (int64_t t = t0; t < t1; t++) {
            const int64_t n = t / C, c = t % C;
            float m, a, b;
            GN_COEF(n, c, m, a, b);
            ops.affine_row(hw, (const float *)(x.data + (size_t)n * x.nb[2] + (size_t)c * x.nb[1]), m, a, b, pr->silu,
                           (float *)(o.data + (size_t)n * o.nb[2] + (size_t)c * o.nb[1]));
        }
        return;
    }
    /* channels-last: threads split the pixels in blocks of 16 */
    const int64_t blocks = (hw + 15) / 16, b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    if (b0 >= b1)
        return;
    float *coef = malloc(sizeof(float) * 3 * (size_t)C);
    if (!coef) {
        for (int64_t p = b0 * 16; p < hw && p < b1 * 16; p++)
            for (int64_t c = 0; c < C; c++)
                ((float *)o.data)[(size_t)p * C + c] = NAN;
        return;
    }
    for (int64_t c = 0; c < C; c++)
        GN_COEF(0, c, coef[c], coef[C + c], coef[2 * C + c]);
#undef GN_COEF
    ops.affine_cl(hw, (int)C, (const float *)x.data, coef, coef + C, coef + 2 * C, pr->silu, b0 * 16,
                  b1 * 16 < hw ? b1 * 16 : hw, (float *)o.data);
    free(coef);
}

/* ggml custom op: a layer norm over the rows of src0 (ne0 floats each, dense rows, any row strides):
 * y = (x - mean) / sqrt(var + eps) * gamma + beta, the mean and variance of each row in two passes
 * (as the group norm's). src1 gamma and src2 beta: ne0 floats each; userdata: the float eps. dst is
 * shaped as src0, dense. Threads take contiguous runs of rows. */
SDRT_EXPORT void sdrt_layer_norm_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_layer_norm_op);
    const float eps = *(const float *)userdata;
    sdrt_view o = sdrt_tensor_view(dst);
    sdrt_view x = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    const float *g = (const float *)sdrt_tensor_view(sdrt_tensor_src(dst, 1)).data;
    const float *b = (const float *)sdrt_tensor_view(sdrt_tensor_src(dst, 2)).data;
    const int64_t n = x.ne[0], rows = x.ne[1] * x.ne[2] * x.ne[3];
    if (n <= 0 || x.nb[0] != sizeof(float))
        return;
    for (int64_t r = rows * ith / nth; r < rows * (ith + 1) / nth; r++) {
        const row_ix ix = row_ix_of(x.ne, r);
        const float *xr = row_at(x, ix);
        float *yr = row_at(o, ix);
        const float mean = (float)(ops.sum(n, xr) / (double)n);
        const double var = ops.sqdev(n, xr, mean) / (double)n;
        ops.ln_row(n, xr, mean, (float)(1.0 / sqrt(var + eps)), g, b, yr);
    }
}

/* ggml custom op: dst[r] = the mean of row r of src0 (ne0 floats, dense rows; any number of rows):
 * global average pooling and ReduceMean over the innermost dims. Threads take rows in turn. */
SDRT_EXPORT void sdrt_rowmean_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_rowmean_op);
    (void)userdata;
    sdrt_view o = sdrt_tensor_view(dst);
    sdrt_view x = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    const int64_t n = x.ne[0], rows = x.ne[1] * x.ne[2] * x.ne[3];
    if (n <= 0 || x.nb[0] != sizeof(float))
        return;
    for (int64_t r = ith; r < rows; r += nth)
        ((float *)o.data)[r] = (float)(ops.sum(n, row_at(x, row_ix_of(x.ne, r))) / (double)n);
}

/* ggml custom op: the rotary embedding of interleaved pairs (Flux's apply_rotary_emb, diffusers'
 * use_real_unbind_dim=-1): y[2j] = x[2j] cos[2j] - x[2j+1] sin[2j], y[2j+1] = x[2j+1] cos[2j+1] +
 * x[2j] sin[2j+1]. src0 x: ne0 (even) floats a row, dense rows, any row strides; src1 cos and src2 sin:
 * ne0 floats a row, dense rows, each of dims 1-3 either x's or 1 (broadcast). dst shaped as x, dense.
 * The export's strided slices, Neg, Concat of the pair and two Muls and an Add become this one pass. */
SDRT_EXPORT void sdrt_rope_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_rope_op);
    (void)userdata;
    sdrt_view o = sdrt_tensor_view(dst);
    sdrt_view x = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    sdrt_view c = sdrt_tensor_view(sdrt_tensor_src(dst, 1));
    sdrt_view s = sdrt_tensor_view(sdrt_tensor_src(dst, 2));
    const int64_t n = x.ne[0], rows = x.ne[1] * x.ne[2] * x.ne[3];
    if (n <= 0 || (n & 1) || x.nb[0] != sizeof(float) || c.nb[0] != sizeof(float) || s.nb[0] != sizeof(float))
        return;
    for (int64_t r = rows * ith / nth; r < rows * (ith + 1) / nth; r++) {
        const row_ix ix = row_ix_of(x.ne, r);
        const row_ix cx = {c.ne[1] == 1 ? 0 : ix.i1, c.ne[2] == 1 ? 0 : ix.i2, c.ne[3] == 1 ? 0 : ix.i3};
        const row_ix sx = {s.ne[1] == 1 ? 0 : ix.i1, s.ne[2] == 1 ? 0 : ix.i2, s.ne[3] == 1 ? 0 : ix.i3};
        const float *xr = row_at(x, ix), *cr = row_at(c, cx), *sr = row_at(s, sx);
        float *yr = row_at(o, ix);
        for (int64_t j = 0; j < n; j += 2) {
            const float a = xr[j], b = xr[j + 1];
            yr[j] = a * cr[j] - b * sr[j];
            yr[j + 1] = b * cr[j + 1] + a * sr[j + 1];
        }
    }
}
