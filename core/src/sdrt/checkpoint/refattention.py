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
from .ipattention import attention_layers, graph_index, matmul_weight, own_heads, processor_order, value_info


def self_layers(model: Any) -> dict[str, dict[str, Any]]:
    """``{attn1 module path: {linear: its MatMul node}}`` for every self-attention layer the graph names."""
    return attention_layers(model, "attn1")


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


_WRITTEN = re.compile(r"ref_bank_\d+$|ref_gn_(mean|var)_\d+$")


def written(name: str) -> bool:
    """Whether ``name`` is an output the write pass reads (a layer's bank, a block's mean or variance): the read
    pass leaves them uncopied (``Part.hidden_outputs``)."""
    return _WRITTEN.match(name) is not None


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
    inits, producer, consumers = graph_index(g)
    batch = next((i.type.tensor_type.shape.dim[0] for i in g.input if i.name == "sample"), None)
    places = layer_places(list(whole))
    extra: dict[str, list[Any]] = {}
    new_inputs, new_outputs = [], []

    for path, nodes in sorted(whole.items(), key=lambda kv: places[kv[0]]):
        k = places[path]
        q_node, k_node, v_node, out_node = (nodes[x] for x in ("to_q", "to_k", "to_v", "to_out.0"))
        w = matmul_weight(q_node, inits, producer)
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
        new_outputs.append(value_info(bank_out, dtype, [rows, f"ref_self_tokens_{k}", width]))
        new_inputs.append(value_info(bank_in, dtype, [rows, f"ref_tokens_{k}", width]))
        new_inputs.append(value_info(mix, dtype, [rows, 1, 1]))
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


# ---------------------------------------------------------------- reference_adain: the blocks' statistics
#
# The extension's ``hacked_group_norm_forward`` wraps whole LDM blocks (not GroupNorm layers): the middle block,
# the input blocks of every level but the first (SD 1.x's 4, 5, 7, 8, 10, 11; SDXL's 4, 5, 7, 8; a downsampler is
# a block of its own and is not wrapped) and the first two thirds of the output blocks (SD 1.x's 0 to 7 of 12,
# SDXL's 0 to 5 of 9; the extension lists those numbers, which the test UNets' two levels do not have: two thirds
# is the rule both lists follow). The write pass keeps each block output's mean and variance over its height and width (per row and
# channel); the read pass replaces the block's output ``x`` by ``(x - mean) / std * std_ref + mean_ref`` (the
# standard deviations at least sqrt(1e-6)), mixed as the attention is. Here block ``i`` (its place in the
# extension's list: the middle block, then those input blocks, then those output blocks) gets the outputs
# ``ref_gn_mean_{i}`` / ``ref_gn_var_{i}`` ``[batch, channels, 1, 1]`` and the inputs ``ref_gn_mean_in_{i}``,
# ``ref_gn_var_in_{i}`` (the written statistics, averaged over the references) and ``ref_gn_mix_{i}``
# ``[batch, 1, 1, 1]``; every reader of the block's output reads ``x + mix * (adain(x) - x)`` instead.

_BIAS = re.compile(r"^(?:unet\.)?((down_blocks|up_blocks)\.(\d+)\.(resnets|attentions|upsamplers)\.(\d+)|"
                   r"mid_block\.(resnets)\.(\d+))\.(conv2|proj_out|conv)\.bias$")
EPS = 1e-6


def gn_names(i: int) -> tuple[str, str, str, str, str]:
    """Block ``i``'s mean and variance outputs and its mean, variance and mix inputs."""
    return f"ref_gn_mean_{i}", f"ref_gn_var_{i}", f"ref_gn_mean_in_{i}", f"ref_gn_var_in_{i}", f"ref_gn_mix_{i}"


