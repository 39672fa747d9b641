"""sdrt-migraphx: the MIGraphX backend for sdrt (AMD Radeon and Instinct GPUs on Linux with ROCm).

Importing this module is light; MIGraphX itself (ROCm's ``migraphx`` Python
module, not on PyPI) loads when the backend first lists its devices or
compiles a graph. Without it the backend reports, with the reason, that it has
no device, and says how to get MIGraphX.
"""

from __future__ import annotations

import sdrt

from .backend import MIGraphXBackend

#: The sdrt plugin API this package was built for.
SDRT_API_VERSION = (1, 2)


@sdrt.hookimpl
def register_backends(register):  # type: ignore[no-untyped-def]
    register(MIGraphXBackend())


__all__ = ["SDRT_API_VERSION", "MIGraphXBackend", "register_backends"]
