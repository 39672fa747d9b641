"""Fixtures for the checkpoint tests: tests/data/ckpt/, built by scripts/gen_checkpoint_data.py with diffusers.

Paths and feed helpers live in ``ckpt_data`` (import them from there, never from ``conftest``).
Every test gets the reference backend plus whichever of the OpenVINO and ggml plugins is installed.
A test that runs on a plugin backend names it, by a ``backend`` parameter or by
``@pytest.mark.needs_backend("openvino")``; it is skipped with the reason when that plugin is not
installed, unless ``nox -s tests`` required it (``SDRT_REQUIRE_PLUGINS``): then it fails.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
from ckpt_data import DATA

PLUGINS = {"openvino": ("sdrt_openvino", "sdrt-openvino"), "ggml": ("sdrt_ggml", "sdrt-ggml")}


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_backend(*names): the test runs on these plugin backends")


@pytest.fixture(scope="session")
def inputs() -> dict[str, np.ndarray]:
    return dict(np.load(DATA / "inputs.npz"))


def _needed(node) -> set[str]:
    names = {n for m in node.iter_markers("needs_backend") for n in m.args}
    callspec = getattr(node, "callspec", None)
    if callspec is not None and "backend" in callspec.params:
        names.add(callspec.params["backend"])
    return names & set(PLUGINS)


@pytest.fixture(autouse=True)
def backends(request, registry, tmp_path_factory, monkeypatch):
    """The reference backend plus the installed plugins (OpenVINO, ggml); a needed one that is missing skips."""
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    required = {n for n in os.environ.get("SDRT_REQUIRE_PLUGINS", "").split(",") if n}
    needed = _needed(request.node)
    for name, (module, dist) in PLUGINS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            if name in needed and name not in required:
                pytest.skip(f"the {dist} plugin is not installed ({exc})")
            if name in needed:
                raise
            continue
        registry.register_plugin(mod, name, distribution=dist, version="0.1.0")
    return registry
