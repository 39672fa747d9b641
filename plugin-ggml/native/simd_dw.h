/* sdrt-ggml native kernels: one ISA's depthwise-conv run, included by simd_body.h (same VW, SFX). */

/* Depthwise conv over a run of output positions q in [0, nq), vectorised along q:
 *   out[q] = act(bias + sum_t w[t] . base[off[t] + q]),  t < nt.
 * The positions run over the zero-padded (phase) planes of one channel (dwconv.c), so each tap is
 * a contiguous, unconditional vector load. Four vectors of q at a time keep four independent
 * accumulator chains (one chain would wait on the multiply-add latency at every tap). The run's
 * end is taken the same way, two or four vectors at once, never one chain alone: a 7x7 map is
 * four vectors in all, and one chain a vector spent four times the multiply-adds' throughput
 * (960 channels at 7x7, stride 1). Four vectors are taken while more than two remain, then two:
 * out and the planes reach up to 2 VW - 1 floats past the run. */
#define SDRT_DW_CHAINS(NV)                                                                   \
    {                                                                                        \
        VF a[NV];                                                                            \
        for (int v = 0; v < (NV); v++)                                                       \
            a[v] = BCAST(bias);                                                              \
        for (int t = 0; t < nt; t++) {                                                       \
            const float *p = base + off[t] + q;                                              \
            const VF wt = BCAST(w[t]);                                                       \
            for (int v = 0; v < (NV); v++)                                                   \
                a[v] += SFX(ld)(p + v * VW) * wt;                                            \
        }                                                                                    \
        for (int v = 0; v < (NV); v++)                                                       \
            SFX(st)(out + q + v * VW, SFX(vact)(ep, a[v]));                                  \
    }
static void SFX(dw_flat)(int nq, int nt, const float *base, const int32_t *off, const float *w, float bias,
                         const sdrt_epilogue *ep, float *out) {
    int q = 0;
    for (; nq - q > 2 * VW; q += 4 * VW)
        SDRT_DW_CHAINS(4)
    if (q < nq)
        SDRT_DW_CHAINS(2)
}
#undef SDRT_DW_CHAINS

/* A 3x3 stride-1 depthwise conv over one padded plane (Wq floats a row), four output rows at a
 * time: out[oy Wq + x] = act(bias + sum_{i,j} w[3 i + j] . P[(oy + i) Wq + x + j]) for oy < rows
 * (rounded up to four: P and out reach four rows and a vector past), x < Wq. The nine weights
 * stay in registers and each loaded input vector serves every output row that reads it: 18 loads
 * for 36 multiply-adds, where one row at a time takes one load per multiply-add. */
static void SFX(dw_3x3)(int rows, int Wq, const float *P, const float *w, float bias, const sdrt_epilogue *ep,
                        float *out) {
    const VF w0 = BCAST(w[0]), w1 = BCAST(w[1]), w2 = BCAST(w[2]), w3 = BCAST(w[3]), w4 = BCAST(w[4]);
    const VF w5 = BCAST(w[5]), w6 = BCAST(w[6]), w7 = BCAST(w[7]), w8 = BCAST(w[8]);
    for (int oy = 0; oy < rows; oy += 4)
        for (int x = 0; x < Wq; x += VW) {
            const float *p = P + (ptrdiff_t)oy * Wq + x;
            VF a0 = BCAST(bias), a1 = a0, a2 = a0, a3 = a0, v;
#define SDRT_DW_ROW(r, A, B, C) /* input row r: row oy+r-i of the output takes tap row i */ \
    v = SFX(ld)(p + (ptrdiff_t)(r) * Wq);                                                 \
    A;                                                                                     \
    v = SFX(ld)(p + (ptrdiff_t)(r) * Wq + 1);                                             \
    B;                                                                                     \
    v = SFX(ld)(p + (ptrdiff_t)(r) * Wq + 2);                                             \
    C;
            SDRT_DW_ROW(0, a0 += v * w0, a0 += v * w1, a0 += v * w2)
            SDRT_DW_ROW(1, (a0 += v * w3, a1 += v * w0), (a0 += v * w4, a1 += v * w1), (a0 += v * w5, a1 += v * w2))
            SDRT_DW_ROW(2, (a0 += v * w6, a1 += v * w3, a2 += v * w0), (a0 += v * w7, a1 += v * w4, a2 += v * w1),
                        (a0 += v * w8, a1 += v * w5, a2 += v * w2))
            SDRT_DW_ROW(3, (a1 += v * w6, a2 += v * w3, a3 += v * w0), (a1 += v * w7, a2 += v * w4, a3 += v * w1),
                        (a1 += v * w8, a2 += v * w5, a3 += v * w2))
            SDRT_DW_ROW(4, (a2 += v * w6, a3 += v * w3), (a2 += v * w7, a3 += v * w4), (a2 += v * w8, a3 += v * w5))
            SDRT_DW_ROW(5, a3 += v * w6, a3 += v * w7, a3 += v * w8)
#undef SDRT_DW_ROW
            float *o = out + (ptrdiff_t)oy * Wq + x;
            SFX(st)(o, SFX(vact)(ep, a0));
            SFX(st)(o + Wq, SFX(vact)(ep, a1));
            SFX(st)(o + 2 * (ptrdiff_t)Wq, SFX(vact)(ep, a2));
            SFX(st)(o + 3 * (ptrdiff_t)Wq, SFX(vact)(ep, a3));
        }
}

