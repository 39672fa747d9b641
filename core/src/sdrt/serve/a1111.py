"""AUTOMATIC1111's ``/sdapi/v1/txt2img`` and ``/img2img`` request bodies -> a checked :class:`Work`.

Field names and defaults follow A1111's API models (modules/api/models.py, built from
``StableDiffusionProcessingTxt2Img``/``Img2Img``). Unknown fields are ignored, as A1111 ignores them;
known fields sdrt cannot honour (face restoration, tiling, seed resize, scripts, extensions other than
ControlNet, ...) are listed in the response's ``info`` under ``sdrt_not_honoured`` when a request sets them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..pipelines.images import JUST_RESIZE, LATENT_UPSCALE, RESIZE_MODES
from . import b64images, controlnet, extras, kontext, modules
from .config import Limits
from .errors import ApiError, file_names, from_pipeline
from .fields import get_bool, get_dict, get_float, get_int, get_list, get_str
from .inpaint import blur_of, blurred, denoising_strength, fit, masked_content, only_masked, read_mask
from .jobs import Work, hires_said
from .registry import ModelEntry, Registry

#: (field, value A1111 treats as "off", why sdrt does not honour it)
_NOT_HONOURED: list[tuple[str, tuple[Any, ...], str]] = [
    ("restore_faces", (False,), "face restoration is not part of sdrt"),
    ("tiling", (False,), "seamless tiling is not supported"),
    ("seed_resize_from_h", (0, -1), "seed resize is not supported"),
    ("seed_resize_from_w", (0, -1), "seed resize is not supported"),
    ("styles", ([],), "saved prompt styles are not supported"),
    ("script_name", ("",), "A1111 scripts are not supported"),
    ("s_churn", (0, 0.0), "sampler churn is not supported"),
    ("s_noise", (1, 1.0), "sampler noise scale is fixed at 1"),
    ("s_tmin", (0, 0.0), "sampler tmin is not supported"),
    ("s_tmax", (0, 0.0, float("inf")), "sampler tmax is not supported"),
    ("s_min_uncond", (0, 0.0), "negative-guidance minimum sigma is not supported"),
    ("infotext", ("",), "infotext parameters are not read; pass the fields themselves"),
    ("firstpass_image", ("",), "hires. fix first-pass images are not supported"),
    ("initial_noise_multiplier", (1, 1.0), "the initial noise multiplier is fixed at 1"),
]
#: A1111's request fields (txt2img and img2img); ``parameters`` echoes only these, never a client's own
#: extra fields (SillyTavern forwards its ``url`` and ``auth`` in the body)
_KNOWN = frozenset("""prompt negative_prompt styles seed subseed subseed_strength seed_resize_from_h seed_resize_from_w
sampler_name scheduler batch_size n_iter steps cfg_scale distilled_cfg_scale width height restore_faces tiling
do_not_save_samples do_not_save_grid eta denoising_strength s_min_uncond s_churn s_tmax s_tmin s_noise
override_settings override_settings_restore_afterwards refiner_checkpoint refiner_switch_at disable_extra_networks
firstpass_image comments enable_hr firstphase_width firstphase_height hr_scale hr_upscaler hr_second_pass_steps
hr_resize_x hr_resize_y hr_checkpoint_name hr_sampler_name hr_scheduler hr_prompt hr_negative_prompt force_task_id
sampler_index script_name script_args send_images save_images alwayson_scripts infotext resize_mode image_cfg_scale
mask_blur mask_blur_x mask_blur_y mask_round inpainting_fill inpaint_full_res inpaint_full_res_padding inpainting_mask_invert
initial_noise_multiplier latent_mask include_init_images init_images mask""".split())
#: override_settings keys that sdrt reads; any other is named as not honoured
_OVERRIDES = {"sd_model_checkpoint", "CLIP_stop_at_last_layers", "sd_vae", "randn_source", "forge_additional_modules",
              "hires_fix_refiner_pass", "img2img_fix_steps", "refiner_switch_by_sample_steps", "upscaler_for_img2img"}
#: A1111's boolean options sdrt reads (from override_settings, else the server's options); all off by default
BOOL_OPTIONS = ("img2img_fix_steps", "refiner_switch_by_sample_steps")
#: the longest sampler or schedule name a request may send (an unknown name is echoed back in the 400)
NAME_CHARS = 100
#: A1111's ``randn_source`` option -> the pipeline's ``rng``
RANDN_SOURCES = {"GPU": "gpu", "CPU": "cpu", "NV": "nv"}



#: the seeds a request may send: torch.manual_seed's range, which A1111 hands them to (-1: a random one below
#: 2**32, as A1111 draws it); the CLI and the Python API take the same (sdrt.samplers.noise)
SEEDS = (-(2**63), 2**64 - 1)

def hires_refiner_pass(value: Any, field: str) -> str:
    """A1111's ``hires_fix_refiner_pass`` (first pass, second pass or both passes, any case); 400 naming ``field``."""
    from ..pipelines.refiner import HIRES_PASSES

    if isinstance(value, str) and value.strip().lower() in HIRES_PASSES:
        return value.strip().lower()
    raise ApiError(400, f"{field} must be one of {', '.join(HIRES_PASSES)} (A1111's), got {str(value)[:40]!r}",
                   field=field)


