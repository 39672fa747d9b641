"""Flux.1 ControlNets (diffusers' ``FluxControlNetModel`` layout: InstantX, Shakker-Labs Union Pro) in the Flux
pipeline, as diffusers 0.42's ``FluxControlNetPipeline`` runs them.

- a net is its ``.safetensors`` (or the diffusers folder holding it), bound onto a graph cut from sdrt's shipped
  Flux transformer graph (:mod:`sdrt.checkpoint.fluxcontrolnet`); the model's transformer runs a copy of its own
  graph with the residual inputs added (``Part.edit_graph``), the plain one again when no net is asked for;
- the control image (after the unit's preprocessor and resize, as an SD ControlNet's) is VAE-encoded for every
  image of the batch with a sample drawn from the run's generator, before the noise (several nets: in the order
  given), shifted, scaled and packed into 2x2 tokens;
- every step the net runs on the transformer's latents, timestep, guidance (when the net has guidance embeddings)
  and the positive prompt's text (the negative pass of true CFG gets the same residuals, as in diffusers); a
  union net takes its ``union_mode`` as one more text token. Its residuals times ``scale`` go to the transformer;
  a net outside its window (diffusers' ``controlnet_keep``) adds nothing; several nets' residuals are summed
  (they must have the same block counts, as diffusers' ``FluxMultiControlNetModel`` needs);
- XLabs' nets (``input_hint_block``) take the control picture itself (RGB in [-1, 1], no VAE, no sample drawn),
  and the transformer's double blocks take their residuals in turn (diffusers' ``controlnet_blocks_repeat``);
  nets of the two designs do not mix;
- img2img and inpainting (with a plain Flux.1 dev model) run as ``FluxControlNetImg2ImgPipeline`` and
  ``FluxControlNetInpaintPipeline``: the control latents are drawn first, then the init image's, then the noise
  (inpainting: then the masked image's); the window is judged over the steps the cut schedule runs (diffusers'
  ``controlnet_keep`` over ``len(timesteps)`` after ``get_timesteps``), which the pipeline's step count already is;
- the hires fix's second pass resizes each control map (made once) to the target size and encodes it with the second
  pass's generator before the upscaled image (``ToolboxMixin._encode_controls``, shared with SD3's nets), as that
  img2img pass would;
- no reference images or FLUX.1 Tools model with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from . import controlnet as cn

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint.fluxcontrolnet import FluxNetLayout
    from ..graph import Graph
    from .parts import Part
    from .settings import Settings

_FIX = "({@@controlnets})"


def layout_of(unit: cn.ControlNet) -> FluxNetLayout:
    assert unit.part is not None
    lay = getattr(unit.part, "flux_layout", None)
    assert lay is not None
    return lay


def prepare(pipe: Any, s: Settings) -> None:
    """Check the run, bind each unit's net, give the transformer the residual inputs of their layout."""
    tb = s.toolbox
    units: list[cn.ControlNet] = tb.controlnets
    if pipe.flux_tool is not None:
        from .fluxtools import LABELS

        raise InputError(f"a Flux ControlNet does not combine with a {LABELS[pipe.flux_tool]} model",
                         where="controlnets", fix="use a Flux.1 dev model with {@controlnets}, or leave them out")
    if "guidance" not in pipe.denoiser.inputs:
        raise InputError("Flux ControlNets run with Flux.1 dev models, and this transformer takes no guidance "
                         "(Flux.1 schnell?)", where="controlnets", fix="use a Flux.1 dev model")
    if s.reference_images:
        raise InputError("reference images (FLUX.1 Kontext) do not combine with a Flux ControlNet",
                         where="reference_images", fix="leave {@reference_images} or {@controlnets} out")
    first = None
    for k, unit in enumerate(units):
        where = f"controlnets[{k}]"
        cn.check_transformer_unit(unit, where, "a Flux ControlNet")
        cn.check_no_control_mask(unit, where, "a Flux ControlNet")
        unit.part = pipe._control_part(unit.net, where)
        lay = getattr(unit.part, "flux_layout", None)
        if lay is None:
            raise InputError(f"{where}: a Flux ControlNet is given as its diffusers .safetensors file (or the folder "
                             f"holding it), not as an ONNX export", where=where,
                             fix="pass diffusion_pytorch_model.safetensors of the ControlNet " + _FIX)
        if lay.modes and unit.union_mode is None:
            raise InputError(f"{where} is a union ControlNet ({lay.modes} modes): it needs the mode of its control "
                             "image", where=f"{where} union_mode",
                             fix=f"pass {{@union_mode}} 0 to {lay.modes - 1} (the net's model card lists its modes, "
                                 "e.g. 0 canny, 2 depth for InstantX/Shakker-Labs Union)")
        if isinstance(unit.union_mode, str):
            raise InputError(f"{where} {{@union_mode}} {unit.union_mode!r:.40} is a name; a union Flux ControlNet takes "
                             "the mode's number", where=f"{where} union_mode",
                             fix=f"pass {{@union_mode}} 0 to {max((lay.modes or 1) - 1, 0)} (the net's model card lists its modes)")
        if unit.union_mode is not None and not lay.modes:
            raise InputError(f"{where} has a {{@union_mode}} and is no union ControlNet", where=f"{where} union_mode",
                             fix="leave {@union_mode} out for this net")
        if unit.union_mode is not None and not 0 <= unit.union_mode < (lay.modes or 0):
            raise InputError(f"{where} {{@union_mode}} {unit.union_mode} is not one of the net's {lay.modes} modes",
                             where=f"{where} union_mode", fix=f"pass {{@union_mode}} 0 to {(lay.modes or 1) - 1}")
        if first is not None and lay.hint != first.hint:
            raise InputError(f"{where} is {lay.label} and controlnets[0] {first.label}: the transformer takes the "
                             "residuals of XLabs' nets in turn and the others' by blocks, not both", where=where,
                             fix="use XLabs' nets together, or diffusers-layout ones (e.g. InstantX) together")
        if first is not None and (lay.double, lay.single) != (first.double, first.single):
            raise InputError(f"{where} has {lay.double} double + {lay.single} single blocks and controlnets[0] "
                             f"{first.double} + {first.single}: their residuals cannot be summed", where=where,
                             fix="use ControlNets of the same layout together (as diffusers' FluxMultiControlNetModel)")
        first = first or lay
        assert s.width is not None and s.height is not None
        from .fluxtools import control_image

        unit.control = control_image(unit, s.width, s.height)  # HxWx3 uint8; encoded with the run's generator
    assert first is not None
    use_residuals(pipe.denoiser, (first.double, first.single), first.hint)


