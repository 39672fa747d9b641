"""Fixtures for the TensorRT-RTX backend tests: the plugin registered, a private cache, the bench models."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

try:  # nox -s tests installs sdrt-trt; a broken install then fails these tests instead of skipping them
    metadata.distribution("sdrt-trt")
except metadata.PackageNotFoundError:  # a development environment without it: pip install -e plugin-trt
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # the bench package (bench/models.py) lives at the repository root
    sys.path.insert(0, str(ROOT))

#: why GPU tests skip here: TensorRT-RTX runs engines only on these GPUs, with a CUDA 13 driver
NO_GPU = ("needs an NVIDIA RTX GPU of compute capability 7.5, 8.0, 8.6, 8.9 or 12.x with driver 580+ "
          "(TensorRT-RTX executes engines only there); this machine has none")


@pytest.fixture
def trt_registry(registry, tmp_path, monkeypatch):
    import sdrt_trt

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    registry.register_plugin(sdrt_trt, "trt", distribution="sdrt-trt", version="0.1.0")
    return registry


@pytest.fixture
def backend(trt_registry):
    return trt_registry.backends["trt"]


@pytest.fixture
def gpu(backend):
    devices = backend.devices()
    if not devices:
        pytest.skip(NO_GPU)
    return devices[0]
