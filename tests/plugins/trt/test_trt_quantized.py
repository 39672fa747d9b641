"""Weight-only quantized graphs on TensorRT-RTX, with the real library and no GPU: what its ONNX parser keeps
quantized, what each target's builder takes, and engines that hold the small weights (docs/trt.md)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt import quantization as Q
from sdrt.graph import Graph
from sdrt_trt.build import parse
from sdrt_trt.enginefile import read_engine
from sdrt_trt.options import parse_options
from sdrt_trt.prepare import prepare
from sdrt_trt.quantized import for_target

UNET = Path(__file__).resolve().parents[2] / "data" / "pipelines" / "tiny-sd15" / "unet" / "model.onnx"
SHAPES = {"batch": 2, "sequence": 7}
SPECS = {"int8": ("int8", 32), "fp8": ("fp8", 32), "int4": ("int4", 16)}  # the tiny UNet is 8-64 wide
STORED = {"int8": "INT8", "fp8": "FP8", "int4": "INT4"}


@pytest.fixture(scope="module")
def unet() -> Graph:
    return Graph.load(UNET)


def _quantized(graph: Graph, spec: str) -> Graph:
    scheme, block = SPECS[spec]
    return Q.quantize(graph, scheme, block_size=block)


def _dequantize_layers(graph: Graph, precision: str = "fp16") -> Counter:
    """(stored type, scale type) of every IDequantizeLayer of the network TensorRT-RTX's parser builds."""
    import tensorrt_rtx as trt

    _b, net, _p, _l, _w = parse(prepare(graph, None, parse_options({"precision": precision, "shapes": SHAPES})))
    out: Counter = Counter()
    for i in range(net.num_layers):
        layer = net.get_layer(i)
        if layer.type == trt.LayerType.DEQUANTIZE:
            out[(layer.get_input(0).dtype.name, layer.get_input(1).dtype.name)] += 1
    return out


@pytest.mark.parametrize("spec", list(SPECS))
def test_parser_keeps_the_weights_quantized(backend, unet, spec) -> None:  # type: ignore[no-untyped-def]
    q = _quantized(unet, spec)
    kept = Q.for_backend(q, backend)
    found, left = Q.quantized_weights(q), Q.quantized_weights(kept)
    if spec == "int4":  # blocked int4 stays on MatMul/Gemm weights only; the conv weights are float32 again
        assert set(left) == {n for n, v in found.items() if v["ops"] <= {"MatMul", "Gemm"}}
        assert 0 < len(left) < len(found)
    else:
        assert set(left) == set(found)
    for precision, scale in (("fp16", "HALF"), ("fp32", "FLOAT")):
        assert _dequantize_layers(kept, precision) == {(STORED[spec], scale): len(left)}


def test_parser_rejects_int4_on_conv_weights(unet) -> None:  # type: ignore[no-untyped-def]
    """Why the backend declares int4 on MatMul/Gemm only: the whole graph, conv weights included, is refused."""
    from sdrt.errors import UnsupportedGraph

    with pytest.raises(UnsupportedGraph, match="DequantizeLinear") as info:
        _dequantize_layers(_quantized(unet, "int4"))
    assert all("proj_in" in n or "conv" in n or "downsamplers" in n or "upsamplers" in n
               for n in info.value.unsupported["DequantizeLinear"])


@pytest.mark.parametrize(("spec", "target", "kept"), [
    ("int8", "sm75", True), ("int4", "sm75", False), ("int4", "sm80", True),
    ("fp8", "sm86", False), ("fp8", "sm89", True), ("fp8", "sm120", True)])
def test_each_target_keeps_what_its_builder_takes(backend, unet, tmp_path, spec, target, kept) -> None:  # type: ignore[no-untyped-def]
    """The AOT engine builds for the tiny SD 1.5 UNet; a target whose builder refuses the type (int4 below sm80, fp8
    below sm89: 'HW-specific datatypes') gets those weights as float32 instead of a failed build."""
    q = Q.for_backend(_quantized(unet, spec), backend)
    g = for_target(q, target)
    assert bool(Q.quantized_weights(g)) is kept
    assert (g is q) is kept
    meta, engine = read_engine(backend.build(q, None, target, tmp_path / "u.engine", shapes=SHAPES))
    assert meta["target"] == target and len(engine) > 1_000_000


def _wide(seed: int = 0) -> Graph:
    """MatMul and Conv weights of 4.7 MB in float32, little else: the engine's size follows its weights."""
    rng = np.random.default_rng(seed)
    w = {f"mm{i}.weight": rng.standard_normal((512, 512), np.float32) * 0.05 for i in range(4)}
    w["conv.weight"] = rng.standard_normal((64, 64, 3, 3), np.float32) * 0.05
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Reshape", ["c", "shape"], ["h0"], name="flat")]
    for i in range(4):
        nodes.append(helper.make_node("MatMul", [f"h{i}", f"mm{i}.weight"], [f"h{i + 1}"], name=f"mm{i}"))
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits.append(numpy_helper.from_array(np.array([1, 64, 512], np.int64), "shape"))
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 32])],
                              [helper.make_tensor_value_info("h4", TensorProto.FLOAT, [1, 64, 512])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return Graph(model)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_quantized_engines_are_smaller(backend, tmp_path, precision) -> None:  # type: ignore[no-untyped-def]
    """Engines for sm89 hold the stored weights: int8 and fp8 save about 3/4 (fp32) or 1/2 (fp16) of the weight
    bytes, int4 more on the matmuls (its conv weight goes back to float)."""
    g = _wide()
    weights = sum(np.asarray(a).nbytes for a in g.initializer_arrays().values())
    size = {}
    for spec in ("float", "int8", "fp8", "int4"):
        graph = g if spec == "float" else Q.for_backend(Q.quantize(g, spec, keep_layers=()), backend)
        out = backend.build(graph, None, "sm89", tmp_path / f"{spec}.engine", precision=precision)
        size[spec] = out.stat().st_size
    stored = weights if precision == "fp32" else weights // 2
    for spec in ("int8", "fp8"):
        saved = size["float"] - size[spec]
        assert saved > 0.6 * (stored - weights // 4), (spec, size)
    assert size["int4"] < size["int8"], size
