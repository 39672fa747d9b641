/* A C-only check of the GEMM kernels against a naive double-precision product, for builds that
 * Python cannot load here: the AArch64 NEON kernels, cross-compiled and run under qemu-user
 * (run.sh arm64), and AVX-512 on a machine that has it. Every ISA this build and CPU have, odd
 * shapes, both output orders, bias, thread shares 1 to 4; and the GEMM op's epilogue (column
 * bias, a residual, each activation) through a stand-in for ggml's tensor structure, as
 * conv_check.c does; the bf16 products (AMX tiles and vdpbf16ps, where the CPU has them) against the product of
 * the bf16-rounded operands. Exit status 1 on any mismatch. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_tensor.h"

void sdrt_gemm_op(void *dst, int ith, int nth, void *userdata);

int sdrt_gemm(int isa, int M, int N, int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t sbk,
              ptrdiff_t sbn, int b_packed, const float *bias, float *c, ptrdiff_t ldc, int trans, int ith, int nth);
int sdrt_gemm_isa_available(int isa);
int sdrt_gemm_set_isa(int isa);
const char *sdrt_gemm_isa_name(int isa);
const char *sdrt_bf16_kernel_name(void);
int sdrt_amx_set(int on);

static float rnd(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

/* random A (M x K), W (N x K: B's columns as rows) and bias (N), and B packed from W in panels of
 * 32 columns, [panel][half][k][16] */
typedef struct {
    float *a, *w, *bp, *bias;
} operands;

static operands operands_of(int M, int N, int K) {
    const int P = (N + 31) / 32;
    operands o = {malloc(sizeof(float) * M * K), malloc(sizeof(float) * N * K),
                  calloc((size_t)P * 32 * K, sizeof(float)), malloc(sizeof(float) * N)};
    for (int i = 0; i < M * K; i++)
        o.a[i] = rnd();
    for (int i = 0; i < N * K; i++)
        o.w[i] = rnd();
    for (int j = 0; j < N; j++)
        o.bias[j] = rnd();
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            o.bp[(size_t)(n / 32) * K * 32 + (size_t)(n % 32 / 16) * K * 16 + (size_t)k * 16 + n % 16] = o.w[n * K + k];
    return o;
}

static void operands_free(operands *o) {
    free(o->a);
    free(o->w);
    free(o->bp);
    free(o->bias);
}

static int check(int isa, int M, int N, int K) {
    operands op = operands_of(M, N, K);
    const float *a = op.a, *w = op.w, *bp = op.bp, *bias = op.bias;
    float *c = malloc(sizeof(float) * M * N);
    int fails = 0;
    for (int trans = 0; trans < 2; trans++) {
        for (int nth = 1; nth <= 4; nth++) {
            for (int ith = 0; ith < nth; ith++)
                sdrt_gemm(isa, M, N, K, a, K, bp, 32, 1, 1, bias, c, trans ? M : N, trans, ith, nth);
            double maxerr = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double r = bias[j];
                    for (int k = 0; k < K; k++)
                        r += (double)a[i * K + k] * w[j * K + k];
                    const double got = trans ? c[j * M + i] : c[i * N + j];
                    if (fabs(got - r) > maxerr)
                        maxerr = fabs(got - r);
                }
            if (maxerr > 1e-3) {
                fails++;
                printf("FAIL %s M=%d N=%d K=%d trans=%d threads=%d: max error %g\n", sdrt_gemm_isa_name(isa), M, N,
                       K, trans, nth, maxerr);
            }
        }
    }
    operands_free(&op);
    free(c);
    return fails;
}

/* an epilogue's operands: a random residual R and the output C (M x N each), activation a_id as the op's int32
 * [act, lo, hi] */
typedef struct {
    float *r, *c;
    float lo, hi;
    int32_t acts[3];
} epilogue_case;

static epilogue_case epilogue_of(int M, int N, int a_id) {
    epilogue_case e = {malloc(sizeof(float) * M * N), malloc(sizeof(float) * M * N), a_id == 2 ? -0.5f : 1.702f, 0.7f,
                       {a_id, 0, 0}};
    memcpy(e.acts + 1, &e.lo, sizeof e.lo);
    memcpy(e.acts + 2, &e.hi, sizeof e.hi);
    for (int i = 0; i < M * N; i++)
        e.r[i] = rnd();
    return e;
}

