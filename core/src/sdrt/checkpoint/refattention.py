"""A UNet graph whose self-attention layers can read a reference: sd-webui-controlnet's ``reference_only``.

The extension's ``hacked_basic_transformer_inner_forward`` runs every transformer block's self-attention
(``attn1``) in two ways. On the *write* pass (the UNet run on the reference latent) it keeps the block's
normalized input ``norm1(x)`` in a bank. On the *read* pass (the UNet run on the latent being denoised) the
block's keys and values are taken of ``concat([norm1(x), *bank], tokens)``, so the image attends to the reference
as well as to itself; the unconditional rows mix that with their plain self-attention by the style fidelity.

Here one graph does both. For each self-attention layer ``k`` (its place in diffusers' attention-processor order,
as :mod:`sdrt.checkpoint.ipattention` numbers layers: attn1 layers take the even places) it gets

- an output ``ref_bank_{k}`` ``[batch, tokens, width]``: the layer's normalized input (the ``to_q`` MatMul's
  input; the write pass reads it);
- inputs ``ref_bank_in_{k}`` ``[batch, ref_tokens_k, width]`` (the bank, several references' concatenated) and
  ``ref_mix_{k}`` ``[batch, 1, 1]``; the attention output before ``to_out`` becomes
  ``plain + mix * (banked - plain)``, ``banked`` being the attention of the layer's own query over the keys and
  values (the layer's own ``to_k`` / ``to_v`` weights) of ``concat([norm1(x), bank])``. A mix of 0 leaves the
  layer exactly as it was (the write pass, a layer no reference writes to, a step outside the window).

The graph holds no new weight: the UNet's bind as before, and one compiled graph serves every reference, weight and
style fidelity. Layers are found by name as :func:`sdrt.checkpoint.ipattention.cross_layers` finds the
cross-attention ones (initializer names of the dynamo exporter and sdrt's shipped graphs; node names of the
TorchScript exporter and Optimum).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..errors import ModelError
from .ipattention import own_heads, processor_order

_BY_WEIGHT = re.compile(r"^(?:unet\.)?(.*\.attn1)\.(to_q|to_k|to_v|to_out\.0)\.weight$")
_BY_NODE = re.compile(r"^/(?:unet/)?(.*/attn1)/(to_q|to_k|to_v|to_out\.0)/MatMul$")


def self_layers(model: Any) -> dict[str, dict[str, Any]]:
    """``{attn1 module path: {linear: its MatMul node}}`` for every self-attention layer the graph names."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    found: dict[str, dict[str, Any]] = {}
    for node in g.node:
        if node.op_type != "MatMul" or len(node.input) != 2:
            continue
        m = _BY_NODE.match(node.name)
        if m:
            path, lin = m[1].replace("/", "."), m[2]
        else:
            w = node.input[1]
            src = producer.get(w)
            if src is not None and src.op_type == "Transpose":
                w = src.input[0]
            m = _BY_WEIGHT.match(w)
            if not m:
                continue
            path, lin = m[1], m[2]
        found.setdefault(path, {})[lin] = node
    return found


def layer_places(paths: list[str]) -> dict[str, int]:
    """Each self-attention layer's place in diffusers' attention-processor order (attn2 after it: even places)."""
    return {p: 2 * i for i, p in enumerate(sorted(paths, key=processor_order))}


def ldm_order(path: str) -> tuple:
    """Sort key of a layer in the order sd-webui-controlnet walks the LDM UNet's modules (``torch_dfs``): input
    blocks, middle block, output blocks, each by its indices."""
    group = {"down_blocks": 0, "mid_block": 1, "up_blocks": 2}.get(path.split(".")[0], 3)
    return (group, *(int(x) for x in re.findall(r"\.(\d+)(?=\.|$)", path)))


def names(k: int) -> tuple[str, str, str]:
    """Layer ``k``'s bank output, bank input and mix input."""
    return f"ref_bank_{k}", f"ref_bank_in_{k}", f"ref_mix_{k}"


