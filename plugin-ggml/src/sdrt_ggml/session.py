"""``GgmlSession``: one lowered graph, allocated once, run many times.

Compile builds the ggml graph once, uploads the weights to a backend buffer
and allocates every intermediate with ggml's graph allocator. ``run`` only
copies the inputs in, computes, and copies the outputs out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sdrt import Session, TensorInfo
from sdrt.errors import InputError, SdrtError

from . import fold
from .lower import Lowered, Lowering
from .ops._common import H, T, gg

log = logging.getLogger("sdrt.ggml.session")

GRAPH_SIZE_MIN = 8192


class GgmlSession(Session):
    def __init__(
        self,
        *,
        nodes: Sequence[Any],
        initializers: dict[str, np.ndarray],
        inputs: Sequence[TensorInfo],
        outputs: Sequence[TensorInfo],
        opsets: Mapping[str, int],
        device_name: str,
        options: Mapping[str, Any],
        graph: Any = None,
        where: str = "<graph>",
    ) -> None:
        super().__init__(inputs, outputs, graph=graph)
        self._nodes = list(nodes)
        self._inits = initializers
        self._opsets = dict(opsets)
        self._device_name = device_name
        self._options = dict(options)
        self._where = where
        self._backend: Any = None
        self._cpu: Any = None
        self._sched: Any = None
        self._allocr: Any = None
        self._wbuf: Any = None
        self._lo: Lowered | None = None
        self.rewrite_hits: dict[str, int] = {}
        self.impl_hits: dict[str, int] = {}
        self._build()

    # -- building ------------------------------------------------------------
    def _init_backend(self) -> None:
        g = gg()
        threads = int(self._options.get("threads") or os.cpu_count() or 1)
        dev = g.ggml_backend_dev_by_name(self._device_name.encode())
        if not dev:
            raise SdrtError(f"ggml device {self._device_name!r} is not available", where="ggml backend registry",
                            fix="list devices with sdrt info, or rebuild ggml-python with that backend")
        self._backend = g.ggml_backend_dev_init(dev, None)
        if not self._backend:
            raise SdrtError(f"ggml could not initialize device {self._device_name!r}", where="ggml_backend_dev_init",
                            fix="check the device's driver, or use device='CPU'")
        self._is_cpu = bool(g.ggml_backend_is_cpu(self._backend))
        if self._is_cpu:
            g.ggml_backend_cpu_set_n_threads(self._backend, threads)
        else:
            self._cpu = g.ggml_backend_cpu_init()
            g.ggml_backend_cpu_set_n_threads(self._cpu, threads)
        # off by default: with OpenBLAS (GGML_BLAS=on) the float32 UNet took 1.11x and the text
        # encoder 1.59x the time of ggml's own kernels on the 2-core test machine
        self._accel = self._init_accel(threads) if self._is_cpu and self._options.get("accel", False) else []

    @staticmethod
    def _init_accel(threads: int) -> list[Any]:
        """Accelerator backends built into ggml (BLAS, AMX...): they take the ops they support, the
        CPU the rest, through ggml's scheduler."""
        g = gg()
        out = []
        for i in range(g.ggml_backend_dev_count()):
            dev = g.ggml_backend_dev_get(i)
            if int(g.ggml_backend_dev_type(dev)) != g.GGML_BACKEND_DEVICE_TYPE_ACCEL:
                continue
            be = g.ggml_backend_dev_init(dev, None)
            if not be:
                continue
            if g.ggml_backend_dev_name(dev).decode().upper().startswith("BLAS"):
                try:
                    g.ggml_backend_blas_set_n_threads(be, threads)
                except (AttributeError, RuntimeError):  # bindings built without BLAS
                    pass
            out.append(be)
        return out

    def _flash_attn_ok(self) -> bool:
        """Whether this backend runs ggml_flash_attn_ext on float32 tensors (probed on a tiny graph)."""
        if self._options.get("flash_attn") is not None:
            return bool(self._options["flash_attn"])
        if self._is_cpu:
            return True
        g = gg()
        ctx = g.ggml_init(g.ggml_init_params(mem_size=16 * g.ggml_tensor_overhead() + 4096, mem_buffer=None,
                                             no_alloc=True))
        try:
            q = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 64, 8, 1, 1)
            k = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 64, 8, 1, 1)
            y = g.ggml_flash_attn_ext(ctx, q, k, k, None, 1.0, 0.0, 0.0)
            return bool(g.ggml_backend_supports_op(self._backend, y))
        finally:
            g.ggml_free(ctx)

    def _build(self) -> None:
        g = gg()
        self._init_backend()
        infos = [(i.name, tuple(int(d) for d in i.shape), i.dtype) for i in self.inputs]  # type: ignore[arg-type]
        lw = Lowering(self._nodes, self._inits, infos, [o.name for o in self.outputs], self._opsets,
                      options=self._options, supports_flash_attn=self._flash_attn_ok(), on_cpu=self._is_cpu)
        lo = lw.lower()
        self.rewrite_hits = dict(lw.rewrite_hits)
        self.impl_hits = dict(lw.impl_hits)
        self._lo = lo
        size = max(GRAPH_SIZE_MIN, 4 * lw._n_tensors)
        self._graph = g.ggml_new_graph_custom(lo.ctx, size, False)
        self._out_tensors: dict[str, T] = {}
        for name, v in lo.outputs.items():
            if isinstance(v, T):
                if not g.ggml_is_contiguous(v.ptr) or v.ptr.contents.view_src:
                    v = T(g.ggml_cont(lo.ctx, v.ptr), v.shape, v.dtype)
                g.ggml_set_output(v.ptr)
                g.ggml_build_forward_expand(self._graph, v.ptr)
                self._out_tensors[name] = v
        self._alloc_weights(lo)
        self._alloc_graph()
        log.info("lowered %s: %d ggml nodes, %d weight tensors, rewrites %s", self._where,
                 g.ggml_graph_n_nodes(self._graph), len(lo.pending), self.rewrite_hits)

    def _alloc_weights(self, lo: Lowered) -> None:
        g = gg()
        if lo.pending:
            self._wbuf = g.ggml_backend_alloc_ctx_tensors(lo.wctx, self._backend)
            if not self._wbuf:
                raise SdrtError("could not allocate the weights buffer", where=f"ggml device {self._device_name}",
                                fix="free memory, or use a smaller model or another device")
            g.ggml_backend_buffer_set_usage(self._wbuf, g.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        for t, data in lo.pending:
            g.ggml_backend_tensor_set(t, data.ctypes.data, 0, data.nbytes)
        lo.pending = []

    def _alloc_graph(self) -> None:
        g = gg()
        if self._is_cpu and not self._options.get("scheduler") and not self._accel:
            self._allocr = g.ggml_gallocr_new(g.ggml_backend_get_default_buffer_type(self._backend))
            ok = g.ggml_gallocr_alloc_graph(self._allocr, self._graph)
        else:
            backends = ([self._backend] + ([self._cpu] if self._cpu else []) if not self._is_cpu
                        else [*self._accel, self._backend])  # the CPU must come last
            arr = (g.ggml_backend_t_ctypes * len(backends))(*backends)
            self._sched = g.ggml_backend_sched_new(arr, None, len(backends), g.ggml_graph_size(self._graph),
                                                   False, True)
            assert self._lo is not None
            for t in self._lo.scratch:  # no op decides where these live: put them with the main backend
                g.ggml_backend_sched_set_tensor_backend(self._sched, t, backends[0])
            ok = g.ggml_backend_sched_alloc_graph(self._sched, self._graph)
        if not ok:
            raise SdrtError("could not allocate memory for the graph's intermediate tensors",
                            where=f"ggml device {self._device_name}",
                            fix="free memory, use smaller input shapes, or another device")

    def compute_bytes(self) -> int:
        """Bytes of the buffers ggml's allocator placed the graph's intermediate tensors in
        (the run's working memory, on top of the weights)."""
        g = gg()
        if self._allocr:
            return int(g.ggml_gallocr_get_buffer_size(self._allocr, 0))
        backends = [self._backend, self._cpu, *self._accel]
        return sum(int(g.ggml_backend_sched_get_buffer_size(self._sched, b)) for b in backends if b)

    # -- running -------------------------------------------------------------
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = gg()
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
        if self._sched is not None:
            status = g.ggml_backend_sched_graph_compute(self._sched, self._graph)
        else:
            status = g.ggml_backend_graph_compute(self._backend, self._graph)
        if status != g.GGML_STATUS_SUCCESS:
            raise SdrtError(f"ggml graph compute failed with status {status}", where=self._where,
                            fix="check free memory; run with device='CPU' to compare")
        out: dict[str, np.ndarray] = {}
        for info in self.outputs:
            v = self._lo.outputs[info.name]
            if isinstance(v, np.ndarray):
                arr = np.array(v)
            elif isinstance(v, H):
                arr = np.array(host[v.name])
            else:
                t = self._out_tensors[info.name]
                arr = np.empty(t.shape, dtype=np.int32 if t.dtype == "int32" else np.float32)
                g.ggml_backend_tensor_get(t.ptr, arr.ctypes.data, 0, arr.nbytes)
            want = info.dtype if info.dtype not in ("undefined", "non-tensor") else arr.dtype.name
            out[info.name] = arr.astype(want, copy=False)
        return out

    def _host_values(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the host part of the graph (integer work on integer inputs) on these feeds."""
        assert self._lo is not None
        if not self._lo.host_plan:
            return {}
        vals: dict[str, np.ndarray] = dict(feeds)
        for node, refs in self._lo.host_plan:
            args = [arg if kind == "const" else vals[arg] for kind, arg in refs]
            outs = node(*args) if callable(node) else fold.fold_node(node, args, self._opsets)
            for name, out in zip(node.output, outs):
                if name:
                    vals[name] = out
        return vals

    # -- weights -------------------------------------------------------------
    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """Write new initializer values into the backend buffer; rebuild only when a weight was folded."""
        assert self._lo is not None
        bound = {b.name for b in self._lo.bindings}
        used = {i for n in self._nodes for i in n.input}
        rebuild = [k for k in arrays if k in used and (k not in bound or k in self._lo.folded_inits)]
        self._inits.update({k: np.asarray(v) for k, v in arrays.items()})
        if rebuild:
            log.info("update_weights: %d weights feed compile-time folding; rebuilding the ggml graph", len(rebuild))
            self._free()
            self._build()
            return
        g = gg()
        for b in self._lo.bindings:
            if b.name in arrays:
                data = np.asarray(arrays[b.name])
                data = b.transform(data) if b.transform else data
                data = np.ascontiguousarray(data, dtype=np.dtype(b.dtype))
                if data.nbytes != g.ggml_nbytes(b.tensor):
                    raise SdrtError(f"weight {b.name!r} has {data.nbytes} bytes, expected {g.ggml_nbytes(b.tensor)}",
                                    where="Session.update_weights", fix="pass weights with the graph's shapes")
                g.ggml_backend_tensor_set(b.tensor, data.ctypes.data, 0, data.nbytes)

    # -- teardown ------------------------------------------------------------
    def _free(self) -> None:
        g = gg()
        if self._sched:
            g.ggml_backend_sched_free(self._sched)
            self._sched = None
        if self._allocr:
            g.ggml_gallocr_free(self._allocr)
            self._allocr = None
        if self._wbuf:
            g.ggml_backend_buffer_free(self._wbuf)
            self._wbuf = None
        if self._lo is not None:
            g.ggml_free(self._lo.ctx)
            g.ggml_free(self._lo.wctx)
            self._lo = None
        for be in getattr(self, "_accel", []):
            g.ggml_backend_free(be)
        self._accel = []
        for attr in ("_backend", "_cpu"):
            if getattr(self, attr):
                g.ggml_backend_free(getattr(self, attr))
                setattr(self, attr, None)

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


def _checked_indices(name: str, arr: np.ndarray, dim: int) -> np.ndarray:
    """Indices with negatives wrapped; out-of-range ones raise (ggml would abort the process)."""
    if arr.size and (arr.min() < -dim or arr.max() >= dim):
        bad = arr[(arr < -dim) | (arr >= dim)].reshape(-1)[:5].tolist()
        raise InputError(f"input {name!r} holds indices out of range [-{dim}, {dim}): {bad}",
                         where=f"Session.run feed {name!r}", fix=f"pass indices below {dim}")
    return np.where(arr < 0, arr + dim, arr) if arr.size and arr.min() < 0 else arr
