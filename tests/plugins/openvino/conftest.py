"""Fixtures for the OpenVINO backend tests: a registry with the plugin, and a private cache dir."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def ov_registry(registry, tmp_path, monkeypatch):
    pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
    import sdrt_openvino

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    registry.register_plugin(sdrt_openvino, "openvino", distribution="sdrt-openvino", version="0.1.0")
    return registry


@pytest.fixture
def backend(ov_registry):
    return ov_registry.backends["openvino"]


@pytest.fixture
def cpu(backend):
    return next(d for d in backend.devices() if d.id == "CPU")
