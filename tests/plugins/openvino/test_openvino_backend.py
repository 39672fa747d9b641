"""The OpenVINO backend on this machine's CPU: devices, compile, run, options and errors."""

from __future__ import annotations

import numpy as np
import pytest
from ov_helpers import conv_model, ort_run, two_output_model, unsupported_model

import sdrt
from sdrt.errors import InputError, NoDeviceError, SdrtError, UnsupportedGraph

X = np.random.default_rng(7).standard_normal((1, 3, 8, 8), dtype=np.float32)


def test_devices_come_from_openvino_plus_auto(backend):
    import openvino as ov

    ids = [d.id for d in backend.devices()]
    assert set(ov.Core().available_devices) <= set(ids)
    assert ids[-1] == "AUTO"
    cpu = next(d for d in backend.devices() if d.id == "CPU")
    assert cpu.kind == "cpu" and cpu.backend == "openvino" and cpu.name
    assert "FP32" in cpu.properties["capabilities"]


def test_backend_outranks_reference(ov_registry):
    from sdrt.runtime import select

    be, dev = select("auto", None, ov_registry)
    assert be.name == "openvino" and be.priority > ov_registry.backends["reference"].priority


def test_run_matches_onnxruntime(ov_registry):
    model = conv_model()
    with sdrt.load(model.SerializeToString(), backend="openvino", device="CPU") as session:
        out = session.run({"x": X})
        again = session.run({"x": X})
    expected = ort_run(model, {"x": X})[0]
    np.testing.assert_allclose(out["y"], expected, rtol=1e-5, atol=1e-5)
    assert out["y"] is not again["y"] and not np.shares_memory(out["y"], again["y"])


