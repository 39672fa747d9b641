/* A C-only check of the conv kernels (conv.c, dwconv.c, and the padded group-norm output of ops.c)
 * against double-precision references, for builds that Python cannot load here: the AArch64 NEON
 * kernels under qemu-user (check_arm64.sh), and AVX-512 on a machine that has it. The ops read
 * ggml tensors through the offsets given to sdrt_set_tensor_layout, so this passes a stand-in
 * structure with the same fields (as ops_check.c does).
 *
 * Both routes of the implicit-GEMM conv (columns packed inside the op; B read from an input
 * padded by sdrt_pad_op) and the Winograd F(2x2, 3x3) conv, with the whole epilogue (bias, a runtime
 * per-channel bias, a residual, each activation), the depthwise conv (strides 1 and 2, dilations, 3x3 and other kernels), on
 * odd shapes, with 1 to 4 threads (called one after another, as ggml's threads may run), for
 * every ISA this build and CPU have. Exit status 1 on any mismatch. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_tensor.h"

int sdrt_gemm_set_isa(int isa);
int sdrt_gemm_isa_nr(int isa);
const char *sdrt_gemm_isa_name(int isa);
int sdrt_ops_set_isa(int isa);
void sdrt_conv_op(void *dst, int ith, int nth, void *userdata);
void sdrt_pad_op(void *dst, int ith, int nth, void *userdata);
void sdrt_dwconv_op(void *dst, int ith, int nth, void *userdata);
void sdrt_winograd_op(void *dst, int ith, int nth, void *userdata);

static float rnd(void) { return 2.0f * ((float)rand() / (float)RAND_MAX - 0.5f); }

static void run(void (*op)(void *, int, int, void *), tensor *dst, int nth) {
    for (int ith = 0; ith < nth; ith++)
        op(dst, ith, nth, NULL);
}

/* the activations as these checks set them up: lo = -0.5, hi = 0.7 (clip to [-0.5, 0.7]; SiLU
 * v sigmoid(-0.5 v)) */
static double act(int a, double v) { return ref_act(a, v, -0.5, 0.7); }

static int32_t fbits(float f) {
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}

/* the conv op (group 1) against a direct double sum; direct: the padded route */
static int check_conv(int N, int C, int H, int W, int OC, int KH, int KW, int s, int d, int p, int direct, int a,
                      int extras, int nr, int nth) {
    const int OH = (H + 2 * p - d * (KH - 1) - 1) / s + 1, OW = (W + 2 * p - d * (KW - 1) - 1) / s + 1;
    const int K = C * KH * KW, ldw = K + 3; /* a padded row stride, as Python may give */
    float *x = malloc(sizeof(float) * N * C * H * W), *w = malloc(sizeof(float) * OC * ldw);
    float *b = malloc(sizeof(float) * OC), *rb = malloc(sizeof(float) * OC * N);
    float *res = malloc(sizeof(float) * N * OC * OH * OW), *y = malloc(sizeof(float) * N * OC * OH * OW);
    for (int i = 0; i < N * C * H * W; i++) x[i] = rnd();
    for (int i = 0; i < OC * ldw; i++) w[i] = rnd() * 0.3f;
    for (int i = 0; i < OC; i++) b[i] = rnd();
    for (int i = 0; i < OC * N; i++) rb[i] = rnd();
    for (int i = 0; i < N * OC * OH * OW; i++) res[i] = rnd();
    /* direct: pad to rows a whole number of slices wide (plus the kernel's reach), as Python does */
    const int Wp = direct ? ((OW + nr - 1) / nr * nr + (KW - 1) * d > W + 2 * p ? (OW + nr - 1) / nr * nr + (KW - 1) * d
                                                                                 : W + 2 * p)
                          : W,
              Hp = direct ? H + 2 * p : H;
    float *xp = direct ? malloc(sizeof(float) * N * C * Hp * Wp) : NULL;
    int32_t tl[2] = {p, p}, st[4] = {0, 0, 0, 0};
    int32_t pr[12] = {KH, KW, s, s, d, d, p, p, direct, a, fbits(-0.5f), fbits(0.7f)};
    tensor tx = dense(x, W, H, C, N), tw = dense(w, ldw, OC, 1, 1), tp = dense(pr, 12, 1, 1, 1);
    tensor ts = dense(st, 4, 1, 1, 1), tb = dense(b, OC, 1, 1, 1), trb = dense(rb, OC, N, 1, 1);
    tensor tres = dense(res, OW, OH, OC, N), ty = dense(y, OW, OH, OC, N), ttl = dense(tl, 2, 1, 1, 1);
    tensor txp = dense(xp, Wp, Hp, C, N);
    if (direct) {
        txp.src[0] = &tx, txp.src[1] = &ttl;
        run(sdrt_pad_op, &txp, nth);
    }
    ty.src[0] = direct ? &txp : &tx, ty.src[1] = &tw, ty.src[2] = &tp, ty.src[3] = &ts;
    ty.src[4] = (extras & 1) ? &tb : NULL, ty.src[5] = (extras & 2) ? &trb : NULL, ty.src[6] = (extras & 4) ? &tres : NULL;
    run(sdrt_conv_op, &ty, nth);
    double maxerr = 0;
    for (int n = 0; n < N; n++)
        for (int oc = 0; oc < OC; oc++)
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    double r = 0;
                    for (int c = 0; c < C; c++)
                        for (int i = 0; i < KH; i++)
                            for (int j = 0; j < KW; j++) {
                                int iy = oy * s + i * d - p, ix = ox * s + j * d - p;
                                if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                                    r += (double)w[oc * ldw + (c * KH + i) * KW + j] * x[((n * C + c) * H + iy) * W + ix];
                            }
                    const size_t at = ((size_t)(n * OC + oc) * OH + oy) * OW + ox;
                    if (extras & 1) r += b[oc];
                    if (extras & 2) r += rb[n * OC + oc];
                    if (extras & 4) r += res[at];
                    const double e = fabs(act(a, r) - y[at]);
                    maxerr = e > maxerr ? e : maxerr;
                }
    free(x), free(w), free(b), free(rb), free(res), free(y), free(xp);
    if (maxerr > 1e-4) {
        printf("FAIL conv N=%d C=%d %dx%d OC=%d k=%dx%d s=%d d=%d p=%d direct=%d act=%d extras=%d threads=%d: "
               "max error %g\n", N, C, H, W, OC, KH, KW, s, d, p, direct, a, extras, nth, maxerr);
        return 1;
    }
    return 0;
}

