"""The tests session must fail, not skip, when a plugin it installs cannot be imported or run.

``nox -s tests`` sets ``SDRT_REQUIRE_PLUGINS`` to the plugins it installs (``INSTALLABLE_PLUGINS``).
Each must import, register its backend, and offer at least one device here; otherwise the
plugin's own tests (behind ``importorskip`` of the vendor package) would all skip and the run
would stay green.
"""

from __future__ import annotations

import importlib
import os

import pytest

REQUIRED = [n for n in os.environ.get("SDRT_REQUIRE_PLUGINS", "").split(",") if n]


@pytest.mark.skipif(not REQUIRED, reason="SDRT_REQUIRE_PLUGINS is unset: only `nox -s tests` says which plugins "
                                         "it installed")
@pytest.mark.parametrize("name", REQUIRED or ["none"])
def test_an_installed_plugin_imports_and_offers_a_device(registry, name):
    module = importlib.import_module(f"sdrt_{name}")  # an ImportError fails the run
    record = registry.register_plugin(module, name, distribution=f"sdrt-{name}")
    assert record.ok, f"plugin {name} is {record.state}: {record.error}"
    backend = registry.backends[name]
    assert backend.devices(), f"plugin {name} offers no device on this machine"