def _module_outputs(model: Any) -> dict[str, tuple[str, str]]:
    """``{module path: (its output tensor, its last layer's bias)}`` of the UNet's resnets (after the residual and the output scale),
    transformers (after the residual) and upsamplers, found from their last layer's bias (``conv2``, ``proj_out``,
    ``conv``), a name every exporter keeps."""
    g = model.graph
    consumers = graph_index(g)[2]
    found: dict[str, tuple[str, str]] = {}
    for node in g.node:
        for name in node.input:
            m = _BIAS.match(name)
            if not m:
                continue
            path, kind = m[1], m[4] or m[6]
            out = node.output[0]
            walked = [node]
            if kind != "upsamplers":
                for _ in range(8):  # through the reshapes back to NCHW, to the residual's Add
                    nxt = consumers.get(out, [])
                    if len(nxt) != 1:
                        break
                    out = nxt[0].output[0]
                    walked.append(nxt[0])
                    if nxt[0].op_type == "Add":
                        break
                after = consumers.get(out, [])
                if kind == "resnets" and len(after) == 1 and after[0].op_type == "Div":  # output_scale_factor
                    out = after[0].output[0]
            # ONNX Runtime's fused layers (NhwcConv's channels-last output, SkipGroupNorm, BiasAdd) and casts hide
            # the block's NCHW output in its own dtype: such a block is not found
            if any(n.domain not in ("", "ai.onnx") or n.op_type == "Cast" for n in walked):
                continue
            found[path] = (out, name)
    return found


