"""Small ONNX models for the OpenVINO backend tests, built with onnx.helper."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR = 8


def _model(nodes, inputs, outputs, inits, opsets=(("", 17),)) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=IR)


def conv_model(seed: int = 0, batch: int | str = 1, dims: list | None = None) -> onnx.ModelProto:
    """x[batch,3,8,8] -> Conv(3->4, 3x3) -> Relu -> y; two named initializers."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or [batch, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8] if not dims else None)],
                  [numpy_helper.from_array(w, "conv.weight"), numpy_helper.from_array(b, "conv.bias")])


def two_output_model() -> onnx.ModelProto:
    """x -> (x @ W, reshape with a shape initializer) to test outputs and non-float initializers."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 5), dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "fc.weight"], ["mm"], name="fc"),
             helper.make_node("Reshape", ["mm", "shape"], ["flat"], name="flatten")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                  [helper.make_tensor_value_info("mm", TensorProto.FLOAT, [2, 5]),
                   helper.make_tensor_value_info("flat", TensorProto.FLOAT, [10])],
                  [numpy_helper.from_array(w, "fc.weight"), numpy_helper.from_array(np.array([-1], np.int64), "shape")])


def unsupported_model() -> onnx.ModelProto:
    """A graph with two ops OpenVINO cannot convert (an unknown standard op and a custom-domain op)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu0"),
             helper.make_node("Frobnicate", ["a"], ["b"], name="frob0"),
             helper.make_node("Frobnicate", ["b"], ["c"], name="frob1"),
             helper.make_node("Twist", ["c"], ["y"], name="twist0", domain="com.example")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [],
                  opsets=(("", 17), ("com.example", 1)))


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
