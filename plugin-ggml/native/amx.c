/* The bf16 products on AMX tiles (Intel Sapphire Rapids and later): sdrt_block_bf16 for the bf16 kernel
 * table "amx-bf16" (gemm_kernels.c), so the GEMM (run_unit_bf16) and the packed conv (conv_unit_bf16) both run
 * here.
 *
 * tdpbf16ps C += A . B: C a 16 x 16 float32 tile, A 16 rows of 16 bf16 pairs (64 bytes a row, any row stride), B 16
 * pair rows of 16 columns (64 bytes a row). A bf16 panel's half ([K2][16][2], sdrt_native.h) is B tile after B tile
 * (stride 64), and A's pair rows (lda uint32 apart) are A tiles in place. Per 32-column panel, rows go in chunks of
 * 32 (two A tiles, the panel's two B tiles, four C tiles: all eight tile registers), K in steps of 16 pairs; the C
 * tiles are then stored to a small buffer and written by the AVX-512 kernels' epilogue (bias, accumulate, residual,
 * activation, transposed output). Tails: the rows past the last multiple of 16 and the pairs past the last multiple
 * of 16 are copied once a call into zero-padded buffers (a tile never reads outside its operand: the conv reads W's
 * rows in place), the B pair rows past it once a panel; one tile shape throughout, so one tile configuration a call
 * (ldtilecfg zeroes the tiles: it cannot change mid-sum); at the end the caller's configuration is loaded again, or
 * the tiles released where there was none (another library in the process may configure the tiles its own way once
 * a thread and rely on it: ggml's AMX kernels do).
 *
 * Linux grants the tile state (8 KiB of registers) only to a process that asks for it (arch_prctl
 * ARCH_REQ_XCOMP_PERM); without the grant a tile instruction is SIGILL. sdrt_amx_available asks once, and AMX is
 * used only where CPUID has AMX-TILE and AMX-BF16 and XCR0 has the tile state after the grant.
 * SDRT_GGML_AMX=0 turns it off (the vdpbf16ps kernels then run the bf16 products).
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* syscall */
#endif
#include "sdrt_native.h"

#include <stdlib.h>
#include <string.h>

static int amx_on = -1; /* -1: not decided yet */

#if defined(SDRT_HAVE_AMX)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TARGET_AMX SDRT_TARGET_AMX
#define AMX_BARRIER() SDRT_AMX_BARRIER()

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_detect(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid(1, a, b, c, d);
    if (!((c >> 27) & 1)) /* OSXSAVE: xgetbv */
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 22) & 1) || !((d >> 24) & 1)) /* AMX-BF16, AMX-TILE */
        return 0;
    if (!sdrt_cpu_has(SDRT_ISA_AVX512) || !sdrt_cpu_has_bf16()) /* the conversions and the epilogue */
        return 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return 0;
    unsigned long perm = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) != 0 || !((perm >> XFEATURE_XTILEDATA) & 1))
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & (3u << 17)) == (3u << 17); /* XTILECFG and XTILEDATA enabled by the OS */
}

SDRT_EXPORT int sdrt_amx_available(void) {
    static int has = -1;
    if (has < 0)
        has = amx_detect();
    return has;
}

/* The caller's tile configuration (all zeros: none) is put back at the end: a library that loads its own once a
 * thread and then relies on it (ggml's AMX kernels do) must find it again after this call. */
void sdrt_amx_config_default(sdrt_amx_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg->colsb[t] = 64;
        cfg->rows[t] = 16;
    }
}

TARGET_AMX void sdrt_amx_tiles_load(const sdrt_amx_config *cfg, sdrt_amx_config *prev) {
    _tile_storeconfig(prev);
    AMX_BARRIER();
    _tile_loadconfig(cfg);
}

void sdrt_amx_tiles_begin(sdrt_amx_config *prev) {
    SDRT_ALIGN(64) sdrt_amx_config cfg;
    sdrt_amx_config_default(&cfg);
    sdrt_amx_tiles_load(&cfg, prev);
}

TARGET_AMX void sdrt_amx_tiles_end(const sdrt_amx_config *prev) {
    if (prev->palette) {
        _tile_loadconfig(prev);
    } else {
        _tile_release();
    }
}

/* tile registers: C 0-3 (rows tile 0 x halves 0, 1; rows tile 1 x halves 0, 1), A 4-5, B 6-7 */
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

/* where a row tile's A comes from at one step of 16 pairs */
typedef struct {
    const uint32_t *p;
    ptrdiff_t stride; /* bytes */
} amx_src;