def _set(overrides: dict[str, Any], key: str) -> bool:
    """Whether ``override_settings`` sets ``key``: null and "" leave the server's option; any other value is checked
    (0, false, [] or {} for a name was the server's option, silently)."""
    return overrides.get(key) not in (None, "")


def option_bool(overrides: dict[str, Any], options: dict[str, Any], key: str) -> bool:
    """A boolean A1111 option: the request's ``override_settings`` over the server's options (off when neither
    sets it); a value that is no boolean is a 422 naming ``override_settings.KEY``."""
    if overrides.get(key) is not None:
        try:
            return bool(get_bool(overrides, key, False))
        except ApiError as exc:
            raise ApiError(exc.status, f"override_settings.{exc.message}", field=f"override_settings.{key}") from None
    return bool(get_bool(options, key, False))


def randn_source(value: Any, field: str) -> str:
    """A1111's ``randn_source`` (GPU, CPU or NV, any case) as A1111 spells it; 400 naming ``field`` otherwise."""
    if isinstance(value, str) and value.strip().upper() in RANDN_SOURCES:
        return value.strip().upper()
    raise ApiError(400, f"{field} must be GPU, CPU or NV (A1111's random sources), got {str(value)[:40]!r}",
                   field=field)


def _prompt_syntax(text: str, key: str) -> list[str]:
    """Notes for the A1111 prompt syntax in ``text`` that runs as plain words here."""
    from ..text.attention import A1111_SYNTAX  # the CLI's patterns: one reading of A1111's grammar

    bare = re.sub(r"\\.", "", text)  # \[ and \] are literal brackets
    bare = re.sub(r"<[^<>]*>", "", bare)  # <lora:name:w> tags are read (and checked) elsewhere
    found = [what for what, kind in (("prompt editing [from:to:when]", "editing"),
                                     ("alternation [a|b]", "alternation"), ("AND (composable diffusion)", "and"))
             if A1111_SYNTAX[kind].search(bare)]
    notes = [f"{key}: A1111's {' and '.join(found)} is not supported; the text ran as written"] if found else []
    network = A1111_SYNTAX["network"].search(re.sub(r"\\.", "", text))
    if network:  # <hypernet:x:1>: removed from the prompt (sdrt.text.loras), as A1111 removes it
        notes.append(f"{key}: extra network {network.group(0)[:60]!r} is not supported; it was removed from the "
                     "prompt, as A1111 removes such tags")
    return notes


@dataclass
class Request:
    work: Work
    mode: str
    not_honoured: list[str] = field(default_factory=list)
    task_id: str | None = None
    send_images: bool = True
    params: dict[str, Any] = field(default_factory=dict)
    #: the body's fields that are no A1111 request field (A1111 drops them too): named back to the client
    ignored: list[str] = field(default_factory=list)


def _not_honoured(body: dict[str, Any]) -> list[str]:
    out = []
    for key, off, why in _NOT_HONOURED:
        if key in body and body[key] is not None and body[key] not in off:
            out.append(f"{key}: {why}")
    return out


