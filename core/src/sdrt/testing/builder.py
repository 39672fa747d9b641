"""A small ONNX graph builder that emits ops the way ``torch.onnx.export`` does at opset 17.

Layers are named like the PyTorch modules they stand for (``mid_block.resnets.0.conv1``),
so the initializer names look like a real checkpoint's keys. Weights are
deterministic random numbers with a fan-in scale, so activations stay O(1) deep
into the network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # what torch.onnx writes for opset 17; onnxruntime reads it everywhere


class Builder:
    """Collects nodes and initializers; every helper returns the name of its output tensor."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count: dict[str, int] = {}
        self._consts: dict[tuple[str, bytes], str] = {}

    # -- plumbing ------------------------------------------------------
    def _uid(self, base: str) -> str:
        n = self._count.get(base, 0)
        self._count[base] = n + 1
        return f"{base}_{n}"

    def input(self, name: str, dtype: int, shape: Sequence[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def output(self, name: str, dtype: int = TensorProto.FLOAT, shape: Sequence[int | str] | None = None) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, dtype, list(shape) if shape is not None else None))

    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None, outputs: int = 1,
           **attrs: object) -> str:
        """Add one node; returns its (first) output name, or a tuple-like string list via ``op_multi``."""
        return self.op_multi(op_type, inputs, name=name, outputs=outputs, **attrs)[0]

    def op_multi(self, op_type: str, inputs: Sequence[str], name: str | None = None, outputs: int = 1,
                 **attrs: object) -> list[str]:
        node_name = name or self._uid(f"/{op_type}")
        outs = [f"{node_name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, **attrs))
        return outs

    def const(self, value: np.ndarray | Sequence[float] | Sequence[int] | float | int, dtype: type = np.int64) -> str:
        """A small constant (shapes, axes, scalars), shared between nodes, as an initializer."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str + str(arr.shape), arr.tobytes())
        if key not in self._consts:
            name = self._uid("onnx::Constant")
            self.inits.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def param(self, name: str, shape: Sequence[int], std: float | None = None, fill: float | None = None) -> str:
        """A named weight: random normal with ``std`` (default 1/sqrt(fan_in)), or a constant ``fill``."""
        if fill is not None:
            arr = np.full(shape, fill, dtype=np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
            scale = std if std is not None else 1.0 / math.sqrt(max(fan_in, 1))
            arr = (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def rename(self, tensor: str, new: str) -> str:
        """Give the node output ``tensor`` the graph-output name ``new`` (as torch names outputs)."""
        for node in reversed(self.nodes):
            for i, out in enumerate(node.output):
                if out == tensor:
                    node.output[i] = new
                    return new
        raise KeyError(tensor)

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                                  producer_name="sdrt-bench")
        return model

    # -- layers (named like torch modules) -----------------------------
    def conv(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
             bias: bool = True, gain: float = 1.0) -> str:
        fan_in = cin // group * k * k
        w = self.param(f"{name}.weight", [cout, cin // group, k, k], std=gain / math.sqrt(fan_in))
        ins = [x, w]
        if bias:
            ins.append(self.param(f"{name}.bias", [cout], std=0.02))
        pad = k // 2
        return self.op("Conv", ins, name=f"/{name}/Conv", dilations=[1, 1], group=group, kernel_shape=[k, k],
                       pads=[pad, pad, pad, pad], strides=[stride, stride])

    def linear(self, x: str, name: str, din: int, dout: int, bias: bool = True) -> str:
        """torch.nn.Linear on a 3-D input: MatMul with the transposed weight, then Add."""
        w = self.param(f"{name}.weight.T", [din, dout], std=1.0 / math.sqrt(din))
        y = self.op("MatMul", [x, w], name=f"/{name}/MatMul")
        if bias:
            y = self.op("Add", [self.param(f"{name}.bias", [dout], std=0.02), y], name=f"/{name}/Add")
        return y

    def gemm(self, x: str, name: str, din: int, dout: int) -> str:
        """torch.nn.Linear on a 2-D input: one Gemm with transB=1."""
        w = self.param(f"{name}.weight", [dout, din], std=1.0 / math.sqrt(din))
        b = self.param(f"{name}.bias", [dout], std=0.02)
        return self.op("Gemm", [x, w, b], name=f"/{name}/Gemm", alpha=1.0, beta=1.0, transB=1)

    def group_norm(self, x: str, name: str, channels: int, groups: int = 32, eps: float = 1e-6) -> str:
        """torch's GroupNorm at opset 17: Reshape -> InstanceNormalization -> Reshape -> Mul -> Add."""
        shape = self.op("Shape", [x], name=f"/{name}/Shape")
        r = self.op("Reshape", [x, self.const([0, groups, -1])], name=f"/{name}/Reshape")
        inorm = self.op("InstanceNormalization", [r, self.const(np.ones(groups), np.float32),
                                                  self.const(np.zeros(groups), np.float32)],
                        name=f"/{name}/InstanceNormalization", epsilon=eps)
        back = self.op("Reshape", [inorm, shape], name=f"/{name}/Reshape_1")
        gamma = self.param(f"{name}.weight", [channels, 1, 1], fill=None, std=0.1)
        self._shift_param(gamma, 1.0)
        y = self.op("Mul", [back, gamma], name=f"/{name}/Mul")
        return self.op("Add", [y, self.param(f"{name}.bias", [channels, 1, 1], std=0.02)], name=f"/{name}/Add")

    def layer_norm(self, x: str, name: str, dim: int, eps: float = 1e-5) -> str:
        gamma = self.param(f"{name}.weight", [dim], std=0.1)
        self._shift_param(gamma, 1.0)
        beta = self.param(f"{name}.bias", [dim], std=0.02)
        return self.op("LayerNormalization", [x, gamma, beta], name=f"/{name}/LayerNormalization", axis=-1,
                       epsilon=eps)

    def _shift_param(self, name: str, offset: float) -> None:
        """Centre a norm scale near 1 (weights like a trained model's, not near 0)."""
        t = self.inits[-1]
        assert t.name == name
        arr = numpy_helper.to_array(t) + np.float32(offset)
        self.inits[-1] = numpy_helper.from_array(arr.astype(np.float32), name)

    def silu(self, x: str, name: str) -> str:
        s = self.op("Sigmoid", [x], name=f"/{name}/Sigmoid")
        return self.op("Mul", [x, s], name=f"/{name}/Mul")

    def gelu_erf(self, x: str, name: str) -> str:
        """torch's exact GELU at opset 17: x * 0.5 * (1 + erf(x / sqrt(2)))."""
        d = self.op("Div", [x, self.const(math.sqrt(2.0), np.float32)], name=f"/{name}/Div")
        e = self.op("Erf", [d], name=f"/{name}/Erf")
        a = self.op("Add", [e, self.const(1.0, np.float32)], name=f"/{name}/Add")
        m = self.op("Mul", [x, a], name=f"/{name}/Mul")
        return self.op("Mul", [m, self.const(0.5, np.float32)], name=f"/{name}/Mul_1")

    def quick_gelu(self, x: str, name: str) -> str:
        """CLIP's quick_gelu: x * sigmoid(1.702 x)."""
        m = self.op("Mul", [x, self.const(1.702, np.float32)], name=f"/{name}/Mul")
        s = self.op("Sigmoid", [m], name=f"/{name}/Sigmoid")
        return self.op("Mul", [x, s], name=f"/{name}/Mul_1")

    def attention(self, q: str, k: str, v: str, name: str, heads: int, dim: int, mask: str | None = None) -> str:
        """Multi-head attention on [B, N, heads*d] tensors: MatMul, scale, Softmax, MatMul."""
        d = dim // heads
        split = self.const([0, -1, heads, d])

        def to_heads(t: str, tag: str, perm: list[int]) -> str:
            r = self.op("Reshape", [t, split], name=f"/{name}/Reshape_{tag}")
            return self.op("Transpose", [r], name=f"/{name}/Transpose_{tag}", perm=perm)

        qh = to_heads(q, "q", [0, 2, 1, 3])
        kh = to_heads(k, "k", [0, 2, 3, 1])
        vh = to_heads(v, "v", [0, 2, 1, 3])
        scores = self.op("MatMul", [qh, kh], name=f"/{name}/MatMul")
        scores = self.op("Mul", [scores, self.const(1.0 / math.sqrt(d), np.float32)], name=f"/{name}/Mul")
        if mask is not None:
            scores = self.op("Add", [scores, mask], name=f"/{name}/Add")
        probs = self.op("Softmax", [scores], name=f"/{name}/Softmax", axis=-1)
        out = self.op("MatMul", [probs, vh], name=f"/{name}/MatMul_1")
        out = self.op("Transpose", [out], name=f"/{name}/Transpose_out", perm=[0, 2, 1, 3])
        return self.op("Reshape", [out, self.const([0, -1, dim])], name=f"/{name}/Reshape_out")
