"""Helpers for the Core ML plugin tests: small ONNX graphs, onnxruntime references, MIL evaluation.

coremltools is installed by the tests session (it installs from PyPI on Linux), so
nothing here is skipped for a missing coremltools: a broken install fails loudly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

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


def graph_of(model: onnx.ModelProto) -> Any:
    from sdrt.graph import Graph

    return Graph.load(model.SerializeToString())


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def ort_intermediates(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output of ``model`` as onnxruntime computes it (graph optimizations off)."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for name in node.output:
            if name and name not in have:
                m.graph.output.append(helper.make_empty_tensor_value_info(name))
                have.add(name)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def mil_eval(model: onnx.ModelProto, feeds: dict[str, np.ndarray], target: str = "macOS14",
             reference: dict[str, np.ndarray] | None = None) -> Any:
    from sdrt_coreml.evaluate import evaluate

    return evaluate(graph_of(model), feeds, target=target, reference=reference)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], target: str = "macOS14", rtol: float = 1e-4,
          atol: float = 1e-5) -> Any:
    """Evaluate the lowering by MIL value inference and compare every output with onnxruntime."""
    ev = mil_eval(model, feeds, target)
    want = run_ort(model, feeds)
    for k, w in want.items():
        got = ev.outputs[k]
        assert got is not None, f"{k}: no value (MIL ops without value inference: {ev.stand_ins})"
        assert got.shape == w.shape, (k, got.shape, w.shape)
        np.testing.assert_allclose(got.astype(w.dtype), w, rtol=rtol, atol=atol, err_msg=k)
    return ev