/* C = act(A . B + bias + R) through sdrt_gemm_op (packed B, shared counter), both output orders */
static int check_epilogue(int isa, int M, int N, int K, int a_id) {
    const int P = (N + 31) / 32;
    operands op = operands_of(M, N, K);
    const float *a = op.a, *w = op.w, *bias = op.bias;
    epilogue_case e = epilogue_of(M, N, a_id);
    float *r = e.r, *c = e.c;
    const float lo = e.lo, hi = e.hi;
    int32_t *acts = e.acts, state[4] = {0, 0, 0, 0};
    int fails = 0;
    sdrt_gemm_set_isa(isa);
    for (int trans = 0; trans < 2; trans++)
        for (int nth = 1; nth <= 4; nth++) {
            tensor ta = dense(op.a, K, M, 1, 1), tb = dense(op.bp, 32, K, P, 1), tbias = dense(op.bias, N, 1, 1, 1);
            tensor tr = trans ? dense(r, M, N, 1, 1) : dense(r, N, M, 1, 1), tact = dense(acts, 3, 1, 1, 1);
            tensor ts = dense(state, 4, 1, 1, 1), tc = trans ? dense(c, M, N, 1, 1) : dense(c, N, M, 1, 1);
            tc.src[0] = &ta, tc.src[1] = &tb, tc.src[2] = &tbias, tc.src[3] = &tr, tc.src[4] = &tact, tc.src[5] = &ts;
            const unsigned flags = 2u | 4u | 8u | 16u | 32u | (trans ? 1u : 0u);
            for (int ith = 0; ith < nth; ith++)
                sdrt_gemm_op(&tc, ith, nth, (void *)(uintptr_t)flags);
            double maxerr = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double v = bias[j] + (trans ? r[j * M + i] : r[i * N + j]);
                    for (int k = 0; k < K; k++)
                        v += (double)a[i * K + k] * w[j * K + k];
                    const double got = trans ? c[j * M + i] : c[i * N + j];
                    if (fabs(got - ref_act(a_id, v, lo, hi)) > maxerr)
                        maxerr = fabs(got - ref_act(a_id, v, lo, hi));
                }
            if (maxerr > 1e-3) {
                fails++;
                printf("FAIL %s epilogue act=%d M=%d N=%d K=%d trans=%d threads=%d: max error %g\n",
                       sdrt_gemm_isa_name(isa), a_id, M, N, K, trans, nth, maxerr);
            }
        }
    sdrt_gemm_set_isa(-1);
    operands_free(&op);
    free(r);
    free(c);
    return fails;
}

/* float -> bf16 bits, round to nearest even (finite values) */
static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static double bf16_f(float f) {
    const uint32_t u = (uint32_t)bf16(f) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

/* C = act(A . B + bias + R) at bf16 through sdrt_gemm_op (bf16 panels [p][half][K2][16][2]), both output orders,
 * 1 and 3 threads, against the double product of the rounded operands: the float32 sums' error only */
static int check_bf16(int M, int N, int K, int a_id) {
    const int P = (N + 31) / 32, K2 = (K + 1) / 2;
    operands op = operands_of(M, N, K);
    uint16_t *bp = calloc((size_t)P * 2 * K2 * 32, sizeof(uint16_t));
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            bp[(((size_t)(n / 32) * 2 + n % 32 / 16) * K2 + k / 2) * 32 + (n % 16) * 2 + k % 2] = bf16(op.w[n * K + k]);
    epilogue_case e = epilogue_of(M, N, a_id);
    float *r = e.r, *c = e.c;
    const float lo = e.lo, hi = e.hi;
    int32_t *acts = e.acts, state[4] = {0, 0, 0, 0};
    int fails = 0;
    for (int trans = 0; trans < 2; trans++)
        for (int nth = 1; nth <= 3; nth += 2) {
            tensor ta = dense(op.a, K, M, 1, 1), tb = dense(bp, 32, K2, 2 * P, 1), tbias = dense(op.bias, N, 1, 1, 1);
            tensor tr = trans ? dense(r, M, N, 1, 1) : dense(r, N, M, 1, 1), tact = dense(acts, 3, 1, 1, 1);
            tensor ts = dense(state, 4, 1, 1, 1), tc = trans ? dense(c, M, N, 1, 1) : dense(c, N, M, 1, 1);
            tc.src[0] = &ta, tc.src[1] = &tb, tc.src[2] = &tbias, tc.src[3] = &tr, tc.src[4] = &tact, tc.src[5] = &ts;
            const unsigned flags = 2u | 4u | 8u | 16u | 32u | 64u | (trans ? 1u : 0u);
            for (int ith = 0; ith < nth; ith++)
                sdrt_gemm_op(&tc, ith, nth, (void *)(uintptr_t)flags);
            double worst = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double v = op.bias[j] + (trans ? r[j * M + i] : r[i * N + j]), mag = fabs(v);
                    for (int k = 0; k < K; k++) {
                        const double p = bf16_f(op.a[i * K + k]) * bf16_f(op.w[j * K + k]);
                        v += p;
                        mag += fabs(p);
                    }
                    const double got = trans ? c[j * M + i] : c[i * N + j];
                    const double err = fabs(got - ref_act(a_id, v, lo, hi)) / (1e-5 * (1.0 + mag));
                    worst = err > worst ? err : worst;
                }
            if (!(worst <= 1.0)) {
                fails++;
                printf("FAIL %s act=%d M=%d N=%d K=%d trans=%d threads=%d: error %g x the bound\n",
                       sdrt_bf16_kernel_name(), a_id, M, N, K, trans, nth, worst);
            }
        }
    operands_free(&op);
    free(bp);
    free(r);
    free(c);
    return fails;
}

