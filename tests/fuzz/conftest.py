"""Shares the small model builders in tests/graph/gw_models.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "graph"))
