"""SD3 / SD3.5 ControlNets (diffusers' ``SD3ControlNetModel``: with a text stream, or Stability's image-only SD3.5
Large design) in the SD3 pipeline, as diffusers 0.42's ``StableDiffusion3ControlNetPipeline`` runs them.

- a net is its ``.safetensors`` (or the diffusers folder holding it), bound onto a graph cut from sdrt's shipped
  SD3 / SD3.5 transformer graph of its architecture (:mod:`sdrt.checkpoint.sd3controlnet`); the model's transformer runs a copy
  of its own graph with the residual inputs added (``Part.edit_graph``), the plain one again when no net is asked;
- the control image (after the unit's preprocessor and resize, as an SD ControlNet's) is VAE-encoded once per row
  of the transformer's batch (both CFG halves: diffusers encodes the doubled batch), with samples drawn from the
  run's generator before the noise (several nets: in the order given), and scaled; shifted by the VAE's shift
  factor only for a net with ``force_zeros_for_pooled_projection: false`` (diffusers: "instantx sd3 controlnet
  does not apply shift factor"), whose pooled projections are the prompt's; the others get zeros;
- every step the net runs on the transformer's own inputs (latents, timestep, both CFG halves' text; an
  image-only net: the tokens the model's ``pos_embed`` makes of the latents, which the transformer's graph gives
  as an extra output, run alone, instead of the latents and text); its
  residuals times ``scale`` go to the transformer; a net outside its window (diffusers' ``controlnet_keep``) adds
  nothing; several nets' residuals are summed (they must have the same block count, as in diffusers'
  ``SD3MultiControlNetModel``), and the first net's config decides the pooled projections and the shift for all,
  as diffusers' pipeline reads ``nets[0].config``;
- img2img and inpainting (with a plain SD3 / SD3.5 model) run as txt2img does on the img2img and inpaint
  pipelines' schedule (diffusers has no such SD3 pipeline; the order is its Flux ControlNet img2img / inpaint
  pipelines'): the control latents are drawn first, then the init image's, then the noise (inpainting: then the
  masked image's); the window is judged over the steps the cut schedule runs, which the pipeline's step count
  already is; the hires fix's second pass resizes each control map (made once) to the target size and encodes it before
  the upscaled image (``ToolboxMixin._encode_controls``, shared with Flux's nets).
- alimama's inpainting nets (17 control channels) run as ``StableDiffusion3ControlNetInpaintingPipeline``: txt2img,
  the unit's picture with the pixels its ``control_mask`` repaints set to black, encoded once per image before the
  noise, shifted and scaled, and ``1 - mask`` at the latent size as the 17th channel (:func:`inpaint_latents`);
  with an init image or the hires fix they are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from . import controlnet as cn

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint.sd3controlnet import SD3NetLayout
    from ..graph import Graph
    from .parts import Part
    from .settings import Settings


#: transformer width -> the SD3 models of it
_MODELS = {1536: "SD3 Medium / SD3.5 Medium", 2432: "SD3.5 Large"}


def layout_of(unit: cn.ControlNet) -> SD3NetLayout:
    lay = getattr(unit.part, "sd3_layout", None)
    assert lay is not None
    return lay


def prepare(pipe: Any, s: Settings) -> None:
    """Check the run, bind each unit's net, give the transformer the residual inputs of their block count."""
    tb = s.toolbox
    units: list[cn.ControlNet] = tb.controlnets
    first = None
    for k, unit in enumerate(units):
        where = f"controlnets[{k}]"
        cn.check_transformer_unit(unit, where, "an SD3 ControlNet")
        if unit.union_mode is not None:
            raise InputError(f"{where} has a {{@union_mode}}: SD3 ControlNets have no union modes",
                             where=f"{where} union_mode", fix="leave {@union_mode} out")
        unit.part = pipe._control_part(unit.net, where)
        lay = getattr(unit.part, "sd3_layout", None)
        # the hint of SD 1.x's inpaint ControlNet (-1 under the mask), and the colour fix of an SD UNet's noise
        if unit.preprocessor in cn.INPAINT_NAMES + cn.COLORFIX_NAMES:
            cn.check_no_control_mask(unit, where, "an SD3 ControlNet")
        if lay is None:
            raise InputError(f"{where} is an ONNX ControlNet (an SD 1.x / SDXL UNet's), and the model is SD3, whose "
                             "ControlNets are given as their diffusers .safetensors file (or the folder holding it)",
                             where=where, fix="pass diffusion_pytorch_model.safetensors of an SD3 ControlNet "
                                              "({@@controlnets})")
        if lay.inpaint and (s.mode != "txt2img" or tb.hires is not None):  # before its mask: one would not help
            hires = s.mode == "txt2img"
            raise InputError("an SD3 inpainting ControlNet runs as diffusers' "
                             "StableDiffusion3ControlNetInpaintingPipeline: a txt2img run whose unit carries the "
                             f"picture and its mask; {'the hires fix' if hires else 'an init image'} with one is not "
                             "supported", where="hires_scale" if hires else "init_image",
                             fix="leave {@hires_scale} unset" if hires else
                             "leave {@init_image} and {@mask} out, and give the picture as the unit's image with its "
                             "{@control_mask}")
        if lay.inpaint and unit.control_mask is None:
            raise InputError(f"{where} is {lay.label}: it needs the mask of its picture", where=f"{where} control_mask",
                             fix="pass {@control_mask=}MASK (white = repaint) with the picture as the unit's image")
        if lay.inpaint:  # read now: a mask that is no picture is refused before the run, naming the unit
            from .images import mask_gray

            mask_gray(unit.control_mask, f"{where} control_mask")
        if unit.control_mask is not None and not lay.inpaint:
            raise InputError(f"{where} has a {{@control_mask}} and is {lay.label}, which reads none (only SD3 "
                             "inpainting ControlNets do)", where=f"{where} control_mask",
                             fix="leave {@control_mask} out for this net")
        if first is not None and lay.inpaint != first.inpaint:
            raise InputError(f"{where} is {lay.label} and controlnets[0] {first.label}: an inpainting net and "
                             "another do not run together (diffusers runs them in two different pipelines)",
                             where=where, fix="use SD3 inpainting ControlNets alone, or the others together")
        if first is not None and lay.blocks != first.blocks:
            raise InputError(f"{where} has {lay.blocks} blocks and controlnets[0] {first.blocks}: their residuals "
                             "cannot be summed", where=where,
                             fix="use SD3 ControlNets of the same block count together (as diffusers' "
                                 "SD3MultiControlNetModel)")
        first = first or lay
        assert s.width is not None and s.height is not None
        from .fluxtools import control_image

        unit.control = control_image(unit, s.width, s.height)  # HxWx3 uint8; encoded with the run's generator
    assert first is not None
    use_residuals(pipe.denoiser, first.blocks, any(layout_of(u).image_only for u in units))
    from ..checkpoint.sd3controlnet import SAMPLE

    info = pipe.denoiser.inputs.get(f"{SAMPLE}0")
    width = info.shape[-1] if info is not None else None
    for k, unit in enumerate(units):
        lay = layout_of(unit)
        if isinstance(width, int) and lay.width != width:
            raise InputError(f"controlnets[{k}] is {lay.label}, and this model's transformer is {width} wide "
                             f"({_MODELS.get(width, 'another SD3')})", where=f"controlnets[{k}]",
                             fix=f"use it with {_MODELS.get(lay.width, 'the model it was made for')}")


