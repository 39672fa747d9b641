"""Graph.load: paths, bytes, external data kept inside the model folder, and every error path."""

from __future__ import annotations

import os

import gw_models as M
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.errors import ModelError, ModelNotFoundError
from sdrt.graph import Graph


def _x(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(9).standard_normal((batch, 8)).astype(np.float32)


def test_load_path_and_bytes_describe_the_same_graph(tmp_path):
    p = M.save(M.linear_model(), tmp_path / "lin.onnx")
    a = Graph.load(p)
    b = Graph.load(p.read_bytes())
    assert a.path == p and a.name == "lin.onnx" and b.path is None
    assert [str(i) for i in a.inputs] == ["x: float32[batch, 8]"] == [str(i) for i in b.inputs]
    assert a.outputs[0].shape == ("batch", 4)
    assert a.initializer_names == ["fc1.weight", "fc1.bias", "onnx::MatMul_7", "fc2.bias"]
    assert a.op_counts() == {"Gemm": 1, "Relu": 1, "MatMul": 1, "Add": 1}
    arrays = a.initializer_arrays()
    assert arrays["fc1.weight"].shape == (16, 8) and arrays["fc1.weight"].dtype == np.float32


def test_external_data_loads_and_runs_identically(tmp_path):
    model = M.linear_model()
    p = M.save_external(model, tmp_path / "ext.onnx")
    assert (tmp_path / "weights.bin").stat().st_size > 0
    g = Graph.load(p)
    assert g.mapped_initializers == []  # read in: graph.model is self-contained
    x = _x()
    np.testing.assert_array_equal(M.run_reference(g, {"x": x})["y"], M.run_reference(model, {"x": x})["y"])
    lazy = Graph.load(p, load_external=False)
    assert sorted(lazy.mapped_initializers) == sorted(g.initializer_names)
    for name, arr in lazy.initializer_arrays().items():
        assert M.is_mapped(arr) and not arr.flags.writeable
        np.testing.assert_array_equal(arr, g.initializer_arrays()[name])


def test_external_data_in_subfolder_is_allowed(tmp_path):
    (tmp_path / "data").mkdir()
    p = M.save_external(M.linear_model(), tmp_path / "m.onnx", location="data/w.bin")
    assert Graph.load(p).initializer_arrays()["fc2.bias"].shape == (4,)


def test_missing_file():
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        Graph.load("/nonexistent/model.onnx")


def test_folder_is_not_a_model(tmp_path):
    with pytest.raises(ModelError, match="folder"):
        Graph.load(tmp_path)


@pytest.mark.parametrize(("content", "what"), [
    (b"", "empty"),
    (b"hello, this is not a model at all\n" * 4, "not a valid ONNX model"),
    (b'{"a": 1}', "JSON"),
    (b"PK\x03\x04" + b"\0" * 60, "pickle"),
    (b"\x80\x02}q\x00." + b"\0" * 20, "pickle"),
])
def test_not_onnx_is_named(tmp_path, content, what):
    p = tmp_path / "x.onnx"
    p.write_bytes(content)
    with pytest.raises(ModelError, match=what) as e:
        Graph.load(p)
    assert str(p) in str(e.value)


def test_safetensors_passed_as_model_is_named(tmp_path):
    from sdrt.weights import stfile

    p = tmp_path / "w.safetensors"
    stfile.write(p, {"a": np.zeros(3, np.float32)})
    with pytest.raises(ModelError, match="safetensors") as e:
        Graph.load(p)
    assert "weights=" in str(e.value)


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.99])
def test_truncated_file(tmp_path, cut):
    data = M.linear_model().SerializeToString()
    p = tmp_path / "t.onnx"
    p.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ModelError, match="truncated|malformed") as e:
        Graph.load(p)
    assert str(p) in str(e.value)


def test_truncated_on_a_field_boundary_is_caught_by_wiring(tmp_path):
    m = M.linear_model()
    del m.graph.initializer[2:]  # what a cut after the second initializer leaves
    with pytest.raises(ModelError, match="nothing produces"):
        Graph.load(m.SerializeToString())


@pytest.mark.parametrize("opset", [5, 99])
def test_opset_outside_range(tmp_path, opset):
    m = M.linear_model()
    m.opset_import[0].version = opset
    p = M.save(m, tmp_path / "o.onnx")
    with pytest.raises(ModelError, match=f"opset {opset} is outside the supported range") as e:
        Graph.load(p)
    assert str(p) in str(e.value)


def test_no_default_opset(tmp_path):
    m = M.linear_model()
    m.opset_import[0].domain = "com.example"
    with pytest.raises(ModelError, match="no default-domain"):
        Graph.load(m.SerializeToString())


def test_newer_ir_version():
    m = M.linear_model()
    m.ir_version = onnx.IR_VERSION + 5
    with pytest.raises(ModelError, match="IR version"):
        Graph.load(m.SerializeToString())