def parse(body: Any, mode: str, registry: Registry, limits: Limits, options: dict[str, Any]) -> Request:
    """Check a txt2img (``mode="txt2img"``) or img2img body; raises ``ApiError`` naming the field."""
    from ..errors import SdrtError
    from ..pipelines import validate
    from ..pipelines.bounds import MAX_CFG
    from ..samplers.names import label_schedule

    if not isinstance(body, dict):
        raise ApiError(422, f"the request body must be a JSON object, got {type(body).__name__}")
    prompt = get_str(body, "prompt", "", max_len=limits.max_prompt_chars)
    negative = get_str(body, "negative_prompt", "", max_len=limits.max_prompt_chars)
    for key, text in (("prompt", prompt), ("negative_prompt", negative)):
        registry.check_prompt(text, key)
    steps = get_int(body, "steps", 20, 1, limits.max_steps)
    cfg = get_float(body, "cfg_scale", None, 0.0, MAX_CFG)  # unset: the family's (7 for SD, as A1111; 1 for Flux)
    distilled = get_float(body, "distilled_cfg_scale", None, 0.0, MAX_CFG)  # Forge's: Flux dev's guidance input
    # A1111's Image CFG Scale: an InstructPix2Pix model's image guidance in img2img (the worker knows the model)
    image_cfg = get_float(body, "image_cfg_scale", None, 0.0, MAX_CFG)
    # names, bounded: an unknown one is echoed in the 400 (and a sampler's beside its schedule in the info)
    sampler = get_str(body, "sampler_name", None, max_len=NAME_CHARS) or \
        get_str(body, "sampler_index", None, max_len=NAME_CHARS) or "Euler"
    scheduler = get_str(body, "scheduler", None, max_len=NAME_CHARS)
    if scheduler is not None and scheduler.strip().casefold() in ("", "automatic"):
        scheduler = None
    batch = get_int(body, "batch_size", 1, 1, limits.max_batch)
    n_iter = get_int(body, "n_iter", 1, 1, limits.max_images)
    if batch * n_iter > limits.max_images:
        raise ApiError(400, f"batch_size x n_iter is {batch * n_iter} images, above this server's limit of "
                            f"{limits.max_images}", field="n_iter")
    width = get_int(body, "width", None, 8, limits.max_width)
    height = get_int(body, "height", None, 8, limits.max_height)
    rounded = []
    for key, side in (("width", width), ("height", height)):
        if side is not None and side % 8:  # A1111 makes a latent of side // 8: the image is a multiple of 8
            rounded.append(f"{key}: {side} ran as {side - side % 8}, a multiple of 8, as A1111 runs it")
    width, height = (v - v % 8 if v is not None else None for v in (width, height))
    seed = get_int(body, "seed", -1, *SEEDS, fixed=True)
    if seed == -1:
        seed = secrets.randbelow(2**32 - limits.max_images)
    elif seed + batch * n_iter > SEEDS[1] + 1:
        raise ApiError(400, f"seed {seed} leaves no room for {batch * n_iter} consecutive seeds below 2**64",
                       field="seed")
    overrides = get_dict(body, "override_settings")
    model_name = overrides.get("sd_model_checkpoint") if _set(overrides, "sd_model_checkpoint") \
        else options.get("sd_model_checkpoint")
    model = registry.model(model_name, "override_settings.sd_model_checkpoint") if model_name not in (None, "") \
        else registry.default
    clip_key = "override_settings.CLIP_stop_at_last_layers"  # named in full, as sd_model_checkpoint is
    clip_skip = get_int({clip_key: overrides.get("CLIP_stop_at_last_layers")}, clip_key, None, 1, 12, fixed=True)
    clip_skip_option = clip_skip is None  # the server's option: run at the model's deepest when deeper (jobs.Work)
    if clip_skip is None:
        clip_skip = int(options.get("CLIP_stop_at_last_layers") or 1)
    not_honoured = _not_honoured(body) + rounded + _prompt_syntax(prompt, "prompt") + \
        _prompt_syntax(negative, "negative_prompt")
    own = label_schedule(sampler, scheduler)
    if own is not None:  # A1111 runs the label's own schedule; clients send a saved scheduler beside an old label
        not_honoured.append(f"scheduler: the sampler {sampler!r} names its schedule ({own}), which A1111 runs "
                            f"instead of {scheduler!r}")
        scheduler = None
    not_honoured += [f"override_settings.{k}: not an option sdrt reads" for k in overrides if k not in _OVERRIDES]
    if get_bool(body, "disable_extra_networks", False) and "<lora:" in prompt + negative:
        not_honoured.append("disable_extra_networks: the prompt's <lora:...> tags were applied; leave them out "
                            "of the prompt instead")
    if get_str(body, "latent_mask", None):
        not_honoured.append("latent_mask: a separate latent mask is not supported; the mask is used")
    model = modules.choose(registry, model, overrides, options, not_honoured)  # sd_vae, forge_additional_modules
    send_images = get_bool(body, "send_images", True)
    task_id = get_str(body, "force_task_id", None, max_len=200)
    for key in ("save_images", "do_not_save_samples", "do_not_save_grid"):
        get_bool(body, key, None)  # type-checked; sdrt never saves images on the server
    if get_bool(body, "override_settings_restore_afterwards", True) is False and overrides:
        not_honoured.append("override_settings_restore_afterwards: false: override_settings apply to this request "
                            "only; POST them to /sdapi/v1/options to keep them")
    for key in ("styles", "script_args"):
        get_list(body, key)

    source = overrides.get("randn_source") if _set(overrides, "randn_source") \
        else options.get("randn_source") or "CPU"
    rng = RANDN_SOURCES[randn_source(source, "override_settings.randn_source" if _set(overrides, "randn_source")
                                     else "randn_source")]
    kwargs: dict[str, Any] = dict(steps=steps, cfg=cfg, sampler=sampler, schedule=scheduler, width=width,
                                  height=height, batch=batch, clip_skip=clip_skip, rng=rng)
    init, extra_infotext = None, {}
    if mode == "img2img":
        upscaler = _img2img_upscaler(overrides, options, registry.models_dir, not_honoured)
        init = _img2img(body, kwargs, limits, not_honoured, upscaler)
        if body.get("mask") not in (None, ""):  # A1111's "Mask blur: 4", whoever blurred (the pipeline or _img2img)
            from ..pipelines.maskblur import infotext as blur_infotext

            extra_infotext.update(blur_infotext(*blur_of(body)))
        # A1111's img2img steps (sdrt.pipelines.strength): t_enc + 1 steps of the schedule, or with its
        # img2img_fix_steps option a schedule stretched so that exactly the steps run
        kwargs["strength_rule"] = "a1111-fix-steps" if option_bool(overrides, options, "img2img_fix_steps") \
            else "a1111"
    else:
        _hires(body, kwargs, limits, not_honoured, registry.models_dir)
    subseed = _variation(body, kwargs)
    passes = hires_refiner_pass(overrides["hires_fix_refiner_pass"], "override_settings.hires_fix_refiner_pass") \
        if _set(overrides, "hires_fix_refiner_pass") else options.get("hires_fix_refiner_pass") or "second pass"
    by_steps = option_bool(overrides, options, "refiner_switch_by_sample_steps")
    refiner = _refiner(body, kwargs, registry, model, not_honoured, passes, by_steps)
    hires_model = _hires_checkpoint(body, kwargs, registry, model, not_honoured) if mode == "txt2img" else None
    # A1111's apply_refiner writes it at every denoiser call while the option is on, with a refiner or without
    # (sd_samplers_common.py); the pipeline writes it with its refiner, the worker without one
    if by_steps and refiner is None:
        extra_infotext["Refiner switch by sampling steps"] = True
    nets, notes, net_fields, net_names = controlnet.units(body, registry, model, limits.max_width * limits.max_height * 4,
                                                          init, any(k in kwargs for k in
                                                                    ("hires_scale", "hires_width", "hires_height")),
                                                          max(limits.max_width, limits.max_height))
    not_honoured += notes
    if nets:
        kwargs["controlnets"] = nets
        # the extension seeds numpy once a job (set_numpy_seed), from the seed and the subseed as sent (-1: the
        # seed): one shuffle map for every n_iter batch (each runs as its own generate, from its own first seed)
        from ..pipelines.shufflemap import numpy_seed

        sent = get_int(body, "subseed", -1, *SEEDS, fixed=True)
        for unit in nets:
            unit.seed = numpy_seed(seed, sent) if unit.seed is None else unit.seed
    ips, ip_names = controlnet.ip_adapters(body, registry, model, limits.max_width * limits.max_height * 4, init)
    if ips:  # the IP-Adapter modules' units: image prompts (sdrt.pipelines.ipadapter), their attentions summed
        kwargs["ip_adapter"] = ips
        net_names.update(ip_names)
    if not clip_skip_option:  # a clip skip the model refuses is the request's override, named in full
        net_names["clip_skip"] = clip_key
    controlnet.check_instantid(nets, ips, net_names)  # an InstantID net without its adapter unit: said in the request's words
    if not body.get("sampler_name") and body.get("sampler_index"):  # the sampler came from A1111's older field
        net_names["sampler"] = "sampler_index"
    if kwargs.get("hires_width") or kwargs.get("hires_height"):  # the pipeline says hires_scale of either size
        net_names["hires_scale"] = "hr_resize_x" if kwargs.get("hires_width") else "hr_resize_y"
    # Forge's FLUX.1 Kontext extension (alwayson_scripts["Forge FluxKontext"]): reference images
    net_names.update(kontext.references(body, kwargs, limits.max_width * limits.max_height * 4, not_honoured,
                                        (limits.max_width, limits.max_height)))
    # the size is the init image's: a size the model refuses is said as that picture's (jobs._public_error)
    size_from = "init_images[0]" if mode == "img2img" and width is None and height is None else None
    try:  # the pipeline's own checks (sampler and schedule names, sizes, strength), before any model loads
        validate(prompt, negative, seed=seed, **{k: v for k, v in kwargs.items() if k != "batch_count"})
    except SdrtError as exc:
        err = from_pipeline(exc, net_names)
        err.message = file_names(err.message, net_names)  # a unit's files by their names, as a job's refusal says them
        raise err from None
    if refiner is not None:  # checked as a path; the worker runs its own pipeline of that model (jobs.Worker._run)
        kwargs["refiner"] = refiner
    if hires_model is not None:  # likewise (jobs.Worker._run): the pipeline the worker holds for that model
        kwargs["hires_checkpoint"] = hires_model
    _eta(body, sampler, scheduler, not_honoured)
    params = {k: v for k, v in body.items() if k in _KNOWN}
    if mode == "img2img" and not get_bool(body, "include_init_images", False):
        # A1111 echoes the images only when asked (api.py: ``if not include_init_images: init_images = None``)
        params.update({k: None for k in ("init_images", "mask") if k in params})
    ignored = sorted(str(k)[:100] for k in body if k not in _KNOWN) + net_fields
    if image_cfg is not None and mode != "img2img" and image_cfg not in (1.5, 0.0, 1.0):
        not_honoured.append("image_cfg_scale: an InstructPix2Pix model's image guidance applies in img2img")
    work = Work(model, prompt, negative, kwargs, seed, batch, n_iter, distilled_cfg=distilled,
                image_cfg=image_cfg if mode == "img2img" else None,
                max_size=(limits.max_width, limits.max_height), fields=net_names, size_from=size_from,
                extra_infotext=extra_infotext, rounded=rounded, subseed=subseed, clip_skip_option=clip_skip_option)
    return Request(work, mode, not_honoured, task_id, send_images, params, ignored)