def use_residuals(part: Part, blocks: int | None, embedded: bool = False) -> None:
    """The transformer part runs its graph with the residual inputs of a ControlNet of ``blocks`` blocks (and, for
    an image-only net, the output of its ``pos_embed``), or as its file has it (None)."""
    if blocks is None:
        part.edit_graph(None)
        return
    where = str(part.path)

    def edit(graph: Graph) -> Graph:
        from ..checkpoint.sd3controlnet import residual_graph

        return graph.derive(residual_graph(graph.model, blocks, where, embedded))

    part.edit_graph(edit, ("sd3_controlnet_residuals", blocks, embedded))


def encode_controls(pipe: Any, units: Sequence[cn.ControlNet], batch: int, generator: Any,
                    pictures: Sequence[np.ndarray] | None = None, guided: bool = False) -> None:
    """diffusers: each control image, repeated for the transformer's rows (the batch, twice when ``guided``: CFG),
    VAE-encoded with a sample per row from the run's generator (before the init image's and the noise) and scaled,
    shifted only for a net that takes the prompt's pooled projections: ``unit.latents`` ``[rows, 16, h, w]``.
    ``pictures``: HxWx3 uint8 images in place of the units' own (the hires pass's, at its size)."""
    from .images import to_nchw

    scale, shift = pipe.family.scaling
    keep_shift = not layout_of(units[0]).zero_pooled
    rows = batch * (2 if guided else 1)  # diffusers encodes both CFG halves' rows
    for k, unit in enumerate(units):
        picture = unit.control if pictures is None else pictures[k]
        assert picture is not None
        if layout_of(unit).inpaint:
            unit.latents = inpaint_latents(pipe, unit, picture, batch, generator, guided, f"controlnets[{k}]")
            continue
        rgb = np.repeat(to_nchw(picture), rows, axis=0)
        latents = pipe._encode_image(rgb, generator).astype(np.float32)
        if shift and not keep_shift:  # sdrt's encoding subtracts the shift: give it back
            latents = latents + np.float32(shift) * np.float32(scale)
        unit.latents = latents


