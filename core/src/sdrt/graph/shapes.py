"""Shape pinning and shape inference for ``Graph.with_shapes`` (inference itself: ``protos``)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ModelError
from . import onnxfile, pinned_store
from .fold import fold_constants
from .protos import apply_inferred, copy_model, infer, skeleton

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from .graph import Graph

#: ONNX TensorProto data types of integer tensors (INT8..UINT64, BOOL): the ones shape arithmetic reads
_INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 9, 12, 13})


def _as_shape(name: str, value: Any) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in value)
    except (TypeError, ValueError):
        dims = ()
        ok = False
    else:
        ok = all(d >= 0 and not isinstance(v, bool) for d, v in zip(dims, value))
    if not ok:
        raise ModelError(f"shape for input {name!r} must be a sequence of non-negative ints, got {value!r}",
                         where="Graph.with_shapes", fix=f"pass e.g. {name}=(1, 4, 64, 64)")
    return dims


def pin_shapes(graph: Graph, spec: Mapping[str, Sequence[int] | int]) -> tuple[onnx.ModelProto, bytes]:
    """A copy of the graph's model with the given inputs/dims pinned and all shapes inferred, and the digest of
    what inference read (the pinned structure, ``_memo_key``): what the copy's shapes tell depends on it alone."""
    import onnx

    inputs = {i.name: i for i in graph.inputs}
    # inputs that declare no shape, not even a rank (their TensorInfo reads as a scalar's): any rank pins them
    unranked = {v.name for v in graph.model.graph.input
                if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")}
    dim_names = {d for i in graph.inputs for d in i.shape if isinstance(d, str)}
    bindings: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for key, value in spec.items():
        if key in inputs:
            info = inputs[key]
            dims = _as_shape(key, value)
            if len(dims) != len(info.shape) and key not in unranked:
                raise ModelError(f"input {key!r} has rank {len(info.shape)}, the pinned shape {dims} has rank {len(dims)}",
                                 where=f"Graph.with_shapes on {graph.name}", fix=f"give {len(info.shape)} dims: {info}")
            for want, got in zip(info.shape, dims):
                if isinstance(want, int) and want != got:
                    raise ModelError(f"input {key!r} has fixed shape {info.shape}; cannot pin it to {dims}",
                                     where=f"Graph.with_shapes on {graph.name}", fix="pin only the dynamic dims")
                if isinstance(want, str):
                    _bind(bindings, want, got, graph.name)
            shapes[key] = dims
        elif key in dim_names:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ModelError(f"dim {key!r} must be pinned to a non-negative int, got {value!r}",
                                 where=f"Graph.with_shapes on {graph.name}", fix=f"pass {key}=2")
            _bind(bindings, key, int(value), graph.name)
        else:
            raise ModelError(
                f"{key!r} is neither an input nor a symbolic dim of the graph",
                where=f"Graph.with_shapes on {graph.name}",
                fix="inputs: " + ", ".join(str(i) for i in graph.inputs)
                + (f"; dims: {', '.join(sorted(dim_names))}" if dim_names else ""),
            )
    model = copy_model(graph.model, value_info=False)
    for vi in list(model.graph.input) + list(model.graph.output):  # -1 is "any size" to the exporters that write it
        tt = vi.type.tensor_type
        for d in tt.shape.dim if vi.type.HasField("tensor_type") and tt.HasField("shape") else ():
            if d.HasField("dim_value") and d.dim_value < 0:
                d.ClearField("dim_value")
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        pinned = shapes.get(vi.name)
        if not tt.HasField("shape"):
            if pinned is not None and vi.type.HasField("tensor_type"):
                tt.shape.dim.extend(onnx.TensorShapeProto.Dimension(dim_value=d) for d in pinned)
            continue
        for k, d in enumerate(tt.shape.dim):
            if pinned is not None:
                d.dim_value = pinned[k]
            elif d.HasField("dim_param") and d.dim_param in bindings:
                d.dim_value = bindings[d.dim_param]
    # An output's dim names are the exporter's labels, not a promise: Optimum labels CLIP-with-projection's
    # text_embeds [batch_size, sequence_length], though it is [batch, projection_dim]. Inference decides the
    # outputs' dims; a label bound by the pins fills only a dim inference leaves open.
    labels = []
    for out in model.graph.output:
        tt = out.type.tensor_type
        labels.append([d.dim_param if d.HasField("dim_param") else None for d in tt.shape.dim]
                      if tt.HasField("shape") else [])
        for d in tt.shape.dim if tt.HasField("shape") else ():
            if d.HasField("dim_param") and d.dim_param in bindings:
                d.ClearField("dim_param")
    key = _memo_key(model)
    with _MEMO_LOCK:
        known = _INFERRED.get(key)
        if known is not None:
            _INFERRED.move_to_end(key)
    if known is None:  # an earlier process's (pinned_store)
        known = pinned_store.load(key)
        if known is not None:
            _remember(key, known)
    if known is not None:  # the same structure pinned the same way before (the plan, the dry run, the compile)
        _restore(model, known)
        return model, key
    inferred = infer(model, f"Graph.with_shapes on {graph.name}")
    apply_inferred(model, inferred)
    if not _all_static(model):
        _complete_with_folding(graph, model, inferred)
    for out, names in zip(model.graph.output, labels):
        tt = out.type.tensor_type
        if tt.HasField("shape") and len(tt.shape.dim) == len(names):
            for d, name in zip(tt.shape.dim, names):
                if not d.HasField("dim_value") and name in bindings:
                    d.dim_value = bindings[name]
    found = ([v.SerializeToString() for v in model.graph.value_info],
             [o.type.SerializeToString() for o in model.graph.output])
    _remember(key, found)
    pinned_store.store(key, found)
    return model, key


def _remember(key: bytes, found: tuple[list[bytes], list[bytes]]) -> None:
    with _MEMO_LOCK:
        _INFERRED[key] = found
        while len(_INFERRED) > _MEMO_SIZE:
            _INFERRED.popitem(last=False)


#: what pinning inferred, per pinned structure: a pipeline pins each part to each call's shapes for its memory
#: plan, its dry run and its compile (about 0.5 s each on the SD 1.5 UNet), from Graph objects of the same file;
#: kept on disk too, for the next process (pinned_store)
_INFERRED: OrderedDict[bytes, tuple[list[bytes], list[bytes]]] = OrderedDict()
_MEMO_SIZE = 64
_MEMO_LOCK = threading.Lock()  # pipelines of a server may pin from several threads


def _memo_key(model: onnx.ModelProto) -> bytes:
    """A digest of everything inference and folding read: the inference skeleton (nodes, pinned inputs and
    outputs, small initializers' values, every other initializer's type and dims), which names are initializers
    (the skeleton lists a large one as an input: a graph fed that weight as an input has the same skeleton, but
    folding and the facts kept under this key, ``pinned_store.store_fact``, read it otherwise) and the values of the
    integer initializers folding may turn into shapes (up to folding's 1 MB)."""
    h = hashlib.blake2b(skeleton(model).SerializeToString(deterministic=True), digest_size=20)
    h.update(repr([t.name for t in model.graph.initializer]).encode())
    for t in model.graph.initializer:
        if t.data_type in _INT_TYPES and not onnxfile.uses_external(t) and 4096 < t.ByteSize() <= 1 << 20:
            h.update(t.SerializeToString(deterministic=True))
    return h.digest()


def _restore(model: onnx.ModelProto, known: tuple[list[bytes], list[bytes]]) -> None:
    import onnx

    infos, outputs = known
    del model.graph.value_info[:]
    for raw in infos:
        model.graph.value_info.add().ParseFromString(raw)
    for out, raw in zip(model.graph.output, outputs):
        out.type.CopyFrom(onnx.TypeProto.FromString(raw))


def _all_static(model: onnx.ModelProto) -> bool:
    infos = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
    for node in model.graph.node:
        for o in node.output:
            if o and (o not in infos or not _static(infos[o])):
                return False
    return True


def _static(vi: Any) -> bool:
    tt = vi.type.tensor_type
    return tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)


