/* Checks of the bf16 product on AMX tiles (amx.c) that the GEMM op's checks cannot make: the operands A (rows
 * lda pairs apart, read in place: the conv's W rows), B (bf16 panels) and C ending exactly at a page followed by
 * an inaccessible one (a tile load or store past an operand's end faults), for 1-40 rows, 1-35 pairs (K 1-70),
 * column tails and both output orders, against the double product; and that a call leaves the calling thread's
 * tile configuration as it found it (a library that configures the tiles once a thread, as ggml's AMX kernels
 * do, relies on it), or released where there was none; and that where the OS refuses the tiles (a thread's
 * signal stack too small for their state) the products run on vdpbf16ps, not into SIGILL; and the attention at bf16
 * on the tiles (amx_attention.c) with its operands at such pages too. Linux on x86-64 with AMX only; elsewhere it
 * says so and passes. Exit status 1 on any failure. */
#include "check_tensor.h"
#include "sdrt_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sdrt_amx_set(int on);
void sdrt_attention_op(void *dst, int ith, int nth, void *userdata);

#if defined(SDRT_HAVE_AMX)
#include <immintrin.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "guarded.h"

const char *sdrt_bf16_kernel_name(void);

/* C (m x n, or transposed) = A (m rows of k2 pairs, lda pairs apart) . B (bf16 panels of k2 pair rows) */
static int check_guarded(const sdrt_bf16_kernels *bk, int m, int k2, ptrdiff_t lda, int n, int trans) {
    const int panels = (n + 31) / 32;
    mapping ma, mb, mc;
    uint16_t *a = guarded(((size_t)(m - 1) * lda + k2) * 4, &ma);
    uint16_t *b = guarded((size_t)panels * 2 * k2 * 32 * 2, &mb);
    float *c = guarded((size_t)m * n * 4, &mc);
    for (size_t i = 0; i < ((size_t)(m - 1) * lda + k2) * 2; i++)
        a[i] = (uint16_t)(0x3F00 + rand() % 255); /* 0.5 .. 1 and -0.5 .. -1 */
    for (size_t i = 0; i < (size_t)panels * 2 * k2 * 32; i++)
        b[i] = (uint16_t)(0x3F00 + rand() % 255);
    sdrt_block_out o;
    memset(&o, 0, sizeof o);
    o.c = c;
    o.ldc = trans ? m : n;
    o.trans = trans;
    o.n = n;
    sdrt_block_bf16(bk, m, k2, (const uint32_t *)(const void *)a, lda, b, (ptrdiff_t)2 * k2 * 32, panels, &o, 0, 1);
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            const uint16_t *bh = b + ((ptrdiff_t)(j / 32) * 2 + j % 32 / 16) * k2 * 32 + (j % 16) * 2;
            double v = 0, mag = 0;
            for (int p = 0; p < 2 * k2; p++) {
                const double t = bf(a[(ptrdiff_t)i * lda * 2 + p]) * bf(bh[(p / 2) * 32 + p % 2]);
                v += t;
                mag += fabs(t);
            }
            const double err = fabs((trans ? c[j * m + i] : c[i * n + j]) - v) / (1e-5 * (1 + mag));
            worst = err > worst ? err : worst;
        }
    unmap(&ma);
    unmap(&mb);
    unmap(&mc);
    if (worst <= 1.0)
        return 0;
    printf("FAIL guarded m=%d k2=%d lda=%td n=%d trans=%d: error %g x the bound\n", m, k2, lda, n, trans, worst);
    return 1;
}

/* float -> bf16 -> double, round to nearest even */
static double rbf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1);
    return bf((uint16_t)(u >> 16));
}

/* attention at bf16 on the tiles (amx_attention.c) with Q, K (read through a transposed view where ktrans), V
 * and the output each ending at an inaccessible page, in nth tasks, against the double softmax of the
 * bf16-rounded products, within 2^-8 of sum_j p_j |v_j| (the weights' rounding to bf16, 2^-9 each, and their
 * polynomial's 7.5e-5) plus 1e-6; a NaN in query row 0 makes output row 0 NaN and leaves the others finite */
