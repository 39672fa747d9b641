"""``OpenVINOBackend``: devices from OpenVINO's own list; compiled models kept in the core's compile cache.

What is OpenVINO's own here: converting the graph (``convert``), compiling it,
and the cache entry's content, one file ``model.blob``: what OpenVINO's own model
cache (``CACHE_DIR``) writes while it compiles, streamed to disk (a header line,
then what ``CompiledModel.export_model`` gives). A cache hit maps that file
(copy-on-write, so nothing is read into Python or written back) past the header
and hands the map to ``Core.import_model`` as an ``ov.Tensor``: the pages come
from the page cache, and the weights are neither resolved nor converted until
``update_weights``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sdrt import Backend, Device, Session
from sdrt.errors import BackendUnavailable, UnsupportedGraph, UnusableEntry
from sdrt.precision_default import choose
from sdrt.tensors import NON_TENSOR
from sdrt.weights.pages import release as release_pages
from sdrt.weights.pages import unmapped_bytes

from . import bf16, convert, swap
from .conformance import CONFORMANCE
from .errors import OpenVINOError, first_lines
from .options import Options, parse_options
from .session import OpenVINOSession

if TYPE_CHECKING:  # pragma: no cover
    import openvino as ov

    from sdrt.cache import Entry
    from sdrt.graph import Graph
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.openvino")

PLUGIN_VERSION = "0.1.0"
CACHE_FORMAT = "8"  # bump to orphan every older cache entry (6: OpenVINO's CACHE_DIR blob, with its header;
#                    7: bf16/fp16 compiles hold float16 weights, convert.half_weights; 8: bf16 ones hold the
#                    bf16 weights their compile rounds, bf16.twin)
#: the file of a cache entry: the compiled model as OpenVINO's ``CACHE_DIR`` writes it (``blob_offset``: where
#: the model starts past its header line), or as ``CompiledModel.export_model`` gives it (no header)
BLOB = "model.blob"
_HEADER_MAX = 4096

#: runtime layers whose compiled blob does not survive export + import on OpenVINO's CPU plugin:
#: a model holding one is compiled every time instead of cached. Measured by running the ONNX
#: conformance suite twice over one cache: only RotaryEmbedding (-> RoPE) failed from the cache.
UNCACHEABLE_LAYERS = {"RoPE": "OpenVINO's CPU blob loses the RoPE layer's settings on import"}
#: numpy (ml_dtypes) dtypes that OpenVINO packs two to a byte: no tensor can carry them in or out
_PACKED_DTYPES = {"int4", "uint4", "float4_e2m1fn", "int2", "uint2"}
_KIND_ORDER = {"gpu": 0, "cpu": 1, "npu": 2, "auto": 3}


#: float32 weights held in memory up to this size are copied to float16 anyway: a few MB more at the peak
_HALF_COPY_SMALL = 64 << 20


def _halving_frees(arrays: Mapping[str, Any]) -> bool:
    """Whether a float16 copy of the weights (``convert.half_weights``) lowers the peak: the float32 pages it read
    are file mappings that ``release_pages`` hands back. Weights converted while binding (a float16 checkpoint on
    the float32 shipped graphs) live in the process's own memory: there the copy would add half their size on top
    (SDXL's 1024x1024 runs under ``--memory 6GB`` passed the budget by 1.2 GiB), so they compile as they are."""
    held = [a for a in arrays.values() if getattr(a, "dtype", None) == np.float32]
    return unmapped_bytes(held) <= max(sum(int(a.nbytes) for a in held) // 4, _HALF_COPY_SMALL)


def _sixteen_bit(opts: Options, arrays: Mapping[str, Any], device: Device,
                 stored_as_compiled: bool = False) -> str | None:
    """Which 16-bit copy of the weights a compile binds, where the copy frees (``_halving_frees``): ``"f16"``
    (``convert.half_weights``) for an fp16 compile; ``"bf16"`` (``bf16.twin``) for a bf16 compile whose blob
    OpenVINO writes as it compiles (``CACHE_DIR``), so that the entry holds bf16 weights, not float32 ones, on
    a device that runs bf16 (elsewhere OpenVINO computes in float32, with the float32 weights). Any other bf16
    compile binds the float32 weights, which it rounds to the same bf16 values itself, faster (a store after
    the job writes the entry from the twin, ``_save``). None: the weights as they are."""
    if not _halving_frees(arrays):
        return None
    if opts.precision == "f16":
        return "f16"
    native = "BF16" in {str(c).upper() for c in device.properties.get("capabilities", ())}
    return "bf16" if opts.precision == "bf16" and stored_as_compiled and native else None


def _bind_sixteen_bit(model: ov.Model, kind: str | None, release: Callable[[], Any]) -> ov.Model:
    """``model`` with the weights ``_sixteen_bit`` chose; the float32 pages the copy read leave the resident set
    (``release``) before compiling packs the 16-bit ones."""
    if kind is None:
        return model
    model = convert.half_weights(model) if kind == "f16" else bf16.twin(model, release)
    release()
    return model


def _properties(opts: Options, device: Device) -> dict[str, Any]:
    """OpenVINO's properties for a compile, a cache hit's import and a swap alike: the options', and at float32 on
    the CPU no dynamic int8 quantization of the activations of i8/i4 weights' matmuls (exact, as asked; an import
    without it computed them ~1e-2 off the compile it came from)."""
    props = opts.properties()
    if opts.precision == "f32" and device.id.startswith("CPU"):
        props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
    return props


class _LazyConversion:
    """The ``ov.Model`` of a graph, converted on first use: a cache hit needs none until update_weights."""

    def __init__(self, core: Any, graph: Graph, arrays: Callable[[], Mapping[str, np.ndarray]]) -> None:
        self._args: tuple[Any, Graph, Callable[[], Mapping[str, np.ndarray]]] | None = (core, graph, arrays)
        self._done: convert.Converted | None = None

    def __call__(self) -> convert.Converted:
        if self._done is None:
            assert self._args is not None
            core, graph, arrays = self._args
            self._done = convert.read(core, graph, arrays())
            self._args = None
        return self._done


def _runtime_layers(compiled: Any) -> list[tuple[str, str]]:
    """(layer type, runtime precision) of each layer of ``compiled``'s runtime model; none where the device gives
    no runtime model of layer types (AUTO)."""
    try:
        out = []
        for op in compiled.get_runtime_model().get_ops():
            info = op.get_rt_info()
            out.append((str(info["layerType"].astype(str)),
                        str(info["runtimePrecision"].astype(str)) if "runtimePrecision" in info else ""))
        return out
    except (RuntimeError, KeyError, AttributeError):
        return []


def _uncacheable(layers: list[tuple[str, str]]) -> list[str]:
    """Why a compiled model with these runtime ``layers`` must not be cached (its blob breaks on import), or
    nothing."""
    kinds = {kind for kind, _ in layers}
    return [f"{layer}: {UNCACHEABLE_LAYERS[layer]}" for layer in sorted(kinds & set(UNCACHEABLE_LAYERS))]


def release_read_pages(blob: np.memmap) -> bool:
    """Drop from this process the pages of the blob's map that OpenVINO only read while importing.

    OpenVINO's CPU plugin copies (repacks) nearly every constant at import and reads only a few in
    place from the tensor it was given, so after an import most of the map is resident for nothing
    (full-size UNet: 3.3 of 3.4 GB). ``MADV_DONTNEED`` on a private map whose pages were never written
    only unmaps them: they stay in the page cache and fault back in from the file if read again. Done
    only when ``/proc/self/smaps`` shows no page of the map copied on write (``Anonymous``), since
    dropping a written page would lose the write; True when done.
    """
    import mmap

    advise = getattr(blob._mmap, "madvise", None)  # type: ignore[attr-defined]
    if advise is None or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    start = blob.__array_interface__["data"][0] - int(blob.offset) % mmap.ALLOCATIONGRANULARITY  # the map's start
    end = start + len(blob._mmap)  # type: ignore[attr-defined]
    covered, written, inside = 0, 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and ":" not in head:
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo < end and hi > start
                    covered += (min(hi, end) - max(lo, start)) if inside else 0
                elif inside and line.startswith("Anonymous:"):
                    written += int(line.split()[1])
    except (OSError, ValueError):
        return False
    if covered != end - start or written:
        return False
    advise(mmap.MADV_DONTNEED)
    return True


def blob_offset(path: Path) -> int | None:
    """Where the compiled model starts in a blob file: 0 for what ``export_model`` gives, past the header line
    for what OpenVINO's ``CACHE_DIR`` writes (``<?xml ...?><compiled_blob ... header_size_alignment="0"/>``);
    None for a header this plugin does not know (padded for alignment, say)."""
    size = os.path.getsize(path)
    head = bytes(np.memmap(path, dtype=np.uint8, mode="r", shape=(min(size, _HEADER_MAX),))) if size else b""
    if not head.startswith(b"<?xml"):
        return 0
    end = head.find(b"\n")
    line = head[:end]
    if end < 0 or b"<compiled_blob" not in line or not line.endswith(b"/>"):
        return None
    align = line.split(b'header_size_alignment="', 1)
    if len(align) == 2 and not align[1].startswith(b'0"'):
        return None
    return end + 1


def _kind(device_id: str) -> str:
    head = device_id.split(".")[0].upper()
    return {"CPU": "cpu", "GPU": "gpu", "NPU": "npu"}.get(head, "gpu")


#: the one ``openvino.Core`` of this process (``shared_core``), kept until the interpreter exits
_CORE: Any = None
_CORE_LOCK = threading.Lock()


def shared_core() -> ov.Core:
    """The process's one ``openvino.Core``, made on first use and kept until exit: every backend instance (a
    registry reset, another registry, a serve worker's) compiles through it.

    Why one: OpenVINO's CPU plugin (2026.4) gives the thread that compiles through a Core an alternate signal
    stack of its own (``sigaltstack``); that Core's destruction unmaps it and puts back the stack that was in
    place when it was installed. Two Cores that die in the order they were made (not nested) so leave the
    thread on the unmapped stack of the first: the next signal handled on the alternate stack (Python's SIGINT
    handler, faulthandler's SIGSEGV) cannot be delivered, and the kernel kills the process with SIGSEGV (rc
    139), no traceback. One pytest process over many registries died that way at its first Ctrl-C test
    (``scripts/ov_altstack_crash.py`` shows it with OpenVINO alone). A Core that outlives every later one keeps
    the order nested."""
    global _CORE
    with _CORE_LOCK:
        try:
            import openvino as ov  # each time: a module gone since (uninstalled, blocked) is still refused

            if _CORE is None:
                _CORE = ov.Core()
        except (ImportError, RuntimeError) as exc:
            raise BackendUnavailable(f"OpenVINO cannot start: {first_lines(exc)}", where="openvino.Core()",
                                     fix="pip install --force-reinstall openvino") from exc
        return _CORE


class OpenVINOBackend(Backend):
    name = "openvino"
    api_version = (1, 1)
    priority = 50  # above the reference backend (0)
    #: stored weight types kept compressed: the ONNX reader turns DequantizeLinear into OpenVINO's
    #: decompression pattern (Convert, Multiply) and the CPU plugin keeps i8/i4/f8 constants in the runtime model
    quantized_weights = frozenset({"int8", "int4", "float8_e4m3fn"})
    #: the inference precision hint is the activations' type too (the memory plan counts them at 2 bytes)
    half_activations = frozenset({"bf16", "fp16"})
    conformance: ClassVar[Mapping[str, Any]] = CONFORMANCE
    precisions: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "fp32": {"precision": "fp32"}, "fp16": {"precision": "fp16"}, "bf16": {"precision": "bf16"}}
    #: onnxruntime contrib ops OpenVINO runs as they are: none. Its ONNX frontend converts MultiHeadAttention,
    #: Attention, GroupNorm, Gelu, BiasGelu and SkipLayerNormalization (right: the tiny optimized folders give the
    #: unoptimized images) but not BiasAdd, BiasSplitGelu, NhwcConv or SkipGroupNorm, and its QuickGelu fails on
    #: float16; with those six kept, the ORT-optimized SD 1.5 ran 2.30 s per 512x512 step, rewritten 2.13 s
    #: (unoptimized: 2.12 s; 2-core EPYC), so the core rewrites them all (sdrt.graph.contrib)
    contrib_ops: ClassVar[frozenset[str]] = frozenset()
    caches = True
    stores_in_background = True  # _open needs no entry: a large blob is checksummed and synced in a thread
    #: compile_model releases the GIL and leaves part of a 2-core machine idle (the full-size SD 1.5 UNet, quiet: 3.7-3.9
    #: s of CPU in 2.4-2.5 s), and this backend keeps its per-compile state per thread (_local)
    compiles_beside = True
    #: a part whose LoRAs are active at its first compile compiles the merged weights in the swappable form at once,
    #: the program its first update_weights makes (swap.py); compiling the base first kept both resident (a full-size
    #: SD 1.5 single file with a LoRA: 9.8 GB peak against 3.9 GB without one)
    rebind_options = {"swappable": True}

    def __init__(self) -> None:
        self._core: ov.Core | None = None
        self._devices: list[Device] | None = None
        self._lock = threading.Lock()
        #: per thread: the cache folder where a compile that will be stored stages OpenVINO's own blob
        self._local = threading.local()

    # -- OpenVINO ------------------------------------------------------
    @property
    def core(self) -> ov.Core:
        with self._lock:
            if self._core is None:
                self._core = shared_core()
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

    # -- compiling: the hooks of the core's Backend.compile -------------------
    def compile(self, graph: Graph, weights: Weights | None, device: Device, **options: Any) -> Session:
        """The core's template; a compile that the cache will store has OpenVINO write its blob straight to a
        file while it compiles (``CACHE_DIR``), instead of ``export_model`` giving the whole blob in memory."""
        from sdrt.cache import deferred

        cache, rest = self._cache_options(options)
        later = deferred.holding() and self._defers_store(self.parse_options(rest, device))
        self._local.staging = cache.dir if cache is not None and not later else None
        self._local.cache = cache  # where the session keeps its swappable form (_swap_store)
        try:
            return super().compile(graph, weights, device, **options)
        finally:
            self._local.staging = self._local.cache = None

    def parse_options(self, options: Mapping[str, Any], device: Device) -> Options:
        return parse_options(options, default=self.precision_for(device))

    def _prepare(self, graph: Graph, device: Device, opts: Options) -> Graph:
        self._check_inputs(graph)
        return graph

    def _compile(self, graph: Graph, arrays: dict[str, np.ndarray], device: Device, opts: Options) -> Session:
        core = self.core
        props = _properties(opts, device)
        lazy = _LazyConversion(core, graph, lambda: arrays)
        staged = self._staging(device, opts)

        def release() -> None:
            release_pages(arrays.values())
            done = getattr(lazy, "_done", None)
            release_pages(done.maps if done else [])

        def compile_(model: ov.Model | None = None, first: bool = False) -> Any:
            model = model if model is not None else lazy().model  # converting raises UnsupportedGraph first
            # 16-bit weights where they halve the blob OpenVINO writes now (a faster import) or compute the same
            kind = _sixteen_bit(opts, arrays, device, first and staged is not None)
            model = _bind_sixteen_bit(model, kind, release)
            try:  # the first compile of a model the cache stores: OpenVINO writes the blob to the staged folder
                return core.compile_model(model, device.id, {**props, "CACHE_DIR": str(staged)} if first and staged
                                          else props)
            except RuntimeError as exc:
                if staged is not None:
                    shutil.rmtree(staged, ignore_errors=True)
                raise self._compile_error(exc, graph, device, opts) from exc

        rebinder = None
        if opts.swappable is True:  # the form a swap imports, its weightless blob kept apart from the weights
            lazy()  # converting raises UnsupportedGraph first
            try:
                compiled, rebinder, views, stored = swap.obtain(core, graph, arrays, device.id, props,
                                                                self._swap_store(graph, device, opts))
                arrays = {**arrays, **views}  # held once: OpenVINO keeps the weights file's mapping
                log.info("%s: compiled in the swappable form (%s)", graph.name,
                         "weightless import from the compile cache" if stored else "compiled to a weightless blob")
            except swap.NotSwappable as exc:
                log.info("%s: not compiled swappable (%s)", graph.name, exc)
                compiled = compile_()
            except RuntimeError as exc:
                raise self._compile_error(exc, graph, device, opts) from exc
        else:
            compiled = compile_(first=True)
        session = self._session(graph, arrays, lazy, compiled, compile_, device, opts, rebinder)
        session.staged = staged
        return session

    def _staging(self, device: Device, opts: Options) -> Path | None:
        """A fresh folder in the compile cache for OpenVINO to write the blob of a compile the cache will store
        (``_save`` moves it into the entry, ``_open`` removes what is left), or None: other devices than the CPU
        (AUTO may write a blob per device it compiles for) keep ``export_model``."""
        folder = getattr(self._local, "staging", None)
        if folder is None or opts.swappable is True or not device.id.startswith("CPU"):  # the tested path
            return None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=".openvino-", suffix=".tmp", dir=folder))  # swept if left behind
        except OSError as exc:  # a cache that cannot be written costs the cache, not the compile
            log.debug("cannot stage a blob in %s: %s", folder, exc)
            return None

    def _session(self, graph: Graph, arrays: Any, lazy: Any, compiled: Any, compile_: Any, device: Device,
                 opts: Options, rebinder: swap.Rebinder | None = None) -> OpenVINOSession:
        self._check_precision(compiled, opts, device)
        core = self.core
        # the compiled model holds its own (packed) weights: the pages of the file-mapped arrays that compiling
        # read leave this process's resident set (the session keeps the arrays; a later read maps them again)
        if isinstance(arrays, dict):  # a cache hit resolves them only when first needed
            release_pages(arrays.values())
        converted = getattr(lazy, "_done", None)  # the constants' copy-on-write maps of the same files
        if converted is not None:
            release_pages(converted.maps)
        swappable = opts.swappable is not False
        return OpenVINOSession(graph, arrays, lazy, compiled, compile_, lambda a: convert.read(core, graph, a),
                               device.id, core=core if swappable else None, props=_properties(opts, device),
                               rebinder=rebinder, store=self._swap_store(graph, device, opts) if swappable else None)

    def _swap_store(self, graph: Graph, device: Device, opts: Options) -> swap.Store | None:
        """Where the swappable form of ``graph`` is kept across processes: the compile cache this compile uses
        (none with ``cache=False``), under a key of the graph without its weights' values (``swap.Store``)."""
        from sdrt.cache import make_key

        cache = getattr(self._local, "cache", None)
        if cache is None or not device.id.startswith(swap.SUPPORTED_DEVICES):
            return None
        parts = [device.id, device.name, str(device.properties.get("architecture", "")), self.version(),
                 PLUGIN_VERSION, "swappable", swap.FORMAT]
        shape_key: list[str] = []

        def key_of(props: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> str:
            if not shape_key:  # the graph and its initializers' names, dtypes and shapes: once per session
                shape_key.append(self.cache_key(graph, None, parts, with_weights=False))
            return make_key([shape_key[0], repr(sorted((str(k), str(v)) for k, v in props.items())),
                             swap.key_values(arrays)])

        return swap.Store(cache, key_of, {"model": graph.label, "device": device.id,
                                          **self._cache_meta(graph, device, opts)})

    # -- the compile cache -----------------------------------------------
    def _cache_parts(self, graph: Graph, device: Device, opts: Options) -> list[str] | None:
        if opts.swappable is True:
            return None
        return [device.id, device.name, str(device.properties.get("architecture", "")), self.version(),
                PLUGIN_VERSION, CACHE_FORMAT, opts.key()]

    def _cache_meta(self, graph: Graph, device: Device, opts: Options) -> dict[str, Any]:
        from .options import PRECISIONS

        return {"precision": {hint: name for name, hint in PRECISIONS.items()}[opts.precision],
                "openvino": self.version()}

    def _save(self, session: Session, folder: Path) -> bool:
        compiled = session.compiled  # type: ignore[attr-defined]
        layers = _runtime_layers(compiled)
        why = _uncacheable(layers)
        if why:
            log.info("not caching: %s", "; ".join(why))
            return False
        staged = getattr(session, "staged", None)
        blobs = sorted(staged.glob("*.blob")) if staged is not None else []
        if len(blobs) == 1 and blob_offset(blobs[0]) is not None:  # written by OpenVINO while it compiled
            os.replace(blobs[0], folder / BLOB)
            return True
        twin_of = getattr(session, "twin_of", None)
        if twin_of is not None and bf16.runs_weights_in_bf16(layers):
            return self._save_twin(twin_of, folder)
        stream = compiled.export_model()  # the whole blob in memory: only when OpenVINO wrote none we can read
        with open(folder / BLOB, "wb") as f:
            f.write(stream.getbuffer())  # the export's own buffer, not a copy of it
        return True

    def _defers_store(self, opts: Options) -> bool:
        """Inside a pipeline's job (``sdrt.cache.deferred.hold``) a bf16/fp16 compile does not have OpenVINO write
        its blob while it compiles (``CACHE_DIR``: 4.3 s more on the full-size UNet); ``export_model`` writes it
        after the job. Only a bf16/fp16 compile's: its blob holds float16 weights, and ``export_model``
        holds the whole blob in memory while it writes. A float32 blob is the model's full size (the full-size
        UNet's store after the job peaked at 11.98 GiB against 7.06 GiB for its compile, GenAI 9.53 GiB), so a
        float32 compile streams it to disk as it compiles (``CACHE_DIR``)."""
        return opts.precision in convert.HALF_PRECISIONS

    def _save_later(self, compiled: Any) -> Any:
        """The compiled model as it is now: ``update_weights`` (a LoRA) compiles a new one into the session, whose
        blob must not be stored under the original weights' key. A bf16 compile from float32 weights also keeps a
        copy of its model's graph (``twin_of``: the constants are shared, not copied; a LoRA replaces them in the
        session's model, not in this copy), from which ``_save`` writes a blob of bf16 weights."""
        from types import SimpleNamespace

        twin_of = None
        conv = getattr(compiled._conversion, "_done", None)  # the model this compile converted, if it did
        if conv is not None and compiled._props.get("INFERENCE_PRECISION_HINT") == "bf16" \
                and compiled._device_id.startswith("CPU"):
            arrays = compiled._arrays
            twin_of = SimpleNamespace(model=conv.model.clone(), device_id=compiled._device_id,
                                      props=dict(compiled._props),
                                      release=lambda: (release_pages(arrays.values()), release_pages(conv.maps)))
        return SimpleNamespace(compiled=compiled.compiled, staged=None, twin_of=twin_of)

    def _save_twin(self, twin_of: Any, folder: Path) -> bool:
        """Write the entry's blob from the bf16 twin of a bf16 compile made from float32 weights that ran every
        convolution and matmul in bf16 (``bf16.runs_weights_in_bf16``): their weights rounded as it rounded them,
        so that the entry is half the size and imports to the same outputs. OpenVINO writes the twin's blob while
        it compiles it (``CACHE_DIR``), not whole in memory. False (nothing stored) where OpenVINO wrote no
        single blob: it gives up a write silently (a full disk), and exporting the float32 model instead would hold
        twice the blob in memory for a write that fails as well (the full-size UNet's store peaked at 11.2 GiB
        that way, against 6.8)."""
        model = bf16.twin(twin_of.model, twin_of.release)
        twin_of.release()  # the float32 pages the rounding read
        staged = Path(tempfile.mkdtemp(prefix=".openvino-twin-", dir=folder))
        try:
            twin = self.core.compile_model(model, twin_of.device_id, {**twin_of.props, "CACHE_DIR": str(staged)})
            del twin, model
            blobs = sorted(staged.glob("*.blob"))
            if len(blobs) != 1 or blob_offset(blobs[0]) is None:  # OpenVINO gives up a failed write in silence:
                # raised, so that the store warns (it was an info line, and the command had said it was writing)
                free = shutil.disk_usage(folder).free
                raise OSError(f"OpenVINO wrote no usable blob ({free / 2**20:.0f} MiB free in {folder.parent}: is "
                              "the disk full?)")
            os.replace(blobs[0], folder / BLOB)
            return True
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _open(self, compiled: Any, entry: Entry | None) -> Session:
        staged = getattr(compiled, "staged", None)
        if staged is not None:  # moved into the entry, or not stored: nothing of it stays
            shutil.rmtree(staged, ignore_errors=True)
            compiled.staged = None
        return compiled

    def _load(self, entry: Entry, graph: Graph, weights: Weights | None, device: Device, opts: Options) -> Session:
        """Import the entry's blob from a copy-on-write map of the file: no read into Python, no copy;
        the weights are resolved only when the session first needs them (``update_weights``)."""
        import openvino as ov

        from sdrt import resolve_weights

        core = self.core
        offset = blob_offset(entry.file(BLOB))
        if offset is None:
            raise UnusableEntry("its blob has a header this plugin does not know")
        blob = np.memmap(entry.file(BLOB), dtype=np.uint8, mode="c", offset=offset)
        compiled = core.import_model(ov.Tensor(blob, shared_memory=True), device.id, _properties(opts, device))
        lazy = _LazyConversion(core, graph, lambda: session._arrays)  # the session's own, resolved once

        def compile_(model: ov.Model | None = None) -> Any:
            model = model if model is not None else lazy().model
            model = _bind_sixteen_bit(model, _sixteen_bit(opts, session._arrays, device), lambda: None)
            try:
                return core.compile_model(model, device.id, _properties(opts, device))
            except RuntimeError as exc:
                raise self._compile_error(exc, graph, device, opts) from exc

        session = self._session(graph, lambda: resolve_weights(graph, weights), lazy, compiled, compile_, device, opts)
        session.blob = blob  # OpenVINO reads some constants from the map for as long as the model lives
        release_read_pages(blob)
        return session

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

    @staticmethod
    def _compile_error(exc: RuntimeError, graph: Graph, device: Device, opts: Options) -> OpenVINOError:
        return OpenVINOError(f"OpenVINO could not compile the model for {device.id}: {first_lines(exc)}",
                             where=f"{graph.name} with {opts.key()}",
                             fix="try device='CPU' or precision='fp32'; run with -vv for OpenVINO's full message")

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