def _eta(body: dict[str, Any], sampler: str, scheduler: str | None, not_honoured: list[str]) -> None:
    """A1111's ``eta`` sets the noise of its ancestral and SDE samplers and of DPM fast/adaptive (default 1) and
    of DDIM (default 0); sdrt runs them at those defaults (ComfyUI's dpm_fast/dpm_adaptive: at 0, theirs), so
    another value is named. Other samplers take no eta (A1111 ignores it)."""
    from ..samplers.names import resolve

    eta = get_float(body, "eta", None, 0.0, None)
    if eta is None:
        return
    choice = resolve(sampler, scheduler)
    name = choice.sampler
    own = 0.0 if name == "ddim" else 1.0 if ("ancestral" in name or "sde" in name) else None
    if name in ("dpm_fast", "dpm_adaptive"):  # A1111 runs "DPM fast"/"DPM adaptive" at its k-diffusion eta, 1
        own = float(choice.options.get("eta", 0.0))
    if own is not None and eta != own:
        not_honoured.append(f"eta: {sampler} runs at eta {own:g} here (A1111's default for it), not {eta:g}")


def _hires(body: dict[str, Any], kwargs: dict[str, Any], limits: Limits, not_honoured: list[str],
           models_dir: Path | None = None) -> None:
    """A1111's hires. fix (``enable_hr``): a first pass at width x height, upscaled by ``hr_scale`` (or to
    ``hr_resize_x`` / ``hr_resize_y``) with ``hr_upscaler``, then ``hr_second_pass_steps`` of img2img at
    ``denoising_strength`` with ``hr_sampler_name`` / ``hr_scheduler`` / ``hr_prompt`` / ``hr_negative_prompt``.
    A second pass at the first pass's own size is no pass: as A1111 (``enable_hr = False``), one pass runs and the
    infotext has no hires fields."""
    if not get_bool(body, "enable_hr", False):
        return
    from ..pipelines.bounds import MAX_SIDE
    from ..pipelines.hires import UPSCALERS, Hires

    scale = get_float(body, "hr_scale", 2.0, 1.0, 8.0)
    resize = (get_int(body, "hr_resize_x", 0, 0, MAX_SIDE), get_int(body, "hr_resize_y", 0, 0, MAX_SIDE))
    sizer = Hires(scale if not any(resize) else 1.0, 0, 0.7, "Latent", resize=resize)
    width, height = kwargs["width"] or 0, kwargs["height"] or 0  # unset: the model's own size (jobs.Worker)
    if not any(resize) and scale == 1 or width and height and sizer.off(width, height):
        return  # A1111's "the user has chosen to do nothing"
    if width and height:
        # the sizes the picture is upscaled to and the second pass runs at: A1111's, down to multiples of 8
        crop = any(sizer.crop(width, height))
        for (tw, th), what in ([(sizer.upscaled(width, height), "upscales the picture to")] if crop else []) + \
                [(sizer.target(width, height), "makes")]:
            if tw > limits.max_width or th > limits.max_height:
                how, field = hires_said(scale, resize)
                raise ApiError(400, f"hires. fix at {how} {what} {tw}x{th}, above this server's limit of "
                                    f"{limits.max_width}x{limits.max_height}", field=field)
    if any(resize):
        kwargs["hires_width"], kwargs["hires_height"] = resize
    else:
        kwargs["hires_scale"] = scale
    kwargs["hires_steps"] = get_int(body, "hr_second_pass_steps", 0, 0, limits.max_steps)
    kwargs["hires_denoise"] = get_float(body, "denoising_strength", 0.7, 0.0, 1.0, low_open=True)
    upscaler = get_str(body, "hr_upscaler", None, max_len=500)
    if upscaler is not None and upscaler.strip().casefold() == "none":
        upscaler = "Lanczos"  # A1111's "None" upscaler leaves the image as it is, then resizes it with Lanczos
    found = _upscaler(upscaler, UPSCALERS, models_dir) if upscaler not in (None, "") else None
    if found is not None:
        kwargs["hires_upscaler"] = found
    elif upscaler not in (None, ""):  # a model upscaler this server does not have
        # an image upscaler stands in for an image upscaler: a client that picked ESRGAN picked a low
        # denoising_strength, at which a latent upscale leaves the picture blurred
        kwargs["hires_upscaler"] = "Lanczos"
        not_honoured.append(f"{_lacking('hr_upscaler', repr(upscaler), UPSCALERS, models_dir)}; Lanczos ran")
    # the second pass's own sampler, schedule and prompts (A1111's "Use same ..." and "" are the first pass's)
    sampler = get_str(body, "hr_sampler_name", None, max_len=NAME_CHARS)
    if sampler not in (None, "", "Use same sampler"):
        kwargs["hires_sampler"] = sampler
    schedule = get_str(body, "hr_scheduler", None, max_len=NAME_CHARS)
    if schedule is not None and schedule.strip().casefold() in ("", "use same scheduler"):
        schedule = None  # A1111: the first pass's scheduler
    if schedule is not None and schedule.strip().casefold() != "automatic":
        kwargs["hires_schedule"] = schedule
    for field, key in (("hr_prompt", "hires_prompt"), ("hr_negative_prompt", "hires_negative_prompt")):
        text = get_str(body, field, None, max_len=limits.max_prompt_chars)
        if text:  # A1111's "": the first pass's
            kwargs[key] = text


