"""The OpenVINO backend's errors: everything OpenVINO raises reaches users as one of these."""

from __future__ import annotations

from sdrt.errors import SdrtError


class OpenVINOError(SdrtError):
    """OpenVINO failed while compiling, importing or running a model."""


def first_lines(exc: BaseException, limit: int = 3) -> str:
    """The informative lines of an OpenVINO exception (it leads with C++ source locations)."""
    lines = [ln.strip() for ln in str(exc).splitlines()
             if ln.strip() and not ln.startswith(("Exception from", "Check '"))]
    text = " ".join(lines[:limit]) or str(exc).strip() or type(exc).__name__
    return text[:600]
