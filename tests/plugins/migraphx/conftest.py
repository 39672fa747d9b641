"""Fixtures for the MIGraphX backend tests.

Most tests need no MIGraphX: device discovery runs on the captured machines of
``tests/hardware/machines`` through the real probes, and the op check, cache,
options and model writing are plain Python. The tests that do need ROCm's
``migraphx`` module take the ``migraphx`` fixture, which skips them with the
reason (the module is not on PyPI; plugin-migraphx/README.md shows how to
build it) where it is absent.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "hardware"))


@pytest.fixture
def mx_registry(registry, tmp_path, monkeypatch):
    import sdrt_migraphx

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    registry.register_plugin(sdrt_migraphx, "migraphx", distribution="sdrt-migraphx", version="0.1.0")
    return registry


@pytest.fixture
def backend(mx_registry):
    return mx_registry.backends["migraphx"]


@pytest.fixture
def migraphx():
    """ROCm's migraphx module; the test is skipped, with the reason, where it is not installed."""
    from sdrt.errors import BackendUnavailable
    from sdrt_migraphx import module

    try:
        return module.load()
    except BackendUnavailable as exc:
        pytest.skip(f"needs ROCm's MIGraphX (not on PyPI; see plugin-migraphx/README.md): {exc.what}")


@pytest.fixture
def ref(backend, migraphx):
    devs = [d for d in backend.devices() if d.id == "ref"]
    if not devs:
        pytest.skip("the installed MIGraphX has no ref target")
    return devs[0]
