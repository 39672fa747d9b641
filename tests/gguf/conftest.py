"""GGUF tests: the gguf package is optional; without it these tests are skipped with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("gguf", reason="the optional gguf package is not installed (pip install gguf)")
