"""Why sdrt-ggml is slower on the CPU: its kernels against their peers, one op at a time.

    python -m bench.ggml_gemm                 # 2 threads (all cores), every section
    python -m bench.ggml_gemm --threads 1
    python -m bench.ggml_gemm --sections models --rounds 15    # whole models, before/after the native GEMM

Sections (``gemm`` and ``conv`` time each contender in interleaved rounds, so that all see the
same machine load, and report the median over rounds of each round's best of 3 calls; each
contender starts after a short pause, so that the threads of the one before (OpenBLAS's keep
spinning after a call) have gone to sleep, and then runs ``--warmup-ms`` (30) of untimed calls,
so that the cores are awake again when the timed calls start):

- ``gemm``: one-node ONNX models ``MatMul(a[M, K], w[K, N])`` with a constant ``w``, at the
  GEMM shapes of the CLIP text encoder and of the SD UNet (bench and full size), through
  ``sdrt.load(..., backend="ggml")`` (what the lowering emits: the native packed GEMM on the
  CPU) and an onnxruntime session (MLAS) with the same thread count; beside them ggml
  ``mul_mat`` on the same operands (llamafile tinyBLAS when ggml-python was built with it)
  and numpy ``a @ w`` (OpenBLAS, with its own thread count: it ignores ``--threads``).
  GFLOPS count 2*M*K*N; ``sdrt/ort`` is the median of the per-round ratios ort time / sdrt
  time (above 1: sdrt is faster); the sdrt output is checked against onnxruntime's. Both time
  the op's compute: sdrt's lowered graph without feeding and fetching, onnxruntime with an IO
  binding into a preallocated output.
- ``conv``: one-node ONNX models ``Conv(x[1, C, H, W], w[OC, C, 3, 3], b)``, pad 1, at the
  bench VAE's and UNet's 3x3 conv sizes and two full-size ones, through sdrt-ggml and
  onnxruntime as above: milliseconds, effective GFLOPS (direct-conv flops, 2*OC*H*W*C*9,
  also for Winograd, which does fewer), ``sdrt/ort``, the error against onnxruntime, and the
  route the lowering chose for the conv (the session's ``impl_hits``: direct, implicit GEMM,
  Winograd, or ``cols_over_patches`` on the small maps).
- ``attention``: ggml flash attention against scores by ``ggml_out_prod`` or
  ``mul_mat`` followed by softmax and ``mul_mat``, at the bench UNet's head sizes.
- ``models`` (not in the default set; ``--sections models --models unet --size full``): whole
  bench models on onnxruntime, on sdrt-ggml with the native GEMM and with ggml's mul_mat
  (``gemm="ggml"``), interleaved, each checked against onnxruntime.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

GEMMS = [  # M (rows), K, N (output features), what: MatMul(a[M, K], w[K, N]) with w constant
    (77, 768, 768, "CLIP attention projection"),
    (77, 768, 3072, "CLIP MLP up"),
    (77, 3072, 768, "CLIP MLP down"),
    (1024, 64, 64, "bench UNet attention projection, 32x32"),
    (1024, 64, 512, "bench UNet GEGLU up, 32x32"),
    (256, 128, 1024, "bench UNet GEGLU up, 16x16"),
    (64, 256, 2048, "bench UNet GEGLU up, 8x8"),
    (4096, 320, 320, "SD1.5 UNet attention projection, 64x64"),
    (4096, 320, 2560, "SD1.5 UNet GEGLU up, 64x64"),
    (4096, 1280, 320, "SD1.5 UNet FF down, 64x64"),
    (1024, 640, 640, "SD1.5 UNet attention projection, 32x32"),
]
CONVS = [  # C, H=W, OC, what: Conv(x[1, C, H, W], w[OC, C, 3, 3], b[OC]), pad 1
    (32, 128, 32, "bench VAE, 128x128"),
    (64, 128, 64, "bench VAE, 128x128"),
    (128, 64, 128, "bench VAE, 64x64"),
    (128, 32, 128, "bench VAE, 32x32"),
    (256, 8, 256, "bench UNet, 8x8"),
    (128, 16, 128, "bench UNet, 16x16"),
    (64, 32, 64, "bench UNet, 32x32"),
    (512, 64, 512, "SD1.5 VAE, 64x64"),
    (320, 64, 320, "SD1.5 UNet, 64x64"),
]
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


def _onnx_model(node: Any, x_name: str, x_shape: tuple[int, ...], inits: dict[str, np.ndarray]) -> bytes:
    """A one-node ONNX model (opset 17) with one float input and constant initializers."""
    import onnx
    from onnx import helper, numpy_helper

    graph = helper.make_graph([node], "op", [helper.make_tensor_value_info(x_name, onnx.TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _ort_session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _sdrt_session(model: bytes, threads: int) -> Any:
    import sdrt

    return sdrt.load(model, backend="ggml", threads=threads)


def _compute_runners(ours: Any, ort: Any, feeds: dict[str, np.ndarray], out_name: str,
                     out_shape: tuple[int, ...]) -> dict[str, Callable[[], Any]]:
    """The op's compute alone on both sides: sdrt-ggml's graph on the inputs its last run set (no
    feeding, no copy out), onnxruntime through an IO binding into a preallocated output (its run
    without allocating the result). Session IO would otherwise weigh on the small shapes."""
    binding = ort.io_binding()
    for name, arr in feeds.items():
        binding.bind_cpu_input(name, arr)
    out = np.empty(out_shape, np.float32)
    binding.bind_output(out_name, "cpu", 0, np.float32, list(out_shape), out.ctypes.data)
    ours.run(feeds)
    return {"sdrt": ours._compute, "ort": lambda: ort.run_with_iobinding(binding), "_keep": lambda: out}


def _openblas_threads() -> str:
    """The thread count of the OpenBLAS that numpy calls ('?' where it cannot be found)."""
    np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32)  # loads the library
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return "?"
    for path in sorted(libs):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                    "openblas_get_num_threads64_", "openblas_get_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                return str(fn())
    return "?"


def _paired(fns: dict[str, Callable[[], Any]], rounds: int, warmup_ms: float = 30.0) -> dict[str, list[float]]:
    """Interleaved rounds: each round times every contender (best of 3 calls) in turn, after a pause
    and then ``warmup_ms`` of untimed calls of the same contender.

    The warm-up is there because the pause idles both cores, and this VM's cores run the next
    millisecond or so slowly (a 2 ms GEMM on one thread: 3.2 ms right after a 20 ms sleep, 2.1 ms
    back to back). Without it the small shapes timed the cores' wake-up, not the kernels, and
    unevenly: onnxruntime's caller thread can take every tile itself while its worker wakes, where a
    ggml graph waits at its barriers for both threads (docs/ggml.md, "The GEMM bench's warm-up").
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(0.2)  # let the threads of the one before (OpenBLAS's spin) go to sleep
            t_warm = time.perf_counter() + warmup_ms / 1e3
            while time.perf_counter() < t_warm:
                fn()
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            times[name].append(best * 1e3)
    return times


