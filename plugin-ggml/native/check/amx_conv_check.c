/* Checks of the conv without packing on AMX tiles (amx_conv.c, sdrt_conv_pairs_run) that the Python tests cannot
 * make: the padded pair input xp (with the lowering's slack rows, ceil(16 / Wp), and nothing more), W, the output
 * and the residual each ending exactly at a page followed by an inaccessible one (a tile load or a store past an
 * operand's end faults), over kernels 1x1 .. 3x3, dilations 1 and 2 with pads 0 .. 2, widths 1 .. 19 (one pixel
 * tile holding several output rows, or one row several tiles), output channels 1 .. 40 (the last row tile partial),
 * 16 and 32 pairs (odd channel counts), batch 1 .. 3, bias, runtime row bias, residual and the activations; each
 * against the double conv of the same bf16 operands, with the tiles (one thread and three threads sharing the work
 * counter, the output first filled with NaN: a unit left out shows) and with the tiles off (the scalar loop); and that
 * an input without the slack rows is refused (nothing read past it, the output untouched) rather than overrun.
 * Linux on x86-64 with AMX only; elsewhere it says so and passes. Exit status 1 on any failure. */
#include "sdrt_ops.h"

#include "check_tensor.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sdrt_amx_set(int on);

#if defined(SDRT_HAVE_AMX)
#include "guarded.h"

static uint16_t rnd_bf16(void) { /* +-0.5 .. +-1 */
    return (uint16_t)((rand() & 1 ? 0x8000u : 0u) | (0x3F00u + (unsigned)(rand() % 128)));
}

typedef struct {
    const sdrt_conv_pairs *a;
    const float *bias, *rbias;
    int32_t *state;
    int nth;
} job;

static void *run_job(void *p) {
    const job *j = p;
    sdrt_conv_pairs_run(j->a, j->bias, j->rbias, j->state, j->nth);
    return NULL;
}

static int fails;

static void check(int C, int OC, int H, int W, int KH, int KW, int dh, int dw, int ph, int pw, int N, int flags) {
    const int C2 = (C + 31) / 32 * 16, Wp = W + 2 * pw, Hpad = H + 2 * ph, Hp = Hpad + (16 + Wp - 1) / Wp;
    const int OH = Hpad - (KH - 1) * dh, OW = Wp - (KW - 1) * dw;
    if (OH <= 0 || OW <= 0)
        return;
    const int OC16 = (OC + 15) / 16 * 16, taps = KH * KW;
    const ptrdiff_t ldw = (ptrdiff_t)taps * C2 * 2, x_item = (ptrdiff_t)C2 * Hp * Wp * 2;
    const ptrdiff_t out_item = (ptrdiff_t)OC * OH * OW;
    mapping mx, mw, mo, mr, mb, mrb;
    uint16_t *x = guarded((size_t)N * x_item * 2, &mx);
    uint16_t *w = guarded((size_t)OC16 * ldw * 2, &mw);
    float *out = guarded((size_t)N * out_item * 4, &mo);
    float *res = (flags & 1) ? guarded((size_t)N * out_item * 4, &mr) : NULL;
    float *bias = (flags & 2) ? guarded((size_t)OC * 4, &mb) : NULL;
    float *rbias = (flags & 4) ? guarded((size_t)OC * N * 4, &mrb) : NULL;
    /* xp: zeros in the pads, the slack rows, the channels past C and the pairs past ceil(C / 2) */
    memset(x, 0, (size_t)N * x_item * 2);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int i = 0; i < W; i++)
                    x[n * x_item + ((ptrdiff_t)(c / 2) * Hp * Wp + (ptrdiff_t)(y + ph) * Wp + i + pw) * 2 + c % 2] =
                        rnd_bf16();
    memset(w, 0, (size_t)OC16 * ldw * 2);
    for (int o = 0; o < OC; o++)
        for (int t = 0; t < taps; t++)
            for (int c = 0; c < C; c++)
                w[o * ldw + t * C2 * 2 + c] = rnd_bf16();
    for (ptrdiff_t i = 0; res && i < N * out_item; i++)
        res[i] = (float)(rand() % 200 - 100) / 50.0f;
    for (int i = 0; bias && i < OC; i++)
        bias[i] = (float)(rand() % 200 - 100) / 25.0f;
    for (int i = 0; rbias && i < OC * N; i++)
        rbias[i] = (float)(rand() % 200 - 100) / 25.0f;
    static const sdrt_epilogue eps[] = {{SDRT_ACT_RELU, 0, 0}, {SDRT_ACT_CLIP, -1.0f, 2.0f}, {SDRT_ACT_SILU, 1.0f, 0}};
    const sdrt_epilogue *ep = (flags >> 3) % 4 ? &eps[(flags >> 3) % 4 - 1] : NULL;
    const sdrt_conv_pairs a = {x, x_item, C2, Hp, Wp, w, ldw, N, OC, KH, KW, dh, dw, OH, OW, out, out_item,
                               (const char *)res, out_item * 4, ep};
    for (int mode = 0; mode < 3; mode++) { /* tiles 1 thread, tiles 3 threads, scalar */
        if (mode == 2 && (OC > 20 || N > 2 || C > 40))
            continue; /* the scalar loop: a smaller share of the shapes */
        sdrt_amx_set(mode < 2);
        for (ptrdiff_t i = 0; i < N * out_item; i++)
            out[i] = NAN;
        int32_t state[4] = {0, 0, 0, 0};
        const int nth = mode == 1 ? 3 : 1;
        job j = {&a, bias, rbias, state, nth};
        pthread_t th[3];
        for (int t = 0; t < nth; t++)
            pthread_create(&th[t], NULL, run_job, &j);
        for (int t = 0; t < nth; t++)
            pthread_join(th[t], NULL);
        double worst = 0;
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++)
                for (int oy = 0; oy < OH; oy++)
                    for (int ox = 0; ox < OW; ox++) {
                        double v = 0, mag = 0;
                        for (int t = 0; t < taps; t++)
                            for (int c = 0; c < 2 * C2; c++) {
                                const ptrdiff_t q = (ptrdiff_t)(oy + t / KW * dh) * Wp + ox + t % KW * dw;
                                const double p = bf(w[o * ldw + t * C2 * 2 + c]) *
                                                 bf(x[n * x_item + ((ptrdiff_t)(c / 2) * Hp * Wp + q) * 2 + c % 2]);
                                v += p;
                                mag += fabs(p);
                            }
                        const ptrdiff_t at = n * out_item + ((ptrdiff_t)o * OH + oy) * OW + ox;
                        v += (bias ? bias[o] : 0) + (rbias ? rbias[n * OC + o] : 0) + (res ? res[at] : 0);
                        const double want = ep ? ref_act(ep->act, v, ep->lo, ep->hi) : v, got = out[at];
                        const double err = isnan(got) ? 1e30 : fabs(got - want) / (1e-5 * (1 + mag + fabs(v)));
                        worst = err > worst ? err : worst;
                    }
        if (!(worst <= 1.0)) {
            printf("FAIL C %d OC %d H %d W %d k %dx%d dil %d,%d pad %d,%d N %d flags %d mode %d: worst %.3g\n", C, OC,
                   H, W, KH, KW, dh, dw, ph, pw, N, flags, mode, worst);
            fails++;
        }
    }
    unmap(&mx);
    unmap(&mw);
    unmap(&mo);
    if (res)
        unmap(&mr);
    if (bias)
        unmap(&mb);
    if (rbias)
        unmap(&mrb);
}

