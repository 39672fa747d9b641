/* Attention at bf16 on AMX tiles: sdrt_attention_op's path at precision bf16 without a mask (the UNets' and DiTs'
 * self- and cross-attention), on a CPU with AMX-BF16 (amx.c says whether the tiles are granted and on).
 *
 * Per (batch, head) the thread rounds K and V to bf16 once (vcvtne2ps2bf16), in the B layouts of tdpbf16ps: K as
 * [key tile][D pair][16 keys][2] (a key tile's pair rows are a B tile of the scores), V as [column tile][key pair]
 * [16 columns][2] (a B tile of the weighted sum). Per task of 32 query rows (two row tiles; Q scaled by scale x
 * log2 e, rounded to bf16 pairs, an A tile), keys go in blocks of KBLK:
 *   S = Q K^T on tiles (four key tiles a row tile, the head dim in steps of 16 pairs, the last step on tail tiles
 *       of the pairs left: no padding of D), stored as float32;
 *   the online softmax in AVX-512: P = 2^(S - m) (a degree-3 polynomial and vscalefps; P is rounded to bf16, 26x
 *       coarser than its 7.5e-5) with m the running maximum, which a later block moves only where its scores exceed
 *       m by more than LAZY_MAX (then alpha = 2^(m_old - m), else 1), the row sums l from the float32 P, P stored as
 *       bf16 (an A tile: 32 keys a row);
 *   O_block = P V on tiles (up to four column tiles at a time), stored, and acc = acc alpha + O_block;
 * and at the end out = acc / l. Like a bf16 compile of OpenVINO or onnxruntime, the products are of bf16-rounded
 * operands with float32 sums: the precision the user asked for, on the CPU's bf16 engine.
 *
 * A mask, or no AMX, leaves the op on its float32 path (ops.c, simd_body.h).
 */
#include "sdrt_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(SDRT_HAVE_AMX)
#include <immintrin.h>

#define TARGET_AMX SDRT_TARGET_AMX
#define AMX_BARRIER() SDRT_AMX_BARRIER()

enum {
    QR = 32,   /* query rows a task: two row tiles */
    KBLK = 512 /* keys a block: S 32 x 512 floats (64 KB) and P (32 KB) stay in L2 */
};
/* tile registers (literals: the intrinsics paste them into the instruction): C 0-3, then */
#define TA 4  /* A, 16 pairs */
#define TAT 5 /* A, the head dim's last pairs */
#define TB 6  /* B, 16 pair rows */
#define TBT 7 /* B, the head dim's last pair rows */

/* one head's operands and the task's buffers */
typedef struct {
    int D, Dv, D2, sD, tD; /* head dims; D's pairs, steps of 16 pairs over them, pairs in the last step */
    int nk, ct;            /* keys padded to a multiple of 32; column tiles of Dv */
    uint16_t *kp;          /* [nk / 16][D2][16][2] */
    uint16_t *vp;          /* [ct][nk / 2][16][2] */
    uint16_t *qb;          /* [QR][2 D2]: the task's scaled queries */
    float *s;              /* [QR][KBLK] scores */
    uint16_t *p;           /* [QR][KBLK] bf16 weights */
    float *acc;            /* [QR][16 ct] */
    float *obuf;           /* 4 C tiles */
} amx_head;

/* 2^x for x <= 0 (below -126: about 0) and up to LAZY_MAX (softmax_block), within 7.5e-5 relative: a degree-3
 * polynomial on [-1/2, 1/2] (minimax in the relative error) and vscalefps. P is rounded to bf16 (2^-9 relative),
 * 26x coarser, so degree 5 (2e-6) only cost two multiply-adds a vector. */
static TARGET_AMX inline __m512 exp2_neg(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-126.0f), x);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(x, n); /* |r| <= 0.5 */
    __m512 p = _mm512_set1_ps(5.5171654e-2f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4261115e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9326097e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.9992806e-1f));
    return _mm512_scalef_ps(p, n);
}

/* 16 floats of a row from element i (elements `stride` bytes apart), those at n and past it 0 */
static TARGET_AMX inline __m512 load16(const char *row, size_t stride, int i, int n) {
    if (i >= n)
        return _mm512_setzero_ps();
    const int k = n - i < 16 ? n - i : 16;
    if (stride == 4)
        return _mm512_maskz_loadu_ps((__mmask16)((1u << k) - 1), row + (size_t)i * 4);
    float t[16] = {0};
    for (int e = 0; e < k; e++)
        t[e] = *(const float *)(row + (size_t)(i + e) * stride);
    return _mm512_loadu_ps(t);
}