typedef struct {
    const uint32_t *a;
    ptrdiff_t lda;
    int m16, ks;             /* rows in whole tiles, whole steps of 16 pairs */
    const uint32_t *atail;   /* rows 0 .. m16-1, the pairs past ks x 16: 16 pairs a row, zero-padded */
    const uint32_t *mtail;   /* rows m16 .. m16+15 (zeros past m), every step: ld_mt pairs a row, zero-padded */
    ptrdiff_t ld_mt;
} amx_a;

static inline amx_src a_src(const amx_a *A, int row0, int s) {
    amx_src r;
    if (row0 >= A->m16) {
        r.p = A->mtail + (ptrdiff_t)s * 16;
        r.stride = A->ld_mt * 4;
    } else if (s < A->ks) {
        r.p = A->a + (ptrdiff_t)row0 * A->lda + (ptrdiff_t)s * 16;
        r.stride = A->lda * 4;
    } else {
        r.p = A->atail + (ptrdiff_t)row0 * 16;
        r.stride = 64;
    }
    return r;
}

/* the lines of the next panel's halves that each step of a row chunk prefetches into L2 (weights from memory) */
typedef struct {
    const char *next; /* NULL: none */
    ptrdiff_t half;   /* bytes from a line of the first half to its twin in the second */
    int left, per;
} amx_pf;

static inline void pf_step(amx_pf *pf) {
    for (int j = 0; j < pf->per && pf->left > 0; j++, pf->left--, pf->next += 64) {
        _mm_prefetch(pf->next, _MM_HINT_T1);
        _mm_prefetch(pf->next + pf->half, _MM_HINT_T1);
    }
}

/* rows row0 .. row0+15 (and with two, row0+16 .. row0+31) times one panel's two B halves over all steps; the C
 * tiles to cbuf (tile i at cbuf + 256 i) */
static TARGET_AMX void amx_chunk(const amx_a *A, int row0, int two, int steps, const uint16_t *b0, const uint16_t *b1,
                                 const uint16_t *btail, amx_pf *pf, float *cbuf) {
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int s = 0; s < steps; s++) {
        const uint16_t *p0 = s < A->ks ? b0 + (ptrdiff_t)s * 16 * SDRT_BF16_NR : btail;
        const uint16_t *p1 = s < A->ks ? b1 + (ptrdiff_t)s * 16 * SDRT_BF16_NR : btail + 16 * SDRT_BF16_NR;
        const amx_src s0 = a_src(A, row0, s);
        _tile_loadd(TB0, p0, 64);
        _tile_loadd(TB1, p1, 64);
        _tile_loadd(TA0, s0.p, s0.stride);
        _tile_dpbf16ps(0, TA0, TB0);
        _tile_dpbf16ps(1, TA0, TB1);
        if (two) {
            const amx_src s1 = a_src(A, row0 + 16, s);
            _tile_loadd(TA1, s1.p, s1.stride);
            _tile_dpbf16ps(2, TA1, TB0);
            _tile_dpbf16ps(3, TA1, TB1);
        }
        if (pf->next)
            pf_step(pf);
    }
    _tile_stored(0, cbuf, 64);
    _tile_stored(1, cbuf + 256, 64);
    if (two) {
        _tile_stored(2, cbuf + 512, 64);
        _tile_stored(3, cbuf + 768, 64);
    }
}

