/* A C-only check of the attention, GELU, group-norm and layer-norm kernels (ops.c) against double-precision
 * references, for builds that Python cannot load here: the AArch64 NEON bodies, cross-compiled
 * and run under qemu-user (ops_check_arm64.sh). The ops read ggml tensors through the offsets
 * given to sdrt_set_tensor_layout, so this passes a stand-in structure with the same fields.
 * Every body this build and CPU have, odd shapes, a mask, strided K, threads 1 to 4.
 * Exit status 1 on any mismatch. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_tensor.h"
#include "sdrt_ops.h"

int sdrt_ops_set_isa(int isa);
void sdrt_attention_op(void *dst, int ith, int nth, void *userdata);
void sdrt_gelu_erf_op(void *dst, int ith, int nth, void *userdata);
void sdrt_gn_stats_op(void *dst, int ith, int nth, void *userdata);
void sdrt_gn_apply_op(void *dst, int ith, int nth, void *userdata);
void sdrt_layer_norm_op(void *dst, int ith, int nth, void *userdata);
typedef struct {
    int32_t groups, silu, cl;
    float eps;
    int32_t pad, W, top, left;
} gn_params;

static const char *NAMES[] = {"portable", "avx2", "avx512", "neon", "scalar"};

static float rnd(void) { return 2.0f * ((float)rand() / (float)RAND_MAX - 0.5f); }

static void run(void (*op)(void *, int, int, void *), tensor *dst, void *ud, int nth) {
    for (int ith = 0; ith < nth; ith++)
        op(dst, ith, nth, ud);
}

static int check_attention(int H, int nq, int nkv, int D, int Dv, int nth) {
    float *q = malloc(sizeof(float) * H * nq * D), *kt = malloc(sizeof(float) * H * nkv * D);
    float *v = malloc(sizeof(float) * H * nkv * Dv), *m = malloc(sizeof(float) * nq * nkv);
    float *o = malloc(sizeof(float) * H * nq * Dv);
    for (int i = 0; i < H * nq * D; i++) q[i] = rnd();
    for (int i = 0; i < H * nkv * D; i++) kt[i] = rnd();
    for (int i = 0; i < H * nkv * Dv; i++) v[i] = rnd();
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nkv; j++) m[i * nkv + j] = j > i + nkv / 2 ? -INFINITY : 0.1f * rnd();
    tensor tq = dense(q, D, nq, H, 1), tv = dense(v, Dv, nkv, H, 1), tm = dense(m, nkv, nq, 1, 1);
    /* K given as K^T (nkv innermost) and read through a transposed view: ne (D, nkv), nb (4 * nkv, 4) */
    tensor tk = dense(kt, nkv, D, H, 1);
    tk.ne[0] = D, tk.ne[1] = nkv, tk.nb[0] = 4 * (size_t)nkv, tk.nb[1] = 4;
    tensor to = dense(o, Dv, H, nq, 1);
    to.src[0] = &tq, to.src[1] = &tk, to.src[2] = &tv, to.src[3] = &tm;
    const float scale = 1.0f / sqrtf((float)D);
    sdrt_attn_params par = {scale, 0};
    run(sdrt_attention_op, &to, &par, nth);
    double maxerr = 0;
    double *s = malloc(sizeof(double) * nkv);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < nq; i++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < nkv; j++) {
                double acc = 0;
                for (int d = 0; d < D; d++)
                    acc += (double)q[(h * nq + i) * D + d] * kt[(h * D + d) * nkv + j];
                s[j] = acc * scale + m[i * nkv + j];
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int j = 0; j < nkv; j++) sum += (s[j] = exp(s[j] - mx));
            for (int d = 0; d < Dv; d++) {
                double r = 0;
                for (int j = 0; j < nkv; j++) r += s[j] * v[(h * nkv + j) * Dv + d];
                double e = fabs(r / sum - o[(i * H + h) * Dv + d]);
                maxerr = e > maxerr ? e : maxerr;
            }
        }
    free(q), free(kt), free(v), free(m), free(o), free(s);
    if (maxerr > 1e-5) {
        printf("FAIL attention H=%d nq=%d nkv=%d D=%d Dv=%d threads=%d: max error %g\n", H, nq, nkv, D, Dv, nth, maxerr);
        return 1;
    }
    return 0;
}

static int check_gelu(int n, int nth) {
    float *x = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) x[i] = 5 * rnd(), g[i] = rnd();
    tensor tx = dense(x, n, 1, 1, 1), tg = dense(g, n, 1, 1, 1), ty = dense(y, n, 1, 1, 1);
    ty.src[0] = &tx, ty.src[1] = &tg;
    run(sdrt_gelu_erf_op, &ty, NULL, nth);
    double maxerr = 0;
    for (int i = 0; i < n; i++) {
        double r = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0))) * g[i], e = fabs(r - y[i]);
        maxerr = e > maxerr ? e : maxerr;
    }
    free(x), free(g), free(y);
    if (maxerr > 2e-6) {
        printf("FAIL gelu n=%d threads=%d: max error %g\n", n, nth, maxerr);
        return 1;
    }
    return 0;
}

