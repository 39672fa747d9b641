"""``OpenVINOBackend``: devices from OpenVINO's own list, compile through the compiled-model cache."""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdrt import Backend, Device, Session, resolve_weights
from sdrt.errors import BackendUnavailable, NoDeviceError, UnsupportedGraph
from sdrt.precision_default import choose
from sdrt.tensors import NON_TENSOR
from sdrt.weights.pages import release as release_pages

from . import cache as cache_mod
from . import convert, swap
from .conformance import CONFORMANCE
from .errors import OpenVINOError, first_lines
from .options import PRECISIONS, Options, parse_options
from .session import OpenVINOSession

if TYPE_CHECKING:  # pragma: no cover
    import openvino as ov

    from sdrt.graph import Graph
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.openvino")

PLUGIN_VERSION = "0.1.0"
CACHE_FORMAT = "2"  # bump to orphan every older cache entry

#: runtime layers whose compiled blob does not survive export + import on OpenVINO's CPU plugin:
#: a model holding one is compiled every time instead of cached. Measured by running the ONNX
#: conformance suite twice over one cache: only RotaryEmbedding (-> RoPE) failed from the cache.
UNCACHEABLE_LAYERS = {"RoPE": "OpenVINO's CPU blob loses the RoPE layer's settings on import"}
#: numpy (ml_dtypes) dtypes that OpenVINO packs two to a byte: no tensor can carry them in or out
_PACKED_DTYPES = {"int4", "uint4", "float4_e2m1fn", "int2", "uint2"}
_KIND_ORDER = {"gpu": 0, "cpu": 1, "npu": 2, "auto": 3}


class _LazyConversion:
    """The ``ov.Model`` of a graph, converted on first use: a cache hit needs none until update_weights."""

    def __init__(self, core: Any, graph: Graph, arrays: Mapping[str, np.ndarray]) -> None:
        self._args: tuple[Any, Graph, Mapping[str, np.ndarray]] | None = (core, graph, arrays)
        self._done: convert.Converted | None = None

    def __call__(self) -> convert.Converted:
        if self._done is None:
            assert self._args is not None
            self._done = convert.read(*self._args)
            self._args = None
        return self._done


