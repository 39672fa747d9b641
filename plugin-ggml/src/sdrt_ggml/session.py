"""``GgmlSession``: one lowered graph, allocated once, run many times.

``GgmlBackend.compile`` lowers the graph (``lower.lower_graph``) and opens the device; the
session wraps the weight arrays lowering made as CPU buffers (the CPU) or uploads them to a
backend buffer (other devices), and allocates every intermediate with ggml's graph allocator. ``run`` only copies the inputs in, computes, and copies the outputs out.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from sdrt import Session, TensorInfo
from sdrt.errors import InputError, SdrtError
from sdrt.lowering import fold_node
from sdrt.weights import same_values
from sdrt.weights.blocks import BlockMatrix
from sdrt.weights.pages import trim_heap

from . import native
from .devices import DeviceHandles
from .gpu import keep_matmuls_f32, weights_on_host
from .lower import BLOCK_ALIGN, Lowered, LoweringSpec, ctypes_addr, free_lowered, lower_graph
from .ops._common import GTensor, HostValue, ggml_lib

log = logging.getLogger("sdrt.ggml.session")

GRAPH_SIZE_MIN = 8192


class GgmlSession(Session):
    def __init__(
        self,
        inputs: Sequence[TensorInfo],
        outputs: Sequence[TensorInfo],
        *,
        graph: Any = None,
        spec: LoweringSpec,
        lowered: Lowered,
        device: DeviceHandles,
        scheduler: bool = False,
        where: str = "<graph>",
        threads: int = 1,
        pool: Any = "auto",
    ) -> None:
        super().__init__(inputs, outputs, graph=graph)
        self._spec = spec
        self._device = device
        self._use_sched = scheduler
        self._where = where
        self._sched: Any = None
        self._allocr: Any = None
        self._wbuf: Any = None
        self._hostbuf: Any = None  # weights a GPU device cannot hold, in CPU memory
        #: on the CPU, each weight's own buffer over the array lowering made for it (``spec.host_weights``), and
        #: those arrays (they are the weights' memory)
        self._wrapped: list[Any] = []
        self._wrapped_arrays: list[np.ndarray] = []
        self._lo: Lowered | None = lowered
        self._threads = threads
        self._pool_choice = pool
        #: counts ``update_weights`` calls that changed a weight: a compile cache store made after one is skipped
        self.weights_generation = 0
        self.pool_width = 0  # the ops' thread pool's width (native/pool.c), 0: ggml's threads
        try:
            self._build(lowered)
        except BaseException:
            self._free()
            raise

    @property
    def layouts(self) -> list[Any]:
        """The weights' layouts the lowering made for the compile cache, in order (``layout_cache.py``)."""
        return list(self._lo.layouts) if self._lo else []

    @property
    def where(self) -> str:
        return self._where

    @property
    def rewrite_hits(self) -> dict[str, int]:
        return dict(self._lo.rewrite_hits) if self._lo else {}

    @property
    def impl_hits(self) -> dict[str, int]:
        return dict(self._lo.impl_hits) if self._lo else {}

    # -- building ------------------------------------------------------------
    def _build(self, lo: Lowered) -> None:
        g = ggml_lib()
        self._lo = lo
        size = max(GRAPH_SIZE_MIN, 4 * lo.n_tensors)
        if not self._device.is_cpu:  # before the graph is built: the copies it adds must be in it
            copies = keep_matmuls_f32(lo.ctx, reserve=int(g.ggml_graph_overhead_custom(size, False)))
            log.info("GPU device %s: float32 matmuls, %d operand copies", self._device.name, copies)
        self._graph = g.ggml_new_graph_custom(lo.ctx, size, False)
        self._out_tensors: dict[str, GTensor] = {}
        for name, v in lo.outputs.items():
            if isinstance(v, GTensor):
                if not g.ggml_is_contiguous(v.ptr) or v.ptr.contents.view_src:
                    v = GTensor(g.ggml_cont(lo.ctx, v.ptr), v.shape, v.dtype)
                g.ggml_set_output(v.ptr)
                g.ggml_build_forward_expand(self._graph, v.ptr)
                self._out_tensors[name] = v
        self._alloc_weights(lo)
        trim_heap()  # the converted weights' temporaries, freed between the weights kept (sdrt.weights.pages)
        self._alloc_graph()
        self._set_threads()
        log.info("lowered %s: %d ggml nodes, %d weight tensors, rewrites %s", self._where,
                 g.ggml_graph_n_nodes(self._graph), len(lo.bindings), lo.rewrite_hits)

    def _alloc_weights(self, lo: Lowered) -> None:
        g = ggml_lib()
        if lo.pending and self._spec.host_weights and self._device.is_cpu and not self._use_sched \
                and not self._device.accel:
            self._wrap_weights(lo)
            return
        if lo.pending:
            if not self._device.is_cpu:
                self._hostbuf = weights_on_host(lo.pending, self._device)
            if any(not t.contents.data for t, _ in lo.pending):
                self._wbuf = g.ggml_backend_alloc_ctx_tensors(lo.wctx, self._device.backend)
                if not self._wbuf:
                    raise SdrtError("could not allocate the weights buffer", where=f"ggml device {self._device.name}",
                                    fix="free memory, or use a smaller model or another device")
                g.ggml_backend_buffer_set_usage(self._wbuf, g.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        for t, data in lo.pending:
            g.ggml_backend_tensor_set(t, data.ctypes.data, 0, data.nbytes)
        lo.pending = []

    def _wrap_weights(self, lo: Lowered) -> None:
        """The CPU device reads each weight where lowering left it: a CPU buffer over that array
        (``lower.host_array``: owned, aligned). Copying them all into one ggml buffer held every weight twice
        until the copies were done (a full-width Flux double block: 3.9 GB peak for 1.4 GB of weights)."""
        g = ggml_lib()
        for t, data in lo.pending:
            if data.nbytes != g.ggml_nbytes(t) or data.ctypes.data % BLOCK_ALIGN:
                raise SdrtError(f"weight tensor {g.ggml_get_name(t).decode(errors='replace')!r}: its array does not "
                                "fit it", where=self._where, fix="report this as a bug of sdrt-ggml")
            buf = _cpu_buffer_from_ptr()(data.ctypes.data, max(data.nbytes, 1))
            if not buf:
                raise SdrtError("could not wrap a weight array as a ggml buffer", where=self._where,
                                fix="free memory, or use a smaller model")
            self._wrapped.append(buf)
            self._wrapped_arrays.append(data)
            g.ggml_backend_buffer_set_usage(buf, g.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
            g.ggml_backend_tensor_alloc(buf, t, ctypes.c_void_p(data.ctypes.data))
        lo.pending = []

    def _alloc_graph(self) -> None:
        g = ggml_lib()
        dev = self._device
        if dev.is_cpu and not self._use_sched and not dev.accel:
            self._allocr = g.ggml_gallocr_new(g.ggml_backend_get_default_buffer_type(dev.backend))
            ok = g.ggml_gallocr_alloc_graph(self._allocr, self._graph)
        else:
            backends = ([dev.backend] + ([dev.cpu] if dev.cpu else []) if not dev.is_cpu
                        else [*dev.accel, dev.backend])  # the CPU must come last
            arr = (g.ggml_backend_t_ctypes * len(backends))(*backends)
            self._sched = g.ggml_backend_sched_new(arr, None, len(backends), g.ggml_graph_size(self._graph),
                                                   False, True)
            assert self._lo is not None
            for t in self._lo.scratch:  # no op decides where these live: put them with the main backend
                g.ggml_backend_sched_set_tensor_backend(self._sched, t, backends[0])
            if not dev.is_cpu:
                # ggml's scheduler puts graph inputs on its last backend (the CPU), and the ops fed
                # only by inputs follow them: a graph without weights ran wholly on the CPU
                for v in [*self._lo.inputs.values(), *self._lo.host_tensors.values()]:
                    g.ggml_backend_sched_set_tensor_backend(self._sched, v.ptr, dev.backend)
            ok = g.ggml_backend_sched_alloc_graph(self._sched, self._graph)
        if not ok:
            raise SdrtError("could not allocate memory for the graph's intermediate tensors",
                            where=f"ggml device {self._device.name}",
                            fix="free memory, use smaller input shapes, or another device")

    def _set_threads(self) -> None:
        """Who runs the graph's work: the ops' pool, with ggml on one thread, or ggml's threads
        (``native.pool_width``). The pool is for the CPU alone (sdrt's ops run only there)."""
        g = ggml_lib()
        dev = self._device
        if not dev.is_cpu or dev.accel:
            return
        self.pool_width = native.pool_width(g, self._graph, self._threads, self._pool_choice)
        g.ggml_backend_cpu_set_n_threads(dev.backend, 1 if self.pool_width else self._threads)

    def compute_bytes(self) -> int:
        """Bytes of the buffers ggml's allocator placed the graph's intermediate tensors in
        (the run's working memory, on top of the weights)."""
        g = ggml_lib()
        if self._allocr:
            return int(g.ggml_gallocr_get_buffer_size(self._allocr, 0))
        backends = [self._device.backend, self._device.cpu, *self._device.accel]
        return sum(int(g.ggml_backend_sched_get_buffer_size(self._sched, b)) for b in backends if b)

    def weight_bytes(self) -> int:
        """Bytes of the weight tensors the session holds, in ggml's types (F32; BF16/F16 at a half precision,
        half.py; Q8_0/Q4_0 blocks, quant.py)."""
        g = ggml_lib()
        if not self._lo:
            return 0
        total, t = 0, g.ggml_get_first_tensor(self._lo.wctx)
        while t:
            total += int(g.ggml_nbytes(t))
            t = g.ggml_get_next_tensor(self._lo.wctx, t)
        return total

    def placement(self) -> dict[str, Any]:
        """Where ggml runs the graph's compute nodes (views, which compute nothing, left out):
        ``device_nodes`` on the session's device, ``fallback_nodes`` on the other backends of its
        scheduler (for a GPU, the CPU running the ops the GPU backend lacks; counted by op in
        ``fallback_ops``), and ``splits``, the scheduler's graph splits (hand-overs between backends)."""
        g = ggml_lib()
        views = {g.GGML_OP_NONE, g.GGML_OP_RESHAPE, g.GGML_OP_VIEW, g.GGML_OP_PERMUTE, g.GGML_OP_TRANSPOSE}
        nodes = [g.ggml_graph_node(self._graph, i) for i in range(int(g.ggml_graph_n_nodes(self._graph)))]
        nodes = [t for t in nodes if t.contents.op not in views]
        if self._sched is None:
            return {"device_nodes": len(nodes), "fallback_nodes": 0, "fallback_ops": {}, "splits": 1}
        main = ctypes_addr(self._device.backend)
        tensor_backend = _sched_tensor_backend()
        fallback: dict[str, int] = {}
        for node in nodes:
            if tensor_backend(self._sched, node) != main:
                op = g.ggml_op_desc(node).decode()
                fallback[op] = fallback.get(op, 0) + 1
        n_fallback = sum(fallback.values())
        return {"device_nodes": len(nodes) - n_fallback, "fallback_nodes": n_fallback, "fallback_ops": fallback,
                "splits": int(g.ggml_backend_sched_get_n_splits(self._sched))}

    # -- running -------------------------------------------------------------
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._run_outputs(feeds, [info.name for info in self.outputs])

    def _run_outputs(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """Compute, then copy out only the outputs ``names`` (``Session.run(outputs=)``): the others stay in the
        graph's buffers, never fetched nor converted to their dtype."""
        g = ggml_lib()
        assert self._lo is not None
        host = self._host_values(feeds)
        sources = [(n, t, feeds) for n, t in self._lo.inputs.items()]
        sources += [(n, t, host) for n, t in self._lo.host_tensors.items()]
        for name, t, vals in sources:
            if not t.ptr.contents.data:
                continue  # input unused by the computed graph
            arr = vals[name]
            if name in self._lo.index_checks:
                arr = _checked_indices(name, arr, self._lo.index_checks[name])
            arr = np.ascontiguousarray(arr, dtype=np.int32 if t.dtype == "int32" else np.float32)
            g.ggml_backend_tensor_set(t.ptr, arr.ctypes.data, 0, arr.nbytes)
        self._compute()
        out: dict[str, np.ndarray] = {}
        declared = {info.name: info for info in self.outputs}
        for info in (declared[name] for name in names):
            v = self._lo.outputs[info.name]
            if isinstance(v, np.ndarray):
                arr = np.array(v)
            elif isinstance(v, HostValue):
                arr = np.array(host[v.name])
            else:
                t = self._out_tensors[info.name]
                arr = np.empty(t.shape, dtype=np.int32 if t.dtype == "int32" else np.float32)
                g.ggml_backend_tensor_get(t.ptr, arr.ctypes.data, 0, arr.nbytes)
            want = info.dtype if info.dtype not in ("undefined", "non-tensor") else arr.dtype.name
            out[info.name] = arr.astype(want, copy=False)
        return out

    def _compute(self) -> None:
        """Compute the graph on the inputs last set (no feeding, no fetching: bench.ggml_gemm times
        the kernels with it)."""
        g = ggml_lib()
        nat = native.native() if self._device.is_cpu else None
        if nat is not None:  # this thread's width (0: ggml's threads), whatever session ran on it before
            nat.lib.sdrt_pool_set_width(self.pool_width)
        try:
            if self._sched is not None:
                status = g.ggml_backend_sched_graph_compute(self._sched, self._graph)
            else:
                status = g.ggml_backend_graph_compute(self._device.backend, self._graph)
        finally:
            if nat is not None:  # the caller's own CPU affinity back, where the pool narrowed it
                nat.lib.sdrt_pool_release()
        if status != g.GGML_STATUS_SUCCESS:
            raise SdrtError(f"ggml graph compute failed with status {status}", where=self._where,
                            fix="check free memory; run with device='CPU' to compare")

    def _host_values(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the host part of the graph (integer work on integer inputs) on these feeds."""
        assert self._lo is not None
        if not self._lo.host_plan:
            return {}
        vals: dict[str, np.ndarray] = dict(feeds)
        for node, refs in self._lo.host_plan:
            args = [arg if kind == "const" else vals[arg] for kind, arg in refs]
            outs = node(*args) if callable(node) else fold_node(node, args, self._spec.opsets)
            for name, out in zip(node.output, outs):
                if name:
                    vals[name] = out
        return vals

    # -- weights -------------------------------------------------------------
    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """Write the weights whose values changed into the backend buffer; lower the graph again only
        when a changed weight was folded at lowering (or is read through a tensor not bound to it).

        Callers pass every initializer (a pipeline binds whole parts): unchanged ones are skipped
        by value, so a LoRA rewrites only the layers it touches. The changed weights are converted
        (layout transform, float32) in a few threads, which numpy runs without the GIL, and each
        is copied once, straight into its tensor.
        """
        assert self._lo is not None
        old = self._spec.initializers
        changed = {k: v if isinstance(v, BlockMatrix) else np.asarray(v) for k, v in arrays.items()
                   if not same_values(old.get(k), v)}
        if not changed:
            return
        self.weights_generation += 1
        bound = {b.name for b in self._lo.bindings}
        used = {i for n in self._spec.nodes for i in n.input}
        rebuild = [k for k in changed if k in used and (k not in bound or k in self._lo.folded_inits
                                                         or isinstance(changed[k], BlockMatrix))]
        self._spec.initializers.update(changed)
        if rebuild:
            log.info("update_weights: %d changed weights feed compile-time folding (%s); lowering the graph "
                     "again", len(rebuild), ", ".join(rebuild[:3]))
            self._free_graph()
            self._build(lower_graph(self._spec))
            return
        g = ggml_lib()
        todo = [b for b in self._lo.bindings if b.name in changed]

        def prepare(b: Any) -> np.ndarray:
            data = changed[b.name]
            data = b.transform(data) if b.transform else data
            return np.ascontiguousarray(data, dtype=np.dtype(b.dtype))

        workers = min(4, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for start in range(0, len(todo), 4 * workers):  # a window: few converted copies alive at once
                chunk = todo[start:start + 4 * workers]
                for b, data in zip(chunk, pool.map(prepare, chunk)):
                    if data.nbytes != g.ggml_nbytes(b.tensor):
                        raise SdrtError(f"weight {b.name!r} has {data.nbytes} bytes, expected "
                                        f"{g.ggml_nbytes(b.tensor)}", where="Session.update_weights",
                                        fix="pass weights with the graph's shapes")
                    g.ggml_backend_tensor_set(b.tensor, data.ctypes.data, 0, data.nbytes)
        log.debug("update_weights: wrote %d of %d weight tensors", len(todo), len(self._lo.bindings))

    # -- teardown ------------------------------------------------------------
    def _free_graph(self) -> None:
        """Free the allocations and the lowered contexts (the device stays open)."""
        g = ggml_lib()
        if self._sched:
            g.ggml_backend_sched_free(self._sched)
            self._sched = None
        if self._allocr:
            g.ggml_gallocr_free(self._allocr)
            self._allocr = None
        if self._wbuf:
            g.ggml_backend_buffer_free(self._wbuf)
            self._wbuf = None
        if self._hostbuf:
            g.ggml_backend_buffer_free(self._hostbuf)
            self._hostbuf = None
        for buf in self._wrapped:  # frees the wrappers; the arrays go with the list
            g.ggml_backend_buffer_free(buf)
        self._wrapped, self._wrapped_arrays = [], []
        if self._lo is not None:
            free_lowered(self._lo)
            self._lo = None

    def _free(self) -> None:
        self._free_graph()
        self._device.free()

    def close(self) -> None:
        if not self._closed:
            self._free()
        super().close()

    def __del__(self) -> None:  # free native memory if the user forgot close()
        try:
            if not getattr(self, "_closed", True):
                self._free()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing useful to do
            pass


@functools.cache
def _cpu_buffer_from_ptr() -> Any:
    """``ggml_backend_cpu_buffer_from_ptr`` returning the buffer's address: ggml-python 0.0.45 declares its result
    as the ``ggml_backend_buffer_t`` NewType, which ctypes reads as a C int (the pointer comes back truncated)."""
    raw = ggml_lib().ggml_backend_cpu_buffer_from_ptr
    proto = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    return proto(ctypes.cast(raw, ctypes.c_void_p).value)


@functools.cache
def _sched_tensor_backend() -> Any:
    """``ggml_backend_sched_get_tensor_backend`` returning the backend's address. ggml-python 0.0.45
    declares its result as the ``ggml_backend_t`` NewType, which ctypes treats as a converter of a C
    int: the pointer comes back truncated."""
    raw = ggml_lib().ggml_backend_sched_get_tensor_backend
    proto = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    fn = proto(ctypes.cast(raw, ctypes.c_void_p).value)

    def tensor_backend(sched: Any, node: Any) -> int:
        return fn(ctypes_addr(sched), ctypes_addr(node)) or 0

    return tensor_backend


def _checked_indices(name: str, arr: np.ndarray, dim: int) -> np.ndarray:
    """Indices with negatives wrapped; out-of-range ones raise (ggml would abort the process)."""
    if arr.size and (arr.min() < -dim or arr.max() >= dim):
        bad = arr[(arr < -dim) | (arr >= dim)].reshape(-1)[:5].tolist()
        raise InputError(f"input {name!r} holds indices out of range [-{dim}, {dim}): {bad}",
                         where=f"Session.run feed {name!r}", fix=f"pass indices below {dim}")
    return np.where(arr < 0, arr + dim, arr) if arr.size and arr.min() < 0 else arr