static int check_group_norm(int C, int hw, int G, int silu, int cl, int nth) {
    float *x = malloc(sizeof(float) * C * hw), *gam = malloc(sizeof(float) * C), *bet = malloc(sizeof(float) * C);
    float st[2 * 64], *y = malloc(sizeof(float) * C * hw);
    for (int i = 0; i < C * hw; i++) x[i] = 3 * rnd() + 4;
    for (int c = 0; c < C; c++) gam[c] = rnd(), bet[c] = rnd();
    tensor tx = dense(x, hw, C, 1, 1), ts = dense(st, 2, G, 1, 1), tgm = dense(gam, C, 1, 1, 1);
    tensor tb = dense(bet, C, 1, 1, 1), ty = cl ? dense(y, C, hw, 1, 1) : dense(y, hw, C, 1, 1);
    ts.src[0] = &tx;
    gn_params p = {G, silu, cl, 1e-5f, 0, 0, 0, 0};
    run(sdrt_gn_stats_op, &ts, &p, nth);
    ty.src[0] = &tx, ty.src[1] = &ts, ty.src[2] = &tgm, ty.src[3] = &tb;
    run(sdrt_gn_apply_op, &ty, &p, nth);
    double maxerr = 0;
    const int per = C / G * hw;
    for (int g = 0; g < G; g++) {
        double mean = 0, var = 0;
        for (int i = 0; i < per; i++) mean += x[g * per + i];
        mean /= per;
        for (int i = 0; i < per; i++) var += (x[g * per + i] - mean) * (x[g * per + i] - mean);
        var /= per;
        for (int i = 0; i < per; i++) {
            int c = (g * per + i) / hw, px = (g * per + i) % hw;
            double r = (x[g * per + i] - mean) / sqrt(var + 1e-5) * gam[c] + bet[c];
            if (silu) r = r / (1 + exp(-r));
            /* float32 rounding of x and the mean, scaled by 1/std: large for a tiny group's spread */
            const double tol = 1e-5 + 4 * 6e-8 * (fabs(x[g * per + i]) + fabs(mean)) / sqrt(var + 1e-5) * fabs(gam[c]);
            double e = fabs(r - (cl ? y[px * C + c] : y[c * hw + px])) / tol * 1e-5;
            maxerr = e > maxerr ? e : maxerr;
        }
    }
    free(x), free(gam), free(bet), free(y);
    if (maxerr > 1e-5) {
        printf("FAIL group norm C=%d hw=%d G=%d silu=%d cl=%d threads=%d: max error %g (in units of the tolerance "
               "x 1e-5)\n", C, hw, G, silu, cl, nth, maxerr);
        return 1;
    }
    return 0;
}

/* the layer norm over `rows` rows of n floats, rows ldx floats apart (a strided view), mean far from 0 */
static int check_layer_norm(int rows, int n, int ldx, int nth) {
    float *x = malloc(sizeof(float) * rows * ldx), *g = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * rows * n), eps = 1e-5f;
    for (int i = 0; i < rows * ldx; i++) x[i] = 3 * rnd() + 40;
    for (int j = 0; j < n; j++) g[j] = rnd(), b[j] = rnd();
    tensor tx = dense(x, n, rows, 1, 1), tg = dense(g, n, 1, 1, 1), tb = dense(b, n, 1, 1, 1);
    tensor ty = dense(y, n, rows, 1, 1);
    tx.nb[1] = sizeof(float) * (size_t)ldx, tx.nb[2] = tx.nb[3] = tx.nb[1] * (size_t)rows;
    ty.src[0] = &tx, ty.src[1] = &tg, ty.src[2] = &tb;
    run(sdrt_layer_norm_op, &ty, &eps, nth);
    double maxerr = 0;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ldx;
        double mean = 0, var = 0;
        for (int j = 0; j < n; j++) mean += xr[j];
        mean /= n;
        for (int j = 0; j < n; j++) var += (xr[j] - mean) * (xr[j] - mean);
        var /= n;
        for (int j = 0; j < n; j++) {
            const double want = (xr[j] - mean) / sqrt(var + eps) * g[j] + b[j];
            /* float32 rounding of x and the mean, scaled by 1/std */
            const double tol = 1e-5 + 4 * 6e-8 * (fabs(xr[j]) + fabs(mean)) / sqrt(var + eps) * fabs(g[j]);
            const double e = fabs(want - y[(size_t)r * n + j]) / tol * 1e-5;
            maxerr = e > maxerr || e != e ? e : maxerr;
        }
    }
    free(x), free(g), free(b), free(y);
    if (!(maxerr <= 1e-5)) {
        printf("FAIL layer norm rows=%d n=%d ldx=%d threads=%d: max error %g (in units of the tolerance x 1e-5)\n", rows,
               n, ldx, nth, maxerr);
        return 1;
    }
    return 0;
}

