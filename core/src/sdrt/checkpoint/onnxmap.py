"""Which ONNX initializer holds which model parameter, read from the graph itself.

torch's exporter (the TorchScript one that Optimum and every published SD export
used) leaves three kinds of weights in a graph:

1. **named** initializers, the parameter's own state-dict name
   (``down_blocks.0.resnets.0.conv1.weight``; a text encoder's
   ``text_model.encoder.layers.0.self_attn.q_proj.bias`` from transformers 4,
   ``encoder.layers.0...`` from transformers >= 5.6);
2. **anonymous, transposed** ``onnx::MatMul_*`` weights: a ``Linear``'s weight
   after constant folding of its transpose, stored [in, out]. The consuming
   MatMul's node name is the module scope
   (``/text_model/encoder/layers.0/self_attn/q_proj/MatMul``); when a graph's
   node names were lost, the named bias that the MatMul's ``Add`` consumes
   (``...q_proj.bias``) identifies it;
3. **anonymous, reshaped** ``onnx::Mul_*``/``onnx::Add_*`` weights: a
   GroupNorm's weight and bias folded to [C, 1, 1] (or [C, 1]) after the
   InstanceNormalization it is exported as (scope ``/.../norm1/Mul``).

``param_map(graph)`` builds ``{canonical name: Slot}`` once per graph. Canonical
names are diffusers/transformers state-dict names with a text encoder's
``text_model.`` prefix removed, so both export generations map to the same
names (``ldm`` produces the same).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..graph import onnxfile

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph

log = logging.getLogger("sdrt.checkpoint")

_PARAM_END = (".weight", ".bias")
_TEXT_PREFIX = "text_model."


@dataclass(frozen=True)
class Slot:
    """One initializer and how a torch-layout parameter goes into it.

    ``layout``: ``"same"`` (as torch stores it), ``"T"`` (transposed: a MatMul
    weight [in, out]), ``"reshape"`` (same values, dims of size 1 differ: a
    GroupNorm weight [C, 1, 1]).
    """

    init: str
    shape: tuple[int, ...]
    dtype: str
    layout: str = "same"
    #: set when the exporter merged equal tensors into one initializer: the parameter that owns it
    alias_of: str | None = None


#: first components of canonical names (diffusers UNet/VAE/ControlNet, transformers CLIP)
ROOTS = frozenset({"conv_in", "time_embedding", "add_embedding", "down_blocks", "mid_block", "up_blocks",
                   "conv_norm_out", "conv_out", "encoder", "decoder", "quant_conv", "post_quant_conv",
                   "embeddings", "final_layer_norm", "text_projection", "text_model", "class_embedding",
                   "encoder_hid_proj", "controlnet_cond_embedding", "controlnet_down_blocks",
                   "controlnet_mid_block", "shared",
                   # a Flux ControlNet's hint convolutions (XLabs' design: ``input_hint_block.conv_in``)
                   "input_hint_block",
                   # flow transformers (SD3, Flux, Chroma) and T5, exported through a wrapper module
                   "transformer_blocks", "single_transformer_blocks", "time_text_embed", "context_embedder",
                   "x_embedder", "pos_embed", "norm_out", "proj_out", "distilled_guidance_layer"})


def canonical(name: str) -> str:
    """The canonical parameter name: a wrapper module's prefix (``unet.``, ``model.``, as exports made
    through a wrapper ``nn.Module`` have) and a text encoder's ``text_model.`` removed."""
    parts = name.split(".")
    for i in range(min(3, len(parts) - 1)):
        if parts[i] in ROOTS:
            name = ".".join(parts[i:])
            break
    return name.removeprefix(_TEXT_PREFIX)


def _scope(node_name: str) -> str | None:
    """``/a/b.0/c/MatMul`` -> ``a.b.0.c`` (the module path torch's exporter wrote), else None."""
    if not node_name.startswith("/"):
        return None
    parts = node_name.strip("/").split("/")
    return ".".join(parts[:-1]) or None


