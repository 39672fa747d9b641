"""A UNet's upsamplers sized by their skip connections, so that it runs at any multiple of 8 as diffusers does.

diffusers' UNet halves the latent once per down block but the last; on the way up each upsampler doubles it again,
and where a side was odd on the way down, torch passes the skip connection's size to the upsampler
(``forward_upsample_size``: ``F.interpolate(size=...)``). An ONNX export traced at a size that halves evenly
writes a ``Resize`` by a constant scale of 2 instead, so at any other multiple of 8 (520 pixels: a latent of 65,
halved to 33, 17 and 9) its output is one row or column longer than the skip it is concatenated with, and shape
inference fails: SD 1.x and 2.x then ran only at multiples of 64, SDXL at multiples of 32.

``skip_sized_upsampling`` points each such ``Resize`` at its skip's spatial size: ``sizes = Shape(x)[:2] ++
Shape(skip)[2:]``. At a size that halves evenly that is the scale's own output; at any other it is what
diffusers computes. The pattern is diffusers' ``Upsample2D`` as every exporter writes it: a nearest ``Resize``
whose only reader is a ``Conv``, whose output is the first input of a two-input ``Concat`` on the channel axis
(the next up block's first ResNet: ``torch.cat([hidden_states, res_hidden_states], dim=1)``). Pinning the shapes
makes the new nodes' values known (``Graph.with_shapes``; ``fold_constants`` turns them into a constant ``sizes``),
so a backend sees a Resize to a fixed size.

A torch.export graph whose latent dimensions are declared as a multiple (``8*h``) computes its attention reshapes
from ``h``: at another latent size those reshapes are wrong whatever the upsamplers do, so such a graph is left
alone and keeps its grid. sdrt's shipped UNet and ControlNet graphs (``sdrt/data/graphs``, for single files) are
exported with free latent sides from an odd example size, where torch itself sizes each upsampler by its skip: every
size is computed from the input's, the pattern holds, and they run at any multiple of 8.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: the metadata key a rewritten graph carries (its value: how many upsamplers were re-pointed)
SKIP_SIZED_KEY = "sdrt.skip_sized_upsamplers"
#: a dimension declared as a multiple (torch.export's ``8*h``, as sdrt's shipped graphs once were): the shape arithmetic
#: (attention's reshapes) is written for that multiple only, so re-pointing the upsamplers would not make other
#: sizes run, and such graphs are left as they are
_MULTIPLE = re.compile(r"\d+\*\w+")
#: the end of the name of the size tensor made for a re-pointed Resize
_SIZES = "/skip_size/sizes"


def skip_sized(model: onnx.ModelProto) -> int:
    """How many of ``model``'s upsamplers ``skip_sized_upsampling`` re-pointed (0: none, or not rewritten)."""
    for p in model.metadata_props:
        if p.key == SKIP_SIZED_KEY:
            return int(p.value) if p.value.isdigit() else 0
    return 0


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _skip_of(resize: Any, readers: dict[str, list[Any]]) -> str | None:
    """The skip tensor that ``resize``'s output meets after its conv, or None when the pattern does not hold."""
    after = readers.get(resize.output[0], [])
    if len(after) != 1 or after[0].op_type != "Conv" or after[0].domain not in ("", "ai.onnx"):
        return None
    conv = after[0]
    joins = [n for n in readers.get(conv.output[0], []) if n.op_type == "Concat"]
    if len(joins) != 1 or len(joins[0].input) != 2 or joins[0].input[0] != conv.output[0]:
        return None
    if _attr(joins[0], "axis", None) not in (1, -3):
        return None
    return joins[0].input[1]


def skip_sized_upsampling(model: onnx.ModelProto) -> tuple[int, int]:
    """Re-point ``model``'s upsamplers at their skips' sizes, in place (module docstring).

    Returns ``(re-pointed, nearest resizes)``: how many ``Resize`` nodes take their skip's size (those re-pointed
    before included: a second call changes nothing), of how many nearest ``Resize`` nodes the graph has. A graph
    with another pattern, below opset 11, or with an input dimension declared as a multiple (``8*h``: its reshapes
    assume it) is left as it is."""
    from onnx import TensorProto, helper

    if _opset(model) < 11:
        return 0, 0
    g = model.graph
    if any(_MULTIPLE.fullmatch(d.dim_param) for i in g.input if i.type.HasField("tensor_type")
           for d in i.type.tensor_type.shape.dim if d.HasField("dim_param")):
        return 0, sum(n.op_type == "Resize" for n in g.node)  # its shape arithmetic assumes that multiple
    readers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    taken = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    def const(base: str, values: list[int]) -> tuple[Any, str]:
        out = fresh(base)
        t = helper.make_tensor(out + "_value", TensorProto.INT64, [len(values)], values)
        return helper.make_node("Constant", [], [out], name=out, value=t), out

    nearest = rewritten = added = 0
    new_nodes: list[Any] = []
    for n in g.node:
        if n.op_type == "Resize" and n.domain in ("", "ai.onnx") and _attr(n, "mode", b"nearest") in (b"nearest",
                                                                                                     "nearest"):
            nearest += 1
            skip = _skip_of(n, readers)
            if len(n.input) == 4 and n.input[3].endswith(_SIZES):  # re-pointed before: counted, left as it is
                rewritten += 1
            elif skip is not None and len(n.input) >= 3:
                base = (n.name or n.output[0]) + "/skip_size"
                made = []
                x_shape, s_shape = fresh(base + "/x_shape"), fresh(base + "/skip_shape")
                made.append(helper.make_node("Shape", [n.input[0]], [x_shape], name=x_shape))
                made.append(helper.make_node("Shape", [skip], [s_shape], name=s_shape))
                parts = []
                for src, lo, hi, what in ((x_shape, 0, 2, "lead"), (s_shape, 2, 4, "spatial")):
                    c_lo, lo_name = const(f"{base}/{what}_start", [lo])
                    c_hi, hi_name = const(f"{base}/{what}_end", [hi])
                    out = fresh(f"{base}/{what}")
                    made += [c_lo, c_hi, helper.make_node("Slice", [src, lo_name, hi_name], [out], name=out)]
                    parts.append(out)
                sizes = fresh(base + "/sizes")
                made.append(helper.make_node("Concat", parts, [sizes], name=sizes, axis=0))
                new_nodes += made
                x = n.input[0]
                roi = n.input[1] if len(n.input) > 1 else ""
                del n.input[:]
                n.input.extend([x, roi, "", sizes])
                rewritten += 1
                added += 1
        new_nodes.append(n)
    if added:
        kept = []
        for node in new_nodes:  # copies: a node removed from a repeated field may not outlive it
            c = type(node)()
            c.CopyFrom(node)
            kept.append(c)
        del g.node[:]
        g.node.extend(kept)
        for p in list(model.metadata_props):
            if p.key == SKIP_SIZED_KEY:
                model.metadata_props.remove(p)
        model.metadata_props.add(key=SKIP_SIZED_KEY, value=str(rewritten))
    return rewritten, nearest