#if VW == 16 && defined(SDRT_X86)
#if defined(__clang__)
#define SDRT_UNROLL_DW _Pragma("unroll")
#else
#define SDRT_UNROLL_DW _Pragma("GCC unroll 32")
#endif
/* the lanes of 16 from `start` of a row of W floats that lie inside it, [0, W) */
SDRT_INLINE __mmask16 SFX(dw_lanes)(int start, int W) {
    const int lo = start < 0 ? -start : 0, hi = W - start < 16 ? W - start : 16;
    return hi <= lo ? (__mmask16)0 : (__mmask16)((0xFFFFu >> (16 - hi)) & (0xFFFFu << lo));
}

/* a stride-2 tap's 16 values: the even (odd) floats of the 32 in lo, hi */
SDRT_INLINE __m512 SFX(dw_evens)(__m512 lo, __m512 hi) {
    return _mm512_permutex2var_ps(lo, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), hi);
}
SDRT_INLINE __m512 SFX(dw_odds)(__m512 lo, __m512 hi) {
    return _mm512_permutex2var_ps(lo, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), hi);
}

/* dw_rows' body for a kernel KW taps wide (a constant where inlined: 3 and 5 unroll) */
SDRT_INLINE void SFX(dw_rows_kw)(const float *x, int H, int W, int KH, const int KW, int s, int ph, int pw,
                                 const float *w, float bias, const sdrt_epilogue *ep, float *out, int OH, int OW,
                                 ptrdiff_t ldo) {
    __mmask16 ma[8], mb[8];
    int st[8];
    for (int x0 = 0; x0 < OW; x0 += 16) {
        /* a tap column's loads and their lanes inside the image: the same for every row */
        for (int j = 0; j < KW; j++) {
            st[j] = x0 * s + j - pw;
            ma[j] = SFX(dw_lanes)(st[j], W);
            mb[j] = s == 2 ? SFX(dw_lanes)(st[j] + 16, W) : (__mmask16)0;
        }
        const int n = OW - x0 < 16 ? OW - x0 : 16;
        const __mmask16 mo = (__mmask16)(0xFFFFu >> (16 - n));
        for (int oy = 0; oy < OH; oy++) {
            __m512 a0 = _mm512_set1_ps(bias), a1 = _mm512_setzero_ps();
            for (int i = 0; i < KH; i++) {
                const int r = oy * s + i - ph;
                if (r < 0 || r >= H)
                    continue;
                const float *row = x + (ptrdiff_t)r * W;
                const float *wr = w + i * KW;
                for (int j = 0; j < KW; j++) {
                    __m512 v = _mm512_maskz_loadu_ps(ma[j], row + st[j]);
                    if (s == 2)
                        v = SFX(dw_evens)(v, _mm512_maskz_loadu_ps(mb[j], row + st[j] + 16));
                    if (j & 1)
                        a1 = _mm512_fmadd_ps(v, _mm512_set1_ps(wr[j]), a1);
                    else
                        a0 = _mm512_fmadd_ps(v, _mm512_set1_ps(wr[j]), a0);
                }
            }
            const VF y = SFX(vact)(ep, (VF)_mm512_add_ps(a0, a1));
            _mm512_mask_storeu_ps(out + (ptrdiff_t)oy * ldo + x0, mo, (__m512)y);
        }
    }
}

