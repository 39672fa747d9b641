/* ggml_tensor field access through offsets given at load time, and CPU feature detection. */
#include "sdrt_native.h"

#if defined(_MSC_VER) && defined(SDRT_X86)
#include <intrin.h>
#include <immintrin.h>
#endif
#if defined(SDRT_X86) && !defined(_MSC_VER) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

static size_t off_ne = (size_t)-1, off_nb, off_data, off_src;
static int n_src;

/* Called once from Python with ggml-python's ctypes offsets of ggml_tensor.ne/.nb/.data/.src.
 * Returns 0, or -1 when an offset is out of the structure (the kernels then stay unused). */
SDRT_EXPORT int sdrt_set_tensor_layout(size_t ne, size_t nb, size_t data, size_t src, int max_src, size_t size) {
    if (ne + 4 * sizeof(int64_t) > size || nb + 4 * sizeof(size_t) > size || data + sizeof(void *) > size ||
        src + (size_t)max_src * sizeof(void *) > size || max_src < 3)
        return -1;
    off_ne = ne;
    off_nb = nb;
    off_data = data;
    off_src = src;
    n_src = max_src;
    return 0;
}

/* What the kernels read from a tensor, for the load-time layout check against ggml's API:
 * out[0..3] = ne, out[4..7] = nb, out[8] = data, out[9..11] = src[0..2]. */
SDRT_EXPORT int sdrt_probe_tensor(const void *tensor, int64_t *out) {
    if (off_ne == (size_t)-1 || !tensor)
        return -1;
    sdrt_view v = sdrt_tensor_view(tensor);
    for (int i = 0; i < 4; i++) {
        out[i] = v.ne[i];
        out[4 + i] = (int64_t)v.nb[i];
    }
    out[8] = (int64_t)(intptr_t)v.data;
    for (int i = 0; i < 3; i++)
        out[9 + i] = (int64_t)(intptr_t)sdrt_tensor_src(tensor, i);
    return 0;
}

sdrt_view sdrt_tensor_view(const void *tensor) {
    const char *t = (const char *)tensor;
    sdrt_view v;
    v.ne = (const int64_t *)(t + off_ne);
    v.nb = (const size_t *)(t + off_nb);
    v.data = *(char *const *)(t + off_data);
    return v;
}

const void *sdrt_tensor_src(const void *tensor, int i) {
    if (i < 0 || i >= n_src)
        return NULL;
    return ((const void *const *)((const char *)tensor + off_src))[i];
}

/* ---- CPU features ---------------------------------------------------------------- */
#if defined(SDRT_X86) && defined(_MSC_VER)
static int x86_has(int isa) {
    int r[4];
    __cpuid(r, 0);
    if (r[0] < 7)
        return 0;
    __cpuid(r, 1);
    int fma = (r[2] >> 12) & 1, osxsave = (r[2] >> 27) & 1, avx = (r[2] >> 28) & 1;
    if (!(osxsave && avx))
        return 0;
    unsigned long long xcr0 = _xgetbv(0);
    if ((xcr0 & 6) != 6)
        return 0;
    __cpuidex(r, 7, 0);
    int avx2 = (r[1] >> 5) & 1, avx512f = (r[1] >> 16) & 1;
    if (isa == SDRT_ISA_AVX2)
        return avx2 && fma;
    if (isa == SDRT_ISA_AVX512)
        return avx512f && avx2 && fma && (xcr0 & 0xe6) == 0xe6;
    return 0;
}
#elif defined(SDRT_X86) && (defined(__GNUC__) || defined(__clang__))
static int x86_has(int isa) {
    __builtin_cpu_init();
    if (isa == SDRT_ISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == SDRT_ISA_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return 0;
}
#endif

/* AVX-512-BF16 (CPUID leaf 7 subleaf 1, EAX bit 5) with AVX-512BW and the OS's AVX-512 state; the
 * bf16 kernels also need AVX-512F (sdrt_cpu_has(SDRT_ISA_AVX512)) */
int sdrt_cpu_has_bf16(void) {
#if defined(SDRT_X86) && defined(_MSC_VER)
    int r[4];
    __cpuid(r, 0);
    if (r[0] < 7 || !x86_has(SDRT_ISA_AVX512))
        return 0;
    __cpuidex(r, 7, 0);
    const int bw = (r[1] >> 30) & 1;
    __cpuidex(r, 7, 1);
    return bw && ((r[0] >> 5) & 1);
#elif defined(SDRT_X86) && (defined(__GNUC__) || defined(__clang__))
    unsigned a, b, c, d;
    if (!x86_has(SDRT_ISA_AVX512) || !__builtin_cpu_supports("avx512bw") || __get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 1, a, b, c, d);
    return (a >> 5) & 1;
#else
    return 0;
#endif
}

int sdrt_cpu_has(int isa) {
    if (isa == SDRT_ISA_PORTABLE)
        return 1;
#if defined(SDRT_X86) && (defined(_MSC_VER) || defined(__GNUC__) || defined(__clang__))
    if (isa == SDRT_ISA_AVX2 || isa == SDRT_ISA_AVX512)
        return x86_has(isa);
#endif
#if defined(SDRT_ARM64)
    if (isa == SDRT_ISA_NEON)
        return 1; /* Advanced SIMD is part of every AArch64 CPU */
#endif
    return 0;
}