TARGET_AMX void sdrt_amx_block_bf16(const sdrt_bf16_kernels *bk, int m, int k2, const uint32_t *a, ptrdiff_t lda,
                                    const uint16_t *b, ptrdiff_t pstride, int panels, const sdrt_block_out *out,
                                    int acc, int last) {
    if (m <= 0 || k2 <= 0)
        return;
    amx_a A = {a, lda, m & ~15, k2 / 16, NULL, NULL, 0};
    const int kt = k2 - 16 * A.ks, mt = m - A.m16;
    const int steps = A.ks + (kt > 0);
    /* the zero-padded tails of A (thread buffer 8): the last pairs of the whole row tiles, the rows of the last
     * partial one */
    A.ld_mt = (ptrdiff_t)steps * 16;
    const size_t n_at = kt ? (size_t)A.m16 * 16 : 0, n_mt = mt ? (size_t)16 * A.ld_mt : 0;
    if (n_at + n_mt) {
        uint32_t *buf = (uint32_t *)sdrt_thread_buffer(8, (n_at + n_mt) * sizeof(uint32_t));
        if (!buf) { /* no memory for the tails: the same product on vdpbf16ps (needs none), never a C left unwritten */
            sdrt_bf16_kernels v = *bk;
            v.block = NULL;
            sdrt_block_bf16(&v, m, k2, a, lda, b, pstride, panels, out, acc, last);
            return;
        }
        A.atail = buf;
        A.mtail = buf + n_at;
        for (int i = 0; i < A.m16 && kt; i++) {
            memcpy(buf + (ptrdiff_t)i * 16, a + (ptrdiff_t)i * lda + 16 * A.ks, (size_t)kt * sizeof(uint32_t));
            memset(buf + (ptrdiff_t)i * 16 + kt, 0, (size_t)(16 - kt) * sizeof(uint32_t));
        }
        uint32_t *mtail = buf + n_at;
        for (int i = 0; i < 16 && mt; i++) {
            uint32_t *d = mtail + (ptrdiff_t)i * A.ld_mt;
            const int have = i < mt ? k2 : 0;
            if (have)
                memcpy(d, a + (ptrdiff_t)(A.m16 + i) * lda, (size_t)k2 * sizeof(uint32_t));
            memset(d + have, 0, (size_t)(A.ld_mt - have) * sizeof(uint32_t));
        }
    }
    SDRT_ALIGN(64) uint16_t btail[2 * 16 * SDRT_BF16_NR]; /* the last pairs of each half, zero-padded */
    SDRT_ALIGN(64) float cbuf[4 * 256];
    SDRT_ALIGN(64) sdrt_amx_config prev;
    sdrt_amx_tiles_begin(&prev);
    const ptrdiff_t half = pstride / 2;
    const int rtiles = (m + 15) / 16, chunks = (rtiles + 1) / 2;
    for (int q = 0; q < panels; q++) {
        const int n0 = q * SDRT_BF16_NR;
        if (n0 >= out->n)
            break;
        const uint16_t *b0 = b + (ptrdiff_t)q * pstride, *b1 = b0 + half;
        if (kt) {
            for (int h = 0; h < 2; h++) {
                uint16_t *d = btail + h * 16 * SDRT_BF16_NR;
                memcpy(d, (h ? b1 : b0) + (ptrdiff_t)A.ks * 16 * SDRT_BF16_NR, (size_t)kt * 64);
                memset(d + kt * SDRT_BF16_NR, 0, (size_t)(16 - kt) * 64);
            }
            AMX_BARRIER();
        }
        /* the next panel's pair rows (a line each, per half), spread over this panel's steps */
        amx_pf pf = {NULL, half * (ptrdiff_t)sizeof(uint16_t), 0, 0};
        if (out->prefetch_b && q + 1 < panels) {
            pf.next = (const char *)(b + (ptrdiff_t)(q + 1) * pstride);
            pf.left = k2;
            pf.per = (k2 + chunks * steps - 1) / (chunks * steps);
        }
        sdrt_tile_out o = sdrt_tile_out_cols(out, n0, SDRT_BF16_NR, acc, last);
        for (int t = 0; t < rtiles; t += 2) {
            const int two = t + 1 < rtiles;
            amx_chunk(&A, 16 * t, two, steps, b0, b1, btail, &pf, cbuf);
            for (int u = 0; u <= two; u++) {
                const int r0 = 16 * (t + u), r1 = r0 + 16 < m ? r0 + 16 : m;
                sdrt_tile_out_rows(&o, out, n0, r0, r1);
                sdrt_store512_16(cbuf + 512 * u, cbuf + 512 * u + 256, &o);
            }
        }
    }
    sdrt_amx_tiles_end(&prev);
}
#else
SDRT_EXPORT int sdrt_amx_available(void) { return 0; }
#endif

int sdrt_amx_enabled(void) {
    if (amx_on < 0) {
        const char *env = getenv("SDRT_GGML_AMX");
        const int off = env && (!strcmp(env, "0") || !strcmp(env, "off") || !strcmp(env, "false") || !strcmp(env, "no"));
        amx_on = !off && sdrt_amx_available();
    }
    return amx_on;
}

/* Use AMX tiles for the bf16 products (1) or not (0: the vdpbf16ps kernels); -1 reads SDRT_GGML_AMX again.
 * Returns whether they are used now (0 where the CPU, the OS or this build has none). */
SDRT_EXPORT int sdrt_amx_set(int on) {
    amx_on = on < 0 ? -1 : on && sdrt_amx_available();
    return sdrt_amx_enabled();
}
