/* sdrt-ggml native kernels: one ISA's attention and GELU bodies, written once with GCC/Clang
 * vector extensions and included by ops_simd.c once per ISA, with
 *   VW        the vector width in floats (4: SSE2/NEON, 8: AVX2, 16: AVX-512),
 *   SFX(name) the per-ISA name of a function,
 * and the target attributes of that ISA pushed around the include. No intrinsics: the same
 * text compiles to SSE2, AVX2, AVX-512 or NEON code.
 */
#include <stdint.h>
#include <string.h>

/* aligned(4): loads and stores through these are unaligned; may_alias: they read float arrays */
typedef float SFX(vf) __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef int32_t SFX(vi) __attribute__((vector_size(VW * 4), aligned(4), may_alias));
#define VF SFX(vf)
#define VI SFX(vi)
#define BCAST(x) ((VF){0} + (float)(x))

/* (not memcpy: GCC's generic tuning expands a 32-byte memcpy as two 16-byte moves through
 * the stack, and the wide reload then stalls on store forwarding: AVX2 ran 8x slower) */
SDRT_INLINE VF SFX(ld)(const float *p) { return *(const VF *)p; }
SDRT_INLINE void SFX(st)(float *p, VF v) { *(VF *)p = v; }
SDRT_INLINE VF SFX(sel)(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); }
SDRT_INLINE float SFX(hsum)(VF v) {
    float s = 0.0f;
    for (int i = 0; i < VW; i++)
        s += v[i];
    return s;
}

/* y[r] = w[r ldw ..] . x for r < rows (K floats each): a matrix-vector product, four rows at a time
 * so that each vector of x is loaded once for four rows' products (memory-bound: w streams) */
static void SFX(dot_rows)(int rows, int K, const float *w, ptrdiff_t ldw, const float *x, float *y) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *w0 = w + (ptrdiff_t)r * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        VF a0 = BCAST(0.0f), a1 = a0, a2 = a0, a3 = a0;
        int k = 0;
        for (; k + VW <= K; k += VW) {
            const VF xv = SFX(ld)(x + k);
            a0 += SFX(ld)(w0 + k) * xv;
            a1 += SFX(ld)(w1 + k) * xv;
            a2 += SFX(ld)(w2 + k) * xv;
            a3 += SFX(ld)(w3 + k) * xv;
        }
        float s0 = SFX(hsum)(a0), s1 = SFX(hsum)(a1), s2 = SFX(hsum)(a2), s3 = SFX(hsum)(a3);
        for (; k < K; k++) {
            s0 += w0[k] * x[k];
            s1 += w1[k] * x[k];
            s2 += w2[k] * x[k];
            s3 += w3[k] * x[k];
        }
        y[r] = s0;
        y[r + 1] = s1;
        y[r + 2] = s2;
        y[r + 3] = s3;
    }
    for (; r < rows; r++) {
        const float *wr = w + (ptrdiff_t)r * ldw;
        VF a = BCAST(0.0f);
        int k = 0;
        for (; k + VW <= K; k += VW)
            a += SFX(ld)(wr + k) * SFX(ld)(x + k);
        float sum = SFX(hsum)(a);
        for (; k < K; k++)
            sum += wr[k] * x[k];
        y[r] = sum;
    }
}

/* exp(x) for x <= 88: Cody-Waite reduction by ln 2, a degree-6 polynomial on |r| <= ln2/2
 * (relative error below 2e-7), 2^n through the exponent bits; below -87.3 (and -inf) it is 0. */