/* the row's first n floats times scale, zeros up to npad (even), rounded to bf16 (vcvtne2ps2bf16) into dst */
static TARGET_AMX void row_bf16(const char *row, size_t stride, int n, int npad, float scale, uint16_t *dst) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < npad; i += 32) {
        const __m512 a = _mm512_mul_ps(load16(row, stride, i, n), sc);
        const __m512 b = _mm512_mul_ps(load16(row, stride, i + 16, n), sc);
        const __mmask32 mk = npad - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (npad - i)) - 1);
        _mm512_mask_storeu_epi16(dst + i, mk, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}

/* round this head's K and V to bf16 in their B layouts, keys past n_kv zero; tmp: 2 D2 values */
static TARGET_AMX void pack_head(const amx_head *hd, const char *kh, const size_t *knb, const char *vh,
                                 const size_t *vnb, int n_kv, uint16_t *tmp) {
    const int D = hd->D, D2 = hd->D2, Dv = hd->Dv, nk2 = hd->nk / 2;
    for (int j = 0; j < hd->nk; j++) { /* a key's pairs go 16 pairs (one per key of its tile) apart */
        row_bf16(kh + (size_t)j * knb[1], knb[0], j < n_kv ? D : 0, 2 * D2, 1.0f, tmp);
        uint16_t *dst = hd->kp + ((size_t)(j / 16) * D2 * 16 + (size_t)(j % 16)) * 2;
        for (int d2 = 0; d2 < D2; d2++)
            memcpy(dst + (size_t)d2 * 32, tmp + 2 * d2, 4);
    }
    /* keys j and j + 1 of 16 columns: the two rows rounded side by side, then interleaved into pairs */
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                           6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int j = 0; j < hd->nk; j += 2) {
        const char *v0 = vh + (size_t)j * vnb[1], *v1 = v0 + vnb[1];
        const int n0 = j < n_kv ? Dv : 0, n1 = j + 1 < n_kv ? Dv : 0;
        for (int c = 0; c < hd->ct; c++) {
            const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(load16(v1, vnb[0], 16 * c, n1),
                                                           load16(v0, vnb[0], 16 * c, n0));
            _mm512_storeu_si512((void *)(hd->vp + (((size_t)c * nk2 + (size_t)(j / 2)) * 16) * 2),
                                _mm512_permutexvar_epi16(inter, w));
        }
    }
}

/* scores of row tile rt against the block's key tiles (kt0 on, nkt of them): S rows rt*16.. */
static TARGET_AMX void scores(const amx_head *hd, int rt, int kt0, int nkt) {
    const ptrdiff_t ldq = 4 * (ptrdiff_t)hd->D2; /* bytes between Q rows */
    const uint16_t *q = hd->qb + (ptrdiff_t)rt * 16 * 2 * hd->D2;
    for (int j0 = 0; j0 < nkt; j0 += 4) {
        const int nj = nkt - j0 < 4 ? nkt - j0 : 4;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int s = 0; s < hd->sD; s++) {
            const int tail = s + 1 == hd->sD && hd->tD < 16;
            const uint16_t *kb = hd->kp + ((size_t)(kt0 + j0) * hd->D2 + 16 * (size_t)s) * 32;
            const ptrdiff_t kstride = (ptrdiff_t)hd->D2 * 32; /* uint16 between key tiles */
            if (tail) {
                _tile_loadd(TAT, q + 32 * s, ldq);
#define STEP(j)                                                                                                        \
    if (nj > (j)) {                                                                                                    \
        _tile_loadd(TBT, kb + (j) * kstride, 64);                                                                      \
        _tile_dpbf16ps(j, TAT, TBT);                                                                                   \
    }
                STEP(0)
                STEP(1)
                STEP(2)
                STEP(3)
#undef STEP
            } else {
                _tile_loadd(TA, q + 32 * s, ldq);
#define STEP(j)                                                                                                        \
    if (nj > (j)) {                                                                                                    \
        _tile_loadd(TB, kb + (j) * kstride, 64);                                                                       \
        _tile_dpbf16ps(j, TA, TB);                                                                                     \
    }
                STEP(0)
                STEP(1)
                STEP(2)
                STEP(3)
#undef STEP
            }
        }
        float *srow = hd->s + (ptrdiff_t)rt * 16 * KBLK + 16 * j0;
        _tile_stored(0, srow, KBLK * 4);
        if (nj > 1)
            _tile_stored(1, srow + 16, KBLK * 4);
        if (nj > 2)
            _tile_stored(2, srow + 32, KBLK * 4);
        if (nj > 3)
            _tile_stored(3, srow + 48, KBLK * 4);
    }
}

