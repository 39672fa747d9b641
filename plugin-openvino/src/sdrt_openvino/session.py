"""``OpenVINOSession``: one compiled model and one reused ``InferRequest``.

The run path is kept lean so that sdrt adds nothing measurable to OpenVINO:
inputs are wrapped as ``ov.Tensor`` over the caller's arrays (no copy), and each
output with a static shape is written by OpenVINO straight into a fresh numpy
array that the caller then owns (no copy, and no aliasing between runs).
Outputs with dynamic shapes are copied out of OpenVINO's buffer once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sdrt import Session
from sdrt.errors import InputError, SdrtError, WeightsError

from . import convert
from .errors import OpenVINOError, first_lines

if TYPE_CHECKING:  # pragma: no cover
    import openvino as ov

    from sdrt.graph import Graph
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.openvino.session")


class OpenVINOSession(Session):
    def __init__(self, graph: Graph, ov_model: ov.Model, compiled: Any,
                 recompile: Callable[[ov.Model], Any], device_id: str) -> None:
        super().__init__(graph.inputs, graph.outputs)
        self._graph = graph
        self._ov_model = ov_model
        self._recompile = recompile
        self._device_id = device_id
        self._lock = threading.Lock()
        self._compiled: Any = None
        self._request: Any = None
        self._bind(compiled)

    # -- setup ---------------------------------------------------------
    def _bind(self, compiled: Any) -> None:
        """Map graph inputs and outputs to the compiled model's ports; make the one InferRequest."""
        import openvino as ov

        def index_of(ports: list[Any], name: str, kind: str) -> int:
            for i, port in enumerate(ports):
                if name in port.get_names():
                    return i
            raise OpenVINOError(f"OpenVINO's compiled model has no {kind} named {name!r}", where=self._graph.name,
                                fix="report this: the ONNX frontend renamed a graph " + kind)

        ins = list(compiled.inputs)
        outs = list(compiled.outputs)
        in_ports = [(index_of(ins, info.name, "input"), info.name) for info in self.inputs]
        static: list[tuple[int, str, tuple[int, ...], np.dtype[Any]]] = []
        dynamic: list[tuple[int, str]] = []
        for info in self.outputs:
            i = index_of(outs, info.name, "output")
            pshape = outs[i].get_partial_shape()
            dtype = np.dtype(outs[i].get_element_type().to_dtype())
            if pshape.is_static and dtype.kind in "biuf" and dtype.name == info.dtype:
                static.append((i, info.name, tuple(int(d) for d in pshape.to_shape()), dtype))
            else:
                dynamic.append((i, info.name))
        request = compiled.create_infer_request()
        self._compiled, self._request = compiled, request
        self._in_ports, self._static_out, self._dynamic_out = in_ports, static, dynamic
        self._out_order = [o.name for o in self.outputs]
        self._out_dtypes = {o.name: o.dtype for o in self.outputs}
        self._tensor = ov.Tensor

    # -- running -------------------------------------------------------
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensor = self._tensor
        with self._lock:
            if self._request is None:
                raise SdrtError("this session is closed", where="OpenVINOSession",
                                fix="compile the graph again with sdrt.load")
            request = self._request
            for index, name in self._in_ports:
                arr = feeds[name]
                if not arr.flags.c_contiguous:
                    arr = np.ascontiguousarray(arr)
                request.set_input_tensor(index, tensor(arr, shared_memory=True))
            results: dict[str, np.ndarray] = {}
            for index, name, shape, dtype in self._static_out:
                out = np.empty(shape, dtype)
                request.set_output_tensor(index, tensor(out, shared_memory=True))
                results[name] = out
            try:
                request.infer()
            except RuntimeError as exc:
                raise self._run_error(exc, feeds) from exc
            for index, name in self._dynamic_out:
                value = request.get_output_tensor(index).data.copy()
                want = self._out_dtypes[name]
                results[name] = value if value.dtype.name == want or want == "undefined" else value.astype(want)
        return results if len(results) == 1 else {name: results[name] for name in self._out_order}

    def _run_error(self, exc: RuntimeError, feeds: Mapping[str, np.ndarray]) -> SdrtError:
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in feeds.items())
        text = first_lines(exc)
        if "shape" in text.lower() or "dimension" in text.lower():
            return InputError(f"OpenVINO rejected the input shapes: {text}", where=f"{self._graph.name}: {shapes}",
                              fix="feed shapes the graph accepts (session.inputs lists them)")
        return OpenVINOError(f"OpenVINO failed to run the model: {text}", where=f"{self._graph.name} on "
                             f"{self._device_id}, inputs {shapes}", fix="check the inputs; run with -vv for details")

    # -- weights -------------------------------------------------------
    def update_weights(self, weights: Weights) -> None:
        """Swap the weight constants in the converted ``ov.Model`` and recompile it.

        The ONNX graph is not read or converted again: each named ``Constant`` is
        replaced in place by one over the new array (no copy when the array is
        writable), then the model is compiled for the device. The session keeps
        running the old weights until the new compiled model is ready.
        """
        if self._request is None:
            raise SdrtError("this session is closed", where="OpenVINOSession.update_weights",
                            fix="compile the graph again with sdrt.load")
        start = time.perf_counter()
        arrays = weights.bind(self._graph)
        consts = convert.constants(self._ov_model)
        missing = sorted(set(arrays) - set(consts))
        if missing:
            raise WeightsError(f"the compiled model has no weight constant named {', '.join(missing[:10])}",
                               where=f"{self._graph.name} (OpenVINO folded or renamed these initializers)",
                               fix="load the model again with sdrt.load(model, weights=...) instead")
        for name, value in arrays.items():
            old = consts[name]
            arr = np.asarray(value)
            want_dtype = np.dtype(old.get_element_type().to_dtype())
            want_shape = tuple(int(d) for d in old.get_output_shape(0))
            if tuple(arr.shape) != want_shape:
                raise WeightsError(f"weight {name!r} has shape {tuple(arr.shape)}, the model expects {want_shape}",
                                   where=f"{self._graph.name} initializer {name!r}",
                                   fix="use weights exported from the same model")
            if arr.dtype != want_dtype:
                arr = arr.astype(want_dtype)
            old.output(0).replace(convert.make_constant(arr, name).output(0))
        try:
            self._ov_model.validate_nodes_and_infer_types()
            compiled = self._recompile(self._ov_model)
        except RuntimeError as exc:
            raise OpenVINOError(f"OpenVINO could not compile the new weights: {first_lines(exc)}",
                                where=self._graph.name, fix="check that the weights fit this graph") from exc
        with self._lock:
            self._bind(compiled)
        log.info("updated %d weights of %s in %.3f s", len(arrays), self._graph.name, time.perf_counter() - start)

    # -- info and cleanup ---------------------------------------------
    @property
    def compiled_model(self) -> Any:
        """The ``openvino.CompiledModel`` (for inspection: properties, runtime model)."""
        return self._compiled

    def property(self, name: str) -> Any:
        """A property of the compiled model, e.g. ``"INFERENCE_PRECISION_HINT"``."""
        return self._compiled.get_property(name)

    def close(self) -> None:
        with self._lock:
            self._request = None
            self._compiled = None
            self._ov_model = None
        super().close()
