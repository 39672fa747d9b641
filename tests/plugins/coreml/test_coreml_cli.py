"""``sdrt compile MODEL --backend coreml --target T -o FILE.mlpackage``: packages for Macs, built here."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from coreml_helpers import make_model, run_ort
from onnx import TensorProto as TP
from onnx import helper

from sdrt.cli import main
from sdrt_coreml import package
from sdrt_coreml.evaluate import evaluate_package


@pytest.fixture
def model_path(tmp_path):
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    model = make_model(nodes, {"x": (("batch", 8), TP.FLOAT)}, {"y": (None, TP.FLOAT)},
                       {"w": rng.standard_normal((8, 16)).astype(np.float32)})
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def test_list_targets(coreml_registry, capsys):
    assert main(["compile", "unused.onnx", "--backend", "coreml", "--list-targets"]) == 0
    assert capsys.readouterr().out.strip() == "coreml: macOS13, macOS14, macOS15, iOS16, iOS17, iOS18"


def test_compile_writes_a_package_that_evaluates_like_onnxruntime(coreml_registry, model_path, tmp_path, capsys):
    out = tmp_path / "model.mlpackage"
    argv = ["compile", str(model_path), "--backend", "coreml", "--target", "macOS15", "-o", str(out),
            "--shape", "batch=3", "--option", "precision=fp32"]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}" in said
    files = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert f"  {files:,} bytes" in said  # the package folder's files, not the folder entry's size
    built = package.load(out)
    assert built.io["inputs"] == [["x", "x", "float32", [3, 8]]]
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    want = run_ort(onnx.load(model_path), {"x": x})["y"]
    np.testing.assert_allclose(evaluate_package(out, {"x": x}).outputs["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("extra", "message"), [
    (["--target", "macOS12"], "target 'macOS12' is not a Core ML deployment target"),
    (["--target", "macOS14", "--option", "precision=int4"], "precision 'int4' is not one this backend accepts"),
    (["--target", "macOS14"], "dynamic dimensions"),
])
def test_errors_are_one_line(coreml_registry, model_path, tmp_path, capsys, extra, message):
    argv = ["compile", str(model_path), "--backend", "coreml", "-o", str(tmp_path / "m.mlpackage"), *extra]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "m.mlpackage").exists()
