/* Copies as sdrt ops: a strided float32 tensor made dense (ggml's CONT), two tensors joined
 * along a dim (CONCAT), and a nearest upscale by whole factors (UPSCALE).
 *
 * ggml's CONT of a permuted view walks the source one element at a time, each with its own index
 * arithmetic (4.6 ns an element here: 0.3 ms for the bench UNet's 64 x 1024 token transposes), and
 * as a ggml op it cannot run on the ops' pool (pool.c). This one copies rows where the source's
 * innermost dim is dense, and otherwise transposes tiles of TILE x TILE between the destination's
 * dim 0 and the source's dense dim, so that both sides touch whole cache lines.
 *
 *   src[0]: float32, ne as dst, any strides
 *   dst:    float32, dense
 * Threads take contiguous ranges of rows or tiles (ith of nth).
 *
 * ggml's CONCAT and nearest UPSCALE also index each element on its own, on ggml's threads only:
 * the bench UNet's skip concatenations and upsamplers took 3.3 ms of a 195 ms run on one thread,
 * several times memcpy's time. Here both copy whole rows.
 */
#include "sdrt_native.h"

#include <string.h>

#define TILE 16

/* n floats, the source's `stride` floats apart */
static inline void copy_strided(float *out, const float *in, int64_t n, size_t stride) {
    if (stride == 1) {
        memcpy(out, in, (size_t)n * sizeof(float));
    } else {
        for (int64_t i = 0; i < n; i++)
            out[i] = in[i * stride];
    }
}

/* rows [r0, r1) of dst (counted over dims 1-3) copied from the same rows of src */
static void copy_rows(const sdrt_view *d, const sdrt_view *s, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const row_ix ix = row_ix_of(d->ne, r);
        copy_strided(row_at(*d, ix), row_at(*s, ix), d->ne[0], s->nb[0] / sizeof(float));
    }
}

/* the tiles [t0, t1) of the transposed copy: dst dim 0 against src dim u (the dense one); the
 * other two dims (a, b) index the planes */
static void copy_tiles(const sdrt_view *d, const sdrt_view *s, int u, int64_t t0, int64_t t1) {
    int other[2], k = 0;
    for (int i = 1; i < 4; i++)
        if (i != u)
            other[k++] = i;
    const int a = other[0], b = other[1];
    const int64_t n0 = d->ne[0], nu = d->ne[u];
    const int64_t tiles0 = ((n0 + TILE - 1) / TILE), tilesu = ((nu + TILE - 1) / TILE);
    const int64_t per_plane = tiles0 * tilesu;
    const size_t ds = d->nb[u] / sizeof(float), ss = s->nb[0] / sizeof(float);
    for (int64_t t = t0; t < t1; t++) {
        const int64_t plane = t / per_plane, tile = t % per_plane;
        const int64_t ia = plane % d->ne[a], ib = plane / d->ne[a];
        const int64_t j0 = (tile / tilesu) * TILE, ju = (tile % tilesu) * TILE;
        const int64_t e0 = j0 + TILE < n0 ? j0 + TILE : n0, eu = ju + TILE < nu ? ju + TILE : nu;
        float *out = (float *)(d->data + ia * d->nb[a] + ib * d->nb[b]);
        const float *in = (const float *)(s->data + ia * s->nb[a] + ib * s->nb[b]);
        for (int64_t iu = ju; iu < eu; iu++) /* dense writes along dim 0, reads one source line each */
            for (int64_t i0 = j0; i0 < e0; i0++)
                out[iu * ds + i0] = in[i0 * ss + iu];
    }
}

SDRT_EXPORT void sdrt_copy_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_copy_op);
    (void)userdata;
    const sdrt_view d = sdrt_tensor_view(dst), s = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    int u = 0; /* the source's dense dim, where dim 0 is not */
    if (s.nb[0] != sizeof(float) && d.ne[0] > 1)
        for (int i = 1; i < 4 && !u; i++)
            if (s.nb[i] == sizeof(float) && d.ne[i] > 1)
                u = i;
    if (!u) {
        const int64_t rows = (int64_t)(d.ne[1] * d.ne[2] * d.ne[3]);
        copy_rows(&d, &s, rows * ith / nth, rows * (ith + 1) / nth);
        return;
    }
    int64_t planes = 1;
    for (int i = 1; i < 4; i++)
        if (i != u)
            planes *= (int64_t)d.ne[i];
    const int64_t tiles = planes * (int64_t)((d.ne[0] + TILE - 1) / TILE) * (int64_t)((d.ne[u] + TILE - 1) / TILE);
    copy_tiles(&d, &s, u, tiles * ith / nth, tiles * (ith + 1) / nth);
}

/* dst = src0 and src1 joined along dim `(intptr_t)userdata` (0-3); each float32, any strides; dst
 * dense. The dims other than `dim` are equal (the lowering checks). Threads take rows of dst. */
SDRT_EXPORT void sdrt_concat_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_concat_op);
    const int dim = (int)(intptr_t)userdata;
    const sdrt_view d = sdrt_tensor_view(dst), a = sdrt_tensor_view(sdrt_tensor_src(dst, 0)),
                    b = sdrt_tensor_view(sdrt_tensor_src(dst, 1));
    const int64_t rows = d.ne[1] * d.ne[2] * d.ne[3];
    for (int64_t r = rows * ith / nth; r < rows * (ith + 1) / nth; r++) {
        row_ix ix = row_ix_of(d.ne, r);
        float *out = row_at(d, ix);
        if (dim == 0) {
            copy_strided(out, row_at(a, ix), a.ne[0], a.nb[0] / sizeof(float));
            copy_strided(out + a.ne[0], row_at(b, ix), b.ne[0], b.nb[0] / sizeof(float));
            continue;
        }
        int64_t *at = dim == 1 ? &ix.i1 : dim == 2 ? &ix.i2 : &ix.i3; /* the index along dim */
        const sdrt_view *s = &a;
        if (*at >= a.ne[dim]) {
            *at -= a.ne[dim];
            s = &b;
        }
        copy_strided(out, row_at(*s, ix), d.ne[0], s->nb[0] / sizeof(float));
    }
}

/* dst = src0 upscaled by whole factors along dims 0 and 1, nearest (element o of dst takes element
 * o / factor, as ggml's nearest mode); dims 2 and 3 equal; src0 float32 with dense rows, dst dense.
 * Threads take rows of dst. */
SDRT_EXPORT void sdrt_upscale_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(sdrt_upscale_op);
    (void)userdata;
    const sdrt_view d = sdrt_tensor_view(dst), s = sdrt_tensor_view(sdrt_tensor_src(dst, 0));
    const int64_t f0 = d.ne[0] / s.ne[0], f1 = d.ne[1] / s.ne[1];
    const int64_t rows = d.ne[1] * d.ne[2] * d.ne[3];
    for (int64_t r = rows * ith / nth; r < rows * (ith + 1) / nth; r++) {
        row_ix ix = row_ix_of(d.ne, r);
        float *out = row_at(d, ix);
        ix.i1 /= f1; /* the source row */
        const float *in = row_at(s, ix);
        if (f0 == 2) {
            for (int64_t x = 0; x < s.ne[0]; x++)
                out[2 * x] = out[2 * x + 1] = in[x];
        } else {
            for (int64_t o = 0; o < d.ne[0]; o++)
                out[o] = in[o / f0];
        }
    }
}