def _hires_checkpoint(body: dict[str, Any], kwargs: dict[str, Any], registry: Registry, model: ModelEntry,
                      not_honoured: list[str]) -> ModelEntry | None:
    """A1111's ``hr_checkpoint_name`` (the UI's "Hires checkpoint"): a model of this server, matched as
    ``sd_model_checkpoint`` is (title, name with or without its hash), that runs the hires pass
    (sdrt.pipelines.hiresmodel); "Use same checkpoint", "" and null: the first pass's model. Without the hires fix
    A1111 reads it not at all."""
    name = get_str(body, "hr_checkpoint_name", None, max_len=500)
    if name is None or name.strip() in ("", "Use same checkpoint") or \
            not any(k in kwargs for k in ("hires_scale", "hires_width", "hires_height")):
        return None
    entry = registry.model(name, "hr_checkpoint_name")
    if entry.needs:
        raise ApiError(400, f"hr_checkpoint_name {entry.name!r} lacks its {entry.needs} (a part-only file): pass a "
                            "model that runs on its own", field="hr_checkpoint_name")
    kwargs["hires_checkpoint"] = entry.path  # checked as a path by validate; the worker runs its pipeline
    if entry.key != model.key and (model.vae is not None or model.text_encoders):
        not_honoured.append(f"{model.module_field or 'sd_vae'}: the VAE / text encoders chosen apply to the first pass's "
                            f"model; the hires checkpoint {entry.name} runs its own")
    return entry


