from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def make_affine_model(path=None) -> onnx.ModelProto:
    """y = relu(x @ W + b) with x: float32[batch, 4]; W, b as initializers."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal((3,)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
            helper.make_node("Add", ["xw", "b"], ["pre"], name="add"),
            helper.make_node("Relu", ["pre"], ["y"], name="relu"),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, str(path))
    return model


def affine_reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return np.maximum(x @ inits["W"] + inits["b"], 0)


@pytest.fixture
def affine_path(tmp_path):
    path = tmp_path / "affine.onnx"
    make_affine_model(path)
    return path


@pytest.fixture
def affine():
    """(model, reference function) for the affine model."""
    model = make_affine_model()
    return model, lambda x: affine_reference(model, x)
