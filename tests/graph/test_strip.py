"""`sdrt strip`: a weight-free graph plus a .safetensors; the round trip is bit-identical."""

from __future__ import annotations

import os
import stat

import gw_models as M
import numpy as np
import onnx
import pytest

import sdrt
from sdrt.cli import main
from sdrt.errors import ModelError, WeightsError
from sdrt.graph import Graph
from sdrt.weights import Weights

X = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)


def _run(model, weights=None) -> np.ndarray:
    with sdrt.load(model, weights=weights, backend="reference") as s:
        return s.run({"x": X})["y"]


@pytest.mark.parametrize("external", [False, True])
def test_cli_strip_round_trip_is_bit_identical(tmp_path, registry, capsys, external):
    src = (M.save_external if external else M.save)(M.linear_model(), tmp_path / "lin.onnx")
    assert main(["strip", str(src)]) == 0
    out = capsys.readouterr().out
    stripped, weights = tmp_path / "lin.stripped.onnx", tmp_path / "lin.stripped.safetensors"
    assert f"{stripped.stat().st_size:,} bytes" in out and f"{weights.stat().st_size:,} bytes" in out
    # the stripped graph holds no weight bytes
    m = onnx.load(str(stripped), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data for t in m.graph.initializer)
    assert stripped.stat().st_size < 1000
    # the safetensors file holds every initializer under its ONNX name, bit for bit
    original = Graph.load(src)
    w = Weights.open(weights)
    assert sorted(w) == sorted(original.initializer_names)
    for name, arr in original.initializer_arrays().items():
        assert w[name].tobytes() == arr.tobytes() and w[name].shape == arr.shape
    want = _run(src)
    got = _run(stripped, weights=weights)
    assert got.tobytes() == want.tobytes()
    assert _run(stripped).tobytes() == want.tobytes()  # its own weights file, found next to it
    # it is still standard ONNX: onnxruntime runs the pair as is
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(stripped), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], want, rtol=1e-5, atol=1e-5)


def test_stripped_graph_with_other_weights_and_no_default_file(tmp_path, registry):
    src = M.save(M.linear_model(), tmp_path / "lin.onnx")
    res = Graph.load(src).strip(tmp_path / "s.onnx")
    custom = tmp_path / "custom.safetensors"
    w = Weights.open(res.weights_path)
    Weights.from_arrays({k: np.asarray(w[k]) * 2 for k in w}).save(custom)
    res.weights_path.unlink()  # only the custom weights remain
    g = Graph.load(res.graph_path)
    assert g.is_stripped and sorted(g.mapped_initializers) == sorted(g.initializer_names)
    assert not g.has_data("fc1.weight")
    y = _run(g, weights=custom)
    ref = M.linear_model()
    for t in ref.graph.initializer:
        t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t) * 2, t.name))
    np.testing.assert_array_equal(y, M.run_reference(ref, {"x": X})["y"])
    with pytest.raises(ModelError, match="is missing"):
        _run(g)  # no weights given and its own file is gone
    # transforms still work without the weights: nothing is read
    assert g.with_shapes(batch=3).fold_constants().outputs[0].shape == (3, 4)


def test_stripped_graph_from_bytes_takes_weights(tmp_path, registry):
    res = Graph.load(M.linear_model().SerializeToString()).strip(tmp_path / "s.onnx")
    g = Graph.load(res.graph_path.read_bytes())  # no folder: its own weights cannot be found
    assert g.is_stripped and not g.has_data("fc1.weight")
    assert _run(g, weights=res.weights_path).tobytes() == _run(M.save(M.linear_model(), tmp_path / "o.onnx")).tobytes()