/* dw_rows for 3x3 kernels, the nine weights in registers. Stride 1: four output rows at a time, each input row's
 * three shifted loads serving every output row that reads it (18 loads for 36 multiply-adds); stride 2: a row's
 * taps 0 and 1 are the even and odd lanes of one pair of loads, tap 2 the even lanes of a pair two floats on. */
SDRT_INLINE void SFX(dw_rows_3x3)(const float *x, int H, int W, int s, int ph, int pw, const float *w, float bias,
                                  const sdrt_epilogue *ep, float *out, int OH, int OW, ptrdiff_t ldo) {
    const __m512 w0 = _mm512_set1_ps(w[0]), w1 = _mm512_set1_ps(w[1]), w2 = _mm512_set1_ps(w[2]);
    const __m512 w3 = _mm512_set1_ps(w[3]), w4 = _mm512_set1_ps(w[4]), w5 = _mm512_set1_ps(w[5]);
    const __m512 w6 = _mm512_set1_ps(w[6]), w7 = _mm512_set1_ps(w[7]), w8 = _mm512_set1_ps(w[8]);
    const __m512 bv = _mm512_set1_ps(bias);
    for (int x0 = 0; x0 < OW; x0 += 16) {
        const int n = OW - x0 < 16 ? OW - x0 : 16;
        const __mmask16 mo = (__mmask16)(0xFFFFu >> (16 - n));
        const int s0 = x0 * s - pw;
        if (s == 1) {
            const __mmask16 m0 = SFX(dw_lanes)(s0, W), m1 = SFX(dw_lanes)(s0 + 1, W), m2 = SFX(dw_lanes)(s0 + 2, W);
            for (int oy = 0; oy < OH; oy += 4) {
                __m512 a0 = bv, a1 = bv, a2 = bv, a3 = bv, v0, v1, v2;
                const float *row;
#define SDRT_DW3_ROW(t, A)                                     \
    row = x + (ptrdiff_t)(oy + (t) - ph) * W + s0;             \
    if (oy + (t) - ph >= 0 && oy + (t) - ph < H) {             \
        v0 = _mm512_maskz_loadu_ps(m0, row);                   \
        v1 = _mm512_maskz_loadu_ps(m1, row + 1);               \
        v2 = _mm512_maskz_loadu_ps(m2, row + 2);               \
        A                                                      \
    }
#define SDRT_DW3_TAP(acc, wa, wb, wc) \
    acc = _mm512_fmadd_ps(v0, wa, acc); \
    acc = _mm512_fmadd_ps(v1, wb, acc); \
    acc = _mm512_fmadd_ps(v2, wc, acc);
                SDRT_DW3_ROW(0, SDRT_DW3_TAP(a0, w0, w1, w2))
                SDRT_DW3_ROW(1, SDRT_DW3_TAP(a0, w3, w4, w5) SDRT_DW3_TAP(a1, w0, w1, w2))
                SDRT_DW3_ROW(2, SDRT_DW3_TAP(a0, w6, w7, w8) SDRT_DW3_TAP(a1, w3, w4, w5) SDRT_DW3_TAP(a2, w0, w1, w2))
                SDRT_DW3_ROW(3, SDRT_DW3_TAP(a1, w6, w7, w8) SDRT_DW3_TAP(a2, w3, w4, w5) SDRT_DW3_TAP(a3, w0, w1, w2))
                SDRT_DW3_ROW(4, SDRT_DW3_TAP(a2, w6, w7, w8) SDRT_DW3_TAP(a3, w3, w4, w5))
                SDRT_DW3_ROW(5, SDRT_DW3_TAP(a3, w6, w7, w8))
#undef SDRT_DW3_ROW
                float *o = out + (ptrdiff_t)oy * ldo + x0;
                _mm512_mask_storeu_ps(o, mo, (__m512)SFX(vact)(ep, (VF)a0));
                if (oy + 1 < OH)
                    _mm512_mask_storeu_ps(o + ldo, mo, (__m512)SFX(vact)(ep, (VF)a1));
                if (oy + 2 < OH)
                    _mm512_mask_storeu_ps(o + 2 * ldo, mo, (__m512)SFX(vact)(ep, (VF)a2));
                if (oy + 3 < OH)
                    _mm512_mask_storeu_ps(o + 3 * ldo, mo, (__m512)SFX(vact)(ep, (VF)a3));
            }
        } else {
            const __mmask16 ma = SFX(dw_lanes)(s0, W), mb = SFX(dw_lanes)(s0 + 16, W);
            const __mmask16 mc = SFX(dw_lanes)(s0 + 2, W), md = SFX(dw_lanes)(s0 + 18, W);
            for (int oy = 0; oy < OH; oy++) {
                __m512 a0 = bv, a1 = _mm512_setzero_ps(), v0, v1, v2;
                const float *row;
#define SDRT_DW3_ROW2(i, A)                                                                   \
    row = x + (ptrdiff_t)(2 * oy + (i) - ph) * W + s0;                                         \
    if (2 * oy + (i) - ph >= 0 && 2 * oy + (i) - ph < H) {                                     \
        const __m512 lo = _mm512_maskz_loadu_ps(ma, row), hi = _mm512_maskz_loadu_ps(mb, row + 16); \
        v0 = SFX(dw_evens)(lo, hi);                                                            \
        v1 = SFX(dw_odds)(lo, hi);                                                             \
        v2 = SFX(dw_evens)(_mm512_maskz_loadu_ps(mc, row + 2), _mm512_maskz_loadu_ps(md, row + 18)); \
        A                                                                                      \
    }
                SDRT_DW3_ROW2(0, SDRT_DW3_TAP(a0, w0, w1, w2))
                SDRT_DW3_ROW2(1, SDRT_DW3_TAP(a1, w3, w4, w5))
                SDRT_DW3_ROW2(2, SDRT_DW3_TAP(a0, w6, w7, w8))
#undef SDRT_DW3_ROW2
#undef SDRT_DW3_TAP
                _mm512_mask_storeu_ps(out + (ptrdiff_t)oy * ldo + x0, mo,
                                      (__m512)SFX(vact)(ep, (VF)_mm512_add_ps(a0, a1)));
            }
        }
    }
}

