"""Black Forest Labs' FLUX.1 Canny/Depth dev LoRAs on a Flux.1 dev model: the model becomes a Canny/Depth one.

A control LoRA (``flux1-canny-dev-lora.safetensors``, ``flux1-depth-dev-lora.safetensors``, or diffusers'
conversion of one; ``sdrt.lora.FluxControl``) is trained on a transformer whose image input takes 128 channels
(the noise and the control image's latents, as FLUX.1-Canny-dev), so merging it changes the model's input as
diffusers' ``FluxControlPipeline`` + ``load_lora_weights`` and ComfyUI do:

- the transformer runs the 128-input twin of its graph (``hidden_states [.., 128]``; the shipped
  ``flux_control_transformer`` for the shipped dev graph, else the part's own weight-free graph widened the same
  way), and its ``x_embedder`` (BFL's ``img_in``) weight is the dev model's with zeros on the 64 new inputs
  (diffusers' ``_maybe_expand_transformer_param_shape_or_error_``; ComfyUI's ``reshape_weight``): the bias is kept;
- the low-rank layers merge as any LoRA's at the LoRA's scale; the up layers' biases (``lora_B.bias``) add
  ``scale * alpha / rank * bias`` to the module's bias (peft's ``lora_bias``; ComfyUI's ``diff_b``);
- the qk-norm scales the file holds replace the model's whole, at any scale (diffusers loads them straight into
  the transformer; ComfyUI's ``set_weight``).

The pipeline then is a Flux.1 Canny/Depth pipeline (``Pipeline.flux_tool == "control"``: the control image is
required and VAE-encoded beside the noise, :mod:`sdrt.pipelines.fluxtools`); removing the LoRA runs the dev graph
and weights again. Only a weight-free transformer graph (a single file, GGUF, diffusers folder) can be widened:
an ONNX folder's graph holds its own ``x_embedder`` and is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import WeightsError

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph
    from ..lora import Lora
    from .parts import Part

log = logging.getLogger("sdrt.pipelines.fluxcontrollora")

WIDTH = 128


def control_loras(active: Sequence[Any]) -> list[Any]:
    """The active LoRAs (``ActiveLora``) that are Flux Control LoRAs."""
    return [a for a in active if getattr(a.lora, "control", None) is not None]


def check(pipe: Any, part: Part | None, plain: Path | None, found: Sequence[tuple[str, str]]) -> None:
    """One ``WeightsError`` when these control LoRAs (``(name, what showed it)``) cannot run on this model: more
    than one, a model that is not Flux.1 dev (schnell, Chroma, SD, a Fill or Canny/Depth model already), or a
    graph that holds its weights."""
    names = ", ".join(n for n, _ in found)
    if len(found) > 1:
        raise WeightsError(f"{len(found)} Flux Control LoRAs at once ({names}): each makes the model a FLUX.1 "
                           "Canny or Depth model with its own control input", where=names,
                           fix="pass one control LoRA (Canny or Depth); other LoRAs may go with it")
    name, shown = found[0]
    label = pipe.family.label
    single = getattr(pipe.folder, "single_file", None)
    if single is not None:  # the checkpoint's family in words ("SD 3 Medium", not the pipeline's "SD3")
        from ..checkpoint.families import LABELS

        label = LABELS.get(single.family, label)
    why = f"{name} is a Flux Control LoRA (Black Forest Labs' FLUX.1 Canny/Depth dev LoRA: {shown})"
    if pipe.family.name != "flux" or part is None or plain is None:
        article = "an" if label[:1] in "AEIOS" else "a"  # an SD 3 Medium, an SDXL, a Chroma
        raise WeightsError(f"{why}, made for Flux.1 dev, and this is {article} {label} model", where=name,
                           fix="load a Flux.1 dev model with it, or use a LoRA made for this model")
    from ..graph import Graph

    graph = Graph.load(plain, load_external=False)
    shape = next((tuple(t.shape) for t in graph.inputs if t.name == "hidden_states"), ())
    width = shape[2] if len(shape) == 3 else None
    if "guidance" not in {t.name for t in graph.inputs}:
        raise WeightsError(f"{why}, made for Flux.1 dev (guidance-distilled), and this is Flux.1 schnell (its "
                           "transformer takes no guidance)", where=name, fix="load a Flux.1 dev model with it")
    if width != 64:
        raise WeightsError(f"{why}, made for Flux.1 dev, and this model's transformer already takes {width} input "
                           "channels (a FLUX.1 Fill or Canny/Depth model)", where=name,
                           fix="load a Flux.1 dev model with it, or run this model without the control LoRA")
    if not graph.is_stripped:
        raise WeightsError(f"{why}; it widens the transformer's image input to 128 channels, and this ONNX folder's "
                           "transformer graph holds its own weights, which sdrt does not rewrite", where=str(plain),
                           fix="load Flux.1 dev as a single file (.safetensors / .gguf) or a diffusers folder, or use "
                               "an ONNX export of FLUX.1-Canny-dev / FLUX.1-Depth-dev with {@control_image}")


def widened_graph(plain: Path) -> Path:
    """The 128-input twin of the weight-free Flux transformer graph ``plain``: the shipped
    ``flux_control_transformer`` when ``plain`` is the shipped dev graph, else a cached widened copy."""
    from ..checkpoint.graphs import derived_graph, shipped_graph

    dev = shipped_graph("flux_dev_transformer")
    if Path(plain) == dev:
        return shipped_graph("flux_control_transformer")

    def edit(model: Any) -> None:
        widen(model, str(plain))

    return derived_graph(Path(plain), Path(plain).stem, f"control{WIDTH}", edit, [__file__], "Flux control",
                         "load Flux.1 dev as a single file or a diffusers folder")


def widen(model: Any, where: str, width: int = WIDTH) -> None:
    """Widen a Flux transformer graph's ``hidden_states`` (its last axis) and the image-input weight it multiplies
    (``MatMul(hidden_states, W [in, out])`` or ``MatMul(hidden_states, Transpose(W [out, in]))``) to ``width``."""
    g = model.graph
    inp = next((i for i in g.input if i.name == "hidden_states"), None)
    users = [n for n in g.node if "hidden_states" in n.input]
    inits = {t.name: t for t in g.initializer}
    makers = {o: n for n in g.node for o in n.output}
    ok = inp is not None and len(inp.type.tensor_type.shape.dim) == 3 and len(users) == 1 \
        and users[0].op_type == "MatMul" and list(users[0].input).index("hidden_states") == 0
    if ok:
        w = users[0].input[1]
        if w in inits and len(inits[w].dims) == 2:
            inits[w].dims[0] = width
        elif w in makers and makers[w].op_type == "Transpose" and makers[w].input[0] in inits:
            inits[makers[w].input[0]].dims[1] = width
        else:
            ok = False
    if not ok:
        from ..errors import ModelError

        raise ModelError("the Flux transformer graph does not take hidden_states through one MatMul with its image "
                         "input weight, so it cannot take a control LoRA's 128 channels", where=where,
                         fix="load Flux.1 dev as a single file or a diffusers folder (sdrt's shipped graph)")
    inp.type.tensor_type.shape.dim[2].dim_value = width
    # torch's exporter stores equal tensors once (a fresh model's qk-norm scales are all ones) and names the others
    # through Identity nodes: a control LoRA sets each norm apart, so each gets its own initializer
    import onnx

    named = _named_copies(g)
    if named:
        copies = []
        for out, src in named.items():
            t = onnx.TensorProto()
            t.CopyFrom(inits[src])
            t.name = out
            copies.append(t)
        keep = [n for n in g.node if not (n.op_type == "Identity" and n.output[0] in named)]
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(copies)


def _named_copies(g: Any) -> dict[str, str]:
    """``{Identity output: the initializer it names}`` for the Identity nodes of graph proto ``g`` that give an
    initializer another name (neither an initializer nor a graph output itself): what ``widen`` makes initializers."""
    inits = {t.name for t in g.initializer}
    outputs = {o.name for o in g.output}
    return {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity"
            and n.input[0] in inits and n.output[0] not in inits and n.output[0] not in outputs}


def shared(plain: Graph) -> dict[str, str]:
    """``{initializer of the widened graph: the plain graph's initializer it copies}`` (``widen``'s copies)."""
    return _named_copies(plain.model.graph)


def padded_input(graph: Graph, base: Mapping[str, Any], plain: Graph) -> dict[str, Any]:
    """``{x_embedder initializer: the base weight with zeros on its new inputs}`` in the widened ``graph``'s
    layout (diffusers' expansion: the old inputs first, the control image's 64 after), and the initializers
    ``widen`` copied from a shared one (``plain``'s), as the base has that one."""
    from ..checkpoint import param_map

    copies = {new: src for new, src in shared(plain).items() if new not in base}

    slot = param_map(graph).get("x_embedder.weight")
    if slot is None:
        raise WeightsError("the widened Flux transformer graph has no x_embedder.weight", where=str(graph.path),
                           fix="load Flux.1 dev as a single file or a diffusers folder")
    old = np.asarray(base[slot.init])
    new = np.zeros(slot.shape, dtype=old.dtype)
    new[tuple(slice(0, d) for d in old.shape)] = old
    return {**{k: np.asarray(base[src]) for k, src in copies.items()}, slot.init: new}


def extras(lora: Lora, scale: float, graph: Graph, base: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``{initializer: array}`` for a control LoRA's whole-tensor replacements (unscaled) and its up-layer biases
    (``base`` bias + ``scale * alpha / rank * bias``), in the graph's initializers. BFL's names go through sdrt's
    Flux checkpoint map (a fused ``qkv`` / ``linear1`` bias splits as its weight does)."""
    from ..checkpoint import flow, param_map

    control = lora.control
    assert control is not None
    pmap = param_map(graph)
    wanted: dict[str, tuple[str, np.ndarray]] = {}  # BFL or diffusers tensor name -> (kind, value)
    for key, value in control.sets.items():
        wanted[_strip(key)] = ("set", np.asarray(value, np.float32))
    for mod, bias in control.biases.items():
        layer = lora.layers[mod]
        factor = np.float32(scale * layer.alpha / layer.rank) if hasattr(layer, "alpha") else np.float32(scale)
        wanted[_strip(mod) + ".bias"] = ("bias", np.asarray(bias, np.float32) * factor)
    bfl = {k: v for k, v in wanted.items() if k.startswith(_BFL_TOP)}
    named: dict[str, tuple[str, np.ndarray]] = {k: v for k, v in wanted.items() if k not in bfl}
    if bfl:
        shapes = {k: tuple(v[1].shape) for k, v in bfl.items()}
        inner = int((pmap.get("x_embedder.bias") or pmap["context_embedder.bias"]).shape[0])
        shapes.setdefault("img_in.weight", (inner, WIDTH))
        conv, _ = flow.convert_flux(shapes)
        used = set()
        for name, src in conv.items():
            if src.key in bfl:
                kind, value = bfl[src.key]
                named[name] = (kind, np.asarray(src.load(lambda _k, v=value: v), np.float32))
                used.add(src.key)
        lost = sorted(set(bfl) - used)
        if lost:
            raise WeightsError(f"{len(lost)} tensors of control LoRA {Path(lora.source).name} name no Flux.1 "
                               f"parameter: {', '.join(lost[:4])}", where=lora.source,
                               fix="use the control LoRA as Black Forest Labs or diffusers saved it")
    out: dict[str, np.ndarray] = {}
    for name, (kind, value) in named.items():
        slot = pmap.get(name)
        if slot is None or int(np.prod(slot.shape)) != value.size:
            raise WeightsError(f"control LoRA {Path(lora.source).name}: {name} {list(value.shape)} does not fit the "
                               f"model's {list(slot.shape) if slot else 'nothing'}", where=lora.source,
                               fix="use a control LoRA made for this Flux.1 dev model")
        orig = np.asarray(base[slot.init])
        if kind == "set":
            new = value.reshape(orig.shape)
        else:
            new = np.asarray(orig, np.float32) + value.reshape(orig.shape)
        out[slot.init] = new.astype(orig.dtype)
    return out


#: BFL's top-level module names (a diffusers file names its modules transformer_blocks.*, x_embedder, ...)
_BFL_TOP = ("img_in.", "txt_in.", "time_in.", "vector_in.", "guidance_in.", "double_blocks.", "single_blocks.",
            "final_layer.")
_PREFIXES = ("transformer.", "diffusion_model.", "model.diffusion_model.", "base_model.model.")


def _strip(key: str) -> str:
    for p in _PREFIXES:
        if key.startswith(p):
            return key[len(p):]
    return key



def is_control_file(path: Path) -> bool:
    """Whether a LoRA file is a Flux control LoRA, from its names and shapes only (nothing read)."""
    from ..weights import Weights
    from ..weights.lora import _flux_control

    try:
        return _flux_control(Weights.open(path).shapes()) is not None
    except Exception:  # noqa: BLE001  (the run itself reports a file it cannot read)
        return False


def pending(pipe: Any, texts: Sequence[Any], files: Sequence[Path] = ()) -> tuple[str, Path] | None:
    """For a run plan: the control LoRA a run would make active (``<lora:name:w>`` in ``texts``, found in the
    LoRA folder, or one of ``files``, the CLI's ``--lora``) while none is active now, as ``(name, file)``."""
    state = pipe._weight_state
    if pipe.control_lora is not None or pipe.family.name != "flux":
        return None
    cands = list(files)
    folder = getattr(state, "lora_dir", None) if state is not None else None
    if folder is not None:
        from ..text import extract_loras

        for text in texts:
            if isinstance(text, str) and "<lora:" in text:
                for name, _ in extract_loras(text)[1]:
                    try:
                        cands.append(state.lora_file(name))
                    except Exception:  # noqa: BLE001,S112  (the run names a missing file)
                        continue
    for p in cands:
        if is_control_file(Path(p)):
            return Path(p).stem, Path(p)
    return None


def plan_graph(pipe: Any, dry_parts: Mapping[str, Part], found: tuple[str, Path]) -> None:
    """A run plan's recording transformer runs the 128-input graph the control LoRA ``found`` would bring."""
    part = dry_parts.get("transformer")
    plain = pipe.parts["transformer"].path if "transformer" in pipe.parts else None
    state = pipe._weight_state
    if state is not None and state._plain_graph is not None:
        plain = state._plain_graph
    check(pipe, part, plain, [(found[0], "its image input takes 128 channels")])
    assert part is not None and plain is not None
    part.path = widened_graph(plain)
    part._graph = None
