"""The backend contract: devices, fail-early UnsupportedGraph, options, weights, sessions."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_helpers import F, check, compile_ggml, make_model, rand, run_ggml
from onnx import helper

from sdrt.errors import InputError, ModelError, SdrtError, UnsupportedGraph
from sdrt_ggml import native

mk = helper.make_node


def _backend():
    from sdrt_ggml import GgmlBackend

    return GgmlBackend()


def test_plugin_module_declares_api_and_hook():
    import sdrt_ggml

    assert sdrt_ggml.SDRT_API_VERSION == (1, 2)
    assert callable(sdrt_ggml.register_backends)


def test_devices_come_from_the_ggml_registry_and_include_the_cpu():
    import ggml

    devs = _backend().devices()
    assert devs and devs[0].backend == "ggml"
    assert any(d.kind == "cpu" and d.id == "CPU" for d in devs)
    names = {ggml.ggml_backend_dev_name(ggml.ggml_backend_dev_get(i)).decode()
             for i in range(ggml.ggml_backend_dev_count())}
    assert {d.id for d in devs} <= names


def test_registered_through_the_plugin_hook(registry):
    import sdrt_ggml

    registry.register_plugin(sdrt_ggml, "ggml", distribution="sdrt-ggml")
    assert "ggml" in registry.backends


def test_unsupported_graph_lists_every_op_and_node_before_lowering():
    nodes = [mk("Relu", ["x"], ["a"], name="ok"),
             mk("NonMaxSuppression", ["a", "a"], ["b"], name="nms1"),
             mk("Einsum", ["a", "a"], ["c"], name="ein1", equation="ij,ij->ij"),
             mk("Einsum", ["c", "a"], ["d"], name="ein2", equation="ij,ij->ij"),
             mk("Resize", ["d", "", "s"], ["y"], name="cubic", mode="cubic")]
    model = make_model(nodes, {"x": ((2, 2), F)}, {"y": (None, F)}, {"s": np.ones(2, np.float32)})
    with pytest.raises(UnsupportedGraph) as err:
        compile_ggml(model)
    un = err.value.unsupported
    # an elementwise product is a contraction-free einsum ggml does not take (only permutations, outer products)
    assert un["Einsum (equation 'ij,ij->ij': only axis permutations and outer products)"] == ["ein1", "ein2"]
    assert un["NonMaxSuppression"] == ["nms1"]
    assert any(k.startswith("Resize (Resize mode 'cubic')") for k in un)
    assert "ein1" in str(err.value) and "What to do" in str(err.value)


def test_runtime_only_problem_is_reported_as_unsupported_graph():
    model = make_model([mk("Equal", ["x", "x"], ["y"], name="eq")], {"x": ((2,), F)},
                       {"y": (None, helper.TensorProto.BOOL)})
    with pytest.raises(UnsupportedGraph, match="eq"):
        run_ggml(model, {"x": rand(2)})


def test_dynamic_input_needs_shapes_option():
    model = make_model([mk("Relu", ["x"], ["y"])], {"x": (("batch", 3), F)}, {"y": (None, F)})
    with pytest.raises(ModelError, match="shapes="):
        run_ggml(model, {"x": rand(2, 3)})
    out = run_ggml(model, {"x": rand(2, 3)}, shapes={"x": (2, 3)})
    assert out["y"].shape == (2, 3)
    assert run_ggml(model, {"x": rand(5, 3)}, shapes={"batch": 5})["y"].shape == (5, 3)
    with pytest.raises(ModelError):
        run_ggml(model, {"x": rand(2, 3)}, shapes={"x": (2, 4)})


def test_unknown_option_is_an_error():
    model = make_model([mk("Relu", ["x"], ["y"])], {"x": ((3,), F)}, {"y": (None, F)})
    with pytest.raises(SdrtError, match="unknown options"):
        run_ggml(model, {"x": rand(3)}, fast=True)


def test_wrong_feed_is_an_input_error():
    model = make_model([mk("Relu", ["x"], ["y"])], {"x": ((3,), F)}, {"y": (None, F)})
    with compile_ggml(model) as s:
        with pytest.raises(InputError):
            s.run({"x": rand(4)})


def test_session_reruns_and_closes():
    w = rand(6, 4)
    model = make_model([mk("MatMul", ["x", "w"], ["y"])], {"x": ((2, 6), F)}, {"y": (None, F)}, {"w": w})
    s = compile_ggml(model)
    for seed in range(3):
        x = rand(2, 6, seed=seed)
        np.testing.assert_allclose(s.run({"x": x})["y"], x @ w, rtol=1e-5, atol=1e-6)
    s.close()
    s.close()
    with pytest.raises(SdrtError, match="closed"):
        s.run({"x": rand(2, 6)})


class _Weights:
    """The part of sdrt.weights.Weights that a backend uses: bind(graph) -> name -> array."""

    def __init__(self, arrays):
        self.arrays = arrays

    def bind(self, graph):
        return dict(self.arrays)


def test_update_weights_in_place_and_with_rebuild():
    w, b = rand(6, 4), rand(4)
    nodes = [mk("MatMul", ["x", "w"], ["m"]), mk("Add", ["m", "b"], ["y"]),
             mk("Mul", ["b", "b"], ["bb"]), mk("Add", ["y", "bb"], ["z"])]
    model = make_model(nodes, {"x": ((2, 6), F)}, {"z": (None, F)}, {"w": w, "b": b})
    x = rand(2, 6, seed=7)
    with compile_ggml(model) as s:
        w2 = rand(6, 4, seed=9)
        s.update_weights(_Weights({"w": w2}))  # bound directly: written in place
        np.testing.assert_allclose(s.run({"x": x})["z"], x @ w2 + b + b * b, rtol=1e-5, atol=1e-5)
        b2 = rand(4, seed=11)
        s.update_weights(_Weights({"b": b2}))  # b*b was folded at compile time: rebuilds
        np.testing.assert_allclose(s.run({"x": x})["z"], x @ w2 + b2 + b2 * b2, rtol=1e-5, atol=1e-5)


def test_weights_given_at_compile_replace_initializers():
    w = rand(6, 4)
    model = make_model([mk("MatMul", ["x", "w"], ["y"])], {"x": ((2, 6), F)}, {"y": (None, F)}, {"w": w})
    w2 = rand(6, 4, seed=5)
    with compile_ggml(model, _Weights({"w": w2})) as s:
        x = rand(2, 6)
        np.testing.assert_allclose(s.run({"x": x})["y"], x @ w2, rtol=1e-5, atol=1e-6)


def test_scheduler_path_matches_and_profiles():
    from sdrt_ggml.op_timing import time_ops

    w = rand(8, 4, 3, 3)
    model = make_model([mk("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), mk("Relu", ["c"], ["y"])],
                       {"x": ((1, 4, 6, 6), F)}, {"y": (None, F)}, {"w": w})
    feeds = {"x": rand(1, 4, 6, 6)}
    check(model, feeds, scheduler=True)
    with compile_ggml(model, scheduler=True) as s:
        prof = time_ops(s, feeds)
    gemm = "sdrt_conv" if native.native() is not None else "MUL_MAT"  # the conv (the native implicit GEMM)
    assert gemm in prof and all(ms >= 0 and n >= 1 for ms, n in prof.values())


def test_constant_output_and_passthrough_output():
    model = make_model([mk("Shape", ["x"], ["s"]), mk("Identity", ["x"], ["y"])], {"x": ((2, 5), F)},
                       {"s": (None, helper.TensorProto.INT64), "y": (None, F)})
    x = rand(2, 5)
    out = run_ggml(model, {"x": x})
    assert out["s"].tolist() == [2, 5] and out["s"].dtype == np.int64
    np.testing.assert_array_equal(out["y"], x)


def test_accelerator_backend_when_built_in():
    import ggml

    kinds = [ggml.ggml_backend_dev_type(ggml.ggml_backend_dev_get(i)) for i in range(ggml.ggml_backend_dev_count())]
    if ggml.GGML_BACKEND_DEVICE_TYPE_ACCEL not in kinds:
        pytest.skip("ggml-python was built without an accelerator backend (CMAKE_ARGS=-DGGML_BLAS=on)")
    w = rand(64, 48)
    model = make_model([mk("MatMul", ["x", "w"], ["y"])], {"x": ((40, 64), F)}, {"y": (None, F)}, {"w": w})
    check(model, {"x": rand(40, 64)}, accel=True)


def test_real_safetensors_weights_at_compile_and_update(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    from sdrt.weights import Weights

    w0, b0 = rand(6, 4), rand(4)
    model = make_model([mk("MatMul", ["x", "w"], ["m"]), mk("Add", ["m", "b"], ["y"])], {"x": ((2, 6), F)},
                       {"y": (None, F)}, {"w": w0, "b": b0})
    w1, b1, w2 = rand(6, 4, seed=21), rand(4, seed=22), rand(6, 4, seed=23)
    safetensors_numpy.save_file({"w": w1, "b": b1}, str(tmp_path / "one.safetensors"))
    safetensors_numpy.save_file({"w": w2, "b": b1}, str(tmp_path / "two.safetensors"))
    x = rand(2, 6, seed=3)
    with compile_ggml(model, Weights.open(tmp_path / "one.safetensors")) as s:
        np.testing.assert_allclose(s.run({"x": x})["y"], x @ w1 + b1, rtol=1e-5, atol=1e-5)
        s.update_weights(Weights.open(tmp_path / "two.safetensors"))
        np.testing.assert_allclose(s.run({"x": x})["y"], x @ w2 + b1, rtol=1e-5, atol=1e-5)


def test_sdrt_load_end_to_end(registry, tmp_path):
    import sdrt
    import sdrt_ggml

    registry.register_plugin(sdrt_ggml, "ggml", distribution="sdrt-ggml")
    w = rand(6, 4)
    model = make_model([mk("MatMul", ["x", "w"], ["y"])], {"x": (("batch", 6), F)}, {"y": (None, F)}, {"w": w})
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with sdrt.load(str(path), backend="ggml", device="CPU", shapes={"batch": 3}) as s:
        x = rand(3, 6)
        np.testing.assert_allclose(s.run({"x": x})["y"], x @ w, rtol=1e-5, atol=1e-6)
        assert s.inputs[0].shape == (3, 6)


def test_sdrt_run_pins_a_dynamic_graph_to_its_inputs(registry, tmp_path, capsys):
    """ggml needs static shapes; `sdrt run` pins the graph to the inputs given rather than refusing it."""
    import sdrt_ggml
    from sdrt.cli import main

    registry.register_plugin(sdrt_ggml, "ggml", distribution="sdrt-ggml")
    w = rand(6, 4)
    model = make_model([mk("MatMul", ["x", "w"], ["y"])], {"x": (("batch", 6), F)}, {"y": (None, F)}, {"w": w})
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    x = rand(3, 6)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(tmp_path / "m.onnx"), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--backend", "ggml"]) == 0
    assert "y: float32[3, 4]" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], x @ w, rtol=1e-5, atol=1e-6)


def test_a_conv_heavy_graph_fits_the_ggml_context():
    """A chain of 200 padded 3x3 convs (row-copy convs take many ggml tensors each) compiles and runs."""
    nodes, inits, x = [], {}, "x"
    for i in range(200):
        nodes.append(mk("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        inits[f"w{i}"] = rand(4, 4, 3, 3, seed=i) * 0.3
        x = f"c{i}"
    model = make_model(nodes, {"x": ((1, 4, 6, 6), F)}, {x: (None, F)}, inits)
    check(model, {"x": rand(1, 4, 6, 6)}, rtol=1e-4, atol=1e-5)


def test_cpu_device_says_whether_ggml_has_its_fast_float32_gemm():
    import ggml

    cpu = next(d for d in _backend().devices() if d.id == "CPU")
    assert cpu.properties["tinyblas"] == bool(ggml.ggml_cpu_has_llamafile())


def test_window_conv_through_the_scheduler_and_with_new_weights():
    """The window conv (reordered kernel, bias added with the crop) runs through ggml's scheduler,
    and update_weights writes a new kernel and bias in place through the same reordering."""
    w, b = rand(6, 16, 3, 3), rand(6)
    model = make_model([mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": ((1, 16, 7, 5), F)}, {"y": (None, F)}, {"w": w, "b": b})
    feeds = {"x": rand(1, 16, 7, 5)}
    check(model, feeds, scheduler=True, conv_impl="window")
    w2, b2 = rand(6, 16, 3, 3, seed=3), rand(6, seed=4)
    model2 = make_model([mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                        {"x": ((1, 16, 7, 5), F)}, {"y": (None, F)}, {"w": w2, "b": b2})
    with compile_ggml(model, conv_impl="window") as s:
        assert s.impl_hits == {"conv window": 1}
        s.update_weights(_Weights({"w": w2, "b": b2}))
        np.testing.assert_allclose(s.run(feeds)["y"], run_ggml(model2, feeds)["y"], rtol=1e-5, atol=1e-5)
    check(model2, feeds)


@pytest.mark.parametrize("scheduler", [False, True])
def test_conv_scratch_lives_only_while_its_conv_runs(scheduler):
    """Each window conv's scratch (K*M floats) is allocated when the graph reaches that conv and
    freed after it, so four chained convs need about one scratch of working memory, not four
    (as graph leaves, all four were live from the first node on)."""
    c, hw = 16, 32
    nodes = [mk("Conv", [f"h{i}", f"w{i}"], [f"h{i + 1}"], pads=[1, 1, 1, 1]) for i in range(4)]
    nodes[0].input[0] = "x"
    nodes[-1].output[0] = "y"
    model = make_model(nodes, {"x": ((1, c, hw, hw), F)}, {"y": (None, F)},
                       {f"w{i}": rand(c, c, 3, 3, seed=i) / 12 for i in range(4)})  # 1/sqrt(fan-in): O(1) values
    feeds = {"x": rand(1, c, hw, hw)}
    check(model, feeds, scheduler=scheduler, conv_impl="window")
    scratch = 9 * c * (hw * (hw + 2)) * 4  # K * M floats, M = rows of the padded-width output
    with compile_ggml(model, scheduler=scheduler, conv_impl="window") as s:
        assert s.impl_hits == {"conv window": 4}
        assert scratch < s.compute_bytes() < 2 * scratch


def test_cpu_device_says_whether_the_build_has_the_fast_gemm():
    import ggml

    cpu = next(d for d in _backend().devices() if d.kind == "cpu")
    tinyblas = bool(ggml.ggml_cpu_has_llamafile())
    nat = native.native()
    assert cpu.properties["tinyblas"] is tinyblas
    assert cpu.properties["native_gemm"] == (nat.isa if nat else None)
    if nat is not None:  # sdrt-ggml's own GEMM, whatever ggml-python was built with; AMX tiles named where used
        amx = ", amx-bf16" if nat.bf16_kernel_name == "amx-bf16" else ""
        assert f"sdrt GEMM ({nat.isa}{amx})" in cpu.name and "slow build" not in cpu.name
        assert cpu.properties["bf16_kernel"] == nat.bf16_kernel_name
    else:
        assert ("tinyBLAS GEMM" in cpu.name) is tinyblas and ("slow build" in cpu.name) is not tinyblas
