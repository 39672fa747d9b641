"""Packages: build, reload, evaluate after coremltools' passes, rewrite weights in place."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from coreml_helpers import graph_of, make_model, run_ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import sdrt
from sdrt_coreml import package
from sdrt_coreml.backend import CoreMLBackend
from sdrt_coreml.errors import CoreMLError
from sdrt_coreml.evaluate import evaluate_package
from sdrt_coreml.options import parse_options
from sdrt_coreml.session import plan_update, update_package

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.models import build as bench_model  # noqa: E402


@pytest.fixture(scope="module")
def text_encoder():
    return bench_model("text_encoder", "tiny")


@pytest.fixture(scope="module")
def te_fp32(text_encoder, tmp_path_factory):
    """The tiny text encoder built once at fp32; tests that change it take a copy (``_copy``)."""
    return _build(text_encoder[0], tmp_path_factory.mktemp("te"), "fp32.mlpackage", precision="fp32")[0]


def _copy(pkg, tmp_path):
    dst = tmp_path / pkg.name
    shutil.copytree(pkg, dst)
    return dst, package.load(dst)


def _build(model, tmp_path, name="m.mlpackage", **options):
    be = CoreMLBackend()
    out = be.build(graph_of(model), None, None, tmp_path / name, **options)
    return out, package.load(out)


def _with_weights(model, arrays):
    m = type(model)()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.name in arrays:
            t.CopyFrom(numpy_helper.from_array(np.asarray(arrays[t.name]), t.name))
    return m


def test_text_encoder_package_evaluates_like_onnxruntime_in_fp32_and_fp16(text_encoder, te_fp32, tmp_path):
    model, feeds = text_encoder
    want = run_ort(model, feeds)["last_hidden_state"]
    for pkg, tol in ((te_fp32, 1e-4), (_build(model, tmp_path, "fp16.mlpackage")[0], 2e-2)):
        built = package.load(pkg)
        assert (pkg / package.WEIGHT_FILE).is_file() and (pkg / "Manifest.json").is_file()
        assert built.io["inputs"][0][:3] == ["input_ids", "input_ids", "int64"]
        assert built.op_counts["linear"] == 12 and built.n_ops > 50
        got = evaluate_package(pkg, feeds)
        assert got.stand_ins == {}
        np.testing.assert_allclose(got.outputs["last_hidden_state"], want, atol=tol, rtol=tol)


def test_package_reloads_with_coremltools(te_fp32):
    from sdrt_coreml.errors import ct

    model = ct().models.MLModel(str(te_fp32), skip_model_load=True)
    assert model.get_spec().WhichOneof("Type") == "mlProgram"
    assert "sdrt.io" in model.user_defined_metadata


def test_update_rewrites_the_weight_file_in_place(text_encoder, te_fp32, tmp_path):
    model, feeds = text_encoder
    pkg, built = _copy(te_fp32, tmp_path)
    graph = graph_of(model)
    arrays = graph.initializer_arrays()
    rng = np.random.default_rng(5)
    new = {n: (a + rng.standard_normal(a.shape).astype(a.dtype) * 0.05) for n, a in arrays.items() if n in built.weights}
    assert len(new) >= 30 and "text_model.encoder.layers.0.self_attn.q_proj.weight.T" in new  # transposed into linear
    assert plan_update(built, new) == []

    def no_rebuild(*_):
        raise AssertionError("an in-place update must not lower again")

    before = (pkg / package.WEIGHT_FILE).stat().st_size
    update_package(pkg, built, new, no_rebuild)
    assert (pkg / package.WEIGHT_FILE).stat().st_size == before
    got = evaluate_package(pkg, feeds).outputs["last_hidden_state"]
    want = run_ort(_with_weights(model, new), feeds)["last_hidden_state"]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert not np.allclose(want, run_ort(model, feeds)["last_hidden_state"], atol=1e-3)


def test_update_lowers_again_when_a_folded_initializer_changes(tmp_path):
    """``c1 + c2`` is folded into one new constant while lowering: changing ``c1`` rebuilds."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    inits = {"w": rng.standard_normal((4, 8)).astype(np.float32), "c1": rng.standard_normal(8).astype(np.float32),
             "c2": rng.standard_normal(8).astype(np.float32)}
    nodes = [helper.make_node("Add", ["c1", "c2"], ["c"]), helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Mul", ["m", "c"], ["y"])]
    model = make_model(nodes, {"x": (x.shape, TP.FLOAT)}, {"y": (None, TP.FLOAT)}, inits)
    be = CoreMLBackend()
    pkg, built = _build(model, tmp_path, precision="fp32")
    assert "w" in built.weights and {"c1", "c2"} <= set(built.folded)
    new = {"c1": inits["c1"] * 3, "w": inits["w"] * 2, "c2": inits["c2"]}
    assert plan_update(built, new) == ["c1"]
    opts = parse_options({"precision": "fp32"})
    static = be._static(graph_of(model), opts)
    arrays = sdrt.resolve_weights(static)
    calls = []

    def rebuild(out):
        calls.append(out)
        return be._build(static, {**arrays, **new}, opts, out)

    pkg2, built2 = update_package(pkg, built, new, rebuild)
    assert len(calls) == 1 and pkg2 == pkg and built2.path == pkg
    got = evaluate_package(pkg, {"x": x}).outputs["y"]
    np.testing.assert_allclose(got, run_ort(_with_weights(model, new), {"x": x})["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_update_rewrites_small_constants_inside_the_program(tmp_path, precision):
    """A 4-element bias is written into the program itself (coremltools inlines under 10 elements)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    inits = {"w": rng.standard_normal((6, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
             "z": np.zeros(4, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Add", ["a", "z"], ["y"])]
    model = make_model(nodes, {"x": (x.shape, TP.FLOAT)}, {"y": (None, TP.FLOAT)}, inits)
    pkg, built = _build(model, tmp_path, precision=precision)
    assert [place for _, _, place in built.weights["b"]] == ["inline"]
    assert "z" in built.folded  # all zeros: never matched by value
    new = {"b": inits["b"] * -3, "w": inits["w"] * 0.5}
    update_package(pkg, built, new, lambda out: pytest.fail("an in-place update must not lower again"))
    got = evaluate_package(pkg, {"x": x}).outputs["y"]
    tol = 1e-5 if precision == "fp32" else 1e-2
    np.testing.assert_allclose(got, run_ort(_with_weights(model, new), {"x": x})["y"], rtol=tol, atol=tol)


def test_rewrite_refuses_an_array_of_the_wrong_size(te_fp32, tmp_path):
    pkg, built = _copy(te_fp32, tmp_path)
    name = next(iter(built.weights))
    with pytest.raises(CoreMLError, match="bytes"):
        package.rewrite_weights(pkg, built, {name: np.zeros(3, np.float32)})


def test_load_refuses_a_package_sdrt_did_not_build(tmp_path):
    from coremltools.converters.mil import Builder as mb

    from sdrt_coreml.errors import ct

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))])
    def prog(x):
        return mb.relu(x=x)

    out = tmp_path / "foreign.mlpackage"
    ct().convert(prog, convert_to="mlprogram", skip_model_load=True).save(str(out))
    with pytest.raises(CoreMLError, match="not a package built by sdrt-coreml"):
        package.load(out)
    with pytest.raises(CoreMLError, match="not a package built by sdrt-coreml"):
        package.load(tmp_path / "absent.mlpackage")
