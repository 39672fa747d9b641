"""Every flow test module starts from a fresh plugin registry (entry-point autoload is off in tests)."""

from __future__ import annotations

import pytest

from sdrt import plugins


@pytest.fixture(scope="module", autouse=True)
def _fresh_registry():
    plugins.reset_registry()
    yield
    plugins.reset_registry()