def use_residuals(part: Part, counts: tuple[int, int] | None, repeat: bool = False) -> None:
    """The transformer part runs its graph with the residual inputs of a ControlNet of ``counts`` (double, single
    block samples; ``repeat``: the double blocks take them in turn, XLabs' rule), or as its file has it (None)."""
    if counts is None:
        part.edit_graph(None)
        return
    where = str(part.path)

    def edit(graph: Graph) -> Graph:
        from ..checkpoint.fluxcontrolnet import residual_graph

        return graph.derive(residual_graph(graph.model, counts[0], counts[1], where, repeat))

    part.edit_graph(edit, ("flux_controlnet_residuals", counts, repeat))


def encode_controls(pipe: Any, units: Sequence[cn.ControlNet], batch: int, generator: Any,
                    pictures: Sequence[np.ndarray] | None = None, guided: bool = False) -> None:
    """diffusers: each control image, repeated for the batch, VAE-encoded with a sample from the run's generator
    (before the noise), shifted, scaled and packed: ``unit.latents`` ``[batch, tokens, 64]``; an XLabs net's is the
    picture itself, ``[batch, 3, height, width]`` in [-1, 1] (nothing drawn). ``pictures``: HxWx3 uint8 images in
    place of the units' own (the hires pass's, at its size). ``guided`` changes nothing: the negative pass of true
    CFG gets the positive pass's residuals, so diffusers encodes the batch once."""
    from .flowparts import pack_latents
    from .images import to_nchw

    for k, unit in enumerate(units):
        picture = unit.control if pictures is None else pictures[k]
        assert picture is not None
        rgb = np.repeat(to_nchw(picture), batch, axis=0)
        if layout_of(unit).hint:
            unit.latents = rgb
            continue
        unit.latents = pack_latents(pipe._encode_image(rgb, generator).astype(np.float32))


