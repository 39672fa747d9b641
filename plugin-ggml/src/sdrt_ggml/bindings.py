"""The ggml bindings (ggml-python), imported once, checked and with ggml's log routed to logging.

Below the ops and the native kernels: ``native``, ``native_ops``, ``lower`` and
``ops`` all reach ggml through ``ggml_lib()`` here.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger("sdrt.ggml")


def ggml_lib() -> Any:
    """The ggml bindings module (imported lazily).

    Before the first import, unless the user set them: libgomp spins briefly at ggml's
    per-node barriers and then sleeps (``GOMP_SPINCOUNT=3000``; the measurements behind it
    are in docs/ggml.md, "Measured choices"), a failed GGML_ASSERT does not start gdb
    (``GGML_NO_BACKTRACE``), and ggml's Vulkan backend uses its float32 shader set
    (``GGML_VK_DISABLE_F16``: the float16 set keeps float32 matmul tiles in float16;
    ``SDRT_GGML_VULKAN_F16=1`` keeps it). ggml's own log lines (device discovery, warnings)
    go to the ``sdrt.ggml.native`` logger instead of stderr. The bindings come wrapped in
    ``guards.CheckedGgml``.
    """
    if "ggml" not in sys.modules:
        if "OMP_WAIT_POLICY" not in os.environ:
            os.environ.setdefault("GOMP_SPINCOUNT", "3000")
        os.environ.setdefault("GGML_NO_BACKTRACE", "1")
        if os.environ.get("SDRT_GGML_VULKAN_F16") != "1":
            os.environ.setdefault("GGML_VK_DISABLE_F16", "1")
    global _CHECKED
    if _CHECKED is None:
        from .guards import CheckedGgml

        lib = import_tolerant("ggml")
        _route_logs(lib)
        _CHECKED = CheckedGgml(lib)
    return _CHECKED


_CHECKED: Any = None
_LOG_CALLBACK: Any = None  # the ctypes callback ggml holds: kept alive for the process


def _route_logs(lib: Any) -> None:
    """ggml's log (GGML_LOG_*) to the ``sdrt.ggml.native`` logger: a library prints nothing."""
    global _LOG_CALLBACK
    native = logging.getLogger("sdrt.ggml.native")
    levels = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}

    def forward(level: int, text: bytes | None, _user: Any) -> None:
        line = (text or b"").decode(errors="replace").rstrip()
        if line:  # GGML_LOG_LEVEL_CONT (5) continues a line: logged as DEBUG
            native.log(levels.get(level, logging.DEBUG), "%s", line)

    try:
        _LOG_CALLBACK = lib.ggml_log_callback(forward)
        lib.ggml_log_set(_LOG_CALLBACK, None)
    except (AttributeError, TypeError) as exc:  # bindings without the log API: ggml keeps stderr
        log.debug("ggml's log stays on stderr: %s", exc)


def import_tolerant(module: str, tries: int = 16) -> Any:
    """``import ggml``, tolerating functions that ggml-python declares but its own ggml lacks.

    ggml-python 0.0.45 built with ``GGML_CUDA=ON`` declares ``ggml_backend_cuda_allreduce_tensor``,
    which the ggml it bundles does not export, so its import fails with an ``AttributeError`` for
    that one symbol and every CUDA user loses the backend. The import is retried with each symbol so
    named bound to a function that raises when called (sdrt-ggml calls none of them), and the names
    are logged. Only the named symbols are tolerated: ``hasattr(lib, ...)`` feature checks of
    ggml-python see the library as it is.
    """
    import ctypes
    import importlib
    import re

    absent: set[str] = set()
    original = ctypes.CDLL.__getitem__

    def tolerant(self: ctypes.CDLL, name: Any) -> Any:
        try:
            return original(self, name)
        except AttributeError:
            if name in absent:
                return _absent_function(str(name))
            raise

    for _ in range(tries):
        try:
            ctypes.CDLL.__getitem__ = tolerant  # type: ignore[method-assign]
            imported = importlib.import_module(module)
            if absent:
                log.warning("%s declares functions its library lacks (%s): they raise if called",
                            module, ", ".join(sorted(absent)))
            return imported
        except AttributeError as exc:
            found = re.findall(r"(\w+)'?\)?$", str(exc).strip())
            if not found or found[-1] in absent:
                raise
            absent.add(found[-1])
            for mod in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
                del sys.modules[mod]
        finally:
            ctypes.CDLL.__getitem__ = original  # type: ignore[method-assign]
    raise ImportError(f"{module} lacks too many of the functions it declares: {', '.join(sorted(absent))}")


def _absent_function(name: str) -> Any:
    def absent(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is declared by the bindings but not exported by their library")

    absent.__name__ = name
    return absent
