"""The backend contract. A plugin implements these classes and nothing else.

Data flows one way::

    file -> Graph (+ Weights) -> Backend.compile(graph, weights, device, **options)
         -> Session.run(feeds) -> outputs

The base classes own the shared work. ``Session.run`` checks the feeds against
``Session.inputs``, then calls ``Session._run``. ``Session.update_weights``
checks that the session is open, resolves and validates the weights against
the session's graph (one ``WeightsError`` listing every problem), then calls
``Session._update_weights(arrays)``. In ``compile`` a backend gets the final
``{initializer name: array}`` from ``sdrt.resolve_weights(graph, weights)``
and never merges weights itself. A backend writes only ``devices``,
``compile``, ``_run`` and, optionally, ``_update_weights``.

This module imports neither ``sdrt.graph`` nor ``sdrt.weights`` at run time:
it speaks to them only through the objects a backend is handed.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import InputError, SdrtError, WeightsError
from .tensors import NON_TENSOR, Dim, TensorInfo, shape_str

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .graph import Graph
    from .weights import Weights

#: The plugin API this core speaks, as (major, minor). A plugin built for
#: (M, m) is accepted when M equals the core's major and m <= the core's minor.
API_VERSION: tuple[int, int] = (1, 0)


@dataclass(frozen=True)
class Device:
    """Something a backend can run on.

    ``id`` is the backend's own name for it (``"CPU"``, ``"GPU.0"``, ``"cuda:0"``)
    and is what users pass as ``device=``. ``kind`` is one of ``cpu``, ``gpu``,
    ``npu`` or ``auto``. A device whose ``properties["auto"]`` is False is never
    picked by ``backend="auto"`` (a slow reference target, say); it runs only when
    named.
    """

    backend: str
    id: str
    name: str = ""
    kind: str = "cpu"
    memory_bytes: int | None = None
    properties: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __str__(self) -> str:
        label = f"{self.backend}:{self.id}"
        return f"{label} ({self.name})" if self.name else label


def check_api_version(plugin_version: tuple[int, int], core_version: tuple[int, int] = API_VERSION) -> bool:
    """True when a plugin built for ``plugin_version`` can run on this core."""
    return plugin_version[0] == core_version[0] and plugin_version[1] <= core_version[1]


class Session(ABC):
    """A compiled graph on one device. Use it as a context manager so ``close`` runs.

    A backend's session passes the ``Graph`` it compiled as ``graph=``: the base
    class validates weight updates against it. Override ``_run`` (required),
    ``_update_weights`` (to support weight swaps) and ``close`` (to free what
    the session holds, then call ``super().close()``).
    """

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    #: the graph this session was compiled from (``None``: the backend did not pass it)
    graph: Graph | None

    def __init__(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], *,
                 graph: Graph | None = None) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.graph = graph
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self, where: str) -> None:
        if self._closed:
            raise SdrtError("this session is closed", where=f"{type(self).__name__}.{where}",
                            fix="compile the graph again with sdrt.load")

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` maps every input name to an array of the declared dtype and shape."""
        self._check_open("run")
        arrays = check_feeds(self.inputs, feeds)
        return self._run(arrays)

    @abstractmethod
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the compiled graph on feeds that ``run`` has already checked."""
        raise NotImplementedError(f"{type(self).__name__} must implement _run")

    def update_weights(self, weights: Weights) -> None:
        """Rebind the graph's initializers to new weights without re-parsing the graph.

        The weights are checked against ``self.graph`` first (names after key
        mapping, dtypes, shapes); a mismatch raises one ``WeightsError`` listing
        every problem and leaves the session as it was. Then the backend's
        ``_update_weights`` gets ``{initializer name: array}``.
        """
        self._check_open("update_weights")
        if self.graph is None:
            raise SdrtError(
                f"{type(self).__name__} was built without its graph, so weights cannot be checked against it",
                where=f"{type(self).__name__}.update_weights",
                fix="the backend must pass graph= to Session.__init__; until then compile again with "
                    "sdrt.load(model, weights=...)",
            )
        bind = getattr(weights, "bind", None)
        if not callable(bind):
            raise WeightsError(
                f"update_weights takes sdrt.Weights, got {type(weights).__name__}",
                where=f"{type(self).__name__}.update_weights",
                fix="wrap arrays with sdrt.Weights.from_arrays({name: array}) or open files with sdrt.Weights.open",
            )
        import numpy as np  # lazily: `import sdrt` must not pay for numpy

        arrays = {name: np.asarray(value) for name, value in bind(self.graph).items()}
        self._update_weights(arrays)

    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """Swap in new initializer values, checked by ``update_weights``. Override to support it."""
        raise SdrtError(
            f"{type(self).__name__} cannot update weights in place",
            where="Session.update_weights",
            fix="compile again with sdrt.load(model, weights=...)",
        )

    def close(self) -> None:
        """Free what the session holds (device memory). Safe to call twice."""
        self._closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(ABC):
    """A way to run graphs: one per plugin (or several)."""

    #: short name users pass as ``backend=``: ``"openvino"``
    name: ClassVar[str]
    #: the plugin API version this backend was built for
    api_version: ClassVar[tuple[int, int]] = API_VERSION
    #: order for automatic choice among backends that offer a device; higher wins
    priority: ClassVar[int] = 0
    #: what the conformance kit (``sdrt.testing``) should expect of this backend:
    #: ``{"xfail": {regex: reason}, "exclude": {regex: reason},
    #: "tolerances": {regex: (rtol, atol)}}``; regexes match test names.
    conformance: ClassVar[Mapping[str, Any]] = {}
    #: the precisions this backend can compile at, each with the compile options that ask for it,
    #: e.g. ``{"fp32": {"precision": "f32"}, "bf16": {"precision": "bf16"}}``; ``sdrt selftest``
    #: measures accuracy at ``fp32`` and at ``default_precision`` (what no options give)
    precisions: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    default_precision: ClassVar[str] = "fp32"

    def precision_for(self, device: Device) -> str:
        """The precision ``compile`` uses on ``device`` when no ``precision=`` is passed (``sdrt info`` shows it).

        By default the device's ``properties["precision"]`` when the backend put one there (see
        ``sdrt.precision_default``: the fastest precision within the image bar against float32), else
        ``default_precision``; ``SDRT_PRECISION`` replaces either when the backend offers it."""
        from .precision_default import override

        forced = override(self.precisions or {"fp32": {}})
        return forced or str(device.properties.get("precision") or self.default_precision)

    @abstractmethod
    def devices(self) -> list[Device]:
        """What this backend can run on, here and now. An empty list means: nothing."""

    @abstractmethod
    def compile(self, graph: Graph, weights: Weights | None, device: Device, **options: Any) -> Session:
        """Compile ``graph`` for ``device`` and return a Session built with ``graph=``.

        Raise ``UnsupportedGraph`` before any long work. Take the weights from
        ``sdrt.resolve_weights(graph, weights)``: every initializer's final array
        (the graph's own data, a stripped graph's mapped file, ``weights`` overriding).
        """

    # -- ahead-of-time builds (optional) ------------------------------------
    def targets(self) -> list[str]:
        """Names of the hardware targets ``build`` can compile for on this machine (``"sm86"``);
        empty when the backend has no ahead-of-time build."""
        return []

    def build(self, graph: Graph, weights: Weights | None, target: str, path: str | os.PathLike[str],
              **options: Any) -> Path:
        """Compile ``graph`` for ``target`` (one of ``targets()``) into the file ``path``, without
        needing that hardware here; returns the path written. ``sdrt compile`` calls this."""
        raise SdrtError(
            f"backend {self.name!r} has no ahead-of-time build",
            where=f"{type(self).__name__}.build",
            fix="use a backend whose targets() is not empty (sdrt compile --help lists them), "
                "or compile on the device with sdrt.load",
        )


_DTYPE_ALIASES = {"float": "float32", "double": "float64"}


def check_feeds(inputs: Sequence[TensorInfo], feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Check ``feeds`` against the declared ``inputs``; return them as numpy arrays.

    Raises ``InputError`` naming the input with the expected and actual values.
    """
    import numpy as np  # lazily: `import sdrt` must not pay for numpy

    if not isinstance(feeds, Mapping):
        raise InputError(
            f"feeds must be a mapping of input name to array, got {type(feeds).__name__}",
            where="Session.run",
            fix="pass a dict such as {'x': array}",
        )
    expected = {i.name: i for i in inputs}
    unknown = [k for k in feeds if k not in expected]
    missing = [k for k in expected if k not in feeds]
    if unknown or missing:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(repr(m) for m in missing))
        if unknown:
            parts.append("unexpected " + ", ".join(repr(u) for u in unknown))
        raise InputError(
            "wrong input names: " + "; ".join(parts),
            where="Session.run feeds",
            fix="the graph expects exactly: " + ", ".join(str(i) for i in inputs),
        )
    out: dict[str, np.ndarray] = {}
    for name, info in expected.items():
        if info.dtype == NON_TENSOR:  # sequence, map or optional input: passed through as given
            out[name] = feeds[name]
            continue
        value = np.asarray(feeds[name])
        want = _DTYPE_ALIASES.get(info.dtype, info.dtype)
        if value.dtype.name != want and not (want == "object" and value.dtype.kind in "OUS"):
            raise InputError(
                f"input {name!r} has dtype {value.dtype}, expected {want}",
                where=f"Session.run feed {name!r}",
                fix=f"convert it with array.astype(np.{want})",
            )
        if len(value.shape) != len(info.shape) or any(
            isinstance(d, int) and d != a for d, a in zip(info.shape, value.shape)
        ):
            raise InputError(
                f"input {name!r} has shape {tuple(value.shape)}, expected {shape_str(info.shape)}",
                where=f"Session.run feed {name!r}",
                fix="reshape the array, or compile a graph whose shape matches",
            )
        out[name] = value
    return out


__all__ = ["API_VERSION", "NON_TENSOR", "Backend", "Device", "Dim", "Session", "TensorInfo",
           "check_api_version", "check_feeds"]
