"""Fixtures for the Core ML backend tests: the plugin in a registry, a private cache dir."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def coreml_registry(registry, tmp_path, monkeypatch):
    import sdrt_coreml

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    registry.register_plugin(sdrt_coreml, "coreml", distribution="sdrt-coreml", version="0.1.0")
    return registry


@pytest.fixture
def backend(coreml_registry):
    return coreml_registry.backends["coreml"]