def test_stripped_graph_with_wrong_weights_lists_every_problem(tmp_path, registry):
    res = Graph.load(M.save(M.linear_model(), tmp_path / "lin.onnx")).strip(tmp_path / "s.onnx")
    w = Weights.open(res.weights_path)
    bad = {k: np.asarray(w[k]) for k in w if k != "fc2.bias"}
    bad["fc1.weight"] = bad["fc1.weight"].T.copy()
    bad["extra"] = np.zeros(2, np.float32)
    with pytest.raises(WeightsError) as e:
        _run(res.graph_path, weights=Weights.from_arrays(bad))
    msg = str(e.value)
    assert "fc2.bias" in msg and "extra" in msg and "fc1.weight: weights float32[8, 16] vs graph float32[16, 8]" in msg


def test_strip_weights_must_sit_next_to_graph(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    g = Graph.load(M.linear_model().SerializeToString())
    with pytest.raises(ModelError, match="same folder"):
        g.strip(tmp_path / "a" / "s.onnx", tmp_path / "b" / "w.safetensors")


def test_strip_cli_on_broken_model_reports_error(tmp_path, capsys):
    p = tmp_path / "x.onnx"
    p.write_bytes(b"garbage" * 10)
    assert main(["strip", str(p)]) == 1
    assert "error:" in capsys.readouterr().err


def test_save_too_large_or_elsewhere(tmp_path):
    p = M.save_external(M.linear_model(), tmp_path / "m.onnx")
    lazy = Graph.load(p, load_external=False)
    (tmp_path / "other").mkdir()
    with pytest.raises(ModelError, match="breaks them"):
        lazy.save(tmp_path / "other" / "m.onnx")
    assert Graph.load(lazy.save(tmp_path / "m2.onnx")).initializer_arrays()["fc1.bias"].shape == (16,)


def test_cli_strip_output_options(tmp_path, registry, capsys):
    src = M.save(M.conv_model(), tmp_path / "conv.onnx")
    out = tmp_path / "out"
    # a missing output folder is refused, as sdrt generate refuses it (strip created it): nothing is made
    assert main(["strip", str(src), "-o", str(out / "c.onnx")]) == 1
    assert "the folder of -o" in capsys.readouterr().err and not out.exists()
    (out / "w").mkdir(parents=True)
    assert main(["strip", str(src), "-o", str(out / "c.onnx"), "--weights", str(out / "w" / "c.safetensors")]) == 0
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 5)).astype(np.float32)
    with sdrt.load(out / "c.onnx", backend="reference") as s:  # finds w/c.safetensors by its relative location
        got = s.run({"x": x})["y"]
    assert got.tobytes() == M.run_reference(M.conv_model(), {"x": x})["y"].tobytes()


def test_cli_strip_missing_model(tmp_path, capsys):
    assert main(["strip", str(tmp_path / "nope.onnx")]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "flag"), [
    (["v.onnx", "-o", "v.safetensors"], "-o and the default --weights"),  # the default weights path is the graph
    (["v.onnx", "-o", "out.onnx", "--weights", "out.onnx"], "-o and --weights name one file"),
    (["v.onnx", "--weights", "v.onnx"], "--weights v.onnx is a file the input model is read from"),
    (["v.onnx", "-o", "v.onnx"], "-o v.onnx is a file the input model is read from"),
    (["v.onnx", "-o", "./sub/../v.onnx"], "is a file the input model is read from"),
    (["v.onnx", "-o", "hard.onnx"], "-o hard.onnx is a file the input model is read from (v.onnx)"),  # a hard link
    (["e.onnx", "--weights", "weights.bin"], "--weights weights.bin is a file the input model is read from"),
])
def test_cli_strip_refuses_outputs_that_would_destroy_the_input_or_each_other(tmp_path, capsys, monkeypatch,
                                                                              args, flag):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    M.save(M.linear_model(), tmp_path / "v.onnx")
    M.save_external(M.linear_model(), tmp_path / "e.onnx")
    (tmp_path / "hard.onnx").hardlink_to(tmp_path / "v.onnx")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert main(["strip", *args]) == 1
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before, "nothing was written"
    with pytest.raises(ModelError, match="out_graph and out_weights name one file"):
        Graph.load(tmp_path / "v.onnx").strip(tmp_path / "w.onnx", tmp_path / "w.onnx")