def _ratio(times: dict[str, list[float]]) -> float:
    """The median over rounds of ort time / sdrt time (above 1: sdrt is faster)."""
    return float(np.median(np.array(times["ort"]) / np.array(times["sdrt"])))


def gemm(threads: int, rounds: int, warmup_ms: float = 30.0, only: str = "") -> None:
    from onnx import helper

    from sdrt_ggml import native

    from .harness import max_rel_err

    sdrt_is = "the native packed GEMM" if native.native() is not None else "ggml mul_mat: no native library"
    print(f"\ngemm: GFLOPS (2*M*K*N; median of {rounds} interleaved rounds, each the best of 3 calls after "
          f"{warmup_ms:g} ms of untimed ones), MatMul(a[M,K], w[K,N] constant), {threads} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"  sdrt: sdrt.load(backend='ggml') ({sdrt_is}), its graph computed without session IO; ort: onnxruntime "
          f"(MLAS) run with an IO binding; ggml mm: ggml_mul_mat; "
          f"numpy: a @ w on OpenBLAS with its own {_openblas_threads()} threads (ignores --threads); "
          f"err: max |sdrt - ort| / max |ort|")
    print(f"{'M x K x N':>18s} {'sdrt':>7s} {'ort':>7s} {'ggml mm':>8s} {'numpy':>7s} {'sdrt/ort':>9s} {'err':>8s}  what")
    for m, k, n, what in GEMMS:
        if only.lower() not in what.lower():
            continue
        rng = np.random.default_rng(m * 7 + k * 3 + n)
        a = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        model = _onnx_model(helper.make_node("MatMul", ["a", "w"], ["c"]), "a", (m, k), {"w": w})
        ours, ort = _sdrt_session(model, threads), _ort_session(model, threads)
        feeds = {"a": a}
        err = max_rel_err([ours.run(feeds)["c"]], ort.run(None, feeds))
        gm = _Ggml(threads)
        mm = gm.g.ggml_mul_mat(gm.ctx, gm.tensor(k, n), gm.tensor(k, m))  # ne (K, N) w^T, (K, M) a: out ne (N, M)
        fns = _compute_runners(ours, ort, feeds, "c", (m, n))
        keep = fns.pop("_keep")
        fns.update({"ggml": gm.runner(mm), "numpy": lambda a=a, w=w: a @ w})
        times = _paired(fns, rounds, warmup_ms)
        del keep
        ours.close()
        gm.close()
        gf = 2 * m * k * n / 1e6
        med = {name: gf / float(np.median(t)) for name, t in times.items()}
        print(f"{f'{m} x {k} x {n}':>18s} {med['sdrt']:7.0f} {med['ort']:7.0f} {med['ggml']:8.0f} "
              f"{med['numpy']:7.0f} {_ratio(times):9.2f} {err:8.1e}  {what}", flush=True)


