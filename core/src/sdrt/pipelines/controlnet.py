"""ControlNet for SD 1.x and SDXL: control images -> residuals the UNet adds, as diffusers computes them.

(Flux.1 ControlNets share the unit, its image preparation and window rule; their nets and hook are in
:mod:`sdrt.pipelines.fluxcontrolnet`.)

Layout (diffusers' community ONNX ControlNet pipelines): a ControlNet is its own ``model.onnx`` with inputs
``sample``, ``timestep``, ``encoder_hidden_states``, ``controlnet_cond`` (RGB in [0, 1], NCHW, at the
output size), ``conditioning_scale`` (SDXL adds ``text_embeds``, ``time_ids``) and outputs
``down_block_res_samples_0..N``, ``mid_block_res_sample``; the UNet takes
``down_block_additional_residual_0..N`` and ``mid_block_additional_residual``. A ControlNet is found as
``controlnet/`` (``controlnet_2/``, ...) in the model folder, or given as its own folder or file. A
ControlNet ``.safetensors`` as people download it (lllyasviel's LDM layout, or diffusers'
``diffusion_pytorch_model.safetensors``, alone or in its folder) is bound onto sdrt's shipped weight-free
ControlNet graph of its base (``sdrt.checkpoint.controlnet``).

The rules (``StableDiffusionControlNetPipeline`` / ``StableDiffusionXLControlNetPipeline``, guess mode off):

- the ControlNet runs on the same rows as the UNet (uncond and cond alike), with the UNet's sample,
  timestep, text and SDXL's ``text_embeds``/``time_ids``; the control image is repeated for every row;
- at step ``i`` of ``n`` a net with window ``[start, end]`` is on when
  ``not (i / n < start or (i + 1) / n > end)``, and then runs at its ``scale``; diffusers runs it at
  scale 0 otherwise, which adds exactly zero: here a net that is off is skipped when another net is on,
  and run at scale 0 (as diffusers) when none is, so the UNet always gets what diffusers feeds it;
- several nets: their residuals are summed element by element, in the order given.

Control modes (per unit; :func:`residual_scales`):

- sd-webui-controlnet's ``control_mode``: "Balanced" (the rules above); "My prompt is more important" (soft
  injection: residual ``i``, counted from the first down residual with the mid block last, times
  ``weight * 0.825 ** (12 - i)``: SD 1.x's 13 residuals 0.1 to 1, SDXL's 10 truncated, the mid at 0.825**3);
  "ControlNet is more important" (soft injection and cfg injection: the uncond rows get no residual). In the
  hires fix's second pass a Balanced ``canny`` or ``mlsd`` unit is soft-injected too, as the extension does;
- diffusers' ``guess_mode=True``: residual ``i`` of ``n`` times ``scale * logspace(-1, 0, n)[i]``, cond rows only.

A unit whose uncond rows get nothing runs its net on the cond rows only (rows ``[uncond, cond]`` as the batched
CFG denoiser stacks them), and zeros stand for the uncond half.

:class:`ControlNet` is one unit (net, image, scale, window, preprocessor, resize mode); :func:`hook`
builds the per-call hook the family's denoiser runs before each UNet call (``ModelCall.hooks``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FileChanged, InputError, ModelError, WeightsError
from .controlmaps import finite_number
from .preprocessors import AT_RESOLUTION, NAMES, WITH_MODELS, check_thresholds, threshold_fields
from .preprocessors import preprocess as _preprocess

INPAINT_NAMES = ("inpaint", "inpaint_only", "inpaint_only+lama")  #: sdrt.pipelines.inpaintcn.INPAINT
COLORFIX_NAMES = ("tile_colorfix", "tile_colorfix+sharp")  #: sdrt.pipelines.colorfix.NAMES
#: True while a run plan runs the pipeline dry (sdrt.pipelines.plan.dry_run): a model-backed preprocessor's map is
#: then zeros of the size it would have, and its network neither compiles nor runs
PLANNING: ContextVar[bool] = ContextVar("sdrt_controlnet_planning", default=False)
#: the reference modules: no net, the picture guides the UNet itself (sdrt.pipelines.refattn)
REFERENCE = ("reference_only", "reference_adain", "reference_adain+attn")
#: the revision modules: no net, the picture's CLIP embedding replaces SDXL's pooled text (sdrt.pipelines.revision)
REVISION = ("revision_clipvision", "revision_ignore_prompt")
#: the T2I-Adapter style adapter's module: the net is the adapter (sdrt.pipelines.styleadapter)
STYLE = "t2ia_style_clipvision"

if TYPE_CHECKING:  # pragma: no cover
    from .parts import Part

__all__ = ["CONTROL_MODES", "HR_OPTIONS", "PREPROCESSORS", "ControlNet", "ControlState", "control_mode", "hook",
           "hr_option", "infotext", "on_pass", "parse_units", "preprocess", "residual_inputs", "residual_scales"]

#: preprocessors that need no model (sdrt.pipelines.preprocessors); "none" feeds the image as it is
PREPROCESSORS = NAMES
DOWN_OUT, MID_OUT = "down_block_res_samples_", "mid_block_res_sample"
DOWN_IN, MID_IN = "down_block_additional_residual_", "mid_block_additional_residual"
#: sd-webui-controlnet's control modes (its ``ControlMode`` enum; a number is the index, as its API took it)
CONTROL_MODES = ("Balanced", "My prompt is more important", "ControlNet is more important")
#: sd-webui-controlnet's ``hr_option`` (its ``HiResFixOption``): which passes of a hires-fix run a unit takes part in
HR_OPTIONS = ("Both", "Low res only", "High res only")
#: the extension's soft injection: residual i of 13 times SOFT_BASE ** (12 - i)
SOFT_BASE = 0.825
#: the largest ``processor_res`` a unit takes (the CLI's ``--control-processor-res`` too)
MAX_PROCESSOR_RES = 8192
#: the weights file of a diffusers ControlNet folder (named after its folder in the infotext)
WEIGHTS_NAMES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors")


@dataclass
class ControlNet:
    """One ControlNet unit: ``net`` (a folder holding ``model.onnx``, a ``model.onnx`` file, a ControlNet
    ``.safetensors`` file (LDM or diffusers layout) or a diffusers ControlNet folder holding one, or the name
    of a part of the model folder such as ``"controlnet"``, or an ``OpenedControlNet`` from
    ``sdrt.checkpoint.controlnet.open_controlnet(file, graph=...)``), the control ``image`` (HxWx3 uint8, a
    ``PIL.Image`` or a PNG/JPEG path), ``scale``, the window ``start``..``end`` (fractions of the steps),
    the ``preprocessor`` (``none``, ``canny``, ``scribble``, ``threshold``, ``invert``, ``tile_resample``,
    ``lineart_standard``, ``scribble_xdog``, ``shuffle``, ``color``, ``blur_gaussian``, ``recolor_luminance``,
    ``recolor_intensity``: sd-webui-controlnet's model-free ones, :mod:`sdrt.pipelines.preprocessors`; the tile
    net's ``tile_colorfix`` / ``tile_colorfix+sharp``, the image as it is and a colour fix of the latents while
    sampling (``low`` its Variation, ``high`` its Sharpness: :mod:`sdrt.pipelines.colorfix`);
    ``low``/``high`` are its ``threshold_a``/``threshold_b``: canny's two thresholds, the scribble and threshold
    level, the down sampling rate, XDoG threshold, sigma or gamma, mlsd's value and distance thresholds) and
    ``resize`` (sd-webui-controlnet's ``Just Resize``, ``Crop and Resize``, ``Resize and Fill``) to the output size. ``processor_res``: the map of
    a preprocessor that reads a resolution is made with the image's shorter side at that many pixels, as the extension
    makes it (None: at the image's own size); ``pixel_perfect``: that resolution is the extension's "pixel
    perfect" one, the image's shorter side once resized to the output. ``control_mode``: sd-webui-controlnet's
    ``Balanced``, ``My prompt is more important``, ``ControlNet is more important`` (or 0, 1, 2);
    ``guess_mode``: diffusers' guess mode (the residuals scaled from 0.1 to 1, none for the uncond rows).
    ``hr_option``: with the hires fix, the passes the unit takes part in (sd-webui-controlnet's ``hr_option``):
    ``"Both"`` (the default), ``"Low res only"`` (the first pass), ``"High res only"`` (the second pass), or 0, 1, 2;
    on the other pass the unit is left out, as if not given (its map is still made from the first pass's size).
    ``seed``: the ``shuffle`` map's numpy seed (None: the extension's, ``(seed + subseed) & 0xFFFFFFFF`` of the
    run, the subseed as given being the seed when none or -1 is, a drawn one counting not). ``window``: how ``start``/``end`` pick the steps:
    ``"diffusers"`` (step ``i`` of ``n`` is on unless
    ``i / n < start or (i + 1) / n > end``) or ``"a1111"`` (sd-webui-controlnet's: on while
    ``start <= i / n <= end``, one step more at the end when ``end * n`` is no whole number of steps).
    ``union_mode``: a union Flux ControlNet's control type (diffusers' ``control_mode``); Flux ControlNets run
    through :mod:`sdrt.pipelines.fluxcontrolnet`. For xinsir's SDXL ControlNet Union: its index or name (``openpose``,
    ``depth``, ``softedge``, ``canny``, ``normal``, ``segment``, ``tile``, ``inpaint``; ``lineart``/``mlsd`` are
    ``canny``, ``scribble``/``hed`` ``softedge``), None: told by the preprocessor (``canny``, ``depth_midas``, ...). ``control_mask``: an SD3 inpainting ControlNet's mask (alimama's;
    white = repaint, diffusers' ``control_mask``; a path, ``PIL.Image`` or HxW array) for its picture ``image``.
    ``face_tokens``: InstantID's ControlNet, whose text is the face tokens of the run's InstantID IP-Adapter (None:
    told by the net's name or the ``instant_id_face_keypoints`` preprocessor; docs/toolbox.md "InstantID (SDXL)")."""

    net: Any
    image: Any
    scale: float = 1.0
    start: float = 0.0
    end: float = 1.0
    preprocessor: str = "none"
    resize: str = "Crop and Resize"
    low: float | None = None
    high: float | None = None
    processor_res: int | None = None
    pixel_perfect: bool = False
    control_mode: Any = "Balanced"
    guess_mode: bool = False
    window: str = "diffusers"
    #: a union Flux ControlNet's mode (diffusers' ``control_mode``: the index of the control type in the net's model
    #: card, e.g. 0 canny, 2 depth for InstantX/Shakker-Labs Union); None for any other net
    union_mode: int | str | None = None
    #: an SD3 inpainting ControlNet's mask (white = repaint) for its picture ``image``; None for any other net
    control_mask: Any = None
    #: an SDXL ControlNet Union's control type the run uses (from ``union_mode`` or the preprocessor; the pipeline fills it)
    union_type: int | None = field(default=None, repr=False)
    #: InstantID's ControlNet: its ``encoder_hidden_states`` are the face tokens of the run's InstantID IP-Adapter
    #: (diffusers' community InstantID pipeline, sd-webui-controlnet's ``control_context_override``), not the prompt;
    #: None: so when the net's file or folder name says InstantID (:func:`names_instantid`: ``control_instant_id_sdxl``,
    #: InstantX's ``InstantID/ControlNetModel``, as the extension tells the model type) or its preprocessor is
    #: ``instant_id_face_keypoints``
    face_tokens: bool | None = None
    #: the shuffle preprocessor's numpy seed; None: derived from the run's seed (the pipeline fills run_seed)
    seed: int | None = None
    #: with ``inpaint_area="only masked"``: cut the control image to the area the run repaints before its
    #: preprocessor (sd-webui-controlnet's ``inpaint_crop_input_image``, on by default); False: the whole image
    inpaint_crop: bool = True
    #: with the hires fix: "Both" passes, "Low res only" (the first), "High res only" (the second); :data:`HR_OPTIONS`
    hr_option: Any = "Both"
    #: a model-backed preprocessor's files: the folder holding them (or an A1111 / ComfyUI folder with the
    #: extension's ``annotator/downloads/<folder>`` or controlnet_aux's ``ckpts/<repo>`` layout under it), the file,
    #: or the files (:mod:`sdrt.pipelines.annotators` names each preprocessor's); compiled on ``pose_backend``
    #: (None: the pipeline's backend and device; "auto": the best here)
    preprocessor_models: Any = None
    #: the older name of ``preprocessor_models`` (when only the pose preprocessors read files); either may be given
    pose_models: Any = None
    pose_backend: str | None = None
    pose_device: Any = field(default=None, repr=False)  #: filled in by the pipeline with its device
    #: how the caller named the models ("preprocessor_models", or "pose_models"), for errors
    models_arg: str = field(default="preprocessor_models", repr=False)
    #: filled in by the pipeline
    part: Part | None = field(default=None, repr=False)
    control: np.ndarray | None = field(default=None, repr=False)
    #: the processor resolution the first control map was made at (the infotext's), None: the image's own
    made_at: int | None = field(default=None, repr=False)
    #: the numpy seed the run gives the shuffle map when ``seed`` is None (:func:`seed_units`)
    run_seed: int | None = field(default=None, repr=False)
    #: a Flux ControlNet's packed control latents ``[batch, tokens, 64]`` (sdrt.pipelines.fluxcontrolnet)
    latents: np.ndarray | None = field(default=None, repr=False)
    #: an only-masked run's paste (sdrt.pipelines.onlymasked.Paste: the picture's size and the crop box) that the
    #: control image is cut to (:func:`prepare_image`); None: the whole image
    region: Any = field(default=None, repr=False)
    #: the run's control map as the preprocessor made it, before its resize to a pass's size: made once, at the
    #: first pass, and resized again for the hires fix's second pass (:func:`prepare_image`)
    detected: np.ndarray | None = field(default=None, repr=False)
    #: an ``inpaint_only`` unit in a run without a mask of its own: its restore of the picture outside the mask runs
    #: (sdrt.pipelines.inpaintcn); in a run with a mask it runs as ``inpaint``, as the extension's
    restores: bool = field(default=False, repr=False)
    #: its last map at a pass's size (an inpaint unit's RGBA, the restore and the pixel blend read it; a colour-fix
    #: unit's RGB, its picture latent is encoded from it: sdrt.pipelines.colorfix)
    prepared: np.ndarray | None = field(default=None, repr=False)
    #: the VAE latent of its map's picture, per pass size (the restore's and the colour fix's)
    origin: dict = field(default_factory=dict, repr=False)
    #: a face-token unit's text, filled by the pipeline: (the UNet input that tells the rows apart, its value on the
    #: negative rows, the positive rows' face tokens, the negative rows') (:func:`face_context`)
    context: Any = field(default=None, repr=False)
    #: a T2I-Adapter unit's network (sdrt.pipelines.t2iadapter.AdapterNet) and its features per pass size
    adapter: Any = field(default=None, repr=False)
    features: dict = field(default_factory=dict, repr=False)
    #: an ``inpaint_only+lama`` unit: the job's first batch draws noise leaning towards its filled picture (the
    #: extension's ``HackedImageRNG``, on a job's first batch only); a caller that runs a job's batches as separate
    #: calls (serve's ``n_iter``) sets it False after the first
    lean_noise: bool = field(default=True, repr=False)

    @property
    def reads_face_tokens(self) -> bool:
        """Whether the net's text is InstantID's face tokens (``face_tokens``, or told by its name / preprocessor)."""
        if self.face_tokens is not None:
            return bool(self.face_tokens)
        if self.preprocessor == "instant_id_face_keypoints":
            return True
        source = self.part.source_file if self.part is not None else None
        return any(names_instantid(p) for p in (getattr(self.net, "path", self.net), source) if p is not None)

    @property
    def model_name(self) -> str:
        source = self.part.source_file if self.part is not None else None  # a .safetensors on a shipped graph
        path = source or (self.part.path if self.part is not None else Path(str(getattr(self.net, "path", self.net))))
        return path.parent.name if path.name in ("model.onnx", *WEIGHTS_NAMES) else path.stem

    @property
    def cond_only(self) -> bool:
        """Whether the uncond rows of a CFG batch get no residual (cfg injection, or diffusers' guess mode)."""
        return self.guess_mode or self.control_mode == CONTROL_MODES[2]


#: names of a net's file or folder that say nothing of it: the folder above is read instead (InstantX's
#: ``InstantID/ControlNetModel/diffusion_pytorch_model.safetensors``)
#: (not ``controlnet``: a diffusers or Optimum pipeline's subfolder, whose parent names the whole model or a folder of
#: the user's, e.g. ``instantid-tests/controlnet`` holding a canny net)
_GENERIC = frozenset(n.casefold() for n in ("model.onnx", *WEIGHTS_NAMES, "ControlNetModel"))


def names_instantid(path: Any) -> bool:
    """Whether a net's name says InstantID (``instant_id`` / ``instantid``, any case, ``-`` as ``_``), the
    extension's rule: its file or folder name, or past generic names (``diffusion_pytorch_model.safetensors``,
    ``ControlNetModel``, ``model.onnx``) the folder that holds them; never a folder further up."""
    parts = Path(os.fspath(path)).parts if isinstance(path, (str, os.PathLike)) else ()
    i = len(parts) - 1
    while i >= 0:
        name = parts[i].casefold().replace("-", "_")
        if "instant_id" in name or "instantid" in name:
            return True
        if name not in _GENERIC:
            return False
        i -= 1
    return False


def _named(value: Any, names: tuple[str, ...], where: str, what: str, fix: str) -> str:
    """One of the extension's ``names`` for its name (any case) or its index (an int or digits); InputError
    ``"{where} {value} is not {what}"`` otherwise."""
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value.strip())
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[int(value)]
    if isinstance(value, str):
        for name in names:
            if value.strip().casefold() == name.casefold():
                return name
    shown = repr(value[:60]) if isinstance(value, str) else repr(value)[:60]
    raise InputError(f"{where} {shown} is not {what}", where=where, fix=fix)


def control_mode(value: Any, where: str) -> str:
    """The extension's control mode for its name (any case) or its number (0, 1, 2); InputError otherwise."""
    return _named(value, CONTROL_MODES, where, "a ControlNet control mode",
                  f"use {', '.join(CONTROL_MODES[:2])} or {CONTROL_MODES[2]} (or 0, 1, 2)")


def hr_option(value: Any, where: str) -> str:
    """The extension's hr_option for its name (any case) or its number (0, 1, 2); InputError otherwise."""
    return _named(value, HR_OPTIONS, where, "a hires-fix option",
                  f"use {', '.join(repr(o) for o in HR_OPTIONS)} (or 0, 1, 2)")


def on_pass(unit: ControlNet, hires_pass: bool | None) -> bool:
    """Whether a unit takes part in a pass (``hires_pass``: None in a run without the hires fix, where every unit
    does; else whether this is its second pass), as the extension's ``disabled_by_hr_option``."""
    if hires_pass is None or unit.hr_option == HR_OPTIONS[0]:
        return True
    return hires_pass == (unit.hr_option == HR_OPTIONS[2])


def _num(value: Any, name: str, low: float, high: float) -> float:
    if not finite_number(value) or not low <= float(value) <= high:
        raise InputError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}", where=name,
                         fix=f"pass {name} between {low:g} and {high:g}")
    return float(value)