/* dw_rows for 5x5 kernels (MobileNetV3), the 25 weights in registers. Stride 1: two output rows at a time (six
 * input rows of five shifted loads for 50 multiply-adds); stride 2: a row's even taps 0, 2, 4 and odd taps 1, 3 from
 * three pairs of loads two floats apart. */
SDRT_INLINE void SFX(dw_rows_5x5)(const float *x, int H, int W, int s, int ph, int pw, const float *w, float bias,
                                  const sdrt_epilogue *ep, float *out, int OH, int OW, ptrdiff_t ldo) {
    __m512 wv[25];
    SDRT_UNROLL_DW for (int t = 0; t < 25; t++) wv[t] = _mm512_set1_ps(w[t]);
    const __m512 bv = _mm512_set1_ps(bias);
    for (int x0 = 0; x0 < OW; x0 += 16) {
        const int n = OW - x0 < 16 ? OW - x0 : 16;
        const __mmask16 mo = (__mmask16)(0xFFFFu >> (16 - n));
        const int s0 = x0 * s - pw;
        __mmask16 m[6];
        SDRT_UNROLL_DW for (int j = 0; j < 6; j++) m[j] = SFX(dw_lanes)(s0 + (s == 1 ? j : 2 * (j % 3) + 16 * (j / 3)), W);
        if (s == 1) {
            for (int oy = 0; oy < OH; oy += 2) {
                __m512 a0 = bv, a1 = bv;
                SDRT_UNROLL_DW for (int t = 0; t < 6; t++) {
                    const int r = oy + t - ph;
                    if (r < 0 || r >= H)
                        continue;
                    const float *row = x + (ptrdiff_t)r * W + s0;
                    SDRT_UNROLL_DW for (int j = 0; j < 5; j++) {
                        const __m512 v = _mm512_maskz_loadu_ps(m[j], row + j);
                        if (t < 5)
                            a0 = _mm512_fmadd_ps(v, wv[5 * t + j], a0);
                        if (t >= 1)
                            a1 = _mm512_fmadd_ps(v, wv[5 * (t - 1) + j], a1);
                    }
                }
                float *o = out + (ptrdiff_t)oy * ldo + x0;
                _mm512_mask_storeu_ps(o, mo, (__m512)SFX(vact)(ep, (VF)a0));
                if (oy + 1 < OH)
                    _mm512_mask_storeu_ps(o + ldo, mo, (__m512)SFX(vact)(ep, (VF)a1));
            }
        } else {
            for (int oy = 0; oy < OH; oy++) {
                __m512 a0 = bv, a1 = _mm512_setzero_ps();
                SDRT_UNROLL_DW for (int i = 0; i < 5; i++) {
                    const int r = 2 * oy + i - ph;
                    if (r < 0 || r >= H)
                        continue;
                    const float *row = x + (ptrdiff_t)r * W + s0;
                    SDRT_UNROLL_DW for (int p = 0; p < 3; p++) { /* the pair of loads at 2 p: taps 2 p and 2 p + 1 */
                        const __m512 lo = _mm512_maskz_loadu_ps(m[p], row + 2 * p);
                        const __m512 hi = _mm512_maskz_loadu_ps(m[3 + p], row + 2 * p + 16);
                        a0 = _mm512_fmadd_ps(SFX(dw_evens)(lo, hi), wv[5 * i + 2 * p], a0);
                        if (p < 2)
                            a1 = _mm512_fmadd_ps(SFX(dw_odds)(lo, hi), wv[5 * i + 2 * p + 1], a1);
                    }
                }
                _mm512_mask_storeu_ps(out + (ptrdiff_t)oy * ldo + x0, mo,
                                      (__m512)SFX(vact)(ep, (VF)_mm512_add_ps(a0, a1)));
            }
        }
    }
}

