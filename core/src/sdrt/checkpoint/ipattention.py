"""A UNet graph with IP-Adapter attention: each cross-attention layer attends to the image tokens too.

diffusers' ``IPAdapterAttnProcessor`` computes, in a cross-attention layer, the usual attention of the layer's
query over the text keys and values, plus ``scale * attention(query, to_k_ip(ip_tokens), to_v_ip(ip_tokens))``
(same heads, no mask), added before ``to_out``. Here the graph gets, per cross-attention layer ``k`` (its place in
diffusers' attention-processor order, as the adapter file numbers it), two inputs ``ip_adapter_{k}_key`` and
``ip_adapter_{k}_value`` ``[batch, image tokens, width]``: the pipeline computes ``to_k_ip`` / ``to_v_ip`` of the
image tokens (4 rows per image, a few small products) and folds the scale into the values
(``scale * softmax(q k^T) v = softmax(q k^T) (scale v)``). So the edited graph holds no adapter weight: one compiled
UNet serves every adapter file and scale, and the UNet's own weights bind as before.

Several adapters (diffusers' ``load_ip_adapter`` with lists, sd-webui-controlnet's several IP-Adapter units): one more
attention per layer per adapter, their outputs summed after the text attention's in the adapters' order. Adapter ``j``
past the first has the inputs ``ip_adapter_{k}_key_{j}`` / ``ip_adapter_{k}_value_{j}``, with its own token count
(``ip_tokens_{j}``: 4 for a base adapter, 16 for a Plus one).

The layers are found by name, in the two ways UNet exports carry them: initializer names
(``...attn2.to_q.weight``, the dynamo exporter and sdrt's shipped graphs) or node names
(``/unet/.../attn2/to_q/MatMul``, the TorchScript exporter and Optimum's exports, whose weights are anonymous).
The query is the ``to_q`` MatMul's output; the attention output is the ``to_out.0`` MatMul's data input.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..errors import ModelError

_LINEAR = ("to_q", "to_k", "to_v", "to_out.0")
#: an attention layer's q/k/v/out MatMul, by its weight's name or by its node's name (torch.onnx / Optimum exports);
#: ``{0}`` the layer's module name: attn2 (cross-attention) or attn1 (self-attention)
_BY_WEIGHT = r"^(?:unet\.)?(.*\.{0})\.(to_q|to_k|to_v|to_out\.0)\.weight$"
_BY_NODE = r"^/(?:unet/)?(.*/{0})/(to_q|to_k|to_v|to_out\.0)/MatMul$"


def processor_order(path: str) -> tuple:
    """Sort key of a module path in diffusers' ``attn_processors`` order: down blocks, up blocks, mid block, each by
    its indices."""
    group = {"down_blocks": 0, "up_blocks": 1, "mid_block": 2}.get(path.split(".")[0], 3)
    return (group, *(int(x) for x in re.findall(r"\.(\d+)(?=\.|$)", path)))


def graph_index(g: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[Any]]]:
    """``(initializers by name, producer node of each tensor, consumer nodes of each tensor)`` of graph ``g``."""
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return {t.name: t for t in g.initializer}, {o: n for n in g.node for o in n.output}, consumers


def matmul_weight(node: Any, inits: dict[str, Any], producer: dict[str, Any]) -> Any:
    """The initializer a MatMul ``node`` multiplies by (read through a Transpose), None when it is not one."""
    w = node.input[1]
    src = producer.get(w)
    if w not in inits and src is not None and src.op_type == "Transpose":
        w = src.input[0]
    return inits.get(w)


def value_info(name: str, dtype: int, shape: list[Any]) -> Any:
    """A graph input/output ``name`` of ``dtype`` whose dims are names (str), sizes (int) or a graph's own dims."""
    from onnx import helper

    vi = helper.make_tensor_value_info(name, dtype, None)
    for dim in shape:
        new = vi.type.tensor_type.shape.dim.add()
        if isinstance(dim, str):
            new.dim_param = dim
        elif isinstance(dim, int):
            new.dim_value = dim
        else:
            new.CopyFrom(dim)
    return vi


