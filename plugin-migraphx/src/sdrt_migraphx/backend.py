"""``MIGraphXBackend``: AMD GPUs (and MIGraphX's cpu/ref targets), compiled through the ``.mxr`` program cache."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdrt import Backend, Device, Session
from sdrt.errors import BackendUnavailable, NoDeviceError

from . import cache as cache_mod
from . import devices as devices_mod
from . import module, ops
from .conformance import CONFORMANCE
from .identity import graph_digest, weights_digest
from .options import Options, parse_options
from .program import Builder
from .session import MIGraphXSession

if TYPE_CHECKING:  # pragma: no cover
    from sdrt.graph import Graph
    from sdrt.hardware import Hardware
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.migraphx")

PLUGIN_VERSION = "0.1.0"
CACHE_FORMAT = "1"  # bump to orphan every older cache entry
#: ops whose programs are compiled every time: MIGraphX 2.16 saves a program with a Scan to .mxr, but the
#: program loaded back takes its loop-state parameters in the wrong places ("Incorrect shape {int64_type,
#: {1}, {0}} for parameter: state_var0"); Loop keeps its state the same way
UNCACHEABLE = frozenset({"Scan", "Loop"})


class MIGraphXBackend(Backend):
    name = "migraphx"
    api_version = (1, 1)
    priority = 70  # above OpenVINO (50) and ggml (10): on a supported Radeon/Instinct GPU, MIGraphX is the fast path
    conformance: ClassVar[Mapping[str, Any]] = CONFORMANCE  # MIGraphX's own failures, checked on raw MIGraphX

    def __init__(self) -> None:
        self._warned: set[str] = set()

    # -- devices -------------------------------------------------------
    @staticmethod
    def hardware() -> Hardware:
        from sdrt.hardware import detect

        return detect()

    def devices(self) -> list[Device]:
        """Supported AMD GPUs (``gpu:N``), then ``cpu`` and ``ref`` where this MIGraphX build has them.

        Raises ``BackendUnavailable`` when the ``migraphx`` module is missing, saying what was found
        on this machine and how to get MIGraphX.
        """
        hw = self.hardware()
        try:
            mod = module.load()
        except BackendUnavailable as exc:
            raise self._unavailable(exc, hw) from exc
        pl = devices_mod.plan(hw, module.targets(mod), os.environ)
        for p in pl.passed_over:
            if str(p) not in self._warned:
                self._warned.add(str(p))
                log.warning("MIGraphX passes over %s", p)
        return pl.devices

    @staticmethod
    def _unavailable(exc: BackendUnavailable, hw: Hardware) -> BackendUnavailable:
        pl = devices_mod.plan(hw, ("gpu",))
        fix = exc.fix or module.INSTALL_HINT
        if pl.passed_over and not pl.devices:  # MIGraphX would not run this machine's GPU anyway
            fix = f"{pl.passed_over[0].instead}; for MIGraphX's CPU ref target only: {fix}"
        return BackendUnavailable(exc.what, where=devices_mod.describe_gpus(hw), fix=fix)

    @staticmethod
    def passed_over() -> list[devices_mod.PassedOver]:
        """The AMD GPUs here that MIGraphX will not run on, each with why and what to use instead."""
        try:
            targets = module.targets(module.load())
        except BackendUnavailable:
            targets = ["gpu"]
        return devices_mod.plan(MIGraphXBackend.hardware(), targets, os.environ).passed_over

    @staticmethod
    def version() -> str:
        return module.version(module.load())

    # -- compiling -----------------------------------------------------
    def compile(self, graph: Graph, weights: Weights | None, device: Device, **options: Any) -> Session:
        if device.backend != self.name:
            raise NoDeviceError(f"device {device} belongs to backend {device.backend!r}", where="migraphx.compile",
                                fix="pass one of the devices of backend 'migraphx' (sdrt info lists them)")
        target = str(device.properties.get("target", device.id))
        opts = parse_options(options, gpu=target == "gpu")
        try:
            mod = module.load()
        except BackendUnavailable:
            ops.check(graph, None)  # a graph MIGraphX could not run is said so even where MIGraphX is missing
            raise
        ops.check(graph, mod)  # before any long work
        builder = Builder(mod, graph, target, opts, opts.cache_dir / "migraphx" if opts.cache_dir else None)
        if target == "gpu" and device.properties.get("hip_index", 0) != 0:
            raise NoDeviceError(
                f"MIGraphX's Python API compiles for the current HIP device only, and {device.id} is not it",
                where=f"{device} ({device.properties.get('bus_id') or 'bus unknown'})",
                fix=f"start the process with HIP_VISIBLE_DEVICES={device.properties['hip_index']}: that GPU is "
                    "then gpu:0")
        import sdrt

        arrays = sdrt.resolve_weights(graph, weights)
        where = f"{graph.name} on migraphx:{device.id}"
        graph_key = graph_digest(graph)
        loops = sorted({op for op, _ in ops.nodes(graph.model.graph)} & UNCACHEABLE)
        if loops and opts.cache:
            log.info("%s: not using the program cache for a graph with %s (MIGraphX's .mxr round trip mixes up "
                     "their state parameters)", where, ", ".join(loops))

        def compile_arrays(arrs: Mapping[str, np.ndarray]) -> tuple[Any, bool]:
            if not opts.cache or loops:
                return builder.build(arrs), False
            store = cache_mod.ProgramCache(opts.cache_dir / "migraphx" if opts.cache_dir else cache_mod.default_dir())
            key = self.cache_key(graph_key, weights_digest(arrs), device, module.version(mod), opts)
            program, hit = store.get_or_compile(
                key, load=lambda p: mod.load(str(p)), compile_=lambda: builder.build(arrs),
                save=lambda prog, p: mod.save(prog, str(p)))
            log.info("%s %s (cache %s)", "loaded" if hit else "compiled", where, key[:12])
            return program, hit

        program, _ = compile_arrays(arrays)
        return MIGraphXSession(graph, program, arrays, compile_arrays, where)

    @staticmethod
    def cache_key(graph_key: str, weights_key: str, device: Device, migraphx_version: str, opts: Options) -> str:
        """The program cache key: graph, weights identity, target and gfx target, versions, options."""
        target = str(device.properties.get("target", device.id))
        gfx = str(device.properties.get("gfx_target", "")) if target == "gpu" else ""
        return cache_mod.make_key([graph_key, weights_key, target, gfx, migraphx_version, PLUGIN_VERSION,
                                   CACHE_FORMAT, opts.key()])