def reference_graph(model: Any, heads: Callable[[int], int], where: str) -> Any:
    """``model`` (an ``onnx.ModelProto`` of a UNet) with reference attention in every self-attention layer, in
    place; ``heads(width)``: the layer's heads where the graph does not say them. Raises ``ModelError`` when the
    layers cannot be found."""
    from onnx import TensorProto, helper

    g = model.graph
    layers = self_layers(model)
    whole = {p: n for p, n in layers.items() if all(lin in n for lin in ("to_q", "to_k", "to_v", "to_out.0"))}
    if not whole or len(whole) != len(layers):
        raise ModelError("the UNet graph's self-attention layers cannot be found (its attn1 to_q / to_k / to_v / "
                         "to_out MatMuls are not named as diffusers names them, by initializer or node name)",
                         where=where, fix="use sdrt's shipped graphs (a single-file checkpoint) or an export that "
                                          "keeps diffusers' names (torch.onnx / Optimum)")
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    batch = next((i.type.tensor_type.shape.dim[0] for i in g.input if i.name == "sample"), None)
    places = layer_places(list(whole))
    extra: dict[str, list[Any]] = {}
    new_inputs, new_outputs = [], []

    def weight_of(node: Any) -> Any:
        w = node.input[1]
        src = producer.get(w)
        if w not in inits and src is not None and src.op_type == "Transpose":
            w = src.input[0]
        return inits.get(w)

    def info(name: str, dtype: int, shape: list[Any]) -> Any:
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

    for path, nodes in sorted(whole.items(), key=lambda kv: places[kv[0]]):
        k = places[path]
        q_node, k_node, v_node, out_node = (nodes[x] for x in ("to_q", "to_k", "to_v", "to_out.0"))
        w = weight_of(q_node)
        if w is None or len(w.dims) != 2 or w.dims[0] != w.dims[1]:
            raise ModelError(f"the UNet graph's {path}.to_q has no square weight sdrt can read", where=where,
                             fix="use sdrt's shipped graphs or a torch.onnx / Optimum export")
        if not (q_node.input[0] == k_node.input[0] == v_node.input[0]):
            raise ModelError(f"the UNet graph's {path} is not a self-attention (its query, key and value read "
                             "different inputs)", where=where, fix="use sdrt's shipped graphs or a torch.onnx / "
                                                                   "Optimum export of the UNet")
        width, dtype = int(w.dims[0]), w.data_type
        h = own_heads(q_node.output[0], consumers, producer, inits) or heads(width)
        if h <= 0 or width % h:
            raise ModelError(f"{path} is {width} wide, which {h} attention heads do not divide", where=where,
                             fix="check the UNet's config.json (attention_head_dim)")
        d = width // h
        bank_out, bank_in, mix = names(k)
        rows = batch if batch is not None else "batch"
        new_outputs.append(info(bank_out, dtype, [rows, f"ref_self_tokens_{k}", width]))
        new_inputs.append(info(bank_in, dtype, [rows, f"ref_tokens_{k}", width]))
        new_inputs.append(info(mix, dtype, [rows, 1, 1]))
        t = f"/ref_attn/{k}/"
        x, q, plain = q_node.input[0], q_node.output[0], out_node.input[0]
        added = [
            helper.make_node("Identity", [x], [bank_out]),
            helper.make_node("Constant", [], [t + "scale_c"],
                             value=helper.make_tensor(t + "scale", dtype, [], [1.0 / d ** 0.5])),
            helper.make_node("Constant", [], [t + "heads_c"],
                             value=helper.make_tensor(t + "heads", TensorProto.INT64, [4], [0, 0, h, d])),
            helper.make_node("Constant", [], [t + "merge_c"],
                             value=helper.make_tensor(t + "merge", TensorProto.INT64, [3], [0, 0, width])),
            helper.make_node("Concat", [x, bank_in], [t + "ctx"], axis=1),
            helper.make_node("MatMul", [t + "ctx", k_node.input[1]], [t + "key"]),
            helper.make_node("MatMul", [t + "ctx", v_node.input[1]], [t + "value"]),
            helper.make_node("Reshape", [q, t + "heads_c"], [t + "q4"]),
            helper.make_node("Transpose", [t + "q4"], [t + "q"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [t + "key", t + "heads_c"], [t + "k4"]),
            helper.make_node("Transpose", [t + "k4"], [t + "kt"], perm=[0, 2, 3, 1]),
            helper.make_node("Reshape", [t + "value", t + "heads_c"], [t + "v4"]),
            helper.make_node("Transpose", [t + "v4"], [t + "v"], perm=[0, 2, 1, 3]),
            helper.make_node("MatMul", [t + "q", t + "kt"], [t + "scores0"]),
            helper.make_node("Mul", [t + "scores0", t + "scale_c"], [t + "scores"]),
            helper.make_node("Softmax", [t + "scores"], [t + "probs"], axis=-1),
            helper.make_node("MatMul", [t + "probs", t + "v"], [t + "o4"]),
            helper.make_node("Transpose", [t + "o4"], [t + "o"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [t + "o", t + "merge_c"], [t + "banked"]),
            helper.make_node("Sub", [t + "banked", plain], [t + "delta"]),
            helper.make_node("Mul", [t + "delta", mix], [t + "mixed"]),
            helper.make_node("Add", [plain, t + "mixed"], [t + "out"]),
        ]
        extra[out_node.name or out_node.output[0]] = added
        out_node.input[0] = t + "out"
    nodes_ = list(g.node)
    del g.node[:]
    for node in nodes_:
        g.node.extend(extra.get(node.name or node.output[0], []))
        g.node.append(node)
    g.input.extend(new_inputs)
    g.output.extend(new_outputs)
    return model


def bank_layers(inputs: dict[str, Any]) -> dict[int, int]:
    """``{layer place: width}`` of a graph's reference inputs (empty: a graph without reference attention)."""
    out = {}
    for name, info in inputs.items():
        m = re.match(r"ref_bank_in_(\d+)$", name)
        if m:
            out[int(m[1])] = int(info.shape[-1])
    return out
