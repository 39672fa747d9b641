"""Finding ROCm's ``migraphx`` Python module, and which targets it was built with.

MIGraphX is not on PyPI (the ``migraphx`` name there is an empty placeholder).
ROCm installs the module as ``/opt/rocm/lib/migraphx.cpython-3XX-*.so`` and
asks users to put ``/opt/rocm/lib`` on ``PYTHONPATH``; a source build leaves it
in ``<build>/lib``. An import that fails is retried once from
``$ROCM_PATH/lib`` and ``/opt/rocm/lib``; a failure after that becomes a
``BackendUnavailable`` that says how to get MIGraphX.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

from sdrt.errors import BackendUnavailable

log = logging.getLogger("sdrt.migraphx")

#: what to do when the module is missing; README.md has the source-build steps
INSTALL_HINT = (
    "install ROCm's MIGraphX on Linux (`sudo apt install migraphx` from repo.radeon.com, see "
    "https://rocm.docs.amd.com/projects/AMDMIGraphX) and put /opt/rocm/lib on PYTHONPATH, or build it from "
    "source as plugin-migraphx/README.md shows and put its build/lib on PYTHONPATH; "
    "`pip install migraphx` does not work (PyPI's migraphx is an empty placeholder)"
)
#: the targets the plugin can compile for, in the order devices are listed
TARGETS = ("gpu", "cpu", "ref")

_lock = threading.Lock()
_state: dict[str, object] = {}


def rocm_lib_dirs() -> list[Path]:
    """Folders where ROCm installs the module: ``$ROCM_PATH/lib``, then ``/opt/rocm/lib``."""
    dirs = []
    if os.environ.get("ROCM_PATH"):
        dirs.append(Path(os.environ["ROCM_PATH"]) / "lib")
    dirs.append(Path("/opt/rocm/lib"))
    return dirs


def _import() -> ModuleType:
    try:
        return importlib.import_module("migraphx")
    except ImportError as first:
        for folder in rocm_lib_dirs():
            if any(folder.glob("migraphx*.so")) and str(folder) not in sys.path:
                log.info("migraphx not on sys.path; trying %s", folder)
                sys.path.append(str(folder))
                try:
                    return importlib.import_module("migraphx")
                except ImportError as exc:
                    raise _unavailable(f"ROCm's migraphx module in {folder} does not import ({exc})") from exc
        raise _unavailable(f"the Python module migraphx cannot be imported ({first})") from first
    except OSError as exc:  # a shared library of ROCm is missing or broken
        raise _unavailable(f"the migraphx module does not load ({exc})") from exc


def _unavailable(what: str) -> BackendUnavailable:
    return BackendUnavailable(f"MIGraphX is not usable here: {what}", where="import migraphx (sdrt-migraphx)",
                              fix=INSTALL_HINT)


def load() -> ModuleType:
    """The ``migraphx`` module, imported once; raises ``BackendUnavailable`` (every time) when it is missing."""
    with _lock:
        if "module" not in _state:
            try:
                mod = _import()
                if not callable(getattr(mod, "parse_onnx", None)) or not callable(getattr(mod, "get_target", None)):
                    raise _unavailable(f"the migraphx module at {getattr(mod, '__file__', '?')} is not ROCm's "
                                       "MIGraphX (it has no parse_onnx/get_target: PyPI's placeholder?)")
                _state["module"] = mod
            except BackendUnavailable as exc:
                _state["module"] = exc
        found = _state["module"]
    if isinstance(found, BackendUnavailable):
        raise found
    assert isinstance(found, ModuleType)
    return found


def version(mod: ModuleType) -> str:
    return str(getattr(mod, "__version__", "unknown"))


def targets(mod: ModuleType) -> list[str]:
    """The targets of ``TARGETS`` this build of MIGraphX has (``get_target`` throws for the others)."""
    with _lock:
        cached = _state.get("targets")
        if isinstance(cached, list):
            return list(cached)
    found = []
    for name in TARGETS:
        try:
            mod.get_target(name)
        except Exception as exc:  # noqa: BLE001 - MIGraphX throws RuntimeError for a target it was built without
            log.debug("MIGraphX has no %s target: %s", name, exc)
            continue
        found.append(name)
    with _lock:
        _state["targets"] = list(found)
    return found


def reset() -> None:
    """Forget the import result (tests, or after installing MIGraphX in a running process)."""
    with _lock:
        _state.clear()
