"""A bf16 compile on the CPU binds the float32 weights (no 16-bit copy first), and its cache entry is written from
the bf16 twin (``sdrt_openvino.bf16``): half the size, and importing it gives the outputs of the compile bit for
bit. References: ml_dtypes' bfloat16 for the rounding, OpenVINO's own float32-weights compile for the outputs."""

from __future__ import annotations

import numpy as np
import pytest

import sdrt

pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")


def _native_bf16() -> bool:
    import openvino as ov

    return "BF16" in {str(c).upper() for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")}


needs_bf16 = pytest.mark.skipif(not _native_bf16(), reason="this CPU has no native bf16 (AVX-512-BF16 or AMX): "
                                                           "OpenVINO computes a bf16 compile in float32 here")


def _conv_matmul_model(seed: int = 0) -> bytes:
    """x[1,8,8,8] -> Conv(16x8x3x3) + bias -> Relu -> Flatten -> MatMul(1024x64) + bias -> y[1,64]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3), dtype=np.float32) * 0.2, "cw"),
             numpy_helper.from_array(rng.standard_normal(16, dtype=np.float32), "cb"),
             numpy_helper.from_array(rng.standard_normal((1024, 64), dtype=np.float32) * 0.05, "mw"),
             numpy_helper.from_array(rng.standard_normal(64, dtype=np.float32), "mb")]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"], axis=1),
             helper.make_node("MatMul", ["f", "mw"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "mb"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _linear_model(seed: int = 0) -> bytes:
    """x[1,8,8,8] -> Flatten -> MatMul(Transpose(lw[64x512])) + bias -> y[1,64], and z = Transpose(sw) * y: a linear
    weight in torch's [out, in] layout, as sdrt's shipped weight-free graphs bind a checkpoint's (160 of the SD 1.5
    UNet's weights), and a transposed constant that is no weight (read by a Mul)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 512), dtype=np.float32) * 0.05, "lw"),
             numpy_helper.from_array(rng.standard_normal(64, dtype=np.float32), "lb"),
             numpy_helper.from_array(rng.standard_normal((64, 32), dtype=np.float32), "sw")]
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1),
             helper.make_node("Transpose", ["lw"], ["lwt"], perm=[1, 0]),
             helper.make_node("MatMul", ["f", "lwt"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "lb"], ["y"]),
             helper.make_node("Transpose", ["sw"], ["swt"], perm=[1, 0]),
             helper.make_node("Mul", ["swt", "y"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [32, 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


X = np.random.default_rng(3).standard_normal((1, 8, 8, 8), dtype=np.float32)


def _entries(tmp_path):
    found = (tmp_path / "cache" / "compiled" / "openvino").glob("*/model.blob")
    return sorted(p for p in found if not p.parent.name.startswith("."))


def test_rounding_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from sdrt_openvino import bf16

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(300_000).astype(np.float32) * 10.0 ** rng.integers(-40, 38, 300_000),
                        np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 3.4028235e38, -3.4028235e38,
                                  1e-45, 1.1754942e-38], np.float32)]).astype(np.float32)
    bits = x.view(np.uint32)
    bits[:1000] = (bits[:1000] & 0xFFFF0000) | 0x8000  # exact ties, odd and even
    out = np.empty(x.size, np.uint16)
    bf16.round_to_bf16(x, out)
    want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(out[finite], want[finite])
    assert np.isnan(out[~finite].view(ml_dtypes.bfloat16).astype(np.float32)).all()


def test_the_twin_rounds_convolution_and_matmul_weights_only(ov_registry):
    import openvino as ov

    from sdrt.graph import Graph
    from sdrt.weights.resolve import resolve_weights
    from sdrt_openvino import bf16, convert

    graph = Graph.load(_conv_matmul_model())
    conv = convert.read(ov.Core(), graph, resolve_weights(graph, None))

    def consts(model):
        return {op.get_friendly_name(): op.get_element_type().get_type_name() for op in model.get_ordered_ops()
                if op.get_type_name() == "Constant" and op.get_friendly_name() in ("cw", "cb", "mw", "mb")}

    twin = bf16.twin(conv.model)
    assert consts(twin) == {"cw": "bf16", "cb": "f32", "mw": "bf16", "mb": "f32"}
    assert consts(conv.model) == {"cw": "f32", "cb": "f32", "mw": "f32", "mb": "f32"}, "the model is left as is"