def test_missing_external_data_file(tmp_path):
    p = M.save_external(M.linear_model(), tmp_path / "m.onnx")
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelError, match="'weights.bin'.*is missing") as e:
        Graph.load(p)
    assert str(p) in str(e.value)


def test_truncated_external_data_file(tmp_path):
    p = M.save_external(M.linear_model(), tmp_path / "m.onnx")
    w = tmp_path / "weights.bin"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(ModelError, match="truncated external-data"):
        Graph.load(p)


def _with_location(tmp_path, location: str):
    p = M.save_external(M.linear_model(), tmp_path / "m.onnx")
    m = onnx.load(str(p), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    return bad


@pytest.mark.parametrize("location", ["/etc/passwd", "../weights.bin", "sub/../../weights.bin", "..\\w.bin",
                                      "C:\\Windows\\win.ini", "\\\\server\\share\\w.bin"])
def test_external_location_outside_folder_is_refused(tmp_path, location):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    bad = _with_location(model_dir, location)
    with pytest.raises(ModelError, match="must stay inside the model folder") as e:
        Graph.load(bad)
    assert str(bad) in str(e.value)


@pytest.mark.parametrize("location", ["a" * 5000, "a/" * 3000, "weights.bin/x"])
def test_unresolvable_external_location(tmp_path, location):
    bad = _with_location(tmp_path, location)
    with pytest.raises(ModelError, match="cannot be resolved|cannot access|is missing"):
        Graph.load(bad)


def test_symlink_loop_is_refused(tmp_path):
    os.symlink(tmp_path / "loop1", tmp_path / "loop2")
    os.symlink(tmp_path / "loop2", tmp_path / "loop1")
    bad = _with_location(tmp_path, "loop1")
    with pytest.raises(ModelError):
        Graph.load(bad)


def test_overlong_model_and_weights_paths(tmp_path):
    from sdrt.errors import WeightsError
    from sdrt.weights import Weights

    with pytest.raises(ModelError, match="cannot access"):
        Graph.load(tmp_path / ("m" * 5000))
    with pytest.raises(WeightsError, match="cannot access"):
        Weights.open(tmp_path / ("w" * 5000))


def test_external_symlink_leading_out_is_refused(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 4096)
    os.symlink(secret, model_dir / "link.bin")
    bad = _with_location(model_dir, "link.bin")
    with pytest.raises(ModelError, match="symbolic link"):
        Graph.load(bad)


def test_external_symlink_inside_folder_is_fine(tmp_path):
    p = M.save_external(M.linear_model(), tmp_path / "m.onnx")
    os.rename(tmp_path / "weights.bin", tmp_path / "real.bin")
    os.symlink(tmp_path / "real.bin", tmp_path / "weights.bin")
    assert Graph.load(p).initializer_arrays()["fc1.bias"].shape == (16,)


def test_the_hugging_face_cache_layout_loads(tmp_path):
    """hf download / snapshot_download keep each file once in REPO/blobs/ and link REPO/snapshots/REV/... to it: the
    external data of every cached ONNX export led out of its folder, and sdrt refused it (onnxruntime loads it). A
    link into that blobs/ folder is taken; one that goes on from there (to a secret) is still refused."""
    repo = tmp_path / "models--org--sd-onnx"
    src = tmp_path / "export"
    src.mkdir()
    p = M.save_external(M.linear_model(), src / "model.onnx")
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abc" / "unet"
    snap.mkdir(parents=True)
    for name, blob in (("model.onnx", "h1"), ("weights.bin", "h2")):
        os.rename(src / name, repo / "blobs" / blob)
        os.symlink(f"../../../blobs/{blob}", snap / name)
    assert p.name == "model.onnx"
    g = Graph.load(snap / "model.onnx")
    assert g.initializer_arrays()["fc1.bias"].shape == (16,)
    secret = tmp_path / "secret.bin"
    os.rename(repo / "blobs" / "h2", secret)
    os.symlink(secret, repo / "blobs" / "h2")  # a blob that is itself a link out
    with pytest.raises(ModelError, match="symbolic link"):
        Graph.load(snap / "model.onnx")


def test_bytes_with_external_data_need_base_dir(tmp_path):
    p = M.save_external(M.linear_model(), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="given as bytes"):
        Graph.load(p.read_bytes())
    g = Graph.load(p.read_bytes(), base_dir=tmp_path)
    assert g.initializer_arrays()["fc2.bias"].shape == (4,)


def test_inline_tensor_with_wrong_byte_count():
    m = M.linear_model()
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]
    g = Graph.load(m.SerializeToString())
    with pytest.raises(ModelError, match="fc1.weight"):
        g.initializer_arrays()


def test_unknown_dtype_in_description_does_not_crash():
    m = M.linear_model()
    m.graph.input[0].type.tensor_type.elem_type = 999
    g = Graph.load(m.SerializeToString())
    assert g.inputs[0].dtype == "undefined"


