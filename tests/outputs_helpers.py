"""``Session.run(feeds, outputs=[...])`` (plugin API 1.3) checked on one backend's session: the contract every
plugin's session keeps, whether it writes ``_run_outputs`` (reference, OpenVINO, ggml) or answers from ``_run``
(TensorRT-RTX, MIGraphX, Core ML: the base class drops the rest). Shared by the test folders."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from sdrt.errors import InputError

X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)


def two_outputs() -> bytes:
    """``y = relu(x)`` and ``bank = x + x`` (a second output, as a reference unit's bank is beside out_sample)."""
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Add", ["x", "x"], ["bank"])]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y", "bank")]
    g = helper.make_graph(nodes, "two", [info[0]], info[1:])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def check_run_outputs(sess, atol: float = 0.0) -> None:
    """``sess`` compiled from ``two_outputs()``: names, order, duplicates, an empty list, None and bad names."""
    whole = sess.run({"x": X})
    assert sorted(whole) == ["bank", "y"]
    np.testing.assert_allclose(whole["y"], np.maximum(X, 0), atol=atol)
    np.testing.assert_allclose(whole["bank"], X + X, atol=atol)
    got = sess.run({"x": X}, outputs=["bank", "y", "bank"])
    assert list(got) == ["bank", "y"]
    for name in got:
        np.testing.assert_array_equal(got[name], whole[name])
    assert list(sess.run({"x": X}, outputs=("y",))) == ["y"]
    assert sess.run({"x": X}, outputs=[]) == {}
    with pytest.raises(InputError, match="'out_sample'"):
        sess.run({"x": X}, outputs=["out_sample"])
