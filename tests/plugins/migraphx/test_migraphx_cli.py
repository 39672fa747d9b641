"""`sdrt info` with the MIGraphX plugin: installed, and either its devices or why it has none."""

from __future__ import annotations

from sdrt.cli import main
from sdrt.errors import BackendUnavailable
from sdrt_migraphx import module


def test_info_shows_the_plugin_with_its_devices_or_the_reason(mx_registry, capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "migraphx  [sdrt-migraphx 0.1.0]  loaded" in out
    assert "backend migraphx (priority 70)" in out
    try:
        module.load()
    except BackendUnavailable:
        line = next(ln for ln in out.splitlines() if "devices: error" in ln and "MIGraphX" in ln)
        assert "the Python module migraphx cannot be imported" in line
        assert "What to do: install ROCm's MIGraphX" in line
    else:
        assert "device migraphx:ref" in out


def test_run_without_migraphx_fails_with_one_line_and_no_traceback(mx_registry, tmp_path, capsys):
    import numpy as np
    from mx_helpers import conv_model

    try:
        module.load()
    except BackendUnavailable:
        pass
    else:
        import pytest

        pytest.skip("MIGraphX is installed here; this test covers machines without it")
    path = tmp_path / "conv.onnx"
    path.write_bytes(conv_model().SerializeToString())
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    rc = main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o.npz"),
               "--backend", "migraphx"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "migraphx" in err and "Traceback" not in err