def parse_units(controlnets: Any) -> list[ControlNet]:
    """``controlnets=[(net, image, scale, start, end), ...]`` (or :class:`ControlNet` objects), checked."""
    from ..checkpoint.controlnet import OpenedControlNet
    from .controlmaps import RESIZE_MODES
    from .images import check_path, resize_mode

    if controlnets is None:
        return []
    if isinstance(controlnets, (ControlNet, tuple)) and not (
            isinstance(controlnets, tuple) and controlnets and isinstance(controlnets[0], (tuple, list, ControlNet))):
        controlnets = [controlnets]
    if not isinstance(controlnets, (list, tuple)):
        raise InputError(f"controlnets must be a list of (net, image, scale, start, end), got "
                         f"{type(controlnets).__name__}", where="controlnets",
                         fix="pass controlnets=[(\"controlnet\", image, 1.0, 0.0, 1.0)]")
    units = []
    for k, item in enumerate(controlnets):
        where = f"controlnets[{k}]"
        if isinstance(item, ControlNet):
            unit = ControlNet(**{f: getattr(item, f) for f in ("net", "image", "scale", "start", "end", "preprocessor",
                                                                 "resize", "low", "high", "processor_res",
                                                                 "pixel_perfect", "control_mode", "guess_mode",
                                                                 "window", "union_mode", "control_mask", "seed",
                                                                 "inpaint_crop", "hr_option", "pose_models",
                                                                 "preprocessor_models", "pose_backend", "face_tokens",
                                                                 "lean_noise")})
        elif isinstance(item, (tuple, list)) and 2 <= len(item) <= 6:
            unit = ControlNet(*item[:5])
            if len(item) == 6:
                unit.control_mode = item[5]
        else:
            raise InputError(f"{where} is not (net, image[, scale[, start[, end[, control_mode]]]])", where=where,
                             fix="pass a tuple of 2 to 6 items, or a sdrt.pipelines.ControlNet")
        if not isinstance(unit.lean_noise, (bool, np.bool_)):
            raise InputError(f"{where} lean_noise must be True or False, got {unit.lean_noise!r:.40}", where=where,
                             fix="pass lean_noise=True (the default) or False")
        if unit.window not in ("diffusers", "a1111"):
            raise InputError(f"{where} window {unit.window!r:.40} is not a step window rule", where=where,
                             fix="pass window='diffusers' (the default) or 'a1111'")
        if isinstance(unit.union_mode, str) and unit.union_mode.strip().isdigit():
            unit.union_mode = int(unit.union_mode)
        if isinstance(unit.union_mode, str):  # a control type's name (an SDXL ControlNet Union's: checked with its net)
            if not unit.union_mode.strip():
                raise InputError(f"{where} {{@union_mode}} is empty", where=f"{where} union_mode",
                                 fix="pass a mode number or a control type's name (e.g. canny, depth, openpose)")
        elif unit.union_mode is not None:
            if isinstance(unit.union_mode, bool) or not isinstance(unit.union_mode, (int, np.integer)) \
                    or unit.union_mode < 0:
                raise InputError(f"{where} {{@union_mode}} must be a mode number (0, 1, ...), got "
                                 f"{unit.union_mode!r:.40}", where=f"{where} union_mode",
                                 fix="pass e.g. {@union_mode=}0 (see the net's model card)")
            unit.union_mode = int(unit.union_mode)
        unit.scale = _num(unit.scale, f"{where} scale", 0.0, 10.0)
        unit.start = _num(unit.start, f"{where} start", 0.0, 1.0)
        unit.end = _num(unit.end, f"{where} end", 0.0, 1.0)
        if unit.start > unit.end:
            raise InputError(f"{where} starts at {unit.start:g}, after its end {unit.end:g}", where=where,
                             fix="pass start <= end (fractions of the steps, 0 to 1)")
        from .inpaintcn import ALIASES as INPAINT_ALIASES
        from .inpaintcn import INPAINT

        unit.preprocessor = INPAINT_ALIASES.get(unit.preprocessor, unit.preprocessor)
        if unit.preprocessor not in PREPROCESSORS:
            import difflib

            near = difflib.get_close_matches(str(unit.preprocessor), list(PREPROCESSORS), n=1)
            raise InputError(f"unknown ControlNet preprocessor {unit.preprocessor!r}", where=where,
                             fix=(f"did you mean {near[0]}? " if near else "") + f"use one of {', '.join(PREPROCESSORS)}")
        arg = "pose_models" if unit.preprocessor_models is None and unit.pose_models is not None else \
            "preprocessor_models"
        if unit.preprocessor_models is not None and unit.pose_models is not None \
                and unit.preprocessor_models is not unit.pose_models:
            raise InputError(f"{where}: both preprocessor_models and pose_models are given", where=where,
                             fix="pass preprocessor_models alone (pose_models is its older name)")
        if unit.preprocessor_models is None:
            unit.preprocessor_models = unit.pose_models
        unit.pose_models = unit.preprocessor_models
        unit.models_arg = arg
        if unit.preprocessor in (*REVISION, STYLE):  # its image encoder: a transformers folder too (revision)
            from .annotators import encoder_path

            encoder_path(unit.preprocessor, unit.preprocessor_models, f"{where} {arg}")
        elif unit.preprocessor in WITH_MODELS:
            from .preprocessors import model_files

            model_files(unit.preprocessor, unit.preprocessor_models, f"{where} {arg}")
        unit.control_mode = control_mode(unit.control_mode, f"{where} control_mode")
        unit.hr_option = hr_option(unit.hr_option, f"{where} hr_option")
        if not isinstance(unit.inpaint_crop, (bool, np.bool_)):
            raise InputError(f"{where} inpaint_crop must be True or False, got {unit.inpaint_crop!r:.40}",
                             where=f"{where} inpaint_crop",
                             fix="pass inpaint_crop=True (cut to the only-masked area, the default) or False")
        unit.inpaint_crop = bool(unit.inpaint_crop)
        if unit.face_tokens is not None and not isinstance(unit.face_tokens, (bool, np.bool_)):
            raise InputError(f"{where} face_tokens must be True, False or None, got {unit.face_tokens!r:.40}",
                             where=f"{where} face_tokens", fix="pass face_tokens=True (InstantID's ControlNet), False, "
                                                               "or leave it out (told by the net's name)")
        if not isinstance(unit.guess_mode, (bool, np.bool_)):
            raise InputError(f"{where} guess_mode must be True or False, got {unit.guess_mode!r}",
                             where=f"{where} guess_mode", fix="pass guess_mode=True (diffusers' guess mode) or False")
        unit.guess_mode = bool(unit.guess_mode)
        if unit.guess_mode and unit.control_mode != CONTROL_MODES[0]:
            raise InputError(f"{where} asks for diffusers' guess mode and the control mode {unit.control_mode!r}: "
                             "they are two ways of scaling the residuals", where=f"{where} guess_mode",
                             fix="pass guess_mode=True with the control mode Balanced, or a control mode alone")
        if unit.processor_res is not None:
            res = _num(unit.processor_res, f"{where} processor_res", 1, MAX_PROCESSOR_RES)
            if not res.is_integer():  # a resolution is whole pixels: 512.7 is not silently 512
                raise InputError(f"{where} processor_res must be a whole number of pixels, got {unit.processor_res!r}",
                                 where=f"{where} processor_res", fix=f"pass processor_res={int(res)} or {int(res) + 1}")
            unit.processor_res = int(res)
        # the init image's names (sdrt.pipelines.images.resize_mode): any case, A1111's 0 to 2, the extension's aliases
        unit.resize = resize_mode(RESIZE_MODES[1] if unit.resize is None else unit.resize, f"{where} resize",
                                  RESIZE_MODES)
        if unit.seed is not None:
            if isinstance(unit.seed, bool) or not isinstance(unit.seed, (int, np.integer)) \
                    or not 0 <= unit.seed < 2**32:
                raise InputError(f"{where} seed must be a whole number from 0 to 4294967295, got {unit.seed!r:.40}",
                                 where=f"{where} seed", fix="pass e.g. seed=1234, or leave it out (the run's)")
            unit.seed = int(unit.seed)
        # each preprocessor's thresholds against its sliders (sdrt.pipelines.preprocessors.SPECS): a level it cannot
        # use, or one it does not read (none, invert), is refused now rather than at the first step or silently
        unit.low, unit.high = check_thresholds(unit.preprocessor, unit.low, unit.high, where)
        if unit.preprocessor in REFERENCE + REVISION:  # no model: the extension's model "None"
            if unit.net not in (None, "None", "none", ""):
                raise InputError(f"{where}: {unit.preprocessor} uses no ControlNet model, and {unit.net!s:.60} was "
                                 "given", where=where, fix="pass the net as None")
            unit.net = None
        elif not isinstance(unit.net, (str, os.PathLike, OpenedControlNet)):
            raise InputError(f"{where}: the net must be a folder, a model.onnx or .safetensors path or a part name, "
                             f"got {type(unit.net).__name__}", where=where,
                             fix="pass e.g. \"controlnet\", a folder path or control_v11p_sd15_canny.safetensors")
        if unit.image is None and unit.preprocessor not in INPAINT:  # inpaint: the run's init image and mask
            raise InputError(f"{where} has no control image", where=where, fix="pass the control image")
        if unit.image is not None:
            check_path(unit.image, "control image", where)
        elif unit.control_mask is not None:
            raise InputError(f"{where} has a control_mask and no image: the mask is of the unit's picture",
                             where=f"{where} control_mask", fix="pass the unit's image with its mask, or neither "
                                                                "(the run's init image and mask)")
        if unit.control_mask is not None:
            check_path(unit.control_mask, "control mask", f"{where} control_mask")
        units.append(unit)
    return units


