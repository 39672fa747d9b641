"""sdrt-openvino: the OpenVINO backend for sdrt (Intel CPUs, GPUs and NPUs, and any x86 CPU).

Importing this module is light; openvino itself loads when the backend first
lists its devices or compiles a graph.

No telemetry: ``import openvino`` imports its model converter, which sends a usage
event to Google Analytics through the ``openvino-telemetry`` package (installed
with openvino) unless the user opted out (``opt_in_out --opt_out`` writes ``0`` to
``~/intel/openvino_telemetry``) or ``CI=true`` is set. Importing this module, before
anything imports openvino, makes ``openvino_telemetry`` unimportable in this process,
so OpenVINO uses the do-nothing stub it ships for installs without that package:
nothing is sent and nothing is written under ``~/intel``, with no file or variable
changed outside the process. ``SDRT_OPENVINO_TELEMETRY=1`` leaves OpenVINO's own
choice in place. See docs/openvino.md, "No telemetry".
"""

from __future__ import annotations

import os
import sys

import sdrt


def _no_telemetry() -> None:
    if os.environ.get("SDRT_OPENVINO_TELEMETRY") == "1" or "openvino_telemetry" in sys.modules:
        return  # asked for, or already imported by the application: its choice
    sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]  # import raises ImportError


_no_telemetry()

from .backend import OpenVINOBackend  # noqa: E402

#: The sdrt plugin API this package was built for.
SDRT_API_VERSION = (1, 2)


@sdrt.hookimpl
def register_backends(register):  # type: ignore[no-untyped-def]
    register(OpenVINOBackend())


__all__ = ["SDRT_API_VERSION", "OpenVINOBackend", "register_backends"]