/* the Winograd F(2x2, 3x3) conv op (3x3, stride 1, pad p) against a direct double sum, with the epilogue */
static int check_winograd(int N, int C, int H, int W, int OC, int p, int a, int nth) {
    static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    const int OH = H + 2 * p - 2, OW = W + 2 * p - 2, TH = (OH + 1) / 2, TW = (OW + 1) / 2;
    const int Hp = H + 2 * p > 2 * TH + 2 ? H + 2 * p : 2 * TH + 2, Wp = W + 2 * p > 2 * TW + 2 ? W + 2 * p : 2 * TW + 2;
    const int ldu = C + 1;
    float *x = malloc(sizeof(float) * N * C * H * W), *w = malloc(sizeof(float) * OC * C * 9);
    float *u = calloc((size_t)16 * OC * ldu, sizeof(float)), *xp = malloc(sizeof(float) * N * C * Hp * Wp);
    float *b = malloc(sizeof(float) * OC), *rb = malloc(sizeof(float) * OC * N);
    float *res = malloc(sizeof(float) * N * OC * OH * OW), *y = malloc(sizeof(float) * N * OC * OH * OW);
    for (int i = 0; i < N * C * H * W; i++) x[i] = rnd();
    for (int i = 0; i < OC * C * 9; i++) w[i] = rnd() * 0.3f;
    for (int i = 0; i < OC; i++) b[i] = rnd();
    for (int i = 0; i < OC * N; i++) rb[i] = rnd();
    for (int i = 0; i < N * OC * OH * OW; i++) res[i] = rnd();
    for (int oc = 0; oc < OC; oc++) /* U = G g G^T */
        for (int c = 0; c < C; c++)
            for (int i = 0; i < 4; i++)
                for (int l = 0; l < 4; l++) {
                    double acc = 0;
                    for (int j = 0; j < 3; j++)
                        for (int k = 0; k < 3; k++) acc += G[i][j] * w[((oc * C + c) * 3 + j) * 3 + k] * G[l][k];
                    u[((size_t)(i * 4 + l) * OC + oc) * ldu + c] = (float)acc;
                }
    int32_t tl[2] = {p, p}, st[4] = {0, 0, 0, 0}, pr[5] = {p, p, a, fbits(-0.5f), fbits(0.7f)};
    tensor tx = dense(x, W, H, C, N), txp = dense(xp, Wp, Hp, C, N), ttl = dense(tl, 2, 1, 1, 1);
    tensor tu = dense(u, ldu, OC, 16, 1), tp = dense(pr, 5, 1, 1, 1), ts = dense(st, 4, 1, 1, 1);
    tensor tb = dense(b, OC, 1, 1, 1), trb = dense(rb, OC, N, 1, 1), tres = dense(res, OW, OH, OC, N);
    tensor ty = dense(y, OW, OH, OC, N);
    txp.src[0] = &tx, txp.src[1] = &ttl;
    run(sdrt_pad_op, &txp, nth);
    ty.src[0] = &txp, ty.src[1] = &tu, ty.src[2] = &tp, ty.src[3] = &ts, ty.src[4] = &tb, ty.src[5] = &trb;
    ty.src[6] = &tres;
    run(sdrt_winograd_op, &ty, nth);
    double maxerr = 0;
    for (int n = 0; n < N; n++)
        for (int oc = 0; oc < OC; oc++)
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    const size_t at = ((size_t)(n * OC + oc) * OH + oy) * OW + ox;
                    double r = b[oc] + rb[n * OC + oc] + res[at];
                    for (int c = 0; c < C; c++)
                        for (int i = 0; i < 3; i++)
                            for (int j = 0; j < 3; j++) {
                                int iy = oy + i - p, ix = ox + j - p;
                                if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                                    r += (double)w[((oc * C + c) * 3 + i) * 3 + j] * x[((n * C + c) * H + iy) * W + ix];
                            }
                    const double e = fabs(act(a, r) - y[at]);
                    maxerr = e > maxerr ? e : maxerr;
                }
    free(x), free(w), free(u), free(xp), free(b), free(rb), free(res), free(y);
    if (maxerr > 1e-4) {
        printf("FAIL winograd N=%d C=%d %dx%d OC=%d p=%d act=%d threads=%d: max error %g\n", N, C, H, W, OC, p, a, nth,
               maxerr);
        return 1;
    }
    return 0;
}

