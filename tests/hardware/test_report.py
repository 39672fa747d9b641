"""What users see: the hardware section of `sdrt info` and the hint from load(backend="auto")."""

from __future__ import annotations

import json
import logging

import pytest
from hw_machines import load_machine

import sdrt.hardware
from sdrt.cli import main
from sdrt.hardware import report
from sdrt.runtime import select


@pytest.fixture
def as_machine(tmp_path, monkeypatch):
    """Make detect() return a captured machine for the rest of the test."""

    def use(name: str):
        hw = load_machine(name, tmp_path)[0]
        monkeypatch.setattr(sdrt.hardware, "_cache", hw)
        monkeypatch.setattr(report, "_hinted", False)
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
    assert "not installed; install it with:" in out and "-m pip install 'sdrt-trt==0.1.*'" in out


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


def test_load_auto_warns_with_the_install_command_when_no_plugin_uses_the_gpu(registry, as_machine, caplog):
    as_machine("rx7900xtx_linux_rocm")
    with caplog.at_level(logging.WARNING, logger="sdrt.hardware"):
        be, dev = select("auto", registry=registry)
    assert be.name == "reference"
    [msg] = [r.getMessage() for r in caplog.records if r.name == "sdrt.hardware"]
    assert "AMD Radeon RX 7900 XTX" in msg and "migraphx" in msg and "'sdrt-migraphx==0.1.*'" in msg


def test_load_auto_warns_once_per_process(registry, as_machine, caplog):
    as_machine("rtx3060_linux")
    with caplog.at_level(logging.WARNING, logger="sdrt.hardware"):
        select("auto", registry=registry)
        select("auto", registry=registry)
    assert len([r for r in caplog.records if r.name == "sdrt.hardware"]) == 1


def test_load_auto_is_quiet_when_the_matching_plugin_is_loaded(registry, as_machine, caplog):
    as_machine("rtx3060_linux")

    class TrtStandIn:            # a plugin named "trt" that registers nothing
        pass

    registry.register_plugin(TrtStandIn(), "trt")
    with caplog.at_level(logging.WARNING, logger="sdrt.hardware"):
        select("auto", registry=registry)
    assert [r for r in caplog.records if r.name == "sdrt.hardware"] == []