def locate(net: str | os.PathLike[str], root: Path) -> Path:
    """The file of a ControlNet: the ``model.onnx`` of a part of the model folder, of a folder, or the file
    itself; or its ``.safetensors`` (a file given, or a diffusers ControlNet folder without ``model.onnx``),
    which the caller binds onto a shipped graph (:func:`is_weights_file`)."""
    from ..checkpoint.controlnet import folder_file

    text = str(net)
    for candidate in (root / text / "model.onnx", Path(text) / "model.onnx", Path(text)):
        if candidate.is_file():
            return candidate
    for folder in (root / text, Path(text)):
        found_file = folder_file(folder) if folder.is_dir() else None
        if found_file is not None:
            return found_file
    found = sorted(p.name for p in root.glob("controlnet*") if (p / "model.onnx").is_file())
    given = Path(text)
    if given.exists() or (root / text).exists():
        what, where = f"no ControlNet model.onnx or .safetensors at {text!r}", text
    elif given.is_absolute() or len(given.parts) > 1 or given.suffix:
        what, where = f"no ControlNet at {text!r}: no such file or folder", text
    else:  # a part name, as --control-image without --controlnet names the model's own "controlnet"
        what = (f"no ControlNet named {text!r}: the model has no {text}/ part (a folder holding a model.onnx beside "
                f"its other parts), and there is no file or folder {text!r} here")
        where = str(root / text)
    raise ModelError(what, where=where,
                     fix="pass the ControlNet's .safetensors file, or a folder holding its model.onnx ({@@controlnets})"
                         + (f", or one of this model's: {', '.join(found)}" if found else ""))


