"""Flux.1 ControlNets in diffusers' layout (``FluxControlNetModel``: InstantX, Shakker-Labs Union Pro), on graphs
derived from sdrt's shipped Flux transformer graphs, so the wheel grows by nothing.

A diffusers Flux ControlNet is a short Flux transformer: its own ``x_embedder``, time/text embeddings and
``context_embedder``, ``n`` double and ``m`` single blocks, plus ``controlnet_x_embedder`` (the packed control
latents, added to the embedded tokens), one zero-initialised linear per block (``controlnet_blocks.j``,
``controlnet_single_blocks.j``) and, for a union net, ``controlnet_mode_embedder`` (one token prepended to the
text, its id a copy of the first text id). Its outputs, times ``conditioning_scale``, are added by the Flux
transformer to the image tokens after its blocks: block ``k`` of ``N`` gets residual ``k // ceil(N / n)``.

Two graph edits, both made once and cached (``sdrt`` cache, ``graphs/``):

- :func:`controlnet_graph`: the ControlNet, cut from a Flux transformer graph with diffusers' parameter names
  (the shipped ``flux_dev_transformer``, or ``flux_schnell_transformer`` for a net without guidance embeddings):
  the first ``n`` double and ``m`` single blocks kept, ``controlnet_cond`` embedded and added after
  ``x_embedder``, the mode token concatenated after ``context_embedder``, one output per block
  (``controlnet_block_sample_j``, ``controlnet_single_block_sample_j``; a single block's covers the text tokens
  too, which the pipeline drops). ``conditioning_scale`` is applied by the pipeline.
- :func:`residual_graph`: the Flux transformer taking those residuals as inputs, an ``Add`` after each block's
  last residual ``Add`` (found from ``transformer_blocks.k.ff.net.2.bias`` and
  ``single_transformer_blocks.k.proj_out.bias``, so any export of diffusers' Flux transformer, Optimum's
  included, takes it). A single-block input covers text and image tokens (zeros on the text).

XLabs' Flux ControlNets (``double_blocks.N`` keys with ``controlnet_blocks`` and an ``input_hint_block``, or that
design in diffusers' names) take the control picture in pixels through the hint convolutions
:mod:`sdrt.checkpoint.xlabscontrolnet` adds in place of the latent embedding, and repeat their residuals over the
double blocks (``residual_graph(..., repeat=True)``).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelError

if TYPE_CHECKING:  # pragma: no cover
    import onnx

log = logging.getLogger("sdrt.checkpoint.fluxcontrolnet")

DOUBLE_IN, SINGLE_IN = "controlnet_block_sample_", "controlnet_single_block_sample_"
DOUBLE_OUT, SINGLE_OUT = DOUBLE_IN, SINGLE_IN
#: the shipped graph a net is cut from, by whether it has guidance embeddings (dev) or not (schnell)
BASES = {True: "flux_dev_transformer", False: "flux_schnell_transformer"}
_DOUBLE_BIAS = re.compile(r"(?:^|\.)transformer_blocks\.(\d+)\.ff\.net\.2\.bias$")
_CONTEXT_BIAS = re.compile(r"(?:^|\.)transformer_blocks\.(\d+)\.ff_context\.net\.2\.bias$")
_SINGLE_BIAS = re.compile(r"(?:^|\.)single_transformer_blocks\.(\d+)\.proj_out\.bias$")


@dataclass(frozen=True)
class FluxNetLayout:
    """What a diffusers Flux ControlNet file holds: its double and single block counts, the union modes (None:
    not a union net), guidance embeddings, the inner width and the packed input channels."""

    double: int
    single: int
    modes: int | None
    guidance: bool
    width: int
    in_channels: int = 64
    #: XLabs' design: the control picture in pixels through ``input_hint_block``, residuals repeated over the blocks
    hint: bool = False
    #: its keys in Black Forest Labs' names (XLabs' own files)
    bfl: bool = False

    @property
    def label(self) -> str:
        if self.hint:
            return (f"an XLabs Flux.1 ControlNet ({'XLabs' if self.bfl else 'diffusers'} layout, {self.double} double "
                    "blocks)")
        union = f", union of {self.modes} modes" if self.modes else ""
        return (f"a Flux.1 ControlNet (diffusers layout, {self.double} double + {self.single} single blocks{union})")


def is_flux(shapes: Mapping[str, Any]) -> bool:
    """True for a file of Flux ControlNet keys (diffusers' or XLabs')."""
    keys = list(shapes)
    diffusers = any(k.startswith("controlnet_x_embedder.") for k in keys) or (
        any(k.startswith("controlnet_blocks.") for k in keys) and any(k.startswith("transformer_blocks.")
                                                                      for k in keys))
    xlabs = any(k.startswith("double_blocks.") for k in keys) and any(k.startswith("controlnet_blocks.")
                                                                      for k in keys)
    return diffusers or xlabs


def layout(shapes: Mapping[str, tuple[int, ...]]) -> FluxNetLayout | str:
    """The layout of a Flux ControlNet file, or why sdrt cannot run it (a phrase: "a Flux ControlNet without ...")."""
    from . import xlabscontrolnet as xlabs

    keys = list(shapes)

    def count(prefix: str) -> int:
        found = {int(m[1]) for k in keys if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
        return max(found) + 1 if found else 0

    if xlabs.is_bfl(shapes) or xlabs.has_hint(shapes):
        why = xlabs.check(shapes)
        if why is not None:
            return why
        bfl = xlabs.is_bfl(shapes)
        key = "img_in.weight" if bfl else "x_embedder.weight"
        img = shapes.get(key)
        if img is None or len(img) != 2:
            return f"an XLabs-style Flux ControlNet without its image embedding ({key})"
        return FluxNetLayout(count("controlnet_blocks."), count("controlnet_single_blocks."), None,
                             any(k.startswith("guidance_in." if bfl else "time_text_embed.guidance_embedder.")
                                 for k in keys), int(img[0]), int(img[1]), hint=True, bfl=bfl)
    emb = shapes.get("controlnet_x_embedder.weight")
    if emb is None or len(emb) != 2:
        return "a Flux ControlNet without controlnet_x_embedder.weight (not diffusers' FluxControlNetModel)"
    modes = shapes.get("controlnet_mode_embedder.weight")
    return FluxNetLayout(count("controlnet_blocks."), count("controlnet_single_blocks."),
                         int(modes[0]) if modes is not None else None,
                         any(k.startswith("time_text_embed.guidance_embedder.") for k in keys), int(emb[0]),
                         int(emb[1]))


def unused_keys(net: FluxNetLayout) -> tuple[str, ...]:
    """Key prefixes of a net's file that no output depends on: with no single blocks, the text stream the last
    double block computes after its attention (diffusers computes it and nothing reads it)."""
    if net.single:
        return ()
    last = f"transformer_blocks.{net.double - 1}."
    return (last + "attn.to_add_out.", last + "ff_context.", last + "norm2_context.")


# ------------------------------------------------------------------------------------------------ graph edits
class _Index:
    """Producers and consumers of a graph's values."""

    def __init__(self, g: onnx.GraphProto) -> None:
        self.g = g
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def sole(self, value: str, op: str) -> Any:
        users = self.consumers.get(value, [])
        return users[0] if len(users) == 1 and users[0].op_type == op else None


