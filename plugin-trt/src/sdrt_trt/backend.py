"""``TrtBackend``: NVIDIA RTX GPUs through TensorRT-RTX; engines kept in the core's compile cache, or built ahead
of time for any target (``sdrt compile``, ``enginefile``).

What is TensorRT-RTX's own here: preparing the graph (``prepare``), building the
engine (``build``), the engine files ``sdrt compile`` writes, and a cache
entry's content, ``engine.bin`` as TensorRT-RTX serializes it (mapped, not read,
on a hit), with its JIT runtime cache kept in an entry of its own beside it.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdrt import Backend, Device, Session
from sdrt.errors import BackendUnavailable, NoDeviceError, UnusableEntry

from . import enginefile
from .errors import TrtError
from .options import OptionError, Options, parse_options
from .prepare import Prepared, prepare
from .quantized import for_target
from .targets import DevicePlan, check_target, plan_devices, target_names

if TYPE_CHECKING:  # pragma: no cover
    from sdrt.cache import Entry
    from sdrt.graph import Graph
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.trt")

PLUGIN_VERSION = "0.1.0"
ENGINE_FORMAT = 1  # bump to orphan every older cache entry and refuse older engine files
#: the file of a compile cache entry: the engine as TensorRT-RTX serialized it
ENGINE = "engine.bin"


@dataclass
class _Built:
    """An engine built (or read from an engine file) and what its session needs."""

    graph: Graph
    engine: bytes
    meta: dict[str, Any]
    prepared: Prepared
    device: Device
    arrays: dict[str, np.ndarray]
    rebuild: Any


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
    caches = True
    #: weight-only quantized weights TensorRT-RTX's ONNX parser takes as they are stored (``DequantizeLinear`` on a
    #: constant weight): int8 and fp8 per channel on MatMul, Gemm and Conv; blocked int4 on MatMul and Gemm only (the
    #: parser rejects it on Conv weights). ``sdrt.quantization.for_backend`` dequantizes the rest at load, and
    #: ``quantized.for_target`` what the target cannot hold (int4 below sm80, fp8 below sm89).
    quantized_weights: ClassVar[Mapping[str, frozenset[str]]] = {
        "int8": frozenset({"MatMul", "Gemm", "Conv"}), "float8_e4m3fn": frozenset({"MatMul", "Gemm", "Conv"}),
        "int4": frozenset({"MatMul", "Gemm"})}
    quantized_weights_note: ClassVar[str] = "int4 needs sm80+, fp8 sm89+; older targets get them as float32"

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
        prepared = prepare(for_target(graph, name), weights, opts)
        engine, _ = self._build(prepared, name, refit)
        return enginefile.write_engine(out, self._meta(prepared, name, refit, opts), engine)

    # -- compiling: the hooks of the core's Backend.compile -------------------
    def parse_options(self, options: Mapping[str, Any], device: Device) -> Options:
        opts = parse_options(options)
        target = str(device.properties.get("target", ""))
        if target not in self.targets():
            raise NoDeviceError(f"device {device} has no TensorRT-RTX target (properties: target={target!r})",
                                where="trt.compile", fix="pass one of backend('trt').devices()")
        if opts.precision == "bf16" and not device.properties.get("bf16"):
            raise OptionError(f"{device.name} (compute {device.properties.get('compute_capability')}) has no bf16",
                              where="sdrt.load(..., backend='trt')", fix="use precision='fp16'")
        return opts

    def _prepare(self, graph: Graph, device: Device, opts: Options) -> Graph:
        if opts.engine is not None:  # refuse a missing or corrupt file before any work
            enginefile.read_engine(opts.engine)
        return for_target(graph, str(device.properties["target"]))

    def _compile(self, graph: Graph, arrays: dict[str, np.ndarray], device: Device, opts: Options) -> _Built:
        """Build the engine (or take the engine file's): stored in the compile cache before a session opens it."""
        target = str(device.properties["target"])
        refit = self._refit_mode(opts, gpu_here=True)
        if opts.engine is not None:
            file_meta, engine = enginefile.read_engine(opts.engine)
            if opts.refit == "auto":
                refit = str(file_meta.get("refit", "none"))
            prepared = prepare(graph, None, opts, arrays)
            meta = self._meta(prepared, target, refit, opts)
            self._check_file(opts.engine, file_meta, meta)
        else:
            prepared = prepare(graph, None, opts, arrays)
            meta = self._meta(prepared, target, refit, opts, digests=False)
            engine, _ = self._build(prepared, target, refit)
        return _Built(graph, engine, meta, prepared, device, arrays, self._rebuilder(graph, target, refit, opts))

    def _open(self, compiled: _Built, entry: Entry | None) -> Session:
        from sdrt.cache import CompileCache

        from .session import RuntimeCache, TrtSession

        b = compiled
        return TrtSession(b.graph, b.engine, b.meta, b.prepared, b.device, b.arrays, b.rebuild,
                          RuntimeCache(CompileCache.of(entry), entry.key) if entry is not None else None)

    def _rebuilder(self, graph: Graph, target: str, refit: str, opts: Options) -> Any:
        def rebuild(arrays: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, Any], Prepared]:
            again = prepare(graph, None, opts, arrays)
            blob, _ = self._build(again, target, refit)
            return blob, self._meta(again, target, refit, opts, digests=False), again

        return rebuild

    # -- the compile cache -----------------------------------------------
    def _cache_parts(self, graph: Graph, device: Device, opts: Options) -> list[str] | None:
        if opts.engine is not None:
            return None
        refit = self._refit_mode(opts, gpu_here=True)
        return [f"format={ENGINE_FORMAT}", f"plugin={PLUGIN_VERSION}", f"tensorrt_rtx={trt_version()}",
                f"target={device.properties['target']}", f"options={opts.key(refit)}",
                f"shapes={sorted((str(k), str(v)) for k, v in opts.shapes.items())}"]

    def _weights_in_key(self, opts: Options) -> bool:
        # a refit='full' engine takes any weights of these shapes: its identity does not depend on them
        return self._refit_mode(opts, gpu_here=True) != "full"

    def _cache_meta(self, graph: Graph, device: Device, opts: Options) -> dict[str, Any]:
        return {"target": str(device.properties["target"]), "precision": opts.precision,
                "refit": self._refit_mode(opts, gpu_here=True)}

    def _save(self, compiled: _Built, folder: Path) -> bool:
        (folder / ENGINE).write_bytes(compiled.engine)
        return True

    def _load(self, entry: Entry, graph: Graph, weights: Weights | None, device: Device, opts: Options) -> Session:
        """The engine mapped from the entry (read-only, not read into Python); the weights resolved, since a
        weight-stripped engine is refit with them before it runs."""
        from sdrt import resolve_weights
        from sdrt.cache import CompileCache

        from .session import RuntimeCache, TrtSession

        target, refit = str(device.properties["target"]), self._refit_mode(opts, gpu_here=True)
        arrays = resolve_weights(graph, weights)
        prepared = prepare(graph, None, opts, arrays)
        with open(entry.file(ENGINE), "rb") as f:
            engine = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        log.info("engine cache hit for %s (%s)", graph.name, entry.key[:12])
        try:
            return TrtSession(graph, engine, self._meta(prepared, target, refit, opts, digests=False), prepared,
                              device, arrays, self._rebuilder(graph, target, refit, opts),
                              RuntimeCache(CompileCache.of(entry), entry.key))
        except TrtError as exc:
            if exc.what.startswith("TensorRT-RTX cannot load the engine"):  # another driver or GPU built it
                raise UnusableEntry(exc.what, where=str(entry.path)) from exc
            raise

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
    def _meta(prepared: Prepared, target: str, refit: str, opts: Options, *, digests: bool = True) -> dict[str, Any]:
        """What an engine was built from: enough to check an engine file against a graph (``digests``: with
        the digest of every weight byte, which only engine files need)."""
        g = prepared.graph
        return {
            "format": ENGINE_FORMAT, "plugin": PLUGIN_VERSION, "tensorrt_rtx": trt_version(), "target": target,
            "graph": prepared.graph_digest, "refit": refit, "options": opts.key(refit),
            # a refit='full' engine takes any weights of these shapes: its identity does not depend on them
            "weights": None if refit == "full" or not digests else prepared.weights_digest,
            "model": g.name, "inputs": [str(i) for i in g.inputs], "outputs": [str(o) for o in g.outputs],
        }

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