def is_weights_file(path: Path) -> bool:
    """A ControlNet given as weights (``.safetensors``, or a PyTorch ``.pth``/``.ckpt``/``.bin``) rather than an
    ONNX graph."""
    from ..weights import PICKLE_SUFFIXES

    return path.suffix.lower() == ".safetensors" or path.suffix.lower() in PICKLE_SUFFIXES


def prepare_image(unit: ControlNet, width: int, height: int, where: str) -> np.ndarray:
    """The control image after its preprocessor, resized to the output size: HxWx3 uint8.

    As sd-webui-controlnet's ``get_control``: the map is made once, at the first call (the first pass's size, which
    a pixel-perfect resolution is worked out for), and kept (``unit.detected``); each call resizes that map to its
    size with the unit's resize mode (``detectmap_proc``), so the hires fix's second pass gets the first pass's map
    resized, not a map made again at its size. With an only-masked run (``unit.region``) the input image is first
    cut to the area the run repaints (:func:`sdrt.pipelines.onlymasked.cut_control`)."""
    from . import controlmaps as cm

    if unit.detected is None:
        unit.detected = detect(unit, width, height, where)
    rgb = unit.detected
    if rgb.ndim == 3 and rgb.shape[2] == 4:  # an inpaint map: the picture and its mask (sdrt.pipelines.inpaintcn)
        from .inpaintcn import resize_map

        return resize_map(rgb, width, height, unit.resize) if rgb.shape[:2] != (height, width) else \
            resize_map(rgb, width, height, "Just Resize")
    try:
        if rgb.shape[:2] != (height, width):
            rgb = cm.resize_control(rgb, width, height, unit.resize)
    except cm.ControlImageError as exc:  # named as the caller names the unit, or its threshold ("... low")
        threshold = getattr(exc, "threshold", None)
        raise cm.ControlImageError(exc.what, where=f"{where} {threshold}" if threshold else where,
                                   fix=exc.fix) from None
    return rgb