/* P = 2^(S - m) of one row's block of kb keys (those from kv on weigh 0), stored bf16; returns the row sum of the
 * float32 P and sets *smax to the block's largest score */
static TARGET_AMX inline float exp_row(const float *s, uint16_t *p, int kb, int kv, float m, float *smax) {
    const __m512 mv = _mm512_set1_ps(m), ninf = _mm512_set1_ps(-INFINITY);
    __m512 sum = _mm512_setzero_ps(), mx = ninf;
    for (int c = 0; c < kb; c += 32) {
        __m512 s0, s1, e0, e1;
        if (c + 32 <= kv) {
            s0 = _mm512_loadu_ps(s + c);
            s1 = _mm512_loadu_ps(s + c + 16);
            e0 = exp2_neg(_mm512_sub_ps(s0, mv));
            e1 = exp2_neg(_mm512_sub_ps(s1, mv));
        } else { /* the keys past n_kv weigh 0 */
            const __mmask16 m0 = c + 16 <= kv ? 0xffff : c < kv ? (__mmask16)((1u << (kv - c)) - 1) : 0;
            const __mmask16 m1 = c + 32 <= kv ? 0xffff : c + 16 < kv ? (__mmask16)((1u << (kv - c - 16)) - 1) : 0;
            s0 = _mm512_mask_loadu_ps(ninf, m0, s + c);
            s1 = _mm512_mask_loadu_ps(ninf, m1, s + c + 16);
            e0 = _mm512_maskz_mov_ps(m0, exp2_neg(_mm512_sub_ps(s0, mv)));
            e1 = _mm512_maskz_mov_ps(m1, exp2_neg(_mm512_sub_ps(s1, mv)));
        }
        mx = _mm512_max_ps(mx, _mm512_max_ps(s0, s1));
        sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
        _mm512_storeu_si512((void *)(p + c), (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
    *smax = _mm512_reduce_max_ps(mx);
    return _mm512_reduce_add_ps(sum);
}

/* the largest of a row's first kv scores */
static TARGET_AMX inline float row_max(const float *s, int kv) {
    const int kv16 = kv / 16 * 16;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int c = 0; c < kv16; c += 16)
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + c));
    if (kv16 < kv)
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, (__mmask16)((1u << (kv % 16)) - 1), s + kv16));
    return _mm512_reduce_max_ps(mx);
}

/* whether each of a row's first kv scores is -inf (a NaN is not: the reduction above may drop it) */
static TARGET_AMX inline int all_neg_inf(const float *s, int kv) {
    for (int c = 0; c < kv; c += 16) {
        const __mmask16 k = kv - c >= 16 ? 0xffff : (__mmask16)((1u << (kv - c)) - 1);
        if (_mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, s + c), _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ))
            return 0;
    }
    return 1;
}

/* how far a block's largest score may exceed the running maximum m before m moves (P up to 2^LAZY_MAX) */
#define LAZY_MAX 8.0f

/* the online softmax of `rows` rows over a block of kb keys (kv of them real): P (bf16), alpha, m and l. The
 * running maximum m is the first block's and moves only where a later block's exceeds it by more than LAZY_MAX
 * (that row's P is then computed again): P = 2^(S - m) is up to 2^LAZY_MAX, exact enough in float32 and bf16 alike,
 * and a block's scores are read once, not twice (maximum, then exponents), and its alpha is 1. */
static TARGET_AMX void softmax_block(const amx_head *hd, int rows, int kb, int kv, float *m, float *l, float *alpha) {
    for (int r = 0; r < rows; r++) {
        const float *s = hd->s + (ptrdiff_t)r * KBLK;
        uint16_t *p = hd->p + (ptrdiff_t)r * KBLK;
        const float mold = m[r];
        float smax, sum;
        if (mold == -INFINITY) { /* the first block: its maximum */
            const float bmax = row_max(s, kv);
            if (bmax == -INFINITY && all_neg_inf(s, kv)) { /* every score so far -inf (a product past float32's
                                                            * range): nothing to add yet, as on the float32 path
                                                            * (2^(S - m) would be NaN); a NaN score goes on */
                memset(p, 0, sizeof(uint16_t) * (size_t)kb);
                alpha[r] = 1.0f;
                continue;
            }
            sum = exp_row(s, p, kb, kv, bmax, &smax);
            m[r] = smax;
            alpha[r] = 0.0f;
        } else {
            sum = exp_row(s, p, kb, kv, mold, &smax);
            alpha[r] = 1.0f;
            if (smax > mold + LAZY_MAX) {
                sum = exp_row(s, p, kb, kv, smax, &smax);
                m[r] = smax;
                alpha[r] = exp2f(mold - smax);
            }
        }
        l[r] = l[r] * alpha[r] + sum;
    }
}

