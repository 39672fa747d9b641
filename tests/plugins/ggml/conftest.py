"""The ggml tests write compile cache entries (a real export's weight layouts, sdrt_ggml/layout_cache.py) into a
cache dir of their own run, not the user's: a later run lowers those models again instead of mapping what an
earlier one stored."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SDRT_CACHE_DIR", str(tmp_path_factory.mktemp("sdrt-cache")))
        yield