SDRT_INLINE VF SFX(vexp)(VF x) {
    const VF lo = BCAST(-87.3f);
    VI under = x < lo;
    x = SFX(sel)(under, lo, x);
    const VF magic = BCAST(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    VF m = x * 1.44269504088896341f + magic;
    VF n = m - magic;
    VI ni = (VI)m - (VI)magic;
    VF r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    VF p = BCAST(1.0f / 720.0f);
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    VI bits = (VI)p + (ni << 23);
    return (VF)(bits & ~under);
}

/* exp(x) for x <= 0, the softmax's: the argument clamped at -87.3 instead of masked (exp(-87.3)
 * is 1e-38, as good as the 0 it stands for next to the row's maximum, which is 1), one FMA-based
 * reduction step (the error it leaves grows with |n|, where exp is tiny anyway) and a degree-5
 * polynomial: relative error about 2e-7 where exp > 1e-6, at 11 vector operations. */
SDRT_INLINE VF SFX(vexp_neg)(VF x) {
    const VF lo = BCAST(-87.3f);
    x = SFX(sel)(x < lo, lo, x);
    const VF magic = BCAST(12582912.0f);
    VF m = x * 1.44269504088896341f + magic;
    VF n = m - magic;
    VI ni = (VI)m - (VI)magic;
    VF r = x - n * 0.6931471805599453f;
    VF p = BCAST(1.3981999e-3f);
    p = p * r + 8.3334519e-3f;
    p = p * r + 4.1665795e-2f;
    p = p * r + 1.6666665e-1f;
    p = p * r + 5.0000001e-1f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return (VF)((VI)p + (ni << 23));
}

/* an epilogue's activation (sdrt_epilogue) of a vector; ep NULL: none */
SDRT_INLINE VF SFX(vact)(const sdrt_epilogue *ep, VF v) {
    if (!ep)
        return v;
    switch (ep->act) {
    case SDRT_ACT_RELU:
        return SFX(sel)(v > BCAST(0.0f), v, BCAST(0.0f));
    case SDRT_ACT_CLIP:
        v = SFX(sel)(v < BCAST(ep->lo), BCAST(ep->lo), v);
        return SFX(sel)(v > BCAST(ep->hi), BCAST(ep->hi), v);
    case SDRT_ACT_HARDSWISH: {
        VF g = v * (1.0f / 6.0f) + 0.5f;
        g = SFX(sel)(g < BCAST(0.0f), BCAST(0.0f), g);
        g = SFX(sel)(g > BCAST(1.0f), BCAST(1.0f), g);
        return v * g;
    }
    case SDRT_ACT_SILU: { /* v sigmoid(lo v), exp's argument clamped at 88 */
        VF z = v * -ep->lo;
        z = SFX(sel)(z > BCAST(88.0f), BCAST(88.0f), z);
        return v / (1.0f + SFX(vexp)(z));
    }
    case SDRT_ACT_GELU_TANH: { /* v sigmoid(2 sqrt(2/pi) (v + 0.044715 v^3)) */
        VF z = v * (-SDRT_GELU_G1 - SDRT_GELU_G3 * (v * v));
        z = SFX(sel)(z > BCAST(88.0f), BCAST(88.0f), z);
        return v / (1.0f + SFX(vexp)(z));
    }
    default:
        return v;
    }
}

/* ---- attention ---------------------------------------------------------------------- */

/* after a block's scores: add each row's mask, set the keys past `valid` to -inf, and take each row's max */
SDRT_INLINE void SFX(mask_rowmax)(int R, int kb, int valid, const float *const *mask, int moff, float *S, int Sld,
                                  float *mx) {
    for (int r = 0; r < R; r++) {
        float *s = S + (size_t)r * Sld;
        if (mask)
            for (int j = 0; j < valid && j < kb; j++)
                s[j] += mask[r][moff + j];
        for (int j = valid < 0 ? 0 : valid; j < kb; j++)
            s[j] = -INFINITY;
        VF m = SFX(ld)(s);
        for (int k = VW; k < kb; k += VW) {
            const VF v = SFX(ld)(s + k);
            m = SFX(sel)(v > m, v, m);
        }
        float best = -INFINITY;
        for (int i = 0; i < VW; i++)
            best = m[i] > best ? m[i] : best;
        mx[r] = best;
    }
}

/* S[r][0..kb) = qs[r] . kt[., k] + mask[r][k] for r < R (R <= 4), kt with row stride ld (kb a
 * multiple of 2*VW); columns from `valid` on get -inf. Returns each row's maximum in mx[r].
 * (Scalar * vector products, not BCAST: GCC then broadcasts straight from memory.) */
SDRT_INLINE void SFX(scores)(int R, int D, int kb, int ld, int valid, const float *qs, const float *kt,
                             const float *const *mask, int moff, float *S, int Sld, float *mx) {
    const float *q0 = qs, *q1 = qs + D, *q2 = qs + 2 * D, *q3 = qs + 3 * D;
    for (int k0 = 0; k0 < kb; k0 += 2 * VW) {
        VF a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
        const float *kp = kt + k0;
        if (R == 4) {
            for (int d = 0; d < D; d++, kp += ld) {
                const VF k0v = SFX(ld)(kp), k1v = SFX(ld)(kp + VW);
                a00 += k0v * q0[d]; a01 += k1v * q0[d];
                a10 += k0v * q1[d]; a11 += k1v * q1[d];
                a20 += k0v * q2[d]; a21 += k1v * q2[d];
                a30 += k0v * q3[d]; a31 += k1v * q3[d];
            }
        } else {
            for (int d = 0; d < D; d++, kp += ld) {
                const VF k0v = SFX(ld)(kp), k1v = SFX(ld)(kp + VW);
                a00 += k0v * q0[d]; a01 += k1v * q0[d];
                if (R > 1) { a10 += k0v * q1[d]; a11 += k1v * q1[d]; }
                if (R > 2) { a20 += k0v * q2[d]; a21 += k1v * q2[d]; }
            }
        }
        SFX(st)(S + k0, a00);
        SFX(st)(S + k0 + VW, a01);
        if (R > 1) { SFX(st)(S + Sld + k0, a10); SFX(st)(S + Sld + k0 + VW, a11); }
        if (R > 2) { SFX(st)(S + 2 * Sld + k0, a20); SFX(st)(S + 2 * Sld + k0 + VW, a21); }
        if (R > 3) { SFX(st)(S + 3 * Sld + k0, a30); SFX(st)(S + 3 * Sld + k0 + VW, a31); }
    }
    SFX(mask_rowmax)(R, kb, valid, mask, moff, S, Sld, mx);
}

/* acc[r][c0 .. c0 + NV*VW) = acc * alpha[r] + P[r] . v[., same columns] over kb keys, for 4 rows;
 * the accumulators live in registers (named, not arrays, so that they stay there) */
#define SFX_PV(NV) \
    SDRT_INLINE void SFX(pv4_##NV)(int kb, const float *P, int Pld, const float *v, int vld, float *acc, int ald, \
                                   const float *alpha) { \
        VF x00 = {0}, x01 = {0}, x02 = {0}, x10 = {0}, x11 = {0}, x12 = {0}; \
        VF x20 = {0}, x21 = {0}, x22 = {0}, x30 = {0}, x31 = {0}, x32 = {0}; \
        const float al0 = alpha[0], al1 = alpha[1], al2 = alpha[2], al3 = alpha[3]; \
        x00 = SFX(ld)(acc) * al0; x10 = SFX(ld)(acc + ald) * al1; \
        x20 = SFX(ld)(acc + 2 * ald) * al2; x30 = SFX(ld)(acc + 3 * ald) * al3; \
        if (NV > 1) { x01 = SFX(ld)(acc + VW) * al0; x11 = SFX(ld)(acc + ald + VW) * al1; \
                      x21 = SFX(ld)(acc + 2 * ald + VW) * al2; x31 = SFX(ld)(acc + 3 * ald + VW) * al3; } \
        if (NV > 2) { x02 = SFX(ld)(acc + 2 * VW) * al0; x12 = SFX(ld)(acc + ald + 2 * VW) * al1; \
                      x22 = SFX(ld)(acc + 2 * ald + 2 * VW) * al2; x32 = SFX(ld)(acc + 3 * ald + 2 * VW) * al3; } \
        for (int k = 0; k < kb; k++) { \
            const float *vk = v + (size_t)k * vld; \
            const VF v0 = SFX(ld)(vk); \
            const float p0 = P[k], p1 = P[Pld + k], p2 = P[2 * Pld + k], p3 = P[3 * Pld + k]; \
            x00 += v0 * p0; x10 += v0 * p1; x20 += v0 * p2; x30 += v0 * p3; \
            if (NV > 1) { const VF v1 = SFX(ld)(vk + VW); x01 += v1 * p0; x11 += v1 * p1; x21 += v1 * p2; x31 += v1 * p3; } \
            if (NV > 2) { const VF v2 = SFX(ld)(vk + 2 * VW); x02 += v2 * p0; x12 += v2 * p1; x22 += v2 * p2; x32 += v2 * p3; } \
        } \
        SFX(st)(acc, x00); SFX(st)(acc + ald, x10); SFX(st)(acc + 2 * ald, x20); SFX(st)(acc + 3 * ald, x30); \
        if (NV > 1) { SFX(st)(acc + VW, x01); SFX(st)(acc + ald + VW, x11); \
                      SFX(st)(acc + 2 * ald + VW, x21); SFX(st)(acc + 3 * ald + VW, x31); } \
        if (NV > 2) { SFX(st)(acc + 2 * VW, x02); SFX(st)(acc + ald + 2 * VW, x12); \
                      SFX(st)(acc + 2 * ald + 2 * VW, x22); SFX(st)(acc + 3 * ald + 2 * VW, x32); } \
    }
SFX_PV(1)
SFX_PV(2)
SFX_PV(3)
#undef SFX_PV

/* the same for R < 4 rows, one vector of columns at a time */
SDRT_INLINE void SFX(pv_rows)(int R, int kb, const float *P, int Pld, const float *v, int vld, float *acc, int ald,
                              int dvp, const float *alpha) {
    for (int c = 0; c < dvp; c += VW)
        for (int r = 0; r < R; r++) {
            VF x = SFX(ld)(acc + (size_t)r * ald + c) * alpha[r];
            const float *pr = P + (size_t)r * Pld;
            for (int k = 0; k < kb; k++)
                x += SFX(ld)(v + (size_t)k * vld + c) * pr[k];
            SFX(st)(acc + (size_t)r * ald + c, x);
        }
}

/* The 8-row tiles (AVX-512 only, where the 16 + 8 accumulators fit in 32 registers): each K^T and V
 * vector loaded serves 8 rows' multiply-adds instead of 4, and the scores' 16 independent
 * accumulators cover the FMA latency twice over. q8: the 8 rows' queries transposed (q8[d * 8 + r]),
 * so each broadcast is a fixed displacement from one pointer. */
SDRT_INLINE void SFX(scores8)(int D, int kb, int ld, int valid, const float *q8, const float *kt,
                              const float *const *mask, int moff, float *S, int Sld, float *mx) {
    for (int k0 = 0; k0 < kb; k0 += 2 * VW) {
        VF a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
        VF a40 = {0}, a41 = {0}, a50 = {0}, a51 = {0}, a60 = {0}, a61 = {0}, a70 = {0}, a71 = {0};
        const float *kp = kt + k0, *qd = q8;
        for (int d = 0; d < D; d++, kp += ld, qd += 8) {
            const VF k0v = SFX(ld)(kp), k1v = SFX(ld)(kp + VW);
            a00 += k0v * qd[0]; a01 += k1v * qd[0];
            a10 += k0v * qd[1]; a11 += k1v * qd[1];
            a20 += k0v * qd[2]; a21 += k1v * qd[2];
            a30 += k0v * qd[3]; a31 += k1v * qd[3];
            a40 += k0v * qd[4]; a41 += k1v * qd[4];
            a50 += k0v * qd[5]; a51 += k1v * qd[5];
            a60 += k0v * qd[6]; a61 += k1v * qd[6];
            a70 += k0v * qd[7]; a71 += k1v * qd[7];
        }
        float *s = S + k0;
        SFX(st)(s, a00); SFX(st)(s + VW, a01); s += Sld;
        SFX(st)(s, a10); SFX(st)(s + VW, a11); s += Sld;
        SFX(st)(s, a20); SFX(st)(s + VW, a21); s += Sld;
        SFX(st)(s, a30); SFX(st)(s + VW, a31); s += Sld;
        SFX(st)(s, a40); SFX(st)(s + VW, a41); s += Sld;
        SFX(st)(s, a50); SFX(st)(s + VW, a51); s += Sld;
        SFX(st)(s, a60); SFX(st)(s + VW, a61); s += Sld;
        SFX(st)(s, a70); SFX(st)(s + VW, a71);
    }
    SFX(mask_rowmax)(8, kb, valid, mask, moff, S, Sld, mx);
}

/* acc[r][c0 .. c0 + NV*VW) = acc * alpha[r] + P[r] . v[., same columns] over kb keys, for 8 rows */
#define SFX_PV8(NV) \
    SDRT_INLINE void SFX(pv8_##NV)(int kb, const float *P, int Pld, const float *v, int vld, float *acc, int ald, \
                                   const float *alpha) { \
        VF x[8][NV]; \
        for (int r = 0; r < 8; r++) \
            for (int c = 0; c < NV; c++) \
                x[r][c] = SFX(ld)(acc + (size_t)r * ald + c * VW) * alpha[r]; \
        const float *p0 = P, *p4 = P + 4 * (size_t)Pld; \
        const size_t pl = (size_t)Pld; \
        for (int k = 0; k < kb; k++, p0++, p4++) { \
            const float *vk = v + (size_t)k * vld; \
            VF vv[NV]; \
            for (int c = 0; c < NV; c++) \
                vv[c] = SFX(ld)(vk + c * VW); \
            const float pr[8] = {p0[0], p0[pl], p0[2 * pl], p0[3 * pl], p4[0], p4[pl], p4[2 * pl], p4[3 * pl]}; \
            for (int r = 0; r < 8; r++) \
                for (int c = 0; c < NV; c++) \
                    x[r][c] += vv[c] * pr[r]; \
        } \
        for (int r = 0; r < 8; r++) \
            for (int c = 0; c < NV; c++) \
                SFX(st)(acc + (size_t)r * ald + c * VW, x[r][c]); \
    }
SFX_PV8(1)
SFX_PV8(2)
SFX_PV8(3)
#undef SFX_PV8

/* the exp pass of R rows of a key block: each row's scores S[r][0..kb) become exp(s - new running maximum),
 * their sum added to lrow after it is rescaled by alpha[r] = exp(old maximum - new) */
SDRT_INLINE void SFX(block_exp)(int R, int kb, float *S, int Sld, const float *bmax, float *mrow, float *lrow,
                                float *alpha) {
    for (int r = 0; r < R; r++) {
        float *s = S + (size_t)r * Sld;
        const float mold = mrow[r], mnew = bmax[r] > mold ? bmax[r] : mold;
        alpha[r] = 1.0f;
        if (mnew == -INFINITY) { /* every key so far masked: nothing to add yet */
            memset(s, 0, sizeof(float) * (size_t)kb);
            continue;
        }
        alpha[r] = mold == -INFINITY ? 0.0f : expf(mold - mnew);
        const VF mv = BCAST(mnew);
        VF sum = {0};
        for (int k = 0; k < kb; k += VW) {
            VF e = SFX(vexp_neg)(SFX(ld)(s + k) - mv);
            SFX(st)(s + k, e);
            sum += e;
        }
        lrow[r] = lrow[r] * alpha[r] + SFX(hsum)(sum);
        mrow[r] = mnew;
    }
}

/* Attention of `rows` query rows of one head (flash attention's online softmax): keys in blocks
 * of job->kb; for each block and each group of 4 rows, the scores (with each row's block maximum),
 * exp against the running maximum, and the weighted sum of V added to the rows' accumulators after
 * rescaling them to the new maximum. The key block's K^T and V stay in L1 over the rows.
 * qs: the rows' scaled queries (rows x D); work: scratch of sdrt_attn_work_floats(job, rows). */
static void SFX(attend)(const sdrt_attn_job *job, int rows, const float *qs, const float *const *mask,
                        float *const *out, float *work) {
    const int D = job->D, Dv = job->Dv, dvp = job->dvp, nk = job->nk, n_kv = job->n_kv, KB = job->kb;
    /* rows a group: 8 where 32 vector registers hold the 8-row tiles, else 4 */
    enum { G = VW == 16 ? 8 : 4 };
    float *S = work, *acc = S + 8 * (size_t)KB, *mrow = acc + (size_t)rows * dvp, *lrow = mrow + rows;
    float *q8 = lrow + rows; /* G = 8: each full group's queries transposed, 8 D floats a group */
    memset(acc, 0, sizeof(float) * (size_t)rows * dvp);
    if (G == 8)
        for (int r0 = 0; r0 + 8 <= rows; r0 += 8)
            for (int r = 0; r < 8; r++)
                for (int d = 0; d < D; d++)
                    q8[(size_t)r0 * D + (size_t)d * 8 + r] = qs[(size_t)(r0 + r) * D + d];
    /* the keys each group of rows reads: all, but where the mask ends a row with keys it masks
     * out (-inf, or below -1e30 like a causal mask's float32 min), only up to the row's last key it
     * keeps. The keys left out would add exp(-huge) = 0 exactly. A row that masks every key keeps
     * them all: softmax over equal scores, as onnxruntime computes it. */
    int glive[16]; /* rows <= 64 */
    for (int r0 = 0; r0 < rows; r0 += G) {
        int g = 0;
        for (int r = r0; r < rows && r < r0 + G; r++) {
            int j = n_kv;
            if (mask)
                while (j > 0 && mask[r][j - 1] <= -1e30f)
                    j--;
            j = j == 0 ? n_kv : j;
            g = j > g ? j : g;
        }
        glive[r0 / G] = g;
    }
    for (int r = 0; r < rows; r++) {
        mrow[r] = -INFINITY;
        lrow[r] = 0.0f;
    }
    for (int k0 = 0; k0 < n_kv; k0 += KB) {
        const int kbb = nk - k0 < KB ? nk - k0 : KB; /* nk and KB are multiples of 2 VW */
        const float *vb = job->v + (size_t)k0 * dvp;
        for (int r0 = 0; r0 < rows; r0 += G) {
            const int RG = rows - r0 < G ? rows - r0 : G;
            const int live = (glive[r0 / G] - k0 + 2 * VW - 1) / (2 * VW) * (2 * VW);
            if (live <= 0)
                continue; /* every key of this block masked out for these rows */
            const int kb = live < kbb ? live : kbb;
            float bmax[8], alpha[8];
            if (G == 8 && RG == 8) {
                SFX(scores8)(D, kb, kbb, n_kv - k0, q8 + (size_t)r0 * D, job->kt + (size_t)k0 * D, mask ? mask + r0 : NULL,
                             k0, S, KB, bmax);
                SFX(block_exp)(8, kb, S, KB, bmax, mrow + r0, lrow + r0, alpha);
                float *ab = acc + (size_t)r0 * dvp;
                int c = 0;
                for (; c + 3 * VW <= dvp; c += 3 * VW)
                    SFX(pv8_3)(kb, S, KB, vb + c, dvp, ab + c, dvp, alpha);
                if (c + 2 * VW <= dvp) {
                    SFX(pv8_2)(kb, S, KB, vb + c, dvp, ab + c, dvp, alpha);
                    c += 2 * VW;
                }
                if (c + VW <= dvp)
                    SFX(pv8_1)(kb, S, KB, vb + c, dvp, ab + c, dvp, alpha);
                continue;
            }
            for (int s0 = r0; s0 < r0 + RG; s0 += 4) { /* groups of 4 rows (and the last 1-3) */
                const int R = r0 + RG - s0 < 4 ? r0 + RG - s0 : 4;
                SFX(scores)(R, D, kb, kbb, n_kv - k0, qs + (size_t)s0 * D, job->kt + (size_t)k0 * D,
                            mask ? mask + s0 : NULL, k0, S, KB, bmax);
                SFX(block_exp)(R, kb, S, KB, bmax, mrow + s0, lrow + s0, alpha);
                float *ab = acc + (size_t)s0 * dvp;
                if (R == 4) {
                    /* 3 vectors a chunk (12 accumulators) where there are 32 vector registers; with 16,
                     * 2 (8 accumulators, 2 of V, 4 broadcasts): GCC spilled one accumulator of the 3 */
                    int c = 0;
                    if (VW == 16)
                        for (; c + 3 * VW <= dvp; c += 3 * VW)
                            SFX(pv4_3)(kb, S, KB, vb + c, dvp, ab + c, dvp, alpha);
                    for (; c + 2 * VW <= dvp; c += 2 * VW)
                        SFX(pv4_2)(kb, S, KB, vb + c, dvp, ab + c, dvp, alpha);
                    if (c + VW <= dvp)
                        SFX(pv4_1)(kb, S, KB, vb + c, dvp, ab + c, dvp, alpha);
                } else {
                    SFX(pv_rows)(R, kb, S, KB, vb, dvp, ab, dvp, dvp, alpha);
                }
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f; /* every key masked: 0 */
        for (int d = 0; d < Dv; d++)
            out[r][d] = acc[(size_t)r * dvp + d] * inv;
    }
}

/* ---- GELU (erf form) ---------------------------------------------------------------- */

/* y = 0.5 x (1 + erf(x / sqrt 2)) [* g]; erf by Abramowitz-Stegun 7.1.26 (absolute error
 * below 1.5e-7) with the exp above */
static void SFX(gelu_erf)(int64_t n, const float *x, const float *g, float *y) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        VF v = SFX(ld)(x + i);
        VF z = v * 0.70710678118654752f;
        VI neg = z < BCAST(0.0f);
        VF a = SFX(sel)(neg, -z, z);
        VF t = 1.0f / (1.0f + 0.3275911f * a);
        VF p = BCAST(1.061405429f);
        p = p * t - 1.453152027f;
        p = p * t + 1.421413741f;
        p = p * t - 0.284496736f;
        p = p * t + 0.254829592f;
        VF e = 1.0f - p * t * SFX(vexp)(-(a * a)); /* erf(|z|) */
        VF erf = SFX(sel)(neg, -e, e);
        VF out = 0.5f * v * (1.0f + erf);
        if (g)
            out *= SFX(ld)(g + i);
        SFX(st)(y + i, out);
    }
    if (i < n) { /* the tail through one padded vector */
        float xb[VW] = {0}, gb[VW], yb[VW];
        memcpy(xb, x + i, (size_t)(n - i) * sizeof(float));
        if (g)
            memcpy(gb, g + i, (size_t)(n - i) * sizeof(float));
        SFX(gelu_erf)(VW, xb, g ? gb : NULL, yb);
        memcpy(y + i, yb, (size_t)(n - i) * sizeof(float));
    }
}

/* ---- group norm ------------------------------------------------------------------- */

/* sum of x[0..n) */
static double SFX(sum)(int64_t n, const float *x) {
    /* four accumulators: one chain of vector adds is bound by the add latency (3-4 cycles), not
     * by the two loads a cycle the core can issue */
    VF acc = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 4 * VW <= n; i += 4 * VW) {
        acc += SFX(ld)(x + i);
        a1 += SFX(ld)(x + i + VW);
        a2 += SFX(ld)(x + i + 2 * VW);
        a3 += SFX(ld)(x + i + 3 * VW);
    }
    for (; i + VW <= n; i += VW)
        acc += SFX(ld)(x + i);
    double s = SFX(hsum)((acc + a1) + (a2 + a3));
    for (; i < n; i++)
        s += x[i];
    return s;
}

