"""InstructPix2Pix editing models: an SD 1.x or SDXL UNet with 8 input channels, the picture to edit beside the noise.

The picture's latent is the VAE encoder's mean, unscaled (``vae.encode(image).latent_dist.mode()``, as the model was
trained; diffusers' ``StableDiffusionInstructPix2PixPipeline`` and the original ``edit_cli.py``), concatenated to the
sample on channels; an EDM-trained one (CosXL Edit) takes it scaled by the VAE's scaling factor (diffusers'
``StableDiffusionXLInstructPix2PixPipeline`` with ``is_cosxl_edit``). Guidance runs three ways, ``[prompt + image, negative + image, negative + no image]``:
``uncond + cfg * (text - image) + image_cfg * (image - uncond)``.

When the guidance runs (``guidance``) is where diffusers and A1111 differ; ``strength_rule`` says whose rule a run
follows (the API's default, "diffusers"; sdrt serve's img2img, "a1111"):

- diffusers: guided only with ``cfg > 1`` and ``image_cfg >= 1``; otherwise one pass, prompt and image;
- A1111 (``sd_samplers_cfg_denoiser``): ``image_cfg == 1`` is ordinary CFG with the image on both rows, any other
  ``image_cfg`` the three-way guidance whatever ``cfg`` is.

Both agree elsewhere, and at ``image_cfg == 1`` the three-way formula is ordinary CFG, which runs then (two rows).
"""

from __future__ import annotations

#: the image guidance scale when the caller sets none (diffusers' and A1111's default)
DEFAULT_IMAGE_CFG = 1.5


def guidance(cfg: float, image_cfg: float, rule: str) -> str:
    """``"edit"`` (three-way), ``"cfg"`` (ordinary CFG, the image on both rows) or ``"none"`` (one pass)."""
    if rule == "diffusers" and not (cfg > 1 and image_cfg >= 1):
        return "none"
    if image_cfg == 1:
        return "cfg" if cfg != 1 else "none"
    return "edit"
