"""Why sdrt-ggml is slower on the CPU: ggml's float32 kernels against their peers, one op at a time.

    python -m bench.ggml_gemm                 # 2 threads (all cores), every section
    python -m bench.ggml_gemm --threads 1
    python -m bench.ggml_gemm --sections models --rounds 15    # whole models, before/after the native GEMM

Sections (each prints GFLOPS or milliseconds, the best of ``--rounds``: the least disturbed
run, since one op takes milliseconds and the machine may be shared; each contender starts
after a short pause, so that the threads of the one before (OpenBLAS's keep spinning after
a call) have gone to sleep):

- ``gemm``: the GEMM shapes the bench models run, as sdrt-ggml's native packed GEMM (the
  custom op the lowering emits on the CPU), ggml ``mul_mat`` (llamafile tinyBLAS when
  ggml-python was built with it), onnxruntime ``MatMul`` (MLAS) and numpy ``@``, timed in
  interleaved rounds so that all see the same machine load; ``sdrt/ort`` is the median of
  the per-round time ratios (above 1: the native GEMM is faster).
- ``conv``: the VAE's 3x3 conv sizes as sdrt-ggml's window conv (one ``mul_mat``
  over overlapping rows of a row-stacked input), as ggml ``mul_mat`` over a ready
  im2col matrix, as numpy (the im2col copy plus its BLAS GEMM), which is what a
  numpy-backed custom op inside the ggml graph would cost, and as the window conv's
  GEMM on the native kernel (``sdrt window``).
- ``attention``: ggml flash attention against scores by ``ggml_out_prod`` or
  ``mul_mat`` followed by softmax and ``mul_mat``, at the bench UNet's head sizes.
- ``models`` (not in the default set; ``--sections models --models unet --size full``): whole
  bench models on onnxruntime, on sdrt-ggml with the native GEMM and with ggml's mul_mat
  (``gemm="ggml"``), interleaved, each checked against onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

GEMMS = [  # K, M (output features), N (rows / pixels), what; conv GEMMs put the pixels first, as the lowering does
    (288, 32, 16384, "VAE 3x3 conv, 32 ch, 128x128"),
    (1152, 128, 1024, "VAE 3x3 conv, 128 ch, 32x32"),
    (768, 768, 77, "CLIP projection"),
    (3072, 768, 77, "CLIP MLP down"),
]
PIXELS_FIRST = 1000  # N above which the operands go in conv order
CONVS = [(32, 128, 32), (64, 64, 64), (128, 32, 128), (128, 16, 128)]  # C, H=W, OC (3x3, pad 1)
ATTENTION = [(1024, 1024, 8, 8), (256, 256, 16, 8), (1024, 77, 8, 8)]  # Nq, Nk, head dim, heads


def _best_ms(fn: Callable[[], Any], rounds: int) -> float:
    time.sleep(0.3)
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


class _Ggml:
    """A ggml context whose tensors live in host memory, computed on the CPU."""

    def __init__(self, threads: int, mb: int = 1024) -> None:
        from sdrt_ggml.ops._common import ggml_lib  # sets the OpenMP wait policy sdrt-ggml uses

        self.g = ggml_lib()
        self.threads = threads
        self.ctx = self.g.ggml_init(self.g.ggml_init_params(mem_size=mb * 1024 * 1024, mem_buffer=None))

    def tensor(self, *ne: int) -> Any:
        from ggml.utils import to_numpy

        t = getattr(self.g, f"ggml_new_tensor_{len(ne)}d")(self.ctx, self.g.GGML_TYPE_F32, *ne)
        arr = to_numpy(t)
        arr[...] = np.random.default_rng(len(ne)).standard_normal(arr.shape)
        return t

    def runner(self, out: Any) -> Callable[[], Any]:
        gf = self.g.ggml_new_graph(self.ctx)
        self.g.ggml_build_forward_expand(gf, out)
        return lambda: self.g.ggml_graph_compute_with_ctx(self.ctx, gf, self.threads)

    def timer(self, out: Any, rounds: int) -> float:
        return _best_ms(self.runner(out), rounds)

    def close(self) -> None:
        self.g.ggml_free(self.ctx)


def _ort_matmul(k: int, m: int, n: int, threads: int) -> Callable[[], Any]:
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((k, m)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["c"])], "mm",
                              [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [n, k])],
                              [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [n, m])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
    return lambda: sess.run(None, {"a": a})


def _native_gemm(gm: _Ggml, k: int, m: int, n: int) -> Any:
    """sdrt-ggml's packed GEMM as the lowering emits it: conv (pixels as A, output NCHW: stored
    transposed) or MatMul (activations as A); the weights packed once, as at session build."""
    from sdrt_ggml import native

    nat = native.native()
    if nat is None:
        return None
    w = np.random.default_rng(2).standard_normal((m, k)).astype(np.float32)
    wp = native.pack_b(w)
    tw = gm.tensor(*reversed(wp.shape))
    from ggml.utils import to_numpy

    to_numpy(tw)[...] = wp
    return native.gemm_op(nat, gm.g, gm.ctx, gm.tensor(k, n), tw, m=n, n=m, trans=n > PIXELS_FIRST, packed=True,
                          state=native.state_tensor(gm.g, gm.ctx))


def _paired(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Interleaved rounds: each round times every contender (best of 3 calls) in turn, after a pause."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(0.2)  # let the threads of the one before (OpenBLAS's spin) go to sleep
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            times[name].append(best * 1e3)
    return times


def gemm(threads: int, rounds: int) -> None:
    print(f"\ngemm: GFLOPS (median of {rounds} interleaved rounds, each the best of 3 calls), {threads} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'K x M x N':>18s} {'sdrt':>7s} {'ggml':>7s} {'ort':>7s} {'numpy':>7s} {'sdrt/ort':>9s}  what")
    for k, m, n, what in GEMMS:
        gm = _Ggml(threads)
        x, w = gm.tensor(k, n), gm.tensor(k, m)
        # the lowering's operand order: conv (pixels, weights), MatMul (weights^T, activations)
        out = gm.g.ggml_mul_mat(gm.ctx, x, w) if n > PIXELS_FIRST else gm.g.ggml_mul_mat(gm.ctx, w, x)
        fns: dict[str, Callable[[], Any]] = {"ggml": gm.runner(out)}
        ours = _native_gemm(gm, k, m, n)
        if ours is not None:
            fns["sdrt"] = gm.runner(ours)
        fns["ort"] = _ort_matmul(k, m, n, threads)
        a, wn = np.ones((n, k), np.float32), np.ones((k, m), np.float32)
        fns["numpy"] = lambda a=a, wn=wn: a @ wn
        times = _paired(fns, rounds)
        gm.close()
        gf = 2 * k * m * n / 1e6
        med = {name: gf / float(np.median(t)) for name, t in times.items()}
        ratio = float(np.median(np.array(times["ort"]) / np.array(times["sdrt"]))) if "sdrt" in times else float("nan")
        print(f"{f'{k} x {m} x {n}':>18s} {med.get('sdrt', float('nan')):7.0f} {med['ggml']:7.0f} {med['ort']:7.0f} "
              f"{med['numpy']:7.0f} {ratio:9.2f}  {what}")


def conv(threads: int, rounds: int) -> None:
    from numpy.lib.stride_tricks import as_strided

    print(f"\nconv (3x3, pad 1): ms, {threads} threads")
    print(f"{'C x HW x OC':>16s} {'window':>8s} {'im2col mm':>10s} {'numpy':>8s} {'sdrt window':>12s}")
    for c, hw, oc in CONVS:
        wp, k = hw + 2, 9 * c
        m = -(-(hw * wp) // 16) * 16
        gm = _Ggml(threads)
        stacked = gm.tensor(k * m)  # ggml sizes views as if contiguous: K*M floats
        windows = gm.g.ggml_view_2d(gm.ctx, stacked, k, m, 3 * c * 4, 0)
        window_ms = gm.timer(gm.g.ggml_mul_mat(gm.ctx, windows, gm.tensor(k, oc)), rounds)
        im2col_ms = gm.timer(gm.g.ggml_mul_mat(gm.ctx, gm.tensor(k, hw * hw), gm.tensor(k, oc)), rounds)
        native_ms = float("nan")
        from sdrt_ggml import native

        nat = native.native()
        if nat is not None:
            tw = gm.tensor(native.NR, k, -(-oc // native.NR))
            y = native.gemm_op(nat, gm.g, gm.ctx, windows, tw, m=m, n=oc, trans=True, packed=True,
                               state=native.state_tensor(gm.g, gm.ctx))
            native_ms = gm.timer(y, rounds)
        gm.close()
        buf = np.ones(hw * wp * 3 * c + k, np.float32)
        view = as_strided(buf, shape=(hw * wp, k), strides=(3 * c * 4, 4))
        w = np.ones((k, oc), np.float32)
        np_ms = _best_ms(lambda view=view, w=w: np.ascontiguousarray(view) @ w, rounds)
        print(f"{f'{c} x {hw} x {oc}':>16s} {window_ms:8.2f} {im2col_ms:10.2f} {np_ms:8.2f} {native_ms:12.2f}")


def attention(threads: int, rounds: int) -> None:
    print(f"\nattention (float32): ms, {threads} threads")
    print(f"{'Nq x Nk x D x H':>18s} {'flash':>7s} {'out_prod':>9s} {'mul_mat':>8s}")
    for nq, nk, d, heads in ATTENTION:
        gm = _Ggml(threads, mb=512)
        g, ctx, dp = gm.g, gm.ctx, -(-d // 16) * 16
        q, k, v = gm.tensor(dp, nq, heads), gm.tensor(dp, nk, heads), gm.tensor(dp, nk, heads)
        fa = g.ggml_flash_attn_ext(ctx, q, k, v, None, 0.3, 0.0, 0.0)
        g.ggml_flash_attn_ext_set_prec(fa, g.GGML_PREC_F32)
        flash_ms = gm.timer(fa, rounds)
        vt = gm.tensor(nk, d, heads)
        scores = g.ggml_out_prod(ctx, gm.tensor(nk, d, heads), gm.tensor(nq, d, heads))  # (Nk, Nq, H)
        outer_ms = gm.timer(g.ggml_mul_mat(ctx, vt, g.ggml_soft_max_ext(ctx, scores, None, 0.3, 0.0)), rounds)
        scores = g.ggml_mul_mat(ctx, k, q)
        inner_ms = gm.timer(g.ggml_mul_mat(ctx, vt, g.ggml_soft_max_ext(ctx, scores, None, 0.3, 0.0)), rounds)
        gm.close()
        print(f"{f'{nq} x {nk} x {d} x {heads}':>18s} {flash_ms:7.2f} {outer_ms:9.2f} {inner_ms:8.2f}")


MODEL_NAMES = "vae_decoder,unet,text_encoder,mobilenet_v3,mobilenet_v2"


def models(threads: int, rounds: int, names: str = MODEL_NAMES, size: str = "bench") -> None:
    """Whole bench models: onnxruntime, sdrt-ggml with the native GEMM (the default) and with ggml's
    mul_mat (``gemm="ggml"``: the lowering before the native GEMM), interleaved in rotated order;
    each checked against onnxruntime first. Ratios are medians of the per-round time ratios."""
    import gc
    import statistics

    from . import harness
    from .__main__ import _default_workdir

    print(f"\nmodels ({size}): ms, median of {rounds} interleaved rounds, {threads} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':14s} {'ort':>9s} {'sdrt gemm':>10s} {'ggml mm':>9s} {'sdrt/ort':>9s} {'ggml mm/ort':>12s} "
          f"{'max rel err':>12s}")
    for name in names.split(","):
        path, feeds, outputs = harness.model_file(name, size, _default_workdir())
        ort = harness.ort_runner(path, outputs, threads)
        ref = ort(feeds)
        runs: dict[str, Callable[[Any], Any]] = {"ort": ort}
        errs = []
        for label, opts in (("sdrt", {}), ("ggml", {"gemm": "ggml"})):
            fn = harness.sdrt_runner(path, outputs, "ggml", {"threads": threads, **opts})
            errs.append(harness.max_rel_err(fn(feeds), ref))
            runs[label] = fn
        times: dict[str, list[float]] = {k: [] for k in runs}
        order = list(runs)
        for r in range(rounds):
            for label in order[r % len(order):] + order[:r % len(order)]:
                gc.disable()
                t0 = time.perf_counter()
                runs[label](feeds)
                times[label].append((time.perf_counter() - t0) * 1e3)
                gc.enable()
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = {k: statistics.median(a / b for a, b in zip(times[k], times["ort"])) for k in ("sdrt", "ggml")}
        print(f"{name:14s} {med['ort']:9.1f} {med['sdrt']:10.1f} {med['ggml']:9.1f} {ratio['sdrt']:8.2f}x "
              f"{ratio['ggml']:11.2f}x {max(errs):12.1e}", flush=True)


SECTIONS = {"gemm": gemm, "conv": conv, "attention": attention, "models": models}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ggml_gemm", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--sections", default="gemm,conv,attention")
    p.add_argument("--models", default=MODEL_NAMES, help="for the models section")
    p.add_argument("--size", default="bench", choices=["tiny", "bench", "full"], help="for the models section")
    args = p.parse_args(argv)
    for name in args.sections.split(","):
        if name == "models":
            models(args.threads, args.rounds, args.models, args.size)
        else:
            SECTIONS[name](args.threads, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