def inpaint_latents(pipe: Any, unit: cn.ControlNet, picture: np.ndarray, batch: int, generator: Any,
                    guided: bool, unit_where: str = "controlnets[0]") -> np.ndarray:
    """diffusers' ``StableDiffusion3ControlNetInpaintingPipeline.prepare_image_with_mask``: the picture with the
    pixels to repaint set to -1 (black), repeated for the batch, VAE-encoded with a sample per image (not per CFG
    row), shifted and scaled; then ``1 - mask`` at the latent size (nearest); both CFG halves the same rows:
    ``[rows, 17, h, w]``. The mask is binarized at 0.5 after its resize to the picture's size (the unit's mode)."""
    from .images import binarize, fit_array, mask_gray, nearest, to_nchw

    height, width = picture.shape[:2]
    where = f"{unit_where} control_mask"
    gray = fit_array(mask_gray(unit.control_mask, where), width, height, unit.resize, "control mask", where)
    mask = binarize(gray)
    masked = np.where(mask[None, None] > 0.5, np.float32(-1.0), to_nchw(picture)).astype(np.float32)
    latents = pipe._encode_image(np.repeat(masked, batch, axis=0), generator).astype(np.float32)
    keep = 1.0 - nearest(mask, latents.shape[2], latents.shape[3])
    cond = np.concatenate([latents, np.repeat(keep[None, None], batch, axis=0)], axis=1).astype(np.float32)
    return np.concatenate([cond, cond], axis=0) if guided else cond


def hook(pipe: Any, units: Sequence[cn.ControlNet], state: cn.ControlState, call: Any = None
         ) -> Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]:
    """The denoiser hook: the nets on this call's inputs, their residuals as the transformer's inputs (``call``,
    the model call Flux's hook reads its prompt from, is not needed: the nets read the transformer's feeds)."""
    from ..checkpoint.sd3controlnet import EMBEDDED, SAMPLE

    family = pipe.family
    model = pipe.denoiser
    targets = [n for n in model.inputs if n.startswith(SAMPLE)]
    first = layout_of(units[0])

    def add(feeds: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        x = np.asarray(feeds[family.sample_input])
        rows, tokens = x.shape[0], (x.shape[2] // 2) * (x.shape[3] // 2)
        pooled = np.asarray(feeds["pooled_projections"])
        net_feeds = {"hidden_states": x, "timestep": feeds["timestep"],
                     "encoder_hidden_states": feeds["encoder_hidden_states"],
                     "pooled_projections": np.zeros_like(pooled) if first.zero_pooled else pooled}
        on = [u for u in units if state.on(u)]  # its window, and its hires pass
        if any(layout_of(u).image_only for u in on):  # the model's pos_embed on the latents: the transformer's own
            zeros = {n: np.zeros((rows, tokens, first.width), np.float32) for n in targets}
            inputs = model.inputs
            net_feeds[EMBEDDED] = model.run({k: v for k, v in {**feeds, **zeros}.items() if k in inputs},
                                            outputs=(EMBEDDED,))[EMBEDDED]
        total: dict[str, np.ndarray] = {}
        for unit in on:
            assert unit.part is not None and unit.latents is not None
            cond = unit.latents if unit.latents.shape[0] == rows else unit.latents[-rows:]
            inputs = unit.part.inputs
            out = unit.part.run({k: v for k, v in {**net_feeds, "controlnet_cond": cond}.items() if k in inputs})
            s = np.float32(unit.scale)
            for j in range(layout_of(unit).blocks):
                name = f"{SAMPLE}{j}"
                r = np.asarray(out[name], np.float32) * s
                total[name] = total[name] + r if name in total else r
        state.calls.append(len(on))
        # off this step: diffusers runs the nets at scale 0, which adds zeros
        return {name: total.get(name, np.zeros((rows, tokens, first.width), np.float32)) for name in targets}

    return add
