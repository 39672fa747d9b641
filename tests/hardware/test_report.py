"""What users see: the hardware section of `sdrt info`; and `sdrt.load` never probes hardware."""

from __future__ import annotations

import importlib.util
import json
import logging

import pytest
from hw_machines import load_machine

import sdrt.hardware
from sdrt.cli import main
from sdrt.runtime import select


@pytest.fixture
def as_machine(tmp_path, monkeypatch):
    """Make detect() return a captured machine for the rest of the test."""

    def use(name: str):
        hw = load_machine(name, tmp_path)[0]
        monkeypatch.setattr(sdrt.hardware, "_cache", hw)
        return hw

    return use


def test_info_shows_hardware_recommendation_and_the_install_command(registry, as_machine, capsys):
    as_machine("rtx4090_linux")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "hardware:" in out and "cpu: 13th Gen Intel(R) Core(TM) i9-13900K" in out
    assert "gpu: NVIDIA GeForce RTX 4090 (10de:2684, Ada Lovelace, compute 8.9, discrete, 24 GiB" in out
    assert "recommended plugin: trt (sdrt-trt)" in out
    assert "passed over: Intel UHD Graphics 770" in out
    if importlib.util.find_spec("sdrt_trt") is None:
        assert "not installed; install it with:" in out and "-m pip install 'sdrt-trt==0.1.*'" in out
    else:  # the tests session installs sdrt-trt (it builds engines without a GPU)
        assert "installed: sdrt-trt 0.1.0" in out


def test_info_json_carries_the_hardware(registry, as_machine, capsys):
    as_machine("radeon_780m_apu_linux")
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["hardware"]
    assert data["recommendation"]["plugin"] == "ggml" and data["recommendation"]["build"] == "vulkan"
    assert data["hardware"]["devices"][0]["gfx_target"] == "gfx1103"
    assert data["install_command"].startswith("CMAKE_ARGS='-DGGML_VULKAN=ON -DGGML_LLAMAFILE=ON' ")


def test_info_survives_detection_blowing_up(registry, monkeypatch, capsys):
    def broken(**_):
        raise OSError("sysfs vanished")

    monkeypatch.setattr(sdrt.hardware, "detect", broken)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "plugins:" in out and "detection failed: OSError('sysfs vanished')" in out


def test_load_auto_never_probes_hardware(registry, monkeypatch, caplog, tmp_path):
    """sdrt.load picks among installed backends; the hardware report belongs to `sdrt info` and the installer."""
    import numpy as np
    from onnx import TensorProto, helper

    def refuse() -> None:
        raise AssertionError("sdrt.load probed the hardware")

    monkeypatch.setattr(sdrt.hardware, "detect", refuse)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with caplog.at_level(logging.WARNING), sdrt.load(model) as s:
        np.testing.assert_array_equal(s.run({"x": np.array([-1, 2], np.float32)})["y"], [0, 2])
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    be, _ = select("auto", registry=registry)
    assert be.name == "reference"