def test_cli_strip_reports_the_original_size_measured_before_writing(tmp_path, capsys):
    src = M.save_external(M.linear_model(), tmp_path / "e.onnx")
    original = src.stat().st_size + (tmp_path / "weights.bin").stat().st_size
    assert main(["strip", str(src)]) == 0
    assert f"original: {original:,} bytes" in capsys.readouterr().out


def test_strip_outputs_get_the_usual_mode_and_a_read_only_file_is_refused(tmp_path, capsys):
    src = M.save(M.linear_model(), tmp_path / "v.onnx")
    out, weights = tmp_path / "s.onnx", tmp_path / "s.safetensors"
    old = os.umask(0o027)
    try:
        assert main(["strip", str(src), "-o", str(out)]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o640 and stat.S_IMODE(weights.stat().st_mode) == 0o640
        out.chmod(0o604)  # a file written over keeps its mode, as with a plain open()
        weights.chmod(0o600)
        assert main(["strip", str(src), "-o", str(out)]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o604 and stat.S_IMODE(weights.stat().st_mode) == 0o600
    finally:
        os.umask(old)
    capsys.readouterr()
    for target in (weights, out):
        target.chmod(0o444)
        kept = {p: p.read_bytes() for p in (out, weights)}
        other = tmp_path / "other.onnx"
        args = ["-o", str(out)] if target == out else ["-o", str(other), "--weights", str(weights)]
        assert main(["strip", str(src), *args]) == 1
        err = capsys.readouterr().err
        assert "read-only file" in err and str(target) in err and "Traceback" not in err
        assert {p: p.read_bytes() for p in (out, weights)} == kept and stat.S_IMODE(target.stat().st_mode) == 0o444
        target.chmod(0o644)


def test_strip_keeps_4bit_weights_inline(tmp_path):
    """`sdrt strip` of `sdrt quantize --to int4`'s own output died: 'dtype int4 cannot be stored in safetensors'.
    4-bit initializers stay in the graph (as strings do); the rest go to the weights file, and the pair runs."""
    from onnx import TensorProto, helper, numpy_helper

    from sdrt import quantization as Q

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.ones(32, np.float32), "b")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], [w, b])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(src))
    q = Q.quantize(Graph.load(src), "int4", keep_layers=())
    q.save(tmp_path / "m.int4.onnx")
    res = Graph.load(tmp_path / "m.int4.onnx").strip(tmp_path / "s.onnx")
    stripped = onnx.load(str(tmp_path / "s.onnx"), load_external_data=False)
    inline = {t.name for t in stripped.graph.initializer if t.data_location != TensorProto.EXTERNAL}
    assert inline == {"w_quantized"} and res.tensors == len(stripped.graph.initializer) - 1
    x = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    ref = onnx.reference.ReferenceEvaluator(str(tmp_path / "m.int4.onnx")).run(None, x)[0]
    np.testing.assert_array_equal(onnx.reference.ReferenceEvaluator(str(tmp_path / "s.onnx")).run(None, x)[0], ref)


def test_cli_strip_puts_a_bare_weights_name_in_the_outputs_folder(tmp_path, monkeypatch, capsys):
    """--weights is 'the weights file to write, in the output's folder': a bare name was taken from the current
    folder instead, and refused ('the weights file must sit in the stripped graph's folder')."""
    src = M.save(M.linear_model(), tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    assert main(["strip", str(src), "-o", str(tmp_path / "out" / "s.onnx"), "--weights", "w.safetensors"]) == 0
    assert (tmp_path / "out" / "w.safetensors").is_file() and not (tmp_path / "w.safetensors").exists()
    assert Graph.load(tmp_path / "out" / "s.onnx").initializer_arrays()["fc1.bias"].shape == (16,)