int main(void) {
    if (use_stand_in())
        return 1;
    static const int shapes[][3] = {{1, 1, 1}, {7, 31, 13}, {14, 32, 16}, {15, 33, 17},
                                    {37, 97, 389}, {6, 160, 1031}, {3, 17, 3072}, {23, 100, 64}, {13, 70, 128},
                                    {8, 45, 129},
                                    /* 14-row tiles over a copied A block: the strides the AVX-512 kernels have
                                     * built in (K blocks of 256 and, from K = 8192, of 128) */
                                    {28, 40, 2048}, {29, 33, 8192}};
    int fails = 0, runs = 0;
    printf("best ISA here: %s\n", sdrt_gemm_isa_name(sdrt_gemm_set_isa(-1)));
    for (int isa = 0; isa < 4; isa++) {
        if (!sdrt_gemm_isa_available(isa))
            continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            fails += check(isa, shapes[s][0], shapes[s][1], shapes[s][2]);
            runs += 8;
        }
        /* the epilogue: full-width tiles, edge columns, several K blocks (K > 384), small K */
        static const int eshapes[][3] = {{13, 64, 40}, {7, 33, 17}, {20, 96, 800}, {6, 48, 64}, {1, 16, 3}};
        for (size_t s = 0; s < sizeof eshapes / sizeof eshapes[0]; s++)
            for (int a_id = 0; a_id <= 4; a_id++) {
                fails += check_epilogue(isa, eshapes[s][0], eshapes[s][1], eshapes[s][2], a_id);
                runs += 8;
            }
        printf("%s: checked\n", sdrt_gemm_isa_name(isa));
    }
    /* bf16: AMX tiles (rows past a multiple of 16 and 32, pairs past a multiple of 16, odd K, several K blocks),
     * then vdpbf16ps */
    static const int bshapes[][3] = {{1, 1, 1}, {16, 32, 32}, {33, 40, 37}, {47, 70, 67}, {64, 96, 512},
                                     {31, 33, 1031}, {77, 100, 768}, {5, 17, 3}, {130, 64, 600}};
    sdrt_gemm_set_isa(-1);
    for (int amx = 1; amx >= 0; amx--) {
        if (sdrt_amx_set(amx) != amx || !strcmp(sdrt_bf16_kernel_name(), "none"))
            continue;
        for (size_t s = 0; s < sizeof bshapes / sizeof bshapes[0]; s++)
            for (int a_id = 0; a_id <= 4; a_id += (s % 2 ? 4 : 1)) {
                fails += check_bf16(bshapes[s][0], bshapes[s][1], bshapes[s][2], a_id);
                runs += 4;
            }
        printf("bf16 %s: checked\n", sdrt_bf16_kernel_name());
    }
    sdrt_amx_set(-1);
    printf("%d runs, %d failures\n", runs, fails);
    return fails != 0;
}
