"""Attention routes on ggml's CPU backend, per head width and sequence length.

    python -m bench.ggml_attention                 # 2 threads, every shape
    python -m bench.ggml_attention --threads 1 --rounds 5

Routes, each checked against numpy (float64) before it is timed (best of ``--rounds``):

- ``flash``: ``ggml_flash_attn_ext`` at float32 precision with the head dims zero-padded to
  a multiple of 16, as the lowering emitted it before the native kernel (the pad copies are
  timed too);
- ``matmul``: scores by ``ggml_mul_mat``, ``ggml_soft_max_ext`` (scale and mask fused),
  then ``ggml_mul_mat`` with V transposed by a copy;
- ``native``: sdrt-ggml's kernel (``sdrt_attention_op``), reading Q, K and V through their
  strides; ``native-avx2`` etc. force a narrower body.

Shapes: the bench UNet's (heads 8, 16 and 32 wide... at 8 heads), the text encoder's, and
SD 1.x/2.x full size (head widths 40, 64, 80; self-attention over 4096/1024 tokens and
cross-attention to 77).
"""

from __future__ import annotations

import argparse
import ctypes
from typing import Any

import numpy as np

from .ggml_gemm import _best_ms, _Ggml

#: n_q, n_kv, head dim, heads, what
SHAPES = [
    (1024, 1024, 8, 8, "bench UNet self, 32x32"),
    (1024, 77, 8, 8, "bench UNet cross, 32x32"),
    (256, 256, 16, 8, "bench UNet self, 16x16"),
    (256, 77, 16, 8, "bench UNet cross, 16x16"),
    (64, 64, 32, 8, "bench UNet self, 8x8"),
    (77, 77, 64, 12, "CLIP L/14 text encoder"),
    (4096, 4096, 40, 8, "SD 1.x self, 64x64"),
    (4096, 77, 40, 8, "SD 1.x cross, 64x64"),
    (1024, 1024, 80, 8, "SD 1.x self, 32x32"),
    (4096, 4096, 64, 5, "SD 2.x self, 64x64"),
]


def _pad(gm: _Ggml, t: Any, d: int) -> Any:
    dp = -(-d // 16) * 16
    return t if dp == d else gm.g.ggml_pad(gm.ctx, t, dp - d, 0, 0, 0)


def _route(gm: _Ggml, route: str, q: Any, k: Any, v: Any, mask: Any, mask16: Any, scale: float, d: int,
           dv: int) -> Any:
    g, ctx = gm.g, gm.ctx
    if route == "flash":
        y = g.ggml_flash_attn_ext(ctx, _pad(gm, q, d), _pad(gm, k, d), _pad(gm, v, dv), mask16, scale, 0.0, 0.0)
        g.ggml_flash_attn_ext_set_prec(y, g.GGML_PREC_F32)
        return y
    if route == "matmul":
        s = g.ggml_soft_max_ext(ctx, g.ggml_mul_mat(ctx, k, q), mask, scale, 0.0)
        vt = g.ggml_cont(ctx, g.ggml_permute(ctx, v, 1, 0, 2, 3))
        return g.ggml_mul_mat(ctx, vt, s)
    from sdrt_ggml.native_ops import attention, native_ops

    ops = native_ops()
    assert ops is not None
    return attention(ops, g, ctx, q, k, v, mask, scale)


def _get(gm: _Ggml, t: Any, shape: tuple[int, ...]) -> np.ndarray:
    ptr = ctypes.cast(gm.g.ggml_get_data(t), ctypes.POINTER(ctypes.c_float))
    ne = t.contents.ne
    full = np.ctypeslib.as_array(ptr, shape=(int(np.prod([ne[i] for i in range(4)])),))
    return full[: int(np.prod(shape))].reshape(shape).copy()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ggml_attention", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--routes", default="flash,matmul,native")
    p.add_argument("--shapes", default=None, help="indices into the shape list, comma-separated")
    args = p.parse_args(argv)
    from sdrt_ggml.native_ops import native_ops, reference_attention

    routes = args.routes.split(",")
    shapes = SHAPES if args.shapes is None else [SHAPES[int(i)] for i in args.shapes.split(",")]
    print(f"{'shape':34s} " + " ".join(f"{r:>12s}" for r in routes) + "   (ms; max rel err vs numpy in brackets)")
    for n_q, n_kv, d, h, what in shapes:
        cells = []
        for route in routes:
            gm = _Ggml(args.threads, mb=max(256, 6 * h * n_q * n_kv * 4 // 2**20 + 64))
            try:
                rng = np.random.default_rng(0)
                qa = rng.standard_normal((h, n_q, d)).astype(np.float32)
                ka = rng.standard_normal((h, n_kv, d)).astype(np.float32)
                va = rng.standard_normal((h, n_kv, d)).astype(np.float32)
                q, k, v = gm.tensor(d, n_q, h), gm.tensor(d, n_kv, h), gm.tensor(d, n_kv, h)
                for t, a in ((q, qa), (k, ka), (v, va)):
                    ctypes.memmove(gm.g.ggml_get_data(t), a.ctypes.data, a.nbytes)
                mask16 = None
                mask = None
                name = route
                if route.startswith("native-"):
                    native_ops().set_isa(route.split("-", 1)[1])
                    name = "native"
                y = _route(gm, name, q, k, v, mask, mask16, 1 / np.sqrt(d), d, d)
                gf = gm.g.ggml_new_graph(gm.ctx)
                gm.g.ggml_build_forward_expand(gf, y)
                gm.g.ggml_graph_compute_with_ctx(gm.ctx, gf, args.threads)
                want = reference_attention(qa, ka, va, None, 1 / np.sqrt(d))
                if name == "matmul":
                    got = _get(gm, y, (h, n_q, d))
                else:
                    got = _get(gm, y, (n_q, h, -(-d // 16) * 16 if name == "flash" else d))[..., :d].transpose(1, 0, 2)
                err = float(np.abs(got - want).max() / np.abs(want).max())
                ms = _best_ms(lambda gf=gf, gm=gm: gm.g.ggml_graph_compute_with_ctx(gm.ctx, gf, args.threads), args.rounds)
                cells.append(f"{ms:7.2f} [{err:.0e}]")
            finally:
                if route.startswith("native-"):
                    native_ops().set_isa(None)
                gm.close()
        print(f"{f'{n_q}x{n_kv} D={d} H={h} ({what})':34s} " + " ".join(f"{c:>12s}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
