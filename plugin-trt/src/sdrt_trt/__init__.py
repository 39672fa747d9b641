"""sdrt-trt: the TensorRT-RTX backend for sdrt (NVIDIA RTX GPUs, compute capability 7.5 and newer).

Importing this module is light; tensorrt_rtx and the CUDA binding load when the
backend first lists its devices, builds or compiles.
"""

from __future__ import annotations

import sdrt

from .backend import TrtBackend

#: The sdrt plugin API this package was built for.
SDRT_API_VERSION = (1, 2)


@sdrt.hookimpl
def register_backends(register):  # type: ignore[no-untyped-def]
    register(TrtBackend())


__all__ = ["SDRT_API_VERSION", "TrtBackend", "register_backends"]