def test_tests_run_at_f32_whatever_the_cpu(ov_registry):
    # tests/conftest.py sets SDRT_PRECISION=fp32: the default is bf16 on CPUs with AVX-512-BF16 or AMX
    # (tests/precision/test_precision_default.py tests that default)
    session = sdrt.load(conv_model().SerializeToString(), backend="openvino", device="CPU")
    assert str(session.property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"


def test_bf16_precision_is_passed_to_openvino(ov_registry, cpu):
    if "BF16" not in cpu.properties["capabilities"]:
        pytest.skip("this CPU has no bf16 support in OpenVINO")
    session = sdrt.load(conv_model().SerializeToString(), backend="openvino", device="CPU", precision="bf16",
                        threads=1, performance_hint="throughput")
    assert "bfloat16" in str(session.property("INFERENCE_PRECISION_HINT"))
    assert session.property("INFERENCE_NUM_THREADS") == 1
    np.testing.assert_allclose(session.run({"x": X})["y"], ort_run(conv_model(), {"x": X})[0], rtol=0.05, atol=0.1)


def test_two_outputs_and_a_shape_initializer(ov_registry):
    model = two_output_model()
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = sdrt.load(model.SerializeToString(), backend="openvino").run({"x": x})
    mm, flat = ort_run(model, {"x": x})
    assert list(out) == ["mm", "flat"]
    np.testing.assert_allclose(out["mm"], mm, rtol=1e-5)
    np.testing.assert_allclose(out["flat"], flat, rtol=1e-5)


def test_dynamic_batch_and_non_contiguous_input(ov_registry):
    model = conv_model(batch="batch")
    session = sdrt.load(model.SerializeToString(), backend="openvino")
    x = np.random.default_rng(3).standard_normal((2, 8, 8, 3), dtype=np.float32).transpose(0, 3, 1, 2)
    assert not x.flags.c_contiguous
    np.testing.assert_allclose(session.run({"x": x})["y"], ort_run(model, {"x": np.ascontiguousarray(x)})[0],
                               rtol=1e-5, atol=1e-5)
    assert session.run({"x": X})["y"].shape == (1, 4, 8, 8)


def test_unsupported_ops_are_listed_with_their_nodes(ov_registry):
    with pytest.raises(UnsupportedGraph) as info:
        sdrt.load(unsupported_model().SerializeToString(), backend="openvino")
    err = info.value
    assert err.unsupported == {"Frobnicate": ["frob0", "frob1"], "com.example.Twist": ["twist0"]}
    assert "frob0" in str(err) and "What to do" in str(err)


@pytest.mark.parametrize(("options", "match"), [
    ({"precision": "int4"}, "precision"),
    ({"performance_hint": "fast"}, "performance_hint"),
    ({"threads": 0}, "threads"),
    ({"threads": True}, "threads"),
    ({"cache": "yes"}, "cache"),
    ({"turbo": 1}, "unknown options"),
])
def test_bad_options_raise_before_compiling(ov_registry, options, match):
    from sdrt.errors import SdrtError

    with pytest.raises(SdrtError, match=match) as info:
        sdrt.load(conv_model().SerializeToString(), backend="openvino", **options)
    if "precision" in options:  # the core's vocabulary: every accepted name, with its aliases
        assert "fp32 (f32, float32" in str(info.value) and "bf16 (bfloat16" in str(info.value)


def test_unknown_device_is_refused(ov_registry):
    with pytest.raises(NoDeviceError, match="GPU.7"):
        sdrt.load(conv_model().SerializeToString(), backend="openvino", device="GPU.7")


def test_wrong_feed_is_an_input_error(ov_registry):
    session = sdrt.load(conv_model().SerializeToString(), backend="openvino")
    with pytest.raises(InputError, match="shape"):
        session.run({"x": np.zeros((1, 3, 9, 8), np.float32)})
    with pytest.raises(InputError, match="dtype"):
        session.run({"x": X.astype(np.float64)})


def test_shape_openvino_rejects_at_run_time_is_wrapped(ov_registry):
    session = sdrt.load(conv_model(dims=["n", "c", "h", "w"]).SerializeToString(), backend="openvino")
    assert session.run({"x": X})["y"].shape == (1, 4, 8, 8)
    with pytest.raises(SdrtError) as info:  # 2 channels where the conv weights need 3
        session.run({"x": np.zeros((1, 2, 8, 8), np.float32)})
    assert not isinstance(info.value, RuntimeError)
    assert "Where:" in str(info.value) and "(1, 2, 8, 8)" in str(info.value)


def test_released_scratch_is_allocated_again_by_the_next_run(ov_registry):
    """``release_scratch`` (OpenVINO's ``release_memory``) between calls, as a pipeline does after its denoising loop:
    the next run gives the same output; on a closed session it does nothing."""
    model = conv_model()
    session = sdrt.load(model.SerializeToString(), backend="openvino", device="CPU")
    first = session.run({"x": X})["y"]
    session.release_scratch()
    session.release_scratch()
    np.testing.assert_array_equal(session.run({"x": X})["y"], first)
    session.close()
    session.release_scratch()


def test_closed_session_refuses_to_run(ov_registry):
    session = sdrt.load(conv_model().SerializeToString(), backend="openvino")
    session.close()
    session.close()
    with pytest.raises(SdrtError, match="closed"):
        session.run({"x": X})


def test_auto_device_runs(ov_registry):
    session = sdrt.load(conv_model().SerializeToString(), backend="openvino", device="AUTO")
    np.testing.assert_allclose(session.run({"x": X})["y"], ort_run(conv_model(), {"x": X})[0], rtol=1e-4, atol=1e-4)


def test_sequence_ops_are_reported_as_unsupported(ov_registry):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], name="split_seq", axis=0)]
    seq_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_value_info("seq", seq_type)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(UnsupportedGraph) as info:
        sdrt.load(model.SerializeToString(), backend="openvino")
    assert info.value.unsupported == {"non-tensor output": ["seq"]}


def test_tensor_types_openvino_lacks_are_unsupported(ov_registry):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["x"], ["h"], name="to_fnuz", to=TensorProto.FLOAT8E4M3FNUZ),
             helper.make_node("Cast", ["h"], ["y"], name="back", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    with pytest.raises(UnsupportedGraph) as info:
        sdrt.load(model.SerializeToString(), backend="openvino")
    assert "to_fnuz" in str(info.value) and info.value.unsupported


def test_precision_the_device_lacks_is_reported(ov_registry, cpu, caplog):
    import logging

    if "FP16" in cpu.properties["capabilities"]:
        pytest.skip("this CPU runs f16 natively")
    caplog.set_level(logging.WARNING, logger="sdrt.openvino")
    session = sdrt.load(conv_model().SerializeToString(), backend="openvino", device="CPU", precision="fp16")
    assert session.property("INFERENCE_PRECISION_HINT").get_type_name() != "f16"
    assert any("where f16 was asked" in r.getMessage() for r in caplog.records)


def test_missing_openvino_makes_the_backend_unavailable(registry, monkeypatch):
    """The plugin imports without openvino; asking it for devices then says what to install."""
    import sys

    import sdrt_openvino
    from sdrt.errors import BackendUnavailable

    monkeypatch.setitem(sys.modules, "openvino", None)  # as if the wheel were not installed
    backend = sdrt_openvino.OpenVINOBackend()
    with pytest.raises(BackendUnavailable, match="pip install"):
        backend.devices()
