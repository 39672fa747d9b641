"""Parsing and ahead-of-time builds with the real TensorRT-RTX library (no GPU needed), and their error paths."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.models import build
from sdrt.errors import SdrtError, UnsupportedGraph
from sdrt.graph import Graph
from sdrt.weights import Weights
from sdrt_trt.build import parse
from sdrt_trt.enginefile import read_engine
from sdrt_trt.errors import TrtError
from sdrt_trt.options import OptionError, parse_options
from sdrt_trt.prepare import prepare
from sdrt_trt.targets import KNOWN_TARGETS

BENCH = ["vae_decoder", "unet", "text_encoder", "mobilenet_v3", "mobilenet_v2"]
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=None, opset=17):  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 21 else 10
    return m


@pytest.mark.parametrize(("name", "precision"), [(n, p) for n in BENCH for p in ("fp16", "fp32")
                                                 if (n, p) != ("unet", "fp32")])  # 3 s: fp16 covers the UNet
def test_bench_models_parse(name: str, precision: str) -> None:
    proto, _ = build(name, "tiny")
    prepared = prepare(Graph(proto), None, parse_options({"precision": precision}))
    _builder, network, _parser, _logger, weights = parse(prepared)
    assert network.num_inputs == len(proto.graph.input)
    assert network.num_outputs == len(proto.graph.output)
    assert network.num_layers > len(proto.graph.node) // 4
    assert set(weights) == {t.name for t in proto.graph.initializer}, "every weight goes in through load_initializer"


@pytest.mark.parametrize("target", KNOWN_TARGETS)
def test_aot_build_for_every_target(backend, target: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proto, _ = build("mobilenet_v2", "tiny")
    out = backend.build(Graph(proto), None, target, tmp_path / f"m.{target}.engine")
    meta, engine = read_engine(out)
    assert meta["target"] == target and meta["refit"] == "none" and meta["tensorrt_rtx"].startswith("1.")
    assert meta["inputs"] == ["input: float32[1, 3, 32, 32]"]
    assert 1_000_000 < len(engine) < 20_000_000  # 4.3 MB (6.2 MB for sm75) measured with 1.7.1


def test_text_encoder_with_int64_ids_builds(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proto, _ = build("text_encoder", "tiny")
    meta, engine = read_engine(backend.build(Graph(proto), None, "sm89", tmp_path / "te.engine"))
    assert meta["inputs"][0].startswith("input_ids: int64") and len(engine) > 100_000


def test_fp16_engine_is_smaller_than_fp32(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    half = backend.build(graph, None, "sm86", tmp_path / "h.engine").stat().st_size
    full = backend.build(graph, None, "sm86", tmp_path / "f.engine", precision="fp32").stat().st_size
    assert half < 0.7 * full


def test_turing_has_no_fp32_gemm(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    with pytest.raises(TrtError, match="FP32 GEMM is not supported.*precision='fp16'"):
        backend.build(graph, None, "sm75", tmp_path / "x.engine", precision="fp32")
    assert not (tmp_path / "x.engine").exists()


def test_refittable_builds_need_a_gpu(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if backend.devices():
        pytest.skip("this machine has a GPU: refittable builds work here")
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    with pytest.raises(TrtError, match="refittable engines only with a CUDA GPU present"):
        backend.build(graph, None, "sm86", tmp_path / "x.engine", refit="full")


def _dynamic() -> Graph:
    w = np.random.default_rng(0).standard_normal((8, 4, 3, 3), dtype=np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="/conv/Conv", pads=[1, 1, 1, 1])]
    return Graph(_model(nodes, {"x": (["batch", 4, "h", "w"], F)}, {"y": (["batch", 8, "h", "w"], F)}, {"w": w}))


def test_dynamic_inputs_need_shapes_or_profiles(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OptionError, match="inputs with dynamic dims need a shape: x: float32\\[batch, 4, h, w\\]"):
        backend.build(_dynamic(), None, "sm86", tmp_path / "x.engine")


def test_pinned_shapes_build(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = backend.build(_dynamic(), None, "sm86", tmp_path / "p.engine", shapes={"x": [2, 4, 16, 16]})
    assert read_engine(out)[0]["inputs"] == ["x: float32[2, 4, 16, 16]"]


def test_optimization_profile_builds(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    profile = {"x": [[1, 4, 8, 8], [2, 4, 32, 32], [4, 4, 64, 64]]}
    meta, _ = read_engine(backend.build(_dynamic(), None, "sm86", tmp_path / "d.engine", profiles=profile))
    assert meta["inputs"] == ["x: float32[batch, 4, h, w]"] and "profiles=[('x'" in meta["options"]


@pytest.mark.parametrize(("profiles", "match"), [
    ({"y": [[1], [1], [1]]}, "profiles name inputs the graph does not have: y"),
    ({"x": [[1, 4, 8, 8], [2, 4, 32, 32]]}, "must be \\[min, opt, max\\] shapes"),
    ({"x": [[2, 4, 8, 8], [1, 4, 32, 32], [4, 4, 64, 64]]}, "needs min <= opt <= max"),
    ({"x": [[1, 3, 8, 8], [1, 3, 8, 8], [1, 3, 8, 8]]}, "does not fit input x"),
    ({"x": [[1, 4, 8], [1, 4, 8], [1, 4, 8]]}, "does not fit input x"),
    ({"x": [[1, 4, 8, 0], [1, 4, 8, 8], [1, 4, 8, 8]]}, "must be a list of positive ints"),
])
def test_bad_profiles(backend, tmp_path, profiles, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OptionError, match=match):
        backend.build(_dynamic(), None, "sm86", tmp_path / "x.engine", profiles=profiles)


def test_parser_rejections_list_every_node_before_any_build(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Unique", ["a"], ["u"], name="uniq"),
             helper.make_node("StringNormalizer", ["s"], ["s2"], name="norm")]
    model = _model(nodes, {"x": ([4], F), "s": ([2], TensorProto.STRING)},
                   {"u": (None, F), "s2": ([2], TensorProto.STRING)})
    with pytest.raises(UnsupportedGraph) as info:
        backend.build(Graph(model), None, "sm86", tmp_path / "x.engine", precision="fp32")
    assert info.value.unsupported["Unique"] == ["uniq"]
    assert info.value.unsupported["StringNormalizer"] == ["norm"]
    assert "TensorRT-RTX's ONNX parser rejects the graph" in str(info.value)
    assert "\n" not in str(info.value)


def test_opset23_attention_is_refused_before_the_parser(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    shape = [1, 4, 16, 8]
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], name="/attn/Attention")]
    model = _model(nodes, {n: (shape, F) for n in "qkv"}, {"y": (shape, F)}, opset=23)
    with pytest.raises(UnsupportedGraph, match="crash TensorRT-RTX.*Attention \\(opset 23\\+\\) "
                                               "\\(nodes: /attn/Attention\\).*opset 17-22"):
        backend.build(Graph(model), None, "sm86", tmp_path / "x.engine")


def test_weights_override_the_graph() -> None:
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    opts = parse_options({})
    a = prepare(graph, None, opts)
    arrays = graph.initializer_arrays()
    name = graph.initializer_names[0]
    new = arrays[name] * 2
    b = prepare(graph, Weights.from_arrays({**arrays, name: new}), opts)
    assert a.graph_digest == b.graph_digest and a.weights_digest != b.weights_digest
    np.testing.assert_array_equal(b.weight_arrays()[name], new.astype(np.float16))


@pytest.mark.parametrize(("options", "match"), [
    ({"speed": 1}, "unknown options for the trt backend: speed"),
    ({"precision": "int8"}, "precision 'int8' is not one this backend accepts.*fp16 \\(f16, float16, half\\)"),
    ({"refit": "maybe"}, "refit 'maybe' is not one of auto, full, identical, none"),
    ({"cache": True}, "unknown options for the trt backend: cache"),  # an ahead-of-time build is never cached
    ({"shapes": [1, 2]}, "shapes must be a dict"),
    ({"profiles": "x"}, "profiles must be a dict"),
    ({"engine": "x.engine"}, "engine= names an engine to load"),
])
def test_bad_options(backend, tmp_path, options, match: str) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    with pytest.raises(SdrtError, match=match):
        backend.build(graph, None, "sm86", tmp_path / "x.engine", **options)


def test_unwritable_output_is_a_clear_error(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "file").write_text("not a folder")
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    with pytest.raises(TrtError, match="cannot write the engine file"):
        backend.build(graph, None, "sm86", tmp_path / "file" / "x.engine")