def test_external_tensor_in_constant_node_is_read(tmp_path):
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    (tmp_path / "c.bin").write_bytes(arr.tobytes())
    t = M.external_tensor("c", TensorProto.FLOAT, [2, 3], "c.bin", 0, 24)
    g = helper.make_graph([helper.make_node("Constant", [], ["y"], value=t)], "c", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    p = tmp_path / "c.onnx"
    onnx.save(helper.make_model(g, opset_imports=M.OPSET), str(p))
    graph = Graph.load(p)
    np.testing.assert_array_equal(M.run_reference(graph, {})["y"], arr)


def test_large_model_above_2gb_maps_and_runs(tmp_path, registry):
    """A 2.25 GB embedding table in a sparse external-data file: loads (mapped) and runs a Gather.

    The file is sparse, so this costs no disk and no memory; bench/large_graph.py loads it fully too.
    """
    import sdrt

    rows, dim = 9 * 2**16, 1024  # 589824 x 1024 float32 = 2.25 GiB
    data = tmp_path / "table.bin"
    with open(data, "wb") as f:
        f.truncate(rows * dim * 4)
        for r in (0, 123_456, rows - 1):
            f.seek(r * dim * 4)
            f.write(np.full(dim, r, np.float32).tobytes())
    t = M.external_tensor("table", TensorProto.FLOAT, [rows, dim], "table.bin", 0, rows * dim * 4)
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "big",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", dim])], [t])
    p = tmp_path / "big.onnx"
    onnx.save(helper.make_model(g, opset_imports=M.OPSET), str(p))
    assert data.stat().st_size > 2**31
    graph = Graph.load(p)  # above 2 GiB the default keeps external data mapped
    assert graph.mapped_initializers == ["table"]
    assert graph.initializer_info()["table"].shape == (rows, dim)
    with sdrt.load(graph, backend="reference") as s:
        y = s.run({"ids": np.array([0, 123_456, rows - 1, 5], np.int64)})["y"]
    np.testing.assert_array_equal(y[:, 0], [0, 123_456, rows - 1, 0])
    assert graph.with_shapes(n=4).outputs[0].shape == (4, dim)  # inference never serializes the table


def test_numpy_helper_arrays_are_equal_to_onnx(tmp_path):
    m = M.linear_model()
    g = Graph.load(m.SerializeToString())
    for t in m.graph.initializer:
        np.testing.assert_array_equal(g.initializer_arrays([t.name])[t.name], numpy_helper.to_array(t))
    with pytest.raises(ModelError, match="no initializers named"):
        g.initializer_arrays(["nope"])


@pytest.mark.parametrize(("old", "new"), [(b"\x06linear", b"\x06\x80inear"), (b"\x05batch", b"\x05b\xffXch")])
def test_invalid_utf8_in_names_is_a_model_error(old, new):
    """Found by the fuzz campaign: protobuf hands invalid UTF-8 back as bytes, which failed later."""
    data = M.linear_model().SerializeToString()
    assert old in data
    with pytest.raises(ModelError, match="not UTF-8"):
        Graph.load(data.replace(old, new, 1))


@pytest.mark.parametrize("text, kind", [
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 3438167536\n", "a Git LFS pointer"),
    (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head></html>\n", "an HTML page"),
])
def test_a_placeholder_instead_of_the_file_is_named(tmp_path, text, kind):
    """A Hugging Face repository cloned without git-lfs holds pointers of three lines where its .onnx and
    .safetensors files are; a download that fetched a web page holds HTML. Both read as 'malformed or truncated
    protobuf' or as a safetensors header 'length 2336927755350992246'."""
    from sdrt.errors import WeightsError
    from sdrt.weights import Weights

    (tmp_path / "model.onnx").write_bytes(text)
    with pytest.raises(ModelError, match=f"not ONNX: it looks like {kind}.*git lfs pull"):
        Graph.load(tmp_path / "model.onnx")
    (tmp_path / "w.safetensors").write_bytes(text)
    with pytest.raises(WeightsError, match=f"not safetensors: it looks like {kind}.*git lfs pull"):
        Weights.open(tmp_path / "w.safetensors")


def test_a_windows_location_loads(tmp_path):
    """A model exported on Windows with its external data in a subfolder names it weights\\w.bin (os.path.join
    there): on Linux that file was 'missing'. A backslash location that names no file is read with slashes."""
    path = _with_location(tmp_path, "weights\\w.bin")
    (tmp_path / "weights").mkdir()
    os.rename(tmp_path / "weights.bin", tmp_path / "weights" / "w.bin")
    g = Graph.load(path)
    assert g.initializer_arrays()["fc1.bias"].shape == (16,)
    with pytest.raises(ModelError, match="'..'"):
        Graph.load(_with_location(tmp_path, "weights\\..\\..\\w.bin"))
