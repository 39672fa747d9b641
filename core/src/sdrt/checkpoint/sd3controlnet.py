"""SD3 / SD3.5 ControlNets (diffusers' ``SD3ControlNetModel``), on graphs derived from sdrt's shipped SD3 / SD3.5
transformer graphs (the wheel grows by nothing). Two designs:

- **with a text stream** (InstantX's SD3 ControlNets and their kind): a short SD3 transformer, its own
  ``pos_embed``, time/text embeddings and ``context_embedder``, ``n`` joint blocks;
- **image-only** (Stability's SD3.5 Large ControlNets, ``sd3.5_large_controlnet_{canny,depth,blur}``, in their
  single-file keys or diffusers' conversion): ``n`` blocks that see the image tokens only (no text stream, no q/k
  norm, diffusers' ``SD3SingleTransformerBlock``), the image tokens embedded by the *model's* ``pos_embed``.

Both add ``pos_embed_input`` (a 2x2 patch embedding of the control image's VAE latents) to the embedded image
tokens and have one linear per block (``controlnet_blocks.j``). Their outputs, times the conditioning scale, are
added by ``SD3Transformer2DModel`` to the image tokens after each block that keeps its text stream (all but the
last): block ``k`` of ``N`` gets residual ``int(k / (N / n))``.

- :func:`controlnet_graph`: the net, cut from an SD3 transformer graph with diffusers' parameter names (the
  shipped ``sd3_medium_transformer``, ``sd35_medium_transformer`` or ``sd35_large_transformer``, by the net's
  width and q/k norm, :func:`base_of`): the first ``n`` blocks
  kept, ``controlnet_cond`` patch-embedded and added after ``pos_embed``, one output per block
  (``controlnet_block_sample_j``); for an image-only net each block's joint attention is made image-only
  (:func:`_image_only`) and the embedded tokens are an input (``EMBEDDED``). The scale is applied by the pipeline.
- :func:`residual_graph`: the SD3 transformer taking those residuals as inputs, an ``Add`` after each block's
  last image residual ``Add`` (found from ``transformer_blocks.k.ff.net.2.bias``, so a torch export of diffusers'
  transformer takes it too), and for image-only nets the output ``EMBEDDED`` (its ``pos_embed``'s tokens).

alimama's inpainting nets (``alimama-creative/SD3-Controlnet-Inpainting``: a text-stream net whose control input
is the masked picture's latents and the mask, 17 channels, diffusers' ``extra_conditioning_channels=1``) take the
same graph with a 17-channel ``pos_embed_input``; the pipeline feeds them as diffusers'
``StableDiffusion3ControlNetInpaintingPipeline`` does (``sdrt.pipelines.sd3controlnet``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelError
from .fluxcontrolnet import _external, _Index, _prune, _rewire, _toposort, _value_info
from .fluxcontrolnet import block_outputs as _flux_block_outputs

if TYPE_CHECKING:  # pragma: no cover
    import onnx

log = logging.getLogger("sdrt.checkpoint.sd3controlnet")

SAMPLE = "controlnet_block_sample_"
#: the image tokens after the model's ``pos_embed``: an output of the edited transformer, an input of an image-only net
EMBEDDED = "sdrt_embedded_hidden_states"
#: the shipped graph a net is cut from, by its width and whether its blocks have SD 3.5's q/k norm: InstantX's SD3
#: Medium nets (none) are cut from SD 3 Medium's graph, the SD 3.5 Medium ones (1536 wide, q/k norm) from SD 3.5
#: Medium's; Stability's image-only SD3.5 Large nets (no q/k norm in their blocks) from SD 3.5 Large's
BASES = {(1536, False): "sd3_medium_transformer", (1536, True): "sd35_medium_transformer",
         (2432, True): "sd35_large_transformer"}
EXAMPLE = "a diffusers SD3ControlNetModel with a text stream made for this model's architecture"


@dataclass(frozen=True)
class SD3NetLayout:
    """What a diffusers SD3 ControlNet file holds: its block count, width, control input channels and whether
    the pipeline feeds it zero pooled projections and unshifted control latents
    (``force_zeros_for_pooled_projection``, from the folder's config.json; True when there is none, as
    diffusers' default)."""

    blocks: int
    width: int
    in_channels: int = 16
    zero_pooled: bool = True
    #: Stability's SD3.5 Large design: blocks that see the image tokens only (no text stream, no q/k norm), the
    #: image tokens embedded by the model's own ``pos_embed`` (diffusers' ``use_pos_embed: false``)
    image_only: bool = False

    @property
    def inpaint(self) -> bool:
        """alimama's inpainting design: the control input is the masked picture's 16 latent channels and the mask."""
        return self.in_channels == 17

    @property
    def label(self) -> str:
        if self.inpaint:
            return (f"an SD3 inpainting ControlNet (alimama's design: {self.blocks} joint blocks, {self.width} wide, "
                    "the mask as a 17th input channel)")
        if self.image_only:
            return (f"an SD3.5 Large ControlNet (Stability's design: {self.blocks} image-only blocks, "
                    f"{self.width} wide)")
        return f"an SD3 ControlNet (diffusers layout, {self.blocks} joint blocks, {self.width} wide)"


def is_sd3(shapes: Mapping[str, Any]) -> bool:
    """True for a file of SD3 ControlNet keys (diffusers' or Stability's single file): a patch embedding of the
    control latents, ``pos_embed_input.proj`` (XLabs' Flux nets have a ``pos_embed_input`` linear)."""
    return any(k.startswith("pos_embed_input.proj.") for k in shapes)


def layout(shapes: Mapping[str, tuple[int, ...]], config: Mapping[str, Any] | None = None) -> SD3NetLayout | str:
    """The layout of an SD3 ControlNet file (diffusers' names or Stability's single file), or why sdrt cannot
    run it (a phrase: "an SD3 inpainting ControlNet ...")."""
    keys = list(shapes)
    emb = shapes.get("pos_embed_input.proj.weight")
    if emb is None or len(emb) != 4:
        return "an SD3 ControlNet without pos_embed_input.proj.weight [width, channels, 2, 2]"
    found = {int(m[1]) for k in keys if (m := re.match(r"controlnet_blocks\.(\d+)\.", k))}
    image_only = not any(k.startswith("context_embedder.") for k in keys)
    if int(emb[1]) not in (16, 17) or (int(emb[1]) == 17 and image_only):
        return (f"an SD3 ControlNet of {emb[1]} control input channels{' without a text stream' if image_only else ''}"
                ", a design sdrt has no graph for (it runs 16: the control image's latents, and 17 with a text "
                "stream: alimama's inpainting nets, the masked picture's latents and the mask)")
    if image_only and any(k.startswith(("pos_embed.", "transformer_blocks.0.attn.norm_q.")) for k in keys):
        return ("an SD3 ControlNet without a text stream and with its own pos_embed or q/k norm, a design sdrt "
                "has no graph for")
    # diffusers' default is True; Stability's files (no config) and their diffusers conversion say False
    zero = (not image_only) if config is None else bool(config.get("force_zeros_for_pooled_projection", True))
    if int(emb[1]) == 17:  # StableDiffusion3ControlNetInpaintingPipeline gives an inpainting net zeros, whatever its config
        zero = True
    return SD3NetLayout(max(found) + 1 if found else 0, int(emb[0]), int(emb[1]), zero, image_only)


def stability_sources(keys: list[str]) -> dict[str, Any] | None:
    """``{diffusers name: Source}`` for Stability's single-file SD3.5 Large ControlNet keys (``attn.qkv``,
    ``attn.proj``, ``mlp.fc1``/``fc2``, ``adaLN_modulation.1``, as diffusers' convert_sd3_controlnet_to_diffusers
    reads them), None for a file in diffusers' names."""
    from .ldm import Source

    if not any(re.match(r"transformer_blocks\.\d+\.attn\.qkv\.", k) for k in keys):
        return None
    renames = {"attn.proj.": "attn.to_out.0.", "mlp.fc1.": "ff.net.0.proj.", "mlp.fc2.": "ff.net.2.",
               "adaLN_modulation.1.": "norm1.linear."}
    out: dict[str, Any] = {}
    for k in keys:
        m = re.match(r"(transformer_blocks\.\d+\.)(.*)$", k)
        if m is None:
            out[k] = Source(k)
            continue
        head, rest = m[1], m[2]
        if rest.startswith("attn.qkv."):
            for i, name in enumerate(("to_q", "to_k", "to_v")):
                out[f"{head}attn.{name}.{rest.rsplit('.', 1)[1]}"] = Source(k, f"part:{i}/3")
            continue
        new = next((head + v + rest[len(o):] for o, v in renames.items() if rest.startswith(o)), None)
        out[new or k] = Source(k)
    return out


def folder_config(path: Path) -> dict[str, Any] | None:
    """The ``config.json`` beside a net's weights file (a diffusers folder), or None."""
    cfg = path.parent / "config.json"
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("_class_name", "SD3ControlNetModel") == "SD3ControlNetModel" \
        else None


def unused_keys(net: SD3NetLayout) -> tuple[str, ...]:
    """Key prefixes of a net's file that no output depends on: the text stream its last block computes after
    the attention (diffusers computes it and nothing reads it)."""
    if net.image_only:
        return ()
    last = f"transformer_blocks.{net.blocks - 1}."
    return (last + "attn.to_add_out.", last + "ff_context.")


def block_outputs(g: onnx.GraphProto, where: str) -> tuple[list[str], list[str]]:
    """The values after each block of an SD3 transformer graph (Flux's double blocks are SD3's joint blocks: the
    same names and residual chain), errors in SD3's words."""
    try:
        return _flux_block_outputs(g, where)
    except ModelError as exc:
        raise ModelError(exc.what.replace("Flux double blocks", "SD3 blocks").replace("Flux", "SD3"), where=where,
                         fix="use sdrt's shipped SD3 graph or a whole export of diffusers' SD3Transformer2DModel"
                         ) from exc


def base_of(net: SD3NetLayout, shapes: Mapping[str, Any]) -> str | None:
    """The shipped transformer graph a net of this layout is cut from (``BASES``), or None: an image-only net's is
    SD 3.5 Large's; a net with a text stream is told by its width and whether its blocks have q/k norm."""
    if net.image_only:
        return BASES.get((net.width, True))
    return BASES.get((net.width, any(".attn.norm_q." in k for k in shapes)))


def residual_map(blocks: int, samples: int) -> list[int]:
    """diffusers' ``SD3Transformer2DModel``: block ``k`` of ``blocks`` adds residual ``int(k / (blocks / samples))``
    (the last block, which keeps no text stream, adds none)."""
    if samples <= 0:
        return []
    interval = blocks / samples
    return [int(k / interval) for k in range(blocks - 1)]


# ------------------------------------------------------------------------------------------------ graph edits
def residual_graph(model: onnx.ModelProto, samples: int, where: str = "transformer", embedded: bool = False
                   ) -> onnx.ModelProto:
    """``model`` (an SD3 transformer, edited in place and returned) with the residual inputs
    ``controlnet_block_sample_j`` ``[batch, image, width]`` of a ControlNet of ``samples`` blocks, each block
    taking the one diffusers' interval rule gives it; ``embedded``: also the output ``EMBEDDED``, the image tokens
    after ``pos_embed`` (what an image-only net takes: run with that output alone, the rest is folded away)."""
    import onnx

    g = model.graph
    outs, _ = block_outputs(g, where)
    if embedded:
        x_in = _block_input(_Index(g), g, where)
        hidden = next((i for i in g.input if i.name == "hidden_states"), None)
        elem0 = hidden.type.tensor_type.elem_type if hidden is not None else onnx.TensorProto.FLOAT
        g.node.append(onnx.helper.make_node("Identity", [x_in], [EMBEDDED], name="sdrt_controlnet_embedded"))
        g.output.append(_value_info(EMBEDDED, elem0, ["batch", "image", "width"]))
    hidden = next((i for i in g.input if i.name == "hidden_states"), None)
    elem = hidden.type.tensor_type.elem_type if hidden is not None else onnx.TensorProto.FLOAT
    bias = next((t for t in g.initializer if t.name.endswith("pos_embed.proj.bias") and len(t.dims) == 1), None)
    width: Any = int(bias.dims[0]) if bias is not None else "width"
    used: set[int] = set()
    for k, j in enumerate(residual_map(len(outs), samples)):
        name = f"{SAMPLE}{j}"
        value = outs[k]
        added = f"{value}_plus_{name}"
        node = onnx.helper.make_node("Add", [value, name], [added], name=f"sdrt_controlnet_add_{k}")
        _rewire(g, value, added, None)
        pos = next(i for i, nd in enumerate(g.node) if value in nd.output)
        g.node.insert(pos + 1, node)
        used.add(j)
    for j in sorted(used):
        g.input.append(_value_info(f"{SAMPLE}{j}", elem, ["batch", "image", width]))
    return model


def _block_input(idx: _Index, g: onnx.GraphProto, where: str) -> str:
    """The embedded image tokens block 0 reads: the other input of its attention's residual ``Add``
    (``transformer_blocks.0.attn.to_out.0.bias`` -> Add -> Mul -> Add)."""
    bias = next((t.name for t in g.initializer if t.name.endswith("transformer_blocks.0.attn.to_out.0.bias")), None)
    add = idx.sole(bias, "Add") if bias is not None else None
    gate = idx.sole(add.output[0], "Mul") if add is not None else None
    res = idx.sole(gate.output[0], "Add") if gate is not None else None
    if res is None:
        raise ModelError(f"the {where} does not end block 0's attention as diffusers' SD3 transformer does "
                         "(to_out.0.bias -> Add -> Mul -> Add)", where=where, fix="use sdrt's shipped SD3 graph")
    return str(next(i for i in res.input if i != gate.output[0]))


def controlnet_graph(model: onnx.ModelProto, net: SD3NetLayout, where: str = "SD3 transformer graph"
                     ) -> onnx.ModelProto:
    """The weight-free graph of an SD3 ControlNet of ``net``'s layout, cut from ``model`` (a weight-free SD3
    transformer graph with diffusers' parameter names; edited in place and returned)."""
    import numpy as np
    import onnx

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    idx = _Index(g)
    for name in ("pos_embed.proj.bias", "context_embedder.bias")[:1 if net.image_only else 2]:
        if name not in inits or name not in idx.consumers:
            raise ModelError(f"the {where} has no {name} (it is not an SD3 transformer graph with diffusers' "
                             "parameter names)", where=where, fix="use sdrt's shipped SD3 graph")
    outs, _ = block_outputs(g, where)
    if not 1 <= net.blocks < len(outs):
        raise ModelError(f"the ControlNet has {net.blocks} blocks; the {where} has {len(outs)}, of which the first "
                         f"{len(outs) - 1} keep the text stream", where=where, fix="use an SD3 ControlNet")
    width = int(inits["pos_embed.proj.bias"].dims[0])
    if width != net.width:
        raise ModelError(f"its blocks are {net.width} wide and the SD3 transformer's {width}", where=where,
                         fix="use a ControlNet made for this SD3 model")
    elem = inits["pos_embed.proj.bias"].data_type
    location = next((p.value for p in model.metadata_props if p.key == "sdrt.stripped_weights"),
                    "sd3_controlnet.weights.safetensors")
    x_in = _block_input(idx, g, where)
    if net.image_only:  # the model's pos_embed runs in the transformer (EMBEDDED): its tokens are an input here
        _image_only(g, idx, net.blocks, width, where)
        _rewire(g, x_in, EMBEDDED, None)
        g.input.append(_value_info(EMBEDDED, elem, ["batch", "image", width]))
        x_in = EMBEDDED
    new: list[Any] = [_external("pos_embed_input.proj.weight", [width, net.in_channels, 2, 2], elem, location),
                      _external("pos_embed_input.proj.bias", [width], elem, location)]
    shape = onnx.numpy_helper.from_array(np.array([0, width, -1], np.int64), "sdrt_cond_shape")
    nodes: list[Any] = [
        onnx.helper.make_node("Conv", ["controlnet_cond", "pos_embed_input.proj.weight", "pos_embed_input.proj.bias"],
                              ["sdrt_cond_conv"], kernel_shape=[2, 2], strides=[2, 2]),
        onnx.helper.make_node("Reshape", ["sdrt_cond_conv", "sdrt_cond_shape"], ["sdrt_cond_flat"]),
        onnx.helper.make_node("Transpose", ["sdrt_cond_flat"], ["sdrt_cond_embedded"], perm=[0, 2, 1]),
        onnx.helper.make_node("Add", [x_in, "sdrt_cond_embedded"], ["sdrt_x_with_cond"])]
    new.append(shape)
    _rewire(g, x_in, "sdrt_x_with_cond", None)
    g.input.append(_value_info("controlnet_cond", elem, ["batch", net.in_channels, "2*h", "2*w"]))
    outputs = []
    for j in range(net.blocks):
        prefix = f"controlnet_blocks.{j}"
        new.extend([_external(f"{prefix}.weight", [width, width], elem, location),
                    _external(f"{prefix}.bias", [width], elem, location)])
        nodes.extend([onnx.helper.make_node("Transpose", [f"{prefix}.weight"], [f"{prefix}.weight_T"], perm=[1, 0]),
                      onnx.helper.make_node("MatMul", [outs[j], f"{prefix}.weight_T"], [f"{prefix}.mm"]),
                      onnx.helper.make_node("Add", [f"{prefix}.mm", f"{prefix}.bias"], [f"{SAMPLE}{j}"])])
        outputs.append(_value_info(f"{SAMPLE}{j}", elem, ["batch", "image", width]))
    g.node.extend(nodes)
    g.initializer.extend(new)
    if net.image_only:  # what still reads the model's patch embedding reads its shape: take the control's (the same)
        conv = idx.sole("pos_embed.proj.weight", "Conv")
        if conv is not None:
            _rewire(g, conv.output[0], "sdrt_cond_conv", None)
    del g.output[:]
    g.output.extend(outputs)
    _toposort(g)
    _prune(g)
    if net.image_only and any(t.name.startswith("pos_embed.") for t in g.initializer):
        raise ModelError(f"the {where}'s image-only cut still reads the model's pos_embed weights", where=where,
                         fix="use sdrt's shipped SD3.5 Large graph")
    for prop in model.metadata_props:
        if prop.key == "sdrt.architecture":
            prop.value = f"sd3_controlnet_{net.blocks}" + ("_image_only" if net.image_only else "")
    return model


def _first_concat(idx: _Index, start: str, limit: int = 40) -> tuple[Any, str | None]:
    """The first ``Concat`` downstream of ``start`` (breadth first) and its input that is not (None: both are)."""
    seen, queue = {start}, [start]
    while queue and limit:
        limit -= 1
        value = queue.pop(0)
        for n in idx.consumers.get(value, []):
            if n.op_type == "Concat":
                other = [i for i in n.input if i != value]
                return n, (other[0] if len(other) == 1 and other[0] not in seen else None)
            for o in n.output:
                if o not in seen:
                    seen.add(o)
                    queue.append(o)
    return None, None


def _image_only(g: onnx.GraphProto, idx: _Index, blocks: int, width: int, where: str) -> None:
    """Blocks ``0..blocks-1`` of an SD3 transformer graph made image-only, as diffusers' ``SD3SingleTransformerBlock``
    (edited in place): each joint attention's q/k/v ``Concat`` with the text's replaced by the image's, the
    attention output reshaped to the image tokens (``[0, -1, width]``, not text + image), the q/k RMS norms dropped.
    The text stream is then read by nothing and pruned."""
    import numpy as np
    import onnx

    def fail(what: str) -> ModelError:
        return ModelError(f"the {where} does not build block attention as diffusers' SD3 transformer does ({what})",
                          where=where, fix="use sdrt's shipped SD3.5 Large graph")

    shape = "sdrt_image_tokens_shape"
    g.initializer.append(onnx.numpy_helper.from_array(np.array([0, -1, width], np.int64), shape))
    names = {t.name for t in g.initializer}
    for k in range(blocks):
        pre = f"transformer_blocks.{k}.attn."
        for proj in ("add_q_proj", "add_k_proj", "add_v_proj"):
            if pre + proj + ".weight" not in names:
                raise fail(f"no {pre}{proj}.weight")
            cat, image = _first_concat(idx, pre + proj + ".weight")
            if cat is None or len(cat.input) != 2 or image is None:
                raise fail(f"no Concat of the image's and {pre}{proj}'s tokens")
            _rewire(g, cat.output[0], image, cat)
        t = idx.sole(pre + "to_out.0.weight", "Transpose")
        mm = idx.sole(t.output[0], "MatMul") if t is not None else None
        sl = idx.producer.get(mm.input[0]) if mm is not None else None
        rs = idx.producer.get(sl.input[0]) if sl is not None and sl.op_type == "Slice" else None
        if rs is None or rs.op_type != "Reshape":
            raise fail(f"no Reshape -> Slice -> to_out.0 in block {k}")
        rs.input[1] = shape
        kept = [a for a in rs.attribute if a.name != "allowzero"]  # 0 copies the batch dimension
        del rs.attribute[:]
        rs.attribute.extend(kept)
        for norm in ("norm_q", "norm_k"):
            mul = idx.sole(pre + norm + ".weight", "Mul")
            if mul is None:
                continue  # a base without q/k norm
            inner = idx.producer.get(next(i for i in mul.input if i != pre + norm + ".weight"))
            x = next((i for i in inner.input if any(c.op_type == "Pow" for c in idx.consumers.get(i, []))), None) \
                if inner is not None and inner.op_type == "Mul" else None
            if x is None:
                raise fail(f"the {norm} RMS norm (x * rsqrt(mean(x ** 2) + eps) * weight)")
            _rewire(g, mul.output[0], x, None)


# ------------------------------------------------------------------------------------------------ cached files
def derived_controlnet_graph(base: Path, net: SD3NetLayout) -> Path:
    """The cached weight-free ControlNet graph of ``net``'s layout cut from the graph file ``base`` (keyed by the
    file, the layout and the source of the code that cuts it: this module and the Flux edits it builds on)."""
    from . import fluxcontrolnet
    from .graphs import derived_graph

    tag = f"{net.blocks}c{net.in_channels}" + ("i" if net.image_only else "")
    return derived_graph(base, "sd3_controlnet", tag, lambda model: controlnet_graph(model, net, base.name),
                         [__file__, fluxcontrolnet.__file__], "SD3 ControlNet",
                         "leave graph= out (sdrt's shipped SD3 graph), or pass a weight-free graph (sdrt strip)")


def open_sd3(p: Path, w: Any, shapes: Mapping[str, tuple[int, ...]], ident: Any,
             graph: Any) -> tuple[Path, Any, SD3NetLayout]:
    """A diffusers SD3 ControlNet bound onto the graph cut from the shipped SD3 transformer graph of its architecture
    (``base_of``; or from ``graph``, a weight-free SD3 transformer graph): (the graph's path, the bound graph, the
    layout), of which ``sdrt.checkpoint.controlnet`` makes its ``OpenedControlNet``."""
    from ..errors import WeightsError
    from ..graph import Graph
    from .graphs import shipped_graph
    from .ldm import Source
    from .single_file import Checkpoint, with_own_constants

    lay = layout(shapes, folder_config(p))
    assert isinstance(lay, SD3NetLayout)
    sources = stability_sources(list(shapes)) or {k: Source(k) for k in shapes}
    if lay.image_only and graph is None and lay.width != 2432:
        raise ModelError(f"{p.name} is {lay.label}; sdrt runs that design with SD3.5 Large (2432 wide)",
                         where=str(p), fix="use it with an SD3.5 Large model")
    name = base_of(lay, shapes)
    if graph is None and name is None:
        raise ModelError(f"{p.name} is {ident.label}; sdrt ships SD3 Medium (1536 wide, no q/k norm), SD3.5 Medium "
                         "(1536, q/k norm) and SD3.5 Large (2432, q/k norm) graphs", where=str(p),
                         fix="pass graph= a weight-free SD3 transformer graph of its architecture (sdrt strip)")
    base = Path(graph) if graph is not None else shipped_graph(str(name))
    what = f"the graph {base.name}" if graph is not None else f"sdrt's SD3 graph ({name})"
    try:
        gpath = derived_controlnet_graph(base, lay)
    except ModelError as exc:
        raise ModelError(f"{p.name} is {lay.label}, which {what} cannot take: {exc.what}", where=str(p),
                         fix=f"pass {EXAMPLE}" if graph is None else exc.fix) from exc
    dead = unused_keys(lay)
    ck = Checkpoint(w, {"controlnet": {k: v for k, v in sources.items() if not k.startswith(dead)}}, lay.label, p)
    try:
        cgraph = Graph.load(gpath)
        (refs,) = ck.lazy({"controlnet": cgraph}).values()
    except WeightsError as exc:
        raise ModelError(f"{p.name} is {lay.label} of another architecture than {what}: {exc.what}"[:1500],
                         where=str(p), fix="pass a ControlNet made for this SD3 model") from exc
    log.info("%s: %s, %d tensors bound onto %s", p.name, lay.label, len(refs), gpath.name)
    return gpath, with_own_constants(cgraph, refs, p), lay
