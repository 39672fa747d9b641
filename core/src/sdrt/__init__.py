"""sdrt: run Stable Diffusion-class ONNX models on any desktop or laptop GPU.

``import sdrt`` is light: onnx, numpy-heavy modules and plugins load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backend import API_VERSION, Backend, Device, Session, TensorInfo
from .errors import SdrtError
from .hookspecs import hookimpl

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Graph
    from .runtime import load
    from .weights import Weights, resolve_weights

_LAZY: dict[str, tuple[str, str | None]] = {
    "load": ("runtime", "load"),
    "Graph": ("graph", "Graph"),
    "Weights": ("weights", "Weights"),
    "resolve_weights": ("weights", "resolve_weights"),
    # modules: ``sdrt.lora.merge(...)`` and ``sdrt.keymap.KeyMap`` work after a plain ``import sdrt``
    "graph": ("graph", None),
    "weights": ("weights", None),
    "lora": ("lora", None),
    "keymap": ("keymap", None),
    "install": ("installer", "install"),  # a plain function: sdrt.install(dry_run=True)
    "hardware": ("hardware", None),  # module: sdrt.hardware.detect()
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(f".{module}", __name__)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    if name.isidentifier() and not name.startswith("_"):  # any submodule: sdrt.pipelines.load(...) after import sdrt
        import importlib
        import importlib.util

        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'sdrt' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy names and the submodules too (``sdrt.pipelines``, ``sdrt.lora``): an IDE or IPython completes
    ``sdrt.pip`` from ``dir(sdrt)``, which listed only what had been imported so far."""
    import pkgutil

    subs = (m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return sorted({*globals(), *_LAZY, *subs})


__all__ = [
    "API_VERSION",
    "Backend",
    "Device",
    "Graph",
    "SdrtError",
    "Session",
    "TensorInfo",
    "Weights",
    "__version__",
    "hookimpl",
    "load",
    "resolve_weights",
]
