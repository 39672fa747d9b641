/* The bf16 kernels' weight layouts, written from float32 weights in one pass (native.py's pack_b_bf16,
 * bf16_rows and pairs_weights call these; tests/plugins/ggml/test_ggml_pack.py holds the layouts as numpy).
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
