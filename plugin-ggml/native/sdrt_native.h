/* sdrt-ggml native kernels: shared declarations.
 *
 * Plain C11, no dependency. The kernels are ggml custom ops (ggml_custom_4d): ggml's CPU
 * backend calls them as fun(dst, ith, nth, userdata) on each of its threads. ggml-python
 * installs no headers, so a tensor's fields are read through byte offsets that Python
 * passes in at load time (sdrt_set_tensor_layout, taken from ggml-python's ctypes
 * structure and checked there against ggml's own API before any kernel runs).
 *
 * Compiler support: GCC and Clang (per-function target attributes, __builtin_cpu_supports),
 * MSVC (intrinsics need no target attribute; CPUID for dispatch). Every ISA-specific
 * kernel is behind a compile-time guard, so a compiler or CPU with only some of them
 * still builds and runs the portable C path.
 */
#ifndef SDRT_NATIVE_H
#define SDRT_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SDRT_EXPORT __declspec(dllexport)
#else
#define SDRT_EXPORT __attribute__((visibility("default")))
#endif

#if defined(_MSC_VER)
#define SDRT_ALIGN(n) __declspec(align(n))
#define SDRT_THREAD_LOCAL __declspec(thread)
#define SDRT_INLINE static __forceinline
#else
#define SDRT_ALIGN(n) __attribute__((aligned(n)))
#define SDRT_THREAD_LOCAL _Thread_local
#define SDRT_INLINE static inline __attribute__((always_inline))
#endif

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#define SDRT_X86 1
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#define SDRT_ARM64 1
#endif

/* ISA ids (also the values of SDRT_GGML_GEMM_ISA / sdrt_gemm_set_isa) */
enum { SDRT_ISA_AUTO = -1, SDRT_ISA_PORTABLE = 0, SDRT_ISA_AVX2 = 1, SDRT_ISA_AVX512 = 2, SDRT_ISA_NEON = 3,
       SDRT_ISA_COUNT = 4 };

/* ---- ggml_tensor access through offsets (tensor.c) ---------------------------------- */
typedef struct {
    const int64_t *ne;
    const size_t *nb;
    char *data;
} sdrt_view;

/* the fields of a ggml_tensor* as a view; src(i) of a tensor */
sdrt_view sdrt_tensor_view(const void *tensor);
const void *sdrt_tensor_src(const void *tensor, int i);

/* ---- GEMM (gemm.c, gemm_kernels.c) ------------------------------------------------- */
/* B panels are always NR = 32 columns wide, for every ISA, so packed weights do not depend
 * on which kernel runs them. */
#define SDRT_NR 32

/* where a tile's results go: c[i*ldc + j] (rows of M), or transposed c[j*ldc + i] */
typedef struct {
    float *c;
    ptrdiff_t ldc;
    int trans;
    int m;              /* valid rows (<= the kernel's MR) */
    int n;              /* valid columns (<= the kernel's NR) */
    const float *bias;  /* per column j, already offset to the tile's first column; NULL for none */
    const float *rbias; /* per row i, already offset to the tile's first row; NULL for none */
    int acc;            /* add to what C holds (a later block of K) instead of overwriting it */
} sdrt_tile_out;

/* C tile (mr x NR) = A rows (mr x K, a[i*lda + k]) . B slice (K x NR, b[k*32 + j]: NR columns of a
 * 32-column packed panel). pf: the A rows the next call reads (same lda), prefetched into L1 while
 * this one computes */
typedef void (*sdrt_kernel_fn)(int K, const float *a, ptrdiff_t lda, const float *b, const sdrt_tile_out *o,
                               const float *pf);

typedef struct {
    const char *name;
    int mr_max;
    int nr; /* columns per call (16 or 32): a 32-column panel takes 32 / nr calls */
    int kc; /* longest block of K: a kc x nr slice of B (row stride 32) stays in L1 over the A tiles */
    sdrt_kernel_fn kern[17]; /* kern[mr] for mr in 1..mr_max */
} sdrt_isa_kernels;

/* the kernel table of an ISA, or NULL when this build or this CPU lacks it */
const sdrt_isa_kernels *sdrt_kernels_portable(void);
const sdrt_isa_kernels *sdrt_kernels_avx2(void);
const sdrt_isa_kernels *sdrt_kernels_avx512(void);
const sdrt_isa_kernels *sdrt_kernels_neon(void);
int sdrt_cpu_has(int isa);
/* the kernels of the ISA the custom ops use now (gemm.c) */
const sdrt_isa_kernels *sdrt_active_kernels(void);

/* the scalar tile store shared by kernels that compute into a temporary tile */
void sdrt_store_tile(const float *tile, int ld_tile, const sdrt_tile_out *o);

/* ---- the blocked product over packed panels (gemm.c; the GEMM op and the conv use it) ------ */
typedef struct {
    float *c;           /* C at (row 0, column 0) of the block */
    ptrdiff_t ldc;
    int trans;          /* c[j*ldc + i] instead of c[i*ldc + j] */
    int n;              /* valid columns from the first panel's column 0 */
    const float *bias;  /* per column from column 0, or NULL */
    const float *rbias; /* per row from row 0, or NULL */
} sdrt_block_out;

/* C[0:m, the panels' columns] (+)= A[0:m, 0:k] . B, B as `panels` packed slices of k x 32 floats,
 * pstride floats apart. For each panel, for each nr-column slice of it, every MR tile of A meets
 * the slice while it is in L1 (the A tiles stream from L2). acc: add to C (a later block of K);
 * else C = product + bias. */
void sdrt_block(const sdrt_isa_kernels *kk, int m, int k, const float *a, ptrdiff_t lda, const float *b,
                ptrdiff_t pstride, int panels, const sdrt_block_out *out, int acc);

/* a 64-byte aligned per-thread scratch buffer (slot 0..3), kept for the thread's life; NULL when
 * out of memory */
float *sdrt_thread_buffer(int slot, size_t bytes);

#endif
