"""The Core ML backend's own errors, and the one lazy import of coremltools."""

from __future__ import annotations

import logging
import platform
from functools import cache
from typing import Any

from sdrt.errors import BackendUnavailable, SdrtError


class CoreMLError(SdrtError):
    """coremltools refused a program, or Core ML refused a package."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0][:300] if text else type(exc).__name__)


@cache
def ct() -> Any:
    """``coremltools``, imported once. Off macOS it logs one warning per missing native proxy
    (``libcoremlpython`` exists only on macOS); those are expected there and kept quiet."""
    quiet = platform.system() != "Darwin"
    logger = logging.getLogger("coremltools")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        import coremltools
    except ImportError as exc:
        raise BackendUnavailable(f"coremltools cannot be imported: {first_line(exc)}", where="import coremltools",
                                 fix="pip install coremltools") from exc
    finally:
        if quiet:
            logger.setLevel(level)
    return coremltools