/* acc rows of row tile rt = acc alpha + P V over the block's kb keys from key k0 */
static TARGET_AMX void weighted_sum(const amx_head *hd, int rt, int k0, int kb, const float *alpha) {
    const int nk2 = hd->nk / 2, ldacc = 16 * hd->ct;
    const uint16_t *p = hd->p + (ptrdiff_t)rt * 16 * KBLK;
    for (int c0 = 0; c0 < hd->ct; c0 += 4) {
        const int nc = hd->ct - c0 < 4 ? hd->ct - c0 : 4;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int st = 0; st < kb / 32; st++) {
            _tile_loadd(TA, p + 32 * st, KBLK * 2);
            const uint16_t *vb = hd->vp + ((size_t)c0 * nk2 + (size_t)(k0 / 2) + 16 * (size_t)st) * 32;
#define STEP(c)                                                                                                        \
    if (nc > (c)) {                                                                                                    \
        _tile_loadd(TB, vb + (size_t)(c) * nk2 * 32, 64);                                                              \
        _tile_dpbf16ps(c, TA, TB);                                                                                     \
    }
            STEP(0)
            STEP(1)
            STEP(2)
            STEP(3)
#undef STEP
        }
        _tile_stored(0, hd->obuf, 64);
        if (nc > 1)
            _tile_stored(1, hd->obuf + 256, 64);
        if (nc > 2)
            _tile_stored(2, hd->obuf + 512, 64);
        if (nc > 3)
            _tile_stored(3, hd->obuf + 768, 64);
        AMX_BARRIER();
        for (int i = 0; i < 16; i++) {
            float *a = hd->acc + (ptrdiff_t)(rt * 16 + i) * ldacc + 16 * c0;
            const __m512 al = _mm512_set1_ps(alpha[rt * 16 + i]);
            for (int c = 0; c < nc; c++)
                _mm512_storeu_ps(a + 16 * c, _mm512_fmadd_ps(_mm512_loadu_ps(a + 16 * c), al,
                                                              _mm512_loadu_ps(hd->obuf + 256 * c + 16 * i)));
        }
    }
}

