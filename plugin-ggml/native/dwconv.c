/* Depthwise 2-D convolution (groups = channels) straight from NCHW, a ggml custom op.
 *
 *   out[n, c, oy, ox] = act(bias[c] + sum_{i,j} W[c, i, j] . x[n, c, oy sh + i dh - ph, ox sw + j dw - pw])
 *
 * ggml's own depthwise kernel is vectorised only over channels, so the lowering used to lay the
 * input out channels-last and the result back (two copies per conv: MobileNets have dozens).
 * Here the outputs are one vector loop (simd_dw.h, per ISA): each input plane is copied once into a
 * zero-padded buffer, and at stride 1 the whole plane is one run (output position q = oy Wp + ox
 * over the padded width Wp; the few columns past a row's output are computed and dropped), so
 * every tap is a contiguous, unconditional vector load; at stride 2 the padded rows are split into
 * even and odd phases and each output row is one run.
 * The bias and the activation (ReLU, clip, hardswish: sdrt_epilogue) are applied as the row is
 * stored. The threads take channel planes in turn.
 */
#include "sdrt_ops.h"

#include <string.h>

/* params[] of sdrt_dwconv_op */
enum { DW_KH, DW_KW, DW_SH, DW_SW, DW_DH, DW_DW, DW_PH, DW_PW, DW_ACT, DW_LO, DW_HI, DW_COUNT };

/* dst = depthwise conv(x, W) + bias, then the activation, as ggml_custom_4d's callback.
 *   src[0] x:      ne (W, H, C, N), contiguous
 *   src[1] W:      ne (KH*KW, C), contiguous: the taps of one channel in (i, j) order
 *   src[2] params: int32 [KH, KW, sh, sw, dh, dw, ph, pw, act, lo, hi] (lo, hi: float bits; sw 1 or 2)
 *   src[3] bias:   C floats, or NULL
 *   dst:           ne (OW, OH, C, N), contiguous */
SDRT_EXPORT void sdrt_dwconv_op(void *dst, int ith, int nth, void *userdata) {
    (void)userdata;
    const void *tx = sdrt_tensor_src(dst, 0), *tw = sdrt_tensor_src(dst, 1), *tp = sdrt_tensor_src(dst, 2),
               *tb = sdrt_tensor_src(dst, 3);
    if (!tx || !tw || !tp)
        return;
    const sdrt_view X = sdrt_tensor_view(tx), Wt = sdrt_tensor_view(tw), O = sdrt_tensor_view(dst);
    const int32_t *pr = (const int32_t *)sdrt_tensor_view(tp).data;
    const float *bias = tb ? (const float *)sdrt_tensor_view(tb).data : NULL;
    const int W = (int)X.ne[0], H = (int)X.ne[1], C = (int)X.ne[2], N = (int)X.ne[3];
    const int OW = (int)O.ne[0], OH = (int)O.ne[1];
    const int KH = pr[DW_KH], KW = pr[DW_KW], sh = pr[DW_SH], sw = pr[DW_SW], dh = pr[DW_DH], dw = pr[DW_DW];
    const int ph = pr[DW_PH], pw = pr[DW_PW];
    sdrt_epilogue ep = {pr[DW_ACT], 0.0f, 0.0f};
    memcpy(&ep.lo, pr + DW_LO, sizeof(float));
    memcpy(&ep.hi, pr + DW_HI, sizeof(float));
    if (KH < 1 || KW < 1 || KH * KW > 256 || (sw != 1 && sw != 2) || sh < 1 || (int)O.ne[2] != C ||
        (int)Wt.ne[1] != C || (int)Wt.ne[0] != KH * KW)
        return;
    const sdrt_dw_taps_fn taps_fn = sdrt_ops_dw_taps();
    const sdrt_split2_fn split2 = sdrt_ops_split2();
    const int nt = KH * KW, Hp = H + 2 * ph, Wp = W + 2 * pw;
    /* stride 1: the whole padded plane (Hp rows of Wp) as one run of positions, q = oy Wp + ox (the
     * columns ox >= OW computed and dropped); otherwise row by row, each padded row split into sw
     * phases of plen floats. Each buffer reaches past its end for the last vector (16 floats). */
    const int flat = sh == 1 && sw == 1;
    const int plen = flat ? Wp : (Wp + sw - 1) / sw + (KW * dw) / sw + 17;
    const size_t plane = (size_t)Hp * sw * plen + (size_t)KW * dw + 32;
    float *buf = sdrt_thread_buffer(3, (plane + (flat ? (size_t)OH * Wp + 16 : 2 * (size_t)plen + 32)) * sizeof(float));
    if (!buf)
        return;
    float *tmp = buf + plane; /* flat: the outputs with their dropped columns */
    float *row = tmp;         /* stride 2: one padded row before its split */
    const float *taps[256];
    for (long pl = ith; pl < (long)N * C; pl += nth) {
        const int n = (int)(pl / C), c = (int)(pl % C);
        const float *xp = (const float *)(X.data + (size_t)n * X.nb[3] + (size_t)c * X.nb[2]);
        float *op = (float *)(O.data + (size_t)n * O.nb[3] + (size_t)c * O.nb[2]);
        const float *wc = (const float *)(Wt.data + (size_t)c * Wt.nb[1]);
        const float b = bias ? bias[c] : 0.0f;
        for (int y = 0; y < Hp; y++) {
            const int iy = y - ph;
            for (int p = 0; p < sw; p++) {
                float *d = buf + ((size_t)y * sw + p) * plen;
                if (iy < 0 || iy >= H) {
                    memset(d, 0, (size_t)plen * sizeof(float));
                    continue;
                }
                const float *src = xp + (size_t)iy * W;
                if (sw == 1) {
                    memset(d, 0, (size_t)pw * sizeof(float));
                    memcpy(d + pw, src, (size_t)W * sizeof(float));
                    memset(d + pw + W, 0, (size_t)(plen - pw - W) * sizeof(float));
                } else if (p == 0) { /* the padded row in `row`, then its even and odd phases */
                    memset(row, 0, (size_t)pw * sizeof(float));
                    memcpy(row + pw, src, (size_t)W * sizeof(float));
                    memset(row + pw + W, 0, (size_t)(2 * plen + 32 - pw - W) * sizeof(float));
                    split2(plen, row, d, d + plen);
                }
            }
        }
        memset(buf + (size_t)Hp * sw * plen, 0, ((size_t)KW * dw + 32) * sizeof(float));
        if (flat) {
            for (int i = 0; i < KH; i++)
                for (int j = 0; j < KW; j++)
                    taps[i * KW + j] = buf + (size_t)i * dh * Wp + (size_t)j * dw;
            taps_fn(OH * Wp, nt, taps, wc, b, ep.act ? &ep : NULL, tmp);
            for (int oy = 0; oy < OH; oy++)
                memcpy(op + (size_t)oy * OW, tmp + (size_t)oy * Wp, (size_t)OW * sizeof(float));
            continue;
        }
        for (int oy = 0; oy < OH; oy++) {
            for (int i = 0; i < KH; i++)
                for (int j = 0; j < KW; j++) {
                    const int t = j * dw;
                    taps[i * KW + j] = buf + ((size_t)(oy * sh + i * dh) * sw + t % sw) * plen + t / sw;
                }
            taps_fn(OW, nt, taps, wc, b, ep.act ? &ep : NULL, op + (size_t)oy * OW);
        }
    }
}
