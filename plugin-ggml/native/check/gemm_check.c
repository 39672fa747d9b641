/* A C-only check of the GEMM kernels against a naive double-precision product, for builds that
 * Python cannot load here: the AArch64 NEON kernels, cross-compiled and run under qemu-user
 * (check_arm64.sh). Every ISA this build and CPU have, odd shapes, both output orders, bias,
 * thread shares 1 to 4. Exit status 1 on any mismatch. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

int sdrt_gemm(int isa, int M, int N, int K, const float *a, ptrdiff_t lda, const float *b, ptrdiff_t sbk,
              ptrdiff_t sbn, int b_packed, const float *bias, float *c, ptrdiff_t ldc, int trans, int ith, int nth);
int sdrt_gemm_isa_available(int isa);
int sdrt_gemm_set_isa(int isa);
const char *sdrt_gemm_isa_name(int isa);

static float rnd(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

static int check(int isa, int M, int N, int K) {
    const int P = (N + 31) / 32;
    float *a = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
    float *bp = calloc((size_t)P * 32 * K, sizeof(float)), *bias = malloc(sizeof(float) * N);
    float *c = malloc(sizeof(float) * M * N);
    int fails = 0;
    for (int i = 0; i < M * K; i++)
        a[i] = rnd();
    for (int i = 0; i < N * K; i++)
        w[i] = rnd();
    for (int j = 0; j < N; j++)
        bias[j] = rnd();
    for (int n = 0; n < N; n++) /* B packed: panels of 32 columns, [panel][k][32] */
        for (int k = 0; k < K; k++)
            bp[(size_t)(n / 32) * K * 32 + (size_t)k * 32 + n % 32] = w[n * K + k];
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
    free(a);
    free(w);
    free(bp);
    free(bias);
    free(c);
    return fails;
}

int main(void) {
    static const int shapes[][3] = {{1, 1, 1}, {7, 31, 13}, {14, 32, 16}, {15, 33, 17},
                                    {37, 97, 389}, {6, 160, 1031}, {3, 17, 3072}, {23, 100, 64}, {13, 70, 128},
                                    {8, 45, 129}};
    int fails = 0, runs = 0;
    printf("best ISA here: %s\n", sdrt_gemm_isa_name(sdrt_gemm_set_isa(-1)));
    for (int isa = 0; isa < 4; isa++) {
        if (!sdrt_gemm_isa_available(isa))
            continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            fails += check(isa, shapes[s][0], shapes[s][1], shapes[s][2]);
            runs += 8;
        }
        printf("%s: checked\n", sdrt_gemm_isa_name(isa));
    }
    printf("%d runs, %d failures\n", runs, fails);
    return fails != 0;
}
