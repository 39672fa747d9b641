"""The backend contract. A plugin implements these classes and nothing else.

Data flows one way::

    file -> Graph (+ Weights) -> Backend.compile(graph, weights, device, **options)
         -> Session.run(feeds) -> outputs

The base classes own the shared work, as templates that call a backend's hooks:

- ``Backend.compile`` checks the device, takes the compile cache's options
  (``cache=``, ``cache_dir=``), has the backend check its own options
  (``parse_options``) and the graph (``_prepare``: refuse before any long
  work), makes the cache key from the graph's and the weights' *identity*
  (``sdrt.cache.identity``: where each weight comes from, nothing read) and
  looks it up. On a hit the backend loads the entry (``_load``) and no weight is
  resolved. On a miss it resolves every initializer's final array
  (``resolve_weights``), calls ``_compile(graph, arrays, device, opts)``,
  stores what ``_save`` writes (``sdrt.cache.CompileCache``: atomic,
  checksummed, size-capped, shared by every backend) and returns ``_open``'s
  session.
- ``Session.run`` checks the feeds against ``Session.inputs``, then calls ``_run``.
- ``Session.update_weights`` checks that the session is open, resolves and
  validates the weights against the session's graph (one ``WeightsError``
  listing every problem), then calls ``_update_weights(arrays)``.

A backend writes ``devices``, ``_compile``, ``Session._run`` and, optionally,
``parse_options``, ``_prepare``, ``Session._update_weights``, and for the
compile cache ``_cache_parts``, ``_save`` and ``_load`` (``_open`` when what
``_compile`` returns must be stored before a session opens it).

This module imports neither ``sdrt.graph`` nor the weights store at run time: it
speaks to them through the objects a backend is handed, and through
``sdrt.weights.resolve`` (``resolve_weights``), the one function of the contract.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import InputError, NoDeviceError, SdrtError, UnusableEntry, WeightsError, check_known_options
from .tensors import NON_TENSOR, Dim, TensorInfo, shape_str

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .cache import CompileCache, Entry
    from .graph import Graph
    from .weights import Weights

#: The plugin API this core speaks, as (major, minor). A plugin built for
#: (M, m) is accepted when M equals the core's major and m <= the core's minor.
#: 1.1: ``Backend.compile`` is the core's template (``_compile``, ``parse_options``, ``_prepare``, and the
#: compile cache's ``_cache_parts``/``_save``/``_load``); a 1.0 plugin that overrides ``compile`` still runs.
#: 1.2: ``sdrt.errors.OptionError`` and ``check_known_options`` (a backend's unknown options as ``UnknownOptions``,
#: names attached), and ``Backend.memory_in_use`` (optional: a device's own memory in use).
#: 1.3: ``Session.run(feeds, outputs=[...])`` returns only the outputs named, and ``Session._run_outputs`` (optional)
#: leaves the others uncopied; a session without it runs ``_run`` and drops them.
API_VERSION: tuple[int, int] = (1, 3)


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
    #: ggml block types whose matmul weights ``update_weights`` passes as ``BlockMatrix`` (``Backend.weight_blocks``)
    weight_blocks: frozenset[str] = frozenset()
    #: for a graph sdrt quantized (``sdrt.load(quantize=...)``): makes float weights bound by their float names fit
    #: it, quantized as it holds them (``sdrt.quantization.Requantizer``)
    requantize: Callable[[Weights], Weights] | None = None

    def __init__(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], *,
                 graph: Graph | None = None) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.graph = graph
        self._closed = False
        #: initializer name -> (file, version) its array maps (``sdrt.stamps``), for those that map a file
        self._watched: dict[str, tuple[str, Any]] = {}

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self, where: str) -> None:
        if self._closed:
            raise SdrtError("this session is closed", where=f"{type(self).__name__}.{where}",
                            fix="compile the graph again with sdrt.load")

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` maps every input name to an array of the declared dtype and shape.

        ``outputs``: the names of the outputs to return, in that order (onnxruntime's ``output_names``); None: all
        of them. The graph runs whole either way; a backend whose session writes ``_run_outputs`` leaves the others
        uncopied (a reference unit's read call skips the hundreds of MiB of banks its write pass needs)."""
        self._check_open("run")
        arrays = check_feeds(self.inputs, feeds)
        names = None if outputs is None else check_outputs(self.outputs, outputs)
        self.check_files()
        if names is None:
            return self._run(arrays)
        return self._run_outputs(arrays, names)

    def watch_weights(self, arrays: Mapping[str, Any]) -> None:
        """Note the file versions the mapped arrays among ``arrays`` (initializer name -> array, as compiled or
        rebound; names not given keep theirs) read: ``run`` and ``update_weights`` check them first, so a session
        never reads the mapping of a file replaced or written again since (new bytes at old offsets, or SIGBUS past
        the end of a file that shrank) and raises ``FileChanged`` instead. Backends whose sessions keep file-mapped
        arrays to read later (weights shared with the device runtime, arrays compared on a rebind) call it; the
        base ``Backend.compile`` does for the arrays it resolves."""
        from .stamps import mapped_files

        watched = getattr(self, "_watched", {})
        for name, arr in arrays.items():
            files = mapped_files([arr])
            if files:
                watched[name] = next(iter(files.items()))
            else:
                watched.pop(name, None)
        self._watched = watched

    def check_files(self) -> None:
        """``FileChanged`` when a file this session's weights map is another version now (``watch_weights``)."""
        watched = getattr(self, "_watched", None)
        if watched:
            from .stamps import check_files

            check_files(dict(watched.values()), "since this session's weights were bound")

    @abstractmethod
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the compiled graph on feeds that ``run`` has already checked."""
        raise NotImplementedError(f"{type(self).__name__} must implement _run")

    def _run_outputs(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """Run on checked feeds and return only ``names`` (declared outputs, checked, in that order). Override to
        leave the other outputs uncopied; by default ``_run`` makes them all and the others are dropped."""
        got = self._run(feeds)
        return {name: got[name] for name in names}

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
        from .weights.resolve import as_arrays
        from .weights.resolve import bind as bind_weights

        self.check_files()  # a backend compares the new arrays with the mapped ones it holds: never on a changed file
        if self.requantize is not None:
            weights = self.requantize(weights)
        arrays = as_arrays(bind_weights(weights, self.graph, self.weight_blocks))
        self._update_weights(arrays)
        self.watch_weights(arrays)

    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """Swap in new initializer values, checked by ``update_weights``. Override to support it."""
        raise SdrtError(
            f"{type(self).__name__} cannot update weights in place",
            where="Session.update_weights",
            fix="compile again with sdrt.load(model, weights=...)",
        )

    def release_scratch(self) -> None:  # noqa: B027 - optional: a backend that keeps no working memory has none to give
        """Hand back the working memory a run uses that the runtime keeps between calls (its intermediate
        buffers); the next run allocates it again. A pipeline calls it on its denoiser before decoding. A no-op
        where the backend keeps none or cannot; never while the session runs."""

    def close(self) -> None:
        """Free what the session holds (device memory). Safe to call twice."""
        self._closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _watching(session: Session, arrays: Mapping[str, Any]) -> Session:
    """``session``, noting the file versions its mapped ``arrays`` read (``Session.watch_weights``)."""
    if isinstance(session, Session) and not getattr(session, "_watched", None):
        session.watch_weights(arrays)
    return session


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
    #: e.g. ``{"fp32": {"precision": "fp32"}, "bf16": {"precision": "bf16"}}``; ``sdrt selftest``
    #: measures accuracy at ``fp32`` and at ``default_precision`` (what no options give)
    precisions: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    default_precision: ClassVar[str] = "fp32"
    #: precisions at which the backend keeps activations in 16 bits (the memory plan halves their bytes there)
    half_activations: ClassVar[frozenset[str]] = frozenset()

    def weight_blocks(self) -> frozenset[str]:
        """The ggml block types (a GGUF file's ``"Q8_0"``, ``"Q4_K"``...) this backend runs as stored when they are
        matmul weights: ``compile`` then passes such weights as ``sdrt.weights.blocks.BlockMatrix`` in ``arrays``
        (``np.asarray`` of one gives its float32 values). Default: none, every tensor arrives as float32."""
        return frozenset()

    def precision_for(self, device: Device) -> str:
        """The precision ``compile`` uses on ``device`` when no ``precision=`` is passed (``sdrt info`` shows it).

        By default the device's ``properties["precision"]`` when the backend put one there (see
        ``sdrt.precision_default``: the fastest precision within the image bar against float32), else
        ``default_precision``; ``SDRT_PRECISION`` replaces either when the backend offers it."""
        from .precision_default import override

        forced = override(self.precisions or {"fp32": {}})
        return forced or str(device.properties.get("precision") or self.default_precision)

    def plain_conv_pixels(self, device: Device, precision: str) -> int:
        """For the cost model (``sdrt.cost.model.Factors.plain_conv_pixels``): a dense conv wider than 1x1 that writes
        at most this many output pixels an image keeps its kernel as stored on ``device`` at ``precision``, where a
        larger one may hold it transformed (ggml's Winograd kernels, 16/9 of a 3x3 kernel). Default 0: the calibration
        fits every such kernel with one factor."""
        return 0

    @abstractmethod
    def devices(self) -> list[Device]:
        """What this backend can run on, here and now. An empty list means: nothing."""

    def memory_in_use(self, device: Device) -> int | None:
        """Bytes of ``device``'s own memory in use now (its total less its free, whoever holds it), for the
        measurements of a device whose memory is not this process's resident memory (a GPU's): the cost model's
        calibration reads it before and after compiling and running a part. None where the backend cannot
        tell, and for a CPU (whose memory the process's resident size measures)."""
        return None

    #: onnxruntime contrib ops (``"com.microsoft.GroupNorm"``...) that this backend runs as they are; ``compile``
    #: rewrites every other one that ``sdrt.graph.contrib`` knows into standard ONNX ops before ``_prepare``
    contrib_ops: ClassVar[frozenset[str]] = frozenset()

    #: whether ``compile`` keeps this backend's results in the compile cache (``sdrt.cache``). A backend
    #: that sets it writes ``_cache_parts``, ``_save`` and ``_load``; the ``cache=`` and ``cache_dir=``
    #: options are then the core's.
    caches: ClassVar[bool] = False
    #: True when a session rebound with ``update_weights`` runs exactly the program a fresh compile with those
    #: weights makes (bit for bit). A pipeline then compiles a LoRA's merged weights in directly; when False (the
    #: default: not known, or OpenVINO, whose swappable form adds biases after the kernel) it compiles the base
    #: weights and binds the merged ones, so that a LoRA's image never depends on what ran before
    #: (``Part.compile_factory``; tests/pipelines/test_lora_history.py holds each backend to its answer)
    rebinds_as_compiled: ClassVar[bool] = False
    #: where ``rebinds_as_compiled`` is False: options under which ``compile`` makes at once the program that a session
    #: compiled without them runs after its first ``update_weights`` (OpenVINO: ``{"swappable": True}``). A pipeline
    #: whose LoRAs are active at a part's first compile then compiles the merged weights with these options instead
    #: of compiling the base weights and binding the merged ones: one compile and one resident program, not two,
    #: and the same image (``Part.session``). Empty: not offered (the two steps)
    rebind_options: ClassVar[Mapping[str, Any]] = {}
    #: True when ``compile`` may run on a second thread while the first compiles or runs another graph, and spends
    #: most of its time in the vendor's compiler with the interpreter released: a pipeline then compiles the parts a
    #: job uses later (the UNet, the VAE) beside the first one's compile and run (``sdrt.pipelines.ahead``)
    compiles_beside: ClassVar[bool] = False
    #: True when ``_open`` does not need the stored entry: a large entry is then synced, checksummed and renamed
    #: into place in a background thread while the session already runs (``CompileCache.store(background=)``)
    stores_in_background: ClassVar[bool] = False
    #: True when what ``_save_later`` returns may be written while the session runs: a deferring compile
    #: (``_defers_store``) outside a pipeline's job then writes its entry in a background thread at once instead of
    #: before ``compile`` returns (``sdrt.cache.deferred.start``; ggml, whose write of a float32 UNet's layouts took
    #: 21 s of a bare ``sdrt.load`` on a disk-throttled VM)
    stores_beside: ClassVar[bool] = False

    # -- compiling: the template ---------------------------------------------
    def compile(self, graph: Graph, weights: Weights | None, device: Device, **options: Any) -> Session:
        """Compile ``graph`` for ``device`` and return a Session built with ``graph=``.

        The steps: check the device; parse the options; rewrite onnxruntime contrib ops the backend does not run
        (``contrib_ops``) into standard ops; ``_prepare`` the graph (refusing what the
        backend cannot run before any long work); key the compile cache from the graph's and the
        weights' identity and look it up (a hit is ``_load``-ed, with no weight resolved); else
        resolve every initializer's final array, ``_compile``, and store what ``_save`` writes.
        """
        if device.backend != self.name:
            raise NoDeviceError(f"device {device} belongs to backend {device.backend!r}",
                                where=f"{self.name}.compile",
                                fix=f"pass one of the devices of backend {self.name!r} (sdrt info lists them)")
        cache, rest = self._cache_options(options)
        opts = self.parse_options(rest, device)
        graph = self._prepare(graph.without_contrib_ops(self.contrib_ops, self.name), device, opts)
        log = logging.getLogger(f"sdrt.{self.name}")
        key = None
        from .weights.resolve import keyable  # the contract's one module of the weights layer

        if cache is not None and not keyable(weights):
            log.debug("compile cache skipped for %s: its weights are a %s, whose identity sdrt cannot tell without "
                      "reading them", graph.label, type(weights).__name__)
            cache = None
        if cache is not None:
            parts = self._cache_parts(graph, device, opts)
            if parts is not None:
                from .weights.resolve import check_fits

                check_fits(graph, weights)  # refused as a fresh compile refuses it, before a hit could skip that
                key = self.cache_key(graph, weights, parts, with_weights=self._weights_in_key(opts))
                entry = cache.lookup(key)
                if entry is not None:
                    try:
                        session = self._load(entry, graph, weights, device, opts)
                    except SdrtError as exc:
                        if not isinstance(exc, UnusableEntry):
                            raise  # about this machine or this call (no driver, no memory), not about the entry
                        cache.discard(key, f"{self.name} could not load it ({exc.what})")
                    except Exception as exc:  # noqa: BLE001 - a vendor's failure to import the entry: rebuild
                        first = str(exc).splitlines()[0][:200] if str(exc) else repr(exc)
                        cache.discard(key, f"{self.name} could not load it ({first})")
                    else:
                        log.info("loaded %s on %s from the compile cache (%s)", graph.label, device.id, key[:12])
                        return session
        from .weights.resolve import resolve_weights  # the contract's one function of the weights layer

        arrays = resolve_weights(graph, weights, blocks=self.weight_blocks())
        compiled = self._compile(graph, arrays, device, opts)
        stored = None
        if key is not None and cache is not None:
            meta = {"model": graph.label, "device": device.id, **self._cache_meta(graph, device, opts)}
            if self._defers_store(opts):
                from .cache import deferred

                later = self._save_later(compiled)  # what is compiled now, whatever the session does next
                if later is None:  # nothing worth an entry (a backend's own threshold)
                    log.info("compiled %s on %s (compile cache %s: nothing to store)", graph.label, device.id,
                             key[:12])
                    return _watching(self._open(compiled, None), arrays)
                job, what = lambda: cache.store(key, lambda folder: self._save(later, folder), meta), \
                    f"{graph.label} ({self.name})"
                if deferred.submit(job, what):
                    log.info("compiled %s on %s (compile cache %s: stored after this job)", graph.label, device.id,
                             key[:12])
                    return _watching(self._open(compiled, None), arrays)
                if self.stores_beside:  # no job to wait for: written in the background now
                    deferred.start([(job, what)])
                    log.info("compiled %s on %s (compile cache %s: storing in the background)", graph.label,
                             device.id, key[:12])
                    return _watching(self._open(compiled, None), arrays)
            stored = cache.store(key, lambda folder: self._save(compiled, folder), meta,
                                 background=self.stores_in_background)
            log.info("compiled %s on %s (compile cache %s: %s)", graph.label, device.id, key[:12],
                     "stored" if stored is not None else "not stored, or storing in the background")
        return _watching(self._open(compiled, stored), arrays)

    def parse_options(self, options: Mapping[str, Any], device: Device) -> Any:
        """Check ``sdrt.load(..., **options)`` (less ``cache``/``cache_dir`` for a caching backend) and
        return what ``_prepare``, ``_compile`` and the cache hooks get as ``opts``. By default: no options."""
        check_known_options(self.name, options, ())
        return None

    def _prepare(self, graph: Graph, device: Device, opts: Any) -> Graph:
        """Refuse a graph this backend cannot run (``UnsupportedGraph``, every op at once) and return the
        graph to compile (pinned shapes, say). Runs before the cache lookup and any long work."""
        return graph

    def _compile(self, graph: Graph, arrays: dict[str, np.ndarray], device: Device, opts: Any) -> Any:
        """Compile ``graph`` with ``arrays`` (``{initializer name: final array}``) into a Session, or into what
        ``_save`` stores and ``_open`` makes a Session of (a backend that must store before it opens)."""
        raise SdrtError(f"backend {self.name!r} implements neither _compile nor compile",
                        where=f"{type(self).__name__}._compile",
                        fix="write _compile(graph, arrays, device, opts) (see plugins/README.md)")

    # -- the compile cache's hooks ----------------------------------------------
    def _cache_parts(self, graph: Graph, device: Device, opts: Any) -> list[str] | None:
        """What besides the graph and the weights changes the compiled result: the vendor's and the
        plugin's versions, the device, the options. None: do not cache this compile."""
        return None

    def _weights_in_key(self, opts: Any) -> bool:
        """False when the compiled result does not depend on the weights' values (a refittable engine)."""
        return True

    def _cache_meta(self, graph: Graph, device: Device, opts: Any) -> dict[str, Any]:
        """What ``sdrt cache list`` shows of an entry besides the model and the device (JSON values)."""
        return {}

    def _save(self, compiled: Any, folder: Path) -> bool:
        """Write what ``_compile`` returned into ``folder`` (files of the backend's own format); return
        False to leave this result out of the cache."""
        return False

    def _defers_store(self, opts: Any) -> bool:
        """Whether this compile's store may wait until the job ends: inside ``sdrt.cache.deferred.hold()`` (a
        pipeline's job) it then runs after the job, ``_save`` writing the entry from what ``_save_later`` gave.
        By default never: a backend that can save its compiled result at any later time says when."""
        return False

    def _save_later(self, compiled: Any) -> Any:
        """What a deferred ``_save`` gets (``_defers_store``): the compiled result as it is now, which a later
        weight update must not change; None when there is nothing worth storing (no store is held for the job).
        By default ``compiled`` itself."""
        return compiled

    def _open(self, compiled: Any, entry: Entry | None) -> Session:
        """The Session of what ``_compile`` returned, once ``_save`` stored it as ``entry`` (None: not cached).
        By default ``_compile`` returns the Session itself."""
        return compiled

    def _load(self, entry: Entry, graph: Graph, weights: Weights | None, device: Device, opts: Any) -> Session:
        """A Session from a cache entry (``entry.file(name)``: the paths ``_save`` wrote; load or map them,
        do not read them into Python first). A vendor's exception or ``UnusableEntry`` discards the entry and
        compiles again; another ``SdrtError`` (no driver, say) goes to the caller.
        Weights are not resolved on a hit: resolve them when the session first needs them."""
        raise SdrtError(f"backend {self.name!r} cannot load compile cache entries", where=str(entry.path),
                        fix="write _load, or leave _cache_parts returning None")

    def cache_key(self, graph: Graph, weights: Weights | None, parts: Sequence[str], *,
                  with_weights: bool = True) -> str:
        """The compile cache key: this backend, the graph's identity, the weights' identity (from where
        each weight comes from, nothing read; see ``sdrt.cache.identity``), and ``parts``. Without
        ``with_weights`` only the initializers' names, dtypes and shapes count."""
        from .cache import make_key
        from .cache.identity import graph_identity, weights_identity

        weights_part = weights_identity(graph, weights) if with_weights else str(
            sorted((i.name, i.dtype, tuple(i.shape)) for i in graph.initializer_info().values()))
        return make_key([f"sdrt-compile/{self.name}", f"api={API_VERSION[0]}", graph_identity(graph),
                         weights_part, *parts])

    def check_options(self, options: Mapping[str, Any], device: Device) -> None:
        """Refuse ``options`` as ``compile`` would, before any work: the compile cache's (``cache=``,
        ``cache_dir=``) checked, the rest parsed by ``parse_options``. Nothing is compiled or created."""
        self.parse_options(self._split_cache_options(options)[2], device)

    def _cache_options(self, options: Mapping[str, Any]) -> tuple[CompileCache | None, dict[str, Any]]:
        """The compile cache ``cache=``/``cache_dir=`` ask for (None: off), and the other options."""
        use, folder, rest = self._split_cache_options(options)
        if not use:
            return None, rest
        from .cache import CompileCache

        return CompileCache(self.name, folder), rest

    def _split_cache_options(self, options: Mapping[str, Any]) -> tuple[bool, Any, dict[str, Any]]:
        """(``cache=``, ``cache_dir=``, the other options), the first two checked; (False, None, all) for a backend
        without a compile cache."""
        rest = dict(options)
        if not self.caches:
            return False, None, rest
        where = f"sdrt.load(..., backend={self.name!r})"
        use = rest.pop("cache", True)
        folder = rest.pop("cache_dir", None)
        if not isinstance(use, bool):
            raise SdrtError(f"cache must be True or False, got {use!r}", where=where,
                            fix="pass cache=False to skip the compile cache")
        if folder is not None and not isinstance(folder, (str, os.PathLike)):
            raise SdrtError(f"cache_dir must be a folder path, got {folder!r}", where=where,
                            fix="pass a folder, or leave cache_dir unset for $SDRT_CACHE_DIR or the user cache")
        return use, folder, rest

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


def check_outputs(outputs: Sequence[TensorInfo], names: Any) -> list[str]:
    """``names`` (``Session.run``'s ``outputs=``) checked against the declared ``outputs``, duplicates dropped.

    Raises ``InputError`` naming the unknown names and the graph's outputs."""
    if isinstance(names, (str, bytes)) or not isinstance(names, (Sequence, AbstractSet)):
        raise InputError(f"outputs must be a list of output names, got {type(names).__name__}", where="Session.run",
                         fix="pass outputs=['out_sample'], or leave it out for all of them")
    odd = [type(n).__name__ for n in names if not isinstance(n, str)]
    if odd:  # a list or dict inside would fail the set lookup below (unhashable)
        raise InputError(f"outputs must be a list of output names (strings), got a {odd[0]} among them",
                         where="Session.run outputs", fix="pass outputs=['out_sample'], or leave it out for all")
    declared = {o.name for o in outputs}
    unknown = [n for n in names if n not in declared]
    if unknown:
        raise InputError("unknown output name(s): " + ", ".join(repr(n) for n in unknown), where="Session.run outputs",
                         fix="the graph's outputs are: " + ", ".join(o.name for o in outputs))
    return list(dict.fromkeys(names))


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
           "check_api_version", "check_feeds", "check_outputs"]
