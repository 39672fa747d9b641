"""ModelProto helpers shared by the graph transforms: copy without weights, the inference skeleton, inference.

Inference runs on a *skeleton* of the model: initializers above a few bytes
(and lazily mapped ones) are replaced by typed graph inputs, so inference
never serializes weights and works for models above 2 GB. Small initializers
stay, so constant shape tensors still propagate (``data_prop=True``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def with_arrays(model: onnx.ModelProto, arrays: Any) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers named in ``arrays`` hold those values (the others as they are)."""
    from onnx import numpy_helper

    m = copy_model(model, initializers=False)
    for t in model.graph.initializer:
        m.graph.initializer.append(numpy_helper.from_array(arrays[t.name], t.name) if t.name in arrays else t)
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
    """Run ONNX shape inference; return the inferred skeleton (value_info and outputs filled; its nodes are the
    inference's, not the model's). Ops ONNX has no inference for are typed by sdrt's own rules, so that everything
    after them keeps its shape: GroupNormalization (no inference at any opset) and onnxruntime's shape-keeping
    com.microsoft ops (``_SAME_AS_INPUT``) are read as Identity of their input, in one pass; FusedMatMul,
    Attention, MultiHeadAttention and EmbedLayerNormalization are typed from their inputs' inferred shapes
    (``_rule_types``), a round of inference after each."""
    from onnx import shape_inference

    sk = skeleton(model)
    _same_shape_as_identity(sk)
    try:
        out = shape_inference.infer_shapes(sk, check_type=True, strict_mode=True, data_prop=True)
        hinted: dict[str, Any] = {}
        for _ in range(64):  # a round per chain of such nodes; a hint is redone when its inputs' shapes sharpen
            hints = {v.name: v for v in _rule_types(out, redo=set(hinted))}
            if all(hinted.get(k) is not None and hinted[k].SerializeToString() == v.SerializeToString()
                   for k, v in hints.items()):
                break
            hinted.update(hints)
            del sk.graph.value_info[:]
            sk.graph.value_info.extend(hinted.values())
            out = shape_inference.infer_shapes(sk, check_type=True, strict_mode=True, data_prop=True)
        return out
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


#: com.microsoft (and ONNX) ops whose first output (and the listed others) has the shape and type of the first input
_SAME_AS_INPUT = {"GroupNormalization": (0,), "Gelu": (0,), "FastGelu": (0,), "BiasGelu": (0,), "QuickGelu": (0,),
                  "SkipLayerNormalization": (0, 3), "SkipSimplifiedLayerNormalization": (0, 3),
                  "SimplifiedLayerNormalization": (0,), "LayerNormalization": (0,), "BiasAdd": (0,),
                  "RotaryEmbedding": (0,), "GroupNorm": (0,), "SkipGroupNorm": (0,), "BiasDropout": (0,)}


def _same_shape_as_identity(sk: onnx.ModelProto) -> None:
    """In an inference skeleton, each node of ``_SAME_AS_INPUT`` (GroupNormalization, any other outside ONNX's own
    domain) becomes Identity of its first input for the outputs listed there (in place)."""
    from onnx import helper

    nodes = []
    for n in sk.graph.node:
        if n.op_type in _SAME_AS_INPUT and n.input and (n.op_type == "GroupNormalization" or n.domain not in ("", "ai.onnx")):
            nodes.extend(helper.make_node("Identity", [n.input[0]], [n.output[k]])
                         for k in _SAME_AS_INPUT[n.op_type] if k < len(n.output) and n.output[k])
        else:
            nodes.append(n)
    del sk.graph.node[:]
    sk.graph.node.extend(nodes)


def _rule_types(inferred: onnx.ModelProto, redo: set[str] | frozenset[str] = frozenset()) -> list[onnx.ValueInfoProto]:
    """Types for node outputs that ONNX's inference left without a shape (or that an earlier round typed: ``redo``),
    from the node's input shapes (see ``infer``); [] where no rule applies."""
    from onnx import TensorProto, helper

    g = inferred.graph
    known: dict[str, tuple[int, list[Any]]] = {}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        tt = v.type.tensor_type
        if v.type.HasField("tensor_type") and tt.HasField("shape") and tt.elem_type:
            known[v.name] = (tt.elem_type, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                            for d in tt.shape.dim])
    for t in g.initializer:
        known[t.name] = (t.data_type, list(t.dims))
    out: list[onnx.ValueInfoProto] = []

    def give(name: str, elem: int, dims: list[Any]) -> None:
        if name and (name not in known or name in redo):
            out.append(helper.make_tensor_value_info(name, elem, dims))
            known[name] = (elem, dims)

    def attr(n: Any, name: str, default: Any) -> Any:
        a = next((a for a in n.attribute if a.name == name), None)
        return default if a is None else helper.get_attribute_value(a)

    for n in g.node:
        if all(o in known and o not in redo for o in n.output if o) or not n.input or n.input[0] not in known:
            continue
        op, (elem, x) = n.op_type, known[n.input[0]]
        if op in ("FusedMatMul", "FusedGemm") and len(n.input) > 1 and n.input[1] in known:
            a, b = list(x), list(known[n.input[1]][1])
            if len(a) < 2 or len(b) < 2:
                continue
            if attr(n, "transA", 0):
                a[-2], a[-1] = a[-1], a[-2]
            if attr(n, "transB", 0):
                b[-2], b[-1] = b[-1], b[-2]
            batch = a[:-2] if len(a) >= len(b) else b[:-2]
            give(n.output[0], elem, [*batch, a[-2], b[-1]])
        elif op == "Attention" and n.domain == "com.microsoft" and len(n.input) > 1 and n.input[1] in known:
            w = known[n.input[1]][1]
            sizes = list(attr(n, "qkv_hidden_sizes", []) or [])
            hv = sizes[2] if len(sizes) == 3 else (w[-1] // 3 if isinstance(w[-1], int) else None)
            if len(x) == 3:
                give(n.output[0], elem, [x[0], x[1], hv])
        elif op == "MultiHeadAttention" and n.domain == "com.microsoft" and len(x) == 3:
            v = known.get(n.input[2])[1] if len(n.input) > 2 and n.input[2] in known else None
            give(n.output[0], elem, [x[0], x[1], v[-1] if v is not None and len(v) == 3 else x[2]])
        elif op == "EmbedLayerNormalization" and len(n.input) > 2 and n.input[2] in known and len(x) == 2:
            word = known[n.input[2]]
            give(n.output[0], word[0], [x[0], x[1], word[1][-1]])
            if len(n.output) > 1:
                give(n.output[1], TensorProto.INT32, [x[0]])
    return out
