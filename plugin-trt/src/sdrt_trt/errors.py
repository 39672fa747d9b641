"""The TensorRT-RTX backend's errors, and the logger that collects what TensorRT-RTX reports."""

from __future__ import annotations

import logging
from typing import Any

from sdrt.errors import SdrtError

log = logging.getLogger("sdrt.trt")

#: messages TensorRT-RTX logs as errors on a machine without a usable CUDA driver, even for builds that succeed
_NO_DRIVER_NOISE = ("CUDA driver version is insufficient", "cudaError 35", "no CUDA-capable device")


class TrtError(SdrtError):
    """TensorRT-RTX failed while building, loading, refitting or running an engine."""


def make_logger() -> Any:
    """A ``tensorrt_rtx.ILogger`` that keeps error messages (for our exceptions) and logs the rest at debug."""
    import tensorrt_rtx as trt

    class _Logger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity <= trt.ILogger.Severity.ERROR:
                self.errors.append(msg)
            log.debug("TensorRT-RTX [%s] %s", getattr(severity, "name", severity), msg)

        def take(self) -> str:
            """The most telling error since the last call (the builder's own, if any), then forget them."""
            errors = [e for e in self.errors if not any(n in e for n in _NO_DRIVER_NOISE)] or self.errors
            self.errors = []
            if not errors:
                return "no message from TensorRT-RTX"
            pick = next((e for e in reversed(errors) if "Error Code" in e), errors[-1])
            return " ".join(pick.split())[:500]

    return _Logger()
