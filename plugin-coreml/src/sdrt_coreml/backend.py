"""``CoreMLBackend``: Core ML compute units as devices on macOS; lower, convert and cache packages anywhere.

The work is the same for ``compile`` (a session on this Mac) and ``build`` (a
package file for Macs, on any OS):

    graph -> fail early (every unsupported op at once) -> pin shapes -> fold constants
          -> lower to MIL -> coremltools converts (fp16 by default) -> .mlpackage

``compile`` is the core's template (``sdrt.backend``): packages are kept in the
core's compile cache (``sdrt.cache``), one entry holding ``model.mlpackage``;
on a cache hit no lowering happens at all. One package serves every compute
unit, so the compute unit is not part of the key.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdrt import Backend, Device, Session, TensorInfo, resolve_weights
from sdrt.errors import ModelError, NoDeviceError, SdrtError

from . import package
from .errors import CoreMLError, ct, first_line
from .lower import Lowering
from .ops import TABLE
from .options import TARGETS, Options, parse_options

if TYPE_CHECKING:  # pragma: no cover
    from sdrt.cache import Entry
    from sdrt.graph import Graph
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.coreml")

PLUGIN_VERSION = "0.1.0"
CACHE_FORMAT = "2"  # bump to orphan every older cache entry
#: the folder a cache entry (and a private build) holds
PACKAGE = "model.mlpackage"

#: device id -> (Core ML compute unit, kind, description)
COMPUTE_UNITS: dict[str, tuple[str, str, str]] = {
    "ALL": ("ALL", "auto", "Core ML on every compute unit (CPU, GPU and Neural Engine; Core ML splits the graph)"),
    "GPU": ("CPU_AND_GPU", "gpu", "Core ML on the GPU (CPU for what the GPU cannot run)"),
    "ANE": ("CPU_AND_NE", "npu", "Core ML on the Neural Engine (CPU for what it cannot run)"),
    "CPU": ("CPU_ONLY", "cpu", "Core ML on the CPU"),
}


def unavailable_reason() -> str | None:
    """Why this machine has no Core ML device, or None on a Mac where Core ML loads models."""
    if platform.system() != "Darwin":
        return (f"Core ML runs only on macOS (this is {platform.system() or 'an unknown OS'}); "
                "`sdrt compile MODEL --backend coreml -o model.mlpackage` still builds packages for Macs here")
    try:
        from coremltools import libcoremlpython  # noqa: F401 - only present in coremltools' macOS wheels
    except ImportError as exc:
        return f"coremltools cannot load models on this Mac ({first_line(exc)}); pip install --force-reinstall coremltools"
    return None


class CoreMLBackend(Backend):
    name = "coreml"
    api_version = (1, 1)
    priority = 60  # on a Mac the vendor's own runtime beats ggml's Metal path (10)
    conformance: ClassVar[Mapping[str, Any]] = {}
    #: what ``sdrt selftest`` measures: fp16 (Core ML's own compute precision, the default) and fp32
    precisions: ClassVar[Mapping[str, Mapping[str, Any]]] = {"fp16": {"precision": "fp16"},
                                                             "fp32": {"precision": "fp32"}}
    default_precision: ClassVar[str] = "fp16"
    caches = True
    #: quantized weights written as Core ML compressed constants (``lower.compressed``): int8 per channel on every
    #: target, blocked int4 on macOS15/iOS18 targets (older ones get float weights, expanded while lowering); fp8
    #: has no Core ML type and is dequantized at load
    quantized_weights: ClassVar[Mapping[str, frozenset[str]]] = {
        "int8": frozenset({"MatMul", "Gemm", "Conv"}), "int4": frozenset({"MatMul", "Gemm", "Conv"})}
    quantized_weights_note: ClassVar[str] = "int4 on macOS15/iOS18 targets; older targets get it as float"

    # -- devices -------------------------------------------------------
    def devices(self) -> list[Device]:
        reason = unavailable_reason()
        if reason is not None:
            log.info("coreml: no device: %s", reason)
            return []
        chip = platform.processor() or platform.machine()
        return [Device(backend=self.name, id=dev_id, name=desc, kind=kind,
                       properties={"compute_units": unit, "chip": chip})
                for dev_id, (unit, kind, desc) in COMPUTE_UNITS.items()]

    def targets(self) -> list[str]:
        """The deployment targets ``build`` accepts: the oldest OS a package must load on."""
        return list(TARGETS)

    # -- compiling: the hooks of the core's Backend.compile -------------------
    def parse_options(self, options: Any, device: Device) -> Options:
        opts = parse_options(options)
        if device.id not in COMPUTE_UNITS:
            raise NoDeviceError(f"device {device} is not a Core ML compute unit", where="coreml.compile",
                                fix=f"pass one of {', '.join(COMPUTE_UNITS)} (sdrt info lists them)")
        reason = unavailable_reason()
        if reason is not None:
            raise NoDeviceError(f"cannot run Core ML here: {reason}", where="coreml.compile",
                                fix="build a package with `sdrt compile` and run it on a Mac")
        return opts

    def _prepare(self, graph: Graph, device: Device, opts: Options) -> Graph:
        return self._static(graph, opts)

    def _compile(self, graph: Graph, arrays: dict[str, np.ndarray], device: Device, opts: Options) -> Session:
        from .session import CoreMLSession

        tmp = Path(tempfile.mkdtemp(prefix="sdrt-coreml-"))
        try:
            built = self._build(graph, arrays, opts, tmp / PACKAGE)
            return CoreMLSession(graph, built, device, private_dir=tmp, arrays=arrays,
                                 rebuild=lambda a, out: self._build(graph, a, opts, out))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    # -- the compile cache -----------------------------------------------
    def _cache_parts(self, graph: Graph, device: Device, opts: Options) -> list[str] | None:
        return [ct().__version__, PLUGIN_VERSION, CACHE_FORMAT, opts.key()]

    def _cache_meta(self, graph: Graph, device: Device, opts: Options) -> dict[str, Any]:
        return {"precision": opts.precision, "target": opts.target}

    def _save(self, session: Session, folder: Path) -> bool:
        shutil.copytree(session._built.path, folder / PACKAGE)  # type: ignore[attr-defined]
        return True

    def _load(self, entry: Entry, graph: Graph, weights: Weights | None, device: Device, opts: Options) -> Session:
        from .session import CoreMLSession

        return CoreMLSession(graph, package.load(entry.file(PACKAGE)), device, private_dir=None,
                             arrays=resolve_weights(graph, weights),
                             rebuild=lambda a, out: self._build(graph, a, opts, out))

    def build(self, graph: Graph, weights: Weights | None, target: str | None, path: str | os.PathLike[str],
              **options: Any) -> Path:
        """Ahead of time, on any OS: write ``path`` (a ``.mlpackage`` folder) for ``target``
        (one of ``targets()``; None: macOS14, or this Mac's own version)."""
        opts = parse_options({**options, "target": target or options.get("target")},
                             where="sdrt compile --backend coreml")
        out = Path(path)
        if out.suffix != ".mlpackage":
            raise SdrtError(f"output {out.name!r} does not end in .mlpackage", where=str(out),
                            fix="name the output MODEL.mlpackage (Core ML packages are folders with that suffix)")
        if out.exists():
            raise SdrtError("the output already exists", where=str(out), fix="remove it or pick another name")
        static = self._static(graph, opts)
        arrays = resolve_weights(static, weights)
        tmp = out.with_name(f".{out.stem}.tmp.mlpackage")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            self._build(static, arrays, opts, tmp)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out

    # -- the shared work -------------------------------------------------
    def _static(self, graph: Graph, opts: Options) -> Graph:
        """Fail early on unsupported ops, then pin shapes and fold constants."""
        TABLE.check_graph(graph.model.graph.node, graph.name, "the coreml backend cannot lower this graph to a Core ML "
                          "program", "openvino, ggml, reference")
        static = graph.with_shapes(dict(opts.shapes)) if opts.shapes else graph
        for info in static.inputs:
            if not info.is_static:
                raise ModelError(
                    f"input {info} has dynamic dimensions; Core ML packages are built for static shapes",
                    where=graph.name,
                    fix=f"pass shapes={{'{info.name}': (...)}} (or a dim name: shapes={{'batch': 1}})",
                )
        if not opts.shapes:
            static = static.with_shapes()
        return static.fold_constants()

    def _build(self, graph: Graph, arrays: Mapping[str, np.ndarray], opts: Options, out: Path) -> package.Built:
        import time

        ct()  # BackendUnavailable before any work if coremltools is missing
        t0 = time.perf_counter()
        lowered = Lowering(graph.model, arrays, graph.inputs, opset_mil=opts.opset, sdpa=opts.sdpa,
                           fp16=opts.precision == "fp16").lower()
        t1 = time.perf_counter()
        try:
            built = package.build(lowered, arrays, graph.inputs, _outputs(graph), opts, out, graph.name)
        except OSError as exc:
            raise CoreMLError(f"cannot write the package: {exc}", where=str(out),
                              fix="check the folder is writable and has space") from exc
        built.seconds["lower"] = t1 - t0
        return built


def _outputs(graph: Graph) -> list[TensorInfo]:
    """The outputs with the shapes inference found (a pinned graph may still declare symbolic dims)."""
    vi = graph.value_infos()
    return [vi.get(o.name, o) for o in graph.outputs]
