/* sdrt-ggml native kernels: a conv's input as rows of patches, for the cols route of a kxk conv.
 *
 * On a small output map (a UNet's 4x4 to 8x8 levels) a kxk conv has too few pixels for the pixel-panel routes:
 * Winograd F(2x2, 3x3) fills 4 of a 32-column panel at 4x4, the packed implicit GEMM 16. As a 1x1 conv of
 * K = C*KH*KW channels over these rows, the cols route (conv.c: output channels along the vectors, pixels
 * broadcast) computes every pixel once; the rows cost K x OH x OW floats, a few hundred KB at these sizes.
 */
#include <string.h>

#include "sdrt_native.h"

/* dst = the patches of x, as ggml_custom_4d's callback.
 *   src[0] x:      ne (W, H, C, N), contiguous (NCHW)
 *   src[1] params: int32 [KH, KW, sh, sw, dh, dw, ph, pw] (symmetric pads)
 *   dst:           ne (OW, OH, C*KH*KW, N), contiguous: row (c*KH + i)*KW + j of item n holds, at pixel (oy, ox),
 *                  x[n, c, oy*sh - ph + i*dh, ox*sw - pw + j*dw], zero outside the image (the OIHW kernel's
 *                  (c, i, j) order, so that W's rows need no reordering)
 * The threads take (item, channel) planes in turn. */
/* n floats from s to d, the short rows of a small map without a library call a row: blocks of 8, then at most one
 * and 4, 2, 1 (fixed-size copies, which compilers turn into moves; a loop for the rest became a memmove call) */
static void copy_short(float *SDRT_RESTRICT d, const float *SDRT_RESTRICT s, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        memcpy(d + i, s + i, 8 * sizeof(float));
    if (i + 4 <= n) {
        memcpy(d + i, s + i, 4 * sizeof(float));
        i += 4;
    }
    if (i + 2 <= n) {
        memcpy(d + i, s + i, 2 * sizeof(float));
        i += 2;
    }
    if (i < n)
        d[i] = s[i];
}

SDRT_EXPORT void sdrt_im2col_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_im2col_op);
    (void)userdata;
    const void *tx = sdrt_tensor_src(dst, 0), *tp = sdrt_tensor_src(dst, 1);
    if (!tx || !tp)
        return;
    const sdrt_view X = sdrt_tensor_view(tx), D = sdrt_tensor_view(dst);
    const int32_t *pr = (const int32_t *)sdrt_tensor_view(tp).data;
    const int KH = pr[0], KW = pr[1], sh = pr[2], sw = pr[3], dh = pr[4], dw = pr[5], ph = pr[6], pw = pr[7];
    const int W = (int)X.ne[0], H = (int)X.ne[1], C = (int)X.ne[2], N = (int)X.ne[3];
    const int OW = (int)D.ne[0], OH = (int)D.ne[1];
    /* the lowering's operands or nothing: float32 rows W apart, every tap inside the padded plane (64-bit sums:
     * no params wrap past the test), dst's channels and items those of the patches. On a mismatch dst is left as
     * it was (the contract's callers never pass one; conv.c does the same) */
    if (KH < 1 || KW < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || ph < 0 || pw < 0 || OW < 1 || OH < 1 ||
        X.nb[0] != sizeof(float) || X.nb[1] != (size_t)W * sizeof(float) || D.nb[0] != sizeof(float) ||
        D.ne[2] != (int64_t)C * KH * KW || D.ne[3] != N ||
        (int64_t)(OH - 1) * sh + (int64_t)(KH - 1) * dh >= (int64_t)H + 2 * (int64_t)ph ||
        (int64_t)(OW - 1) * sw + (int64_t)(KW - 1) * dw >= (int64_t)W + 2 * (int64_t)pw ||
        ((int64_t)W + 2 * (int64_t)pw) * ((int64_t)H + 2 * (int64_t)ph) > ((int64_t)1 << 30))
        return;
    const long planes = (long)C * N;
    if (ith >= planes)
        return;
    /* a plane zero-padded in this thread's buffer, then each tap's rows copied from it with no bounds to test */
    const int Wp = W + 2 * pw, Hp = H + 2 * ph;
    float *pad = sdrt_thread_buffer(2, (size_t)Wp * Hp * sizeof(float));
    if (!pad)
        return;
    memset(pad, 0, (size_t)Wp * Hp * sizeof(float));
    for (long p = ith; p < planes; p += nth) {
        const int n = (int)(p / C), c = (int)(p % C);
        const float *s = (const float *)(X.data + c * X.nb[2] + n * X.nb[3]);
        for (int y = 0; y < H; y++) /* the pads stay zero: only the image is written */
            copy_short(pad + (ptrdiff_t)(y + ph) * Wp + pw, s + (ptrdiff_t)y * W, W);
        for (int i = 0; i < KH; i++)
            for (int j = 0; j < KW; j++) {
                float *d = (float *)(D.data + ((int64_t)(c * KH + i) * KW + j) * D.nb[2] + n * D.nb[3]);
                for (int oy = 0; oy < OH; oy++, d += OW) {
                    const float *row = pad + (ptrdiff_t)(oy * sh + i * dh) * Wp + j * dw;
                    if (sw == 1)
                        copy_short(d, row, OW);
                    else
                        for (int ox = 0; ox < OW; ox++)
                            d[ox] = row[(ptrdiff_t)ox * sw];
                }
            }
    }
}