def _refiner(body: dict[str, Any], kwargs: dict[str, Any], registry: Registry, model: ModelEntry,
             not_honoured: list[str], passes: str = "second pass", by_steps: bool = False) -> ModelEntry | None:
    """A1111's ``refiner_checkpoint`` (a model of this server, by name or title) and ``refiner_switch_at``: the
    refiner takes over at that fraction of the schedule (sdrt.pipelines.refiner). Unset, the switch is 0.8, the
    UI's default (A1111's API would run the refiner from the first step). With the hires. fix, ``passes`` (A1111's
    ``hires_fix_refiner_pass`` option) says in which pass it may take over; ``by_steps`` (A1111's
    ``refiner_switch_by_sample_steps`` option) switches at that fraction of the sampler's denoiser calls."""
    name = get_str(body, "refiner_checkpoint", None)
    if name is None or name.strip() in ("", "None", "none"):
        return None  # refiner_switch_at alone does nothing in A1111 (its example payload sends 0)
    entry = registry.model(name, "refiner_checkpoint")
    if entry.key == model.key:  # A1111's apply_refiner: the loaded checkpoint as its own refiner switches nothing
        not_honoured.append(f"refiner_checkpoint: {entry.name} is the model itself; no refiner ran, as in A1111")
        return None
    if entry.weights is not None or entry.needs:
        raise ApiError(400, f"refiner_checkpoint {entry.name!r} is "
                            + ("bound onto --checkpoint-base" if entry.weights is not None else "a part-only file")
                            + ", which cannot run as a refiner; pass a refiner served on its own", field="refiner_checkpoint")
    kwargs["refiner"] = entry.path
    switch = get_float(body, "refiner_switch_at", 0.8)
    if not 0 < switch <= 1:
        raise ApiError(400, f"refiner_switch_at must be above 0 and at most 1 (1: the refiner never takes over), got "
                            f"{switch:g}", field="refiner_switch_at")
    kwargs["refiner_switch_at"] = switch
    if by_steps:
        kwargs["refiner_switch_by_steps"] = True
    if any(k in kwargs for k in ("hires_scale", "hires_width", "hires_height")):
        kwargs["hires_refiner_pass"] = passes
    return entry


