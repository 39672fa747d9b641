"""Fixtures for the graph tests; the model builders live in gw_models.py (shared with tests/weights,
tests/lora and tests/fuzz, which put this folder on sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
