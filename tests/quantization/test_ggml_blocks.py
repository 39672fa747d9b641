"""ggml runs int8/int4 matmul weights as its own Q8_0/Q4_0 blocks: the packing is exact (checked with
ggml's C dequantizer), and a quantized UNet runs through ggml's quantized matmuls."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import pytest

import sdrt
from sdrt import quantization as Q

ggml = pytest.importorskip("ggml", reason="ggml-python is not installed")
quant = pytest.importorskip("sdrt_ggml.quant", reason="sdrt-ggml is not installed")


def _ggml_to_float(kind: str, rows: np.ndarray, n: int, k: int) -> np.ndarray:
    t = getattr(ggml, f"GGML_TYPE_{kind}")
    out = np.zeros(n * k, np.float32)
    src = np.ascontiguousarray(rows)
    ggml.ggml_get_type_traits(t).contents.to_float(src.ctypes.data_as(ctypes.c_void_p),
                                                   out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n * k)
    return out.reshape(n, k)


def _dql(axis: int, block: int = 0):
    attrs = {"axis": axis, **({"block_size": block} if block else {})}
    return onnx.helper.make_node("DequantizeLinear", ["q", "s"], ["w"], name="dq", **attrs)


def _reference(node, ins):  # onnx's reference op: the independent value
    from sdrt.lowering import fold_node

    return fold_node(node, ins, {"": 21})[0]


@pytest.mark.parametrize("scheme,block,trans", [("int8", 0, False), ("int8", 0, True), ("int4", 32, False),
                                                ("int4", 64, False), ("int4", 128, True)])
def test_blocks_hold_the_dequantized_values_exactly(scheme, block, trans):
    k, n = 256, 24
    w = np.random.default_rng(3).standard_normal((n, k) if trans else (k, n)).astype(np.float32)
    k_axis, n_axis = (1, 0) if trans else (0, 1)
    q, s = Q.quantize_array(w, scheme, axis=n_axis, red=k_axis, block_size=block or 32)
    node = _dql(k_axis if block else n_axis, block)
    values = _reference(node, [q, s])
    bm = quant.fold(node, [q, s])
    assert bm.ggml_type == {"int8": "Q8_0", "int4": "Q4_0"}[scheme]
    assert bm.shape == values.shape and bm.transposed == (k_axis == 0)
    got = _ggml_to_float(bm.ggml_type, bm.data, n, k)  # ggml's own C dequantizer
    np.testing.assert_array_equal(got, values if trans else values.T)
    np.testing.assert_array_equal(bm.dequantize(), values)  # what other ops read


def test_what_does_not_map_folds_to_the_reference_values():
    rng = np.random.default_rng(4)
    q, s = Q.quantize_array(rng.standard_normal((48, 8)).astype(np.float32), "int4", axis=1, red=0, block_size=16)
    cases = [
        (_dql(0, 16), [q, s]),  # blocks of 16: not ggml's 32
        (_dql(1), [rng.integers(-127, 127, (4, 40), dtype=np.int8), np.full(40, 0.1, np.float32)]),  # K = 4
        (_dql(1), [rng.integers(0, 255, (64, 8), dtype=np.uint8), np.full(8, 0.3, np.float32),
                   np.full(8, 128, np.uint8)]),  # uint8 with a zero point
        (_dql(1), [rng.integers(-127, 127, (64, 8), dtype=np.int8), np.float32(0.25)]),  # per tensor
        (_dql(0), [rng.integers(-127, 127, (8, 3, 3, 3), dtype=np.int8), np.linspace(0.1, 1, 8, dtype=np.float32)]),
    ]
    for node, ins in cases:
        got = quant.fold(node, ins)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_array_equal(got, _reference(node, ins))


@pytest.mark.parametrize("transposed", [False, True], ids=["in-out", "out-in-transposed"])
@pytest.mark.parametrize("scheme,kind", [("int8", "mul_mat_Q8_0"), ("int4", "mul_mat_Q4_0")])
def test_quantized_unet_runs_on_ggml_block_matmuls(backends, unet, unet_transposed, unet_feeds, scheme, kind,
                                                   transposed):
    """Its weights stored [in, out] (an Optimum export) or [out, in] behind a Transpose (a single file bound onto
    sdrt's shipped graphs): both run on ggml's quantized mul_mat."""
    if "ggml" not in backends.backends:
        pytest.skip("sdrt-ggml is not installed")
    unet = unet_transposed if transposed else unet
    ref = sdrt.load(unet, backend="reference", quantize=scheme).run(unet_feeds)
    s = sdrt.load(unet, backend="ggml", quantize=scheme, shapes={"batch": 1, "sequence": 7})
    assert s.impl_hits.get(kind, 0) >= 10
    for name, v in s.run(unet_feeds).items():
        # ggml quantizes the activations to 8-bit blocks for these matmuls (as llama.cpp does)
        assert np.abs(v - ref[name]).max() <= 3e-2 * np.abs(ref[name]).max()
