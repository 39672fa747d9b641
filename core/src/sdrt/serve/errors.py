"""The one error a request can end in: an HTTP status, a one-line message, and the field at fault."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..errors import _items, _render


class ApiError(Exception):
    """A request the server refuses (4xx) or cannot serve now (503), or a job that failed (500). ``field`` names
    the request field; ``kind``: a 500's exception type name, which A1111's answer carries in ``error``
    (``modules/api/api.py``'s ``handle_exception``: ``type(e).__name__``)."""

    def __init__(self, status: int, message: str, *, field: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.kind = kind


#: the pipeline's argument names -> A1111's request fields
_FIELDS = {"strength": "denoising_strength", "cfg": "cfg_scale", "batch": "batch_size", "clip_skip":
           "CLIP_stop_at_last_layers", "negative_prompt": "negative_prompt", "init_image": "init_images", "sampler": "sampler_name",
           "schedule": "scheduler", "hires_scale": "hr_scale", "hires_steps": "hr_second_pass_steps",
           "hires_denoise": "denoising_strength", "hires_width": "hr_resize_x", "hires_height": "hr_resize_y",
           "hires_sampler": "hr_sampler_name", "hires_schedule": "hr_scheduler", "hires_prompt": "hr_prompt",
           "hires_negative_prompt": "hr_negative_prompt",
           "hires_upscaler": "hr_upscaler", "refiner": "refiner_checkpoint", "hires_checkpoint": "hr_checkpoint_name",
           "hires_refiner_pass": "override_settings.hires_fix_refiner_pass", "mask": "mask",
           "init_upscaler": "upscaler_for_img2img", "inpaint_area": "inpaint_full_res",
           "inpaint_padding": "inpaint_full_res_padding", "masked_content": "inpainting_fill",
           # {@@name}: how a request brings in a file of that kind
           "@loras": "a <lora:NAME:WEIGHT> tag in the prompt (the file in the LoRA folder, --lora-dir)",
           "@controlnets": "a ControlNet unit's model (alwayson_scripts.controlnet.args; the file in the models "
                           "folder's ControlNet/)",
           "@embeddings": "its name in the prompt (the file in the embeddings folder, --embedding-dir)",
           "@model": "sd_model_checkpoint (the file in the models folder, --models)",
           "@weights": "sd_model_checkpoint (the file in the models folder, --models)",
           "@lora_dir": "the server's --lora-dir",
           "@hires_upscaler": "hr_upscaler, or /sdapi/v1/extra-single-image (the file in the models folder's "
                              "ESRGAN/)"}


def in_request_words(text: str) -> str:
    """``text`` (a message with ``{@name}`` / ``{@@name}`` arguments, sdrt.errors) in the request's fields."""
    return _items(_render(text, _FIELDS), _FIELDS)


def file_names(text: str, fields: Mapping[str, str]) -> str:
    """``text`` with each server path among ``fields``' keys (a ControlNet unit's net or preprocessor file,
    ``sdrt.serve.controlnet.units``) said by the name ``fields`` gives it, never by its path on the server."""
    for key, name in fields.items():
        if os.path.isabs(key):
            text = text.replace(key, name)
    return text


def from_pipeline(exc: Exception, fields: Mapping[str, str] | None = None) -> ApiError:
    """A 400 from the pipeline's own check (``sdrt.pipelines.validate``): what was wrong and what to do,
    with the field named as the request names it. ``fields``: this request's own fields of pipeline
    arguments (``reference_images`` -> ``alwayson_scripts.Forge FluxKontext.args[1]``), over the A1111 ones."""
    names = {**_FIELDS, **(fields or {})}
    what = getattr(exc, "what", str(exc))
    fix = getattr(exc, "fix", None)
    where = getattr(exc, "where", None) or ""
    if where == "control_image":  # the pipeline's own argument, which no A1111 field carries
        return ApiError(400, f"{_render(what, names)}; sdrt serve does not pass a control image to a FLUX.1 "
                             "Canny/Depth model yet (a ControlNet unit is for ControlNet models): run it with "
                             "sdrt generate --control-image or the Python API's control_image=",
                        field="alwayson_scripts")
    field = names.get(where, where) or None
    kind = where.split(" ", 1)[0]
    mapped = where in names
    if not mapped and kind != where and kind in names:  # "sampler uni_pc": a sampler's own check, at run time
        field, mapped = names[kind], True
    # {@cfg} -> cfg_scale; a list item (controlnets[0]) -> the request's own (alwayson_scripts.controlnet.args[0])
    what, fix = _items(_render(what, names), names), _items(_render(fix, names), names) if fix else fix
    if mapped and field and field not in what and not (fix and field in fix):
        # the request's field, where the pipeline's words do not say it: a unit's threshold_a ("a down sampling rate
        # of 500 ..."), a sampler's step count, "the sampler 'Restart' is not available" of sampler_index
        what = f"{field}: {what}"
    message = f"{what}; {fix}" if fix else what
    # "use a {@clip_skip} from 1 to 3" of a request's override: "use an override_settings.CLIP_stop_at_last_layers"
    return ApiError(400, re.sub(r"\ba (override_settings\.)", r"an \1", message), field=field)


__all__ = ["ApiError", "file_names", "from_pipeline", "in_request_words"]