def gn_blocks(model: Any) -> list[tuple[str, str, float, str]]:
    """The blocks the extension wraps, in its order: ``(module path, output tensor, write threshold, bias)``, the
    threshold as its ``gn_weight`` (times 2): the middle block 0, the input blocks ``2 (1 - w / n)``, the output
    blocks ``2 w / n``."""
    outs = _module_outputs(model)

    def levels(kind: str) -> dict[int, list[int]]:
        got: dict[int, set[int]] = {}
        for p in outs:
            m = re.match(rf"{kind}\.(\d+)\.(resnets|attentions)\.(\d+)$", p)
            if m:
                got.setdefault(int(m[1]), set()).add(int(m[3]))
        return {b: sorted(js) for b, js in sorted(got.items())}

    def block(kind: str, b: int, j: int, last: bool) -> str | None:
        up = f"{kind}.{b}.upsamplers.0"
        if last and up in outs:
            return up
        for sub in ("attentions", "resnets"):
            if f"{kind}.{b}.{sub}.{j}" in outs:
                return f"{kind}.{b}.{sub}.{j}"
        return None

    downs, ups = levels("down_blocks"), levels("up_blocks")
    mids = sorted(int(re.match(r"mid_block\.resnets\.(\d+)$", p)[1]) for p in outs
                  if re.match(r"mid_block\.resnets\.(\d+)$", p))
    if not downs or not ups or not mids:
        return []
    inputs = [block("down_blocks", b, j, False) for b in list(downs)[1:] for j in downs[b]]
    outputs = [block("up_blocks", b, j, j == ups[b][-1]) for b in ups for j in ups[b]]
    outputs = outputs[:2 * len(outputs) // 3]
    if any(p is None for p in inputs + outputs):
        return []
    mid = f"mid_block.resnets.{mids[-1]}"
    blocks = [(mid, *outs[mid], 0.0)]
    blocks += [(p, *outs[p], 2 * (1.0 - w / len(inputs))) for w, p in enumerate(inputs) if p is not None]
    blocks += [(p, *outs[p], 2 * (w / len(outputs))) for w, p in enumerate(outputs) if p is not None]
    return [(p, out, threshold, bias) for p, out, bias, threshold in blocks]


def adain_graph(model: Any, where: str) -> Any:
    """``model`` with the extension's AdaIN on the outputs of the blocks :func:`gn_blocks` finds, in place."""
    from onnx import TensorProto, helper

    g = model.graph
    blocks = gn_blocks(model)
    if not blocks:
        raise ModelError("the UNet graph's blocks cannot be found (its resnets' conv2, transformers' proj_out and "
                         "upsamplers' conv biases are not named as diffusers names them, or ONNX Runtime's optimizer "
                         "fused those layers)", where=where,
                         fix="use sdrt's shipped graphs (a single-file checkpoint) or an export that keeps diffusers' "
                             "names (torch.onnx / Optimum)")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    dtype = next((i.type.tensor_type.elem_type for i in g.input if i.name == "sample"), TensorProto.FLOAT)
    batch = next((i.type.tensor_type.shape.dim[0] for i in g.input if i.name == "sample"), None)
    rows = batch if batch is not None else "batch"
    producer = {o: k for k, n in enumerate(g.node) for o in n.output}
    after: dict[int, list[Any]] = {}
    new_inputs, new_outputs = [], []

    def info(name: str, shape: list[Any]) -> Any:
        return value_info(name, dtype, shape)

    def mean(x: str, out: str, t: str) -> list[Any]:
        if opset >= 18:
            return [helper.make_node("Constant", [], [t + "axes"],
                                     value=helper.make_tensor(t + "axes_v", TensorProto.INT64, [2], [2, 3])),
                    helper.make_node("ReduceMean", [x, t + "axes"], [out], keepdims=1)]
        return [helper.make_node("ReduceMean", [x], [out], axes=[2, 3], keepdims=1)]

    inits = {t.name: list(t.dims) for t in g.initializer}
    inits.update({i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input})
    renamed: dict[str, str] = {}
    for i, (_, x, _, bias) in enumerate(blocks):
        mean_out, var_out, mean_in, var_in, mix = gn_names(i)
        dims = inits.get(bias, [])
        channels: Any = int(dims[0]) if len(dims) == 1 and dims[0] > 0 else f"ref_gn_channels_{i}"
        new_outputs += [info(mean_out, [rows, channels, 1, 1]), info(var_out, [rows, channels, 1, 1])]
        new_inputs += [info(mean_in, [rows, channels, 1, 1]), info(var_in, [rows, channels, 1, 1]),
                       info(mix, [rows, 1, 1, 1])]
        t = f"/ref_gn/{i}/"
        nodes = mean(x, t + "mean", t)
        nodes += [helper.make_node("Identity", [t + "mean"], [mean_out]),
                  helper.make_node("Sub", [x, t + "mean"], [t + "centred"]),
                  helper.make_node("Mul", [t + "centred", t + "centred"], [t + "sq"])]
        nodes += mean(t + "sq", t + "var", t + "v")
        nodes += [helper.make_node("Identity", [t + "var"], [var_out]),
                  helper.make_node("Constant", [], [t + "eps"], value=helper.make_tensor(t + "eps_v", dtype, [], [EPS])),
                  # max(v, eps) as relu(v - eps) + eps: a Max of two runtime tensors is what ggml cannot lower
                  helper.make_node("Sub", [t + "var", t + "eps"], [t + "var_d"]),
                  helper.make_node("Relu", [t + "var_d"], [t + "var_r"]),
                  helper.make_node("Add", [t + "var_r", t + "eps"], [t + "var_e"]),
                  helper.make_node("Sqrt", [t + "var_e"], [t + "std"]),
                  helper.make_node("Sub", [var_in, t + "eps"], [t + "ref_var_d"]),
                  helper.make_node("Relu", [t + "ref_var_d"], [t + "ref_var_r"]),
                  helper.make_node("Add", [t + "ref_var_r", t + "eps"], [t + "ref_var_e"]),
                  helper.make_node("Sqrt", [t + "ref_var_e"], [t + "ref_std"]),
                  helper.make_node("Div", [t + "centred", t + "std"], [t + "norm"]),
                  helper.make_node("Mul", [t + "norm", t + "ref_std"], [t + "scaled"]),
                  helper.make_node("Add", [t + "scaled", mean_in], [t + "adain"]),
                  helper.make_node("Sub", [t + "adain", x], [t + "delta"]),
                  helper.make_node("Mul", [t + "delta", mix], [t + "mixed"]),
                  helper.make_node("Add", [x, t + "mixed"], [t + "out"])]
        after.setdefault(producer[x], []).extend(nodes)
        renamed[x] = t + "out"
    own = {id(n) for ns in after.values() for n in ns}
    nodes_ = list(g.node)
    for n in nodes_:  # every reader of a block's output reads the mixed one
        if id(n) in own:
            continue
        for k, name in enumerate(n.input):
            if name in renamed:
                n.input[k] = renamed[name]
    del g.node[:]
    for k, node in enumerate(nodes_):
        g.node.append(node)
        g.node.extend(after.get(k, []))
    for o in g.output:
        if o.name in renamed:
            raise ModelError(f"the UNet graph's block {o.name} is a graph output", where=where,
                             fix="use sdrt's shipped graphs or a torch.onnx / Optimum export of the UNet")
    g.input.extend(new_inputs)
    g.output.extend(new_outputs)
    return model


def gn_layers(inputs: dict[str, Any]) -> list[int]:
    """The blocks of a graph's AdaIN inputs (empty: a graph without them)."""
    return sorted(int(m[1]) for name in inputs if (m := re.match(r"ref_gn_mix_(\d+)$", name)))
