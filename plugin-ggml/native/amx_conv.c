/* A dense stride-1 conv at bf16 on AMX tiles with no packing (conv.c hands sdrt_conv_op's "pairs" case here).
 *
 * The input comes converted once a call (sdrt_pair_pad_op, a node before the conv): bf16, zero-padded, with the
 * channels in pairs side by side, xp[C2][Hp][Wp][2] (C2 a multiple of 16: zero pairs past ceil(C / 2), a zero
 * second element for odd C; rows past the image's padded height zero too, so that a tile never reads past the
 * buffer). The weights come from the lowering as [OC][tap][C2][2] (rows past OC zero up to a multiple of 16), so
 * an A tile (16 output channels x 16 pairs of one tap) is one tileloadd with W's row stride. Output pixels go in
 * "flat padded" order q = oy Wp + ox: the B tile of tap (i, j), pairs cp .. cp+15 and pixels q0 .. q0+15 is the
 * 16 rows xp + (cp Hp Wp + q0 + i dh Wp + j dw) 2 (uint16), Hp Wp 4 bytes apart, 64 bytes each, read where they
 * lie. Columns with ox >= OW are junk, dropped as the C tiles are stored (a run per output row, through the
 * AVX-512 epilogue: bias with the runtime row bias, residual, activation).
 *
 * Blocking as amx.c's: two row tiles x two pixel tiles (four C tiles, two A, two B), K over (tap, 16 pairs). A
 * unit is a chunk of row tiles (W's rows of them in L2) x the pixel tiles (all of them, or a share where there
 * would be too few units) of every batch item, so that W is read from memory once a call; the op's threads take
 * units from the shared counter. Where the tiles are off (SDRT_GGML_AMX=0 after lowering) a scalar loop computes
 * the same.
 */
#include "sdrt_ops.h"

#include <string.h>

/* bytes of W's rows a unit keeps in L2 */
#define AMXC_W_BYTES (512 * 1024)

/* one output pixel tile's runs along output rows: the tile's columns off .. off+n-1 are pixels (oy, ox ..) */
typedef struct {
    int off, n, oy, ox;
} amxc_run;

static int tile_runs(const sdrt_conv_pairs *a, int q0, amxc_run *runs) {
    if (a->Wp == a->OW) { /* no padding columns (a 1x1 conv): the tile's pixels are one run of the output */
        const int nq = a->OH * a->OW - q0;
        runs[0] = (amxc_run){0, nq < 16 ? nq : 16, q0 / a->OW, q0 % a->OW};
        return nq > 0;
    }
    int count = 0;
    for (int off = 0; off < 16;) {
        const int q = q0 + off, oy = q / a->Wp, ox = q % a->Wp;
        const int len = 16 - off < a->Wp - ox ? 16 - off : a->Wp - ox;
        if (oy < a->OH && ox < a->OW)
            runs[count++] = (amxc_run){off, ox + len <= a->OW ? len : a->OW - ox, oy, ox};
        off += len;
    }
    return count;
}

/* the scalar product of rows [r0, r1) x pixel tiles [t0, t1) of item n (the tiles off) */
static void pairs_unit_scalar(const sdrt_conv_pairs *a, int n, const float *rb, int r0, int r1, int t0, int t1) {
    const int taps = a->KH * a->KW, np = a->OH * a->OW;
    const uint16_t *x = a->x + (ptrdiff_t)n * a->x_item;
    const ptrdiff_t plane = (ptrdiff_t)a->Hp * a->Wp;
    amxc_run runs[16];
    for (int t = t0; t < t1; t++) {
        const int nr = tile_runs(a, 16 * t, runs);
        for (int oc = r0; oc < r1; oc++)
            for (int k = 0; k < nr; k++)
                for (int u = 0; u < runs[k].n; u++) {
                    const ptrdiff_t q = (ptrdiff_t)runs[k].oy * a->Wp + runs[k].ox + u;
                    float s = 0.0f;
                    for (int tap = 0; tap < taps; tap++) {
                        const uint16_t *w = a->w + (ptrdiff_t)oc * a->ldw + (ptrdiff_t)tap * a->C2 * 2;
                        const ptrdiff_t shift = (ptrdiff_t)(tap / a->KW) * a->dh * a->Wp + (tap % a->KW) * a->dw;
                        const uint16_t *xi = x + 2 * (q + shift);
                        for (int cp = 0; cp < a->C2; cp++)
                            s += sdrt_bf16_to_f32(w[2 * cp]) * sdrt_bf16_to_f32(xi[cp * plane * 2]) +
                                 sdrt_bf16_to_f32(w[2 * cp + 1]) * sdrt_bf16_to_f32(xi[cp * plane * 2 + 1]);
                    }
                    const ptrdiff_t at = (ptrdiff_t)oc * np + (ptrdiff_t)runs[k].oy * a->OW + runs[k].ox + u;
                    const float *res = a->res ? (const float *)(a->res + n * a->res_item) : NULL;
                    float *o = a->out + (ptrdiff_t)n * a->out_item;
                    o[at] = sdrt_act(a->ep, s + (rb ? rb[oc] : 0.0f) + (res ? res[at] : 0.0f));
                }
    }
}