/* a plane one slack row short of the last pixel tile's reach (Wp 5: 3 x 3 pads 1 on 3 x 3, no slack rows) */
static void check_refused(void) {
    const int C2 = 16, Wp = 5, Hp = 5, OC = 16, OH = 3, OW = 3;
    mapping mx, mw, mo;
    uint16_t *x = guarded((size_t)C2 * Hp * Wp * 2 * 2, &mx);
    uint16_t *w = guarded((size_t)OC * 9 * C2 * 2 * 2, &mw);
    float *out = guarded((size_t)OC * OH * OW * 4, &mo);
    memset(x, 0, (size_t)C2 * Hp * Wp * 2 * 2);
    memset(w, 0, (size_t)OC * 9 * C2 * 2 * 2);
    for (int i = 0; i < OC * OH * OW; i++)
        out[i] = NAN;
    const sdrt_conv_pairs a = {x, (ptrdiff_t)C2 * Hp * Wp * 2, C2, Hp, Wp, w, 9 * C2 * 2, 1, OC, 3, 3, 1, 1, OH, OW,
                               out, OC * OH * OW, NULL, 0, NULL};
    for (int amx = 1; amx >= 0; amx--) {
        sdrt_amx_set(amx);
        int32_t state[4] = {0, 0, 0, 0};
        sdrt_conv_pairs_run(&a, NULL, NULL, state, 1);
        for (int i = 0; i < OC * OH * OW; i++)
            if (!isnan(out[i])) {
                printf("FAIL an input without slack rows was not refused (amx %d)\n", amx);
                fails++;
                break;
            }
    }
    unmap(&mx);
    unmap(&mw);
    unmap(&mo);
}

int main(void) {
    if (sdrt_amx_set(1) != 1) {
        printf("amx_conv_check: no AMX tiles here (CPU, OS or build): nothing to check\n");
        return 0;
    }
    srand(7);
    int count = 0;
    static const int shapes[][4] = {{1, 1, 1, 0}, {3, 3, 1, 1}, {3, 3, 2, 2}, {3, 3, 1, 0}, {1, 3, 1, 1}, {3, 1, 2, 1}};
    static const int widths[] = {1, 2, 3, 5, 7, 13, 16, 17, 19};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
            const int k = shapes[s][0], kw = shapes[s][1], d = shapes[s][2], p = shapes[s][3];
            const int W = widths[wi], H = 1 + (int)(wi * 3 % 7);
            const int C = (int[]){32, 33, 64, 7}[count % 4], OC = (int[]){16, 17, 40, 1, 32, 31}[count % 6];
            const int N = 1 + count % 3;
            check(C, OC, H, W, k, kw, d, d, k > 1 ? p : 0, kw > 1 ? p : 0, N, count % 32);
            count++;
        }
    /* wider maps: several pixel tiles a row, many units */
    check(64, 48, 9, 40, 3, 3, 1, 1, 1, 1, 2, 1 | 2 | 4 | 8);
    check(32, 16, 33, 33, 3, 3, 2, 2, 2, 2, 1, 2 | 16);
    count += 2;
    check_refused();
    printf("amx_conv_check: %d shapes, %s\n", count, fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
#else
int main(void) {
    printf("amx_conv_check: no AMX in this build: nothing to check\n");
    return 0;
}
#endif
