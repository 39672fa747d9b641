"""``Session.run(feeds, outputs=[...])`` (plugin API 1.3): only the outputs named come back, with the values a
whole run gives; a backend whose session writes ``_run_outputs`` leaves the others uncopied, one that writes only
``_run`` still answers (the base class drops the rest)."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import register
from onnx import TensorProto, helper

import sdrt
from sdrt import Backend, Device, Session
from sdrt.errors import InputError
from sdrt.graph import Graph

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def two_outputs() -> bytes:
    """``y = relu(x) * 2`` and ``bank = x`` (an Identity, as a reference unit's bank output is)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "r"], ["y"]),
             helper.make_node("Identity", ["x"], ["bank"])]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y", "bank")]
    g = helper.make_graph(nodes, "two", [info[0]], info[1:])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_a_session_returns_the_outputs_asked_for(backend):
    register(backend)
    with sdrt.load(two_outputs(), backend=backend) as sess:
        whole = sess.run({"x": X})
        assert list(whole) == ["y", "bank"]
        got = sess.run({"x": X}, outputs=["y"])
        assert list(got) == ["y"]
        np.testing.assert_array_equal(got["y"], whole["y"])
        got = sess.run({"x": X}, outputs=("bank", "y"))
        assert list(got) == ["bank", "y"]
        np.testing.assert_array_equal(got["bank"], X)
        assert sess.run({"x": X}, outputs=[]) == {}
        with pytest.raises(InputError) as err:
            sess.run({"x": X}, outputs=["out_sample"])
        assert "'out_sample'" in err.value.what and "y, bank" in err.value.fix and "\n" not in str(err.value)
        with pytest.raises(InputError, match="list of output names"):
            sess.run({"x": X}, outputs="y")


class _WholeSession(Session):
    """A third-party session of plugin API 1.2: ``_run`` only."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph.inputs, graph.outputs, graph=graph)
        self.calls = 0

    def _run(self, feeds):
        self.calls += 1
        x = feeds["x"]
        return {"y": np.maximum(x, 0) * 2, "bank": x.copy()}


class _WholeBackend(Backend):
    name = "whole"
    api_version = (1, 2)

    def devices(self):
        return [Device("whole", "CPU")]

    def _compile(self, graph, arrays, device, opts):
        return _WholeSession(graph)


def test_a_session_without_run_outputs_answers_from_its_whole_run():
    be = _WholeBackend()
    import onnx

    sess = be.compile(Graph(onnx.load_model_from_string(two_outputs())), None, be.devices()[0])
    got = sess.run({"x": X}, outputs=["y"])
    assert list(got) == ["y"] and sess.calls == 1
    np.testing.assert_array_equal(got["y"], np.maximum(X, 0) * 2)


@pytest.mark.parametrize("names", [[["y"]], [{"y": 1}], ["y", b"bank"], [0]])
def test_outputs_that_are_no_names_are_one_line_input_errors(names):
    """Each entry of ``outputs=`` must be a name (str): a list or dict inside was a TypeError traceback from the
    set lookup (unhashable), bytes and numbers read as unknown names."""
    register("reference")
    with sdrt.load(two_outputs(), backend="reference") as sess:
        with pytest.raises(InputError) as err:
            sess.run({"x": X}, outputs=names)
    assert "output names" in err.value.what and "\n" not in str(err.value)


def test_the_keys_of_a_mapping_name_outputs_too():
    """``outputs=whole.keys()`` (a dict's keys: a set view, ordered) is a list of names as much as a list is."""
    register("reference")
    with sdrt.load(two_outputs(), backend="reference") as sess:
        whole = sess.run({"x": X})
        got = sess.run({"x": X}, outputs={"bank": None, "y": None}.keys())
    assert list(got) == ["bank", "y"]
    np.testing.assert_array_equal(got["y"], whole["y"])


class _DefaultSession(Session):
    """A session of plugin API 1.2 as TensorRT-RTX's, MIGraphX's and Core ML's are: ``_run`` alone, whose keys
    come in the graph's order; the base class answers ``outputs=``."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph.inputs, graph.outputs, graph=graph)

    def _run(self, feeds):
        x = feeds["x"]
        return {"y": np.maximum(x, 0), "bank": x + x}


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml", "default"])
def test_the_shared_contract_check_on_every_session_kind_here(backend):
    """tests/outputs_helpers.check_run_outputs, which the TensorRT-RTX, MIGraphX and Core ML folders run on their
    own sessions where their hardware is, on the sessions this machine has and on the default path theirs take."""
    import onnx
    from outputs_helpers import check_run_outputs
    from outputs_helpers import two_outputs as graph_bytes

    if backend == "default":
        sess = _DefaultSession(Graph(onnx.load_model_from_string(graph_bytes())))
    else:
        register(backend)
        sess = sdrt.load(graph_bytes(), backend=backend)
    with sess:
        check_run_outputs(sess, atol=1e-6)
