"""The conformance kit runs onnx's own BackendTest against sdrt backends, and can fail."""

from __future__ import annotations

import numpy as np
import pytest

import sdrt
from sdrt.backend import Backend, Device, Session
from sdrt.errors import UnsupportedGraph
from sdrt.testing import BackendTest, make_onnx_backend


class _ZerosSession(Session):
    def _run(self, feeds):
        return {o.name: np.zeros(feeds[self.inputs[0].name].shape, np.float32) for o in self.outputs}


class WrongBackend(Backend):
    """A real backend that computes the wrong answer: zeros, whatever the graph."""

    name = "wrong"

    def devices(self):
        return [Device("wrong", "GPU.1", kind="gpu")]

    def compile(self, graph, weights, device, **options):
        ops = {n.op_type for n in graph.model.graph.node}
        if ops - {"Relu", "Abs"}:
            raise UnsupportedGraph("only Relu and Abs", unsupported={op: ["n"] for op in ops - {"Relu", "Abs"}})
        return _ZerosSession(graph.inputs, graph.outputs)


class _Plugin:
    @sdrt.hookimpl
    def register_backends(self, register):
        register(WrongBackend())


def test_reference_backend_passes_selected_node_tests_per_op(registry):
    summary = BackendTest("reference").include(r"^test_(relu|abs)_cpu$").include(r"^test_softmax_axis_0_").run()
    assert summary.ops["Relu"].counts["passed"] == 1
    assert summary.ops["Abs"].counts["passed"] == 1
    assert summary.ops["Softmax"].counts["passed"] == 3  # the op and its two _expanded function bodies
    assert summary.totals()["failed"] == 0
    assert set(summary.outcome) == {"test_relu_cpu", "test_abs_cpu", "test_softmax_axis_0_cpu",
                                    "test_softmax_axis_0_expanded_cpu", "test_softmax_axis_0_expanded_ver18_cpu"}


def test_wrong_backend_fails_and_unsupported_ops_are_counted_apart_with_device_in_names(registry, inline_plugin):
    inline_plugin(_Plugin(), "wrong-plugin")
    summary = (BackendTest("wrong", "GPU.1").include(r"^test_(relu|abs|add|sub)_gpu_1$")
               .exclude(r"^test_sub_", "left out on purpose").run())
    assert summary.outcome["test_relu_gpu_1"] == "failed"
    assert summary.outcome["test_abs_gpu_1"] == "failed"
    assert summary.outcome["test_add_gpu_1"] == "unsupported"  # the backend's UnsupportedGraph
    assert summary.outcome["test_sub_gpu_1"] == "skipped"  # excluded
    text = summary.render()
    assert "test_relu_gpu_1 [Relu]" in text and "0 passed, 2 failed, 0 crashed, 0 timeout, 1 unsupported, 1 skipped" in text
    # the failure message is the exception line with numpy's ACTUAL/DESIRED, not just the traceback's last line
    assert summary.ops["Add"].unsupported == [("test_add_gpu_1", "only Relu and Abs: Add (nodes: n).")]
    assert summary.to_json()["ops"]["Add"]["unsupported"] == [["test_add_gpu_1", "only Relu and Abs: Add (nodes: n)."]]
    message = dict(summary.ops["Relu"].failures)["test_relu_gpu_1"]
    assert message.startswith("AssertionError:") and "ACTUAL" in message and "DESIRED" in message


def test_xfail_and_tolerance_patterns_chain(registry, inline_plugin):
    inline_plugin(_Plugin(), "wrong-plugin")
    summary = (BackendTest("wrong").include(r"^test_(relu|abs)_gpu_1$")
               .xfail(r"^test_relu_", "computes zeros on purpose")
               .tolerance(r"^test_abs_", rtol=0, atol=1e9)
               .run())
    assert summary.outcome == {"test_relu_gpu_1": "xfail", "test_abs_gpu_1": "passed"}
    assert ("test_relu_gpu_1", "xfail: computes zeros on purpose") in summary.ops["Relu"].failures


