"""Large inline initializers stay in the .onnx file and are mapped from it (Graph.load), not held in the proto."""

from __future__ import annotations

import gw_models as M
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import sdrt
from sdrt.cache.identity import weights_identity
from sdrt.graph import Graph
from sdrt.graph.onnxfile import MAP_INLINE_MIN_BYTES, inline_spans


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    rows = MAP_INLINE_MIN_BYTES // (4 * 8) + 1  # just above the threshold
    big = rng.standard_normal((rows, 8)).astype(np.float32)
    small = rng.standard_normal((8,)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["big"], ["big_t"]), helper.make_node("MatMul", ["x", "big_t"], ["h"]),
         helper.make_node("Add", ["h", "bias"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(big.T.copy(), "big"), numpy_helper.from_array(small, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_large_inline_initializers_are_mapped_from_the_file_with_the_same_values(tmp_path, registry):
    model = _model()
    p = tmp_path / "m.onnx"
    onnx.save(model, p)
    spans = inline_spans(p.read_bytes())
    assert list(spans) == ["big"]  # the 32-byte bias stays inline
    g = Graph.load(p)
    assert g.mapped_initializers == ["big"]
    t = next(t for t in g.model.graph.initializer if t.name == "big")
    assert not t.raw_data  # the proto holds no weight bytes
    arrays = g.initializer_arrays()
    assert M.is_mapped(arrays["big"]) and not arrays["big"].flags.writeable
    for init in model.graph.initializer:
        np.testing.assert_array_equal(arrays[init.name], numpy_helper.to_array(init))
    x = np.random.default_rng(4).standard_normal((2, model.graph.input[0].type.tensor_type.shape.dim[1].dim_value)
                                                 ).astype(np.float32)
    with sdrt.load(g, backend="reference") as session:  # the backend gets the mapped arrays
        np.testing.assert_array_equal(session.run({"x": x})["y"], M.run_reference(model, {"x": x})["y"])
    eager = Graph.load(p, load_external=True)  # asked to read everything in: nothing mapped
    assert eager.mapped_initializers == []
    np.testing.assert_array_equal(eager.initializer_arrays()["big"], arrays["big"])
    # the cache key names the file (a rewritten file misses) instead of hashing the bytes
    assert weights_identity(g) == weights_identity(Graph.load(p))


def test_saving_a_mapped_graph_writes_its_weights_inline_even_over_its_own_file(tmp_path):
    model = _model()
    p = tmp_path / "m.onnx"
    onnx.save(model, p)
    g = Graph.load(p)
    g.save(p)  # over the file its weights are mapped from: written whole, nothing destroyed
    again = onnx.load(p)
    assert not any(t.data_location == TensorProto.EXTERNAL for t in again.graph.initializer)
    for a, b in zip(again.graph.initializer, model.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    other = tmp_path / "sub"
    other.mkdir()
    Graph.load(p).save(other / "copy.onnx")  # elsewhere too: self-contained
    np.testing.assert_array_equal(Graph.load(other / "copy.onnx", load_external=True).initializer_arrays()["big"],
                                  numpy_helper.to_array(model.graph.initializer[0]))


def test_packed_4bit_initializers_read_from_the_file_as_onnx_reads_them(tmp_path):
    """ONNX stores INT4/UINT4/FLOAT4E2M1 two values a byte: a large one, left in the .onnx file or in external data,
    is unpacked (it was viewed byte for byte, and `--quantize int4` on any real model ended in a traceback)."""
    import ml_dtypes

    rng = np.random.default_rng(5)
    n = 2 * MAP_INLINE_MIN_BYTES + 7  # over the threshold once packed, and odd
    values = {"i4": rng.integers(-8, 8, n).astype(ml_dtypes.int4),
              "u4": rng.integers(0, 16, n).astype(ml_dtypes.uint4),
              "f4": rng.choice([0, 0.5, 1, 1.5, -2, 3, -4, 6], n).astype(ml_dtypes.float4_e2m1fn)}
    inits = [numpy_helper.from_array(v, k) for k, v in values.items()]
    nodes = [helper.make_node("Cast", [k], [f"{k}_f"], to=TensorProto.FLOAT) for k in values]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(f"{k}_f", TensorProto.FLOAT, [n])
                                               for k in values], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    inline, external = tmp_path / "inline.onnx", tmp_path / "external.onnx"
    onnx.save(model, inline)
    onnx.save(model, external, save_as_external_data=True, location="external.onnx.data", size_threshold=0)
    for p in (inline, external):
        arrays = Graph.load(p).initializer_arrays()
        for init in onnx.load(p).graph.initializer:
            expected = numpy_helper.to_array(init, base_dir=str(tmp_path))
            assert arrays[init.name].dtype == expected.dtype and arrays[init.name].shape == (n,)
            np.testing.assert_array_equal(arrays[init.name].view(np.uint8), expected.view(np.uint8))


def test_a_model_file_linked_from_another_folder_maps_its_own_inline_weights(tmp_path):
    """`unet/model.onnx` a symbolic link to a file elsewhere (a model assembled from parts): the weights left in that
    file are its own bytes, not external data leading out of the folder (that was refused as such)."""
    model = _model()
    (tmp_path / "store").mkdir()
    (tmp_path / "model" / "unet").mkdir(parents=True)
    real = tmp_path / "store" / "unet-int8.onnx"
    onnx.save(model, real)
    link = tmp_path / "model" / "unet" / "model.onnx"
    link.symlink_to(real)
    g = Graph.load(link)
    assert g.mapped_initializers == ["big"]
    np.testing.assert_array_equal(g.initializer_arrays()["big"],
                                  numpy_helper.to_array(model.graph.initializer[0]))


def test_rewriting_without_the_inline_weights_reads_the_file_or_the_bytes_alike(tmp_path):
    """``without_inline`` writes the rewritten model once, reading the kept spans from the open file with plain reads
    (as Graph.load does) or from the bytes given: both give the same model, whose external references point at the original bytes."""
    from sdrt.graph.onnxfile import FileBytes, without_inline

    rng = np.random.default_rng(7)
    rows = MAP_INLINE_MIN_BYTES // (4 * 8) + 1
    inits = []
    for i in range(3):  # large and small initializers interleaved
        inits.append(numpy_helper.from_array(rng.standard_normal((rows, 8)).astype(np.float32), f"big{i}"))
        inits.append(numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), f"small{i}"))
    nodes = [helper.make_node("Identity", [t.name], [f"o{k}"]) for k, t in enumerate(inits)]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(f"o{k}", TensorProto.FLOAT, None)
                                               for k in range(len(inits))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    p = tmp_path / "m.onnx"
    onnx.save(model, p)
    data = p.read_bytes()
    from_bytes, spans = without_inline(data, p.name)
    class SmallBlocks(FileBytes):
        BLOCK = 64  # many blocks: tags and names that straddle them

    with open(p, "rb") as f:
        from_file, spans_f = without_inline(SmallBlocks(f, len(data)), p.name, source=f)
    assert bytes(from_bytes) == bytes(from_file) and spans == spans_f
    assert sorted(spans) == ["big0", "big1", "big2"]
    rewritten = onnx.ModelProto()
    rewritten.ParseFromString(from_file)
    assert [n.name for n in rewritten.graph.node] == [n.name for n in model.graph.node]
    for got, want in zip(rewritten.graph.initializer, model.graph.initializer):
        assert got.name == want.name
        if got.name in spans:
            off, length = spans[got.name]
            assert not got.raw_data and {e.key: e.value for e in got.external_data} == {
                "location": "m.onnx", "offset": str(off), "length": str(length)}
            assert data[off:off + length] == want.raw_data
        else:
            assert got.raw_data == want.raw_data
