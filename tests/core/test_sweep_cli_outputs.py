"""Outputs of strip, quantize, conformance and run, as a newcomer gives them: a dangling symlink as -o or
--weights (quantize quantized the whole graph, then said "check free disk space"; strip replaced a --weights link
with a file), -o beside a symlink into another folder, two outputs that name one file, a flag another one voids."""

from __future__ import annotations

import numpy as np
import pytest

from sdrt.cli import main


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("flag", ["-o", "--weights"])
def test_strip_refuses_a_dangling_link_and_keeps_it(affine_path, tmp_path, capsys, flag):
    link = tmp_path / ("out.onnx" if flag == "-o" else "out.safetensors")
    link.symlink_to(tmp_path / "gone" / link.name)
    assert main(["strip", str(affine_path), flag, str(link)]) == 1
    err = _error(capsys)
    assert "is a symlink to" in err and "which does not exist" in err and f"Where: {flag}." in err
    assert link.is_symlink() and not (tmp_path / "gone").exists()


def test_strip_writes_through_a_weights_link_and_the_graph_finds_them(affine_path, tmp_path, capsys):
    """A live --weights link is written through as -o's is (the link stays): the weights replaced the link with a
    file while the graph named the link's target, which kept its old bytes, so the stripped graph did not load."""
    from sdrt.graph import Graph

    (tmp_path / "target.safetensors").write_bytes(b"old")
    link = tmp_path / "w.safetensors"
    link.symlink_to("target.safetensors")
    assert main(["strip", str(affine_path), "-o", str(tmp_path / "g.onnx"), "--weights", str(link)]) == 0
    capsys.readouterr()
    assert link.is_symlink() and (tmp_path / "target.safetensors").stat().st_size > 3
    want, got = Graph.load(affine_path).initializer_arrays(), Graph.load(tmp_path / "g.onnx").initializer_arrays()
    assert want.keys() == got.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def test_strip_names_the_link_that_moves_the_graph_away_from_its_weights(affine_path, tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out.onnx").symlink_to(tmp_path / "elsewhere" / "g.onnx")
    (tmp_path / "elsewhere" / "g.onnx").write_bytes(b"old")
    assert main(["strip", str(affine_path), "-o", str(tmp_path / "out.onnx")]) == 1
    err = _error(capsys)
    assert "-o is a symlink to" in err and "Where: -o." in err
    assert (tmp_path / "elsewhere" / "g.onnx").read_bytes() == b"old"
    assert main(["strip", str(affine_path), "-o", str(tmp_path / "out.onnx"), "--weights",
                 str(tmp_path / "elsewhere" / "w.safetensors")]) == 0  # the fix it gives works


def test_quantize_refuses_a_dangling_link_before_the_work(affine_path, tmp_path, capsys):
    link = tmp_path / "q.onnx"
    link.symlink_to(tmp_path / "gone" / "q.onnx")
    assert main(["quantize", str(affine_path), "--to", "int8", "-o", str(link)]) == 1
    err = _error(capsys)
    assert "is a symlink to" in err and "Where: -o." in err and "disk space" not in err


def test_quantize_plan_with_an_output_is_refused(affine_path, tmp_path, capsys):
    assert main(["quantize", str(affine_path), "--to", "int8", "--plan", "-o", str(tmp_path / "q.onnx")]) == 1
    assert "--plan lists the weights and writes nothing, so -o would be ignored" in _error(capsys)
    assert not (tmp_path / "q.onnx").exists()


def test_conformance_json_and_markdown_in_one_file_are_refused_before_the_run(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["conformance", "reference", "--suite", "node", "-k", "test_abs_cpu$", "--json", str(out),
                 "--markdown", f"{tmp_path}/./r.json"]) == 1
    assert "--json and --markdown name one file" in _error(capsys) and not out.exists()


def test_run_refuses_one_weights_file_given_twice(affine_path, tmp_path, capsys):
    from safetensors.numpy import save_file

    w = tmp_path / "w.safetensors"
    save_file({"W": np.ones((4, 3), np.float32)}, str(w))
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--weights", str(w), "--weights", str(w)]) == 1
    err = _error(capsys)
    assert "is given twice. Where: --weights." in err and "Weights.open" not in err
    assert not (tmp_path / "o.npz").exists()


def test_weights_that_are_a_npy_array_are_named_as_such(tmp_path, capsys):
    """sdrt run --weights x.npy said "header length 379676406402707 does not fit the file"."""
    import numpy as np

    from sdrt.errors import WeightsError
    from sdrt.weights import Weights

    np.save(tmp_path / "x.npy", np.ones(3, np.float32))
    with pytest.raises(WeightsError) as err:
        Weights.open(tmp_path / "x.npy")
    assert "x.npy is not safetensors: it looks like a NumPy .npy array" in str(err.value)
