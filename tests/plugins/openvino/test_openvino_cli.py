"""The CLI with the OpenVINO backend: `sdrt info` lists its devices, `sdrt run --backend openvino` works."""

from __future__ import annotations

import numpy as np
from ov_helpers import conv_model, ort_run

from sdrt.cli import main


def test_info_shows_openvino_devices(ov_registry, capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend openvino (priority 50)" in out
    assert "device openvino:CPU" in out and "device openvino:AUTO" in out


def test_run_with_the_openvino_backend(ov_registry, tmp_path, capsys):
    model_path = tmp_path / "conv.onnx"
    model_path.write_bytes(conv_model().SerializeToString())
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    rc = main(["run", str(model_path), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "out.npz"),
               "--backend", "openvino", "--device", "CPU"])
    assert rc == 0
    assert "y: float32[1, 4, 8, 8]" in capsys.readouterr().out
    with np.load(tmp_path / "out.npz") as data:
        np.testing.assert_allclose(data["y"], ort_run(conv_model(), {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_run_reports_bad_option_as_an_error(ov_registry, tmp_path, capsys):
    model_path = tmp_path / "conv.onnx"
    model_path.write_bytes(conv_model().SerializeToString())
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    rc = main(["run", str(model_path), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o.npz"),
               "--backend", "openvino", "--device", "NPU.9"])
    assert rc == 1
    assert "NPU.9" in capsys.readouterr().err


def test_run_pins_a_dynamic_graph_to_its_inputs(ov_registry, tmp_path, capsys):
    """OpenVINO takes no shapes option: `sdrt run` (and `sdrt.load(shapes=)`) pin in the core, so OpenVINO
    compiles the static graph the pipelines give it."""
    import sdrt

    model = conv_model(batch="batch")
    model_path = tmp_path / "conv.onnx"
    model_path.write_bytes(model.SerializeToString())
    with sdrt.load(str(model_path), backend="openvino", device="CPU", shapes={"batch": 2}) as s:
        assert s.inputs[0].shape == (2, 3, 8, 8)
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"),
                 "--backend", "openvino"]) == 0
    assert "y: float32[2, 4, 8, 8]" in capsys.readouterr().out
    with np.load(tmp_path / "o.npz") as data:
        np.testing.assert_allclose(data["y"], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
