"""A GGUF file's block types kept as stored on ggml: matmul weights bound from a GGUF file run by ggml's quantized
mul_mat on the file's blocks, checked against ggml on the same weights dequantized to float32.

The tiny graph has the two forms a checkpoint's Linear takes in an ONNX export: a MatMul whose weight is the
initializer laid out [in, out] (torch's exporter folds the transpose: the file's [out, in] blocks are its
transpose, used as they are) and a Gemm with transB=1 whose weight is [out, in]; plus an embedding table (a
Gather) stored in the same block type, which the lowering must dequantize. The tensors are bound the way a
checkpoint is (``sdrt.checkpoint.Checkpoint``: names matched through the graph's parameter map, the MatMul
weight's layout read from its consumer).

Tolerance: ggml's quantized mul_mat quantizes the activations too, to its ``vec_dot_type`` (Q8_0 or Q8_1: 8-bit
blocks of 32 with one scale; Q8_K for the K-, IQ and TQ types: blocks of 256), each value within half a step,
``amax/254`` of its block, of the float32 one. A dot product of K such values errs by about
``amax / 254 / sqrt(3) * sqrt(K) * rms(w)``, a few 1e-3 of the output's scale; two matmuls in a row compound
it. 3e-2 of the output's largest value is that with headroom (measured 3.7e-3 to 9.7e-3 over the types); the float32 weights the
reference runs are exactly the file's dequantized values, so no weight error enters the comparison.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf_files import GGML_QUANTIZED, NUMPY_QUANTIZED, encode, write

import sdrt
from sdrt.checkpoint import Checkpoint
from sdrt.checkpoint.ldm import Source
from sdrt.graph import Graph
from sdrt.weights import Weights
from sdrt.weights.blocks import BlockMatrix

sdrt_ggml = pytest.importorskip("sdrt_ggml", reason="the sdrt-ggml plugin is not installed")

M, K, N1, N2, V = 8, 256, 256, 64, 16  # K and N1 whole super-blocks of 256 (the K-quants' rows)
TOL = 3e-2


@pytest.fixture(autouse=True)
def ggml_backend(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    registry.register_plugin(sdrt_ggml, "ggml", distribution="sdrt-ggml", version="0.1.0")
    return registry


def _graph(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((K, N1)).astype(np.float32), "proj.weight"),
             numpy_helper.from_array(rng.standard_normal((N2, N1)).astype(np.float32), "fc.weight"),
             numpy_helper.from_array(rng.standard_normal(N2).astype(np.float32), "fc.bias"),
             numpy_helper.from_array(rng.standard_normal((V, K)).astype(np.float32), "emb.weight")]
    nodes = [helper.make_node("Gather", ["emb.weight", "ids"], ["e"], name="/emb/Gather"),
             helper.make_node("Add", ["x", "e"], ["xe"], name="/Add"),
             helper.make_node("MatMul", ["xe", "proj.weight"], ["h"], name="/proj/MatMul"),
             helper.make_node("Gemm", ["h", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1)]
    g = helper.make_graph(nodes, "blocks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K]),
                                            helper.make_tensor_value_info("ids", TensorProto.INT64, [M])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N2])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "blocks.onnx"
    path.write_bytes(model.SerializeToString())
    return Graph.load(path)


def _gguf(tmp_path, type_name):
    """The graph's weights as a checkpoint stores them ([out, in] for both Linears), matrices in ``type_name``."""
    rng = np.random.default_rng(1)
    vals = {"proj.weight": rng.standard_normal((N1, K)).astype(np.float32) * 0.05,  # [out, in]
            "fc.weight": rng.standard_normal((N2, N1)).astype(np.float32) * 0.05,
            "emb.weight": rng.standard_normal((V, K)).astype(np.float32)}
    tensors = {k: (type_name, encode(type_name, v), v.shape) for k, v in vals.items()}
    tensors["fc.bias"] = ("F32", rng.standard_normal(N2).astype(np.float32), (N2,))
    return write(tmp_path / f"w-{type_name}.gguf", tensors)