/* the depthwise conv op against a direct double sum */
static int check_dw(int N, int C, int H, int W, int KH, int KW, int sh, int sw, int d, int p, int a, int nth) {
    const int OH = (H + 2 * p - d * (KH - 1) - 1) / sh + 1, OW = (W + 2 * p - d * (KW - 1) - 1) / sw + 1;
    float *x = malloc(sizeof(float) * N * C * H * W), *w = malloc(sizeof(float) * C * KH * KW);
    float *b = malloc(sizeof(float) * C), *y = malloc(sizeof(float) * N * C * OH * OW);
    for (int i = 0; i < N * C * H * W; i++) x[i] = rnd();
    for (int i = 0; i < C * KH * KW; i++) w[i] = rnd();
    for (int i = 0; i < C; i++) b[i] = rnd();
    int32_t pr[11] = {KH, KW, sh, sw, d, d, p, p, a, fbits(-0.5f), fbits(0.7f)};
    tensor tx = dense(x, W, H, C, N), tw = dense(w, KH * KW, C, 1, 1), tp = dense(pr, 11, 1, 1, 1);
    tensor tb = dense(b, C, 1, 1, 1), ty = dense(y, OW, OH, C, N);
    ty.src[0] = &tx, ty.src[1] = &tw, ty.src[2] = &tp, ty.src[3] = &tb;
    run(sdrt_dwconv_op, &ty, nth);
    double maxerr = 0;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    double r = b[c];
                    for (int i = 0; i < KH; i++)
                        for (int j = 0; j < KW; j++) {
                            int iy = oy * sh + i * d - p, ix = ox * sw + j * d - p;
                            if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                                r += (double)w[(c * KH + i) * KW + j] * x[((n * C + c) * H + iy) * W + ix];
                        }
                    const double e = fabs(act(a, r) - y[((size_t)(n * C + c) * OH + oy) * OW + ox]);
                    maxerr = e > maxerr ? e : maxerr;
                }
    free(x), free(w), free(b), free(y);
    if (maxerr > 1e-5) {
        printf("FAIL dwconv N=%d C=%d %dx%d k=%dx%d s=%d,%d d=%d p=%d act=%d threads=%d: max error %g\n", N, C, H, W,
               KH, KW, sh, sw, d, p, a, nth, maxerr);
        return 1;
    }
    return 0;
}