def test_backend_declared_expectations_apply(registry):
    summary = BackendTest("reference").include(r"^test_bernoulli_seed_").run()
    assert summary.outcome["test_bernoulli_seed_cpu"] == "xfail"


def test_light_model_suite_runs(registry):
    summary = BackendTest("reference", suites=("light",)).include(r"^test_(bvlc_alexnet|zfnet512)_").run()
    assert summary.outcome == {"test_bvlc_alexnet_cpu": "passed", "test_zfnet512_cpu": "passed"}


def test_adapter_is_an_onnx_backend(registry):
    from onnx import TensorProto, helper
    from onnx.backend.base import Backend as OnnxBackend

    be = registry.backends["reference"]
    adapter = make_onnx_backend(be, be.devices()[0])
    assert issubclass(adapter, OnnxBackend) and adapter.supports_device("CPU") and not adapter.supports_device("CUDA")
    node = helper.make_node("Neg", ["x"], ["y"])
    model = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    (y,) = adapter.run_model(model, [np.array([1, -2], np.float32)])
    np.testing.assert_array_equal(y, [-1, 2])


def test_conformance_cli_prints_summary(registry, capsys):
    from sdrt.cli import main

    assert main(["conformance", "reference", "-k", "^test_relu_cpu$", "--suite", "node", "--no-isolate"]) == 0
    out = capsys.readouterr().out
    assert "Relu" in out and "1 passed, 0 failed" in out


@pytest.mark.parametrize("strict, code", [(False, 0), (True, 1)])
def test_conformance_cli_strict_exit_code(registry, inline_plugin, capsys, strict, code):
    from sdrt.cli import main

    inline_plugin(_Plugin(), "wrong-plugin")
    args = ["conformance", "wrong", "-k", "^test_relu_gpu_1$", "--no-isolate"] + (["--strict"] if strict else [])
    assert main(args) == code


def test_backend_instance_and_device_id_are_resolved(registry):
    from sdrt.errors import NoDeviceError

    suite = BackendTest(WrongBackend(), "gpu.1")
    assert (suite.device.id, suite.tag) == ("GPU.1", "GPU_1")
    with pytest.raises(NoDeviceError, match=r"no device 'GPU.9'.*devices here: GPU.1"):
        BackendTest(WrongBackend(), "GPU.9")


def test_conformance_cli_passes_compile_options_and_refuses_malformed_ones(registry, capsys):
    from sdrt.cli import main

    args = ["conformance", "reference", "-k", "^test_relu_cpu$", "--suite", "node", "--no-isolate"]
    # the reference backend takes no options: refused once, up front, naming -o (each test failed with it, exit 0)
    assert main([*args, "-o", "cache=false", "-o", "label=x"]) == 1
    err = capsys.readouterr().err
    assert "-o: unknown options for the reference backend: cache, label. Where: -o." in err
    assert main([*args, "-o", "bogus=1", "-k", "zzzznomatch"]) == 1  # checked even when no test would run
    assert "unknown options for the reference backend: bogus" in capsys.readouterr().err
    assert main([*args, "-o", "precision"]) == 1
    assert "compile option 'precision' is not KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("flags, said", [
    (["-k", "("], "the -k pattern '(' is not a regular expression"),
    (["--exclude", "["], "the --exclude pattern '[' is not a regular expression"),
    (["-k", "zzzznomatch"], "no test of the node suite matches -k 'zzzznomatch'"),
    (["--timeout", "-5"], "--timeout -5.0 is not a number of seconds above 0"),
    (["--timeout", "0"], "Where: --timeout."),
    (["--batch", "0"], "--batch 0 is not a number of tests of 1 or more"),
    (["--timeout", "60", "--no-isolate"], "--timeout limits the child processes of an isolated run, and does nothing"),
])
def test_conformance_cli_refuses_bad_filters_and_limits_in_flag_words(registry, capsys, flags, said):
    """A bad regex was a re.error traceback, a -k that selects nothing a run of 0 tests with exit 0, and
    --timeout -5 a child 'dead before its first test' with advice in API words (isolate=False)."""
    from sdrt.cli import main

    assert main(["conformance", "reference", "--suite", "node", *flags]) == 1
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