def detect(unit: ControlNet, width: int, height: int, where: str) -> np.ndarray:
    """A unit's control map (HxWx3 uint8) before its resize: the image (cut to an only-masked run's area), its
    preprocessor at the resolution the unit asks for a ``width x height`` pass."""
    from . import controlmaps as cm
    from .images import to_rgb

    rgb = to_rgb(unit.image, "control image", where)
    mask = None
    if unit.preprocessor in INPAINT_NAMES:  # the map is RGBA: the picture and its mask (sdrt.pipelines.inpaintcn)
        from .images import mask_gray
        from .inpaintcn import check_size

        if unit.control_mask is not None:
            mask = mask_gray(unit.control_mask, f"{where} control_mask")
            check_size(rgb, mask, where)
    if unit.region is not None and unit.inpaint_crop:
        from .onlymasked import cut_control

        rgb = cut_control(rgb, unit.region, unit.resize, width, height, "control image", where)
        if mask is not None:
            mask = cut_control(np.repeat(mask[:, :, None], 3, axis=2), unit.region, unit.resize, width, height,
                               "control mask", where)[:, :, 0]
    if unit.preprocessor in INPAINT_NAMES:
        from .inpaintcn import LAMA, rgba

        a = rgba(rgb, mask)
        if unit.preprocessor != LAMA:
            return a
        if unit.resize == "Resize and Fill":  # the extension's outpaint fix: fitted (the padding masked) before LaMa
            from .inpaintcn import resize_map

            a = resize_map(a, width, height, unit.resize)
        from .lamafill import check_size

        check_size(a.shape[0], a.shape[1], where)  # a strip LaMa cannot read: refused in the plan too
        if PLANNING.get():  # a run plan: the map's size, no network
            return np.zeros_like(a)
        from .preprocessors import lama_fill

        try:
            return lama_fill(a, unit.preprocessor_models, unit.pose_backend or "auto", unit.pose_device,
                             f"{where} {unit.models_arg}")
        except (ModelError, WeightsError) as exc:  # the file named, where it was given the unit's argument
            if isinstance(exc, FileChanged) or not exc.where or not os.path.isfile(exc.where):
                raise
            raise type(exc)(exc.what, where=f"{where} {unit.models_arg}", fix=exc.fix) from None
    res = processor_resolution(unit, rgb.shape[0], rgb.shape[1], width, height)
    if unit.preprocessor in AT_RESOLUTION and unit.made_at is None:  # the infotext's: what ran (None: the image's own)
        unit.made_at = res if res is not None else min(rgb.shape[:2])
    seed = unit.seed if unit.seed is not None else unit.run_seed
    try:
        if unit.preprocessor in WITH_MODELS and PLANNING.get():
            # a run plan (sdrt.pipelines.plan): the map's size without compiling or running the network (it is resized
            # to the pass's size anyway), after the refusals its resolution would give
            from .preprocessors import map_size

            return np.zeros((*map_size(unit.preprocessor, rgb.shape[0], rgb.shape[1], res), 3), np.uint8)
        if unit.preprocessor in WITH_MODELS:
            try:
                return _preprocess(rgb, unit.preprocessor, unit.low, unit.high, res, seed,
                                   models=unit.preprocessor_models, backend=unit.pose_backend or "auto",
                                   device=unit.pose_device, where=f"{where} {unit.models_arg}")
            except (ModelError, WeightsError) as exc:
                # a file that is not the model (another network, a truncated download): its message names the
                # file; where it was given is the unit's argument (serve's unit field, the CLI's flag), not the path
                if isinstance(exc, FileChanged) or not exc.where or not os.path.isfile(exc.where):
                    raise
                raise type(exc)(exc.what, where=f"{where} {unit.models_arg}", fix=exc.fix) from None
        return preprocess(rgb, unit.preprocessor, unit.low, unit.high, res, seed)
    except cm.ControlImageError as exc:  # named as the caller names the unit, or its threshold ("... low")
        threshold = getattr(exc, "threshold", None)
        raise cm.ControlImageError(exc.what, where=f"{where} {threshold}" if threshold else where,
                                   fix=exc.fix) from None