def attention_layers(model: Any, module: str = "attn2") -> dict[str, dict[str, Any]]:
    """``{module path: {linear: its MatMul node}}`` for every attention layer named ``module`` (``attn2``: the
    cross-attention, ``attn1``: the self-attention) the graph names, by node name or by weight name (through a
    Transpose)."""
    by_node, by_weight = re.compile(_BY_NODE.format(module)), re.compile(_BY_WEIGHT.format(module))
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    found: dict[str, dict[str, Any]] = {}
    for node in g.node:
        if node.op_type != "MatMul" or len(node.input) != 2:
            continue
        m = by_node.match(node.name)
        if m:
            path, lin = m[1].replace("/", "."), m[2]
        else:
            w = node.input[1]
            src = producer.get(w)
            if src is not None and src.op_type == "Transpose":
                w = src.input[0]
            m = by_weight.match(w)
            if not m:
                continue
            path, lin = m[1], m[2]
        found.setdefault(path, {})[lin] = node
    return found


def cross_layers(model: Any) -> dict[str, dict[str, Any]]:
    """``{attn2 module path: {linear: its MatMul node}}`` for every cross-attention layer the graph names."""
    return attention_layers(model, "attn2")


def processor_indices(paths: list[str]) -> dict[str, int]:
    """Each cross-attention layer's place in diffusers' attention-processor order (attn1 before it: odd places)."""
    return {p: 2 * i + 1 for i, p in enumerate(sorted(paths, key=processor_order))}


def input_names(k: int, j: int = 0) -> tuple[str, str]:
    """The key and value inputs of cross-attention layer ``k`` for adapter ``j`` (the first: no suffix)."""
    tail = f"_{j}" if j else ""
    return f"ip_adapter_{k}_key{tail}", f"ip_adapter_{k}_value{tail}"


def ip_attention_graph(model: Any, heads: Callable[[int], int], where: str, tokens: str = "ip_tokens",
                       adapters: int = 1) -> Any:
    """``model`` (an ``onnx.ModelProto`` of a UNet) with IP-Adapter attention in every cross-attention layer, in
    place, once per adapter (``adapters``, summed); ``heads(width)``: the layer's attention heads where the graph does not say them (the ``Reshape`` that
    splits its query into heads). Raises ``ModelError`` when the layers cannot be found."""
    from onnx import TensorProto, helper

    g = model.graph
    layers = cross_layers(model)
    whole = {p: nodes for p, nodes in layers.items() if all(lin in nodes for lin in ("to_q", "to_out.0"))}
    if not whole or len(whole) != len(layers):
        raise ModelError("the UNet graph's cross-attention layers cannot be found (its to_q / to_out MatMuls are not "
                         "named as diffusers names them, by initializer or node name)", where=where,
                         fix="use sdrt's shipped graphs (a single-file checkpoint) or an export that keeps diffusers' "
                             "names (torch.onnx / Optimum)")
    inits, producer, consumers = graph_index(g)
    batch = next((i.type.tensor_type.shape.dim[0] for i in g.input if i.name == "encoder_hidden_states"), None)
    order = processor_indices(list(whole))
    extra: dict[str, list[Any]] = {}  # to_out node name -> nodes to insert before it
    new_inputs = []

    for path, nodes in sorted(whole.items(), key=lambda kv: order[kv[0]]):
        k = order[path]
        q_node, out_node = nodes["to_q"], nodes["to_out.0"]
        w = matmul_weight(q_node, inits, producer)
        if w is None or len(w.dims) != 2 or w.dims[0] != w.dims[1]:
            raise ModelError(f"the UNet graph's {path}.to_q has no square weight sdrt can read", where=where,
                             fix="use sdrt's shipped graphs or a torch.onnx / Optimum export")
        width, dtype = int(w.dims[0]), w.data_type
        h = own_heads(q_node.output[0], consumers, producer, inits) or heads(width)
        if h <= 0 or width % h:
            raise ModelError(f"{path} is {width} wide, which {h} attention heads do not divide", where=where,
                             fix="check the UNet's config.json (attention_head_dim)")
        d = width // h
        t = f"/ip_adapter/{k}/"
        scale = helper.make_tensor(t + "scale", dtype, [], [1.0 / d ** 0.5])
        split = helper.make_tensor(t + "heads", TensorProto.INT64, [4], [0, 0, h, d])
        merge = helper.make_tensor(t + "merge", TensorProto.INT64, [3], [0, 0, width])
        q, total = q_node.output[0], out_node.input[0]
        added = [
            helper.make_node("Constant", [], [t + "scale_c"], value=scale),
            helper.make_node("Constant", [], [t + "heads_c"], value=split),
            helper.make_node("Constant", [], [t + "merge_c"], value=merge),
            helper.make_node("Reshape", [q, t + "heads_c"], [t + "q4"]),
            helper.make_node("Transpose", [t + "q4"], [t + "q"], perm=[0, 2, 1, 3]),
        ]
        for j in range(adapters):
            kname, vname = input_names(k, j)
            for name in (kname, vname):
                shape = [batch if batch is not None else "batch", f"{tokens}_{j}" if j else tokens, width]
                vi = helper.make_tensor_value_info(name, dtype, None)
                for dim in shape:
                    new = vi.type.tensor_type.shape.dim.add()
                    if isinstance(dim, str):
                        new.dim_param = dim
                    elif isinstance(dim, int):
                        new.dim_value = dim
                    else:
                        new.CopyFrom(dim)
                new_inputs.append(vi)
            a = t if not j else f"{t}{j}/"  # the first adapter's node names as before (one adapter: the same graph)
            added += [
                helper.make_node("Reshape", [kname, t + "heads_c"], [a + "k4"]),
                helper.make_node("Transpose", [a + "k4"], [a + "kt"], perm=[0, 2, 3, 1]),
                helper.make_node("Reshape", [vname, t + "heads_c"], [a + "v4"]),
                helper.make_node("Transpose", [a + "v4"], [a + "v"], perm=[0, 2, 1, 3]),
                helper.make_node("MatMul", [t + "q", a + "kt"], [a + "scores0"]),
                helper.make_node("Mul", [a + "scores0", t + "scale_c"], [a + "scores"]),
                helper.make_node("Softmax", [a + "scores"], [a + "probs"], axis=-1),
                helper.make_node("MatMul", [a + "probs", a + "v"], [a + "o4"]),
                helper.make_node("Transpose", [a + "o4"], [a + "o"], perm=[0, 2, 1, 3]),
                helper.make_node("Reshape", [a + "o", t + "merge_c"], [a + "ip"]),
                helper.make_node("Add", [total, a + "ip"], [a + "sum"]),
            ]
            total = a + "sum"
        extra[out_node.name or out_node.output[0]] = added
        out_node.input[0] = total
    nodes = list(g.node)
    del g.node[:]
    for node in nodes:
        g.node.extend(extra.get(node.name or node.output[0], []))
        g.node.append(node)
    g.input.extend(new_inputs)
    return model


