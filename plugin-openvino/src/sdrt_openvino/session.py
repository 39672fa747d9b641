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
from sdrt.errors import InputError, SdrtError
from sdrt.weights import same_values
from sdrt.weights.pages import release as release_pages

from . import convert, swap
from .errors import OpenVINOError, first_lines

if TYPE_CHECKING:  # pragma: no cover
    import openvino as ov

    from sdrt.graph import Graph

log = logging.getLogger("sdrt.openvino.session")

#: numpy dtype name (ml_dtypes) -> (OpenVINO type name, numpy type with the same bits)
_RAW_TYPES: dict[str, tuple[str, type]] = {
    "bfloat16": ("bf16", np.uint16),
    "float8_e4m3fn": ("f8e4m3", np.uint8),
    "float8_e5m2": ("f8e5m2", np.uint8),
    "float8_e8m0fnu": ("f8e8m0", np.uint8),
}


class OpenVINOSession(Session):
    def __init__(self, graph: Graph, arrays: Mapping[str, np.ndarray] | Callable[[], Mapping[str, np.ndarray]],
                 converted: Callable[[], convert.Converted],
                 compiled: Any, recompile: Callable[[ov.Model], Any],
                 reconvert: Callable[[dict[str, np.ndarray]], Any], device_id: str, *,
                 core: Any = None, props: Mapping[str, Any] | None = None,
                 rebinder: swap.Rebinder | None = None, store: swap.Store | None = None) -> None:
        super().__init__(graph.inputs, graph.outputs, graph=graph)
        self._graph = graph
        #: the converted model, made on first need (a session loaded from the cache has none until then)
        self._conversion: Callable[[], convert.Converted] | None = converted
        self._converted: convert.Converted | None = None
        self._recompile = recompile
        self._reconvert = reconvert
        #: every initializer's current array (from resolve_weights, then each update_weights); a session
        #: loaded from the compile cache gets a callable and resolves them only when it first needs them
        self._pending = arrays if callable(arrays) else None
        self._current: dict[str, np.ndarray] | None = None if callable(arrays) else dict(arrays)
        #: what the compiled model was imported from (a map of the cache entry's blob), kept alive with it
        self.blob: Any = None
        #: the folder where OpenVINO wrote this session's blob as it compiled, until the cache took it (backend)
        self.staged: Any = None
        self._device_id = device_id
        self._core = core
        self._props = dict(props or {})
        #: rebinds weights through a weightless blob (swap.py), made at the first update_weights
        self._rebinder = rebinder
        self._swappable = core is not None
        #: where the swappable form is kept across processes (the compile cache), or None
        self._store = store
        #: weights fed as inputs of the compiled model (its Parameters), kept alive for OpenVINO
        self._weight_inputs: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self._compiled: Any = None
        self._request: Any = None
        self._bind(compiled, rebinder.input_arrays(self._arrays) if rebinder is not None else None)
        if rebinder is not None:
            self._drop_conversion()

    @property
    def _arrays(self) -> dict[str, np.ndarray]:
        if self._current is None:
            self._current = dict(self._pending()) if self._pending is not None else {}
            self._pending = None
            self.watch_weights(self._current)  # run checks their files first: OpenVINO may read these maps
        return self._current

    @_arrays.setter
    def _arrays(self, value: dict[str, np.ndarray]) -> None:
        self._current, self._pending = value, None
        self.watch_weights(value)

    @property
    def compiled(self) -> Any:
        """The ``ov.CompiledModel`` this session runs."""
        return self._compiled

    def _drop_conversion(self) -> None:
        """A swappable session needs no converted ``ov.Model`` (whose constants hold the first weights)."""
        self._converted = None
        self._conversion = lambda: self._reconvert(self._arrays)

    # -- setup ---------------------------------------------------------
    def _bind(self, compiled: Any, weight_inputs: Mapping[str, np.ndarray] | None = None) -> None:
        """Map graph inputs and outputs to the compiled model's ports; make the one InferRequest.

        ``weight_inputs``: weights the compiled model takes as inputs (a swappable session's
        vectors), set on the request once; it reads them on every run.
        """
        import openvino as ov

        weight_inputs = dict(weight_inputs or {})
        all_ins = list(compiled.inputs)
        weight_ports = {i: n for i, port in enumerate(all_ins) for n in port.get_names() if n in weight_inputs}
        ins = [port for i, port in enumerate(all_ins) if i not in weight_ports]
        index = [i for i in range(len(all_ins)) if i not in weight_ports]
        in_ports = [(index[i], name) for i, name in self._match_inputs(ins)]
        outs = list(compiled.outputs)
        input_names = {n for port in ins for n in port.get_names()}
        static: list[tuple[int, str, tuple[int, ...], np.dtype[Any]]] = []
        dynamic: list[tuple[int, str]] = []
        for info in self.outputs:
            i = next((k for k, port in enumerate(outs) if info.name in port.get_names()), None)
            if i is None:
                raise OpenVINOError(f"OpenVINO's compiled model has no output named {info.name!r}",
                                    where=self._graph.name, fix="report this: the ONNX frontend renamed an output")
            pshape = outs[i].get_partial_shape()
            dtype = np.dtype(outs[i].get_element_type().to_dtype())
            passthrough = bool(outs[i].get_names() & input_names)  # OpenVINO hands back the input's buffer
            if pshape.is_static and dtype.kind in "biuf" and dtype.name == info.dtype and not passthrough:
                static.append((i, info.name, tuple(int(d) for d in pshape.to_shape()), dtype))
            else:
                dynamic.append((i, info.name))
        request = compiled.create_infer_request()
        for i, name in weight_ports.items():
            request.set_input_tensor(i, ov.Tensor(weight_inputs[name], shared_memory=True))
        self._compiled, self._request, self._weight_inputs = compiled, request, weight_inputs
        self._in_ports, self._static_out, self._dynamic_out = in_ports, static, dynamic
        self._out_order = [o.name for o in self.outputs]
        self._out_dtypes = {o.name: o.dtype for o in self.outputs}
        self._tensor = ov.Tensor
        # dtypes numpy knows only through ml_dtypes: OpenVINO reads and writes their raw bits
        self._raw_types = {name: (getattr(ov.Type, t), bits) for name, (t, bits) in _RAW_TYPES.items()}
        self._raw_out = {ov_type for ov_type, _ in self._raw_types.values()}

    def _match_inputs(self, ports: list[Any]) -> list[tuple[int, str]]:
        """(port index, graph input name) for each input OpenVINO kept.

        Inputs match by tensor name. OpenVINO renames a Parameter wired straight
        to a Result after the output, and drops inputs the outputs do not depend
        on (an empty ``axes``); those left over match in order, as the frontend
        keeps the graph's input order.
        """
        by_name = {n: i for i, port in enumerate(ports) for n in port.get_names()}
        matched = [(by_name.get(info.name), info.name) for info in self.inputs]
        used = {i for i, _ in matched if i is not None}
        spare = [i for i in range(len(ports)) if i not in used]
        unmatched = [info for (i, _), info in zip(matched, self.inputs) if i is None]
        renamed: dict[str, int] = {}
        if len(spare) == len(unmatched):
            renamed = {info.name: i for info, i in zip(unmatched, spare)}
        else:  # some were dropped too: match the renamed ones by element type and rank
            for i in spare:
                fits = [info for info in unmatched if info.name not in renamed and _fits(ports[i], info)]
                if len(fits) != 1:
                    raise OpenVINOError(
                        f"cannot match OpenVINO's input {sorted(ports[i].get_names())} to one of the graph's "
                        f"{[u.name for u in unmatched]}", where=self._graph.name,
                        fix="report this: the ONNX frontend renamed graph inputs")
                renamed[fits[0].name] = i
        return [(i if i is not None else renamed[name], name) for i, name in matched
                if i is not None or name in renamed]

    # -- running -------------------------------------------------------
    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._run_outputs(feeds, None)

    def _run_outputs(self, feeds: dict[str, np.ndarray], names: list[str] | None) -> dict[str, np.ndarray]:
        """The outputs ``names`` (None: all). OpenVINO computes every output into the buffers bound to it: the
        others' are fresh ones dropped after the call (a buffer kept for them would hold their bytes between calls
        too), and the others of a dynamic shape are not copied out."""
        with self._lock:
            if self._request is None:
                raise SdrtError("this session is closed", where="OpenVINOSession",
                                fix="compile the graph again with sdrt.load")
            request = self._request
            try:
                return self._infer(request, feeds, names)
            except RuntimeError as exc:
                raise self._run_error(exc, feeds) from exc

    def _infer(self, request: Any, feeds: dict[str, np.ndarray], names: list[str] | None = None
               ) -> dict[str, np.ndarray]:
        """Bind inputs and outputs to the request, run it, collect the outputs (``names``: only those)."""
        tensor = self._tensor
        copies = []  # OpenVINO shares these arrays' memory: they must outlive infer()
        for index, name in self._in_ports:
            arr = feeds[name]
            if not (arr.flags.c_contiguous and arr.flags.writeable):  # OpenVINO shares only these
                arr = np.array(arr, order="C")
                copies.append(arr)
            raw = self._raw_types.get(arr.dtype.name)
            if raw is not None:  # numpy has no such dtype of its own; OpenVINO reads the raw bits
                request.set_input_tensor(index, tensor(arr.view(raw[1]), arr.shape, raw[0]))
            else:
                request.set_input_tensor(index, tensor(arr, shared_memory=True))
        results: dict[str, np.ndarray] = {}
        for index, name, shape, dtype in self._static_out:
            out = np.empty(shape, dtype)
            request.set_output_tensor(index, tensor(out, shared_memory=True))
            results[name] = out
        request.infer()
        del copies
        for index, name in self._dynamic_out:
            if names is not None and name not in names:
                continue
            out_tensor = request.get_output_tensor(index)
            if out_tensor.element_type in self._raw_out:
                bits = np.uint16 if out_tensor.element_type.bitwidth == 16 else np.uint8
                value = out_tensor.data.view(bits).copy().view(self._out_dtypes[name])
                results[name] = value
                continue
            value = out_tensor.data.copy()
            want = self._out_dtypes[name]
            results[name] = value if value.dtype.name == want or want == "undefined" else value.astype(want)
        if names is not None:
            return {name: results[name] for name in names}
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
    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """Bind new weights: import the session's weightless blob with them, or compile again.

        On the CPU the first update compiles the graph once more in a swappable form and
        keeps its weightless export (``swap.py``; imported from the compile cache where an
        earlier process stored it for this graph); every later update writes the weights
        file and imports that blob, which skips OpenVINO's transformations. Elsewhere, or
        when the graph does not allow it, the weight constants of the converted
        ``ov.Model`` are replaced and the model is compiled again. The session keeps
        running the old weights until the new model is ready.
        """
        start = time.perf_counter()
        assert self._conversion is not None  # the base class refuses a closed session
        if all(same_values(self._arrays.get(k), v) for k, v in arrays.items()):  # a pipeline rebinds whole parts
            log.info("%s: the %d weights passed hold the values bound already; nothing to do", self._graph.name,
                     len(arrays))
            return
        merged = {**self._arrays, **arrays}
        done = self._swap(merged) if self._swappable else None
        if done is not None:
            compiled, inputs, how = done
        else:
            compiled, how = self._recompile_with(arrays, merged), "compiled"
            inputs = {}
        with self._lock:
            self._arrays = merged
            self._bind(compiled, inputs)
        log.info("updated %d weights of %s in %.3f s (%s)", len(arrays), self._graph.name,
                 time.perf_counter() - start, how)

    def _swap(self, merged: dict[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray], str] | None:
        """The compiled model with ``merged`` through the weightless blob, or None when it cannot be used."""
        assert self._core is not None
        rebinder = self._rebinder
        try:
            if rebinder is not None and rebinder.fits(merged):
                compiled, views = rebinder.compile(self._core, merged)
                how = "weightless import"
            else:  # first update, or a shape/index initializer changed: the swappable form, stored or compiled
                compiled, rebinder, views, stored = swap.obtain(self._core, self._graph, merged, self._device_id,
                                                                self._props, self._store)
                how = ("weightless import of the swappable form from the compile cache" if stored else
                       "compiled once more to a weightless blob")
        except swap.NotSwappable as exc:
            log.info("%s: weights are bound by compiling again from now on (%s)", self._graph.name, exc)
            self._swappable, self._rebinder = False, None
            return None
        except (RuntimeError, OSError) as exc:  # OpenVINO refused the blob, or the weights file could not be written
            log.warning("%s: the weightless swap failed (%s); compiling again from now on", self._graph.name,
                        first_lines(exc) if isinstance(exc, RuntimeError) else exc)
            self._swappable, self._rebinder = False, None
            return None
        self._rebinder = rebinder
        self._drop_conversion()
        inputs = rebinder.input_arrays(merged)
        merged.update(views)  # the weights file's mapping, which OpenVINO keeps: held once, not twice
        return compiled, inputs, how

    def _recompile_with(self, arrays: dict[str, np.ndarray], merged: dict[str, np.ndarray]) -> Any:
        """Replace the weight constants of the converted ``ov.Model`` (or convert again) and compile it.

        The ONNX graph is not read or converted again: each weight's ``Constant`` is
        replaced in place by one over the new array (no copy when the array is writable).
        Only when a weight has no constant of its own (a changed shape or index
        initializer, which stays baked into the graph) is the graph converted once more.
        """
        assert self._conversion is not None
        conv = self._converted if self._converted is not None else self._conversion()
        swaps, reread = self._plan(conv, arrays)
        try:
            if reread:
                log.info("%s: %s has no constant of its own; converting the graph once more with every weight "
                         "bound as a constant", self._graph.name, reread)
                conv = self._reconvert(merged)
            else:
                for name, (node, arr) in swaps.items():
                    new = convert.make_constant(arr, name, conv.maps)
                    node.output(0).replace(new.output(0))
                    conv.consts[name] = new
                conv.model.validate_nodes_and_infer_types()
            compiled = self._recompile(conv.model)
        except RuntimeError as exc:
            raise OpenVINOError(f"OpenVINO could not compile the new weights: {first_lines(exc)}",
                                where=self._graph.name, fix="check that the weights fit this graph") from exc
        release_pages(conv.maps)  # compiled: the new weights' mapped pages that compiling read leave the RSS
        self._converted = conv
        return compiled

    def _plan(self, conv: convert.Converted, arrays: dict[str, np.ndarray]
              ) -> tuple[dict[str, tuple[Any, np.ndarray]], str | None]:
        """Which constant each new weight replaces, or the first weight that needs the graph read again."""
        swaps: dict[str, tuple[Any, np.ndarray]] = {}
        by_name: dict[str, Any] | None = None
        for name, arr in arrays.items():
            node = conv.consts.get(name)
            if node is None and arr.dtype.kind not in "fcV":  # shapes, axes, indices: must not change
                old = conv.fixed.get(name, self._arrays.get(name))
                if np.array_equal(np.asarray(old).ravel(), arr.ravel()):
                    continue
                return {}, name
            if node is None:  # an inline graph's initializer: OpenVINO names its Constant after it
                if by_name is None:
                    by_name = convert.constants(conv.model)
                node = by_name.get(name)
                if node is None or tuple(node.get_output_shape(0)) != tuple(arr.shape):
                    return {}, name
            want = np.dtype(node.get_element_type().to_dtype()) if node.get_element_type().is_real() else arr.dtype
            swaps[name] = (node, arr if arr.dtype == want or arr.dtype.kind == "V" else arr.astype(want))
        return swaps, None

    # -- info and cleanup ---------------------------------------------
    @property
    def compiled_model(self) -> Any:
        """The ``openvino.CompiledModel`` (for inspection: properties, runtime model)."""
        return self._compiled

    def property(self, name: str) -> Any:
        """A property of the compiled model, e.g. ``"INFERENCE_PRECISION_HINT"``."""
        return self._compiled.get_property(name)

    def release_scratch(self) -> None:
        """``CompiledModel.release_memory``: OpenVINO's CPU plugin keeps a request's intermediate buffers between
        calls. Released after the UNet's last step, the VAE decoder's first call of a process ran in 1.9 s instead of
        2.8 (SD 1.5 at 512 px, bf16, an AMX Xeon: its 400 MB of first-touch page faults cost 5x the system time while
        the UNet's buffers stayed), and the UNet's next call re-allocated its own in 0.04 s."""
        with self._lock:
            if self._compiled is None:
                return
            try:
                self._compiled.release_memory()
            except (RuntimeError, AttributeError) as exc:  # a device or an OpenVINO without it: kept, as before
                log.debug("release_memory not done: %s", exc)

    def close(self) -> None:
        with self._lock:
            self._request = None
            self._compiled = None
            self._converted = None
            self._conversion = None
            self._arrays = {}
            self._rebinder = None
            self._weight_inputs = {}
            self.blob = None
        super().close()


def _fits(port: Any, info: Any) -> bool:
    """Whether an OpenVINO input port could be the graph input ``info`` (same element type and rank)."""
    try:
        dtype = np.dtype(port.get_element_type().to_dtype()).name
    except (RuntimeError, TypeError):
        return False
    rank = port.get_partial_shape().rank
    return dtype == info.dtype and (rank.is_dynamic or rank.get_length() == len(info.shape))
