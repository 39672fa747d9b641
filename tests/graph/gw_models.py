"""Small ONNX graphs for the graph, weights, LoRA and fuzz tests, built with onnx.helper.

``exporter_chain_model`` reproduces what torch.onnx.export emits for a model
exported with dynamic axes: the runtime shape is read with Shape, picked
apart with Gather, re-assembled with Unsqueeze/Concat and fed to Reshape.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]
IR = 8  # what torch exports for opset 17, and what onnxruntime reads


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def linear_model(dtype: type = np.float32) -> onnx.ModelProto:
    """Torch-style export of Linear(8,16) -> Relu -> Linear(16,4):

    - fc1 as Gemm(transB=1) with named ``fc1.weight`` [16, 8] (torch layout) and ``fc1.bias``;
    - fc2 as MatMul with anonymous ``onnx::MatMul_7`` [16, 4] (stored transposed) plus ``fc2.bias``.
    """
    r = _rng(1)
    w1 = r.standard_normal((16, 8)).astype(dtype)
    b1 = r.standard_normal(16).astype(dtype)
    w2t = r.standard_normal((16, 4)).astype(dtype)
    b2 = r.standard_normal(4).astype(dtype)
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], name="/fc1/Gemm", transB=1),
            helper.make_node("Relu", ["h"], ["hr"], name="/act/Relu"),
            helper.make_node("MatMul", ["hr", "onnx::MatMul_7"], ["m"], name="/fc2/MatMul"),
            helper.make_node("Add", ["m", "fc2.bias"], ["y"], name="/fc2/Add"),
        ],
        "linear",
        [helper.make_tensor_value_info("x", et, ["batch", 8])],
        [helper.make_tensor_value_info("y", et, ["batch", 4])],
        [numpy_helper.from_array(w1, "fc1.weight"), numpy_helper.from_array(b1, "fc1.bias"),
         numpy_helper.from_array(w2t, "onnx::MatMul_7"), numpy_helper.from_array(b2, "fc2.bias")],
    )
    m = helper.make_model(g, opset_imports=OPSET, ir_version=IR)
    onnx.checker.check_model(m)
    return m


def conv_model() -> onnx.ModelProto:
    """Conv 3x3 (``conv_in.weight`` [8,3,3,3]) -> Conv 1x1 (``proj_in.weight`` [8,8,1,1])."""
    r = _rng(2)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "conv_in.weight", "conv_in.bias"], ["c"], name="/conv_in/Conv",
                             pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["c", "proj_in.weight", "proj_in.bias"], ["y"], name="/proj_in/Conv"),
        ],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, "h", "w"])],
        [numpy_helper.from_array(r.standard_normal((8, 3, 3, 3)).astype(np.float32), "conv_in.weight"),
         numpy_helper.from_array(r.standard_normal(8).astype(np.float32), "conv_in.bias"),
         numpy_helper.from_array(r.standard_normal((8, 8, 1, 1)).astype(np.float32), "proj_in.weight"),
         numpy_helper.from_array(r.standard_normal(8).astype(np.float32), "proj_in.bias")],
    )
    m = helper.make_model(g, opset_imports=OPSET, ir_version=IR)
    onnx.checker.check_model(m)
    return m


def exporter_chain_model() -> onnx.ModelProto:
    """x: float32[batch, seq, 8] -> reshape to [batch, seq*8] via the exporter's Shape chain -> MatMul.

    Also carries a dead branch (Shape -> Cast nobody reads) and a Constant node.
    """
    r = _rng(3)
    nodes = [
        helper.make_node("Shape", ["x"], ["/Shape_output_0"], name="/Shape"),
        helper.make_node("Constant", [], ["/Constant_output_0"], name="/Constant",
                         value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["/Shape_output_0", "/Constant_output_0"], ["/Gather_output_0"], name="/Gather",
                         axis=0),
        helper.make_node("Unsqueeze", ["/Gather_output_0", "axes0"], ["/Unsqueeze_output_0"], name="/Unsqueeze"),
        helper.make_node("Concat", ["/Unsqueeze_output_0", "minus_one"], ["/Concat_output_0"], name="/Concat",
                         axis=0),
        helper.make_node("Reshape", ["x", "/Concat_output_0"], ["/Reshape_output_0"], name="/Reshape"),
        helper.make_node("MatMul", ["/Reshape_output_0", "head.weight_t"], ["y"], name="/head/MatMul"),
        # dead branch: exporters leave these behind
        helper.make_node("Shape", ["x"], ["/Shape_1_output_0"], name="/Shape_1"),
        helper.make_node("Cast", ["/Shape_1_output_0"], ["/Cast_output_0"], name="/Cast", to=TensorProto.FLOAT),
    ]
    g = helper.make_graph(
        nodes,
        "exporter_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes0"),
         numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
         numpy_helper.from_array(r.standard_normal((24, 5)).astype(np.float32), "head.weight_t")],
    )
    m = helper.make_model(g, opset_imports=OPSET, ir_version=IR)
    onnx.checker.check_model(m)
    return m


def external_tensor(name: str, elem_type: int, dims: list[int], location: str, offset: int, length: int):
    """A TensorProto whose bytes live in an external file."""
    t = TensorProto()
    t.name, t.data_type = name, elem_type
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def save_external(model: onnx.ModelProto, path: Path, location: str = "weights.bin") -> Path:
    """Save with every initializer in one external-data file next to the model."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    return path


def is_mapped(arr) -> bool:
    """True when the array's memory is a file mapping (nothing was copied)."""
    import mmap

    a = arr
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a = getattr(a, "base", None)
    return False


def run_reference(model_or_graph, feeds: dict) -> dict:
    from onnx.reference import ReferenceEvaluator

    model = getattr(model_or_graph, "model", model_or_graph)
    return dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, feeds)))