/* A depthwise conv of one channel plane straight from its unpadded input (H x W floats) to its output rows (ldo
 * floats apart): output row oy, lanes x0 .. x0 + 15, tap (i, j) reads input row oy s + i - ph at columns
 * (x0 + lane) s + j - pw, zero-masked outside the image (a masked load reads nothing at its masked lanes); at stride
 * 2 the tap's 16 values are the even lanes of two loads (one permute). Dilation 1, equal strides 1 or 2, kernels up
 * to 8 wide. No padded copy of the plane and no copy of the outputs: on small maps the copies cost more than the
 * taps (a 14 x 14 plane: 28 rows of 14 floats copied for 14 vectors of output). */
static void SFX(dw_rows)(const float *x, int H, int W, int KH, int KW, int s, int ph, int pw, const float *w,
                         float bias, const sdrt_epilogue *ep, float *out, int OH, int OW, ptrdiff_t ldo) {
    if (KW == 3 && KH == 3)
        SFX(dw_rows_3x3)(x, H, W, s, ph, pw, w, bias, ep, out, OH, OW, ldo);
    else if (KW == 3)
        SFX(dw_rows_kw)(x, H, W, KH, 3, s, ph, pw, w, bias, ep, out, OH, OW, ldo);
    else if (KW == 5 && KH == 5)
        SFX(dw_rows_5x5)(x, H, W, s, ph, pw, w, bias, ep, out, OH, OW, ldo);
    else if (KW == 5)
        SFX(dw_rows_kw)(x, H, W, KH, 5, s, ph, pw, w, bias, ep, out, OH, OW, ldo);
    else
        SFX(dw_rows_kw)(x, H, W, KH, KW, s, ph, pw, w, bias, ep, out, OH, OW, ldo);
}
#undef SDRT_UNROLL_DW
#endif

/* dst[r ld + i] = src[r ls + i] for r < rows, i < n: a depthwise conv's image rows into its padded planes and its
 * outputs out of them. Rows of 7 to 112 floats: whole vectors, then one of 8 and one of 4 floats, then the last 4
 * floats again over the ones before (the same values); never a float past n. Compiled with the ISA's moves: in
 * the generic build a 64-byte row piece was four 16-byte moves (14% of MobileNetV2's float32 run) */