def _chain_end(idx: _Index, name: str) -> str | None:
    """The value at the end of a block's gated residual: ``name`` (a bias) -> Add -> Mul -> Add (-> Clip)."""
    value = name
    cast = idx.sole(value, "Cast")
    if cast is not None:
        value = cast.output[0]
    bias = idx.sole(value, "Add")
    gate = idx.sole(bias.output[0], "Mul") if bias is not None else None
    res = idx.sole(gate.output[0], "Add") if gate is not None else None
    if res is None:
        return None
    clip = idx.sole(res.output[0], "Clip")
    return str(clip.output[0] if clip is not None else res.output[0])


def block_outputs(g: onnx.GraphProto, where: str, context: bool = False) -> tuple[list[str], list[str]]:
    """The values after each double and each single block of a Flux transformer graph (the block's residual
    ``Add``, or the ``Clip`` an fp16 export puts after it), in block order; ``context``: the double blocks'
    text stream instead of the single blocks'."""
    idx = _Index(g)
    found: dict[str, dict[int, str]] = {"double": {}, "single": {}, "context": {}}
    patterns = (("double", _DOUBLE_BIAS), ("context" if context else "single",
                                           _CONTEXT_BIAS if context else _SINGLE_BIAS))
    for t in [*g.initializer, *g.input]:
        for kind, pattern in patterns:
            m = pattern.search(t.name)
            if m is None:
                continue
            end = _chain_end(idx, t.name)
            if end is None:
                raise ModelError(f"the Flux transformer graph does not end its {kind} block {m[1]} as diffusers' "
                                 f"does ({t.name} -> Add -> Mul -> Add)", where=where,
                                 fix="use sdrt's shipped Flux graph (a single file) or an export of diffusers' "
                                     "FluxTransformer2DModel without graph optimizations")
            found[kind][int(m[1])] = end
    lists = []
    for kind in ("double", "context" if context else "single"):
        got = found[kind]
        if sorted(got) != list(range(len(got))):
            raise ModelError(f"the Flux transformer graph has {kind} blocks {sorted(got)}: some are missing",
                             where=where, fix="use sdrt's shipped Flux graph or a whole export")
        lists.append([got[k] for k in range(len(got))])
    if not lists[0]:
        raise ModelError("the graph has no Flux double blocks (no transformer_blocks.N.ff.net.2.bias)", where=where,
                         fix="pass a Flux.1 transformer graph")
    return lists[0], lists[1]


