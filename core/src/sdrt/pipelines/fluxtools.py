"""BFL's FLUX.1 Tools: Fill (inpainting, outpainting) and Canny / Depth (a control image), as diffusers runs them.

These are Flux.1 dev transformers whose ``x_embedder`` takes more input channels; the extra channels are
conditioning concatenated to the packed noise at every step, and nothing else of the run changes:

- **Fill** (FLUX.1-Fill-dev, 384 = 64 + 64 + 256): diffusers 0.42's ``FluxFillPipeline``. The init image is
  VAE-encoded first (the start latent when ``strength`` < 1; it draws the VAE sample from the run's generator
  either way), then the noise, then the masked image ``image * (1 - mask)`` is encoded, shifted and scaled; the
  binarized mask (white = repaint) is pixel-unshuffled 8x8 into 64 channels at latent size. Packed in 2x2
  tokens: ``[noise 64 | masked image 64 | mask 256]``. No blending of the known part: the model repaints.
- **Canny / Depth** ("control", FLUX.1-Canny-dev, FLUX.1-Depth-dev, 128 = 64 + 64): ``FluxControlPipeline``.
  The control image (resized to the output, in [-1, 1]) is VAE-encoded for every image of the batch, before the
  noise, shifted, scaled and packed: ``[noise 64 | control 64]``. txt2img only.

The pipeline keeps latents unpacked (``[B, 16, h, w]``); the conditioning is built unpacked too
(``[B, 16 + 64, h, w]`` for Fill, ``[B, 16, h, w]`` for control) and concatenated on channels by the family's
generic hook before the Flux family packs the whole: packing is channel-major within a token, so that is the
same as concatenating the packed parts on the token axis, as diffusers does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError

#: a Flux transformer's input width (packed channels) -> the tool
TOOLS = {384: "fill", 128: "control"}
LABELS = {"fill": "Flux.1 Fill", "control": "Flux.1 Canny/Depth"}
#: the distilled guidance when the caller sets none: diffusers' pipeline defaults (FluxFillPipeline: 30,
#: FluxControlPipeline: 3.5; BFL suggest 30 for Canny and 10 for Depth)
DEFAULT_GUIDANCE = {"fill": 30.0, "control": 3.5}
#: the widths a Flux transformer's ``hidden_states`` may take: plain (4 x 16 channels) and the tools'
WIDTHS = (64, *TOOLS)


def tool_of(family: Any, denoiser: Any, configs: Any = None) -> str | None:
    """``"fill"``, ``"control"`` or None: what a Flux model's transformer is, from its ``hidden_states`` width (an
    export's static last axis), else its ``config.json``'s ``in_channels``."""
    if getattr(family, "name", None) != "flux":
        return None
    shape = tuple(denoiser.inputs[family.sample_input].shape)
    width = shape[2] if len(shape) == 3 and isinstance(shape[2], int) and shape[2] > 0 else None
    if width is None and configs is not None:
        width = (configs.get("transformer") or {}).get("in_channels")
    return TOOLS.get(width) if isinstance(width, int) else None


def mask_channels(mask: np.ndarray) -> np.ndarray:
    """An HxW {0, 1} mask as diffusers' ``prepare_mask_latents`` lays it out: ``[1, 64, H/8, W/8]``, channel
    ``8 dy + dx`` holding the pixel at ``(8 y + dy, 8 x + dx)`` (``view(h, 8, w, 8).permute(8, 8, h, w)``)."""
    h, w = mask.shape[0] // 8, mask.shape[1] // 8
    m = np.asarray(mask, np.float32)[: 8 * h, : 8 * w]
    return np.ascontiguousarray(m.reshape(h, 8, w, 8).transpose(1, 3, 0, 2).reshape(1, 64, h, w))


def fill_conditioning(masked_latents: np.ndarray, mask: np.ndarray, batch: int) -> np.ndarray:
    """``[batch, 16 + 64, h, w]``: the masked image's latents and the unshuffled mask, per image of the batch."""
    m = mask_channels(mask)
    lat = np.asarray(masked_latents, np.float32)
    cond = np.concatenate([lat, np.repeat(m, lat.shape[0], axis=0)], axis=1)
    return np.repeat(cond, batch // cond.shape[0], axis=0) if cond.shape[0] != batch else cond


def check(tool: str | None, s: Any, label: str, lora: str | None = None) -> None:
    """What a run asks against what the model is: one ``InputError`` naming the argument; ``lora``: the control
    LoRA that makes a Flux.1 dev model a Canny/Depth one (:mod:`.fluxcontrollora`)."""
    control = getattr(s, "control_image", None)
    if tool is not None and getattr(s, "reference_images", None):
        raise InputError(f"reference images (FLUX.1 Kontext) do not combine with a {LABELS[tool]} model: its "
                         "transformer takes wider tokens than a reference image's", where="reference_images",
                         fix="leave {@reference_images} out, or use a Flux.1 dev or Kontext model")
    if tool == "fill":
        if s.mask is None:
            raise InputError("this is a Flux.1 Fill model (its transformer takes 384 input channels): it repaints the "
                             "white part of a mask in an init image", where="mask",
                             fix="pass {@init_image=} and {@mask=} (white = repaint; an outpainting canvas is the "
                                 "image padded, with the padding white in the mask)")
        if control is not None:
            raise InputError("{@control_image} is the control map of a Flux.1 Canny or Depth model, and this is a "
                             "Flux.1 Fill model", where="control_image", fix="leave {@control_image} out")
    elif tool == "control":
        if control is None:
            what = (f"the control LoRA {lora} makes this Flux.1 dev model a Canny/Depth model" if lora else
                    "this is a Flux.1 Canny/Depth model")
            raise InputError(f"{what} (its transformer takes 128 input channels): it "
                             "needs a control image (an edge map for Canny, a depth map for Depth)",
                             where="control_image", fix="pass {@control_image=} (an edge map or a depth map as the "
                                                        "model was trained on)" + (
                                 ", or leave the LoRA out for Flux.1 dev: at any scale, 0 too, it makes the model "
                                 "Canny/Depth, as diffusers loads one" if lora else ""))
        if s.init_image is not None:
            raise InputError("img2img and inpainting with a Flux.1 Canny/Depth model are not supported (diffusers' "
                             "FluxControlPipeline is txt2img)", where="init_image",
                             fix="leave {@init_image} and {@mask} out")
    elif control is not None:
        raise InputError(f"{{@control_image}} is the control map of a Flux.1 Canny or Depth model, and this {label} model "
                         "takes none", where="control_image",
                         fix="use a Flux.1 Canny/Depth model, or a ControlNet with {@controlnets} (SD 1.x, SDXL, Flux.1 dev)")


def control_from_units(units: list[Any], where: str = "controlnets") -> Any:
    """The one ControlNet unit a Canny/Depth model takes as its control image (what ``--control-image PNG
    [--control-preprocessor canny]`` makes): no net of its own, scale 1 over every step."""
    if len(units) != 1:
        raise InputError(f"a Flux.1 Canny/Depth model takes one control image, and {len(units)} were given",
                         where=where, fix="pass one control image")
    unit = units[0]
    if not (isinstance(unit.net, str) and unit.net == "controlnet") or unit.scale != 1.0 or unit.start != 0.0 \
            or unit.end != 1.0 or getattr(unit, "control_mode", "Balanced") != "Balanced" \
            or getattr(unit, "guess_mode", False):
        raise InputError("a Flux.1 Canny/Depth model takes its control image itself, not through a ControlNet "
                         "(no net, scale, start, end, control mode or guess mode)", where=where,
                         fix="pass the image alone as {@control_image=} (a preprocessor and a resize mode may make "
                             "it; no net, scale 1, the whole schedule)")
    from .controlnet import check_no_control_mask

    # an inpaint map (RGBA, -1 under its mask) or a mask is no image for this model's VAE: refused in one line
    check_no_control_mask(unit, f"{where}[0]", "a Flux.1 Canny/Depth model")
    return unit


def control_size(s: Any) -> tuple[int, int] | None:
    """The size of a run that gives none: the control image's, each side cut to a multiple of 16 (at least 16)."""
    from .images import to_rgb

    value = s.control_image
    if value is None and len(s.toolbox.controlnets) == 1:
        value = s.toolbox.controlnets[0].image
    if value is None:
        return None
    rgb = to_rgb(getattr(value, "image", value), "control image", "control_image")
    return max(16, rgb.shape[1] // 16 * 16), max(16, rgb.shape[0] // 16 * 16)


def control_image(value: Any, width: int, height: int) -> np.ndarray:
    """The control image as the transformer's VAE input: HxWx3 uint8 after the unit's preprocessor (``value`` a
    ``ControlNet`` unit) or as given, resized to the output size as a ControlNet's image is."""
    from .controlnet import ControlNet, prepare_image

    unit = value if isinstance(value, ControlNet) else ControlNet("controlnet", value)
    return prepare_image(unit, width, height, "control_image")
