"""``TrtSession``: a deserialized engine on one GPU, run through device buffers.

Nothing here has run on an RTX GPU yet (none was available while writing it);
docs/trt.md says how to verify it: ``sdrt conformance trt`` and
``python -m sdrt_trt.verify`` on a machine with one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sdrt import Device, Session

from . import cuda
from .errors import TrtError, make_logger
from .prepare import Prepared

if TYPE_CHECKING:  # pragma: no cover
    from sdrt.graph import Graph

log = logging.getLogger("sdrt.trt")

#: ``rebuild(arrays) -> (engine bytes, metadata, prepared)`` for weights a refit cannot take
Rebuild = Callable[[Mapping[str, np.ndarray]], tuple[bytes, dict[str, Any], Prepared]]


def _trt_weights(arr: np.ndarray) -> Any:
    import tensorrt_rtx as trt

    arr = np.ascontiguousarray(arr)
    if arr.dtype.name == "bfloat16":
        return trt.Weights(trt.DataType.BF16, arr.ctypes.data, arr.size)
    return trt.Weights(arr)


class RuntimeCache:
    """TensorRT-RTX's JIT runtime cache of one engine, kept in the core's compile cache beside the engine's
    entry (its own entry, keyed from the engine's key), replaced whenever a session saves it."""

    FILE = "runtime.cache"

    def __init__(self, cache: Any, engine_key: str) -> None:
        from sdrt.cache import make_key

        self.cache, self.key = cache, make_key([engine_key, "tensorrt-rtx runtime cache"])

    def get(self) -> bytes | None:
        entry = self.cache.lookup(self.key)
        return entry.file(self.FILE).read_bytes() if entry is not None else None

    def put(self, blob: bytes) -> None:
        self.cache.store(self.key, lambda folder: (folder / self.FILE).write_bytes(blob), {"kind": "runtime-cache"},
                         replace=True)

    def discard(self, reason: str) -> None:
        self.cache.discard(self.key, reason)


class TrtSession(Session):
    def __init__(self, graph: Graph, engine: Any, meta: dict[str, Any], prepared: Prepared, device: Device,
                 source_arrays: Mapping[str, np.ndarray], rebuild: Rebuild,
                 runtime_cache: RuntimeCache | None = None) -> None:
        super().__init__(graph.inputs, graph.outputs, graph=graph)
        self.graph: Graph = graph
        self.device = device
        self._ordinal = int(device.id.split(":")[-1])
        self._rebuild = rebuild
        self._sources = dict(source_arrays)  # the resolved weights in the graph's own dtypes (mostly mapped views)
        self._rtcache = runtime_cache
        self._logger = make_logger()
        self._buffers: dict[str, cuda.Buffer] = {}
        self._stream: cuda.Stream | None = None
        self._engine: Any = None
        self._context: Any = None
        self._runtime_cache: Any = None
        cuda.set_device(self._ordinal)
        self._stream = cuda.Stream()
        self._load(engine, meta, prepared)

    # -- loading -------------------------------------------------------
    def _load(self, engine_bytes: Any, meta: dict[str, Any], prepared: Prepared) -> None:
        import tensorrt_rtx as trt

        self._release_engine()
        self._meta, self._prepared = meta, prepared
        self._runtime = trt.Runtime(self._logger)
        engine = self._runtime.deserialize_cuda_engine(engine_bytes)
        if engine is None:
            raise TrtError(f"TensorRT-RTX cannot load the engine: {self._logger.take()}",
                           where=f"{self.graph.name} on {self.device}",
                           fix="the engine was built for another GPU or TensorRT-RTX version: build it again "
                               "(delete the engine file, or pass cache=False)")
        self._engine = engine
        if meta.get("refit") in ("full", "identical"):  # weight-stripped: the weights go in before any run
            self._refit(prepared.weight_arrays(), everything=True)
        config = engine.create_runtime_config()
        self._runtime_cache = config.create_runtime_cache()
        if self._rtcache is not None:
            blob = self._rtcache.get()
            if blob is not None and not self._runtime_cache.deserialize(blob):
                self._rtcache.discard("TensorRT-RTX rejects it (another GPU, driver or version)")
        config.set_runtime_cache(self._runtime_cache)
        self._context = engine.create_execution_context(config)
        if self._context is None:
            raise TrtError(f"TensorRT-RTX cannot create an execution context: {self._logger.take()}",
                           where=str(self.device), fix="free GPU memory (close other sessions) and try again")
        self._names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in self._names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in self._names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self._dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in self._names}

    def _refittable(self) -> set[str]:
        import tensorrt_rtx as trt

        return set(trt.Refitter(self._engine, self._logger).get_all_weights())

    def _refit(self, arrays: Mapping[str, np.ndarray], *, everything: bool = False) -> None:
        import tensorrt_rtx as trt

        refitter = trt.Refitter(self._engine, self._logger)
        refittable = set(refitter.get_all_weights())
        keep = []  # the arrays must outlive refit_cuda_engine
        for name, arr in arrays.items():
            if name not in refittable:
                continue
            weights = _trt_weights(arr)
            keep.append((arr, weights))
            if not refitter.set_named_weights(name, weights):
                raise TrtError(f"TensorRT-RTX rejects new weights for {name!r}: {self._logger.take()}",
                               where=f"Refitter on {self.graph.name}",
                               fix="give weights of the graph's dtype and shape")
        missing = list(refitter.get_missing_weights()) if everything else []
        if missing:
            raise TrtError(f"the weight-stripped engine still lacks {len(missing)} weights: {', '.join(missing[:8])}",
                           where=f"Refitter on {self.graph.name}",
                           fix="build the engine from the same graph as the weights")
        if not refitter.refit_cuda_engine():
            raise TrtError(f"TensorRT-RTX could not refit the engine: {self._logger.take()}",
                           where=f"Refitter on {self.graph.name}",
                           fix="compile again with sdrt.load(model, weights=...)")
        del keep

    # -- running -------------------------------------------------------
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._stream is not None
        cuda.set_device(self._ordinal)
        ctx = self._context
        for name in self._inputs:
            arr = np.ascontiguousarray(feeds[name], dtype=self._dtypes[name])
            if not ctx.set_input_shape(name, arr.shape):
                raise TrtError(f"input {name!r} of shape {arr.shape} is outside the engine's profile",
                               where=f"{self.graph.name} on {self.device}",
                               fix="feed a shape within the profile the engine was built with (profiles=...)")
            buf = self._buffers.setdefault(name, cuda.Buffer())
            buf.upload(arr, self._stream)
            ctx.set_tensor_address(name, buf.ptr)
        results: dict[str, np.ndarray] = {}
        for name in self._outputs:
            shape = tuple(ctx.get_tensor_shape(name))
            out = np.empty(shape, dtype=self._dtypes[name])
            results[name] = out
            buf = self._buffers.setdefault(name, cuda.Buffer())
            ctx.set_tensor_address(name, buf.ensure(out.nbytes))
        if not ctx.execute_async_v3(self._stream.ptr):
            raise TrtError(f"TensorRT-RTX failed to run the engine: {self._logger.take()}",
                           where=f"{self.graph.name} on {self.device}",
                           fix="run with -vv for TensorRT-RTX's log")
        for name, out in results.items():
            self._buffers[name].download(out, self._stream)
        self._stream.synchronize()
        return results

    # -- weights -------------------------------------------------------
    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """Refit a ``refit='full'`` engine in place; rebuild any other, saying why."""
        from sdrt.precision import half_array

        self._sources.update(arrays)
        mode = self._meta.get("refit", "none")
        fixed: list[str] = []
        if mode == "full":  # initializers the engine folded in (shapes, axes) cannot be refit: changed, they rebuild
            refittable = self._refittable()
            current = self._prepared.graph.initializer_arrays([n for n in arrays if n not in refittable])
            fixed = [n for n, old in current.items() if not np.array_equal(np.asarray(arrays[n], old.dtype), old)]
        if mode == "full" and not fixed:
            info = self._prepared.graph.initializer_info()
            converted = {}
            for name, arr in arrays.items():
                want = info[name].dtype if name in info else str(arr.dtype)
                converted[name] = half_array(arr, want) if want in ("float16", "bfloat16") else np.asarray(arr, want)
            self._refit(converted)
            log.info("refit %d weights of %s", len(converted), self.graph.name)
            return
        why = (f"the engine folded in {', '.join(fixed[:4])}, which changed" if fixed else
               "it holds its weights (refit='none')" if mode == "none" else
               "refit='identical' engines take only the weights they were built with")
        log.warning("rebuilding %s for new weights: %s; compile with refit='full' to refit instead",
                    self.graph.name, why)
        engine, meta, prepared = self._rebuild(self._sources)
        self._release_engine()  # saves the old engine's runtime cache under the old engine's key
        self._rtcache = None  # the rebuilt engine is not the cached one: its runtime cache is not kept
        self._load(engine, meta, prepared)

    # -- closing -------------------------------------------------------
    def _release_engine(self) -> None:
        if self._runtime_cache is not None and self._rtcache is not None:
            try:
                blob = self._runtime_cache.serialize()
                if blob is not None and len(blob):
                    self._rtcache.put(bytes(blob))
            except Exception as exc:  # noqa: BLE001 - the runtime cache is optional
                log.warning("cannot save TensorRT-RTX's runtime cache: %s", exc)
        self._context = None
        self._runtime_cache = None
        self._engine = None

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        try:
            self._release_engine()
            for buf in self._buffers.values():
                buf.free()
            self._buffers.clear()
            if self._stream is not None:
                self._stream.close()
                self._stream = None
        finally:
            super().close()
