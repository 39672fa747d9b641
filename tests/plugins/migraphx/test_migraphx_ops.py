"""Fail early: every op MIGraphX's ONNX parser lacks is listed with its nodes, before any long work."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from mx_helpers import conv_model, model, unsupported_model
from onnx import TensorProto, helper

import sdrt
from sdrt.errors import BackendUnavailable, UnsupportedGraph
from sdrt_migraphx import module, ops
from sdrt_migraphx.onnx_ops import ONNX_OPERATORS, SOURCE_COMMIT

TOOL = Path(__file__).parents[3] / "plugin-migraphx" / "tools" / "extract_onnx_ops.py"


def test_the_derived_list_has_the_ops_of_stable_diffusion_graphs():
    sd_ops = {"Conv", "MatMul", "Gemm", "Add", "Mul", "Div", "Sub", "Softmax", "LayerNormalization",
              "GroupNormalization", "InstanceNormalization", "Resize", "Concat", "Reshape", "Transpose", "Gather",
              "Slice", "Split", "Cast", "Erf", "Sigmoid", "Where", "Einsum", "Shape", "Unsqueeze", "Squeeze",
              "Expand", "ConstantOfShape", "Range", "ReduceMean", "Pow", "Sqrt", "Gelu", "Attention"}
    assert sd_ops <= ONNX_OPERATORS
    assert len(ONNX_OPERATORS) > 150 and len(SOURCE_COMMIT) == 40


def test_every_unsupported_op_is_listed_with_every_node_subgraphs_included():
    graph = sdrt.Graph.load(unsupported_model().SerializeToString())
    with pytest.raises(UnsupportedGraph) as info:
        ops.check(graph, None)
    err = info.value
    assert err.unsupported == {"Frobnicate": ["frob0", "frob1", "if0/then_branch/in_branch"], "Twist": ["twist0"]}
    text = str(err)
    assert "Frobnicate (nodes: frob0, frob1, if0/then_branch/in_branch)" in text and "Twist (nodes: twist0)" in text
    assert f"op list from MIGraphX's src/onnx/parse_*.cpp at {SOURCE_COMMIT[:12]}" in text
    assert "What to do:" in text and "\n" not in text


def test_a_supported_graph_passes():
    ops.check(sdrt.Graph.load(conv_model().SerializeToString()), None)


def test_nodes_without_names_are_labelled_by_index():
    m = model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Nope", ["a"], ["y"])],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    assert ops.unsupported_ops(m.graph, ONNX_OPERATORS) == {"Nope": ["#1 Nope"]}


def test_string_inputs_and_outputs_are_refused():
    m = model([helper.make_node("Identity", ["s"], ["t"], name="id")],
              [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
              [helper.make_tensor_value_info("t", TensorProto.STRING, [2])])
    with pytest.raises(UnsupportedGraph) as info:
        ops.check(sdrt.Graph.load(m.SerializeToString()), None)
    assert info.value.unsupported == {"object input": ["s"], "object output": ["t"]}
    assert "MIGraphX takes and returns only numeric and bool tensors" in str(info.value)


def test_compile_lists_unsupported_ops_even_without_migraphx(backend):
    from sdrt import Device

    graph = sdrt.Graph.load(unsupported_model().SerializeToString())
    device = Device(backend="migraphx", id="ref", kind="cpu", properties={"target": "ref"})
    with pytest.raises(UnsupportedGraph) as info:
        backend.compile(graph, None, device)
    assert set(info.value.unsupported) == {"Frobnicate", "Twist"}


def test_compile_without_migraphx_then_says_it_is_missing(backend):
    from sdrt import Device

    try:
        module.load()
    except BackendUnavailable:
        pass
    else:
        pytest.skip("MIGraphX is installed here; this test covers machines without it")
    device = Device(backend="migraphx", id="ref", kind="cpu", properties={"target": "ref"})
    with pytest.raises(BackendUnavailable, match="migraphx cannot be imported"):
        backend.compile(sdrt.Graph.load(conv_model().SerializeToString()), None, device)


def _tool():
    spec = importlib.util.spec_from_file_location("extract_onnx_ops", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_extractor_reads_every_operators_method(tmp_path):
    onnx_dir = tmp_path / "src" / "onnx"
    onnx_dir.mkdir(parents=True)
    (onnx_dir / "parse_binary_op.cpp").write_text('''
struct parse_binary_op : op_parser<parse_binary_op>
{
    std::vector<op_desc> operators() const
    {
        return {{"Add", "add"},
                {"Div", "div"}};
    }
    instruction_ref parse(const op_desc& opd, const onnx_parser& parser, onnx_parser::node_info info) const
    {
        if(contains(info.attributes, "axis")) { auto x = info.attributes.at("axis"); }
        return info.add_instruction(make_op(opd.op_name), args);
    }
};''')
    (onnx_dir / "parse_reduce_op.cpp").write_text('''
struct parse_reduce_mean : op_parser<parse_reduce_mean>
{
    std::vector<op_desc> operators() const { return {{"ReduceMean"}}; }
};
struct parse_reduce_l2 : op_parser<parse_reduce_l2>
{
    std::vector<op_desc> operators() const { return {{"ReduceL2"}}; }
};''')
    (onnx_dir / "onnx_parser.cpp").write_text('{"NotAParser"}')
    assert _tool().extract(tmp_path) == ["Add", "Div", "ReduceL2", "ReduceMean"]


def test_the_extractor_refuses_a_folder_without_parsers(tmp_path):
    with pytest.raises(SystemExit, match="no src/onnx/parse_"):
        _tool().extract(tmp_path)


def test_the_installed_migraphx_agrees_with_the_derived_list(migraphx):
    have = set(migraphx.get_onnx_operators())
    assert have == set(ONNX_OPERATORS), (sorted(have - ONNX_OPERATORS), sorted(ONNX_OPERATORS - have))


def test_with_migraphx_installed_its_own_list_is_used(migraphx):
    found, source = ops.supported_ops(migraphx)
    assert source == "migraphx.get_onnx_operators()" and "Conv" in found
