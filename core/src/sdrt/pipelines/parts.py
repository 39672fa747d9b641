"""One part of a pipeline (text encoder, UNet, VAE): its Graph and its compiled Sessions, one per shape.

Every part goes through ``sdrt.load`` on the pipeline's backend and device, pinned to the static
shapes of the call (``Graph.with_shapes``), so backends compile static graphs. Sessions are cached
per shape; ``update_weights`` reaches every cached session and every later one.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ModelError, SdrtError

if TYPE_CHECKING:  # pragma: no cover
    from ..backend import Device, Session, TensorInfo
    from ..graph import Graph
    from ..weights import Weights

log = logging.getLogger("sdrt.pipelines.parts")

_ORDER = itertools.count()
ShapeKey = tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[str, ...]]


class Part:
    """A named part of a model folder. ``graph`` loads on first use; ``run(feeds)`` compiles per shape."""

    def __init__(self, name: str, path: Path, *, backend: str = "auto", device: str | Device | None = None,
                 options: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.path = path
        self.backend = backend
        self.device = device
        self.options = dict(options or {})
        self.sessions: dict[ShapeKey, Session] = {}
        #: a compile of this part started ahead on another thread (``sdrt.pipelines.ahead``): ``session`` and every
        #: change of the part wait for it first
        self._ahead: Any = None
        self._weights: Weights | None = None
        #: the weights the part runs with when nothing else is bound: a single file's, bound onto a
        #: weight-free graph (``ModelFolder.weights``); None: the graph's own initializers
        self.default_weights: Weights | None = None
        #: the weights file bound onto a shipped weight-free graph (a ControlNet .safetensors), if any
        self.source_file: Path | None = None
        #: its version (``stamps.file_stamp``) when the part was made: one written anew makes a new part
        self.source_stamp: Any = None
        #: what logs and ``sdrt cache list`` call the part's graph ("dreamshaper_8/unet"; ``Graph.label``); None: the
        #: weights file's name and the part's when there is one, else the graph file's own
        self.label: str | None = None
        #: a Flux ControlNet's layout (``sdrt.checkpoint.fluxcontrolnet.FluxNetLayout``), None for any other part
        self.flux_layout: Any = None
        #: an SD3 ControlNet's layout (``sdrt.checkpoint.sd3controlnet.SD3NetLayout``), None for any other part
        self.sd3_layout: Any = None
        #: rebuilds ``weights`` after low-memory mode dropped them with the graph (sdrt.pipelines.lowmem)
        self.weights_factory: Callable[[], Weights] | None = None
        #: the part's weights without its LoRAs (``weights`` holds them merged), or None: a new session compiles with
        #: these and gets ``weights`` through ``update_weights``, the path a LoRA bound on a live session takes, so
        #: that a LoRA's image does not depend on whether a session existed before it (``WeightState._bind``)
        self.compile_factory: Callable[[], Weights] | None = None
        #: leave external initializer data mapped from disk (set by low-memory mode)
        self.lazy_external = False
        #: run as block groups of at most this many weight bytes, one loaded at a time (sdrt.pipelines.streaming)
        self.stream_bytes: int | None = None
        #: streamed: identical groups share one compiled session, their weights swapped in (update_weights)
        self.stream_share = False
        self._graph: Graph | None = None
        #: the graph as ``graph`` loaded it from ``path`` (and edited it): the dry run's shapes are kept on disk
        #: only for it (a graph set otherwise, say with reserved embedding rows, is not the file's)
        self._loaded_graph: Graph | None = None
        #: an edit applied to the graph each time it loads (a Flux transformer given ControlNet residual inputs,
        #: ``sdrt.pipelines.fluxcontrolnet``), and what it is (sessions compiled for another edit are closed)
        self.graph_edit: Callable[[Graph], Graph] | None = None
        self.graph_edit_key: Any = None
        #: outputs the edit adds that an ordinary ``run`` does not return (a reference unit's banks: only its write
        #: pass asks for them, by ``run(select=)``): the session computes them and copies none out
        #: (``Session.run(outputs=)``); None: every output is returned
        self.hidden_outputs: Callable[[str], bool] | None = None
        #: the graph the bound weights were made for, once ``retarget`` moved the part to another (None: not moved)
        self._weights_graph: Path | None = None
        #: a job's dry twin: the real part whose graph it takes (loading it there) instead of loading its own
        self._share: Part | None = None
        #: a dry run (``Pipeline.plan``): ``run`` records its calls here and returns zeros, compiling nothing
        self.record: list[tuple[dict[str, tuple[tuple[int, ...], str]], tuple[str, ...]]] | None = None

    def dry(self, share: bool = False) -> Part:
        """A recording twin: same graph and paths, no sessions; its ``run`` only records and returns zeros.
        ``share``: the dry run of a job that loads the same graphs next, so a graph the twin needs is loaded by
        this part (as it loads it to run) and the twin takes it: one load, not two. Otherwise the twin loads its
        own with the external data mapped (a plan reads no weights in)."""
        twin = Part(self.name, self.path, backend=self.backend, device=self.device, options=self.options)
        twin._graph, twin.lazy_external, twin.record = self._graph, True, []
        twin._share = self if share and self._graph is None else None
        twin._loaded_graph = self._loaded_graph
        twin.graph_edit, twin.graph_edit_key = self.graph_edit, self.graph_edit_key
        twin.hidden_outputs = self.hidden_outputs
        twin.default_weights = self.default_weights
        twin.label = self.graph_label
        return twin

    def __repr__(self) -> str:
        return f"Part({self.name!r}, {str(self.path)!r}, {len(self.sessions)} session(s))"

    @property
    def weights(self) -> Weights | None:
        """The weights the part runs with (None: the graph's own, or ``default_weights``)."""
        return self._weights

    @weights.setter
    def weights(self, value: Weights | None) -> None:
        self.settle()
        self._weights = value

    def settle(self) -> None:
        """Wait for a compile started ahead (``sdrt.pipelines.ahead``), if any; a no-op on its own thread."""
        pending = self._ahead
        if pending is not None and pending.thread is not threading.current_thread():
            pending.wait()
            if self._ahead is pending:
                self._ahead = None

    @property
    def graph_label(self) -> str | None:
        """``label``, else ``<weights file>/<part>`` for a part bound to a weights file; None: the graph file's name."""
        return self.label or (f"{self.source_file.stem}/{self.name}" if self.source_file is not None else None)

    @property
    def graph(self) -> Graph:
        src = self._share
        if self._graph is None and src is not None and src.path == self.path and src.graph_edit is self.graph_edit:
            self._graph, self._loaded_graph = src.graph, src._loaded_graph  # the real part's (``dry(share=True)``)
        if self._graph is None:
            from ..graph import Graph

            try:
                # low-memory mode keeps external data (model.onnx_data) mapped instead of read in
                self._graph = Graph.load(self.path, load_external=False if self.lazy_external else None)
            except SdrtError as exc:
                raise type(exc)(f"the {self.name} part cannot be loaded: {exc.what}", where=exc.where or str(self.path),
                                fix=exc.fix) from exc
            self._graph.label = self.graph_label
            if self.name == "unet":  # upsamplers sized by their skips: any multiple of 8 runs (sdrt.graph.upsample)
                from ..graph.upsample import skip_sized_upsampling

                skip_sized_upsampling(self._graph.model)
            if self.graph_edit is not None:
                self._graph = self.graph_edit(self._graph)
            self._loaded_graph = self._graph
        return self._graph

    def edit_graph(self, edit: Callable[[Graph], Graph] | None, key: Any = None,
                   hidden: Callable[[str], bool] | None = None) -> None:
        """Run the graph as ``edit`` makes it from the file's (None: as the file has it) from now on; ``key``
        names the edit, so that asking for the same one again keeps the compiled sessions. ``hidden``: which of
        the edited graph's outputs an ordinary ``run`` leaves out (``hidden_outputs``)."""
        if edit is None and self.graph_edit is None or edit is not None and key == self.graph_edit_key:
            self.hidden_outputs = hidden if edit is not None else None
            return
        self.close()  # waits for a compile started ahead
        self._graph = None
        self.graph_edit, self.graph_edit_key = edit, (key if edit is not None else None)
        self.hidden_outputs = hidden if edit is not None else None

    @property
    def inputs(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.graph.inputs}

    @property
    def outputs(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.graph.outputs}

    def input(self, name: str) -> TensorInfo:
        info = self.inputs.get(name)
        if info is None:
            raise ModelError(f"the {self.name} graph has no input {name!r}", where=str(self.path),
                             fix=f"export it with the diffusers/Optimum input names (it has: {', '.join(self.inputs)})")
        return info

    def require_output(self, name: str) -> None:
        if name not in self.outputs:
            raise ModelError(f"the {self.name} graph has no output {name!r}", where=str(self.path),
                             fix=f"export it with the diffusers/Optimum output names (it has: {', '.join(self.outputs)})")

    @staticmethod
    def shape_key(shapes: Mapping[str, tuple[int, ...]], outputs: tuple[str, ...] = ()) -> ShapeKey:
        """The key of the session for these input shapes and outputs in ``sessions``."""
        return tuple(sorted((k, tuple(int(d) for d in v)) for k, v in shapes.items())), tuple(outputs)

    def session(self, shapes: Mapping[str, tuple[int, ...]], outputs: tuple[str, ...] = ()) -> Session:
        """The compiled session for these input shapes (compiled now if new).

        ``outputs``: compute only these (a text encoder's one hidden state, say); all when empty.
        """
        self.settle()
        key = self.shape_key(shapes, outputs)
        dims = key[0]
        sess = self.sessions.get(key)
        if sess is None:
            from ..runtime import load

            # static shapes, so every backend compiles a static graph. A graph cut to fewer outputs drops the
            # nodes only the other outputs needed (weights keep their names), cut after pinning: the whole graph's
            # shapes, pinned by the job's dry run, hold for the cut one (no inference again). It is folded too: the
            # text encoder's position ids then reach OpenVINO as a constant, which its swappable form needs
            for name in outputs:
                self.require_output(name)
            pinned = self.graph.with_shapes(dict(dims))
            if outputs:
                pinned = pinned.keep_outputs(outputs).fold_constants()
            log.info("compiling %s for %s", self.name, ", ".join(f"{k}{list(v)}" for k, v in dims))
            if self.weights is None and self.weights_factory is not None:
                self.weights = self.weights_factory()
            fit = self._fit_constants
            if self.stream_bytes:
                from .streaming import StreamedSession

                sess = StreamedSession(pinned, fit(self.weights), max_weight_bytes=self.stream_bytes, backend=self.backend,
                                       device=self.device, share=self.stream_share, options=self.options)
            else:
                direct = rebind_options(self.backend, self.options) if self.compile_factory is not None else {}
                # LoRAs active at the first compile: the base weights compiled, then the merged ones bound, as on a
                # live session; or at once the program that binding makes, where the backend offers it
                first = self.compile_factory() if self.compile_factory is not None and not direct else self.weights
                sess = load(pinned, weights=fit(first), backend=self.backend, device=self.device,
                            **{**self.options, **direct})
                if first is not self.weights and self.weights is not None:
                    try:
                        sess.update_weights(fit(self.weights))
                    except BaseException:
                        sess.close()
                        raise
            self.sessions[key] = sess
        return sess

    def _fit_constants(self, weights: Weights | None) -> Weights | None:
        """Weights bound onto the graph the part ran before ``retarget`` (a single file's plain UNet, whose weights
        carry that graph's own constants: position ids, the exporter's scalars) made to fit the graph it runs now:
        the old graph's own constants out, this one's in (the twins share their parameters' names, not their
        constants'). Unchanged when the part was not moved or runs its weights' graph again."""
        if weights is None or self._weights_graph is None or self._weights_graph == self.path:
            return weights
        from ..checkpoint.single_file import with_own_constants
        from ..graph import Graph

        old = Graph.load(self._weights_graph, load_external=False)
        own = {n for n in old.initializer_names if old.has_data(n)}
        names = set(self.graph.initializer_names)
        refs = {n: weights.ref(n) for n in weights if n in names and n not in own}
        return with_own_constants(self.graph, refs, weights.sources[0] if weights.sources else Path(self.path))

    def run(self, feeds: Mapping[str, np.ndarray], outputs: tuple[str, ...] = (),
            select: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """Run with feeds cast to the graph's dtypes; the session for their shapes is compiled once.

        ``outputs``: a graph cut to these outputs (compiled apart: a text encoder's one hidden state). ``select``:
        these outputs of the whole graph's session, the others computed but not copied out (``Session.run``'s
        ``outputs=``); None: all but the ``hidden_outputs``."""
        inputs = self.inputs
        cast = {}
        for name, value in feeds.items():
            info = inputs.get(name)
            if info is None:
                raise ModelError(f"the {self.name} graph has no input {name!r}", where=str(self.path),
                                 fix=f"export it with the diffusers/Optimum names (it has: {', '.join(inputs)})")
            cast[name] = np.asarray(value, dtype=np.dtype(info.dtype), order="C")  # keeps 0-d arrays 0-d
        if select is None and not outputs and self.hidden_outputs is not None:
            select = tuple(name for name in self.outputs if not self.hidden_outputs(name))
        if self.record is not None:
            return self._dry_run(cast, outputs, select)
        session = self.session({k: v.shape for k, v in cast.items()}, outputs)
        return session.run(cast) if select is None else session.run(cast, outputs=select)

    def _dry_run(self, cast: dict[str, np.ndarray], outputs: tuple[str, ...],
                 select: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """Record the call; zeros in the shapes the graph infers for these inputs (nothing compiles or runs)."""
        assert self.record is not None
        if not self.record:
            self.first_use = next(_ORDER)  # the plan lists parts in the order they first run
        self.record.append(({k: (tuple(v.shape), str(v.dtype)) for k, v in cast.items()}, tuple(outputs)))
        dims = {k: tuple(v.shape) for k, v in cast.items()}
        key = tuple(sorted(dims.items()))
        cache = self.__dict__.setdefault("_dry_shapes", {})
        if key not in cache:
            cache[key] = self._dry_outputs(dims)
        out = {}
        for name, (dims_out, dtype) in cache[key].items():
            if outputs and name not in outputs or select is not None and name not in select:
                continue
            shape = tuple(int(d) if isinstance(d, int) else 1 for d in dims_out)
            out[name] = np.zeros(shape, dtype=np.dtype(dtype))
        return out

    def _dry_outputs(self, dims: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int | str, ...], str]]:
        """The outputs' shapes and dtypes at ``dims``, from the graph pinned to them (what an earlier process
        inferred for the same structure is read back: ``graph.pinned_store``)."""
        return {t.name: (tuple(d if isinstance(d, int) else str(d) for d in t.shape), str(t.dtype))
                for t in self.graph.with_shapes(dims).outputs}

    def update_weights(self, weights: Weights) -> None:
        """New values for some or all of the part's weights, in every compiled session now and every later one.

        ``weights`` may name only some initializers (a LoRA-merged block, say): the others keep their
        current values (the graph's own, or an earlier update's).
        """
        self.settle()
        base = self.weights if self.weights is not None else self.own_weights()
        merged = base.overlaid(weights)  # read on use: a checkpoint's tensors stay in its file
        for sess in self.sessions.values():
            sess.update_weights(self._fit_constants(merged))
        self.weights = merged

    def own_weights(self) -> Weights:
        """The part's weights before any checkpoint, LoRA or embedding: a single file's, or the graph's own."""
        from ..weights import Weights

        return self.default_weights if self.default_weights is not None else Weights.from_graph(self.graph)

    def release_scratch(self) -> None:
        """Its sessions' working memory handed back (``Session.release_scratch``); the graph and weights stay."""
        for sess in self.sessions.values():
            release = getattr(sess, "release_scratch", None)  # a StreamedSession's groups load and go anyway
            if release is not None:
                release()

    def close(self) -> None:
        self.settle()
        for sess in self.sessions.values():
            sess.close()
        self.sessions.clear()

    def retarget(self, path: Path) -> None:
        """Run another graph of the same parameters from now on (a single file's UNet with ControlNet
        inputs, and back): sessions close, the graph reloads; bound weights stay (same initializer names)."""
        if path == self.path:
            return
        self.settle()
        if self._weights_graph is None:
            self._weights_graph = self.path  # the bound weights carry this graph's own constants
        elif path == self._weights_graph:
            self._weights_graph = None
        log.info("%s: now %s", self.name, path.name)
        self.close()
        self._graph = None
        self.path = path


def backend_trait(backend: str, name: str, default: Any) -> Any:
    """The class attribute ``name`` of the backend registered as ``backend`` (``rebinds_as_compiled``,
    ``rebind_options``); ``default`` for a name not resolved yet (``auto``), the safe answer."""
    from ..plugins import get_registry

    return getattr(get_registry().backends.get(backend), name, default)


def rebind_options(backend: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that compile the program a rebound session runs (``Backend.rebind_options``), unless ``options``
    already set one of them (the caller's choice stands: then the base is compiled and the merged weights bound)."""
    offered = dict(backend_trait(backend, "rebind_options", {}) or {})
    return {} if any(k in options for k in offered) else offered
