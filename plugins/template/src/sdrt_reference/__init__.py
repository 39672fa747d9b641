"""sdrt-reference: the reference backend, and the template for new backends.

It runs any ONNX graph with ``onnx.reference.ReferenceEvaluator``: slow, but
complete and exact, so the core's tests and the conformance kit run with no
hardware at all.
"""

from __future__ import annotations

import sdrt

from .backend import ReferenceBackend

#: The sdrt plugin API this package was built for. sdrt refuses to load a
#: plugin whose major differs from its own, or whose minor is newer.
SDRT_API_VERSION = (1, 1)


@sdrt.hookimpl
def register_backends(register):  # type: ignore[no-untyped-def]
    register(ReferenceBackend())


__all__ = ["SDRT_API_VERSION", "ReferenceBackend", "register_backends"]