static int check_attention(int H, int nq, int nkv, int D, int Dv, int nth, int ktrans, int spike) {
    mapping mq, mk, mv, mo;
    float *q = guarded(sizeof(float) * H * nq * D, &mq), *k = guarded(sizeof(float) * H * nkv * D, &mk);
    float *v = guarded(sizeof(float) * H * nkv * Dv, &mv), *o = guarded(sizeof(float) * H * nq * Dv, &mo);
    for (int i = 0; i < H * nq * D; i++)
        q[i] = 6.0f * ((float)rand() / (float)RAND_MAX - 0.5f);
    for (int i = 0; i < H * nkv * D; i++)
        k[i] = 2.0f * ((float)rand() / (float)RAND_MAX - 0.5f);
    for (int i = 0; i < H * nkv * Dv; i++)
        v[i] = 2.0f * ((float)rand() / (float)RAND_MAX - 0.5f) + 0.5f;
    q[0] = NAN;
    if (spike >= 0) /* a key (past the first 512-key block) whose scores are far above the first block's maximum in
                     * about half the rows: there the running maximum moves */
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++)
                k[ktrans ? (h * D + d) * nkv + spike : (h * nkv + spike) * D + d] = 12.0f;
    tensor tq = dense(q, D, nq, H, 1), tv = dense(v, Dv, nkv, H, 1), to = dense(o, Dv, H, nq, 1);
    tensor tk = ktrans ? dense(k, nkv, D, H, 1) : dense(k, D, nkv, H, 1);
    if (ktrans)
        tk.ne[0] = D, tk.ne[1] = nkv, tk.nb[0] = 4 * (size_t)nkv, tk.nb[1] = 4;
    to.src[0] = &tq, to.src[1] = &tk, to.src[2] = &tv;
    sdrt_attn_params par = {1.0f / sqrtf((float)D), 1};
    for (int ith = 0; ith < nth; ith++)
        sdrt_attention_op(&to, ith, nth, &par);
    const float qs = par.scale * 1.4426950408889634f; /* the kernel's scores are in powers of two */
    double worst = 0, *s = malloc(sizeof(double) * nkv);
    int nonfinite = 0;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < nq; i++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < nkv; j++) {
                s[j] = 0;
                for (int d = 0; d < D; d++)
                    s[j] += rbf(q[(h * nq + i) * D + d] * qs) *
                            rbf(ktrans ? k[(h * D + d) * nkv + j] : k[(h * nkv + j) * D + d]);
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int j = 0; j < nkv; j++)
                sum += (s[j] = exp2(s[j] - mx));
            for (int d = 0; d < Dv; d++) {
                double r = 0, bound = 0;
                for (int j = 0; j < nkv; j++) {
                    r += s[j] * rbf(v[(h * nkv + j) * Dv + d]);
                    bound += s[j] * fabs(rbf(v[(h * nkv + j) * Dv + d]));
                }
                bound = 0x1p-8 * bound / sum + 1e-6;
                const float got = o[(i * H + h) * Dv + d];
                if (h == 0 && i == 0)
                    nonfinite += !isnan(got);
                else if (!isfinite(got))
                    nonfinite++;
                else
                    worst = fabs(r / sum - got) / bound > worst ? fabs(r / sum - got) / bound : worst;
            }
        }
    free(s);
    munmap(mq.base, mq.len), munmap(mk.base, mk.len), munmap(mv.base, mv.len), munmap(mo.base, mo.len);
    if (getenv("SDRT_CHECK_SHOW"))
        printf("attention H=%d nq=%d nkv=%d D=%d Dv=%d spike=%d: %.3f x the bound\n", H, nq, nkv, D, Dv, spike, worst);
    if (worst <= 1.0 && !nonfinite)
        return 0;
    printf("FAIL attention bf16 H=%d nq=%d nkv=%d D=%d Dv=%d tasks=%d ktrans=%d spike=%d: error %g x the bound, %d "
           "values NaN where they should not be or not where they should\n", H, nq, nkv, D, Dv, nth, ktrans, spike,
           worst, nonfinite);
    return 1;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* a 17 x 32 product of ones over 20 pairs (40 each): its last element */
static float ones_product(const sdrt_bf16_kernels *bk) {
    SDRT_ALIGN(64) uint32_t a[17 * 20];
    SDRT_ALIGN(64) uint16_t b[2 * 20 * 32];
    float c[17 * 32];
    for (int i = 0; i < 17 * 20; i++)
        a[i] = 0x3F803F80u;
    for (int i = 0; i < 2 * 20 * 32; i++)
        b[i] = 0x3F80;
    sdrt_block_out o;
    memset(&o, 0, sizeof o);
    o.c = c;
    o.ldc = 32;
    o.n = 32;
    sdrt_block_bf16(bk, 17, 20, a, 20, b, 2 * 20 * 32, 1, &o, 0, 1);
    return c[16 * 32 + 31];
}

/* a product with the tiles configured as `before` (palette 0: none); returns the configuration after it */
static __attribute__((target("amx-tile"))) tile_config around_product(const sdrt_bf16_kernels *bk, tile_config before) {
    SDRT_ALIGN(64) tile_config cfg = before, after;
    if (cfg.palette)
        _tile_loadconfig(&cfg);
    else
        _tile_release();
    __asm__ volatile("" ::: "memory");
    const float last = ones_product(bk);
    memset(&after, 0xFF, sizeof after);
    _tile_storeconfig(&after);
    __asm__ volatile("" ::: "memory");
    _tile_release();
    if (last != 40.0f)
        printf("FAIL the product under a caller's tile configuration: %g, not 40\n", last);
    return after;
}

