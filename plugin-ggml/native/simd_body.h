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

/* ---- attention ---------------------------------------------------------------------- */

/* S[r][0..nk) = qs[r] . kt[., k] + mask[r][k] for r < R (R <= 4); kt is D x nk (nk a
 * multiple of 2*VW), column k of S past n_kv gets -inf */
SDRT_INLINE void SFX(scores)(int R, int D, int nk, int n_kv, const float *qs, const float *kt,
                             const float *const *mask, float *S) {
    for (int k0 = 0; k0 < nk; k0 += 2 * VW) {
        VF a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
        const float *kp = kt + k0;
        if (R == 4) {
            for (int d = 0; d < D; d++, kp += nk) {
                VF k0v = SFX(ld)(kp), k1v = SFX(ld)(kp + VW);
                VF c0 = BCAST(qs[d]), c1 = BCAST(qs[D + d]), c2 = BCAST(qs[2 * D + d]), c3 = BCAST(qs[3 * D + d]);
                a00 += c0 * k0v; a01 += c0 * k1v;
                a10 += c1 * k0v; a11 += c1 * k1v;
                a20 += c2 * k0v; a21 += c2 * k1v;
                a30 += c3 * k0v; a31 += c3 * k1v;
            }
        } else {
            for (int d = 0; d < D; d++, kp += nk) {
                VF k0v = SFX(ld)(kp), k1v = SFX(ld)(kp + VW);
                VF c0 = BCAST(qs[d]);
                a00 += c0 * k0v; a01 += c0 * k1v;
                if (R > 1) { VF c1 = BCAST(qs[D + d]); a10 += c1 * k0v; a11 += c1 * k1v; }
                if (R > 2) { VF c2 = BCAST(qs[2 * D + d]); a20 += c2 * k0v; a21 += c2 * k1v; }
            }
        }
        VF acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
        for (int r = 0; r < R; r++) {
            float *s = S + (size_t)r * nk + k0;
            SFX(st)(s, acc[r][0]);
            SFX(st)(s + VW, acc[r][1]);
            int end = n_kv - k0 < 2 * VW ? n_kv - k0 : 2 * VW;
            if (mask)
                for (int j = 0; j < end; j++)
                    s[j] += mask[r][k0 + j];
            for (int j = end < 0 ? 0 : end; j < 2 * VW; j++)
                s[j] = -INFINITY;
        }
    }
}

/* softmax of each of R rows in place (unnormalised: returns 1/sum in inv[r]) */
SDRT_INLINE void SFX(softmax_rows)(int R, int nk, float *S, float *inv) {
    for (int r = 0; r < R; r++) {
        float *s = S + (size_t)r * nk;
        VF mx = BCAST(-INFINITY);
        for (int k = 0; k < nk; k += VW) {
            VF v = SFX(ld)(s + k);
            mx = SFX(sel)(v > mx, v, mx);
        }
        float m = -INFINITY;
        for (int i = 0; i < VW; i++)
            m = mx[i] > m ? mx[i] : m;
        if (m == -INFINITY) { /* every key masked: the row's output is 0 */
            memset(s, 0, (size_t)nk * sizeof(float));
            inv[r] = 0.0f;
            continue;
        }
        VF sum = {0};
        VF mv = BCAST(m);
        for (int k = 0; k < nk; k += VW) {
            VF e = SFX(vexp)(SFX(ld)(s + k) - mv);
            SFX(st)(s + k, e);
            sum += e;
        }
        inv[r] = 1.0f / SFX(hsum)(sum);
    }
}

/* out[r][dv] = inv[r] * P[r] . vt[dv] for r < R, dv < Dv; vt is Dv x nk */
SDRT_INLINE void SFX(weighted)(int R, int Dv, int nk, const float *P, const float *vt, const float *inv,
                               float *const *out) {
    int dv = 0;
    for (; dv + 2 <= Dv; dv += 2) {
        const float *v0 = vt + (size_t)dv * nk, *v1 = v0 + nk;
        VF acc[4][2] = {{{0}}};
        for (int k = 0; k < nk; k += VW) {
            VF x0 = SFX(ld)(v0 + k), x1 = SFX(ld)(v1 + k);
            for (int r = 0; r < 4; r++) {
                if (r < R) {
                    VF p = SFX(ld)(P + (size_t)r * nk + k);
                    acc[r][0] += p * x0;
                    acc[r][1] += p * x1;
                }
            }
        }
        for (int r = 0; r < R; r++) {
            out[r][dv] = SFX(hsum)(acc[r][0]) * inv[r];
            out[r][dv + 1] = SFX(hsum)(acc[r][1]) * inv[r];
        }
    }
    for (; dv < Dv; dv++) {
        const float *v0 = vt + (size_t)dv * nk;
        VF acc[4] = {{0}};
        for (int k = 0; k < nk; k += VW) {
            VF x0 = SFX(ld)(v0 + k);
            for (int r = 0; r < R; r++)
                acc[r] += SFX(ld)(P + (size_t)r * nk + k) * x0;
        }
        for (int r = 0; r < R; r++)
            out[r][dv] = SFX(hsum)(acc[r]) * inv[r];
    }
}

static void SFX(attention_rows)(const sdrt_attn_job *job, int R, const float *qs, const float *const *mask,
                                float *const *out) {
    SFX(scores)(R, job->D, job->nk, job->n_kv, qs, job->kt, mask, job->S);
    float inv[4];
    SFX(softmax_rows)(R, job->nk, job->S, inv);
    SFX(weighted)(R, job->Dv, job->nk, job->S, job->vt, inv, out);
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
    VF acc = {0};
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        acc += SFX(ld)(x + i);
    double s = SFX(hsum)(acc);
    for (; i < n; i++)
        s += x[i];
    return s;
}

/* sum of (x[i] - m)^2 */
static double SFX(sqdev)(int64_t n, const float *x, float m) {
    VF acc = {0}, mv = BCAST(m);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        VF d = SFX(ld)(x + i) - mv;
        acc += d * d;
    }
    double s = SFX(hsum)(acc);
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

#undef VF
#undef VI
#undef BCAST
