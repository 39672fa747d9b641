"""ModelProto helpers shared by the graph transforms: copy without weights, the inference skeleton, inference.

Inference runs on a *skeleton* of the model: initializers above a few bytes
(and lazily mapped ones) are replaced by typed graph inputs, so inference
never serializes weights and works for models above 2 GB. Small initializers
stay, so constant shape tensors still propagate (``data_prop=True``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ModelError
from . import onnxfile

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: initializers up to this many bytes keep their values in the inference skeleton
SMALL_BYTES = 4096


def copy_model(model: onnx.ModelProto, *, initializers: bool = True, value_info: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` that can leave out initializers and value_info (so nothing big is copied)."""
    import onnx

    m = onnx.ModelProto()
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(m, f, getattr(model, f))
    m.opset_import.extend(model.opset_import)
    m.metadata_props.extend(model.metadata_props)
    m.functions.extend(model.functions)
    src, g = model.graph, m.graph
    g.name = src.name
    g.doc_string = src.doc_string
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.sparse_initializer.extend(src.sparse_initializer)
    if value_info:
        g.value_info.extend(src.value_info)
    if initializers:
        g.initializer.extend(src.initializer)
    return m


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its large initializers turned into typed inputs."""
    from onnx import helper

    m = copy_model(model, initializers=False, value_info=False)
    declared = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        if not onnxfile.uses_external(t) and t.ByteSize() <= SMALL_BYTES:
            m.graph.initializer.append(t)
        elif t.name not in declared:
            m.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m


def infer(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """Run ONNX shape inference; return the inferred skeleton (value_info and outputs filled)."""
    from onnx import shape_inference

    try:
        return shape_inference.infer_shapes(skeleton(model), check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        lines = [line for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
        more = f" (and {len(lines) - 1} more node(s) after it)" if len(lines) > 1 else ""  # an error is one line
        raise ModelError(
            f"shape inference failed: {lines[0]}{more}",
            where=where,
            fix="check the pinned shapes against the graph's inputs (graph.inputs), or re-export the model",
        ) from exc


def apply_inferred(model: onnx.ModelProto, inferred: onnx.ModelProto) -> None:
    """Copy inferred value_info and output types into ``model`` (in place)."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    del model.graph.value_info[:]
    model.graph.value_info.extend(v for v in inferred.graph.value_info if v.name not in inits | inputs)
    by_name = {o.name: o for o in inferred.graph.output}
    for out in model.graph.output:
        new = by_name.get(out.name)
        if new is not None and new.type.tensor_type.HasField("shape"):
            out.type.CopyFrom(new.type)
