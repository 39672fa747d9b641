/* sdrt-ggml native kernels: one ISA's Winograd F(2x2, 3x3) transforms, included by simd_body.h
 * (same VW, SFX). The conv they serve is in winograd.c.
 *
 * Input: a 4x4 patch d of the padded input per 2x2 output tile, V = B^T d B with
 *   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
 * Output: Y = A^T M A from the 16 products M of a tile, A^T = [1 1 1 0; 0 1 -1 -1].
 * Both run along a row of tiles, VW tiles a vector. */

/* V of n consecutive tiles of one tile row: rows[r] is input row 2 ty + r of the padded plane,
 * from column 2 tx0 on, already split into its even (e[r][t] = row[2t]) and odd (o[r][t] = row[2t+1])
 * columns for t <= n (so n + 1 of each, plus VW floats of room); dst[k ld + j] = V[k] of tile j. */
static void SFX(wino_in)(int n, const float *const *e, const float *const *o, float *dst, ptrdiff_t ld) {
    for (int j = 0; j < n; j += VW) {
        VF u[4][4];
        for (int r = 0; r < 4; r++) { /* d B along the row: u[r][c] */
            const VF e0 = SFX(ld)(e[r] + j), e1 = SFX(ld)(e[r] + j + 1);
            const VF o0 = SFX(ld)(o[r] + j), o1 = SFX(ld)(o[r] + j + 1);
            u[r][0] = e0 - e1;
            u[r][1] = o0 + e1;
            u[r][2] = e1 - o0;
            u[r][3] = o0 - o1;
        }
        for (int c = 0; c < 4; c++) { /* B^T (d B) down the columns: V[r][c], stored at k = 4 r + c */
            const VF v0 = u[0][c] - u[2][c], v1 = u[1][c] + u[2][c], v2 = u[2][c] - u[1][c], v3 = u[1][c] - u[3][c];
            if (j + VW <= n) {
                SFX(st)(dst + 0 * 4 * ld + c * ld + j, v0);
                SFX(st)(dst + 1 * 4 * ld + c * ld + j, v1);
                SFX(st)(dst + 2 * 4 * ld + c * ld + j, v2);
                SFX(st)(dst + 3 * 4 * ld + c * ld + j, v3);
            } else {
                for (int t = 0; j + t < n; t++) {
                    dst[0 * 4 * ld + c * ld + j + t] = v0[t];
                    dst[1 * 4 * ld + c * ld + j + t] = v1[t];
                    dst[2 * 4 * ld + c * ld + j + t] = v2[t];
                    dst[3 * 4 * ld + c * ld + j + t] = v3[t];
                }
            }
        }
    }
}

/* Y of n consecutive tiles of one tile row of one output channel: m[k ld + j] is M[k] of tile j;
 * the 2x2 outputs go to row0[2j + (0, 1)] and row1[2j + (0, 1)] (row1 NULL: the tile row's second
 * output row is past the image), `cols` outputs per row in all (2n, or 2n - 1 at an odd width).
 * Then + bias, + the residual rows (res0, res1, laid out as the outputs; NULL for none), and the
 * activation. */
static void SFX(wino_out)(int n, int cols, const float *m, ptrdiff_t ld, float bias, const float *res0,
                          const float *res1, const sdrt_epilogue *ep, float *row0, float *row1) {
    float buf[2][2 * VW];
    for (int j = 0; j < n; j += VW) {
        VF s0[4], s1[4];
        for (int r = 0; r < 4; r++) { /* M A along the row */
            const VF m0 = SFX(ld)(m + (4 * r + 0) * ld + j), m1 = SFX(ld)(m + (4 * r + 1) * ld + j);
            const VF m2 = SFX(ld)(m + (4 * r + 2) * ld + j), m3 = SFX(ld)(m + (4 * r + 3) * ld + j);
            s0[r] = m0 + m1 + m2;
            s1[r] = m1 - m2 - m3;
        }
        const VF y00 = s0[0] + s0[1] + s0[2] + bias, y01 = s1[0] + s1[1] + s1[2] + bias;
        const VF y10 = s0[1] - s0[2] - s0[3] + bias, y11 = s1[1] - s1[2] - s1[3] + bias;
        for (int t = 0; t < VW; t++) { /* the tiles' two columns side by side */
            buf[0][2 * t] = y00[t];
            buf[0][2 * t + 1] = y01[t];
            buf[1][2 * t] = y10[t];
            buf[1][2 * t + 1] = y11[t];
        }
        const int c0 = 2 * j, nc = cols - c0 < 2 * VW ? cols - c0 : 2 * VW;
        for (int h = 0; h < 2; h++) {
            float *row = h ? row1 : row0;
            const float *res = h ? res1 : res0;
            if (!row)
                continue;
            for (int q = 0; q < nc; q += VW) {
                VF v = SFX(ld)(buf[h] + q);
                if (res) {
                    if (q + VW <= nc) {
                        v += SFX(ld)(res + c0 + q);
                    } else {
                        for (int t = 0; q + t < nc; t++)
                            v[t] += res[c0 + q + t];
                    }
                }
                v = SFX(vact)(ep, v);
                if (q + VW <= nc) {
                    SFX(st)(row + c0 + q, v);
                } else {
                    for (int t = 0; q + t < nc; t++)
                        row[c0 + q + t] = v[t];
                }
            }
        }
    }
}
