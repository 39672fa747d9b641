"""sdrt-ggml's own thread pool (native/pool.c) and the copy ops that keep a graph on it
(native/copy.c): against numpy, on odd shapes, 1 to 4 threads, both through ggml's threads and
through the pool; which sessions use the pool; concurrent sessions; a forked child."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ggml_helpers import compile_ggml, run_native_graph
from onnx import TensorProto, helper

from sdrt.errors import SdrtError


def _ops():
    from sdrt_ggml.native_ops import native_ops, unavailable_reason

    ops = native_ops()
    if ops is None:
        pytest.skip(f"sdrt-ggml's native library is not usable here: {unavailable_reason()}")
    return ops


def _run(build, threads: int, via: str) -> np.ndarray:
    _ops()
    return run_native_graph(build, threads, via)


THREADS = [1, 2, 3, 4]
VIA = ["ggml", "pool"]


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 1, 37, 19), (2, 3, 5, 7), (1, 64, 1, 33), (3, 1, 17, 16)])
@pytest.mark.parametrize("perm", [(0, 1, 3, 2), (0, 2, 3, 1), (3, 2, 1, 0), (1, 0, 2, 3), (0, 3, 1, 2)])
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("via", VIA)
def test_copy_matches_numpy_transpose(shape, perm, threads, via):
    """A permuted view made dense: row copies where the source's first dim stays first, tiles of
    16 transposed where it does not (odd sizes leave partial tiles)."""
    from sdrt_ggml.native_ops import copy

    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    # ggml_permute(a, b, c, d) puts source ggml dim i at position axes[i]; in numpy terms (dims
    # reversed) the output is x.transpose(perm) when ggml axis i goes to 3 - perm.index(3 - i)
    axes = [3 - perm.index(3 - i) for i in range(4)]
    want = np.ascontiguousarray(x.transpose(perm))
    got = _run(lambda g, ctx, put: (copy(_ops(), g, ctx, g.ggml_permute(ctx, put(x), *axes)), want.shape), threads, via)
    np.testing.assert_array_equal(got, want)


def test_copy_of_a_strided_slice():
    """A view with strided rows (every other column): the row route with a source stride."""
    from sdrt_ggml.native_ops import copy

    x = np.arange(5 * 13 * 8, dtype=np.float32).reshape(5, 13, 8)

    def build(g, ctx, put):
        t = put(x)
        nb = t.contents.nb
        view = g.ggml_view_3d(ctx, t, 4, 13, 5, nb[1], nb[2], 0)
        view.contents.nb[0] = 8  # every other element of a row
        return copy(_ops(), g, ctx, view), (5, 13, 4)

    np.testing.assert_array_equal(_run(build, 3, "pool"), x[:, :, ::2])


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("via", VIA)
def test_concat_matches_numpy(axis, threads, via):
    from sdrt_ggml.native_ops import concat

    rng = np.random.default_rng(axis)
    a_shape, b_shape = [2, 3, 5, 7], [2, 3, 5, 7]
    b_shape[axis] = 4 if axis else 1
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    want = np.concatenate([a, b], axis)
    got = _run(lambda g, ctx, put: (concat(_ops(), g, ctx, put(a), put(b), 3 - axis), want.shape), threads, via)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("factors", [(1, 1), (2, 2), (3, 2), (1, 4), (5, 1)])
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("via", VIA)
def test_upscale_matches_numpy(factors, threads, via):
    from sdrt_ggml.native_ops import upscale

    x = np.random.default_rng(7).standard_normal((2, 3, 5, 7)).astype(np.float32)
    want = x.repeat(factors[0], 2).repeat(factors[1], 3)
    ne = (7 * factors[1], 5 * factors[0], 3, 2)
    got = _run(lambda g, ctx, put: (upscale(_ops(), g, ctx, put(x), ne), want.shape), threads, via)
    np.testing.assert_array_equal(got, want)


# -- sessions -------------------------------------------------------------------------------------
def _model(n: int = 40) -> tuple[Any, dict[str, np.ndarray], np.ndarray]:
    """MatMul (the native GEMM), Transpose (the copy op), Concat and nearest Resize (theirs): every
    node an sdrt op on the CPU, so the session runs on the pool."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, n)).astype(np.float32)
    x = rng.standard_normal((1, 3, n, n)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Transpose", ["m"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("Concat", ["t", "m"], ["c"], axis=1),
        helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="nearest", nearest_mode="floor",
                         coordinate_transformation_mode="asymmetric"),
    ]
    graph = helper.make_graph(nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
                               helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    m = x @ w
    want = np.concatenate([m.transpose(0, 1, 3, 2), m], 1).repeat(2, 2).repeat(2, 3)
    return model, {"x": x}, want


def _ggml_ops(s) -> set[str]:
    """The ggml ops a session's graph computes (views left out)."""
    from sdrt_ggml.ops._common import ggml_lib

    g = ggml_lib()
    nodes = [g.ggml_graph_node(s._graph, i) for i in range(int(g.ggml_graph_n_nodes(s._graph)))]
    return {g.ggml_op_desc(t).decode() for t in nodes} - {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


def test_session_runs_on_the_pool_and_matches_numpy():
    _ops()
    model, feeds, want = _model()
    for threads in THREADS:
        s = compile_ggml(model, threads=threads)
        assert s.pool_width == (threads if threads > 1 else 0)
        assert _ggml_ops(s) == {"CUSTOM"}  # the GEMM, the transposed copy, the concat, the upscale
        for _ in range(3):
            np.testing.assert_allclose(s.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)
        s.close()


def test_pool_choice():
    """``pool=False`` keeps ggml's threads; "auto" does too where ggml's own heavy ops run
    (``gemm="ggml"``: ggml_mul_mat needs ggml's threads); a bad value is a clear error."""
    _ops()
    model, feeds, want = _model()
    for options, width in (({"pool": False}, 0), ({"gemm": "ggml"}, 0), ({"gemm": "ggml", "pool": True}, 2),
                           ({"pool": "auto"}, 2)):
        s = compile_ggml(model, threads=2, **options)
        assert s.pool_width == width, options
        np.testing.assert_allclose(s.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)
        s.close()
    with pytest.raises(SdrtError, match=r"pool='fast' is not a choice.*pass pool='auto'"):
        compile_ggml(model, pool="fast")


def test_a_one_thread_session_after_a_pooled_one_stays_on_one_thread():
    """The width belongs to the calling thread: each session sets its own before it computes, so a
    session of one thread run after a pooled one on the same thread does not inherit the pool."""
    _ops()
    from sdrt_ggml.native_ops import native_ops

    lib = native_ops().lib
    model, feeds, want = _model()
    pooled, single = compile_ggml(model, threads=2), compile_ggml(model, threads=1)
    before = lib.sdrt_pool_jobs()
    pooled.run(feeds)
    assert lib.sdrt_pool_jobs() - before == 4  # its four ops, each one job
    lib.sdrt_pool_set_width(7)  # what an earlier caller on this thread left behind
    before = lib.sdrt_pool_jobs()
    np.testing.assert_allclose(single.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)
    assert lib.sdrt_pool_jobs() == before
    lib.sdrt_pool_set_width(0)
    pooled.close()
    single.close()


def test_sessions_in_two_python_threads_at_once():
    """One job holds the pool at a time: the other thread's ops run inline, and both stay right."""
    _ops()
    model, feeds, want = _model(64)
    sessions = [compile_ggml(model, threads=2) for _ in range(2)]
    errors: list[BaseException] = []

    def work(s):
        try:
            for _ in range(30):
                np.testing.assert_allclose(s.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in sessions:
        s.close()
    assert not errors, errors[0]


def _child(q) -> None:
    model, feeds, want = _model()
    s = compile_ggml(model, threads=2)
    q.put(bool(np.allclose(s.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)) and s.pool_width == 2)


@pytest.mark.skipif(sys.platform != "linux", reason="fork() start method: Linux only")
def test_forked_child_starts_its_own_workers():
    """A child forked after the parent's pool started has none of its workers: it starts its own."""
    _ops()
    model, feeds, want = _model()
    s = compile_ggml(model, threads=2)
    s.run(feeds)  # the parent's workers exist now
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(60)
    assert p.exitcode == 0 and q.get(timeout=5) is True
    np.testing.assert_allclose(s.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)
    s.close()


_AFFINITY_CHILD = """
import json, os, sys
sys.path.insert(0, {here!r})
from test_ggml_pool import _model, _ops
from ggml_helpers import compile_ggml
_ops()
cpus = sorted(os.sched_getaffinity(0))
model, feeds, want = _model()
s = compile_ggml(model, threads={threads})
import time
t_end = time.perf_counter() + {seconds}
while True:
    s.run(feeds)
    if time.perf_counter() > t_end:
        break
others = [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task") if int(t) != os.getpid()]
print(json.dumps({{"cpus": cpus, "main": sorted(os.sched_getaffinity(0)), "others": others}}))
"""


def _affinities(threads: int, seconds: float, **env: str) -> dict:
    """Run _AFFINITY_CHILD in a fresh process (the pool reads its variables once) with ``env`` added: the CPUs
    its main thread and its other threads may use after ``seconds`` of runs on ``threads`` threads."""
    code = _AFFINITY_CHILD.format(here=str(Path(__file__).parent), threads=threads, seconds=seconds)
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning the pool's workers: Linux with at least 2 CPUs allowed")
@pytest.mark.parametrize(("pin", "threads", "pinned"), [("2", 2, 1), ("1", 3, 1), ("0", 2, 0), ("3", 2, 0)])
def test_workers_pinned_to_the_cpus_after_the_callers_first(pin, threads, pinned):
    """SDRT_GGML_PIN: at 1 and 2, worker i runs only on the (i+1)-th CPU the process may use (a worker
    whose CPU does not exist stays free), and the caller's own affinity is its own again after each run;
    0 pins nothing; 3 (the default) with no hold after a contention (SDRT_GGML_PIN_HOLD_MS=0) pins a
    worker only while its core is contended during long jobs, never for this graph of tiny ops. A fresh
    process each, since the pool reads the variables once."""
    out = _affinities(threads, 0, SDRT_GGML_PIN=pin, SDRT_GGML_PIN_HOLD_MS="0")
    cpus = out["cpus"]
    assert out["main"] == cpus
    assert sum(a == [cpus[1]] for a in out["others"]) == pinned, out
    assert all(a in ([cpus[1]], cpus) for a in out["others"]), out


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning the pool's workers: Linux with at least 2 CPUs allowed")
def test_contended_worker_stays_pinned_for_the_hold_in_graphs_of_tiny_ops():
    """SDRT_GGML_PIN=3 (the default) beside busy programs: a worker whose spin lost its core is pinned to its
    CPU for SDRT_GGML_PIN_HOLD_MS after, though this graph's ops are tiny (the MobileNets' case: a caller and
    a worker sharing one core beside a busy program got 1.0-1.15 cores), and the caller's affinity is its own
    again after each run. A busy process on each CPU makes every thread share a core."""
    cpus = sorted(os.sched_getaffinity(0))
    busy = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{c}}})\nwhile 1: pass"])
            for c in cpus[:16]]
    try:
        out = _affinities(2, 1.0, SDRT_GGML_PIN="3", SDRT_GGML_PIN_HOLD_MS="60000")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert out["main"] == out["cpus"]
    assert sum(a == [cpus[1]] for a in out["others"]) == 1, out


