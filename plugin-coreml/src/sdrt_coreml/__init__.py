"""sdrt-coreml: the Core ML backend for sdrt (Apple GPUs and the Neural Engine).

ONNX graphs are lowered op by op to Core ML's MIL with coremltools' builder and
saved as ML Program packages (``.mlpackage``). Packages build on any OS
(``sdrt compile MODEL --backend coreml -o model.mlpackage``); only macOS runs them.
Importing this module is light; coremltools loads on first use.
"""

from __future__ import annotations

import sdrt

from .backend import CoreMLBackend

#: The sdrt plugin API this package was built for.
SDRT_API_VERSION = (1, 2)


@sdrt.hookimpl
def register_backends(register):  # type: ignore[no-untyped-def]
    register(CoreMLBackend())


__all__ = ["SDRT_API_VERSION", "CoreMLBackend", "register_backends"]
