/* The kernels' weight layouts, written from float32 weights in one pass (native.py's pack_b, pack_b_bf16, bf16_rows,
 * pairs_weights and winograd_weights call these; tests/plugins/ggml/test_ggml_pack.py holds the layouts as numpy).
 *
 * At bf16 a lowering converts every MatMul and dense conv weight of the model (860M of SD 1.5's UNet) to
 * bf16 and lays it out for its kernel. numpy did that in five passes over the float32 weights plus a
 * transposing copy: about 8 s of sdrt-ggml's first image at 512 px (Sapphire Rapids). Here each weight is
 * read once and each bf16 written once, rounded by sdrt_f32_to_bf16 (to nearest even, a NaN kept a quiet NaN, as
 * ggml_fp32_to_bf16_row does).
 */
#include "sdrt_native.h"

#include <string.h>

/* B as (n, k) float32 rows (element strides sn, sk: a transposed view is read in place) -> panels of 32 columns,
 * each two halves of 16, each k as ceil(k/2) pairs with the pair of a column side by side: out (ceil(n/32), 2,
 * ceil(k/2), 16, 2), zeros where n or k fall short. Written in order. */
SDRT_EXPORT void sdrt_pack_b_bf16(const float *w, int64_t n, int64_t k, int64_t sn, int64_t sk, uint16_t *out) {
    const int64_t halves = (n + 31) / 32 * 2, k2 = (k + 1) / 2;
    for (int64_t hf = 0; hf < halves; hf++)
        for (int64_t kp = 0; kp < k2; kp++)
            for (int64_t c = 0; c < 16; c++, out += 2) {
                const int64_t col = hf * 16 + c, k0 = 2 * kp;
                const float *src = col < n ? w + col * sn : w;
                out[0] = col < n ? sdrt_f32_to_bf16(src[k0 * sk]) : 0;
                out[1] = col < n && k0 + 1 < k ? sdrt_f32_to_bf16(src[(k0 + 1) * sk]) : 0;
            }
}

/* sdrt_pack_b_bf16's panels at float32: out (ceil(n/32), 2, k, 16), zero columns where n falls short. */
SDRT_EXPORT void sdrt_pack_b_f32(const float *w, int64_t n, int64_t k, int64_t sn, int64_t sk, float *out) {
    const int64_t halves = (n + 31) / 32 * 2;
    for (int64_t hf = 0; hf < halves; hf++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t c = 0; c < 16; c++) {
                const int64_t col = hf * 16 + c;
                *out++ = col < n ? w[col * sn + kk * sk] : 0.0f;
            }
}

/* a conv's kernel rows (oc, k) -> bf16 rows ld apart (ld >= k), zeros past k */
SDRT_EXPORT void sdrt_bf16_rows(const float *w, int64_t oc, int64_t k, int64_t ld, uint16_t *out) {
    for (int64_t r = 0; r < oc; r++) {
        const float *src = w + r * k;
        uint16_t *dst = out + r * ld;
        for (int64_t i = 0; i < k; i++)
            dst[i] = sdrt_f32_to_bf16(src[i]);
        memset(dst + k, 0, (size_t)(ld - k) * sizeof(uint16_t));
    }
}

/* a kernel (oc, c, taps) -> [ceil(oc/16)*16][taps][2 c2] bf16 (the channels of each tap side by side), zeros past c
 * and in the rows past oc */
SDRT_EXPORT void sdrt_pairs_weights(const float *w, int64_t oc, int64_t c, int64_t taps, int64_t c2,
                                    uint16_t *out) {
    const int64_t rows = (oc + 15) / 16 * 16, width = 2 * c2;
    for (int64_t o = 0; o < rows; o++)
        for (int64_t t = 0; t < taps; t++, out += width) {
            const int64_t have = o < oc ? c : 0;
            const float *src = have ? w + o * c * taps + t : w;
            for (int64_t ch = 0; ch < have; ch++)
                out[ch] = sdrt_f32_to_bf16(src[ch * taps]);
            memset(out + have, 0, (size_t)(width - have) * sizeof(uint16_t));
        }
}

/* Rows o0..o1 of a 3x3 kernel (oc, c, 3, 3) as Winograd F(2x2, 3x3)'s 16 matrices: out is the whole (16, oc, ld)
 * array, out[k][o][ch] = (G g G^T)[k / 4][k % 4] with G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], zeros from c
 * to ld; what sdrt_winograd_op multiplies the transformed input by. Computed in double and rounded once. numpy's
 * three-operand einsum took 36 of the 42 s that lowering SD 1.5's UNet at float32 took (Zen 3, 2.2 GB of 3x3
 * kernels); this is a pass over the kernel and one over the output. */
SDRT_EXPORT void sdrt_winograd_weights(const float *w, int64_t oc, int64_t c, int64_t ld, int64_t o0, int64_t o1,
                                       float *out) {
    const int64_t plane = oc * ld;
    for (int64_t o = o0; o < o1; o++) {
        float *row = out + o * ld;
        for (int64_t ch = 0; ch < c; ch++) {
            const float *g = w + (o * c + ch) * 9;
            double t[4][3]; /* G g */
            for (int j = 0; j < 3; j++) {
                const double a = g[j], b = g[3 + j], d = g[6 + j];
                t[0][j] = a;
                t[1][j] = 0.5 * (a + b + d);
                t[2][j] = 0.5 * (a - b + d);
                t[3][j] = d;
            }
            for (int i = 0; i < 4; i++) { /* (G g) G^T, row i */
                const double a = t[i][0], b = t[i][1], d = t[i][2];
                float *dst = row + 4 * i * plane + ch;
                dst[0] = (float)a;
                dst[plane] = (float)(0.5 * (a + b + d));
                dst[2 * plane] = (float)(0.5 * (a - b + d));
                dst[3 * plane] = (float)d;
            }
        }
        for (int k = 0; k < 16; k++)
            memset(row + k * plane + c, 0, (size_t)(ld - c) * sizeof(float));
    }
}