def param_map(graph: Graph) -> dict[str, Slot]:
    """``{canonical parameter name: Slot}`` for every weight the graph's initializers hold."""
    g = graph.model.graph
    infos = {t.name: (tuple(int(d) for d in t.dims), onnxfile.dtype_name(t.data_type)) for t in g.initializer}
    consumers: dict[str, list[tuple[object, int]]] = {}
    by_output: dict[str, list[object]] = {}
    # torch's exporter stores equal tensors once and feeds the other users through Identity nodes
    # whose output carries the other parameter's name
    through = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.input and n.input[0] in infos}
    for node in g.node:
        for i, x in enumerate(node.input):
            src = through.get(x, x)
            if src in infos:
                consumers.setdefault(src, []).append((node, i))
            by_output.setdefault(x, []).append(node)
    out: dict[str, Slot] = {}
    aliases: list[tuple[str, Slot]] = []
    # sdrt's shipped weight-free graphs name every weight by its parameter (or persistent buffer) name,
    # ``pos_embed.pos_embed`` included
    weight_free = any(p.key == "sdrt.weight_free" for p in graph.model.metadata_props)
    external = {t.name for t in g.initializer if t.external_data} if weight_free else set()
    for name, (shape, dtype) in infos.items():
        named = (name.endswith(_PARAM_END) or name in external) and not name.startswith("onnx::")
        if not named and int(np.prod(shape)) <= 1:
            continue  # scalars: constants of the graph, not weights
        found = _from_uses(name, consumers.get(name, []), by_output, infos)
        if named:
            layout = "T" if any(n.op_type == "MatMul" and i == 1 for n, i in consumers.get(name, [])) else "same"
            primary = (canonical(name), layout)
        elif found:
            primary = min(found)
            primary = (canonical(primary[0]), primary[1])
        else:
            continue
        key, layout = primary
        if key in out:
            log.debug("%s: %s and %s both look like %s; keeping the first", graph.name, out[key].init, name, key)
            continue
        out[key] = Slot(name, shape, dtype, layout)
        # torch's exporter stores equal tensors once: every other module using this one is an alias
        for param, lay in sorted(found):
            c = canonical(param)
            if c != key:
                aliases.append((c, Slot(name, shape, dtype, lay, alias_of=key)))
    for out_name, src in through.items():
        if out_name.endswith(_PARAM_END) and not out_name.startswith("onnx::"):
            owner = next((k for k, v in out.items() if v.init == src and v.alias_of is None), None)
            if owner is not None:
                shape, dtype = infos[src]
                aliases.append((canonical(out_name), Slot(src, shape, dtype, out[owner].layout, alias_of=owner)))
    for c, slot in aliases:
        out.setdefault(c, slot)
    return out


def _from_uses(name: str, uses: list[tuple[object, int]], by_output: dict[str, list[object]],
               infos: dict[str, tuple[tuple[int, ...], str]]) -> set[tuple[str, str]]:
    """Every ``(parameter, layout)`` the initializer's consumers say it is."""
    params: set[tuple[str, str]] = set()
    for node, i in uses:
        op = node.op_type  # type: ignore[attr-defined]
        scope = _scope(node.name)  # type: ignore[attr-defined]
        if op == "MatMul" and i == 1:
            if scope is None:
                scope = _scope_from_bias(node, by_output, infos)
            if scope is not None:
                params.add((scope + ".weight", "T"))
        elif op == "Gemm" and i in (1, 2) and scope is not None:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)  # type: ignore[attr-defined]
            params.add((scope + (".weight" if i == 1 else ".bias"), "same" if i == 2 or trans_b else "T"))
        elif op in ("Conv", "ConvTranspose") and i in (1, 2) and scope is not None:
            params.add((scope + (".weight" if i == 1 else ".bias"), "same"))
        elif op == "Gather" and i == 0 and scope is not None:
            params.add((scope + ".weight", "same"))
        elif op == "LayerNormalization" and i in (1, 2) and scope is not None:
            params.add((scope + (".weight" if i == 1 else ".bias"), "same"))
        elif op in ("Mul", "Add") and scope is not None and "norm" in scope.rsplit(".", 1)[-1]:
            params.add((scope + (".weight" if op == "Mul" else ".bias"), "reshape"))
        elif op == "Add" and scope is not None and len(infos[name][0]) == 1:
            params.add((scope + ".bias", "same"))  # a Linear bias
    return params


def _scope_from_bias(matmul: object, by_output: dict[str, list[object]],
                     infos: dict[str, tuple[tuple[int, ...], str]]) -> str | None:
    """The module of a MatMul whose node name was lost: the named ``X.bias`` its consumer ``Add`` adds."""
    for nxt in by_output.get(matmul.output[0], []):  # type: ignore[attr-defined]
        if nxt.op_type != "Add":  # type: ignore[attr-defined]
            continue
        for x in nxt.input:  # type: ignore[attr-defined]
            if x in infos and x.endswith(".bias") and not x.startswith("onnx::"):
                return x[: -len(".bias")]
    return None


def fit(arr: np.ndarray, slot: Slot) -> np.ndarray | None:
    """``arr`` (torch layout) in the slot's layout, shape and dtype; None when it cannot fit.

    A 1x1 conv weight [o, i, 1, 1] fits a linear slot and the other way round
    (SD 1.x's conv ``proj_in``/``proj_out`` against an export with linear ones).
    """
    a = np.asarray(arr)
    if slot.layout == "T":
        if a.ndim == 4 and a.shape[2:] == (1, 1):
            a = a.reshape(a.shape[:2])
        if a.ndim != 2:
            return None
        a = a.T
    if a.shape != slot.shape:
        if a.size != int(np.prod(slot.shape)) or _squeezed(a.shape) != _squeezed(slot.shape):
            return None
        a = a.reshape(slot.shape)
    want = _np_dtype(slot.dtype)
    if a.dtype != want:
        a = a.astype(want)
    return np.ascontiguousarray(a)


def fits_shape(shape: tuple[int, ...], slot: Slot) -> bool:
    """Whether a torch-layout tensor of ``shape`` fits ``slot`` (no data read)."""
    s = tuple(shape)
    if slot.layout == "T":
        if len(s) == 4 and s[2:] == (1, 1):
            s = s[:2]
        if len(s) != 2:
            return False
        s = (s[1], s[0])
    return s == slot.shape or _squeezed(s) == _squeezed(slot.shape)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
