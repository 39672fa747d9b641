"""Fixtures for the hardware tests; the machine captures and their loader are in hw_machines.py."""

from __future__ import annotations

import pytest
from hw_machines import load_machine


@pytest.fixture
def machine(tmp_path):
    """``machine("rtx3060_linux")`` -> the Hardware that detection sees on that captured machine."""

    def load(name: str):
        return load_machine(name, tmp_path)[0]

    return load