def residual_map(blocks: int, samples: int, repeat: bool = False) -> list[int]:
    """diffusers' ``FluxTransformer2DModel``: block ``k`` of ``blocks`` adds residual ``k // ceil(blocks / samples)``,
    or ``k % samples`` with ``repeat`` (``controlnet_blocks_repeat``: XLabs' nets)."""
    if samples <= 0:
        return []
    if repeat:
        return [k % samples for k in range(blocks)]
    interval = int(math.ceil(blocks / samples))
    return [k // interval for k in range(blocks)]


def _rewire(g: onnx.GraphProto, old: str, new: str, skip: Any) -> None:
    for n in g.node:
        if n is skip:
            continue
        for i, name in enumerate(n.input):
            if name == old:
                n.input[i] = new
    for o in g.output:
        if o.name == old:
            o.name = new  # pragma: no cover  (a block output is never a graph output)


def _value_info(name: str, elem: int, dims: list[Any]) -> Any:
    import onnx

    return onnx.helper.make_tensor_value_info(name, elem, dims)


def residual_graph(model: onnx.ModelProto, double: int, single: int, where: str = "transformer",
                   repeat: bool = False) -> onnx.ModelProto:
    """``model`` (a Flux transformer, edited in place and returned) with the residual inputs of a ControlNet of
    ``double`` and ``single`` block samples: ``controlnet_block_sample_j`` ``[batch, image, width]`` added after
    the double blocks, ``controlnet_single_block_sample_j`` ``[batch, text + image, width]`` (zeros on the text)
    after the single blocks, each block taking the one diffusers' interval rule gives it (``repeat``: the double
    blocks take them in turn, as for XLabs' nets)."""
    import onnx

    g = model.graph
    dbl, sgl = block_outputs(g, where)
    hidden = next((i for i in g.input if i.name == "hidden_states"), None)
    elem = hidden.type.tensor_type.elem_type if hidden is not None else onnx.TensorProto.FLOAT
    bias = next((t for t in g.initializer if t.name.endswith("x_embedder.bias") and len(t.dims) == 1), None)
    width: Any = int(bias.dims[0]) if bias is not None else "width"
    for outs, n, prefix in ((dbl, double, DOUBLE_IN), (sgl, single, SINGLE_IN)):
        used: set[int] = set()
        for k, j in enumerate(residual_map(len(outs), n, repeat and prefix == DOUBLE_IN)):
            name = f"{prefix}{j}"
            value = outs[k]
            added = f"{value}_plus_{name}"
            node = onnx.helper.make_node("Add", [value, name], [added], name=f"sdrt_controlnet_add_{prefix}{k}")
            _rewire(g, value, added, None)
            # after the producer of ``value``: keep the node list topologically sorted
            pos = next(i for i, nd in enumerate(g.node) if value in nd.output)
            g.node.insert(pos + 1, node)
            used.add(j)
        for j in sorted(used):
            tokens = "image" if prefix == DOUBLE_IN else "tokens"
            g.input.append(_value_info(f"{prefix}{j}", elem, ["batch", tokens, width]))
    return model


def _external(name: str, dims: list[int], elem: int, location: str) -> Any:
    """A weight-free initializer: a typed, shaped reference to a file that does not exist (``sdrt strip``'s)."""
    import onnx

    t = onnx.TensorProto(name=name, data_type=elem, dims=dims)
    entry = t.external_data.add()
    entry.key, entry.value = "location", location
    t.data_location = onnx.TensorProto.EXTERNAL
    return t


def controlnet_graph(model: onnx.ModelProto, net: FluxNetLayout, where: str = "flux transformer graph"
                     ) -> onnx.ModelProto:
    """The weight-free graph of a Flux ControlNet of ``net``'s layout, cut from ``model`` (a weight-free Flux
    transformer graph with diffusers' parameter names; edited in place and returned)."""
    import onnx

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    idx = _Index(g)
    for name in ("x_embedder.bias", "context_embedder.bias", "x_embedder.weight"):
        if name not in inits or name not in idx.consumers:
            raise ModelError(f"the {where} has no {name} (it is not a Flux transformer graph with diffusers' "
                             "parameter names)", where=where, fix="use sdrt's shipped Flux graph")
    dbl, sgl = block_outputs(g, where)
    _, ctx = block_outputs(g, where, context=True)
    if net.double > len(dbl) or net.single > len(sgl) or net.double < 1:
        raise ModelError(f"the ControlNet has {net.double} double and {net.single} single blocks, more than the "
                         f"{where}'s {len(dbl)} and {len(sgl)}", where=where, fix="use a Flux.1 ControlNet")
    width = int(inits["x_embedder.bias"].dims[0])
    if width != net.width:
        raise ModelError(f"its blocks are {net.width} wide and the Flux transformer's {width}", where=where,
                         fix="use a ControlNet made for Flux.1")
    elem = inits["x_embedder.bias"].data_type
    location = next((p.value for p in model.metadata_props if p.key == "sdrt.stripped_weights"),
                    "flux_controlnet.weights.safetensors")
    new: list[Any] = []
    nodes: list[Any] = []

    def linear(x: str, prefix: str, shape_in: int, out: str) -> None:
        new.extend([_external(f"{prefix}.weight", [width, shape_in], elem, location),
                    _external(f"{prefix}.bias", [width], elem, location)])
        nodes.extend([onnx.helper.make_node("Transpose", [f"{prefix}.weight"], [f"{prefix}.weight_T"], perm=[1, 0]),
                      onnx.helper.make_node("MatMul", [x, f"{prefix}.weight_T"], [f"{prefix}.mm"]),
                      onnx.helper.make_node("Add", [f"{prefix}.mm", f"{prefix}.bias"], [out])])

    # the control latents (XLabs: the control picture through the hint convolutions), embedded and added to the
    # embedded image tokens
    x_out = next(n for n in idx.consumers["x_embedder.bias"] if n.op_type == "Add").output[0]
    if net.hint:
        from .xlabscontrolnet import hint_nodes

        hint_inits, hint = hint_nodes(width, lambda name, dims: _external(name, dims, elem, location),
                                      "sdrt_cond_embedded")
        new.extend(hint_inits)
        nodes.extend(hint)
        g.input.append(_value_info("controlnet_cond", elem, ["batch", 3, "height", "width"]))
    else:
        linear("controlnet_cond", "controlnet_x_embedder", net.in_channels, "sdrt_cond_embedded")
        g.input.append(_value_info("controlnet_cond", elem, ["batch", "image", net.in_channels]))
    nodes.append(onnx.helper.make_node("Add", [x_out, "sdrt_cond_embedded"], ["sdrt_x_with_cond"]))
    _rewire(g, x_out, "sdrt_x_with_cond", None)
    hidden = next(i for i in g.input if i.name == "hidden_states")
    hidden.type.tensor_type.shape.dim[2].dim_value = net.in_channels
    for t in g.initializer:
        if t.name == "x_embedder.weight":
            t.dims[1] = net.in_channels
    if net.modes:  # union: the mode's embedding is the first text token
        c_out = next(n for n in idx.consumers["context_embedder.bias"] if n.op_type == "Add").output[0]
        new.append(_external("controlnet_mode_embedder.weight", [net.modes, width], elem, location))
        nodes.extend([onnx.helper.make_node("Gather", ["controlnet_mode_embedder.weight", "controlnet_mode"],
                                            ["sdrt_mode_emb"], axis=0),
                      onnx.helper.make_node("Concat", ["sdrt_mode_emb", c_out], ["sdrt_text_with_mode"], axis=1)])
        _rewire(g, c_out, "sdrt_text_with_mode", None)
        g.input.append(_value_info("controlnet_mode", onnx.TensorProto.INT64, ["batch", 1]))
        # the text length the blocks split the joint sequence at is now one more: read it from the joined text
        for n in g.node:
            if n.op_type == "Shape" and n.input[0] == "encoder_hidden_states":
                attrs = {a.name: a.i for a in n.attribute}
                if attrs.get("start", 0) < 0 or attrs.get("end", 3) > 2 or "end" not in attrs:
                    raise ModelError(f"the {where} reads the whole shape of encoder_hidden_states", where=where,
                                     fix="use sdrt's shipped Flux graph")
                n.input[0] = "sdrt_text_with_mode"
        for i in g.input:
            if i.name == "txt_ids":
                i.type.tensor_type.shape.dim[0].dim_param = "text_with_mode"
    if net.double < len(dbl):  # the single blocks read the last kept double block's image and text streams
        for value, kept in ((dbl[-1], dbl[net.double - 1]), (ctx[-1], ctx[net.double - 1])):
            _rewire(g, value, kept, None)
        dbl = dbl[:net.double]
    outputs = []
    for outs, n, prefix, block in ((dbl, net.double, DOUBLE_OUT, "controlnet_blocks"),
                                   (sgl, net.single, SINGLE_OUT, "controlnet_single_blocks")):
        for j in range(n):
            linear(outs[j], f"{block}.{j}", width, f"{prefix}{j}")
            outputs.append(_value_info(f"{prefix}{j}", elem, ["batch", "image" if prefix == DOUBLE_OUT else "tokens",
                                                              width]))
    g.node.extend(nodes)
    g.initializer.extend(new)
    del g.output[:]
    g.output.extend(outputs)
    _toposort(g)
    _prune(g)
    for prop in model.metadata_props:
        if prop.key == "sdrt.architecture":
            prop.value = f"flux_controlnet_{net.double}x{net.single}" + (f"_union{net.modes}" if net.modes else "") \
                + ("_xlabs" if net.hint else "")
    return model


def _prune(g: onnx.GraphProto) -> None:
    """Drop the nodes, initializers and inputs no output needs."""
    needed = {o.name for o in g.output}
    keep = []
    for n in reversed(g.node):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
            for a in n.attribute:  # subgraphs (If/Loop) read outer values
                for sub in ([a.g] if a.g.node else []) + list(a.graphs):
                    needed.update(i for s in sub.node for i in s.input)
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    inits = [t for t in g.initializer if t.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)
    inputs = [i for i in g.input if i.name in needed]
    del g.input[:]
    g.input.extend(inputs)
    vis = [v for v in g.value_info if v.name in needed]
    del g.value_info[:]
    g.value_info.extend(vis)


def _toposort(g: onnx.GraphProto) -> None:
    """Order the nodes so that each comes after the producers of its inputs."""
    ready = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    pending = list(g.node)
    order = []
    while pending:
        rest = []
        for n in pending:
            outer = set()
            for a in n.attribute:
                for sub in ([a.g] if a.g.node else []) + list(a.graphs):
                    produced = {o for s in sub.node for o in s.output} | {i.name for i in sub.input}
                    outer |= {i for s in sub.node for i in s.input if i not in produced}
            if all(i in ready for i in n.input) and all(i in ready for i in outer):
                order.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise ModelError("the derived Flux ControlNet graph has a cycle", where=g.name or "graph",
                             fix="report this: the graph edit went wrong")
        pending = rest
    del g.node[:]
    g.node.extend(order)


# ------------------------------------------------------------------------------------------------ cached files
def edit_sources() -> list[str]:
    """The source files of the code that cuts a net's graph (this module and :mod:`sdrt.checkpoint.xlabscontrolnet`):
    part of the cached graph's key, so a changed edit is made again, not read from an older sdrt's cache."""
    from . import xlabscontrolnet

    return [__file__, xlabscontrolnet.__file__]


def derived_controlnet_graph(base: Path, net: FluxNetLayout) -> Path:
    """The cached weight-free ControlNet graph of ``net``'s layout cut from the graph file ``base`` (keyed by the
    file, the layout and :func:`edit_sources`)."""
    from .graphs import derived_graph

    tag = f"{net.double}x{net.single}" + (f"u{net.modes}" if net.modes else "") + f"c{net.in_channels}" + \
        ("h" if net.hint else "")
    return derived_graph(base, "flux_controlnet", tag, lambda model: controlnet_graph(model, net, base.name),
                         edit_sources(), "Flux ControlNet", "leave graph= out (sdrt's shipped Flux graph), or pass a "
                                                            "weight-free graph (sdrt strip)")
