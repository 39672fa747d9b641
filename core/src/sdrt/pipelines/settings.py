"""Generation settings: every argument checked once, before any model loads, with errors in argument names."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from .bounds import MAX_BATCH, MAX_BATCH_COUNT, MAX_CFG, MAX_SEQUENCE_LENGTH, MAX_SIDE, MAX_STEPS
from .images import ImageLike, check_path
from .toolbox import KEYWORDS as TOOLBOX_KEYWORDS


@dataclass
class Settings:
    """Checked generation settings (``validate`` builds them before any model loads)."""

    prompt: str
    negative_prompt: str
    steps: int
    cfg: float
    sampler: str
    choice: Any
    seed: int
    width: int | None
    height: int | None
    strength: float | None
    batch: int
    batch_count: int
    clip_skip: int
    init_image: ImageLike | None = None
    mask: ImageLike | None = None
    #: ControlNet, hires fix, previews, A1111's seeds (sdrt.pipelines.toolbox.Toolbox)
    toolbox: Any = None
    #: the distilled guidance fed to a guidance-distilled model (Flux dev); None: the family's default
    guidance: float | None = None
    #: the flow-matching shift in place of the scheduler config's (and of Flux's dynamic shift)
    shift: float | None = None
    #: T5's token count (SD3, Flux, Chroma); None: the family's
    max_sequence_length: int | None = None
    #: diffusers' guidance_rescale (CFG rescale phi): 0 off, up to 1
    guidance_rescale: float = 0.0
    #: FLUX.1 Kontext's reference images (sdrt.pipelines.reference), None without; resized to Kontext's sizes or not
    reference_images: list[Any] | None = None
    reference_resize: bool = True
    #: how the init image and mask meet the size when theirs differs (sdrt.pipelines.images.RESIZE_MODES)
    resize_mode: str = "Just Resize"
    #: a Flux.1 Canny/Depth model's control image (sdrt.pipelines.fluxtools); a ControlNet unit when it came from
    #: ``--control-image`` (its preprocessor and resize mode)
    control_image: Any = None
    #: which part of the schedule img2img's strength runs (sdrt.pipelines.strength.RULES)
    strength_rule: str = "diffusers"
    #: A1111's upscaler_for_img2img: (name, model file or None) of what enlarges the init image; None: Lanczos
    init_upscaler: tuple[str, Any] | None = None
    #: what the area to repaint starts from (sdrt.pipelines.maskedcontent.MODES; A1111's inpainting_fill)
    masked_content: str = "original"
    #: which area a mask's run paints at the size: "whole picture", or "only masked" (sdrt.pipelines.onlymasked;
    #: A1111's inpaint_full_res) with inpaint_padding pixels around the mask's box
    inpaint_area: str = "whole picture"
    inpaint_padding: int = 32
    #: A1111's mask blur (sdrt.pipelines.maskblur): (x, y) pixels, the mask blurred at its own size; (0, 0): not
    mask_blur: tuple[int, int] = (0, 0)
    #: A1111's overlay of the whole-picture run (sdrt.pipelines.onlymasked.Overlay): the fitted picture composited
    #: back over each image where the mask keeps it
    mask_overlay: bool = False
    #: an InstructPix2Pix model's image guidance scale (diffusers' image_guidance_scale, A1111's Image CFG Scale);
    #: None: 1.5, both's default. Refused on other models (the pipeline's check)
    image_cfg: float | None = None
    #: whether the caller set ``strength`` (an InstructPix2Pix run starts from noise alone without one, as diffusers')
    strength_given: bool = False

    @property
    def mode(self) -> str:
        return "inpaint" if self.mask is not None else "img2img" if self.init_image is not None else "txt2img"


@dataclass
class Generation:
    """What one call made: the images, the seed of each, and A1111-style settings for each image.

    ``seeds[i]`` is the seed image ``i`` was drawn from. With ``rng="cpu"`` (diffusers' one stream per run)
    every image of a batch reports the run's seed and its settings say ``Batch size`` and ``Batch pos``: image
    ``i`` is the ``i``-th of the noise that stream draws for the batch, so the same seed with the same ``batch``
    gives it again (``images[i]``), while that seed with ``batch=1`` gives image 0 only. With ``rng="gpu"``/``"nv"``
    (A1111's per-image noise) image ``i`` reports ``seed + i`` and that seed alone reproduces it.
    """

    images: list[np.ndarray]
    seeds: list[int]
    settings: list[dict[str, object]] = field(default_factory=list)
    prompt: str = ""
    negative_prompt: str = ""
    #: the memory plan (each part's placement, the predicted peak) with the measured peak RSS of each stage
    memory: Any = None


_HIGH = {"steps": MAX_STEPS, "batch": MAX_BATCH, "batch_count": MAX_BATCH_COUNT, "width": MAX_SIDE,
         "height": MAX_SIDE, "max_sequence_length": MAX_SEQUENCE_LENGTH}


#: the range of Flux dev's distilled ``guidance`` (as cfg's; sdrt serve's distilled_cfg_scale too) and of ``shift``
_FLOW_RANGE = {"guidance": (0.0, MAX_CFG), "shift": (0.01, 100.0)}


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"{{@{name}}} must be an integer >= {low}, got {value!r}", where=name,
                         fix=f"pass {{@{name}=}}{low} or more")
    high = _HIGH.get(name)
    if high is not None and value > high:
        raise InputError(f"{{@{name}}} {value} is above the limit of {high}", where=name,
                         fix=f"pass {{@{name}=}}{high} or less")
    return int(value)


def _number(value: Any) -> bool:
    """A real number as Python or numpy gives one (``np.int64(7)`` as well as ``7.0``), not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_text(name: str, value: str, label: str) -> None:
    """``value`` (a prompt) is text that UTF-8 can write (into the PNG's infotext, the tokenizer): not a byte that
    was not UTF-8 (Python decodes such command-line bytes to surrogates) nor a lone surrogate (JSON's ``\\ud800``)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(value[exc.start])
        if 0xDC80 <= bad <= 0xDCFF:  # the surrogateescape of a byte that was not UTF-8
            at = len(value[:exc.start].encode("utf-8"))
            what = f"the {label} is not UTF-8 text: byte 0x{bad - 0xDC00:02x} at byte {at} (read as U+{bad:04X})"
        else:
            what = f"the {label} holds a lone surrogate U+{bad:04X} at character {exc.start}, which is not text"
        raise InputError(what, where=name, fix="write it in UTF-8 (a UTF-8 terminal or file; in JSON, a pair of "
                         "\\u escapes for a character above U+FFFF)") from None


def validate(prompt: str, negative_prompt: str | None = "", *, steps: int = 20, cfg: float | None = None,
             sampler: str | None = None, schedule: str | None = None, seed: int | None = None,
             width: int | None = None, height: int | None = None, init_image: ImageLike | None = None,
             strength: float | None = None, mask: ImageLike | None = None, batch: int = 1, batch_count: int = 1,
             clip_skip: int = 1, guidance: float | None = None, shift: float | None = None,
             max_sequence_length: int | None = None, guidance_rescale: float = 0.0, reference_images: Any = None,
             reference_resize: bool = True, control_image: ImageLike | None = None, resize_mode: Any = None,
             strength_rule: str | None = None, init_upscaler: Any = None, masked_content: str | None = None,
             inpaint_area: str | None = None, inpaint_padding: int | None = None, mask_blur: Any = None,
             mask_overlay: Any = None, image_cfg: float | None = None, **toolbox: Any) -> Settings:
    """Check every setting; raises a clear ``SdrtError`` on the first bad one, before any model loads.

    ``cfg`` and ``sampler`` left unset take the model family's defaults when the pipeline runs (CFG 7 and
    DPM++ 2M Karras for SD; CFG 1 and Euler for Flux, whose ``guidance`` is the distilled scale).
    ``resize_mode``: how ``init_image`` and ``mask`` meet ``width`` and ``height`` when their size differs:
    ``"Just Resize"`` (default), ``"Crop and Resize"``, ``"Resize and Fill"``, ``"Just Resize (latent upscale)"``
    (A1111's img2img modes 0 to 3; any case).
    ``strength_rule``: which part of the schedule ``strength`` runs: ``"diffusers"`` (default), ``"a1111"`` or
    ``"a1111-fix-steps"`` (:mod:`sdrt.pipelines.strength`).
    ``init_upscaler``: what enlarges an init image that grows to the size (A1111's ``upscaler_for_img2img``):
    ``"Lanczos"``, ``"Nearest"`` or a model upscaler (a path, or a name in ``$SDRT_UPSCALERS``); None: a Lanczos
    resize.
    ``masked_content``: what the area a ``mask`` repaints starts from: ``"original"`` (default), ``"fill"``,
    ``"latent noise"`` or ``"latent nothing"`` (A1111's masked content 1, 0, 2, 3; :mod:`sdrt.pipelines.maskedcontent`).
    ``mask_blur``: pixels to blur the ``mask`` by at its own size, an integer or ``(x, y)`` (A1111's mask blur;
    default 0, diffusers'; :mod:`sdrt.pipelines.maskblur`).
    ``mask_overlay``: composite the fitted init image back over each image where the mask keeps it, as A1111 does
    (default False, diffusers'; "only masked" always pastes back; :mod:`sdrt.pipelines.onlymasked`).
    ``inpaint_area``: which area a ``mask``'s run paints at ``width`` x ``height``: ``"whole picture"`` (default) or
    ``"only masked"`` (the mask's box, ``inpaint_padding`` pixels wider, default 32, cut out, run and pasted back;
    A1111's "Inpaint area"; :mod:`sdrt.pipelines.onlymasked`).
    ``image_cfg``: an InstructPix2Pix model's image guidance scale (diffusers' ``image_guidance_scale``, A1111's
    Image CFG Scale; default 1.5); it needs ``init_image``, the picture to edit.
    ``toolbox``: ControlNet, hires fix, preview and seed arguments (:mod:`sdrt.pipelines.toolbox`)."""
    from ..samplers import resolve
    from ..samplers.seeds import resolve_seed
    from .toolbox import split

    unknown, extras = split(toolbox, schedule)
    if unknown:
        check_keywords(unknown)

    if not isinstance(prompt, str):
        raise InputError(f"the prompt must be a string, got {type(prompt).__name__}", where="prompt",
                         fix="pass the prompt text")
    if negative_prompt is not None and not isinstance(negative_prompt, str):
        raise InputError(f"the negative prompt must be a string, got {type(negative_prompt).__name__}",
                         where="negative_prompt", fix="pass text or leave it empty")
    check_text("prompt", prompt, "prompt")
    if negative_prompt:
        check_text("negative_prompt", negative_prompt, "negative prompt")
    for name, value in (("width", width), ("height", height)):
        if value is not None:
            value = _int(name, value, 8)  # a plain int: np.int64 reached the run plan's plain data (not JSON)
            if value % 8:
                raise InputError(f"{name} {value} is not a multiple of 8", where=name,
                                 fix=f"use {value - value % 8} or {value - value % 8 + 8}")
    width = None if width is None else int(width)
    height = None if height is None else int(height)
    steps = _int("steps", steps, 1)
    batch = _int("batch", batch, 1)
    batch_count = _int("batch_count", batch_count, 1)
    clip_skip = _int("clip_skip", clip_skip, 1)
    if cfg is not None and (not _number(cfg) or not math.isfinite(cfg) or not 0 <= cfg <= MAX_CFG):
        raise InputError(f"{{@cfg}} must be a finite number from 0 to {MAX_CFG:g}, got {cfg!r}", where="cfg",
                         fix="use e.g. 7")
    if image_cfg is not None:
        if not _number(image_cfg) or not math.isfinite(image_cfg) or not 0 <= image_cfg <= MAX_CFG:
            raise InputError(f"{{@image_cfg}} must be a finite number from 0 to {MAX_CFG:g}, got {image_cfg!r}",
                             where="image_cfg", fix="use e.g. 1.5 (InstructPix2Pix's default)")
        if init_image is None:
            raise InputError("{@image_cfg} guides an InstructPix2Pix model by its input image", where="image_cfg",
                             fix="pass {@init_image=} (the picture to edit), or leave {@image_cfg} unset")
    for name, value in (("guidance", guidance), ("shift", shift)):
        # bounded as cfg is (1e300 ran the whole model into NaN latents, said as the backend's fault); a shift as
        # ComfyUI's ModelSamplingSD3/Flux nodes take it (0.01 to 100; 1e-30 rounds to 0 in float32: NaN too)
        low, high = _FLOW_RANGE[name]
        if value is not None and (not _number(value) or not math.isfinite(value) or not low <= value <= high):
            raise InputError(f"{{@{name}}} must be a finite number from {low:g} to {high:g}, got {value!r}",
                             where=name, fix=f"use e.g. {3.5 if name == 'guidance' else 3}")
    if not _number(guidance_rescale) or not 0 <= guidance_rescale <= 1:
        raise InputError(f"{{@guidance_rescale}} must be a number from 0 to 1, got {guidance_rescale!r}",
                         where="guidance_rescale", fix="use e.g. 0.7 (0 turns it off)")
    if max_sequence_length is not None:
        max_sequence_length = _int("max_sequence_length", max_sequence_length, 2)
    # an A1111 label ("DPM++ 2M Karras") or ComfyUI names ("dpmpp_2m", "karras"); unset: the family's, at run time
    if schedule is not None and not isinstance(schedule, str):
        raise InputError(f"{{@schedule}} must be a schedule's name, got {type(schedule).__name__} {schedule!r:.40}",
                         where="schedule", fix="pass e.g. {@schedule=}'karras', or leave it unset")
    choice = resolve(sampler, schedule) if sampler is not None else None
    if sampler is None and schedule is not None:
        raise InputError("a schedule was given without a sampler", where="schedule",
                         fix="pass {@sampler} too, e.g. euler with the simple schedule")
    seed = resolve_seed(seed)  # A1111's get_fixed_seed: -1 (or none) is a random seed
    _check_last_seeds(seed, extras, batch, batch_count)
    if mask is not None and init_image is None:
        raise InputError("a mask needs an init image", where="mask", fix="pass {@init_image=} too")
    if strength is not None:
        if init_image is None:
            raise InputError("{@strength} applies only with an init image", where="strength",
                             fix="pass {@init_image=}, or leave {@strength} unset")
        if not _number(strength) or not 0 < strength <= 1:
            raise InputError(f"{{@strength}} must be in (0, 1], got {strength!r}", where="strength", fix="use e.g. 0.75")
    from .strength import DEFAULT, check_rule, schedule

    rule = DEFAULT
    if strength_rule is not None:
        rule = check_rule(strength_rule)
        if init_image is None:
            raise InputError("{@strength_rule} applies only with an init image", where="strength_rule",
                             fix="pass {@init_image=}, or leave {@strength_rule} unset")
    if init_image is not None:
        _check_image(init_image, "init_image", "init image")
        init_strength = strength
        strength = float(strength if strength is not None else (1.0 if mask is not None else 0.75))
        schedule(steps, strength, rule)  # A1111's fixed steps: a stretched schedule within the bounds
        # (an InstructPix2Pix run without a strength runs every step: image_cfg says the model is one)
        if rule == "diffusers" and min(int(steps * strength), steps) < 1 and (init_strength is not None
                                                                              or image_cfg is None):  # A1111's rules run one step at least
            given = "strength" if init_strength is not None else "steps"  # the default strength is not the user's
            said = "{@strength}" if given == "strength" else "the default strength"
            raise InputError(f"{said} {strength} of {steps} step{'' if steps == 1 else 's'} leaves no step to run",
                             where=given,
                             fix=f"raise {{@strength}} to at least {1 / steps:.3g}, or {{@steps}}")
    if mask is not None:
        _check_image(mask, "mask", "mask")
    from .maskedcontent import check as check_content

    content = "original"
    if masked_content is not None:
        content = check_content(masked_content)
        if mask is None:
            raise InputError("{@masked_content} says what the area a mask repaints starts from, and no mask was "
                             "given", where="masked_content", fix="pass {@mask=} too, or leave {@masked_content} unset")
    area, padding = _inpaint_area(inpaint_area, inpaint_padding, mask, resize_mode)
    blur, overlay = _mask_options(mask_blur, mask_overlay, mask)
    from .initupscaler import parse as upscaler_of

    upscaler = upscaler_of(init_upscaler)
    if upscaler is not None and init_image is None:
        raise InputError("{@init_upscaler} enlarges an init image, and none was given", where="init_upscaler",
                         fix="pass {@init_image=} too, or leave {@init_upscaler} unset")
    if resize_mode is not None and init_image is None:
        raise InputError("{@resize_mode} fits an init image (and its mask) to the size, and none was given",
                         where="resize_mode", fix="pass {@init_image=} too, or leave {@resize_mode} unset")
    from .images import resize_mode as resize_mode_of

    fit = resize_mode_of(resize_mode)
    if control_image is not None:
        _check_image(control_image, "control_image", "control image")
    from .reference import references_of

    references = references_of(reference_images)
    if not isinstance(reference_resize, (bool, np.bool_)):
        raise InputError(f"{{@reference_resize}} must be True or False, got {reference_resize!r:.40}",
                         where="reference_resize", fix="pass True (resize to Kontext's sizes, the default) or False (keep the "
                         "images' sizes, cut down to multiples of 16)")
    if init_image is not None and getattr(extras, "hires", None) is not None:  # found once the model had loaded
        raise InputError("the hires fix is a txt2img pass followed by img2img", where="hires_scale",
                         fix="leave {@init_image} and {@mask} out, or {@hires_scale} unset")
    if getattr(extras, "hires", None) is not None:
        from .hires import second_pass_steps

        second_pass_steps(extras.hires, steps)  # its stretched schedule within the bounds, before any model loads
    return Settings(prompt, negative_prompt or "", steps, float(cfg) if cfg is not None else None,  # type: ignore[arg-type]
                    sampler, choice, int(seed), width, height, strength, batch, batch_count, clip_skip, init_image,
                    mask, toolbox=extras, guidance=None if guidance is None else float(guidance),
                    shift=None if shift is None else float(shift), max_sequence_length=max_sequence_length,
                    guidance_rescale=float(guidance_rescale), reference_images=references,
                    reference_resize=bool(reference_resize), control_image=control_image, resize_mode=fit,
                    strength_rule=rule, init_upscaler=upscaler, masked_content=content,
                    inpaint_area=area, inpaint_padding=padding, mask_blur=blur, mask_overlay=overlay,
                    image_cfg=None if image_cfg is None else float(image_cfg), strength_given=strength is not None
                    and init_image is not None and init_strength is not None)


def _check_image(value: Any, name: str, what: str) -> None:
    """An image argument that is a path: an empty one (an app's "no picture") is said as empty, not read as the
    current folder ("the init image . is a folder"); then ``check_path``."""
    if isinstance(value, (str, bytes)) and not value:
        raise InputError(f"{{@{name}}} is an empty path", where=name,
                         fix=f"pass the {what}, or leave {{@{name}}} unset")
    check_path(value, what)


def _mask_options(blur: Any, overlay: Any, mask: Any) -> tuple[tuple[int, int], bool]:
    """``mask_blur`` and ``mask_overlay`` checked: each acts on a mask."""
    from .maskblur import check as check_blur

    xy = (0, 0) if blur is None else check_blur(blur)
    if overlay is not None and not isinstance(overlay, (bool, np.bool_)):
        raise InputError(f"{{@mask_overlay}} must be True or False, got {overlay!r:.40}", where="mask_overlay",
                         fix="pass True (the init image composited back where the mask keeps it, as A1111) or False")
    for name, given in (("mask_blur", blur is not None and xy != (0, 0)), ("mask_overlay", bool(overlay))):
        if given and mask is None:
            raise InputError(f"{{@{name}}} acts on a mask, and no mask was given", where=name,
                             fix=f"pass {{@mask=}} too, or leave {{@{name}}} unset")
    return xy, bool(overlay)


def _inpaint_area(area: Any, padding: Any, mask: Any, resize_mode: Any) -> tuple[str, int]:
    """``inpaint_area`` and ``inpaint_padding`` checked (sdrt.pipelines.onlymasked): each needs what it acts on."""
    from .onlymasked import DEFAULT_PADDING, ONLY_MASKED, WHOLE_PICTURE, check_area, check_padding

    chosen = WHOLE_PICTURE if area is None else check_area(area)
    if area is not None and mask is None:
        raise InputError("{@inpaint_area} says which area a mask's run paints, and no mask was given",
                         where="inpaint_area", fix="pass {@mask=} too, or leave {@inpaint_area} unset")
    if padding is not None:
        padding = check_padding(padding)
        if chosen != ONLY_MASKED:
            raise InputError("{@inpaint_padding} widens the area 'only masked' inpainting cuts out, and "
                             f"{{@inpaint_area}} is {chosen!r}", where="inpaint_padding",
                             fix="pass {@inpaint_area=}'only masked' too, or leave {@inpaint_padding} unset")
    if chosen == ONLY_MASKED and resize_mode is not None:
        raise InputError("{@resize_mode} fits the whole picture to the size, and with {@inpaint_area} 'only masked' "
                         "the masked area is cut out and fitted with Resize and Fill (as A1111 does)",
                         where="resize_mode", fix="leave {@resize_mode} unset, or {@inpaint_area} unset")
    return chosen, DEFAULT_PADDING if padding is None else padding


def _check_last_seeds(seed: int, toolbox: Any, batch: int, batch_count: int) -> None:
    """The seeds a run draws: run ``k`` starts at ``seed + k * batch`` and, with A1111's noise (``rng`` gpu/nv, or
    any variation), its image ``i`` draws ``seed + i`` (one seed for all with a variation strength), its variation
    seed ``subseed + k * batch + i``. The last must be a seed too (below 2**64): said now, not after the first
    images ran."""
    from ..samplers.noise import _U64

    per_image = toolbox.rng != "cpu" or bool(toolbox.subseed_strength)
    last_seed = 0 if toolbox.subseed_strength else batch * batch_count - 1 if per_image else (batch_count - 1) * batch
    for name, first, last in (("seed", seed, last_seed), ("subseed", toolbox.subseed, batch * batch_count - 1)):
        if first is None or first + last < _U64:
            continue
        raise InputError(f"{{@{name}}} {first} with {{@batch}} {batch} and {{@batch_count}} {batch_count} draws "
                         f"{name}s up to {first + last}, past the largest, 2**64 - 1", where=name,
                         fix=f"pass a {{@{name}}} of at most {_U64 - 1 - last}, or fewer images")


#: the keyword arguments of generate / __call__ / plan (validate's; generate also takes callback)
KEYWORDS = ("steps", "cfg", "sampler", "schedule", "seed", "width", "height", "init_image", "strength", "mask",
            "batch", "batch_count", "clip_skip", "guidance", "shift", "max_sequence_length", "guidance_rescale",
            "reference_images", "reference_resize", "control_image", "resize_mode", "strength_rule", "init_upscaler",
            "masked_content", "inpaint_area", "inpaint_padding", "mask_blur", "mask_overlay", "image_cfg",
            *TOOLBOX_KEYWORDS)


#: every argument of generate by name, for "did you mean" (prompt and negative_prompt are positional ones)
_ARGUMENTS = ("prompt", "negative_prompt", *KEYWORDS, "callback")


#: other libraries' names for these arguments (diffusers', A1111's API): what to pass here instead. A near spelling
#: is no guide for them: difflib offered hires_steps for num_inference_steps, hires_scale for cfg_scale, and
#: guidance (Flux dev's distilled guidance) for diffusers' guidance_scale, which is the CFG scale for SD
_OTHER_NAMES = {
    "guidance_scale": "cfg (classifier-free guidance; for Flux dev's distilled guidance, guidance)",
    "cfg_scale": "cfg", "num_inference_steps": "steps", "negative": "negative_prompt", "neg_prompt": "negative_prompt",
    "num_images_per_prompt": "batch", "batch_size": "batch", "n_iter": "batch_count",
    "denoising_strength": "strength",
    "image": "init_image (img2img), or reference_images (FLUX.1 Kontext's pictures to edit)",
    "init_images": "init_image", "mask_image": "mask",
    "sampler_name": "sampler", "scheduler": "schedule (a ComfyUI scheduler) or sampler (an A1111 label)",
    "generator": "seed (an integer)", "enable_hr": "hires_scale", "hr_scale": "hires_scale",
    "hr_second_pass_steps": "hires_steps", "hr_upscaler": "hires_upscaler", "hr_resize_x": "hires_width",
    "hr_resize_y": "hires_height", "hr_sampler_name": "hires_sampler", "hr_scheduler": "hires_schedule",
    "hr_prompt": "hires_prompt", "hr_negative_prompt": "hires_negative_prompt",
    "hr_checkpoint_name": "hires_checkpoint (a model path or a loaded pipeline)",
    "controlnet": "controlnets", "cfg_rescale": "guidance_rescale",
    "image_guidance_scale": "image_cfg", "image_cfg_scale": "image_cfg",
    "ip_adapter_image": "ip_adapter=IPAdapter(file, image=...)", "ip_adapter_scale": "ip_adapter=IPAdapter(file, scale=...)",
    "image_encoder": "ip_adapter=IPAdapter(file, image_encoder=...)",
    "ip_adapter_start": "ip_adapter=IPAdapter(file, start=...)", "ip_adapter_end": "ip_adapter=IPAdapter(file, end=...)",
    "_auto_resize": "reference_resize", "reference_image": "reference_images",
    "images": "reference_images (FLUX.1 Kontext) or init_image (img2img)",
    "upscaler_for_img2img": "init_upscaler", "img2img_fix_steps": "strength_rule='a1111-fix-steps'",
    "inpainting_fill": "masked_content",
    "inpaint_full_res": "inpaint_area='only masked'", "inpaint_full_res_padding": "inpaint_padding",
    "padding_mask_crop": "inpaint_area='only masked' and inpaint_padding",
    "mask_blur_x": "mask_blur=(x, y)", "mask_blur_y": "mask_blur=(x, y)",
    "refiner_switch_by_sample_steps": "refiner_switch_by_steps",
    "refiner_checkpoint": "refiner (a model path or a loaded pipeline)",
    "hires_fix_refiner_pass": "hires_refiner_pass (A1111's option: 'first pass', 'second pass' or 'both passes')",
    "denoising_end": "refiner and refiner_switch_at (the base's denoising_end is the switch)",
    "denoising_start": "refiner_switch_at on the base's call (the refiner continues its latents)",
}


def check_keywords(kwargs: dict[str, Any]) -> None:
    """Unknown keyword arguments fail by name (not as a TypeError from an inner function)."""
    import difflib

    for key in kwargs:
        if key not in KEYWORDS:
            if key == "callback":  # generate()'s own argument: it reaches here from validate() or plan()
                raise InputError("{@callback} is generate()'s: it is called after each step, and validate() and "
                                 "plan() run no step", where="callback",
                                 fix="pass callback to pipe.generate(...) or pipe(...), and leave it out here")
            other = _OTHER_NAMES.get(key)
            # prompt and negative_prompt too (a typo of one, "negative_promt", was offered hires_negative_prompt)
            close = None if other else difflib.get_close_matches(key, _ARGUMENTS, n=1)
            hint = f"pass {other} instead; " if other else f"did you mean {close[0]}? " if close else ""
            raise InputError(f"unknown argument {key!r}", where=key,
                             fix=hint + "the arguments are prompt, negative_prompt, " + ", ".join(KEYWORDS)
                             + ", callback")