/* sum of (x[i] - m)^2 */
static double SFX(sqdev)(int64_t n, const float *x, float m) {
    VF acc = {0}, a1 = {0}, a2 = {0}, a3 = {0}, mv = BCAST(m);
    int64_t i = 0;
    for (; i + 4 * VW <= n; i += 4 * VW) { /* four accumulators, as in sum */
        VF d0 = SFX(ld)(x + i) - mv, d1 = SFX(ld)(x + i + VW) - mv;
        VF d2 = SFX(ld)(x + i + 2 * VW) - mv, d3 = SFX(ld)(x + i + 3 * VW) - mv;
        acc += d0 * d0;
        a1 += d1 * d1;
        a2 += d2 * d2;
        a3 += d3 * d3;
    }
    for (; i + VW <= n; i += VW) {
        VF d = SFX(ld)(x + i) - mv;
        acc += d * d;
    }
    double s = SFX(hsum)((acc + a1) + (a2 + a3));
    for (; i < n; i++)
        s += (double)(x[i] - m) * (x[i] - m);
    return s;
}

/* x * sigmoid(x) = x / (1 + exp(-x)); exp's argument clamped at 88 (the result is then -0) */
SDRT_INLINE VF SFX(silu)(VF v) {
    VF e = -v;
    VI big = e > BCAST(88.0f);
    e = SFX(sel)(big, BCAST(88.0f), e);
    return v / (1.0f + SFX(vexp)(e));
}

