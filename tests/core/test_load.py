"""sdrt.load: explicit choices fail loudly, auto picks by priority and says why."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import sdrt
from sdrt.backend import Backend, Device
from sdrt.errors import BackendUnavailable, InputError, ModelNotFoundError, NoDeviceError, UnknownBackendError


class _NoDevice(Backend):
    name = "nodevice"
    priority = 100

    def devices(self):
        return []

    def compile(self, graph, weights, device, **options):  # pragma: no cover - never reached
        raise AssertionError("compile must not be called without a device")


class _Failing(Backend):
    name = "failing"
    priority = 90

    def devices(self):
        raise RuntimeError("driver exploded")

    def compile(self, graph, weights, device, **options):  # pragma: no cover
        raise AssertionError


class _Plugin:
    def __init__(self, *backends):
        self.backends = backends

    @sdrt.hookimpl
    def register_backends(self, register):
        for b in self.backends:
            register(b)


def test_load_runs_on_reference_and_matches_numpy(registry, affine_path, affine):
    _, reference = affine
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    with sdrt.load(affine_path, backend="reference") as s:
        assert [str(i) for i in s.inputs] == ["x: float32[batch, 4]"]
        y = s.run({"x": x})["y"]
    np.testing.assert_allclose(y, reference(x), rtol=1e-6)


def test_load_accepts_bytes_graph_and_proto(registry, affine_path):
    import onnx

    data = affine_path.read_bytes()
    x = np.ones((2, 4), np.float32)
    a = sdrt.load(data, backend="reference").run({"x": x})["y"]
    b = sdrt.load(sdrt.Graph.load(affine_path), backend="reference").run({"x": x})["y"]
    c = sdrt.load(onnx.load(affine_path), backend="reference").run({"x": x})["y"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize(("args", "kwargs", "match"), [
    ((None,), {}, r"model must be a path, the bytes of an ONNX file, an onnx.ModelProto or an sdrt.Graph, got NoneType\. Where: model\."),
    ((5,), {}, r"model must be .* got int\. Where: model\."),
    (("vae.onnx",), {"device": 5}, r"device must be a device id, a Device or None, got int 5\. Where: device\."),
    (("vae.onnx",), {"backend": 5}, r"backend must be a backend's name, got int\. Where: backend\."),
])
def test_arguments_of_the_wrong_type_are_input_errors(registry, args, kwargs, match):
    """Not a TypeError from pathlib or an AttributeError from str.lower deep in the device lookup."""
    with pytest.raises(InputError, match=match):
        sdrt.load(*args, **kwargs)


def test_unknown_backend_name_lists_installed(registry, affine_path):
    with pytest.raises(UnknownBackendError, match=r"no backend named 'cuda-magic'.*installed backends: reference"):
        sdrt.load(affine_path, backend="cuda-magic")


def test_backend_with_no_usable_device(registry, inline_plugin, affine_path):
    inline_plugin(_Plugin(_NoDevice()), "nodevice-plugin")
    with pytest.raises(NoDeviceError, match="'nodevice' offers no device"):
        sdrt.load(affine_path, backend="nodevice")


def test_backend_whose_devices_call_raises_is_wrapped(registry, inline_plugin, affine_path):
    inline_plugin(_Plugin(_Failing()), "failing-plugin")
    with pytest.raises(NoDeviceError, match="driver exploded"):
        sdrt.load(affine_path, backend="failing")


def test_explicit_device_that_does_not_exist(registry, affine_path):
    with pytest.raises(NoDeviceError, match=r"no device 'GPU.7'.*devices here: CPU"):
        sdrt.load(affine_path, backend="reference", device="GPU.7")


def test_model_path_that_does_not_exist(registry, tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist") as e:
        sdrt.load(tmp_path / "nope.onnx", backend="reference")
    assert "nope.onnx" in str(e.value)


def test_auto_skips_backends_without_devices_and_logs_choice(registry, inline_plugin, affine_path, caplog):
    inline_plugin(_Plugin(_NoDevice(), _Failing()), "bad-plugin")
    with caplog.at_level(logging.INFO, logger="sdrt.runtime"):
        session = sdrt.load(affine_path)
    assert session.run({"x": np.ones((1, 4), np.float32)})["y"].shape == (1, 3)
    assert "auto-selected backend reference" in caplog.text and "priority" in caplog.text


def test_auto_prefers_higher_priority(registry, inline_plugin):
    from sdrt.runtime import select

    class _High(Backend):
        name = "high"
        priority = 10

        def devices(self):
            return [Device("high", "X1")]

        def compile(self, graph, weights, device, **options):  # pragma: no cover
            raise AssertionError

    inline_plugin(_Plugin(_High()), "high-plugin")
    be, dev = select("auto")
    assert (be.name, dev.id) == ("high", "X1")
    be, dev = select("auto", "CPU")  # a device id narrows the choice
    assert be.name == "reference"


def test_auto_passes_over_devices_that_run_only_when_named(registry, inline_plugin):
    from sdrt.runtime import select

    class _SlowReferenceTarget(Backend):  # as MIGraphX's ref target: high priority, but never by choice
        name = "vendor"
        priority = 70

        def devices(self):
            return [Device("vendor", "ref", kind="cpu", properties={"auto": False})]

        def compile(self, graph, weights, device, **options):  # pragma: no cover
            raise AssertionError

    inline_plugin(_Plugin(_SlowReferenceTarget()), "vendor-plugin")
    be, dev = select("auto")
    assert be.name == "reference"
    be, dev = select("vendor", "ref")  # named, it runs
    assert (be.name, dev.id) == ("vendor", "ref")
    registry.unregister_plugin("reference")
    with pytest.raises(NoDeviceError, match=r"vendor: its devices \(ref\) run only when named"):
        select("auto")


def test_auto_with_nothing_usable_says_what_to_do(registry, inline_plugin, affine_path):
    registry.unregister_plugin("reference")
    inline_plugin(_Plugin(_NoDevice()), "nodevice-plugin")
    with pytest.raises(NoDeviceError, match=r"no installed backend can run here.*sdrt info"):
        sdrt.load(affine_path)


def test_explicit_broken_plugin_backend_is_refused_with_its_error(registry, inline_plugin, affine_path):
    class Broken:
        @sdrt.hookimpl
        def register_backends(self, register):
            raise ValueError("cannot find libfoo.so")

    record = inline_plugin(Broken(), "foo")
    assert record.state == "broken" and "libfoo.so" in record.error
    with pytest.raises(BackendUnavailable, match=r"'foo' cannot be used: plugin is broken.*libfoo.so"):
        sdrt.load(affine_path, backend="foo")


def test_shapes_pins_the_graph_before_the_backend_sees_it(registry, affine_path, affine):
    _, reference = affine
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    with sdrt.load(affine_path, backend="reference", shapes={"batch": 3}) as s:
        assert [str(i) for i in s.inputs] == ["x: float32[3, 4]"]
        np.testing.assert_allclose(s.run({"x": x})["y"], reference(x), rtol=1e-6)
        with pytest.raises(InputError, match=r"input 'x' has shape \(2, 4\), expected \(3, 4\)"):
            s.run({"x": x[:2]})  # pinned: the session takes those shapes only
    with sdrt.load(affine_path, backend="reference", shapes={"x": (2, 4)}) as s:
        assert [str(i) for i in s.inputs] == ["x: float32[2, 4]"]


@pytest.mark.parametrize("shapes, message", [
    ({"batch": -1}, "dim 'batch' must be pinned to a non-negative int, got -1"),
    ({"nope": 2}, "'nope' is neither an input nor a symbolic dim of the graph"),
    ({"x": (2, 5)}, r"input 'x' has fixed shape \('batch', 4\); cannot pin it to \(2, 5\)"),
    ({"x": (2,)}, "input 'x' has rank 2, the pinned shape"),
    ({"x": "ab"}, "shape for input 'x' must be a sequence of non-negative ints"),
    ([("batch", 2)], "shapes must map input or dim names to sizes, got list"),
])
def test_a_bad_shapes_argument_is_an_error_about_that_argument(registry, affine_path, shapes, message):
    with pytest.raises(InputError, match=message) as info:
        sdrt.load(affine_path, backend="reference", shapes=shapes)
    assert info.value.where == "shapes" and "\n" not in str(info.value)
    assert "shapes=" in info.value.fix and "Graph.with_shapes" not in str(info.value)


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
def test_reference_batch_norm_before_opset_14_is_inference(registry, opset):
    """onnx.reference's BatchNormalization_9 reads the momentum attribute's default as training mode and normalizes
    with the batch's statistics: an opset-9 graph (the ONNX model zoo's ResNets) ran 0.76 of its output's scale off
    onnxruntime on the reference backend, and opset 7 raised. Constant folding uses the same fix."""
    from onnx import TensorProto, helper, numpy_helper

    from sdrt.graph import Graph

    x = np.random.default_rng(0).standard_normal((1, 4, 2, 2)).astype(np.float32)
    stats = [numpy_helper.from_array(np.full(4, v, np.float32), n) for n, v in (("g", 2.0), ("b", 0.5), ("m", 0.25),
                                                                               ("v", 4.0))]
    want = (x - 0.25) / np.sqrt(4 + 1e-5) * 2 + 0.5
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"])], "g",
                          [vi("x", TensorProto.FLOAT, [1, 4, 2, 2])], [vi("y", TensorProto.FLOAT, [1, 4, 2, 2])], stats)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    with sdrt.load(m.SerializeToString(), backend="reference") as s:
        np.testing.assert_allclose(s.run({"x": x})["y"], want, rtol=1e-6, atol=1e-6)
    const = helper.make_graph([helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bc"]),
                               helper.make_node("Add", ["x", "bc"], ["y"])], "g",
                              [vi("x", TensorProto.FLOAT, [1, 4, 2, 2])], [vi("y", TensorProto.FLOAT, [1, 4, 2, 2])],
                              [numpy_helper.from_array(x, "c"), *stats])
    m = helper.make_model(const, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    folded = Graph.load(m.SerializeToString()).fold_constants(fold_weights=True)
    bc = next(t for t in folded.model.graph.initializer if t.name == "bc")
    np.testing.assert_allclose(numpy_helper.to_array(bc), want, rtol=1e-6, atol=1e-6)