#if defined(SDRT_HAVE_AMX)
#include <immintrin.h>

#define TARGET_AMX SDRT_TARGET_AMX
#define AMX_BARRIER() SDRT_AMX_BARRIER()

/* tile registers: C 0-3 (row tile 0 x pixel tiles 0, 1; row tile 1 x pixel tiles 0, 1), A 4-5, B 6-7 */
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

/* rows row0 .. (two rows: +31) x pixels q0 .. (two pixel tiles: +31), all of K, to cbuf (tile i at 256 i) */
static TARGET_AMX void pairs_chunk(const sdrt_conv_pairs *a, const uint16_t *x, int row0, int two, int q0, int twop,
                                   float *cbuf) {
    const ptrdiff_t bstride = (ptrdiff_t)a->Hp * a->Wp * 4, astride = a->ldw * 2;
    const ptrdiff_t cstep = (ptrdiff_t)a->Hp * a->Wp * 32; /* uint16 from 16 pairs to the next 16 */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int tap = 0; tap < a->KH * a->KW; tap++) {
        const uint16_t *w = a->w + (ptrdiff_t)row0 * a->ldw + (ptrdiff_t)tap * a->C2 * 2;
        const uint16_t *b = x + 2 * ((ptrdiff_t)q0 + (ptrdiff_t)(tap / a->KW) * a->dh * a->Wp + (tap % a->KW) * a->dw);
        for (int cp = 0; cp < a->C2; cp += 16, w += 32, b += cstep) {
            _tile_loadd(TA0, w, astride);
            _tile_loadd(TB0, b, bstride);
            _tile_dpbf16ps(0, TA0, TB0);
            if (twop) {
                _tile_loadd(TB1, b + 32, bstride);
                _tile_dpbf16ps(1, TA0, TB1);
            }
            if (two) {
                _tile_loadd(TA1, w + 16 * a->ldw, astride);
                _tile_dpbf16ps(2, TA1, TB0);
                if (twop)
                    _tile_dpbf16ps(3, TA1, TB1);
            }
        }
    }
    _tile_stored(0, cbuf, 64);
    _tile_stored(1, cbuf + 256, 64);
    _tile_stored(2, cbuf + 512, 64);
    _tile_stored(3, cbuf + 768, 64);
    AMX_BARRIER(); /* GCC's tile stores tell the compiler of no memory written: cbuf is read after this */
}

/* the C tile at cbuf (rows row0 .., pixel tile at q0) through the epilogue to item n's output */
static void pairs_store(const sdrt_conv_pairs *a, int n, const float *rb, const float *cbuf, int row0, int q0) {
    amxc_run runs[16];
    const int nr = tile_runs(a, q0, runs), np = a->OH * a->OW;
    float *o = a->out + (ptrdiff_t)n * a->out_item;
    const float *res = a->res ? (const float *)(a->res + n * a->res_item) : NULL;
    const int rows = a->OC - row0 < 16 ? a->OC - row0 : 16;
    for (int k = 0; k < nr; k++) {
        const ptrdiff_t at = (ptrdiff_t)row0 * np + (ptrdiff_t)runs[k].oy * a->OW + runs[k].ox;
        sdrt_store512_run(o + at, np, cbuf + runs[k].off, rows, runs[k].n, rb ? rb + row0 : NULL, res ? res + at : NULL,
                          a->ep);
    }
}

static TARGET_AMX void pairs_unit_amx(const sdrt_conv_pairs *a, int n, const float *rb, int t_r0, int t_r1, int t0,
                                      int t1) {
    SDRT_ALIGN(64) float cbuf[4 * 256];
    const uint16_t *x = a->x + (ptrdiff_t)n * a->x_item;
    for (int t = t0; t < t1; t += 2) {
        const int twop = t + 1 < t1;
        for (int rt = t_r0; rt < t_r1; rt += 2) {
            const int two = rt + 1 < t_r1;
            pairs_chunk(a, x, 16 * rt, two, 16 * t, twop, cbuf);
            for (int u = 0; u <= two; u++)
                for (int v = 0; v <= twop; v++)
                    pairs_store(a, n, rb, cbuf + 512 * u + 256 * v, 16 * (rt + u), 16 * (t + v));
        }
    }
}