int main(void) {
    if (use_stand_in())
        return 1;
    /* N, C, H, W, OC, KH, KW, stride, dilation, pad */
    static const int convs[][10] = {{1, 3, 9, 70, 5, 3, 3, 1, 1, 1},  {2, 48, 6, 33, 17, 3, 3, 1, 1, 1},
                                    {1, 5, 7, 40, 4, 5, 1, 1, 1, 2},  {1, 6, 15, 37, 7, 3, 3, 1, 2, 2},
                                    {1, 8, 20, 40, 29, 3, 3, 2, 1, 1}, {1, 16, 4, 32, 9, 1, 1, 1, 1, 0},
                                    {2, 1, 1, 1, 1, 1, 1, 1, 1, 0},   {1, 130, 5, 19, 3, 3, 3, 1, 1, 1},
                                    {2, 37, 1, 1, 70, 1, 1, 1, 1, 0}, {1, 200, 1, 1, 9, 1, 1, 2, 1, 0},
                                    /* strided rows of 32 pixels and more (each K row one run) */
                                    {1, 4, 9, 75, 6, 3, 3, 2, 1, 1},  {1, 3, 7, 110, 5, 3, 3, 3, 1, 1}};
    /* N, C, H, W, KH, KW, sh, sw, dilation, pad */
    static const int dws[][10] = {{1, 5, 9, 70, 3, 3, 1, 1, 1, 1}, {2, 3, 7, 7, 3, 3, 1, 1, 1, 1},
                                  {1, 4, 14, 14, 5, 5, 1, 1, 1, 2}, {1, 3, 13, 29, 3, 3, 2, 2, 1, 1},
                                  {1, 2, 11, 12, 3, 3, 2, 1, 1, 1}, {1, 3, 9, 17, 3, 3, 1, 1, 2, 2},
                                  {1, 2, 1, 1, 3, 3, 1, 1, 1, 1},   {1, 2, 10, 33, 1, 7, 1, 2, 1, 3},
                                  {1, 3, 13, 12, 3, 3, 1, 1, 1, 1}, {1, 2, 17, 23, 5, 5, 2, 2, 1, 2},
                                  {2, 2, 16, 19, 3, 3, 3, 3, 1, 1}, {1, 2, 15, 14, 3, 5, 2, 2, 2, 4},
                                  {1, 3, 14, 14, 3, 3, 1, 1, 1, 1}}; /* rows of 16 padded: dw_3x3's narrowest */
    int fails = 0, runs = 0;
    for (int isa = 0; isa < 4; isa++) {
        if (sdrt_gemm_set_isa(isa) < 0)
            continue;
        const int nr = sdrt_gemm_isa_nr(isa);
        for (int nth = 1; nth <= 4; nth++)
            for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++)
                for (int direct = 0; direct < 2; direct++) {
                    const int *c = convs[i];
                    if (direct && c[7] != 1)
                        continue;
                    for (int a = 0; a < 5; a++, runs++)
                        fails += check_conv(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], direct, a,
                                            a == 0 ? 1 : a == 1 ? 7 : a == 2 ? 2 : a == 3 ? 5 : 4, nr, nth);
                }
        /* N, C, H, W, OC, pad */
        static const int winos[][6] = {{1, 3, 9, 70, 5, 1}, {2, 40, 7, 9, 35, 1}, {1, 3, 1, 1, 2, 1},
                                       {1, 17, 12, 33, 9, 0}, {1, 400, 4, 4, 8, 1},
                                       {1, 24, 8, 8, 70, 1}}; /* one tile group: split by output channels */
        for (int nth = 1; nth <= 4; nth++)
            for (size_t i = 0; i < sizeof winos / sizeof winos[0]; i++)
                for (int a = 0; a < 5; a++, runs++) {
                    const int *c = winos[i];
                    sdrt_ops_set_isa(isa == 2 ? 2 : isa == 1 ? 1 : isa == 3 ? 3 : 0);
                    fails += check_winograd(c[0], c[1], c[2], c[3], c[4], c[5], a, nth);
                }
        sdrt_ops_set_isa(-1);
        printf("conv %s: checked\n", sdrt_gemm_isa_name(isa));
    }
    static const char *OPS[] = {"portable", "avx2", "avx512", "neon", "scalar"};
    for (int isa = 0; isa < 5; isa++) {
        if (sdrt_ops_set_isa(isa) < 0)
            continue;
        for (int nth = 1; nth <= 4; nth++)
            for (size_t i = 0; i < sizeof dws / sizeof dws[0]; i++)
                for (int a = 0; a < 4; a++, runs++) {
                    const int *c = dws[i];
                    fails += check_dw(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], a, nth);
                }
        printf("dwconv %s: checked\n", OPS[isa]);
    }
    sdrt_gemm_set_isa(-1);
    sdrt_ops_set_isa(-1);
    printf("%d runs, %d failures\n", runs, fails);
    return fails != 0;
}