/* one task: query rows row0 .. row0+rows-1 of a head whose K and V are packed; q0: the first row's queries */
static TARGET_AMX void attend_rows(const amx_head *hd, int rows, int n_kv, const char *q0, const size_t *qnb,
                                   float qscale, float *const *out) {
    const int rtiles = (rows + 15) / 16, nrows = 16 * rtiles, D = hd->D, D2 = hd->D2, ldacc = 16 * hd->ct;
    for (int r = 0; r < nrows; r++)
        row_bf16(q0 + (size_t)r * qnb[1], qnb[0], r < rows ? D : 0, 2 * D2, qscale, hd->qb + (ptrdiff_t)r * 2 * D2);
    memset(hd->acc, 0, sizeof(float) * (size_t)nrows * ldacc);
    float m[QR], l[QR], alpha[QR];
    for (int r = 0; r < nrows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    AMX_BARRIER();
    for (int k0 = 0; k0 < hd->nk; k0 += KBLK) {
        const int kb = hd->nk - k0 < KBLK ? hd->nk - k0 : KBLK, kv = n_kv - k0 < kb ? n_kv - k0 : kb;
        for (int rt = 0; rt < rtiles; rt++)
            scores(hd, rt, k0 / 16, kb / 16);
        AMX_BARRIER();
        softmax_block(hd, nrows, kb, kv, m, l, alpha);
        AMX_BARRIER();
        for (int rt = 0; rt < rtiles; rt++)
            weighted_sum(hd, rt, k0, kb, alpha);
    }
    for (int r = 0; r < rows; r++) {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        const float *a = hd->acc + (ptrdiff_t)r * ldacc;
        for (int d = 0; d < hd->Dv; d++)
            out[r][d] = a[d] * inv;
    }
}

static TARGET_AMX void run_tasks(amx_head *hd, sdrt_view q, sdrt_view k, sdrt_view v, sdrt_view o, float qscale,
                                 int nqb, int H, int64_t t0, int64_t t1) {
    const int n_q = (int)q.ne[1], n_kv = (int)k.ne[1];
    SDRT_ALIGN(64) sdrt_amx_config cfg, prev;
    sdrt_amx_config_default(&cfg);
    cfg.colsb[TAT] = (uint16_t)(4 * hd->tD);
    cfg.rows[TBT] = (uint8_t)hd->tD;
    sdrt_amx_tiles_load(&cfg, &prev); /* the caller's configuration, put back at the end (amx.c says why) */
    float *out[QR];
    int last = -1;
    for (int64_t t = t0; t < t1; t++) {
        const int bh = (int)(t / nqb), qb = (int)(t % nqb), b = bh / H, h = bh % H;
        if (bh != last) {
            pack_head(hd, k.data + (size_t)h * k.nb[2] + (size_t)b * k.nb[3], k.nb,
                      v.data + (size_t)h * v.nb[2] + (size_t)b * v.nb[3], v.nb, n_kv, hd->qb);
            last = bh;
        }
        const int row0 = qb * QR, rows = n_q - row0 < QR ? n_q - row0 : QR;
        for (int r = 0; r < rows; r++)
            out[r] = (float *)(o.data + (size_t)h * o.nb[1] + (size_t)(row0 + r) * o.nb[2] + (size_t)b * o.nb[3]);
        attend_rows(hd, rows, n_kv, q.data + (size_t)row0 * q.nb[1] + (size_t)h * q.nb[2] + (size_t)b * q.nb[3], q.nb,
                    qscale, out);
    }
    sdrt_amx_tiles_end(&prev);
}

int sdrt_amx_attention(sdrt_view q, sdrt_view k, sdrt_view v, sdrt_view o, float scale, int ith, int nth) {
    if (!sdrt_amx_enabled())
        return -1;
    const int D = (int)q.ne[0], n_q = (int)q.ne[1], H = (int)q.ne[2], B = (int)q.ne[3];
    const int n_kv = (int)k.ne[1], Dv = (int)v.ne[0];
    if (D < 1 || Dv < 1 || n_kv < 1)
        return -1;
    const int nqb = (n_q + QR - 1) / QR;
    const int64_t T = (int64_t)B * H * nqb, t0 = T * ith / nth, t1 = T * (ith + 1) / nth;
    if (t0 >= t1)
        return 0;
    amx_head hd;
    hd.D = D;
    hd.Dv = Dv;
    hd.D2 = (D + 1) / 2;
    hd.sD = (hd.D2 + 15) / 16;
    hd.tD = hd.D2 - 16 * (hd.sD - 1);
    hd.nk = (n_kv + 31) / 32 * 32;
    hd.ct = (Dv + 15) / 16;
    const size_t n_kp = (size_t)hd.nk * hd.D2 * 2, n_vp = (size_t)hd.ct * hd.nk * 16, n_qb = (size_t)QR * 2 * hd.D2;
    const size_t bytes = (n_kp + n_vp + n_qb + (size_t)QR * KBLK) * 2 + ((size_t)QR * KBLK + (size_t)QR * 16 * hd.ct +
                                                                         1024) * 4 + 256;
    char *buf = malloc(bytes);
    if (!buf) { /* no scratch: this thread's rows become NaN (as on the float32 path), not the process aborting */
        for (int64_t t = t0; t < t1; t++) {
            const int bh = (int)(t / nqb), qb = (int)(t % nqb), b = bh / H, h = bh % H;
            for (int row = qb * QR; row < n_q && row < (qb + 1) * QR; row++)
                for (int d = 0; d < Dv; d++)
                    *(float *)(o.data + d * o.nb[0] + h * o.nb[1] + row * o.nb[2] + b * o.nb[3]) = NAN;
        }
        return 0;
    }
    char *at = (char *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    hd.s = (float *)at;
    at += (size_t)QR * KBLK * 4;
    hd.obuf = (float *)at;
    at += 1024 * 4;
    hd.acc = (float *)at;
    at += (size_t)QR * 16 * hd.ct * 4;
    hd.p = (uint16_t *)at;
    at += (size_t)QR * KBLK * 2;
    hd.kp = (uint16_t *)at;
    at += n_kp * 2;
    hd.vp = (uint16_t *)at;
    at += n_vp * 2;
    hd.qb = (uint16_t *)at;
    run_tasks(&hd, q, k, v, o, scale * 1.4426950408889634f, nqb, H, t0, t1);
    free(buf);
    return 0;
}
#else
int sdrt_amx_attention(sdrt_view q, sdrt_view k, sdrt_view v, sdrt_view o, float scale, int ith, int nth) {
    (void)q, (void)k, (void)v, (void)o, (void)scale, (void)ith, (void)nth;
    return -1;
}
#endif