def _complete_with_folding(graph: Graph, model: onnx.ModelProto, inferred: onnx.ModelProto | None = None) -> None:
    """ONNX data propagation stops at some shape arithmetic (torch's ``c // heads`` is a Div).
    Fold a copy, where that arithmetic becomes constants, infer again, and copy the now static
    shapes back to the values of ``model`` (in place). ``model`` itself is not folded. ``inferred``: ``model``'s
    inference, which folding's first pass reads."""
    from onnx import helper

    try:
        folded = fold_constants(graph.derive(model), max_bytes=1 << 20, inferred=inferred)
    except ModelError:
        return
    known = {v.name: v for v in list(folded.graph.value_info) + list(folded.graph.output) if _static(v)}
    for t in folded.graph.initializer:  # values that folding turned into constants
        if t.name not in known:
            known[t.name] = helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
    have = {v.name: v for v in model.graph.value_info}
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for o in node.output:
            if o in known and o not in outputs and not (o in have and _static(have[o])):
                if o in have:
                    have[o].CopyFrom(known[o])
                else:
                    model.graph.value_info.append(known[o])
    for out in model.graph.output:
        if out.name in known and not _static(out):
            out.type.CopyFrom(known[out.name].type)


def _bind(bindings: dict[str, int], dim: str, value: int, where: str) -> None:
    if bindings.setdefault(dim, value) != value:
        raise ModelError(f"dim {dim!r} pinned to both {bindings[dim]} and {value}",
                         where=f"Graph.with_shapes on {where}", fix=f"use one value for {dim!r} on every input")