/* the group norm written zero-padded (a direct conv's input): W-wide rows at (top, left) of Wp x Hp */
static int check_group_norm_padded(int C, int H, int W, int G, int top, int left, int Wp, int Hp, int nth) {
    float *x = malloc(sizeof(float) * C * H * W), st[2 * 64], *y = malloc(sizeof(float) * C * Hp * Wp);
    for (int i = 0; i < C * H * W; i++) x[i] = 3 * rnd() + 4;
    for (int i = 0; i < C * Hp * Wp; i++) y[i] = NAN; /* every float must be written */
    tensor tx = dense(x, H * W, C, 1, 1), ts = dense(st, 2, G, 1, 1), ty = dense(y, Wp, Hp, C, 1);
    ts.src[0] = &tx;
    gn_params p = {G, 1, 0, 1e-5f, 1, W, top, left};
    run(sdrt_gn_stats_op, &ts, &p, nth);
    ty.src[0] = &tx, ty.src[1] = &ts;
    run(sdrt_gn_apply_op, &ty, &p, nth);
    double maxerr = 0;
    const int per = C / G * H * W;
    for (int c = 0; c < C; c++) {
        const int g = c / (C / G);
        double mean = 0, var = 0;
        for (int i = 0; i < per; i++) mean += x[g * per + i];
        mean /= per;
        for (int i = 0; i < per; i++) var += (x[g * per + i] - mean) * (x[g * per + i] - mean);
        var /= per;
        for (int yy = 0; yy < Hp; yy++)
            for (int xx = 0; xx < Wp; xx++) {
                const int iy = yy - top, ix = xx - left;
                double r = 0;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) {
                    r = (x[(c * H + iy) * W + ix] - mean) / sqrt(var + 1e-5);
                    r = r / (1 + exp(-r));
                }
                const double e = fabs(r - y[((size_t)c * Hp + yy) * Wp + xx]);
                maxerr = e > maxerr || e != e ? e : maxerr;
            }
    }
    free(x), free(y);
    if (!(maxerr <= 1e-5)) {
        printf("FAIL padded group norm C=%d %dx%d G=%d at (%d,%d) of %dx%d threads=%d: max error %g\n", C, H, W, G, top,
               left, Hp, Wp, nth, maxerr);
        return 1;
    }
    return 0;
}

int main(void) {
    if (use_stand_in())
        return 1;
    static const int att[][5] = {{1, 1, 1, 1, 1}, {2, 3, 5, 7, 3}, {3, 13, 33, 8, 8}, {2, 67, 77, 40, 40},
                                 {1, 130, 64, 80, 64}, {2, 37, 613, 8, 8}, {1, 21, 300, 64, 24}};
    int fails = 0, runs = 0;
    for (int isa = 0; isa < 5; isa++) {
        if (sdrt_ops_set_isa(isa) < 0)
            continue;
        for (int nth = 1; nth <= 4; nth++) {
            for (size_t s = 0; s < sizeof att / sizeof att[0]; s++, runs++)
                fails += check_attention(att[s][0], att[s][1], att[s][2], att[s][3], att[s][4], nth);
            for (int n = 1; n < 1100; n = n * 3 + 1, runs++)
                fails += check_gelu(n, nth);
            for (int silu = 0; silu < 2; silu++)
                for (int cl = 0; cl < 2; cl++, runs += 2) {
                    fails += check_group_norm(32, 37, 8, silu, cl, nth);
                    fails += check_group_norm(6, 1, 3, silu, cl, nth);
                }
            fails += check_group_norm_padded(8, 5, 7, 4, 1, 1, 16, 7, nth);
            fails += check_group_norm_padded(6, 1, 1, 3, 2, 3, 9, 5, nth);
            fails += check_group_norm_padded(4, 9, 33, 2, 0, 0, 48, 9, nth);
            runs += 3;
            fails += check_layer_norm(7, 37, 37, nth);
            fails += check_layer_norm(77, 768, 768, nth);
            fails += check_layer_norm(3, 1, 5, nth);
            fails += check_layer_norm(5, 20, 29, nth);
            runs += 4;
        }
        printf("%s: checked\n", NAMES[isa]);
    }
    printf("%d runs, %d failures\n", runs, fails);
    return fails != 0;
}