def seed_units(units: Sequence[ControlNet], seed: int, subseed: int | None) -> None:
    """Give each unit the numpy seed sd-webui-controlnet seeds its preprocessors with (``set_numpy_seed``):
    ``(seed + subseed) & 0xFFFFFFFF`` of the run's first image, the subseed (as given, not drawn) being the seed
    without one."""
    from .shufflemap import numpy_seed

    for unit in units:
        unit.run_seed = numpy_seed(seed, subseed)


def preprocess(rgb: np.ndarray, preprocessor: str, low: float | None = None, high: float | None = None,
               resolution: int | None = None, seed: int | None = None) -> np.ndarray:
    """The control map of an HxWx3 uint8 image (HxWx3 uint8): ``preprocessor`` with its thresholds, made at
    ``resolution`` (the image's shorter side, as the extension makes it; None: at the image's own size);
    ``seed``: the shuffle map's numpy seed (:mod:`sdrt.pipelines.preprocessors`)."""
    return _preprocess(rgb, preprocessor, low, high, resolution, seed)


def processor_resolution(unit: ControlNet, image_h: int, image_w: int, width: int, height: int) -> int | None:
    """The resolution a unit's preprocessor runs at: the extension's pixel-perfect one (the image's shorter side
    once scaled to cover the output, or to fit in it for ``Resize and Fill``), else ``processor_res``."""
    if not unit.pixel_perfect:
        return unit.processor_res
    k0, k1 = height / image_h, width / image_w
    k = min(k0, k1) if unit.resize == "Resize and Fill" else max(k0, k1)
    return int(np.round(k * min(image_h, image_w)))


def check_transformer_unit(unit: ControlNet, where: str, net: str) -> None:
    """A transformer family's ControlNet unit takes its scale and window only: a control mode or guess mode (which
    scale an SD UNet's residuals) is refused."""
    if unit.control_mode != CONTROL_MODES[0] or unit.guess_mode:
        raise InputError(f"{where}: control modes and guess mode scale an SD UNet's residuals; {net} takes its "
                         "scale and window only", where=where, fix="leave {@control_mode} Balanced and {@guess_mode} off")


