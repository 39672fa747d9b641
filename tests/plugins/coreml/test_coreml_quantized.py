"""Quantized weights in Core ML packages, built here (no Mac needed): int8 and blocked int4 ``DequantizeLinear``
weights become Core ML's compressed constants (constexpr ops holding the stored values), checked in the saved
program, in the size of its weight file, and by value through MIL's own value inference (docs/coreml.md)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdrt
from sdrt import quantization as Q
from sdrt.graph import Graph
from sdrt_coreml.evaluate import evaluate_package

UNET = Path(__file__).resolve().parents[2] / "data" / "pipelines" / "tiny-sd15" / "unet" / "model.onnx"
SHAPES = {"batch": 2, "sequence": 7}
WEIGHTS = "Data/com.apple.CoreML/weights/weight.bin"


def _constexpr(pkg: Path) -> Counter:
    import coremltools as ct

    spec = ct.utils.load_spec(str(pkg))
    block = next(iter(spec.mlProgram.functions["main"].block_specializations.values()))
    return Counter(op.type for op in block.operations if op.type.startswith("constexpr"))


@pytest.fixture(scope="module")
def unet() -> Graph:
    return Graph.load(UNET)


@pytest.mark.parametrize(("spec", "target", "op", "kept"), [
    ("int8", "macOS14", "constexpr_affine_dequantize", True),
    ("int8", "macOS15", "constexpr_blockwise_shift_scale", True),
    ("int4", "macOS15", "constexpr_blockwise_shift_scale", True),
    ("int4", "macOS14", None, False),  # no blocked 4-bit constant before iOS18/macOS15: float weights
    ("fp8", "macOS15", None, False)])  # Core ML has no 8-bit float type
def test_unet_package_holds_compressed_weights(backend, unet, tmp_path, spec, target, op, kept) -> None:  # type: ignore[no-untyped-def]
    scheme, block = {"int8": ("int8", 32), "int4": ("int4", 16), "fp8": ("fp8", 32)}[spec]
    q = Q.for_backend(Q.quantize(unet, scheme, block_size=block), backend)
    n = len(Q.quantized_weights(q))
    assert bool(n) is (spec != "fp8")  # what sdrt.load and sdrt compile hand the backend
    pkg = backend.build(q, None, target, tmp_path / "q.mlpackage", shapes=SHAPES)
    ref = backend.build(unet, None, target, tmp_path / "f.mlpackage", shapes=SHAPES)
    got, size, full = _constexpr(pkg), (pkg / WEIGHTS).stat().st_size, (ref / WEIGHTS).stat().st_size
    if kept:
        assert got == {op: n}
        # the fp16 package stores 2 bytes a weight; the quantized weights take 1 (int8) or 1/2 (int4)
        assert size < (0.7 if spec == "int8" else 0.6) * full, (size, full)
    else:
        assert not got and size == full


def _linear_model(seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((64, 96), np.float32) * 0.1  # MatMul: (in, out)
    w2 = rng.standard_normal((32, 96), np.float32) * 0.1  # Gemm transB (nn.Linear): (out, in)
    b2 = rng.standard_normal(32).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1, name="fc")]
    g = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                           numpy_helper.from_array(b2, "b2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return Graph(m)


@pytest.mark.parametrize(("scheme", "target", "precision"), [
    ("int8", "macOS14", "fp32"), ("int8", "macOS15", "fp32"), ("int4", "macOS15", "fp32"),
    ("int8", "macOS15", "fp16"), ("int4", "macOS15", "fp16")])
def test_compressed_weights_evaluate_like_the_reference(registry, backend, tmp_path, scheme, target, precision
                                                        ) -> None:  # type: ignore[no-untyped-def]
    """The saved program, read back and evaluated by MIL's value inference (constexpr ops expanded by coremltools'
    own code), against the reference backend on the same quantized graph."""
    q = Q.quantize(_linear_model(), scheme, block_size=32, keep_layers=())
    assert len(Q.quantized_weights(q)) == 2
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    want = sdrt.load(q, backend="reference").run({"x": x})["y"]
    pkg = backend.build(q, None, target, tmp_path / "lin.mlpackage", precision=precision)
    assert sum(_constexpr(pkg).values()) == 2
    got = evaluate_package(pkg, {"x": x})
    assert not got.stand_ins
    tol = 1e-5 if precision == "fp32" else 2e-2  # fp16: activations and scales in half precision
    np.testing.assert_allclose(got.outputs["y"], want, rtol=tol, atol=tol * np.abs(want).max())