def test_a_pool_variable_that_is_no_whole_number_in_range_is_named_and_dropped(caplog) -> None:
    """native/pool.c reads its variables with strtol: "abc" would be 0 and a huge value would overflow. They are
    checked in Python before the pool starts; a bad one is named and the default used."""
    from sdrt_ggml.native import check_pool_variables

    env = {"SDRT_GGML_SPIN_US": "abc", "SDRT_GGML_TASKS": "0", "SDRT_GGML_WAIT_US": "99999999999999999",
           "SDRT_GGML_YIELD_US": "-1", "SDRT_GGML_PIN": " 2 ", "OTHER": "x",
           "SDRT_GGML_WAIT_PINNED_US": "1_000", "SDRT_GGML_LONG_JOB_US": "\uff15\uff10"}  # strtol reads 1 and 0
    with caplog.at_level("WARNING", logger="sdrt.ggml.native"):
        assert check_pool_variables(env) == ["SDRT_GGML_SPIN_US", "SDRT_GGML_WAIT_US", "SDRT_GGML_TASKS",
                                             "SDRT_GGML_WAIT_PINNED_US", "SDRT_GGML_LONG_JOB_US"]
    assert env == {"SDRT_GGML_YIELD_US": "-1", "SDRT_GGML_PIN": " 2 ", "OTHER": "x"}
    assert "SDRT_GGML_SPIN_US='abc' is not a whole number from 0 to 10000000; using the default 200" in caplog.text
    code = ("import logging, os, sdrt_ggml.native as n; logging.basicConfig(); n.native(); "
            "print(os.environ.get('SDRT_GGML_SPIN_US'))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "SDRT_GGML_SPIN_US": "1e3"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "None" and "SDRT_GGML_SPIN_US='1e3'" in out.stderr