def _sample(arr: np.ndarray, chunk: int = 256, count: int = 16) -> bytes:
    """The first, last and ``count`` evenly spaced ``chunk``-byte pieces of an array's bytes."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    n = flat.size
    if n <= chunk * (count + 2):
        return flat.tobytes()
    starts = [0, n - chunk] + [int(i * (n - chunk) / count) for i in range(1, count)]
    return b"".join(flat[s:s + chunk].tobytes() for s in starts)


def _weight_files(graph: Graph, weights: Weights | None, arrays: Mapping[str, np.ndarray]) -> dict[str, str]:
    """``{initializer name: identity of the file it is read from}`` for weights that come from files."""
    stats: dict[str, str] = {}

    def identity(path: str, where: str) -> str | None:
        if path not in stats:
            try:
                st = os.stat(path)
            except OSError:
                return None
            stats[path] = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
        return f"{stats[path]}|{where}"

    out: dict[str, str] = {}
    own = {t.name: t for t in graph.model.graph.initializer}
    for name in arrays:
        ident = None
        if weights is not None and name in weights:
            ref = weights.ref(name)
            if weights.dtype is None and os.path.isfile(ref.source):
                ident = identity(ref.source, name)
        elif name in own and graph.base_dir is not None:
            info = {e.key: e.value for e in own[name].external_data}
            if "location" in info:
                ident = identity(str(graph.base_dir / info["location"]),
                                 f"{info.get('offset', 0)}+{info.get('length', '')}")
        if ident is not None:
            out[name] = ident
    return out


def _export(compiled: Any) -> bytes:
    """The compiled model as a blob, or an error for models that must not be cached."""
    try:
        layers = {str(op.get_rt_info()["layerType"].astype(str)) for op in compiled.get_runtime_model().get_ops()}
    except (RuntimeError, KeyError):  # devices without a runtime model of layer types (AUTO)
        layers = set()
    bad = sorted(layers & set(UNCACHEABLE_LAYERS))
    if bad:
        raise RuntimeError("; ".join(f"{layer}: {UNCACHEABLE_LAYERS[layer]}" for layer in bad))
    return bytes(compiled.export_model().getvalue())


def _kind(device_id: str) -> str:
    head = device_id.split(".")[0].upper()
    return {"CPU": "cpu", "GPU": "gpu", "NPU": "npu"}.get(head, "gpu")


class OpenVINOBackend(Backend):
    name = "openvino"
    api_version = (1, 0)
    priority = 50  # above the reference backend (0)
    conformance: ClassVar[Mapping[str, Any]] = CONFORMANCE
    precisions: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "fp32": {"precision": "f32"}, "fp16": {"precision": "f16"}, "bf16": {"precision": "bf16"}}

    def __init__(self) -> None:
        self._core: ov.Core | None = None
        self._devices: list[Device] | None = None
        self._lock = threading.Lock()

    # -- OpenVINO ------------------------------------------------------
    @property
    def core(self) -> ov.Core:
        with self._lock:
            if self._core is None:
                try:
                    import openvino as ov

                    self._core = ov.Core()
                except (ImportError, RuntimeError) as exc:
                    raise BackendUnavailable(f"OpenVINO cannot start: {first_lines(exc)}", where="openvino.Core()",
                                             fix="pip install --force-reinstall openvino") from exc
            return self._core

    @staticmethod
    def version() -> str:
        import openvino as ov

        return str(ov.get_version())

    # -- devices -------------------------------------------------------
    def devices(self) -> list[Device]:
        """OpenVINO's devices (GPUs first, then CPU, then NPU), then AUTO over all of them."""
        if self._devices is None:
            core = self.core
            try:
                available = list(core.available_devices)
            except RuntimeError as exc:
                raise BackendUnavailable(f"OpenVINO cannot list its devices: {first_lines(exc)}",
                                         where="openvino.Core().available_devices",
                                         fix="check the GPU/NPU drivers, or reinstall openvino") from exc
            found = []
            for dev_id in available:
                try:
                    found.append(self._describe(core, dev_id))
                except RuntimeError as exc:  # a device whose driver fails to answer is left out, and logged
                    log.warning("OpenVINO device %s does not answer: %s", dev_id, first_lines(exc))
            found.sort(key=lambda d: (_KIND_ORDER[d.kind], d.properties.get("device_type") != "discrete", d.id))
            if found:  # AUTO runs on the first of them first: its default precision
                found.append(Device(backend=self.name, id="AUTO", kind="auto",
                                    name=f"OpenVINO AUTO over {', '.join(d.id for d in found)}",
                                    properties={"devices": [d.id for d in found],
                                                "precision": found[0].properties["precision"]}))
            self._devices = found
        return list(self._devices)

    def _describe(self, core: ov.Core, dev_id: str) -> Device:
        def prop(name: str, default: Any = None) -> Any:
            try:
                return core.get_property(dev_id, name)
            except RuntimeError:
                return default

        kind = _kind(dev_id)
        props = {
            "device_type": str(prop("DEVICE_TYPE", "")).lower().split(".")[-1],
            "architecture": str(prop("DEVICE_ARCHITECTURE", "")),
            "capabilities": [str(c) for c in prop("OPTIMIZATION_CAPABILITIES", [])],
            "default_precision": str(prop("INFERENCE_PRECISION_HINT", "")),
        }
        # sdrt's default: the fastest precision within the image bar (sdrt.precision_default). OpenVINO's
        # capabilities say what it runs natively: BF16 on a CPU with AVX-512-BF16 or AMX, FP16 on a GPU.
        caps = {c.upper() for c in props["capabilities"]}
        offered = ["fp32"] + [p for p, cap in (("fp16", "FP16"), ("bf16", "BF16")) if cap in caps or kind != "cpu"]
        props["precision"] = choose(kind, offered, bf16_fast="BF16" in caps)
        memory = prop("GPU_DEVICE_TOTAL_MEM_SIZE") if kind == "gpu" else None
        return Device(backend=self.name, id=dev_id, name=str(prop("FULL_DEVICE_NAME", dev_id)), kind=kind,
                      memory_bytes=int(memory) if memory else None, properties=props)

    # -- compiling -----------------------------------------------------
    def compile(self, graph: Graph, weights: Weights | None, device: Device, **options: Any) -> Session:
        opts = parse_options(options, default=PRECISIONS[self.precision_for(device)])
        if device.backend != self.name:
            raise NoDeviceError(f"device {device} belongs to backend {device.backend!r}", where="openvino.compile",
                                fix="pass one of the devices of backend 'openvino'")
        self._check_inputs(graph)
        core = self.core
        arrays = resolve_weights(graph, weights)  # checks the weights before any long work
        props = opts.properties()
        lazy = _LazyConversion(core, graph, arrays)

        def compile_(model: ov.Model | None = None) -> Any:
            model = model if model is not None else lazy().model  # converting raises UnsupportedGraph first
            try:
                return core.compile_model(model, device.id, props)
            except RuntimeError as exc:
                raise self._compile_error(exc, graph, device, opts) from exc

        rebinder = None
        if opts.swappable is True:  # the form a swap imports (no compile cache: its blob needs a weights file)
            lazy()  # converting raises UnsupportedGraph first
            try:
                compiled, rebinder, views = swap.build(core, graph, arrays, device.id, props)
                arrays = {**arrays, **views}  # held once: OpenVINO keeps the weights file's mapping
            except swap.NotSwappable as exc:
                log.info("%s: not compiled swappable (%s)", graph.name, exc)
                compiled = compile_()
            except RuntimeError as exc:
                raise self._compile_error(exc, graph, device, opts) from exc
        elif not opts.cache:
            compiled = compile_()
        else:
            store = cache_mod.CompiledCache(opts.cache_dir / "openvino" if opts.cache_dir else cache_mod.default_dir())
            key = self._cache_key(graph, weights, arrays, device, opts)
            compiled, hit = store.get_or_compile(
                key, load=lambda blob: core.import_model(blob, device.id, props), compile_=compile_,
                export=_export)
            log.info("%s %s on %s (cache %s)", "loaded" if hit else "compiled", graph.name, device.id, key[:12])
        self._check_precision(compiled, opts, device)
        # the compiled model holds its own (packed) weights: the pages of the file-mapped arrays that compiling
        # read leave this process's resident set (the session keeps the arrays; a later read maps them again)
        release_pages(arrays.values())
        return OpenVINOSession(graph, arrays, lazy, compiled, compile_, lambda a: convert.read(core, graph, a),
                               device.id, core=core if opts.swappable is not False else None, props=props,
                               rebinder=rebinder)

    def _check_inputs(self, graph: Graph) -> None:
        """Refuse inputs and outputs that cannot cross OpenVINO's Python API, before any work."""
        odd: dict[str, list[str]] = {}
        for kind, infos in (("input", graph.inputs), ("output", graph.outputs)):
            for info in infos:
                if info.dtype in (NON_TENSOR, "object", "undefined"):
                    odd.setdefault(f"non-tensor {kind}", []).append(info.name)
                elif info.dtype in _PACKED_DTYPES:
                    odd.setdefault(f"{info.dtype} {kind}", []).append(info.name)
        if odd:
            raise UnsupportedGraph("OpenVINO takes and returns only numeric or bool tensors of 8 bits or more",
                                   unsupported=odd, where=graph.name,
                                   fix="use the reference backend for graphs with sequence, string or 4-bit inputs "
                                       "and outputs")

    def _cache_key(self, graph: Graph, weights: Weights | None, arrays: Mapping[str, np.ndarray], device: Device,
                   opts: Options) -> str:
        """SHA-256 over the graph, the weights, the device, the versions and the options.

        A weight read from a file is keyed by that file's identity (path, size, mtime, inode), the
        tensor's name, dtype and shape and a few sampled bytes, so that a cache hit never reads
        gigabytes of weights; a weight held in memory is keyed by all its bytes.
        """
        h = hashlib.sha256()  # the graph without its initializers, then each resolved weight (every initializer)
        h.update(graph.model_without(graph.initializer_names).SerializeToString())
        files = _weight_files(graph, weights, arrays)
        for name in sorted(arrays):
            arr = arrays[name]
            h.update(f"{name}|{arr.dtype.str}|{arr.shape}".encode())
            if name in files:  # the file's identity, plus a few sampled bytes that tell its tensors apart
                h.update(files[name].encode())
                h.update(_sample(arr))
                continue
            arr = np.ascontiguousarray(arr)
            h.update(struct.pack("<Q", arr.nbytes))
            h.update(arr.reshape(-1).view(np.uint8))
        return cache_mod.make_key([
            h.hexdigest(), device.id, device.name, str(device.properties.get("architecture", "")),
            self.version(), PLUGIN_VERSION, CACHE_FORMAT, opts.key(),
        ])

    @staticmethod
    def _compile_error(exc: RuntimeError, graph: Graph, device: Device, opts: Options) -> OpenVINOError:
        return OpenVINOError(f"OpenVINO could not compile the model for {device.id}: {first_lines(exc)}",
                             where=f"{graph.name} with {opts.key()}",
                             fix="try device='CPU' or precision='f32'; run with -vv for OpenVINO's full message")

    @staticmethod
    def _check_precision(compiled: Any, opts: Options, device: Device) -> None:
        try:
            hint = compiled.get_property("INFERENCE_PRECISION_HINT")
            got = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        except RuntimeError:
            return
        if got != opts.precision:
            log.warning("OpenVINO on %s runs precision %s where %s was asked (the device lacks it)",
                        device.id, got, opts.precision)