def _constant(name: str, producer: dict[str, Any], inits: dict[str, Any]) -> Any:
    from onnx import numpy_helper

    if name in inits and not inits[name].external_data:
        return numpy_helper.to_array(inits[name])
    node = producer.get(name)
    if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def own_heads(q: str, consumers: dict[str, list[Any]], producer: dict[str, Any], inits: dict[str, Any]) -> int | None:
    """The heads the layer's own attention splits its query into: the third entry of the shape its ``Reshape``
    takes (``[batch, -1, heads, head_dim]``, a constant or a ``Concat`` of pieces, as both exporters write it); None
    when the graph does not say it so."""
    reshape = next((n for n in consumers.get(q, []) if n.op_type == "Reshape"), None)
    if reshape is None or len(reshape.input) < 2:
        return None
    shape = _constant(reshape.input[1], producer, inits)
    if shape is not None:
        flat = shape.reshape(-1)
        return int(flat[2]) if flat.size == 4 and flat[2] > 0 else None
    concat = producer.get(reshape.input[1])
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 4:
        return None
    piece = _constant(concat.input[2], producer, inits)
    return int(piece.reshape(-1)[0]) if piece is not None and piece.size == 1 and piece.reshape(-1)[0] > 0 else None


def layer_widths(model: Any) -> dict[int, int]:
    """``{processor place: width}`` of the cross-attention layers :func:`ip_attention_graph` feeds."""
    out = {}
    for name in (i.name for i in model.graph.input):
        m = re.match(r"ip_adapter_(\d+)_key$", name)
        if m:
            dims = next(i for i in model.graph.input if i.name == name).type.tensor_type.shape.dim
            out[int(m[1])] = int(dims[2].dim_value)
    return out