def check_no_control_mask(unit: ControlNet, where: str, net: str, *, sd: bool = False) -> None:
    """A unit's ``control_mask`` is read by SD3 inpainting ControlNets and, on an SD UNet's net (``sd``), the inpaint
    preprocessors: refused on ``net`` ("a Flux ControlNet") otherwise, in one line; the inpaint preprocessors (whose
    hint holds -1 under the mask) are for SD nets only, and so is the colour fix of ``tile_colorfix`` (an SD UNet's
    noise prediction, sdrt.pipelines.colorfix)."""
    if unit.preprocessor in COLORFIX_NAMES and not sd:
        raise InputError(f"{where}: {unit.preprocessor} corrects the colours of an SD UNet's noise prediction while "
                         f"sampling, and this is {net}", where=f"{where} preprocessor",
                         fix="use tile_resample (the same map at its default rate, without the colour fix) or an SD 1.x / "
                                 "SDXL model")
    if unit.preprocessor in INPAINT_NAMES and not sd:
        raise InputError(f"{where}: the {unit.preprocessor} preprocessor makes the hint of an SD inpaint ControlNet "
                         f"(control_v11p_sd15_inpaint), and this is {net}", where=f"{where} preprocessor",
                         fix="use an SD 1.x inpaint ControlNet, or another preprocessor")
    if unit.preprocessor in INPAINT_NAMES:
        return
    if unit.control_mask is not None:
        raise InputError(f"{where} has a {{@control_mask}}, which only SD3 inpainting ControlNets read, and is {net}",
                         where=f"{where} control_mask", fix="leave {@control_mask} out for this net")


def residual_inputs(unet: Part) -> list[str]:
    """The UNet's ControlNet residual inputs in order (down 0..N, then mid); empty for a plain UNet."""
    names = list(unet.inputs)
    down = sorted((n for n in names if n.startswith(DOWN_IN)), key=lambda n: int(n[len(DOWN_IN):]))
    return down + ([MID_IN] if MID_IN in names else [])


def check_net(part: Part, unet: Part, where: str) -> None:
    """A ControlNet graph's inputs and outputs against the UNet's residual inputs; ModelError naming it."""
    needed = ("sample", "timestep", "encoder_hidden_states", "controlnet_cond", "conditioning_scale")
    missing = [n for n in needed if n not in part.inputs]
    if missing:
        raise ModelError(f"the ControlNet {part.path} lacks the input(s) {', '.join(missing)} (it has "
                         f"{', '.join(part.inputs)})", where=where,
                         fix="export the ControlNet with diffusers' ONNX names (sample, timestep, "
                             "encoder_hidden_states, controlnet_cond, conditioning_scale)")
    wanted = [n.replace(DOWN_IN, DOWN_OUT) if n != MID_IN else MID_OUT for n in residual_inputs(unet)]
    if not wanted:
        raise ModelError(f"the {unet.name} takes no ControlNet residuals ({', '.join(unet.inputs)})",
                         where=str(unet.path), fix="export the UNet with down_block_additional_residual_0..N and "
                                                   "mid_block_additional_residual inputs")
    absent = [n for n in wanted if n not in part.outputs]
    if absent:
        raise ModelError(f"the ControlNet {part.path} gives {', '.join(part.outputs)} and the {unet.name} needs "
                         f"{', '.join(absent)}", where=where, fix="use a ControlNet made for this model's UNet")
    label = f"the ControlNet {part.source_file or part.path}"
    given = [n for n in part.outputs if n.startswith(DOWN_OUT)]
    if len(given) != len(wanted) - (MID_OUT in wanted):
        raise ModelError(f"{label} gives {len(given)} down residuals and the {unet.name} takes "
                         f"{len(wanted) - (MID_OUT in wanted)}: they are made for different UNets", where=where,
                         fix="use a ControlNet made for this model's architecture")
    pairs = [(part.outputs[w], unet.inputs[r], 1, f"{w} has") for w, r in zip(wanted, residual_inputs(unet))]
    if "encoder_hidden_states" in unet.inputs:
        pairs.append((part.inputs["encoder_hidden_states"], unet.inputs["encoder_hidden_states"], -1,
                      "encoder_hidden_states has"))
    for net_info, unet_info, axis, what in pairs:
        x, y = _dim(net_info.shape, axis), _dim(unet_info.shape, axis)
        if x is not None and y is not None and x != y:
            raise ModelError(f"{label}: {what} {x} channels and the {unet.name}'s {y}: they are made for "
                             "different UNets", where=where, fix="use a ControlNet made for this model's architecture")


def union_types(part: Part) -> int:
    """An SDXL ControlNet Union graph's number of control types (its ``control_type`` input's width)."""
    n = _dim(part.inputs["control_type"].shape, 1)
    if n is None:
        raise ModelError(f"the ControlNet Union {part.path} takes control_type of no fixed width", where=str(part.path),
                         fix="export it with control_type [batch, number of control types]")
    return n


def _dim(shape: Sequence[Any], axis: int) -> int | None:
    """A static dimension of a shape, or None (dynamic or absent)."""
    if not shape or len(shape) <= (axis if axis >= 0 else -axis - 1):
        return None
    d = shape[axis]
    return int(d) if isinstance(d, (int, np.integer)) else None


@dataclass
class ControlState:
    """Which step the loop is on (the pipeline moves it after every step)."""

    step: int = 0
    total: int = 1
    calls: list[int] = field(default_factory=list)
    #: None: a run without the hires fix; else whether this is the hires fix's second pass (:func:`on_pass`)
    hires_pass: bool | None = None

    def on(self, unit: ControlNet) -> bool:
        """Whether a unit runs at this step: its window (:func:`active`) and its pass (:func:`on_pass`)."""
        return active(unit, self.step, self.total) and on_pass(unit, self.hires_pass)


def active(unit: ControlNet, step: int, total: int) -> bool:
    """diffusers' ``controlnet_keep``: on unless ``i / n < start or (i + 1) / n > end``; with ``window="a1111"``,
    sd-webui-controlnet's ``guidance_schedule_handler``: off when ``i / n < start or i / n > end``."""
    if unit.window == "a1111":
        return unit.start <= step / total <= unit.end
    return not (step / total < unit.start or (step + 1) / total > unit.end)


def residual_scales(unit: ControlNet, n: int, *, hires: bool = False) -> list[float] | None:
    """What each of a unit's ``n`` residuals (down 0..n-2, then mid) is multiplied by, its weight included; None
    for Balanced (the plain ``scale``, which the net's ``conditioning_scale`` applies).

    - diffusers' guess mode: ``scale * logspace(-1, 0, n)``, in float32 as ``torch.logspace`` gives it;
    - the extension's soft injection ("My prompt is more important", "ControlNet is more important", and a
      Balanced ``canny`` or ``mlsd`` unit in the hires fix's second pass): ``weight * 0.825 ** (12 - i)``, its 13 scales
      zipped with the residuals from the first: SD 1.x's 13 go from 0.099 to 1, SDXL's 10 from 0.099 to 0.56
      (the extension cuts the list to 10, and the mid block's scale is 0.825**3), a residual past the 13th
      gets none."""
    if unit.guess_mode:
        return [float(v) for v in np.logspace(-1, 0, n).astype(np.float32) * np.float32(unit.scale)]
    soft = unit.control_mode != CONTROL_MODES[0] or (hires and unit.preprocessor in ("canny", "mlsd"))
    if not soft:
        return None
    return [float(np.float32(unit.scale * SOFT_BASE ** (12 - i))) if i < 13 else 0.0 for i in range(n)]


