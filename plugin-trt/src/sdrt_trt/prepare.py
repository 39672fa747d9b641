"""From the core's Graph and Weights to what TensorRT-RTX parses: weights resolved, shapes pinned,
precision applied, and every node known to crash the builder refused."""

from __future__ import annotations

import functools
import hashlib
import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sdrt.errors import UnsupportedGraph

from .options import OptionError, Options

if TYPE_CHECKING:  # pragma: no cover
    from sdrt.graph import Graph
    from sdrt.weights import Weights

log = logging.getLogger("sdrt.trt")

_HALF = {"fp16": "float16", "bf16": "bfloat16"}


@dataclass
class Prepared:
    """The graph TensorRT-RTX parses, and what keys its engine."""

    graph: Graph
    #: sha256 of the graph without its weight data, after pinning and precision
    graph_digest: str
    #: dynamic input name -> (min, opt, max) shapes
    profiles: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)

    @functools.cached_property
    def weights_digest(self) -> str:
        """blake2b of every initializer's bytes, in name order: what an engine file that holds its weights
        is checked against (computed only for engine files; the compile cache keys weights by identity)."""
        return _weights_digest(self.graph)

    def weight_arrays(self) -> dict[str, np.ndarray]:
        """Every initializer in the type the engine holds it (what a stripped engine is refit with)."""
        return self.graph.initializer_arrays()


def resolve(graph: Graph, weights: Weights | None) -> dict[str, np.ndarray]:
    """Every initializer of ``graph`` with its final array: the core's ``resolve_weights``."""
    from sdrt import resolve_weights

    return dict(resolve_weights(graph, weights))


def _baked(graph: Graph, arrays: Mapping[str, np.ndarray]) -> Graph:
    """``graph`` with ``arrays`` as its inline initializers."""
    from onnx import numpy_helper

    from sdrt.graph import Graph

    model = graph.model_without(graph.initializer_names)
    del model.graph.initializer[:]
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(arrays[n]), n) for n in graph.initializer_names)
    return Graph(model, graph.path, base_dir=graph.base_dir)


def check_known_crashes(graph: Graph) -> None:
    """Nodes that crash TensorRT-RTX 1.7 (the process, not a clean error) are refused before any parse."""
    crashing: dict[str, list[str]] = {}
    if graph.opset >= 23:
        for i, n in enumerate(graph.model.graph.node):
            if n.op_type == "Attention" and n.domain in ("", "ai.onnx"):
                crashing.setdefault("Attention (opset 23+)", []).append(n.name or f"#{i}")
    if crashing:
        raise UnsupportedGraph("the graph has nodes that crash TensorRT-RTX 1.7's builder (segfault)",
                               unsupported=crashing, where=graph.name,
                               fix="export with opset 17-22 so attention is written as MatMul/Softmax/MatMul, or "
                                   "use another backend (sdrt-ggml, sdrt-openvino)")


def _digest(graph: Graph) -> str:
    skeleton = graph.model_without(graph.initializer_names)
    h = hashlib.sha256(skeleton.SerializeToString())
    for name, info in graph.initializer_info().items():  # names, dtypes and shapes, not the data
        h.update(f"{name}|{info.dtype}|{info.shape}".encode())
    return h.hexdigest()


def _weights_digest(graph: Graph) -> str:
    h = hashlib.blake2b(digest_size=32)
    for name, arr in sorted(graph.initializer_arrays().items()):
        a = np.ascontiguousarray(arr)
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(struct.pack("<Q", a.nbytes))
        h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()


def _profiles(graph: Graph, opts: Options) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    inputs = {i.name: i for i in graph.inputs}
    unknown = sorted(set(opts.profiles) - set(inputs))
    if unknown:
        raise OptionError(f"profiles name inputs the graph does not have: {', '.join(unknown)}", where=graph.name,
                          fix="name graph inputs: " + ", ".join(inputs))
    dynamic = [i for i in inputs.values() if not i.is_static]
    missing = [str(i) for i in dynamic if i.name not in opts.profiles]
    if missing:
        raise OptionError(f"inputs with dynamic dims need a shape: {'; '.join(missing)}", where=graph.name,
                          fix="pass shapes={'batch': 1, ...} to pin them, or profiles={name: [min, opt, max]}")
    out = {}
    for name, triple in opts.profiles.items():
        info = inputs[name]
        for shape in triple:
            if len(shape) != len(info.shape) or any(isinstance(d, int) and d != s for d, s in zip(info.shape, shape)):
                raise OptionError(f"profile shape {list(shape)} does not fit input {info}", where=graph.name,
                                  fix="give shapes of the input's rank that keep its fixed dims")
        out[name] = triple
    return out


def prepare(graph: Graph, weights: Weights | None, opts: Options,
            arrays: Mapping[str, np.ndarray] | None = None) -> Prepared:
    """Resolve the weights into the graph (or take ``arrays``, resolved already), pin its shapes, convert its
    precision, refuse known crashes."""
    from sdrt.precision import to_half

    check_known_crashes(graph)
    g = _baked(graph, resolve(graph, weights) if arrays is None else arrays)
    if opts.shapes:
        g = g.with_shapes(dict(opts.shapes))
    profiles = _profiles(g, opts)
    if opts.precision in _HALF:
        g = to_half(g, _HALF[opts.precision])
    return Prepared(g, _digest(g), profiles)