def _variation(body: dict[str, Any], kwargs: dict[str, Any]) -> int | None:
    """A1111's variation seeds: ``subseed`` (-1: random) mixed in at ``subseed_strength``. At strength 0 the
    subseed, fixed as A1111 fixes it whatever the strength, is returned for ``info`` only (``Work.subseed``)."""
    strength = get_float(body, "subseed_strength", 0.0, 0.0, 1.0)
    subseed = get_int(body, "subseed", -1, *SEEDS, fixed=True)
    subseed = secrets.randbelow(2**32 - 1) if subseed == -1 else subseed
    if strength:
        kwargs["subseed"] = subseed
        kwargs["subseed_strength"] = strength
        return None
    return subseed


def _img2img_upscaler(overrides: dict[str, Any], options: dict[str, Any], models_dir: Path | None,
                      not_honoured: list[str]) -> str | None:
    """A1111's ``upscaler_for_img2img`` (``override_settings`` over the server's option): ``Lanczos``, ``Nearest``
    or a model upscaler of the models folder (its path), for the pipeline's ``init_upscaler``; None for A1111's
    default (``None``: a Lanczos resize) and for a name this server lacks, which is named, as an unknown
    ``hr_upscaler`` is (A1111 falls back to ``None`` then too)."""
    from ..pipelines.hires import IMAGE_MODES

    key = "upscaler_for_img2img"
    given = overrides.get(key) if overrides.get(key) is not None else options.get(key)
    if given is None:
        return None
    if not isinstance(given, str):
        field = f"override_settings.{key}" if overrides.get(key) is not None else key
        raise ApiError(422, f"{field} must be an upscaler's name (a string), got {type(given).__name__}", field=field)
    name = given.strip()
    if name.casefold() in ("", "none"):
        return None
    found = _upscaler(name, IMAGE_MODES, models_dir)
    if found is None:
        not_honoured.append(f"{_lacking(key, repr(name[:60]), IMAGE_MODES, models_dir)}; the init image was resized "
                            "with Lanczos (A1111's None)")
    return found


def _upscaler(name: str, known: Iterable[str], models_dir: Path | None) -> str | None:
    """An upscaler a request names (``hr_upscaler``, ``upscaler_for_img2img``): one of sdrt's ``known`` names (any
    case), else the path of a model upscaler sdrt can run in the models folder's ESRGAN/ or RealESRGAN/; None when
    this server has neither (:func:`_lacking` says so)."""
    plain = {u.casefold(): u for u in known}
    if name.casefold() in plain:
        return plain[name.casefold()]
    model = extras.resolve(name, models_dir)
    return None if model is None else str(model)


def _lacking(field: str, shown: str, known: Iterable[str], models_dir: Path | None) -> str:
    """The not-honoured line for an upscaler name (``shown``, quoted) this server lacks, up to what ran instead."""
    models = ", ".join(extras.runnable(models_dir)) or "none"
    return (f"{field}: {shown} is not one of sdrt's ({', '.join(known)}) nor a model upscaler in the models folder's "
            f"ESRGAN/ or RealESRGAN/ ({models})")


