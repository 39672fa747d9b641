"""Small ONNX models for the MIGraphX backend tests, built with onnx.helper."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=8)


def conv_model(seed: int = 0, batch: int | str = 1) -> onnx.ModelProto:
    """x[batch,3,8,8] -> Conv(3->4, 3x3) -> Relu -> y; two named initializers (432 and 16 bytes)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8])],
                 [numpy_helper.from_array(w, "conv.weight"), numpy_helper.from_array(b, "conv.bias")])


def mlp_model(seed: int = 0) -> onnx.ModelProto:
    """x[2,64] -> MatMul(64x256) -> Add -> Tanh -> MatMul(256x8) -> y; weights above the inline size."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 256), dtype=np.float32) * 0.1, "fc1.weight"),
             numpy_helper.from_array(rng.standard_normal(256, dtype=np.float32), "fc1.bias"),
             numpy_helper.from_array(rng.standard_normal((256, 8), dtype=np.float32) * 0.1, "fc2.weight"),
             numpy_helper.from_array(np.array([2, 8], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "fc1.bias"], ["hb"], name="fc1_bias"),
             helper.make_node("Tanh", ["hb"], ["t"], name="act"),
             helper.make_node("MatMul", ["t", "fc2.weight"], ["o"], name="fc2"),
             helper.make_node("Reshape", ["o", "shape"], ["y"], name="reshape")]
    return model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)


def unsupported_model() -> onnx.ModelProto:
    """Two op types MIGraphX has no parser for, one of them twice, and one inside an If branch."""
    branch = helper.make_graph([helper.make_node("Frobnicate", ["a"], ["z"], name="in_branch")], "then", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["w"], name="else_id")], "else", [],
                              [helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu0"),
             helper.make_node("Frobnicate", ["a"], ["b"], name="frob0"),
             helper.make_node("Frobnicate", ["b"], ["c"], name="frob1"),
             helper.make_node("Twist", ["c"], ["d"], name="twist0", domain="com.example"),
             helper.make_node("If", ["cond"], ["y"], name="if0", then_branch=branch, else_branch=other)]
    return model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                  helper.make_tensor_value_info("d", TensorProto.FLOAT, [2, 3])],
                 opsets=(("", 17), ("com.example", 1)))


def ort_run(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
