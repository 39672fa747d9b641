/* The bf16 kernels' weight layouts, written from float32 weights in one pass (native.py's pack_b_bf16,
 * bf16_rows and pairs_weights call these; tests/plugins/ggml/test_ggml_pack.py holds the layouts as numpy).
 *
 * At bf16 a lowering converts every MatMul and dense conv weight of the model (860M of SD 1.5's UNet) to
 * bf16 and lays it out for its kernel. numpy did that in five passes over the float32 weights plus a
 * transposing copy: about 8 s of sdrt-ggml's first image at 512 px (Sapphire Rapids). Here each weight is
 * read once and each bf16 written once. Round to nearest even, a NaN kept a (quiet) NaN, as
 * sdrt_f32_to_bf16 and ggml_fp32_to_bf16_row do.
 */
#include "sdrt_native.h"

#include <string.h>

/* float32 -> bf16 bits without a branch (sdrt_f32_to_bf16's rounding), so that the loops below vectorize */
static inline uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? (u >> 16) | 0x40u : rounded);
}

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
                out[0] = col < n ? bf16_of(src[k0 * sk]) : 0;
                out[1] = col < n && k0 + 1 < k ? bf16_of(src[(k0 + 1) * sk]) : 0;
            }
}

/* a conv's kernel rows (oc, k) -> bf16 rows ld apart (ld >= k), zeros past k */
SDRT_EXPORT void sdrt_bf16_rows(const float *w, int64_t oc, int64_t k, int64_t ld, uint16_t *out) {
    for (int64_t r = 0; r < oc; r++) {
        const float *src = w + r * k;
        uint16_t *dst = out + r * ld;
        for (int64_t i = 0; i < k; i++)
            dst[i] = bf16_of(src[i]);
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
                out[ch] = bf16_of(src[ch * taps]);
            memset(out + have, 0, (size_t)(width - have) * sizeof(uint16_t));
        }
}