def _img2img(body: dict[str, Any], kwargs: dict[str, Any], limits: Limits, not_honoured: list[str],
             upscaler: str | None = None) -> Any:
    """A1111's img2img fields into ``kwargs``; returns the init image as sent (ControlNet units without an image
    read it, as the extension reads ``p.init_images[0]``). ``upscaler``: A1111's ``upscaler_for_img2img`` (the
    pipeline's ``init_upscaler``): the picture is then fitted by the worker's pipeline, which runs it."""
    images = get_list(body, "init_images")
    if not images:
        raise ApiError(400, "img2img needs init_images: a list with one base64 PNG or JPEG", field="init_images")
    if len(images) > 1:
        not_honoured.append(f"init_images: {len(images)} given, the first one is used for every image")
    max_pixels = limits.max_width * limits.max_height * 4
    img = b64images.decode(images[0], "init_images[0]", max_pixels)
    resize_mode = get_int(body, "resize_mode", 0, 0, 3, fixed=True)
    width, height = kwargs["width"] or img.width, kwargs["height"] or img.height
    # sides left unset take the image's, within this server's limits (a 4096x4096 photo ran at 4096x4096)
    scale = min([1.0, *(limit / side for side, given, limit in ((width, kwargs["width"], limits.max_width),
                                                                   (height, kwargs["height"], limits.max_height))
                        if not given)])
    if scale < 1.0:
        not_honoured.append(f"width/height: init_images[0] is {img.width}x{img.height}, above this server's limit of "
                            f"{limits.max_width}x{limits.max_height}; it ran scaled down (pass width and height)")
        width = kwargs["width"] or max(int(width * scale), 8)
        height = kwargs["height"] or max(int(height * scale), 8)
    width, height = width - width % 8, height - height % 8
    if width < 8 or height < 8:
        raise ApiError(400, f"init_images[0] is {img.width}x{img.height}, too small for an 8x8 image",
                       field="init_images")
    kwargs["width"], kwargs["height"] = width, height
    # A1111's processing: the picture flattened, then fitted (images.resize_image); resize_mode 3 (latent upscale)
    # leaves it at its own size for the VAE and resizes its latents: the pipeline does that (resize_mode=)
    mode = RESIZE_MODES[resize_mode]
    picture = b64images.rgb_array(img)
    mask = body.get("mask")
    gray = blank = None
    blur = (0, 0)
    if mask is not None and mask != "":
        gray = read_mask(body, mask, max_pixels, not_honoured)
        blur = blur_of(body)
        if get_bool(body, "inpaint_full_res", False):
            if blurred(gray, blur).any():  # A1111 looks for the box in the blurred mask
                return only_masked(body, kwargs, img, picture, gray, blur, upscaler)
            # A1111: 'Unable to perform "Inpaint Only mask" because mask is blank, switch to img2img mode': the
            # whole picture repainted, no fill, no overlay; here an all-white mask (an inpainting UNet's
            # conditioning is then A1111's for no mask: the mask all ones, the masked picture all zeros)
            not_honoured.append("inpaint_full_res: the mask is blank (nothing to repaint), so there is no masked "
                                "area to cut out: the whole picture ran as img2img, as in A1111")
            blank = gray = np.full_like(gray, 255)
            blur = (0, 0)
    latent = mode == LATENT_UPSCALE
    # an upscaler runs a model on the worker's device: the pipeline fits the picture then (the same fit_image)
    fitted_later = latent or upscaler is not None
    kwargs["init_image"] = picture if fitted_later else fit(picture, width, height, mode, "init_images[0]")
    if fitted_later:
        kwargs["resize_mode"] = mode
    if upscaler is not None and not latent:
        kwargs["init_upscaler"] = upscaler
    kwargs["strength"] = denoising_strength(body)
    if gray is not None:
        # A1111 blurs the mask at its own size (mask_blur_x, mask_blur_y), then fits it with the init images'
        # resize_mode (processing.py: images.resize_image(self.resize_mode, image_mask, ...)): the pipeline's
        # mask_blur and fit where the pipeline fits the picture (an upscaler, latent upscale) and the mask has its
        # size. Clients send masks at their own canvas size (under latent upscale stretched, as the latents are); a
        # mask that meets the picture here (fitted here too, or of another size) is blurred here, by the same code
        if fitted_later and gray.shape == picture.shape[:2]:
            kwargs["mask"] = gray
            if blur != (0, 0):
                kwargs["mask_blur"] = blur
        else:
            kwargs["mask"] = fit(blurred(gray, blur), width, height, JUST_RESIZE if latent else mode, "mask")
        # A1111's img2img init fills the fitted picture (masking.fill) for every fill but 1 (original); 2 (latent
        # noise) and 3 (latent nothing) then change the VAE-encoded latent where the mask repaints: the pipeline's
        # masked_content (sdrt.pipelines.maskedcontent), which fits (through the upscaler), then fills, as A1111
        if blank is None:  # a blank mask's whole-picture run reads no inpainting_fill (1, original)
            masked_content(body, kwargs)
            kwargs["mask_overlay"] = True  # A1111 pastes the fitted picture back where the mask keeps it (apply_overlay)
    return img


__all__ = ["Request", "parse"]