/* n floats of each of two channel rows (x1 NULL: zeros) as bf16 pairs to d (2 n uint16) */
static TARGET_AMX void pair_row(const float *x0, const float *x1, int n, uint16_t *d) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int i = 0; i < n; i += 16) {
        const int m = n - i < 16 ? n - i : 16;
        const __mmask16 k = (__mmask16)((1u << m) - 1u);
        const __m512 a = _mm512_maskz_loadu_ps(k, x0 + i);
        const __m512 b = x1 ? _mm512_maskz_loadu_ps(k, x1 + i) : _mm512_setzero_ps();
        const __m512i p = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        _mm512_mask_storeu_epi16(d + 2 * i, (__mmask32)(m == 16 ? 0xFFFFFFFFu : (1u << (2 * m)) - 1u), p);
    }
}
#endif


/* whether every tile load stays inside x and W: 16 pairs a step, W's rows hold KH KW C2 pairs, the padded plane
 * holds the image's taps and the last pixel tile's largest tap offset (the slack rows past the padded image) */
static int pairs_fit(const sdrt_conv_pairs *a, int ptiles) {
    const long taps = (long)a->KH * a->KW, plane = (long)a->Hp * a->Wp;
    return a->N > 0 && a->OC > 0 && a->OH > 0 && a->OW > 0 && a->KH > 0 && a->KW > 0 && a->dh > 0 && a->dw > 0 &&
           a->C2 >= 16 && a->C2 % 16 == 0 && a->ldw >= taps * a->C2 * 2 && a->x_item >= plane * a->C2 * 2 &&
           a->Wp >= a->OW + (long)(a->KW - 1) * a->dw && a->Hp >= a->OH + (long)(a->KH - 1) * a->dh &&
           16L * ptiles + (long)(a->KH - 1) * a->dh * a->Wp + (long)(a->KW - 1) * a->dw <= plane;
}

void sdrt_conv_pairs_run(const sdrt_conv_pairs *a, const float *bias, const float *rbias, int32_t *state, int nth) {
    const int rtiles = (a->OC + 15) / 16;
    const int nq = (a->OH - 1) * a->Wp + a->OW, ptiles = (nq + 15) / 16;
    if (!pairs_fit(a, ptiles))
        return; /* not the lowering's layout (conv_kernels.conv_pairs): nothing read or written */
    /* row tiles a unit: W's rows of them fit AMXC_W_BYTES, an even count (pairs of tiles) */
    int rchunk = (int)(AMXC_W_BYTES / ((size_t)16 * a->ldw * 2));
    rchunk = rchunk < 2 ? 2 : rchunk & ~1;
    rchunk = rchunk > rtiles ? rtiles : rchunk;
    const int rchunks = (rtiles + rchunk - 1) / rchunk;
    /* pixel tiles a unit: all of them (every batch item in the unit: W's rows read once from memory), split in
     * halves while there would be fewer than 4 units a thread */
    int pchunk = ptiles + (ptiles & 1);
    const int th = nth > 0 ? nth : 1;
    while (pchunk > 2 && (long)rchunks * ((ptiles + pchunk - 1) / pchunk) < 4L * th)
        pchunk = (pchunk / 2 + 1) & ~1;
    const int pchunks = (ptiles + pchunk - 1) / pchunk;
    const long units = (long)rchunks * pchunks;
    int tiles = 0;
#if defined(SDRT_HAVE_AMX)
    SDRT_ALIGN(64) sdrt_amx_config prev;
    tiles = sdrt_amx_enabled();
    if (tiles)
        sdrt_amx_tiles_begin(&prev);
#endif
    for (;;) {
        const long u = sdrt_work_take(state);
        if (u >= units)
            break;
        const int pc = (int)(u / rchunks), rc = (int)(u % rchunks); /* row chunks inner: the pixels' input stays hot */
        const int r0 = rc * rchunk, r1 = r0 + rchunk < rtiles ? r0 + rchunk : rtiles;
        const int t0 = pc * pchunk, t1 = t0 + pchunk < ptiles ? t0 + pchunk : ptiles;
        int n = 0;
        for (; n < a->N; n++) {
            const float *rb = rbias ? sdrt_item_row_bias(5, rbias, bias, n, a->OC) : bias;
            if (rbias && !rb)
                break;
#if defined(SDRT_HAVE_AMX)
            if (tiles) {
                pairs_unit_amx(a, n, rb, r0, r1, t0, t1);
                continue;
            }
#endif
            pairs_unit_scalar(a, n, rb, 16 * r0, 16 * r1 < a->OC ? 16 * r1 : a->OC, t0, t1);
        }
        if (n < a->N)
            break;
    }
#if defined(SDRT_HAVE_AMX)
    if (tiles)
        sdrt_amx_tiles_end(&prev);
#endif
    (void)tiles;
}

