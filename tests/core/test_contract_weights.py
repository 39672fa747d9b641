"""The weights half of the contract, seen from a third-party backend written from plugins/README.md.

The backend below writes only ``devices``, ``compile``, ``_run`` and ``_update_weights``; the core
resolves a stripped graph's weights, key-mapped weights and checks every update.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdrt
from sdrt import Backend, Device, Session
from sdrt.errors import SdrtError, UnsupportedGraph, WeightsError
from sdrt.graph import Graph
from sdrt.keymap import KeyMap
from sdrt.weights import Weights

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
B = np.array([1, -1, 2, -2], np.float32)
X = np.ones((2, 3), np.float32)


def linear_model() -> bytes:
    """y = x @ W + b, as torch exports a Linear: the weight is an anonymous 'onnx::MatMul_7'."""
    nodes = [helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["h"], name="/fc/MatMul"),
             helper.make_node("Add", ["h", "fc.bias"], ["y"], name="/fc/Add")]
    g = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          [numpy_helper.from_array(W, "onnx::MatMul_7"), numpy_helper.from_array(B, "fc.bias")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


class NumpySession(Session):
    def __init__(self, graph: Graph, arrays: dict[str, np.ndarray]) -> None:
        super().__init__(graph.inputs, graph.outputs, graph=graph)
        self.values = dict(arrays)
        self.updates: list[set[str]] = []

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        env = {**self.values, **feeds}
        assert self.graph is not None
        for node in self.graph.model.graph.node:
            a, b = (env[i] for i in node.input)
            env[node.output[0]] = a @ b if node.op_type == "MatMul" else a + b
        return {o.name: env[o.name] for o in self.outputs}

    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        self.updates.append(set(arrays))
        self.values.update(arrays)


class NumpyBackend(Backend):
    """What a third party writes: devices, compile, and a Session with _run and _update_weights."""

    name = "numpy"
    priority = -1

    def devices(self) -> list[Device]:
        return [Device(backend=self.name, id="CPU")]

    def compile(self, graph: Graph, weights: Any, device: Device, **options: Any) -> Session:
        odd = {n.op_type: [n.name] for n in graph.model.graph.node if n.op_type not in ("MatMul", "Add")}
        if odd:
            raise UnsupportedGraph("numpy runs MatMul and Add only", unsupported=odd, where=graph.name,
                                   fix="use another backend")
        return NumpySession(graph, sdrt.resolve_weights(graph, weights))


class NoUpdateSession(Session):
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}


@pytest.fixture
def numpy_backend(inline_plugin):
    class Plugin:
        @sdrt.hookimpl
        def register_backends(self, register):
            register(NumpyBackend())

    inline_plugin(Plugin(), "numpy")
    return "numpy"


def test_a_stripped_graph_runs_with_its_weights_without_backend_code_for_it(numpy_backend, tmp_path):
    (tmp_path / "fc.onnx").write_bytes(linear_model())
    res = Graph.load(tmp_path / "fc.onnx").strip(tmp_path / "out" / "fc.onnx")
    with sdrt.load(res.graph_path, backend="numpy") as s:
        np.testing.assert_allclose(s.run({"x": X})["y"], X @ W + B)


def test_key_mapped_weights_at_compile_and_in_update(numpy_backend, tmp_path):
    ckpt = {"model.fc.weight_t": W * 2, "model.fc.bias": B * 2}
    mapping = KeyMap(explicit={"model.fc.weight_t": "onnx::MatMul_7"}, strip_prefix="model.")
    with sdrt.load(linear_model(), weights=Weights.from_arrays(ckpt, mapping), backend="numpy") as s:
        np.testing.assert_allclose(s.run({"x": X})["y"], X @ (W * 2) + B * 2)
        s.update_weights(Weights.from_arrays({"model.fc.weight_t": W * 3, "model.fc.bias": B}, mapping))
        assert s.updates == [{"onnx::MatMul_7", "fc.bias"}]
        np.testing.assert_allclose(s.run({"x": X})["y"], X @ (W * 3) + B)


def test_update_weights_checks_everything_before_the_backend_sees_it(numpy_backend):
    with sdrt.load(linear_model(), backend="numpy") as s:
        bad = Weights.from_arrays({"onnx::MatMul_7": W[:2], "extra": B})
        with pytest.raises(WeightsError) as e:
            s.update_weights(bad)
        msg = str(e.value)
        assert "1 missing" in msg and "fc.bias" in msg and "1 unexpected" in msg and "extra" in msg
        assert "onnx::MatMul_7: weights float32[2, 4] vs graph float32[3, 4]" in msg
        assert s.updates == []
        with pytest.raises(WeightsError, match="takes sdrt.Weights, got dict.*Weights.from_arrays"):
            s.update_weights({"onnx::MatMul_7": W, "fc.bias": B})
        assert s.updates == []


def test_update_weights_on_a_closed_session(numpy_backend):
    s = sdrt.load(linear_model(), backend="numpy")
    s.close()
    assert s.closed
    with pytest.raises(SdrtError, match=r"closed.*NumpySession.update_weights"):
        s.update_weights(Weights.from_arrays({"onnx::MatMul_7": W, "fc.bias": B}))


def test_the_default_update_weights_fails_loudly():
    graph = Graph.load(linear_model())
    s = NoUpdateSession(graph.inputs, graph.outputs, graph=graph)
    with pytest.raises(SdrtError, match="NoUpdateSession cannot update weights in place.*sdrt.load"):
        s.update_weights(Weights.from_graph(graph))


def test_a_session_built_without_its_graph_says_so():
    graph = Graph.load(linear_model())
    s = NoUpdateSession(graph.inputs, graph.outputs)
    with pytest.raises(SdrtError, match="built without its graph.*pass graph="):
        s.update_weights(Weights.from_graph(graph))
