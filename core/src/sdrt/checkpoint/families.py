"""Which model family a checkpoint's keys and shapes look like (pure functions on names and shapes)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import edm, foreign

Shapes = Mapping[str, tuple[int, ...]]


#: an LCM-distilled UNet in diffusers' names (SimianLuo's LCM_Dreamshaper_v7, latent-consistency/lcm-sdxl): its
#: guidance scale goes in through ``time_embedding.cond_proj``, an input the shipped graphs do not have
LCM_UNET = ("an LCM-distilled UNet (its time_embedding.cond_proj takes the guidance scale), which sdrt has no graph "
            "for; an LCM-LoRA (lcm-lora-sdv1-5, lcm-lora-sdxl) on its base model runs instead, with the LCM sampler")


def detect(shapes: Shapes) -> str:
    """A family name for a checkpoint given ``{key: shape}``: ``"SD 1.x"``, ``"SD 2.x"``,
    ``"SDXL base"``, ``"SDXL refiner"``, ``"SD 3"``, ``"Flux"``, ``"diffusers UNet"``, ... or
    ``"unknown"``. Inpainting UNets (9 input channels) get an ``" inpainting"`` suffix, image-conditioned ones
    (8: InstructPix2Pix, CosXL Edit) an ``" InstructPix2Pix"`` suffix."""
    keys = shapes.keys()

    def has(prefix: str) -> bool:
        return any(k.startswith(prefix) for k in keys)

    if has("model.diffusion_model.joint_blocks.") or has("diffusion_model.joint_blocks.") or has("joint_blocks.") \
            or has("text_encoders.clip_g."):
        fam = "SD 3"
    elif has("model.diffusion_model.double_blocks.") or has("diffusion_model.double_blocks.") or has("double_blocks."):
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
        fam = "SDXL refiner (UNet only)" if _refiner_unet(shapes) else "SDXL (UNet only)"
    elif has("model.diffusion_model."):
        ctx = _context_dim(shapes)
        fam = {768: "SD 1.x (UNet only)", 1024: "SD 2.x (UNet only)", 2048: "SDXL (UNet only)"}.get(
            ctx or 0, "LDM UNet")
    elif has("control_model.") or has("zero_convs.") or has("controlnet_cond_embedding.") or has("lora_controlnet") \
            or has("controlnet_x_embedder.") or (has("controlnet_blocks.") and has("double_blocks.")) \
            or has("pos_embed_input."):
        fam = "a ControlNet"
    elif has("down_blocks.") and has("conv_in."):
        fam = "diffusers UNet"
    elif has("lora_unet_") or has("lora_te") or has("lora_transformer_"):
        fam = "kohya LoRA"
    elif any(k.endswith((".lora_A.weight", ".lora_B.weight", ".lora_down.weight", ".lora_up.weight", ".hada_w1_a",
                         ".lokr_w1", ".lokr_w1_a", ".lora.down.weight", ".diff", ".w_norm")) for k in keys):
        fam = "LoRA"
    elif "emb_params" in keys or "clip_l" in keys or "string_to_param.*" in keys:
        fam = "textual-inversion embedding"
    else:
        return "unknown"
    w = shapes.get("model.diffusion_model.input_blocks.0.0.weight")
    if w is not None and len(w) == 4 and w[1] == 9:
        fam += " inpainting"
    elif w is not None and len(w) == 4 and w[1] == 8:
        fam += " InstructPix2Pix"
    return fam


#: what ``detect`` calls a file that goes in beside a model, not as one -> the argument that takes it (``{@@name}``)
NOT_CHECKPOINTS = {"a ControlNet": "controlnets", "kohya LoRA": "loras", "LoRA": "loras",
                   "textual-inversion embedding": "embeddings"}


def with_use(label: str, given_as: str = "a checkpoint") -> str:
    """``label`` (``detect``'s) with, for a LoRA, ControlNet or embedding, where that file goes instead, as
    ``{@@name}`` (sdrt.errors): each caller reads its own way in (``--lora FILE:WEIGHT`` on the command line,
    ``pipe.set_loras(...)`` in the API, a ``<lora:...>`` tag in a served prompt)."""
    use = NOT_CHECKPOINTS.get(label.removesuffix(" inpainting"))
    return f"{label} (not {given_as}: pass it with {{@@{use}}})" if use else label


def _refiner_unet(shapes: Shapes) -> bool:
    """An LDM UNet whose ADM input is 2560 wide: the SDXL refiner's (pooled 1280 + 5 time ids x 256; base: 2816)."""
    w = shapes.get("model.diffusion_model.label_emb.0.0.weight")
    return w is not None and len(w) == 2 and int(w[1]) == 2560


def _context_dim(shapes: Shapes) -> int | None:
    for k, s in shapes.items():
        if k.endswith("attn2.to_k.weight") and len(s) == 2:
            return int(s[1])
    return None


# -- what a file holds, for loading it onto the shipped graphs -------------------------------------
#: family -> {pipeline part: shipped graph name}; parts named as diffusers' pipelines name them
FAMILY_GRAPHS: dict[str, dict[str, str]] = {
    "sd1": {"unet": "sd1_unet", "text_encoder": "clip_l", "vae_decoder": "vae4_decoder", "vae_encoder": "vae4_encoder"},
    "sd1-inpaint": {"unet": "sd1_inpaint_unet", "text_encoder": "clip_l", "vae_decoder": "vae4_decoder",
                    "vae_encoder": "vae4_encoder"},
    # timbrooks/instruct-pix2pix (instruct-pix2pix-00-22000): SD 1.x with 8 input channels (noise + the image's latent)
    "sd1-ip2p": {"unet": "sd1_ip2p_unet", "text_encoder": "clip_l", "vae_decoder": "vae4_decoder",
                 "vae_encoder": "vae4_encoder"},
    "sd2": {"unet": "sd2_unet", "text_encoder": "openclip_h", "vae_decoder": "vae4_decoder",
            "vae_encoder": "vae4_encoder"},
    # stabilityai/stable-diffusion-2-inpainting (512-inpainting-ema) and its finetunes: SD 2.x with 9 input channels
    "sd2-inpaint": {"unet": "sd2_inpaint_unet", "text_encoder": "openclip_h", "vae_decoder": "vae4_decoder",
                    "vae_encoder": "vae4_encoder"},
    "sdxl": {"unet": "sdxl_unet", "text_encoder": "clip_l", "text_encoder_2": "clip_g",
             "vae_decoder": "vae4_decoder", "vae_encoder": "vae4_encoder"},
    "sdxl-inpaint": {"unet": "sdxl_inpaint_unet", "text_encoder": "clip_l", "text_encoder_2": "clip_g",
                     "vae_decoder": "vae4_decoder", "vae_encoder": "vae4_encoder"},
    # stabilityai/cosxl's cosxl_edit.safetensors (EDM v-prediction: sdrt.checkpoint.edm): SDXL with 8 input channels
    "sdxl-ip2p": {"unet": "sdxl_ip2p_unet", "text_encoder": "clip_l", "text_encoder_2": "clip_g",
                  "vae_decoder": "vae4_decoder", "vae_encoder": "vae4_encoder"},
    "sdxl-refiner": {"unet": "sdxl_refiner_unet", "text_encoder_2": "clip_g", "vae_decoder": "vae4_decoder",
                     "vae_encoder": "vae4_encoder"},
    # SD 3 Medium (June 2024): the SD 3.5 parts around an MMDiT without q/k norm or dual attention
    "sd3-medium": {"transformer": "sd3_medium_transformer", "text_encoder": "clip_l_proj",
                   "text_encoder_2": "clip_g", "text_encoder_3": "t5xxl", "vae_decoder": "vae16_decoder",
                   "vae_encoder": "vae16_encoder"},
    "sd35-medium": {"transformer": "sd35_medium_transformer", "text_encoder": "clip_l_proj",
                    "text_encoder_2": "clip_g", "text_encoder_3": "t5xxl", "vae_decoder": "vae16_decoder",
                    "vae_encoder": "vae16_encoder"},
    "sd35-large": {"transformer": "sd35_large_transformer", "text_encoder": "clip_l_proj",
                   "text_encoder_2": "clip_g", "text_encoder_3": "t5xxl", "vae_decoder": "vae16_decoder",
                   "vae_encoder": "vae16_encoder"},
    "flux-dev": {"transformer": "flux_dev_transformer", "text_encoder": "clip_l", "text_encoder_2": "t5xxl",
                 "vae_decoder": "vae16_decoder", "vae_encoder": "vae16_encoder"},
    # BFL's FLUX.1 Tools: Flux.1 dev with a wider x_embedder (sdrt.checkpoint.graphs.DERIVED)
    "flux-fill": {"transformer": "flux_fill_transformer", "text_encoder": "clip_l", "text_encoder_2": "t5xxl",
                  "vae_decoder": "vae16_decoder", "vae_encoder": "vae16_encoder"},
    "flux-control": {"transformer": "flux_control_transformer", "text_encoder": "clip_l", "text_encoder_2": "t5xxl",
                     "vae_decoder": "vae16_decoder", "vae_encoder": "vae16_encoder"},
    "flux-schnell": {"transformer": "flux_schnell_transformer", "text_encoder": "clip_l", "text_encoder_2": "t5xxl",
                     "vae_decoder": "vae16_decoder", "vae_encoder": "vae16_encoder"},
    "chroma": {"transformer": "chroma_transformer", "text_encoder": "t5xxl", "vae_decoder": "vae16_decoder",
               "vae_encoder": "vae16_encoder"},
}
#: which encoder kind each family's text-encoder parts are, and its VAE's latent channels
FAMILY_ENCODERS: dict[str, dict[str, str]] = {
    fam: {part: g for part, g in graphs.items() if part.startswith("text_encoder")} for fam, graphs in FAMILY_GRAPHS.items()
}
FAMILY_LATENT_CHANNELS = {fam: 16 if graphs["vae_decoder"] == "vae16_decoder" else 4
                          for fam, graphs in FAMILY_GRAPHS.items()}
LABELS = {"sd1": "SD 1.x", "sd1-inpaint": "SD 1.x inpainting", "sd1-ip2p": "SD 1.x InstructPix2Pix", "sd2": "SD 2.x", "sd2-inpaint": "SD 2.x inpainting",
          "sdxl": "SDXL",
          "sdxl-inpaint": "SDXL inpainting", "sdxl-ip2p": "SDXL InstructPix2Pix (CosXL Edit)", "sdxl-refiner": "SDXL refiner", "sd3-medium": "SD 3 Medium",
          "sd35-medium": "SD 3.5 Medium",
          "sd35-large": "SD 3.5 Large",
          "flux-dev": "Flux.1 dev", "flux-schnell": "Flux.1 schnell", "chroma": "Chroma",
          "flux-fill": "Flux.1 Fill dev", "flux-control": "Flux.1 Canny/Depth dev"}
#: a Flux.1 dev transformer's input channels (x_embedder's in_features) -> its family: FLUX.1 Tools widen it
FLUX_INPUTS = {64: "flux-dev", 384: "flux-fill", 128: "flux-control"}
#: a separate part file's kind -> its human name
PART_KINDS = {"clip_l": "a CLIP-L text encoder", "clip_g": "a CLIP-G (OpenCLIP bigG) text encoder",
              "openclip_h": "an OpenCLIP-H text encoder (SD 2.x)", "t5xxl": "a T5-XXL text encoder",
              "vae4": "a 4-channel VAE (SD 1.x/2.x/SDXL)", "vae16": "a 16-channel VAE (SD 3.x/Flux)"}


@dataclass(frozen=True)
class Identity:
    """What one file holds.

    ``family``: a key of ``FAMILY_GRAPHS`` when the file holds a denoiser, else None; ``kind``:
    ``"checkpoint"`` (a denoiser, possibly with text encoders and a VAE), a ``PART_KINDS`` key for a
    separate text encoder or VAE, or ``"unknown"``; ``components``: what it holds, by part
    (``unet``/``transformer``, ``text_encoder``..., ``vae``), each with its key prefix; ``label``: what
    it looks like, in words (for messages); ``foreign``: the file is a model (or tool) sdrt knows and does not
    run (``sdrt.checkpoint.foreign``), and ``label`` says what it is.
    """

    family: str | None
    kind: str
    label: str
    components: dict[str, str] = field(default_factory=dict)
    foreign: bool = False
    #: the denoiser's key names: ``"publisher"`` (LDM / Stability / BFL, as checkpoints ship) or ``"diffusers"`` (a
    #: ``UNet2DConditionModel`` / transformer's own names, the file of a diffusers folder's ``unet/`` or
    #: ``transformer/`` given alone)
    layout: str = "publisher"


def _width(shapes: Shapes, *keys: str) -> int | None:
    for k in keys:
        s = shapes.get(k)
        if s:
            return int(s[-1])
    return None


def clip_kind(shapes: Shapes, prefix: str) -> str | None:
    """``clip_l``/``openclip_h``/``clip_g`` for a CLIP text tower under ``prefix`` (by its width), else None."""
    w = _width(shapes, prefix + "text_model.embeddings.token_embedding.weight", prefix + "token_embedding.weight",
               prefix + "embeddings.token_embedding.weight")
    return {768: "clip_l", 1024: "openclip_h", 1280: "clip_g"}.get(w or 0)


#: the width of each flow family's transformer at its release (x_embedder / context_embedder rows)
_RELEASE_WIDTH = {"sd3-medium": 1536, "sd35-medium": 1536, "sd35-large": 2432, "flux-dev": 3072, "flux-schnell": 3072,
                  "flux-fill": 3072, "flux-control": 3072, "chroma": 3072}


def diffusers_denoiser(shapes: Shapes) -> tuple[str | None, str]:
    """``(family, what it looks like)`` of a diffusers UNet / transformer from its tensor names and shapes."""
    keys = list(shapes)

    def has(p: str) -> bool:
        return any(k.startswith(p) for k in keys)

    if has("single_transformer_blocks.") and has("x_embedder."):
        if has("distilled_guidance_layer."):
            return "chroma", "a Chroma transformer"
        if has("time_text_embed.guidance_embedder."):
            width = (shapes.get("x_embedder.weight") or (0, 0))[-1]
            fam = FLUX_INPUTS.get(width)
            if fam is None:
                return None, f"a Flux.1 dev-like transformer with {width} input channels, which has no shipped graph"
            return fam, f"a {LABELS[fam]} transformer"
        return "flux-schnell", "a Flux.1 schnell transformer (no guidance input)"
    if has("transformer_blocks.") and has("context_embedder.") and has("pos_embed."):
        if has("transformer_blocks.0.attn2."):
            return "sd35-medium", "an SD 3.5 Medium transformer"
        if has("transformer_blocks.0.attn.norm_q."):
            return "sd35-large", "an SD 3.5 Large transformer"
        return "sd3-medium", "an SD 3 Medium transformer"
    if has("down_blocks.") and has("conv_in."):
        conv_in = shapes.get("conv_in.weight", ())
        inpaint = len(conv_in) == 4 and conv_in[1] == 9
        ip2p = len(conv_in) == 4 and conv_in[1] == 8
        if ip2p and has("add_embedding."):
            return "sdxl-ip2p", "an SDXL InstructPix2Pix UNet (8 input channels: CosXL Edit)"
        if has("add_embedding."):
            adm = shapes.get("add_embedding.linear_1.weight", ())
            if len(adm) == 2 and adm[1] == 2560 and not inpaint:  # pooled 1280 + 5 time ids (aesthetic score) x 256
                return "sdxl-refiner", "an SDXL refiner UNet"
            return ("sdxl-inpaint" if inpaint else "sdxl"), "an SDXL UNet"
        proj = next((s for k, s in shapes.items() if re.search(r"attentions\.\d+\.proj_in\.weight$", k)), None)
        if proj is not None and len(proj) == 2 and ip2p:
            return None, "an SD 2.x UNet with 8 input channels, which has no shipped graph; SD 1.x InstructPix2Pix runs"
        if proj is not None and len(proj) == 2:  # SD 2.x: linear proj_in; SD 1.x: a 1x1 conv
            return ("sd2-inpaint", "an SD 2.x inpainting UNet") if inpaint else ("sd2", "an SD 2.x UNet")
        if ip2p:
            return "sd1-ip2p", "an SD 1.x InstructPix2Pix UNet (8 input channels)"
        return ("sd1-inpaint" if inpaint else "sd1"), "an SD 1.x UNet"
    what = foreign.recognise(shapes)
    if what is not None:
        return None, f"{what}, which sdrt does not run"
    return None, f"not a diffusers UNet or transformer ({detect(shapes)})"


def identify(shapes: Shapes, family: str | None = None, arch: str | None = None) -> Identity:
    """What a file holds, from its tensor names and shapes only (no data read).

    A file of a family sdrt does not run (Wan, Qwen-Image, an IP-Adapter, an LLM...: ``foreign.recognise``;
    ``arch``: a GGUF file's ``general.architecture``) is ``Identity(None, "unknown", what it is, foreign=True)``.

    SD 3 Medium, SD 3.5, Flux.1 and Chroma transformers are told apart by their keys (SD 3.5's q/k norm,
    SD 3.5 Medium's ``attn2``) and then checked against their release widths; ``family`` (a ``FAMILY_GRAPHS``
    key) accepts a transformer whose keys say that family at other widths (a reduced or test model bound onto
    graphs of its own, ``graph_paths``)."""
    what = foreign.recognise(shapes, arch)
    if what is not None:
        return Identity(None, "unknown", what, foreign=True)
    keys = list(shapes)

    def has(p: str) -> bool:
        return any(k.startswith(p) for k in keys)

    comps: dict[str, str] = {}
    # ComfyUI's prefix, the bare "diffusion_model." some trainers save (as foreign.PREFIXES reads), or none
    flow_prefix = next((p for p in ("model.diffusion_model.", "diffusion_model.") if has(p)), "")
    fam: str | None = None
    if has(flow_prefix + "joint_blocks."):
        width = _width(shapes, flow_prefix + "context_embedder.bias") or 0
        dual = has(flow_prefix + "joint_blocks.0.x_block.attn2.")
        qk = has(flow_prefix + "joint_blocks.0.x_block.attn.ln_q.")
        keyed = ("sd35-medium" if dual else "sd35-large") if qk else (None if dual else "sd3-medium")
        if keyed is not None and family == keyed:
            fam = keyed
        elif dual and qk and width == 1536:
            fam = "sd35-medium"
        elif qk and width == 2432:
            fam = "sd35-large"
        elif not qk and not dual and width == 1536:  # stabilityai/stable-diffusion-3-medium (June 2024)
            fam = "sd3-medium"
        else:
            by_keys = f" ({LABELS[keyed]} by its keys)" if keyed and family else ""
            return Identity(None, "unknown", f"an SD 3 MMDiT of width {width}{' with' if qk else ' without'} qk-norm"
                            f"{' and with dual attention' if dual else ''}{by_keys}, which has no shipped graph")
        comps["transformer"] = flow_prefix
    elif has(flow_prefix + "double_blocks.") and has(flow_prefix + "single_blocks."):
        if has(flow_prefix + "distilled_guidance_layer."):
            fam = "chroma"
        elif has(flow_prefix + "guidance_in."):
            fam = FLUX_INPUTS.get(_width(shapes, flow_prefix + "img_in.weight") or 0, "flux-dev")
        else:
            fam = "flux-schnell"
        w = _width(shapes, flow_prefix + "img_in.weight")
        if family != fam and (shapes.get(flow_prefix + "img_in.weight", (0, 0))[0] != 3072
                              or (w != 64 and fam not in ("flux-fill", "flux-control"))):
            return Identity(None, "unknown", f"a Flux-like transformer of width "
                            f"{shapes.get(flow_prefix + 'img_in.weight', (0,))[0]} with {w} input channels "
                            f"(not Flux.1/Chroma{'; ' + LABELS[fam] + ' by its keys' if family else ''}), "
                            "which has no shipped graph")
        comps["transformer"] = flow_prefix
    elif has("model.diffusion_model.input_blocks."):
        old = detect(shapes)
        inpaint = old.endswith(" inpainting")
        ip2p = old.endswith(" InstructPix2Pix")
        if old.startswith("SDXL refiner"):  # conditioner.embedders.0 is OpenCLIP-G alone, or a 2560-wide ADM input
            fam = "sdxl-refiner"
        elif old.startswith("SDXL base") or old.startswith("SDXL (UNet only)"):
            fam = "sdxl"
        elif old.startswith("SD 2.x"):
            fam = "sd2"
        elif old.startswith("SD 1.x"):
            fam = "sd1"
        else:
            return Identity(None, "unknown", f"{old}, which has no shipped graph")
        if fam == "sdxl-refiner" and family != fam and not _refiner_unet(shapes):
            return Identity(None, "unknown", "an SDXL refiner's text encoder (conditioner.embedders.0: OpenCLIP-G) "
                            "beside a UNet that is not the refiner's (its ADM input is not 2560 wide), which has no "
                            "shipped graph")
        if inpaint and fam in ("sd1", "sd2", "sdxl"):
            fam += "-inpaint"
        elif ip2p and fam in ("sd1", "sdxl"):
            fam += "-ip2p"
        elif inpaint or ip2p:
            return Identity(None, "unknown", f"{old}, which has no shipped graph")
        comps["unet"] = "model.diffusion_model."
    elif detect(shapes) in ("diffusers UNet", "unknown") and (dfam := diffusers_denoiser(shapes)[0]) is not None:
        # a UNet / transformer in diffusers' names as one file: a diffusers folder's unet/ or transformer/ file given
        # alone, SDXL-Lightning's sdxl_lightning_4step_unet.safetensors, diffusers-format finetunes (ComfyUI's "Load
        # Diffusion Model" reads them); the shipped graphs' parameters carry these names
        if "time_embedding.cond_proj.weight" in shapes:  # LCM's guidance embedding: run as its base it is noise
            return Identity(None, "unknown", LCM_UNET)
        width = (shapes.get("x_embedder.weight") or shapes.get("context_embedder.weight") or (0,))[0]
        want = _RELEASE_WIDTH.get(dfam)
        if want is not None and width != want and family != dfam:
            return Identity(None, "unknown", f"{diffusers_denoiser(shapes)[1]} in diffusers' names of width {width} "
                            f"(the release's is {want}), which has no shipped graph")
        fam = dfam
        den = "transformer" if dfam.startswith(("sd3", "sd35", "flux", "chroma")) else "unet"
        shown = LABELS[fam] + (" (transformer only, diffusers' names)" if den == "transformer" else
                               " (UNet only, diffusers' names)")
        return Identity(fam, "checkpoint", shown, {den: ""}, layout="diffusers")
    if fam is not None:
        # text encoders and VAE baked into the file
        for p, part in (("cond_stage_model.transformer.", "text_encoder"), ("cond_stage_model.model.", "text_encoder"),
                        ("conditioner.embedders.0.transformer.", "text_encoder"),
                        ("conditioner.embedders.1.model.", "text_encoder_2"),
                        ("conditioner.embedders.0.model.", "text_encoder_2")):  # the refiner's only encoder
            if has(p):
                comps[part] = p
        t = {"sd3-medium": ("text_encoder", "text_encoder_2", "text_encoder_3"),
             "sd35-medium": ("text_encoder", "text_encoder_2", "text_encoder_3"),
             "sd35-large": ("text_encoder", "text_encoder_2", "text_encoder_3"),
             "flux-dev": ("text_encoder", None, "text_encoder_2"), "flux-schnell": ("text_encoder", None,
                                                                                   "text_encoder_2"),
             "flux-fill": ("text_encoder", None, "text_encoder_2"),
             "flux-control": ("text_encoder", None, "text_encoder_2"),
             "chroma": (None, None, "text_encoder")}.get(fam)
        if t:
            for p, part in zip(("text_encoders.clip_l.transformer.", "text_encoders.clip_g.transformer.",
                                "text_encoders.t5xxl.transformer."), t):
                if part and has(p):
                    comps[part] = p
        for p in ("first_stage_model.", "vae."):
            if has(p + "decoder.") or has(p + "encoder."):
                comps["vae"] = p
        # Playground v2.5 (edm_mean/edm_std) and CosXL (edm_vpred.*): SDXL trained with EDM (sdrt.checkpoint.edm)
        edm_label = edm.edm_label(shapes) if fam == "sdxl" else None
        shown = (edm_label or LABELS[fam]) + ("" if set(comps) - {"unet", "transformer"} else
                                              (" (transformer only)" if "transformer" in comps else " (UNet only)"))
        return Identity(fam, "checkpoint", shown, comps)
    # a separate part
    kind = clip_kind(shapes, "")
    if kind is not None and (has("text_model.encoder.layers.") or has("transformer.resblocks.")
                             or has("encoder.layers.")):
        return Identity(None, kind, PART_KINDS[kind], {"text_encoder": ""})
    if has("encoder.block.0.layer.0.SelfAttention.q.weight") or has("encoder.block.0.layer.0.SelfAttention."):
        d = _width(shapes, "shared.weight", "encoder.embed_tokens.weight", "encoder.final_layer_norm.weight")
        vocab = (shapes.get("shared.weight") or shapes.get("encoder.embed_tokens.weight") or (0,))[0]
        if vocab > 200_000 or has("encoder.block.1.layer.0.SelfAttention.relative_attention_bias."):
            # UMT5: a 256k vocabulary and a position bias in every block (T5: 32k, block 0 only)
            return Identity(None, "unknown", f"a UMT5{'-XXL' if d == 4096 else ''} text encoder (Wan's; not the "
                            "T5-XXL that SD 3.5, Flux.1 and Chroma use)", foreign=True)
        if d == 4096:
            return Identity(None, "t5xxl", PART_KINDS["t5xxl"], {"text_encoder": ""})
        return Identity(None, "unknown", f"a T5 encoder of width {d} (not T5-XXL), which has no shipped graph")
    for p in ("", "first_stage_model.", "vae."):
        s = shapes.get(p + "decoder.conv_in.weight") or shapes.get(p + "encoder.conv_out.weight")
        if s is not None and len(s) == 4:
            ch = int(s[1]) if (p + "decoder.conv_in.weight") in shapes else int(s[0]) // 2
            kind = {4: "vae4", 16: "vae16"}.get(ch)
            if kind:
                return Identity(None, kind, PART_KINDS[kind], {"vae": p})
            return Identity(None, "unknown", f"a {ch}-channel VAE, which no shipped family uses")
    label = with_use(detect(shapes))
    if label == "unknown":  # say what was looked for and what is there, not "it looks like unknown"
        keys = sorted(shapes)
        shown = ", ".join(keys[:4]) + (f", ... ({len(keys)} tensors)" if len(keys) > 4 else "")
        label = (f"no family sdrt knows: none of the key layouts of an SD 1.x/2.x/XL/3 or Flux checkpoint, a "
                 f"diffusers UNet, a CLIP/T5 text encoder, a VAE, a ControlNet, a LoRA or an embedding; its keys: "
                 f"{shown or 'none'}")
    return Identity(None, "unknown", label)
