"""``sdrt.load``: pick a backend and a device, compile, and return a Session."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .backend import Backend, Device, Session
from .errors import BackendUnavailable, InputError, ModelError, NoDeviceError, UnknownBackendError
from .graph import Graph
from .plugins import Registry, get_registry
from .weights import Weights

log = logging.getLogger("sdrt.runtime")


def load(
    model: str | os.PathLike[str] | bytes | Graph,
    weights: str | os.PathLike[str] | list[str | os.PathLike[str]] | Weights | None = None,
    backend: str = "auto",
    device: str | Device | None = None,
    *,
    quantize: str | None = None,
    shapes: Mapping[str, Sequence[int] | int] | None = None,
    **options: Any,
) -> Session:
    """Compile ``model`` and return a ready ``Session``.

    ``quantize="int8" | "int4" | "int4-64" | "fp8"`` stores the matmul and conv weights in that type
    (``sdrt.quantization``; quantized once, then read from the cache). A backend that cannot run a
    graph's quantized weights natively gets them dequantized to float32 at load.

    ``shapes={"sample": (2, 4, 64, 64)}`` or ``shapes={"batch": 2}`` pins dynamic dims (input names with
    full shapes, or symbolic dim names with sizes) before any backend sees the graph, so every backend
    compiles a static graph, as the pipelines do (on OpenVINO a UNet's attention runs 1.3-2.2x faster
    pinned). The session then takes those shapes only.

    ``backend="auto"`` picks, by priority, among the backends that offer a
    device here and logs its choice. An explicit ``backend`` or ``device`` that
    is missing, broken or unusable raises; there is no silent fallback.
    """
    proto = type(model).__name__ == "ModelProto" and hasattr(model, "graph")  # onnx's, in memory
    if not (proto or isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview, Graph))):
        raise InputError(f"model must be a path, the bytes of an ONNX file, an onnx.ModelProto or an sdrt.Graph, "
                         f"got {type(model).__name__}", where="model", fix="pass {@model=}'unet/model.onnx'")
    be, dev = select(backend, device)  # before any file I/O: a wrong name fails fast
    graph = model if isinstance(model, Graph) else Graph(model) if proto else Graph.load(model)
    if shapes:
        graph = _pinned(graph, shapes)
    reg = get_registry()
    chosen = _split_device(reg, backend, device)[0] if isinstance(device, str) else backend
    if chosen == "auto" and not isinstance(device, Device):  # the cost model may choose, now that it sees the graph
        be, dev = _auto(reg, device if isinstance(device, str) else None, graph=graph, quiet=True)
    bound = _open_weights(weights)
    requantize = None
    if quantize is not None or "DequantizeLinear" in graph.op_counts():
        from . import quantization

        if quantize is not None:  # the quantized graph holds the weights: bound ones are bound into it
            source = bound if bound is not None else Weights.from_graph(graph)
            graph = quantization.cached(graph, quantize, bound)
            bound = None
        graph = quantization.for_backend(graph, be)
        if quantize is not None:  # later float weights (a LoRA) are quantized as the graph holds them
            requantize = quantization.Requantizer(graph, source)
    log.info("compiling %s on %s", graph.label, dev)
    session = be.compile(graph, bound, dev, **options)
    if requantize is not None and requantize.held:
        session.requantize = requantize
    return session


def _pinned(graph: Graph, shapes: Any) -> Graph:
    """``graph`` with ``shapes`` pinned; a bad pin is an error about the ``shapes`` argument."""
    if not isinstance(shapes, Mapping):
        raise InputError(f"shapes must map input or dim names to sizes, got {type(shapes).__name__}",
                         where="shapes", fix="pass {@shapes=}{'sample': (2, 4, 64, 64)} or {@shapes=}{'batch': 2}")
    try:
        pinned = graph.with_shapes(dict(shapes))
    except ModelError as exc:
        told = "" if not exc.fix or exc.fix.startswith("pass ") else f"{exc.fix}; "  # "pass x=..." is Graph's
        raise InputError(f"{exc.what} ({graph.name})", where="shapes",
                         fix=f"{told}{{@shapes=}} maps input names to full shapes and dim names to sizes") from exc
    log.info("%s pinned to %s", graph.label, ", ".join(str(i) for i in pinned.inputs))
    return pinned


def _open_weights(weights: Any) -> Weights | None:
    if weights is None:
        return None
    if isinstance(weights, Weights):
        return weights
    return Weights.open(weights)


def select(backend: str = "auto", device: str | Device | None = None,
           registry: Registry | None = None) -> tuple[Backend, Device]:
    """Resolve a backend name (or ``"auto"``) and a device to usable objects.

    ``device`` may name its backend as ``sdrt info`` prints it: ``"openvino:CPU"``.
    """
    if not isinstance(backend, str):
        raise InputError(f"backend must be a backend's name, got {type(backend).__name__}", where="backend",
                         fix="pass {@backend=}'auto' or a name that sdrt info lists, e.g. 'openvino'")
    if device is not None and not isinstance(device, (str, Device)):
        raise InputError(f"device must be a device id, a Device or None, got {type(device).__name__} {device!r:.40}",
                         where="device", fix="pass {@device=}'CPU' or 'openvino:CPU' as sdrt info lists them, "
                         "or leave it unset")
    reg = registry or get_registry()
    if isinstance(device, str):
        backend, device = _split_device(reg, backend, device)
    if backend == "auto":
        if isinstance(device, Device):
            backend = device.backend
        else:
            return _auto(reg, device)
    be = _named_backend(reg, backend)
    return be, device_of(be, device)


def _split_device(reg: Registry, backend: str, device: str) -> tuple[str, str]:
    """``("openvino", "CPU")`` for ``"openvino:CPU"`` when ``openvino`` is a backend; else unchanged."""
    prefix, sep, rest = device.partition(":")
    if not sep or prefix not in reg.backends:
        return backend, device  # a plain id, which may hold a colon itself ("cuda:0")
    if backend not in ("auto", prefix):
        raise NoDeviceError(f"device {device!r} belongs to backend {prefix!r}, but backend {backend!r} was asked for",
                            where="device",
                            fix=f"drop {{@backend}}, or pass {{@device=}}{rest!r}")
    return prefix, rest


def device_of(be: Backend, device: str | Device | None = None) -> Device:
    """The device of ``be`` named by ``device`` (its first device when None); raises NoDeviceError."""
    devices = _devices(be)
    if not devices:
        raise NoDeviceError(
            f"backend {be.name!r} offers no device on this machine",
            where=f"{be.name}.devices() returned nothing",
            fix="check its drivers and runtime (sdrt info shows what each backend sees), or pick another backend",
        )
    return _pick_device(be, devices, device)


def cpu_device(beside: Backend | None = None, registry: Registry | None = None) -> tuple[Backend, Device] | None:
    """A CPU device to place parts on beside an accelerator (text encoders and VAE, ``sdrt.pipelines.budget``):
    ``beside``'s own CPU device when it offers one (OpenVINO, ggml), else the CPU device of the installed backend
    with the highest priority that offers one (skipping devices that run only when named); None when none does."""
    reg = registry or get_registry()
    ordered = sorted(reg.backends.values(), key=lambda b: (-b.priority, b.name))
    if beside is not None:
        ordered = [beside] + [b for b in ordered if b is not beside]
    for be in ordered:
        try:
            devs = _devices(be)
        except NoDeviceError:
            continue
        for d in devs:
            if d.kind == "cpu" and d.properties.get("auto", True) is not False:
                return be, d
    return None


def _named_backend(reg: Registry, name: str) -> Backend:
    if name in reg.backends:
        return reg.backends[name]
    record = reg.plugins.get(name)
    if record is not None and not record.ok:
        raise BackendUnavailable(
            f"backend {name!r} cannot be used: plugin is {record.state}: {record.error}",
            where=f"plugin {record.name} ({record.distribution or record.module})",
            fix="run `sdrt info` for details; reinstall or update the plugin",
        )
    known = sorted(reg.backends) or ["none installed"]
    same = [b for b in reg.backends if isinstance(name, str) and b.lower() == name.lower()]
    if same:  # --backend OpenVINO: "install the plugin" sent a user with it installed to reinstall it
        raise UnknownBackendError(f"no backend named {name!r}: backend names are lower case", where=f"installed "
                                  f"backends: {', '.join(known)}", fix=f"pass {{@backend=}}{same[0]!r}")
    from difflib import get_close_matches

    close = get_close_matches(name.lower(), list(reg.backends), n=1, cutoff=0.75) if isinstance(name, str) else []
    if close:  # --backend referenc, openvno: a typo of an installed one, not a plugin to install
        raise UnknownBackendError(f"no backend named {name!r} (the closest installed: {close[0]!r})",
                                  where=f"installed backends: {', '.join(known)}", fix=f"pass {{@backend=}}{close[0]}")
    raise UnknownBackendError(
        f"no backend named {name!r}",
        where=f"installed backends: {', '.join(known)}",
        fix="install the plugin that provides it (`sdrt install`), or pick one of the installed backends",
    )


def _devices(be: Backend) -> list[Device]:
    try:
        return list(be.devices())
    except Exception as exc:
        raise NoDeviceError(
            f"backend {be.name!r} failed while listing its devices: {exc!r}",
            where=f"{be.name}.devices()",
            fix="check the backend's runtime and drivers; `sdrt info` shows the same error",
        ) from exc


def _pick_device(be: Backend, devices: list[Device], wanted: str | Device | None) -> Device:
    if wanted is None:
        return devices[0]
    want_id = wanted.id if isinstance(wanted, Device) else str(wanted)
    for d in devices:
        if d.id == want_id or d.id.lower() == want_id.lower():
            return d
    raise NoDeviceError(
        f"backend {be.name!r} has no device {want_id!r}",
        where=f"{be.name} devices here: {', '.join(d.id for d in devices)}",
        fix="pass one of those device ids as {@device}, or leave it unset",
    )


def _auto(reg: Registry, device: str | None, graph: Graph | None = None, quiet: bool = False
          ) -> tuple[Backend, Device]:
    """The fixed priority's choice, unless the cost model is calibrated here for two or more of the
    candidates (``sdrt selftest --calibrate``): then the one it predicts fastest for ``graph`` (or, without
    a graph, for an SD UNet's mix of op classes)."""
    candidates: list[tuple[Backend, list[Device]]] = []
    reasons: list[str] = []
    for be in sorted(reg.backends.values(), key=lambda b: (-b.priority, b.name)):
        try:
            devs = _devices(be)
        except NoDeviceError as exc:
            reasons.append(str(exc))
            continue
        if device is not None:
            devs = [d for d in devs if d.id.lower() == device.lower()]
        else:  # devices that ask to run only when named stay out of the automatic choice
            named_only = [d.id for d in devs if d.properties.get("auto", True) is False]
            devs = [d for d in devs if d.properties.get("auto", True) is not False]
            if named_only and not devs:
                reasons.append(f"{be.name}: its devices ({', '.join(named_only)}) run only when named")
                continue
        if devs:
            candidates.append((be, devs))
        else:
            reasons.append(f"{be.name}: no {'device ' + repr(device) if device else 'usable device'}")
    if not candidates:
        broken = [f"{r.name} ({r.state}: {r.error})" for r in reg.plugins.values() if not r.ok]
        raise NoDeviceError(
            "no installed backend can run here" + (f" on device {device!r}" if device else ""),
            where="; ".join(reasons + broken) or "no backend plugins are installed",
            fix="run `sdrt info` to see what was detected and which plugin to install (`sdrt install`)",
        )
    planned = _by_plan(candidates, graph)
    if planned is not None:
        be, dev, why = planned
        log.info("auto-selected backend %s on %s: %s", be.name, dev, why)
        return be, dev
    be, devs = candidates[0]
    passed = [b.name for b, _ in candidates[1:]]
    if quiet:
        return be, devs[0]
    log.info(
        "auto-selected backend %s on %s: highest priority (%d) among backends with a device%s",
        be.name, devs[0], be.priority, f"; passed over: {', '.join(passed)}" if passed else "",
    )
    return be, devs[0]


def _by_plan(candidates: list[tuple[Backend, list[Device]]], graph: Graph | None) -> tuple[Backend, Device, str] | None:
    """(backend, device, why) from the calibrated cost model, or None when fewer than two candidates
    are calibrated on this machine or the prediction fails (the fixed priority then decides)."""
    if len(candidates) < 2:
        return None
    try:
        from .cost import choose

        return choose.by_prediction([(b, ds[0]) for b, ds in candidates], graph)
    except Exception as exc:  # noqa: BLE001 - the plan is advice: the fixed priority stays in charge
        log.debug("the cost model could not rank the backends (%s); using the fixed priority", exc)
        return None
