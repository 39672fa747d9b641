"""``sdrt compile MODEL --backend trt --target sm86 -o model.engine``, on this machine with no GPU."""

from __future__ import annotations

import pytest

from bench.models import build
from sdrt.cli import main
from sdrt_trt.enginefile import read_engine


@pytest.fixture
def model_path(tmp_path):  # type: ignore[no-untyped-def]
    import onnx

    path = tmp_path / "mobilenet_v2.onnx"
    onnx.save(build("mobilenet_v2", "tiny")[0], path)
    return path


def test_compile_writes_an_engine(trt_registry, model_path, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "model.engine"
    assert main(["compile", str(model_path), "--backend", "trt", "--target", "sm86", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out}") and "(trt sm86," in printed
    meta, engine = read_engine(out)
    assert meta["target"] == "sm86" and f"{out.stat().st_size:,} bytes" in printed


def test_compile_with_shape_and_options(trt_registry, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import onnx

    proto, _ = build("mobilenet_v2", "tiny")
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dyn.onnx"
    onnx.save(proto, path)
    out = tmp_path / "dyn.engine"
    argv = ["compile", str(path), "-b", "trt", "-t", "sm89", "-o", str(out), "--shape", "batch=2",
            "--option", "precision=fp32", "--option", "refit=none"]
    assert main(argv) == 0
    meta, _ = read_engine(out)
    assert meta["inputs"] == ["input: float32[2, 3, 32, 32]"] and "precision=fp32" in meta["options"]


def test_list_targets(trt_registry, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["compile", "unused.onnx", "--backend", "trt", "--list-targets"]) == 0
    assert capsys.readouterr().out.strip() == "trt: sm75, sm80, sm86, sm89, sm120, sm121"


@pytest.mark.parametrize(("extra", "message"), [
    (["--target", "sm90", "-o", "x.engine"], "unknown TensorRT-RTX target 'sm90'"),
    (["-o", "x.engine"], "sdrt compile needs --target and --output"),
    (["--target", "sm86", "-o", "x.engine", "--shape", "batch=two"], "bad --shape 'batch=two'"),
    (["--target", "sm86", "-o", "x.engine", "--option", "novalue"], "bad --option 'novalue'"),
    (["--target", "sm86", "-o", "x.engine", "--option", "speed=1"], "unknown options for the trt backend: speed"),
])
def test_errors_are_one_line(trt_registry, model_path, tmp_path, capsys, extra, message) -> None:  # type: ignore[no-untyped-def]
    argv = ["compile", str(model_path), "--backend", "trt", *extra]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_backend_without_aot_build(registry, model_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["compile", str(model_path), "--backend", "reference", "--target", "x", "-o", "x"]) == 1
    assert "backend 'reference' has no ahead-of-time build" in capsys.readouterr().err


def test_unknown_backend(registry, model_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["compile", str(model_path), "--backend", "nope", "--target", "sm86", "-o", "x"]) == 1
    assert "no backend named 'nope'" in capsys.readouterr().err


def test_missing_model(trt_registry, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["compile", str(tmp_path / "absent.onnx"), "-b", "trt", "-t", "sm86", "-o", "x"]) == 1
    assert "the model file does not exist" in capsys.readouterr().err
