"""Which model family a checkpoint's keys and shapes look like (pure functions on names and shapes)."""

from __future__ import annotations

from collections.abc import Mapping

Shapes = Mapping[str, tuple[int, ...]]


def detect(shapes: Shapes) -> str:
    """A family name for a checkpoint given ``{key: shape}``: ``"SD 1.x"``, ``"SD 2.x"``,
    ``"SDXL base"``, ``"SDXL refiner"``, ``"SD 3"``, ``"Flux"``, ``"diffusers UNet"``, ... or
    ``"unknown"``. Inpainting UNets (9 input channels) get an ``" inpainting"`` suffix."""
    keys = shapes.keys()

    def has(prefix: str) -> bool:
        return any(k.startswith(prefix) for k in keys)

    if has("model.diffusion_model.joint_blocks.") or has("text_encoders.clip_g."):
        fam = "SD 3"
    elif has("model.diffusion_model.double_blocks.") or has("double_blocks."):
        fam = "Flux"
    elif has("conditioner.embedders.1.model."):
        fam = "SDXL base"
    elif has("conditioner.embedders.0.model."):
        fam = "SDXL refiner"
    elif has("cond_stage_model.model."):
        fam = "SD 2.x"
    elif has("cond_stage_model.transformer."):
        fam = "SD 1.x"
    elif has("model.diffusion_model.label_emb."):
        fam = "SDXL (UNet only)"
    elif has("model.diffusion_model."):
        ctx = _context_dim(shapes)
        fam = {768: "SD 1.x (UNet only)", 1024: "SD 2.x (UNet only)", 2048: "SDXL (UNet only)"}.get(
            ctx or 0, "LDM UNet")
    elif has("down_blocks.") and has("conv_in."):
        fam = "diffusers UNet"
    elif has("lora_unet_") or has("lora_te"):
        fam = "kohya LoRA (not a checkpoint)"
    elif "emb_params" in keys or "clip_l" in keys or "string_to_param.*" in keys:
        fam = "textual-inversion embedding (not a checkpoint)"
    else:
        return "unknown"
    w = shapes.get("model.diffusion_model.input_blocks.0.0.weight")
    if w is not None and len(w) == 4 and w[1] == 9:
        fam += " inpainting"
    return fam


def _context_dim(shapes: Shapes) -> int | None:
    for k, s in shapes.items():
        if k.endswith("attn2.to_k.weight") and len(s) == 2:
            return int(s[1])
    return None