def _bound(graph, path):
    w = Weights.open(path)
    names = ["proj.weight", "fc.weight", "fc.bias", "emb.weight"]
    ck = Checkpoint(w, {"m": {n: Source(n) for n in names}}, "test", path)
    return Weights(ck.lazy({"m": graph})["m"], sources=[path])


def _feeds():
    rng = np.random.default_rng(2)
    return {"x": rng.standard_normal((M, K)).astype(np.float32), "ids": rng.integers(0, V, M).astype(np.int64)}


@pytest.mark.parametrize("type_name", NUMPY_QUANTIZED + GGML_QUANTIZED)
def test_gguf_blocks_run_as_stored_on_ggml(tmp_path, type_name, caplog):
    from sdrt_ggml.quant import gguf_types

    if type_name in GGML_QUANTIZED:
        pytest.importorskip("ggml", reason="ggml-python quantizes this type for the test file")
    if type_name not in gguf_types():
        pytest.skip(f"this ggml build's CPU mul_mat does not take {type_name}")
    graph = _graph(tmp_path)
    weights = _bound(graph, _gguf(tmp_path, type_name))
    # the binding carries the file's blocks onto the two matmul weights (and the embedding table, a 2-D tensor)
    proj, fc = weights.blocks("proj.weight"), weights.blocks("fc.weight")
    assert isinstance(proj, BlockMatrix) and proj.transposed and proj.shape == (K, N1)  # [in, out] = blocks^T
    assert isinstance(fc, BlockMatrix) and not fc.transposed and fc.shape == (N2, N1)
    dense = {n: np.asarray(weights[n]) for n in weights}  # float32: the file's values, dequantized
    np.testing.assert_array_equal(np.asarray(proj), dense["proj.weight"])
    feeds = _feeds()
    with caplog.at_level("INFO", logger="sdrt"):
        kept = sdrt.load(graph, backend="ggml", weights=weights, precision="fp32")
    with kept, sdrt.load(graph, backend="ggml", weights=Weights.from_arrays(dense), precision="fp32") as ref:
        got, want = kept.run(feeds)["y"], ref.run(feeds)["y"]
        hits = kept.impl_hits
        assert hits.get(f"mul_mat_{type_name}") == 2, hits  # both matmuls on the file's blocks
        lo = kept._lo
        assert lo.blocks_kept == {type_name: 2} and lo.blocks_dequantized == {type_name: 1}  # the Gather's table
        # the matmul weights take their stored size in ggml's buffers, not float32's
        f32 = sum(dense[n].nbytes for n in dense)
        q = proj.nbytes + fc.nbytes + dense["emb.weight"].nbytes + dense["fc.bias"].nbytes
        assert kept.weight_bytes() <= q + 4096 and kept.weight_bytes() < ref.weight_bytes()
        assert ref.weight_bytes() >= f32 - dense["emb.weight"].nbytes
    assert f"2 {type_name} kept for ggml's quantized mul_mat" in caplog.text
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= TOL, (type_name, err)