def face_context(unit: ControlNet, feeds: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
    """A face-token unit's ``encoder_hidden_states`` for this call's rows: the negative face tokens (the projection
    of a zero embedding) on the rows whose IP-Adapter key input is the negative pass's, the face's tokens on the
    others, however CFG stacks or splits the rows."""
    marker, neg_key, pos, neg = unit.context
    got = np.asarray(feeds[marker]).reshape(rows, -1)
    is_neg = np.all(got == np.asarray(neg_key, got.dtype).reshape(1, -1), axis=1)
    return np.stack([neg[0] if n else pos[0] for n in is_neg]).astype(np.float32)


def hook(units: Sequence[ControlNet], unet: Part, state: ControlState, *, latent_channels: int,
         sample_name: str = "sample", batch: int | None = None, hires: bool = False
         ) -> Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]:
    """The denoiser hook: run the nets on this call's feeds, sum their residuals, feed the UNet.

    ``batch``: the images per call, so that a call of ``2 * batch`` rows is a CFG batch (``[uncond, cond]``, as
    the batched CFG denoiser stacks it), whose uncond half a cond-only unit skips; ``hires``: the second pass."""
    targets = residual_inputs(unet)
    scales = {id(u): residual_scales(u, len(targets), hires=hires) for u in units}

    def run(unit: ControlNet, feeds: dict[str, np.ndarray], on: bool) -> dict[str, np.ndarray]:
        assert unit.part is not None and unit.control is not None
        inputs = unit.part.inputs
        sample = feeds[sample_name][:, :latent_channels]  # an inpainting UNet's extra channels are not the net's
        rows = sample.shape[0]
        text = face_context(unit, feeds, rows) if unit.context is not None else None
        # cfg injection / guess mode: the uncond rows get zeros, so the net runs on the cond half only
        split = unit.cond_only and batch is not None and rows == 2 * batch
        if split:
            assert batch is not None
            feeds = {k: (v[batch:] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == rows else v)
                     for k, v in feeds.items() if k in inputs or k == "timestep"}
            sample, rows = sample[batch:], batch
            text = text[batch:] if text is not None else None
        factors = scales[id(unit)]
        scale = unit.scale if on else 0.0
        net_feeds: dict[str, np.ndarray] = {"sample": sample, "controlnet_cond": np.repeat(unit.control, rows, axis=0),
                                            "conditioning_scale": np.asarray(scale if factors is None else 1.0,
                                                                             dtype=np.float32)}
        t = np.asarray(feeds["timestep"]).reshape(-1)
        ts = inputs["timestep"].shape
        net_feeds["timestep"] = t[:1].reshape(()) if len(ts) == 0 else np.resize(t, (rows,))
        if text is not None:  # InstantID: the face tokens in place of the prompt
            net_feeds["encoder_hidden_states"] = text
        if "control_type" in inputs:  # an SDXL ControlNet Union: its image's type, as diffusers' union pipeline feeds it
            assert unit.union_type is not None
            onehot = np.zeros((rows, union_types(unit.part)), np.float32)
            onehot[:, unit.union_type] = 1.0
            net_feeds["control_type"] = onehot
            net_feeds["control_type_idx"] = np.array([unit.union_type], np.int64)
        for name in inputs:
            if name not in net_feeds and name in feeds:
                net_feeds[name] = feeds[name]
        if "conditioning_scale" in inputs and len(inputs["conditioning_scale"].shape) == 1:
            net_feeds["conditioning_scale"] = net_feeds["conditioning_scale"].reshape(1)
        out = unit.part.run(net_feeds)
        res = {n: out[n.replace(DOWN_IN, DOWN_OUT) if n != MID_IN else MID_OUT] for n in targets}
        if factors is not None:  # per-residual scales, each times the weight (0 when the unit is off)
            res = {n: (r * np.float32(f if on else 0.0)).astype(r.dtype, copy=False)
                   for (n, r), f in zip(res.items(), factors)}
        if split:
            res = {n: np.concatenate([np.zeros_like(r), r], axis=0) for n, r in res.items()}
        return res

    def add(feeds: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        on = [u for u in units if state.on(u)]
        if not on:  # diffusers runs every net at scale 0: what it feeds the UNet then (also: every unit off this pass)
            state.calls.append(0)
            return run(units[0], feeds, False)
        total: dict[str, np.ndarray] | None = None
        for unit in on:
            res = run(unit, feeds, True)
            total = res if total is None else {k: total[k] + res[k] for k in targets}
        state.calls.append(len(on))
        assert total is not None
        return total

    return add


def infotext(units: Sequence[ControlNet], width: int, height: int) -> dict[str, str]:
    """sd-webui-controlnet's infotext: ``ControlNet N: "Module: ..., Model: ..., Weight: ..., ..."``.

    The value holds commas, so ``png.format_parameters`` JSON-quotes it, as the extension's does."""
    fields: dict[str, str] = {}
    for k, u in enumerate(units):
        items = [("Module", u.preprocessor), ("Model", u.model_name), ("Weight", _short(u.scale)),
                 ("Resize Mode", u.resize),
                 ("Processor Res", str(u.made_at if u.made_at is not None else min(width, height)))]
        items += threshold_fields(u.preprocessor, u.low, u.high)
        items += [("Guidance Start", _short(u.start)), ("Guidance End", _short(u.end)),
                  ("Pixel Perfect", str(bool(u.pixel_perfect))),
                  ("Control Mode", CONTROL_MODES[2] if u.guess_mode else u.control_mode)]
        if u.guess_mode:  # the extension turned guess_mode into "ControlNet is more important"; the scales are diffusers'
            items.append(("Guess Mode", "True"))
        if u.union_mode is not None or u.union_type is not None:  # a union net's control type
            # the type's number, however it was asked ("canny", "Lineart", 3, the preprocessor): one run, one text
            items.append(("Union Mode", str(u.union_type if u.union_type is not None else u.union_mode)))
        fields[f"ControlNet {k}"] = ", ".join(f"{a}: {b}" for a, b in items)
    return fields


def _short(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{float(value):g}"
