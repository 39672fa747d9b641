"""A UNet graph that takes a T2I-Adapter's features: ``t2i_adapter_residual_0..3`` added inside its down blocks.

diffusers' ``UNet2DConditionModel`` (``down_intrablock_additional_residuals``) adds feature ``k`` to the hidden
state where its down path reaches the feature's size, in place, so the sum flows on and is also the skip the up
blocks read: SD 1.x / 2.x after each level's last resnet + attention (before the level's downsampler; the last
level has none), SDXL after level 0 (its downsampler included: level 0 has no cross-attention), after levels 1 and 2's
last resnet + attention, and the fourth after the mid block. sd-webui-controlnet adds them at the same places
(``input_blocks`` 2, 5, 8, 11 on SD; 3, 5, 8 and the middle block's output on SDXL).

The places are found by structure, not by name, so diffusers / Optimum exports and sdrt's own graphs alike are
edited: the up blocks' skip concatenations (a two-input ``Concat`` on the channel axis that a ``Conv``, the resnet's
shortcut, reads) name the skips in reverse; a ControlNet residual added to a skip (``down_block_additional_residual_*``)
is looked through to the skip itself, and the first concatenation's other input is the mid block's output.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError

__all__ = ["FEATURE", "adapter_graph", "skip_tensors"]

FEATURE = "t2i_adapter_residual_"
#: where each feature goes, as an index into the down path's skips (conv_in's output first); "mid": after the mid block
PLACES = {"sd": (2, 5, 8, 11), "sdxl": (3, 5, 8, "mid")}
_SKIPS = {"sd": 12, "sdxl": 9}
_FIX = "use a UNet with diffusers' block layout (SD 1.x / 2.x: 4 levels, SDXL: 3, two resnets a level)"


def skip_tensors(model: Any, where: str) -> tuple[list[str], str, list[Any]]:
    """(the down path's skip tensors in order, the mid block's output (as the up path reads it), the concat nodes)."""
    from .ipattention import graph_index

    g = model.graph
    inits, producer, consumers = graph_index(g)
    inputs = {i.name for i in g.input}
    concats = []
    for n in g.node:
        if n.op_type != "Concat" or len(n.input) != 2:
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), None)
        if axis not in (1, -3):
            continue
        if any(c.op_type == "Conv" and c.input[0] == n.output[0] for c in consumers.get(n.output[0], [])):
            concats.append(n)

    def through_residual(t: str) -> str:
        p = producer.get(t)
        if p is not None and p.op_type == "Add":
            for a, b in ((0, 1), (1, 0)):
                if p.input[b] in inputs and p.input[b].startswith(("down_block_additional_residual",
                                                                    "mid_block_additional_residual")):
                    return p.input[a]
        return t

    skips = [through_residual(c.input[1]) for c in reversed(concats)]
    mid = concats[0].input[0] if concats else ""
    return skips, mid, concats


def adapter_graph(model: Any, layout: str, where: str) -> Any:
    """``model`` (an ``onnx.ModelProto`` of a UNet) with the inputs ``t2i_adapter_residual_0..3`` ([batch, channels,
    h, w], the skip's dtype) added at diffusers' places (``layout``: "sd" or "sdxl"), in place. ``ModelError`` when the
    down path cannot be found."""
    from onnx import TensorProto, helper

    from .ipattention import graph_index, value_info

    g = model.graph
    skips, mid, concats = skip_tensors(model, where)
    if len(skips) != _SKIPS[layout]:
        raise ModelError(f"the UNet graph's up path reads {len(skips)} skip connections, and a "
                         f"{'SDXL' if layout == 'sdxl' else 'SD 1.x / 2.x'} UNet has {_SKIPS[layout]}: sdrt cannot find "
                         "where a T2I-Adapter's features go", where=where, fix=_FIX)
    inits, producer, consumers = graph_index(g)
    batch = next((i.type.tensor_type.shape.dim[0] for i in g.input if i.name in ("sample", "x")), "batch")
    # the dtype of the skips: the shortcut Conv's weight's (float32 where it is not an initializer)
    conv = next((c for c in consumers.get(concats[0].output[0], []) if c.op_type == "Conv"), None)
    w = inits.get(conv.input[1]) if conv is not None else None
    dtype = w.data_type if w is not None else TensorProto.FLOAT
    position = {n.name or n.output[0]: i for i, n in enumerate(g.node)}
    extra: dict[int, list[Any]] = {}
    for k, place in enumerate(PLACES[layout]):
        name = f"{FEATURE}{k}"
        g.input.append(value_info(name, dtype, [batch, f"t2i_c{k}", f"t2i_h{k}", f"t2i_w{k}"]))
        out = f"/t2i_adapter/{k}/sum"
        if place == "mid":
            node = concats[0]
            add = helper.make_node("Add", [mid, name], [out], name=f"/t2i_adapter/{k}/Add")
            node.input[0] = out
            extra.setdefault(position[node.name or node.output[0]], []).append(add)
            continue
        t = skips[place]
        src = producer.get(t)
        if src is None:
            raise ModelError(f"the UNet graph's skip {t} has no producer", where=where, fix=_FIX)
        add = helper.make_node("Add", [t, name], [out], name=f"/t2i_adapter/{k}/Add")
        for c in consumers.get(t, []):
            for i, x in enumerate(c.input):
                if x == t:
                    c.input[i] = out
        extra.setdefault(position[src.name or src.output[0]] + 1, []).append(add)
    nodes = list(g.node)
    del g.node[:]
    for i, node in enumerate(nodes):
        g.node.extend(extra.get(i, []))
        g.node.append(node)
    g.node.extend(extra.get(len(nodes), []))
    return model