def test_other_backends_layouts_and_updates(tmp_path):
    """A backend that keeps no blocks gets float32 from the same binding; a GGUF tensor bound by name in the graph's
    own [in, out] layout (its blocks along the output axis, not the reduction) is dequantized, not misread; and
    update_weights from float32 weights to the GGUF file lowers again with the blocks kept."""
    graph = _graph(tmp_path)
    path = _gguf(tmp_path, "Q8_0")
    weights = _bound(graph, path)
    arrays = sdrt.resolve_weights(graph, weights)
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays.values())
    assert isinstance(sdrt.resolve_weights(graph, weights, blocks={"Q8_0"})["proj.weight"], BlockMatrix)
    dense = Weights.from_arrays(arrays)
    feeds = _feeds()
    with sdrt.load(graph, backend="ggml", weights=dense, precision="fp32") as s:
        want = s.run(feeds)["y"]
        assert not any(k.startswith("mul_mat_Q") for k in s.impl_hits)
        s.update_weights(weights)
        assert s.impl_hits.get("mul_mat_Q8_0") == 2
        got = s.run(feeds)["y"]
    assert 0 < np.abs(got - want).max() <= TOL * np.abs(want).max()
    # by name, no checkpoint: "proj.weight" stored as the graph holds it, [K, N1], blocks along N1
    rng = np.random.default_rng(3)
    w_in_out = rng.standard_normal((K, N1)).astype(np.float32) * 0.05
    own = write(tmp_path / "own.gguf", {"proj.weight": ("Q8_0", encode("Q8_0", w_in_out), (K, N1)),
                                        "fc.weight": ("F32", arrays["fc.weight"], (N2, N1)),
                                        "fc.bias": ("F32", arrays["fc.bias"], (N2,)),
                                        "emb.weight": ("F32", arrays["emb.weight"], (V, K))})
    byname = Weights.open(own)
    flat = Weights.from_arrays({n: np.asarray(byname[n]) for n in byname})
    with sdrt.load(graph, backend="ggml", weights=byname, precision="fp32") as a, \
            sdrt.load(graph, backend="ggml", weights=flat, precision="fp32") as b:
        assert a._lo.blocks_dequantized == {"Q8_0": 1} and not a._lo.blocks_kept
        np.testing.assert_array_equal(a.run(feeds)["y"], b.run(feeds)["y"])


def test_a_transpose_then_matmul_runs_on_the_blocks(tmp_path, caplog):
    """torch's dynamo exporter (sdrt's shipped graphs) writes a Linear as the [out, in] weight, a Transpose, then a
    MatMul: the Transpose of a block weight is the same blocks read the other way, so the MatMul still runs ggml's
    quantized mul_mat on the file's blocks and nothing is dequantized."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    init = numpy_helper.from_array(rng.standard_normal((N1, K)).astype(np.float32), "lin.weight")  # [out, in]
    nodes = [helper.make_node("Transpose", ["lin.weight"], ["wt"], perm=[1, 0], name="/lin/Transpose"),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="/lin/MatMul")]
    g = helper.make_graph(nodes, "tlin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N1])], [init])
    path = tmp_path / "tlin.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    graph = Graph.load(path)
    vals = rng.standard_normal((N1, K)).astype(np.float32) * 0.05
    gg = write(tmp_path / "tlin.gguf", {"lin.weight": ("Q8_0", encode("Q8_0", vals), vals.shape)})
    ck = Checkpoint(Weights.open(gg), {"m": {"lin.weight": Source("lin.weight")}}, "test", gg)
    weights = Weights(ck.lazy({"m": graph})["m"], sources=[gg])
    dense = Weights.from_arrays({"lin.weight": np.asarray(weights["lin.weight"])})
    x = rng.standard_normal((M, K)).astype(np.float32)
    with caplog.at_level("INFO", logger="sdrt"):
        kept = sdrt.load(graph, backend="ggml", weights=weights, precision="fp32")
    with kept, sdrt.load(graph, backend="ggml", weights=dense, precision="fp32") as ref:
        assert kept.impl_hits.get("mul_mat_Q8_0") == 1, kept.impl_hits
        assert kept._lo.blocks_kept == {"Q8_0": 1} and not kept._lo.blocks_dequantized
        got, want = kept.run({"x": x})["y"], ref.run({"x": x})["y"]
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= TOL


def test_a_released_parts_gguf_pages_leave_the_resident_set(tmp_path):
    """A GGUF file is mapped once for all its tensors and stays mapped while its Weights live; release_weights (what
    a part released after use calls) advises that mapping away: its pages leave this process's resident set."""
    from sdrt.weights.pages import release_weights

    graph = _graph(tmp_path)
    weights = _bound(graph, _gguf(tmp_path, "Q8_0"))
    bm = weights.blocks("proj.weight")
    assert float(np.asarray(bm).sum()) != 0  # every page of the tensor read
    advised = release_weights(weights)
    assert advised >= bm.nbytes  # the whole file's mapping, which holds the tensor
    np.testing.assert_array_equal(np.asarray(weights.blocks("proj.weight")), np.asarray(bm))  # still readable
    assert release_weights(Weights.from_arrays({"a": np.zeros(4, np.float32)})) == 0  # nothing mapped: nothing done
