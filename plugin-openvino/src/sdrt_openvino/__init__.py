"""sdrt-openvino: the OpenVINO backend for sdrt (Intel CPUs, GPUs and NPUs, and any x86 CPU).

Importing this module is light; openvino itself loads when the backend first
lists its devices or compiles a graph.
"""

from __future__ import annotations

import sdrt

from .backend import OpenVINOBackend

#: The sdrt plugin API this package was built for.
SDRT_API_VERSION = (1, 1)


@sdrt.hookimpl
def register_backends(register):  # type: ignore[no-untyped-def]
    register(OpenVINOBackend())


__all__ = ["SDRT_API_VERSION", "OpenVINOBackend", "register_backends"]
