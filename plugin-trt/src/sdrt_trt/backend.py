"""``TrtBackend``: NVIDIA RTX GPUs through TensorRT-RTX; engines cached, or built ahead of time for any target."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdrt import Backend, Device, Session
from sdrt.errors import BackendUnavailable, NoDeviceError

from . import cache as cache_mod
from .errors import TrtError
from .options import OptionError, Options, parse_options
from .prepare import Prepared, prepare, resolve
from .targets import DevicePlan, check_target, plan_devices, target_names

if TYPE_CHECKING:  # pragma: no cover
    from sdrt.graph import Graph
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.trt")

PLUGIN_VERSION = "0.1.0"
ENGINE_FORMAT = 1  # bump to orphan every older cache entry and refuse older engine files


def trt_version() -> str:
    try:
        import tensorrt_rtx as trt
    except ImportError as exc:  # pragma: no cover - a dependency of this package
        raise BackendUnavailable("tensorrt-rtx is not installed", where="import tensorrt_rtx",
                                 fix="pip install 'tensorrt-rtx>=1.7,<2'") from exc
    except OSError as exc:  # pragma: no cover - a broken wheel (missing shared library)
        raise BackendUnavailable(f"tensorrt-rtx cannot load its libraries ({exc})", where="import tensorrt_rtx",
                                 fix="pip install --force-reinstall tensorrt-rtx") from exc
    return str(trt.__version__)


class TrtBackend(Backend):
    name = "trt"
    api_version = (1, 1)
    priority = 100  # the fastest runtime on the GPUs it supports
    conformance: ClassVar[Mapping[str, Any]] = {}
    #: what ``sdrt selftest`` measures: each precision's compile options, and the default one
    precisions: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "fp16": {"precision": "fp16"}, "bf16": {"precision": "bf16"}, "fp32": {"precision": "fp32"}}
    default_precision: ClassVar[str] = "fp16"

    def __init__(self) -> None:
        self._plan: DevicePlan | None = None
        self._lock = threading.Lock()

    # -- devices -------------------------------------------------------
    def device_plan(self) -> DevicePlan:
        """Usable devices and, for every NVIDIA GPU that is not, the reason and the plugin to use instead."""
        with self._lock:
            if self._plan is None:
                from sdrt import hardware

                from . import cuda

                found, error = cuda.list_devices()
                self._plan = plan_devices(hardware.detect(), found, error, self.targets())
                for line in self._plan.unusable:
                    log.warning("TensorRT-RTX cannot use %s", line)
            return self._plan

    def devices(self) -> list[Device]:
        return list(self.device_plan().devices)

    def unusable(self) -> list[str]:
        """One line per NVIDIA GPU here that TensorRT-RTX cannot run on, with the reason."""
        return list(self.device_plan().unusable)

    def targets(self) -> list[str]:
        trt_version()
        return target_names()

    # -- ahead of time -------------------------------------------------
    def build(self, graph: Graph, weights: Weights | None, target: str, path: str | os.PathLike[str],
              **options: Any) -> Path:
        opts = parse_options(options, where="sdrt compile --backend trt")
        if opts.engine is not None:
            raise OptionError("engine= names an engine to load; sdrt compile writes one", where="trt build",
                              fix="drop the engine option")
        name = check_target(target, self.targets())
        out = Path(path)
        if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):  # before a build of minutes
            raise TrtError("cannot write the engine file: its folder does not exist or is not writable",
                           where=str(out), fix="create the folder, or pass -o with a writable path")
        refit = self._refit_mode(opts, gpu_here=bool(self._cuda_devices()))
        prepared = prepare(graph, weights, opts)
        engine, _ = self._build(prepared, name, refit)
        return cache_mod.write_engine(out, self._meta(prepared, name, refit, opts), engine)

    # -- compiling -----------------------------------------------------
    def compile(self, graph: Graph, weights: Weights | None, device: Device, **options: Any) -> Session:
        from .session import TrtSession

        opts = parse_options(options)
        if device.backend != self.name:
            raise NoDeviceError(f"device {device} belongs to backend {device.backend!r}", where="trt.compile",
                                fix="pass one of the devices of backend 'trt'")
        target = str(device.properties.get("target", ""))
        if target not in self.targets():
            raise NoDeviceError(f"device {device} has no TensorRT-RTX target (properties: target={target!r})",
                                where="trt.compile", fix="pass one of backend('trt').devices()")
        if opts.precision == "bf16" and not device.properties.get("bf16"):
            raise OptionError(f"{device.name} (compute {device.properties.get('compute_capability')}) has no bf16",
                              where="sdrt.load(..., backend='trt')", fix="use precision='fp16'")
        refit = self._refit_mode(opts, gpu_here=True)
        file_meta: dict[str, Any] | None = None
        if opts.engine is not None:  # refuse a missing or corrupt file before any work
            file_meta, engine_file = cache_mod.read_engine(opts.engine)
            if opts.refit == "auto":
                refit = str(file_meta.get("refit", "none"))
        sources = resolve(graph, weights)
        prepared = prepare(graph, weights, opts)
        meta = self._meta(prepared, target, refit, opts)

        def rebuild(arrays: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, Any], Prepared]:
            from sdrt.weights import Weights

            again = prepare(graph, Weights.from_arrays(dict(arrays)), opts)
            blob, _ = self._build(again, target, refit)
            return blob, self._meta(again, target, refit, opts), again

        store = key = None
        if opts.engine is not None and file_meta is not None:
            self._check_file(opts.engine, file_meta, meta)
            engine = engine_file
        else:
            engine = None
            if opts.cache:
                store = cache_mod.EngineCache(opts.cache_dir / "trt" if opts.cache_dir else cache_mod.default_dir())
                key = self.cache_key(meta)
                hit = store.get(key)
                if hit is not None and self._same_build(hit[0], meta):
                    engine = hit[1]
                    log.info("engine cache hit for %s (%s)", graph.name, key[:12])
            if engine is None:
                engine, _ = self._build(prepared, target, refit)
                if store is not None and key is not None:
                    store.put(key, meta, engine)
        return TrtSession(graph, engine, meta, prepared, device, sources, rebuild, store, key)

    # -- helpers -------------------------------------------------------
    @staticmethod
    def _cuda_devices() -> list[Any]:
        from . import cuda

        return cuda.list_devices()[0]

    @staticmethod
    def _refit_mode(opts: Options, *, gpu_here: bool) -> str:
        if opts.refit != "auto":
            return opts.refit
        return "full" if gpu_here else "none"

    def _build(self, prepared: Prepared, target: str, refit: str) -> tuple[bytes, float]:
        from .build import build_engine

        return build_engine(prepared, target, refit)

    @staticmethod
    def _meta(prepared: Prepared, target: str, refit: str, opts: Options) -> dict[str, Any]:
        """What an engine was built from: enough to key the cache and to check an engine file against a graph."""
        g = prepared.graph
        return {
            "format": ENGINE_FORMAT, "plugin": PLUGIN_VERSION, "tensorrt_rtx": trt_version(), "target": target,
            "graph": prepared.graph_digest, "refit": refit, "options": opts.key(refit),
            # a refit='full' engine takes any weights of these shapes: its identity does not depend on them
            "weights": None if refit == "full" else prepared.weights_digest,
            "model": g.name, "inputs": [str(i) for i in g.inputs], "outputs": [str(o) for o in g.outputs],
        }

    @staticmethod
    def cache_key(meta: Mapping[str, Any]) -> str:
        parts = ("format", "plugin", "tensorrt_rtx", "target", "graph", "refit", "options", "weights")
        return cache_mod.make_key(f"{p}={meta.get(p)}" for p in parts)

    @staticmethod
    def _same_build(found: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
        keys = ("format", "tensorrt_rtx", "target", "graph", "refit", "options", "weights")
        return all(found.get(k) == want.get(k) for k in keys)

    @staticmethod
    def _check_file(path: Path, meta: Mapping[str, Any], want: Mapping[str, Any]) -> None:
        """An engine file must come from this graph, target, TensorRT-RTX version and options; a file that
        holds its weights (refit='none') from these weights too."""
        problems = [f"{k}: file {meta.get(k)!r}, wanted {want.get(k)!r}"
                    for k in ("format", "tensorrt_rtx", "target", "graph", "options", "weights")
                    if meta.get(k) != want.get(k) and not (k == "weights" and meta.get("refit") == "full")]
        if problems:
            raise TrtError(f"the engine file does not match this graph, device or options ({'; '.join(problems)})",
                           where=str(path), fix="build it again with sdrt compile for this model, target and options")
