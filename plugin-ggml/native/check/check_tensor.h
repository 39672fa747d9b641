/* What the C checks share: a stand-in for ggml's tensor structure with the fields the ops read
 * (the library is told their offsets, as Python tells it ggml-python's), dense tensors over a
 * buffer, and the double-precision reference of the epilogue's activations. */
#ifndef SDRT_CHECK_TENSOR_H
#define SDRT_CHECK_TENSOR_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    int64_t ne[4];
    size_t nb[4];
    void *data;
    void *src[10];
} tensor;

int sdrt_set_tensor_layout(size_t ne, size_t nb, size_t data, size_t src, int max_src, size_t size);

/* give the library this stand-in's layout; 0, or 1 (with a message) when it refuses it */
static inline int use_stand_in(void) {
    if (sdrt_set_tensor_layout(offsetof(tensor, ne), offsetof(tensor, nb), offsetof(tensor, data),
                               offsetof(tensor, src), 10, sizeof(tensor))) {
        printf("layout refused\n");
        return 1;
    }
    return 0;
}

/* a contiguous float32 tensor of ne (n0, n1, n2, n3) over data */
static inline tensor dense(void *data, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    tensor t;
    memset(&t, 0, sizeof t);
    t.ne[0] = n0, t.ne[1] = n1, t.ne[2] = n2, t.ne[3] = n3;
    t.nb[0] = 4, t.nb[1] = 4 * n0, t.nb[2] = t.nb[1] * n1, t.nb[3] = t.nb[2] * n2;
    t.data = data;
    return t;
}

/* the activations of the ops' epilogue (SDRT_ACT_* in sdrt_native.h): clip to [lo, hi], or
 * v sigmoid(lo v) */
enum { ACT_NONE, ACT_RELU, ACT_CLIP, ACT_HARDSWISH, ACT_SILU };
static inline double ref_act(int a, double v, double lo, double hi) {
    switch (a) {
    case ACT_RELU:
        return v > 0 ? v : 0;
    case ACT_CLIP:
        return v < lo ? lo : v > hi ? hi : v;
    case ACT_HARDSWISH: {
        const double g = v / 6 + 0.5;
        return v * (g < 0 ? 0 : g > 1 ? 1 : g);
    }
    case ACT_SILU:
        return v / (1 + exp(-lo * v));
    default:
        return v;
    }
}

#endif