static int check_config_kept(const sdrt_bf16_kernels *bk) {
    int fails = 0;
    tile_config mine, none;
    memset(&mine, 0, sizeof mine);
    memset(&none, 0, sizeof none);
    mine.palette = 1;
    mine.colsb[0] = 32, mine.rows[0] = 8; /* unlike amx.c's (16 rows of 64 bytes each) */
    mine.colsb[3] = 64, mine.rows[3] = 4;
    tile_config got = around_product(bk, mine);
    if (memcmp(&got, &mine, sizeof got)) {
        printf("FAIL a caller's tile configuration (palette 1, tile 0 8 x 32 bytes) not kept: palette %d, tile 0 "
               "%d x %d bytes\n", got.palette, got.rows[0], got.colsb[0]);
        fails++;
    }
    got = around_product(bk, none);
    if (memcmp(&got, &none, sizeof got)) {
        printf("FAIL the tiles not released after a call that found none configured (palette %d)\n", got.palette);
        fails++;
    }
    return fails;
}

/* in a child process that has not asked for the tiles yet: a signal stack of 8 KB (the tile state needs more), so
 * the OS refuses them; the bf16 products must then run on vdpbf16ps */
static int check_refused(void) {
    const pid_t pid = fork();
    if (pid == 0) {
        stack_t st;
        memset(&st, 0, sizeof st);
        st.ss_size = 8192;
        st.ss_sp = malloc(st.ss_size);
        if (sigaltstack(&st, NULL))
            _exit(0); /* an OS that takes no stack this small: nothing to check */
        const sdrt_bf16_kernels *bk = sdrt_kernels_bf16();
        if (!bk && !sdrt_amx_available())
            _exit(0); /* a CPU with no bf16 products at all (AVX2): nothing to check */
        if (sdrt_amx_available() || !bk || bk->block) {
            printf("FAIL tiles refused by the OS, yet the bf16 kernels are %s\n", sdrt_bf16_kernel_name());
            fflush(stdout);
            _exit(1);
        }
        _exit(ones_product(bk) == 40.0f ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        printf("FAIL the bf16 product with the tiles refused: %s %d\n", WIFSIGNALED(status) ? "signal" : "status",
               WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        return 1;
    }
    return 0;
}

int main(void) {
    const int refused = check_refused();
    if (sdrt_amx_set(1) != 1) {
        printf("no AMX-BF16 here (CPU or OS): nothing to check\n");
        return 0;
    }
    const sdrt_bf16_kernels *bk = sdrt_kernels_bf16();
    if (!bk || !bk->block) {
        printf("FAIL AMX available but the bf16 kernels are %s\n", bk ? bk->name : "none");
        return 1;
    }
    static const int ns[] = {1, 17, 32, 33, 64};
    int runs = 0, fails = 0;
    for (int m = 1; m <= 40; m++)
        for (int k2 = 1; k2 <= 35; k2++)
            for (int j = 0; j < 5; j++, runs++)
                fails += check_guarded(bk, m, k2, j % 2 ? k2 : k2 + 3, ns[j], (m + k2 + j) % 2);
    fails += check_config_kept(bk) + refused;
    runs += 3;
    if (use_stand_in())
        return 1;
    static const int att[][6] = {/* H, n_q, n_kv, D, Dv: head-dim tail tiles, keys past 32 and past a 512-key block,
                                  * query rows past a 32-row task; a key whose scores move the running maximum */
                                 {2, 1, 1, 1, 1, -1},      {1, 17, 15, 3, 5, -1},     {2, 33, 33, 40, 40, -1},
                                 {1, 31, 77, 33, 17, -1},  {2, 64, 513, 64, 65, -1},  {1, 47, 1025, 80, 80, -1},
                                 {1, 35, 544, 130, 128, -1}, {2, 64, 513, 64, 65, 512}, {1, 47, 1025, 40, 40, 700}};
    for (int a = 0; a < 9; a++)
        for (int nth = 1; nth <= 3; nth += 2, runs++)
            fails += check_attention(att[a][0], att[a][1], att[a][2], att[a][3], att[a][4], nth, (a + nth) % 2,
                                     att[a][5]);
    sdrt_amx_set(-1);
    printf("amx: %d runs, %d failures\n", runs, fails);
    return fails != 0;
}
#else
int main(void) {
    printf("no AMX in this build (x86-64 Linux with GCC 11 / Clang 12 or later): nothing to check\n");
    return 0;
}
#endif
