"""sdrt-ggml: ONNX graphs lowered to ggml compute graphs.

CPU everywhere; CUDA, Vulkan, Metal and HIP when ggml-python was built with
them (``CMAKE_ARGS="-DGGML_CUDA=on" pip install ggml-python``). ggml itself is
imported only when the backend lists devices or compiles.
"""

from __future__ import annotations

import sdrt

from .backend import GgmlBackend

#: The sdrt plugin API this package was built for.
SDRT_API_VERSION = (1, 2)


@sdrt.hookimpl
def register_backends(register):  # type: ignore[no-untyped-def]
    register(GgmlBackend())


__all__ = ["SDRT_API_VERSION", "GgmlBackend", "register_backends"]