static void SFX(dw_copy_rows)(int rows, int n, const float *src, ptrdiff_t ls, float *dst, ptrdiff_t ld) {
#if VW > 8
    typedef float v8f __attribute__((vector_size(32), aligned(4), may_alias));
#endif
    typedef float v4f __attribute__((vector_size(16), aligned(4), may_alias));
    for (int r = 0; r < rows; r++, src += ls, dst += ld) {
        int i = 0;
        for (; i + VW <= n; i += VW)
            SFX(st)(dst + i, SFX(ld)(src + i));
#if VW > 8
        if (i + 8 <= n) {
            *(v8f *)(dst + i) = *(const v8f *)(src + i);
            i += 8;
        }
#endif
#if VW > 4
        if (i + 4 <= n) {
            *(v4f *)(dst + i) = *(const v4f *)(src + i);
            i += 4;
        }
#endif
        if (i < n && n >= 4)
            *(v4f *)(dst + n - 4) = *(const v4f *)(src + n - 4);
        else
            for (; i < n; i++)
                dst[i] = src[i];
    }
}

/* even[t] = src[2 t], odd[t] = src[2 t + 1] for t < n (no read past src[2 n - 1]): a row split
 * into its two column phases (a stride-2 depthwise conv's input, Winograd's tiles) */
/* With 8-float vectors a two-source shuffle across the halves is three or four permutes; two steps
 * are cheaper: pick within each 128-bit half (one shufps), then order the 64-bit pairs (one
 * permpd): [a0 a2 b0 b2 | a4 a6 b4 b6] -> [a0 a2 a4 a6 b0 b2 b4 b6]. */
#if VW == 8
#define SDRT_EVENS 0, 2, 8, 10, 4, 6, 12, 14
#define SDRT_ODDS 1, 3, 9, 11, 5, 7, 13, 15
#define SDRT_PAIRS 0, 1, 4, 5, 2, 3, 6, 7
#elif VW == 4
#define SDRT_EVENS 0, 2, 4, 6
#define SDRT_ODDS 1, 3, 5, 7
#else
#define SDRT_EVENS 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define SDRT_ODDS 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#endif
#if defined(__clang__)
#define SDRT_SHUF2(a, b, ...) __builtin_shufflevector((a), (b), __VA_ARGS__)
#define SDRT_SHUF1(a, ...) __builtin_shufflevector((a), (a), __VA_ARGS__)
#else
#define SDRT_SHUF2(a, b, ...) __builtin_shuffle((a), (b), (VI){__VA_ARGS__})
#define SDRT_SHUF1(a, ...) __builtin_shuffle((a), (VI){__VA_ARGS__})
#endif
#if VW == 8
#define SDRT_PICK(a, b, IDX) SDRT_SHUF1(SDRT_SHUF2(a, b, IDX), SDRT_PAIRS)
#else
#define SDRT_PICK(a, b, IDX) SDRT_SHUF2(a, b, IDX)
#endif
static void SFX(dw_split2)(int n, const float *src, float *even, float *odd) {
    int t = 0;
    /* the last vector ends at n, overlapping the one before: it writes the same values again,
     * where a scalar tail took as long as the vectors (rows of 112 floats at stride 2) */
    for (; t < n && n >= VW; t += VW) {
        if (t + VW > n)
            t = n - VW;
        const VF a = SFX(ld)(src + 2 * t), b = SFX(ld)(src + 2 * t + VW);
        SFX(st)(even + t, SDRT_PICK(a, b, SDRT_EVENS));
        SFX(st)(odd + t, SDRT_PICK(a, b, SDRT_ODDS));
    }
    for (; t < n; t++) {
        even[t] = src[2 * t];
        odd[t] = src[2 * t + 1];
    }
}

#undef SDRT_PICK
#undef SDRT_SHUF1
#undef SDRT_SHUF2
#undef SDRT_EVENS
#undef SDRT_ODDS
#if VW == 8
#undef SDRT_PAIRS
#endif
