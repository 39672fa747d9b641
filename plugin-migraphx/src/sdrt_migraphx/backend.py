"""``MIGraphXBackend``: AMD GPUs (and MIGraphX's cpu/ref targets); programs kept in the core's compile cache.

What is MIGraphX's own here: checking and building the program (``program``) and
the cache entry's content, one ``program.mxr`` exactly as ``migraphx.save``
writes it (``migraphx-driver`` and ``migraphx.load`` read it as is). The key,
the checksums, atomic writes, discarding a bad entry and the size cap are the
core's (``sdrt.cache``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdrt import Backend, Device, Session
from sdrt.errors import BackendUnavailable, NoDeviceError

from . import devices as devices_mod
from . import module, ops
from .conformance import CONFORMANCE
from .options import Options, parse_options
from .program import Builder
from .session import MIGraphXSession

if TYPE_CHECKING:  # pragma: no cover
    from sdrt.cache import CompileCache, Entry
    from sdrt.graph import Graph
    from sdrt.hardware import Hardware
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.migraphx")

PLUGIN_VERSION = "0.1.0"
CACHE_FORMAT = "2"  # bump to orphan every older cache entry
#: the file of a cache entry
PROGRAM = "program.mxr"
#: ops whose programs are compiled every time: MIGraphX 2.16 saves a program with a Scan to .mxr, but the
#: program loaded back takes its loop-state parameters in the wrong places ("Incorrect shape {int64_type,
#: {1}, {0}} for parameter: state_var0"); Loop keeps its state the same way
UNCACHEABLE = frozenset({"Scan", "Loop"})


class MIGraphXBackend(Backend):
    name = "migraphx"
    api_version = (1, 1)
    priority = 70  # above OpenVINO (50) and ggml (10): on a supported Radeon/Instinct GPU, MIGraphX is the fast path
    conformance: ClassVar[Mapping[str, Any]] = CONFORMANCE  # MIGraphX's own failures, checked on raw MIGraphX
    caches = True
    #: int8 weights (``DequantizeLinear`` per channel on MatMul/Gemm/Conv weights) go to MIGraphX's parser as stored:
    #: it reads INT8 initializers and DequantizeLinear's axis (src/onnx/parse_dequantizelinear.cpp at f729a52).
    #: int4 and fp8 are dequantized at load (the written model keeps one 4-bit value a byte; not checked on MIGraphX)
    quantized_weights: ClassVar[Mapping[str, frozenset[str]]] = {"int8": frozenset({"MatMul", "Gemm", "Conv"})}

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

    # -- compiling: the hooks of the core's Backend.compile -------------------
    @staticmethod
    def _target(device: Device) -> str:
        return str(device.properties.get("target", device.id))

    def parse_options(self, options: Mapping[str, Any], device: Device) -> Options:
        return parse_options(options, gpu=self._target(device) == "gpu")

    def _prepare(self, graph: Graph, device: Device, opts: Options) -> Graph:
        try:
            mod = module.load()
        except BackendUnavailable:
            ops.check(graph, None)  # a graph MIGraphX could not run is said so even where MIGraphX is missing
            raise
        ops.check(graph, mod)  # before any long work
        if self._target(device) == "gpu" and device.properties.get("hip_index", 0) != 0:
            raise NoDeviceError(
                f"MIGraphX's Python API compiles for the current HIP device only, and {device.id} is not it",
                where=f"{device} ({device.properties.get('bus_id') or 'bus unknown'})",
                fix=f"start the process with HIP_VISIBLE_DEVICES={device.properties['hip_index']}: that GPU is "
                    "then gpu:0")
        return graph

    def _compile(self, graph: Graph, arrays: dict[str, np.ndarray], device: Device,
                 opts: Options) -> tuple[MIGraphXSession, Any]:
        program = Builder(module.load(), graph, self._target(device), opts, None).build(arrays)
        session = MIGraphXSession(graph, program, arrays, self._updater(graph, device, opts, None),
                                  f"{graph.name} on migraphx:{device.id}")
        return session, (lambda cache: self._updater(graph, device, opts, cache))

    def _open(self, compiled: tuple[MIGraphXSession, Any], entry: Entry | None) -> Session:
        """The session; its weight updates go through the compile cache its program was stored in."""
        session, updater = compiled
        if entry is not None:
            from sdrt.cache import CompileCache

            session._compile = updater(CompileCache.of(entry))
        return session

    def _updater(self, graph: Graph, device: Device, opts: Options, cache: CompileCache | None) -> Any:
        """``update_weights``' compile: a program is compiled again for new weights (MIGraphX folds them into
        literals), through ``cache`` when given, so that weights used before are one ``migraphx.load``."""
        builder = Builder(module.load(), graph, self._target(device), opts, None)
        parts = self._cache_parts(graph, device, opts) if cache is not None else None

        def compile_arrays(arrs: Mapping[str, np.ndarray]) -> tuple[Any, bool]:
            if cache is None or parts is None:
                return builder.build(arrs), False
            from sdrt.weights import Weights

            key = self.cache_key(graph, Weights.from_arrays(dict(arrs)), parts)
            entry = cache.lookup(key)
            if entry is not None:
                try:
                    return module.load().load(str(entry.file(PROGRAM))), True
                except Exception as exc:  # noqa: BLE001 - MIGraphX cannot read it: compile again
                    cache.discard(key, f"migraphx could not load it ({str(exc).splitlines()[0][:200]})")
            program = builder.build(arrs)
            cache.store(key, lambda folder: module.load().save(program, str(folder / PROGRAM)),
                        {"model": graph.label, "device": device.id, **self._cache_meta(graph, device, opts)})
            return program, False

        return compile_arrays

    # -- the compile cache -----------------------------------------------
    def _cache_parts(self, graph: Graph, device: Device, opts: Options) -> list[str] | None:
        loops = sorted({op for op, _ in ops.nodes(graph.model.graph)} & UNCACHEABLE)
        if loops:
            log.info("%s: not using the compile cache for a graph with %s (MIGraphX's .mxr round trip mixes up "
                     "their state parameters)", graph.name, ", ".join(loops))
            return None
        return self.cache_parts(device, module.version(module.load()), opts)

    @staticmethod
    def cache_parts(device: Device, migraphx_version: str, opts: Options) -> list[str]:
        """What besides the graph and the weights keys a program: target and gfx target, versions, options."""
        target = str(device.properties.get("target", device.id))
        gfx = str(device.properties.get("gfx_target", "")) if target == "gpu" else ""
        return [target, gfx, migraphx_version, PLUGIN_VERSION, CACHE_FORMAT, opts.key()]

    def _cache_meta(self, graph: Graph, device: Device, opts: Options) -> dict[str, Any]:
        return {"precision": opts.precision}

    def _save(self, compiled: tuple[MIGraphXSession, Any], folder: Path) -> bool:
        module.load().save(compiled[0]._program, str(folder / PROGRAM))
        return True

    def _load(self, entry: Entry, graph: Graph, weights: Weights | None, device: Device, opts: Options) -> Session:
        from sdrt import resolve_weights
        from sdrt.cache import CompileCache

        program = module.load().load(str(entry.file(PROGRAM)))
        return MIGraphXSession(graph, program, resolve_weights(graph, weights),
                               self._updater(graph, device, opts, CompileCache.of(entry)),
                               f"{graph.name} on migraphx:{device.id}")
