/* sdrt-ggml native kernels: one ISA's depthwise-conv row, included by simd_body.h (same VW, SFX). */

/* Depthwise conv over output positions q in [0, nq), vectorised along q:
 *   out[q] = act(bias + sum_t w[t] . taps[t][q]),  t < nt,
 * where taps[t] points at the input element that tap t reads for q = 0, and tap t reads
 * consecutive elements for consecutive q: one output row with its taps in zero-padded row
 * buffers (a stride-2 conv's taps in even/odd phase buffers), or, for small stride-1 maps, the
 * whole plane at once, q running over a zero-padded plane's rows (the columns past a row's
 * output are computed and dropped by the caller). The buffers reach VW floats past nq, so every
 * vector load stays inside. 3x3 kernels keep their 9 taps in registers. */
static void SFX(dw_taps)(int nq, int nt, const float *const *taps, const float *w, float bias,
                         const sdrt_epilogue *ep, float *out) {
    const int k9 = nt == 9;
    const VF w0 = BCAST(w[0]), w1 = BCAST(k9 ? w[1] : 0.0f), w2 = BCAST(k9 ? w[2] : 0.0f);
    const VF w3 = BCAST(k9 ? w[3] : 0.0f), w4 = BCAST(k9 ? w[4] : 0.0f), w5 = BCAST(k9 ? w[5] : 0.0f);
    const VF w6 = BCAST(k9 ? w[6] : 0.0f), w7 = BCAST(k9 ? w[7] : 0.0f), w8 = BCAST(k9 ? w[8] : 0.0f);
    for (int q = 0; q < nq; q += VW) {
        VF acc = BCAST(bias);
        if (k9) {
            acc += SFX(ld)(taps[0] + q) * w0 + SFX(ld)(taps[1] + q) * w1 + SFX(ld)(taps[2] + q) * w2;
            acc += SFX(ld)(taps[3] + q) * w3 + SFX(ld)(taps[4] + q) * w4 + SFX(ld)(taps[5] + q) * w5;
            acc += SFX(ld)(taps[6] + q) * w6 + SFX(ld)(taps[7] + q) * w7 + SFX(ld)(taps[8] + q) * w8;
        } else {
            for (int t = 0; t < nt; t++)
                acc += SFX(ld)(taps[t] + q) * w[t];
        }
        acc = SFX(vact)(ep, acc);
        if (q + VW <= nq) {
            SFX(st)(out + q, acc);
        } else {
            for (int u = 0; q + u < nq; u++)
                out[q + u] = acc[u];
        }
    }
}

/* even[t] = src[2 t], odd[t] = src[2 t + 1] for t < n (src holds 2 n floats, plus up to 2 VW - 1
 * more that may be read): a stride-2 depthwise conv's padded row split into its two phases */
#if defined(__clang__)
#if VW == 4
#define SDRT_EVENS 0, 2, 4, 6
#define SDRT_ODDS 1, 3, 5, 7
#elif VW == 8
#define SDRT_EVENS 0, 2, 4, 6, 8, 10, 12, 14
#define SDRT_ODDS 1, 3, 5, 7, 9, 11, 13, 15
#else
#define SDRT_EVENS 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define SDRT_ODDS 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#endif
#define SDRT_PICK(a, b, IDX) __builtin_shufflevector((a), (b), IDX)
#else
#define SDRT_PICK(a, b, IDX) __builtin_shuffle((a), (b), SFX(IDX##_v)())
SDRT_INLINE VI SFX(SDRT_EVENS_v)(void) {
    VI v;
    for (int i = 0; i < VW; i++)
        v[i] = 2 * i;
    return v;
}
SDRT_INLINE VI SFX(SDRT_ODDS_v)(void) {
    VI v;
    for (int i = 0; i < VW; i++)
        v[i] = 2 * i + 1;
    return v;
}
#endif
static void SFX(dw_split2)(int n, const float *src, float *even, float *odd) {
    int t = 0;
    for (; t + VW <= n; t += VW) {
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
#if defined(__clang__)
#undef SDRT_EVENS
#undef SDRT_ODDS
#endif