void sdrt_pair_rows(const float *a0, const float *a1, ptrdiff_t lda, int rows, int n, uint16_t *d, ptrdiff_t ldd) {
#if defined(SDRT_HAVE_AMX)
    if (sdrt_amx_available()) {
        for (int r = 0; r < rows; r++)
            pair_row(a0 + r * lda, a1 ? a1 + r * lda : NULL, n, d + r * ldd);
        return;
    }
#endif
    for (int r = 0; r < rows; r++) {
        const float *a = a0 + r * lda, *b = a1 ? a1 + r * lda : NULL;
        uint16_t *o = d + r * ldd;
        for (int i = 0; i < n; i++) {
            o[2 * i] = sdrt_f32_to_bf16(a[i]);
            o[2 * i + 1] = b ? sdrt_f32_to_bf16(b[i]) : 0;
        }
    }
}

void sdrt_pair_plane_borders(uint16_t *d, int top, int left, int W, int H, int Wp, int Hp, int all) {
    if (all) {
        memset(d, 0, (size_t)Hp * Wp * 4);
        return;
    }
    memset(d, 0, (size_t)top * Wp * 4);
    if (left > 0 || Wp > left + W)
        for (int y = 0; y < H; y++) {
            uint16_t *row = d + (ptrdiff_t)(y + top) * Wp * 2;
            memset(row, 0, (size_t)left * 4);
            memset(row + 2 * (left + W), 0, (size_t)(Wp - left - W) * 4);
        }
    memset(d + (ptrdiff_t)(top + H) * Wp * 2, 0, (size_t)(Hp - top - H) * Wp * 4);
}

/* dst = x as bf16 channel pairs, zero-padded: the input of the conv's "pairs" case, as ggml_custom_4d's callback.
 *   src[0] x:      ne (W, H, C, N), contiguous float32
 *   src[1] params: int32 [top, left]
 *   dst:           ne (2 Wp, Hp, C2, N) 16-bit, C2 >= ceil(C / 2): pair plane p holds channels 2p and 2p + 1
 *                  (zeros past C) as bf16 side by side, the image at (top, left), zeros around it
 * The threads take pair planes in turn. */
SDRT_EXPORT void sdrt_pair_pad_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_pair_pad_op);
    (void)userdata;
    sdrt_pad_job j;
    if (sdrt_pad_job_of(dst, 2, &j) || j.X.ne[3] != j.D.ne[3] || j.D.ne[2] * 2 < j.X.ne[2])
        return;
    const sdrt_view X = j.X, D = j.D;
    const int top = j.top, left = j.left, W = j.W, H = j.H, C = (int)X.ne[2], Wp = j.Wp, Hp = j.Hp;
    const long planes = j.planes;
    for (long p = ith; p < planes; p += nth) {
        const int cp = (int)(p % D.ne[2]), n = (int)(p / D.ne[2]);
        uint16_t *d = (uint16_t *)(void *)(D.data + cp * D.nb[2] + n * D.nb[3]);
        const char *xn = X.data + n * X.nb[3];
        const float *x0 = 2 * cp < C ? (const float *)(const void *)(xn + 2 * cp * X.nb[2]) : NULL;
        const float *x1 = 2 * cp + 1 < C ? (const float *)(const void *)(xn + (2 * cp + 1) * X.nb[2]) : NULL;
        sdrt_pair_plane_borders(d, top, left, W, H, Wp, Hp, x0 == NULL);
        if (!x0)
            continue;
        /* no columns of padding (a 1x1 conv's input): the image is one run in both planes, converted as one */
        if (left == 0 && Wp == W)
            sdrt_pair_rows(x0, x1, 0, 1, H * W, d + (ptrdiff_t)top * Wp * 2, 0);
        else
            sdrt_pair_rows(x0, x1, W, H, W, d + ((ptrdiff_t)top * Wp + left) * 2, (ptrdiff_t)Wp * 2);
    }
}