def test_the_twin_rounds_a_transposed_linear_weight(ov_registry):
    import openvino as ov

    from sdrt.graph import Graph
    from sdrt.weights.resolve import resolve_weights
    from sdrt_openvino import bf16, convert

    graph = Graph.load(_linear_model())
    conv = convert.read(ov.Core(), graph, resolve_weights(graph, None))
    twin = bf16.twin(conv.model)
    got = {op.get_friendly_name(): op.get_element_type().get_type_name() for op in twin.get_ordered_ops()
           if op.get_type_name() == "Constant" and op.get_friendly_name() in ("lw", "lb", "sw")}
    assert got == {"lw": "bf16", "lb": "f32", "sw": "f32"}


@needs_bf16
@pytest.mark.parametrize("build", [_conv_matmul_model, _linear_model], ids=["conv-matmul", "transposed-linear"])
def test_a_jobs_bf16_entry_imports_to_the_compiles_outputs_bit_for_bit(ov_registry, tmp_path, build):
    """Inside a job a bf16 compile binds the float32 weights; the entry stored after the job holds the bf16 twin,
    about half the float32 entry, and a later load imports it to exactly the outputs of the compile."""
    from sdrt.cache import deferred, wait_for_stores

    model = tmp_path / "cm.onnx"  # a file: its weights are mapped
    model.write_bytes(build())
    sdrt.load(model, backend="openvino", device="CPU", precision="fp32")
    (f32_entry,) = _entries(tmp_path)
    with deferred.hold():
        cold = sdrt.load(model, backend="openvino", device="CPU", precision="bf16").run({"x": X})["y"]
    assert wait_for_stores(timeout=120)
    (entry,) = [e for e in _entries(tmp_path) if e != f32_entry]
    assert entry.stat().st_size < 0.6 * f32_entry.stat().st_size, (entry.stat().st_size, f32_entry.stat().st_size)
    hit = sdrt.load(model, backend="openvino", device="CPU", precision="bf16")
    assert getattr(hit, "blob", None) is not None, "the second load imports the stored blob"
    np.testing.assert_array_equal(hit.run({"x": X})["y"], cold)
    plain = sdrt.load(model, backend="openvino", device="CPU", precision="bf16", cache=False).run({"x": X})["y"]
    np.testing.assert_array_equal(plain, cold)


@pytest.mark.parametrize("layers, want", [
    ([], False),  # no runtime model (AUTO): nothing says the weights were rounded
    ([("Convolution", "bf16"), ("FullyConnected", "bf16"), ("Reorder", "f32")], True),
    ([("Convolution", "bf16"), ("FullyConnected", "f32")], False),  # a matmul kept its float32 weights
    ([("Reorder", "bf16")], False),
])
def test_the_twin_is_written_only_where_every_weighted_layer_ran_bf16(layers, want):
    from sdrt_openvino import bf16

    assert bf16.runs_weights_in_bf16(layers) is want


@needs_bf16
def test_a_twin_openvino_could_not_write_is_a_warning_not_an_info_line(ov_registry, tmp_path, monkeypatch, caplog):
    """A full disk: OpenVINO gives up writing the twin's blob in silence. It was an info line (and `sdrt generate`
    had printed 'writing the compile cache for the next run'); now the store's one warning names the cause."""
    import logging

    import sdrt_openvino.backend as ov_backend
    from sdrt.cache import deferred, wait_for_stores

    model = tmp_path / "cm.onnx"
    model.write_bytes(_conv_matmul_model())
    monkeypatch.setattr(ov_backend, "blob_offset", lambda path: None)  # as where the write was cut short
    caplog.set_level(logging.INFO)
    with deferred.hold():
        sdrt.load(model, backend="openvino", device="CPU", precision="bf16").run({"x": X})
    assert wait_for_stores(timeout=120)
    said = [r for r in caplog.records if "no usable blob" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "is the disk full?" in said[0].getMessage()
    assert not [e for e in (tmp_path / "cache" / "compiled" / "openvino").iterdir() if not e.name.startswith(".")]
