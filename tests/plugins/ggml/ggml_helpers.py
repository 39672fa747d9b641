"""Helpers for the ggml plugin tests: build small ONNX graphs, run them on ggml and onnxruntime."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ggml  # noqa: F401 - the tests session installs sdrt-ggml: a missing ggml must fail, not skip
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make_model(nodes: Sequence[Any], inputs: dict[str, tuple[tuple[int, ...], int]],
               outputs: dict[str, tuple[Any, int]], inits: dict[str, np.ndarray] | None = None,
               opset: int = OPSET) -> onnx.ModelProto:
    """A model from nodes; ``inputs``/``outputs`` map name -> (shape, TensorProto type)."""
    graph = helper.make_graph(
        list(nodes), "g",
        [helper.make_tensor_value_info(n, t, list(s)) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(n, t, None if s is None else list(s)) for n, (s, t) in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def compile_ggml(model: onnx.ModelProto, weights: Any = None, **options: Any) -> Any:
    """A ggml session for ``model`` on the CPU device (a GPU build lists its GPUs first)."""
    from sdrt.graph import Graph
    from sdrt_ggml import GgmlBackend

    be = GgmlBackend()
    return be.compile(Graph(model), weights, next(d for d in be.devices() if d.kind == "cpu"), **options)


def run_ggml(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **options: Any) -> dict[str, np.ndarray]:
    with compile_ggml(model, **options) as s:
        return s.run(feeds)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-4, atol: float = 1e-5,
          **options: Any) -> dict[str, np.ndarray]:
    got = run_ggml(model, feeds, **options)
    want = run_ort(model, feeds)
    for k in want:
        assert got[k].shape == want[k].shape, (k, got[k].shape, want[k].shape)
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)
    return got


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


F = TensorProto.FLOAT
I64 = TensorProto.INT64


def run_native_graph(build: Any, threads: int, via: str = "ggml") -> np.ndarray:
    """Build tensors with ``build(g, ctx, put)`` (returning the output tensor and its numpy shape), compute
    it on ``threads`` threads and return the output: on ggml's own threads (``via="ggml"``), or with
    ggml on one thread and sdrt-ggml's ops spread over their pool (``via="pool"``, as a session runs)."""
    import ctypes

    from sdrt_ggml.native import native
    from sdrt_ggml.ops._common import ggml_lib

    g = ggml_lib()
    ctx = g.ggml_init(g.ggml_init_params(mem_size=64 << 20, mem_buffer=None, no_alloc=False))

    def put(arr):
        arr = np.ascontiguousarray(arr, np.float32)
        t = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, *(list(reversed(arr.shape)) + [1] * (4 - arr.ndim)))
        ctypes.memmove(g.ggml_get_data(t), arr.ctypes.data, arr.nbytes)
        return t

    lib = native().lib if via == "pool" else None
    try:
        out, shape = build(g, ctx, put)
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, out)
        if lib is not None:
            lib.sdrt_pool_set_width(threads)
        try:
            g.ggml_graph_compute_with_ctx(ctx, gf, 1 if lib is not None else threads)
        finally:
            if lib is not None:
                lib.sdrt_pool_set_width(0)
        ptr = ctypes.cast(g.ggml_get_data(out), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(int(np.prod(shape)),)).reshape(shape).copy()
    finally:
        g.ggml_free(ctx)
