"""Registering a backend plugin in a test: the reference backend always; OpenVINO and ggml when their
packages are installed (skipped with the reason otherwise, never faked), and required when ``nox -s tests``
installed them (``SDRT_REQUIRE_PLUGINS``). Shared by the test folders (tests/ is on sys.path through its
conftest)."""

from __future__ import annotations

import importlib
import os

import pytest

from sdrt import plugins

PLUGINS = {"reference": ("sdrt_reference", "sdrt-reference"), "openvino": ("sdrt_openvino", "sdrt-openvino"),
           "ggml": ("sdrt_ggml", "sdrt-ggml")}


REQUIRED = {n for n in os.environ.get("SDRT_REQUIRE_PLUGINS", "").split(",") if n}


def register(name: str) -> None:
    """Register one backend plugin in a fresh registry; skip when its package is not installed, unless
    ``nox -s tests`` installed it (``SDRT_REQUIRE_PLUGINS``): then a failure to load fails the test."""
    module, dist = PLUGINS[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        if name in REQUIRED:
            raise
        pytest.skip(f"the {dist} plugin is not installed ({exc})")
    reg = plugins.get_registry()
    if name not in reg.backends:
        reg.register_plugin(mod, name, distribution=dist)
    if name not in reg.backends:
        record = reg.plugins.get(name)
        assert name not in REQUIRED, f"required plugin {name} did not load: {record}"
        pytest.skip(f"the {name} backend did not load here: {record.state if record else '?'} "
                    f"{record.error if record else ''}")