def hook(pipe: Any, units: Sequence[cn.ControlNet], state: cn.ControlState, call: Any
         ) -> Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]:
    """The denoiser hook: the nets on this call's latents, their residuals as the transformer's inputs."""
    from ..checkpoint.fluxcontrolnet import DOUBLE_IN, DOUBLE_OUT, SINGLE_IN, SINGLE_OUT
    from .flowparts import pack_latents, text_ids

    family = pipe.family
    targets = [n for n in pipe.denoiser.inputs if n.startswith((DOUBLE_IN, SINGLE_IN))]
    last: dict[str, Any] = {}

    def residuals(x: np.ndarray, t: np.ndarray, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = x.shape[0]
        packed = pack_latents(x)
        img = packed.shape[1]
        text_feeds = family.cond_feeds(call.cond, rows)  # the positive prompt's, for the negative pass too
        text = text_feeds["encoder_hidden_states"].shape[1]
        joint = feeds["encoder_hidden_states"].shape[1]  # the transformer's text tokens (this pass's prompt)
        on = [u for u in units if state.on(u)]  # its window, and its hires pass
        width = layout_of(units[0]).width
        total: dict[str, np.ndarray] = {}
        for unit in on:
            lay = layout_of(unit)
            assert unit.part is not None and unit.latents is not None
            net_feeds = {"hidden_states": packed, "controlnet_cond": unit.latents, "timestep": t, "img_ids": feeds["img_ids"], **text_feeds,
                         "txt_ids": text_ids(text + (1 if lay.modes else 0))}
            if "guidance" in feeds:
                net_feeds["guidance"] = feeds["guidance"]
            if lay.modes:
                net_feeds["controlnet_mode"] = np.full((rows, 1), unit.union_mode, np.int64)
            inputs = unit.part.inputs
            out = unit.part.run({k: v for k, v in net_feeds.items() if k in inputs})
            scale = np.float32(unit.scale)
            for j in range(lay.double):
                r = np.asarray(out[f"{DOUBLE_OUT}{j}"], np.float32) * scale
                total[f"{DOUBLE_IN}{j}"] = total[f"{DOUBLE_IN}{j}"] + r if f"{DOUBLE_IN}{j}" in total else r
            for j in range(lay.single):
                r = np.asarray(out[f"{SINGLE_OUT}{j}"], np.float32)[:, -img:] * scale
                total[f"{SINGLE_IN}{j}"] = total[f"{SINGLE_IN}{j}"] + r if f"{SINGLE_IN}{j}" in total else r
        state.calls.append(len(on))
        result = {}
        for name in targets:
            r = total.get(name)
            if r is None:  # off this step: diffusers runs the net at scale 0, which adds zeros
                r = np.zeros((rows, img, width), np.float32)
            if name.startswith(SINGLE_IN):  # the transformer's single blocks carry the text tokens first: zeros there
                r = np.concatenate([np.zeros((rows, joint, r.shape[2]), np.float32), r], axis=1)
            result[name] = r
        return result

    def add(feeds: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        x = np.asarray(feeds[family.sample_input])
        t = np.asarray(feeds["timestep"])
        key = (state.step, state.total)
        # the negative pass of true CFG comes with the same latents and step: the same residuals
        if last.get("key") == key and np.array_equal(last["x"], x) and np.array_equal(last["t"], t):
            return last["out"]
        out = residuals(x, t, feeds)
        last.update(key=key, x=x.copy(), t=t.copy(), out=out)
        return out

    return add