def conv(threads: int, rounds: int, warmup_ms: float = 30.0) -> None:
    from onnx import helper

    from .harness import max_rel_err

    print(f"\nconv (3x3, pad 1, bias): ms and effective GFLOPS (direct-conv flops 2*OC*H*W*C*9, also for Winograd, "
          f"which does fewer), median of {rounds} interleaved rounds, each the best of 3 calls after "
          f"{warmup_ms:g} ms of untimed ones, {threads} threads, load average {os.getloadavg()[0]:.1f}")
    print("  sdrt: sdrt.load(backend='ggml'), its graph computed without session IO; ort: onnxruntime (MLAS) run with "
          "an IO binding; err: max |sdrt - ort| / max |ort|; route: the lowering's choice (impl_hits)")
    print(f"{'C x HW x OC':>16s} {'sdrt ms':>8s} {'ort ms':>8s} {'sdrt GF':>8s} {'ort GF':>7s} {'sdrt/ort':>9s} "
          f"{'err':>8s}  {'route':18s} what")
    for c, hw, oc, what in CONVS:
        rng = np.random.default_rng(c * 7 + hw * 3 + oc)
        x = rng.standard_normal((1, c, hw, hw), dtype=np.float32)
        w = rng.standard_normal((oc, c, 3, 3), dtype=np.float32) / np.float32(np.sqrt(9 * c))
        b = rng.standard_normal(oc, dtype=np.float32)
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        model = _onnx_model(node, "x", (1, c, hw, hw), {"w": w, "b": b})
        ours, ort = _sdrt_session(model, threads), _ort_session(model, threads)
        feeds = {"x": x}
        err = max_rel_err([ours.run(feeds)["y"]], ort.run(None, feeds))
        route = ",".join(sorted(k.removeprefix("conv ").replace(" ", "_") for k in ours.impl_hits
                                if k.startswith("conv"))) or "ggml"  # one word: the table's columns split on spaces
        fns = _compute_runners(ours, ort, feeds, "y", (1, oc, hw, hw))
        keep = fns.pop("_keep")
        times = _paired(fns, rounds, warmup_ms)
        del keep
        ours.close()
        ms = {name: float(np.median(t)) for name, t in times.items()}
        gf = 2 * oc * hw * hw * c * 9 / 1e6
        print(f"{f'{c} x {hw} x {oc}':>16s} {ms['sdrt']:8.2f} {ms['ort']:8.2f} {gf / ms['sdrt']:8.0f} "
              f"{gf / ms['ort']:7.0f} {_ratio(times):9.2f} {err:8.1e}  {route:18s} {what}", flush=True)


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
    p.add_argument("--warmup-ms", type=float, default=30.0,
                   help="gemm, conv: untimed calls of each contender before its timed ones (0: none)")
    p.add_argument("--gemms", default="", help="gemm: only the shapes whose description has this text (e.g. CLIP)")
    p.add_argument("--models", default=MODEL_NAMES, help="for the models section")
    p.add_argument("--size", default="bench", choices=["tiny", "bench", "full"], help="for the models section")
    args = p.parse_args(argv)
    for name in args.sections.split(","):
        if name == "models":
            models(args.threads, args.rounds, args.models, args.size)
        elif name == "gemm":
            gemm(args.threads, args.rounds, args.warmup_ms, args.gemms)
        elif name == "conv":
            conv(args.threads, args.rounds, args.warmup_ms)
        else:
            SECTIONS[name](args.threads, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
