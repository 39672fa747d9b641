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