/* y[i] = act((x[i] - m) * a + b): the mean subtracted first, so a large mean costs no precision */
static void SFX(affine_row)(int64_t n, const float *x, float m, float a, float b, int silu, float *y) {
    VF mv = BCAST(m), av = BCAST(a), bv = BCAST(b);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        VF v = (SFX(ld)(x + i) - mv) * av + bv;
        SFX(st)(y + i, silu ? SFX(silu)(v) : v);
    }
    if (i < n) {
        float xb[VW] = {0}, yb[VW];
        memcpy(xb, x + i, (size_t)(n - i) * sizeof(float));
        SFX(affine_row)(VW, xb, m, a, b, silu, yb);
        memcpy(y + i, yb, (size_t)(n - i) * sizeof(float));
    }
}

/* a layer norm's row: y[i] = (x[i] - m) * a * g[i] + b[i] (g, b: the scale and bias, n floats each) */
static void SFX(ln_row)(int64_t n, const float *x, float m, float a, const float *g, const float *b, float *y) {
    VF mv = BCAST(m), av = BCAST(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        SFX(st)(y + i, (SFX(ld)(x + i) - mv) * av * SFX(ld)(g + i) + SFX(ld)(b + i));
    for (; i < n; i++)
        y[i] = (x[i] - m) * a * g[i] + b[i];
}

/* channels-last output: y[p * C + c] = act((x[c * hw + p] - m[c]) * a[c] + b[c]) for p in [p0, p1) */
static void SFX(affine_cl)(int64_t hw, int C, const float *x, const float *m, const float *a, const float *b, int silu,
                           int64_t p0, int64_t p1, float *y) {
    int64_t p = p0;
    for (; p + VW <= p1; p += VW)
        for (int c = 0; c < C; c++) {
            VF v = (SFX(ld)(x + (size_t)c * hw + p) - m[c]) * a[c] + b[c];
            if (silu)
                v = SFX(silu)(v);
            float *out = y + (size_t)p * C + c;
            for (int i = 0; i < VW; i++)
                out[(size_t)i * C] = v[i];
        }
    for (; p < p1; p++)
        for (int c = 0; c < C; c++) {
            float v = (x[(size_t)c * hw + p] - m[c]) * a[c] + b[c];
            y[(size_t)p * C + c] = silu ? v / (1.0f + expf(-v < 88.0f ? -v : 88.0f)) : v;
        }
}

#include "simd_dw.h"
#include "simd_wino.h"

#undef VF
#undef VI
#undef BCAST
