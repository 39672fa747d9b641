"""Model files people download that sdrt recognises and does not run: what each one is, in words.

Pure functions on what a file says about itself, headers only: its tensor names and shapes (``recognise``), a GGUF
file's ``general.architecture`` (``recognise(shapes, arch)``), a diffusers folder's ``model_index.json``
``_class_name`` (``pipeline_class``) and the class a PyTorch pickle names (``pickle_class``). Each answer is a noun
phrase ("Wan 2.1/2.2 14B text-to-video (a video diffusion transformer)") that the callers put into one line with
what sdrt runs instead. The signatures are the key layouts of the releases (as ComfyUI's model detection and
diffusers' single-file loader tell them apart); none of them occurs in a family sdrt runs, so a file sdrt runs is
never answered here.
"""

from __future__ import annotations

from collections.abc import Mapping

Shapes = Mapping[str, tuple[int, ...]]

#: where a denoiser's keys start: LDM/ComfyUI single files, ComfyUI's diffusion_model, bare (diffusers, GGUF)
PREFIXES = ("model.diffusion_model.", "diffusion_model.", "")
#: how a PyTorch .pth wraps its state dict (basicsr's params_ema, SAM 2's model, ...)
WRAPPERS = ("params_ema.", "params.", "state_dict.", "model_state_dict.", "module.", "model.")


class _Keys:
    """Questions on a ``{key: shape}`` mapping with a prefix taken off every key."""

    def __init__(self, shapes: Shapes, prefix: str = "") -> None:
        n = len(prefix)
        self.shapes = {k[n:]: s for k, s in shapes.items() if k.startswith(prefix)} if prefix else dict(shapes)

    def has(self, *keys: str) -> bool:
        """Whether every one of ``keys`` is there."""
        return all(k in self.shapes for k in keys)

    def pre(self, prefix: str) -> bool:
        return any(k.startswith(prefix) for k in self.shapes)

    def sub(self, part: str) -> bool:
        return any(part in k for k in self.shapes)

    def ends(self, suffix: str) -> bool:
        return any(k.endswith(suffix) for k in self.shapes)

    def dim(self, key: str, axis: int) -> int | None:
        s = self.shapes.get(key)
        return int(s[axis]) if s is not None and len(s) > abs(axis) - (axis < 0) else None

    def ndim(self, key: str) -> int | None:
        s = self.shapes.get(key)
        return None if s is None else len(s)


def recognise(shapes: Shapes, arch: str | None = None) -> str | None:
    """What a file sdrt does not run is, in words, from its tensor names and shapes (and a GGUF file's
    ``general.architecture``), or None when it is none of the known ones."""
    if instruct_pix2pix(shapes):  # runs (family sd1-ip2p / sdxl-ip2p)
        return None
    for p in PREFIXES:
        if p and not any(k.startswith(p) for k in shapes):
            continue
        what = _denoiser(_Keys(shapes, p))
        if what:
            return what
    return _other(_Keys(shapes), arch) or GGUF_IMAGE_ARCHS.get((arch or "").strip().lower())


def instruct_pix2pix(shapes: Shapes) -> bool:
    """An InstructPix2Pix checkpoint as released: an LDM UNet with 8 input channels beside its text encoders, SD 1.x
    (timbrooks' ``instruct-pix2pix-00-22000.safetensors``: CLIP-L, no ADM input) or SDXL (stabilityai's
    ``cosxl_edit.safetensors``: both SDXL encoders and the ADM input). A UNet-only 8-channel file stays refused:
    IC-Light's fc UNet has the same shapes and means something else."""
    w = shapes.get("model.diffusion_model.input_blocks.0.0.weight")
    if w is None or len(w) != 4 or int(w[1]) != 8:
        return False
    adm = any(k.startswith("model.diffusion_model.label_emb.") for k in shapes)
    if adm:
        return any(k.startswith("conditioner.embedders.1.model.") for k in shapes)
    return any(k.startswith("cond_stage_model.transformer.") for k in shapes)


def _sized(width: int | None, sizes: Mapping[int, str]) -> str:
    return f" {sizes[width]}" if width in sizes else ""


def _denoiser(k: _Keys) -> str | None:
    """A diffusion model of a family sdrt does not run (its keys with the file's denoiser prefix taken off)."""
    # -- video
    if k.has("head.modulation", "patch_embedding.weight") or k.has(
            "patch_embedding.weight", "condition_embedder.time_embedder.linear_1.weight"):
        width = k.dim("head.modulation", -1) or k.dim("patch_embedding.weight", 0)
        in_dim = k.dim("patch_embedding.weight", 1)
        if k.pre("vace_blocks.") or k.pre("vace_patch_embedding."):
            kind = "VACE (video editing)"
        elif in_dim == 48:
            return "Wan 2.2 TI2V 5B (a text/image-to-video diffusion transformer)"
        elif k.pre("img_emb.") or k.pre("condition_embedder.image_embedder.") or in_dim == 36:
            kind = "image-to-video"
        else:
            kind = "text-to-video"
        return f"Wan 2.1/2.2{_sized(width, {1536: '1.3B', 5120: '14B'})} {kind} (a video diffusion transformer)"
    if k.pre("txt_in.individual_token_refiner.blocks.") or k.pre("context_embedder.token_refiner.refiner_blocks."):
        patch = k.ndim("img_in.proj.weight") or k.ndim("x_embedder.proj.weight")
        if patch == 4:
            return "HunyuanImage 2.1 (a HunyuanVideo-architecture image transformer)"
        v15 = k.has("cond_type_embedding.weight")
        return f"HunyuanVideo{' 1.5' if v15 else ''} (a video diffusion transformer)"
    if k.pre("av_ca_a2v_gate_adaln_single.") or k.pre("audio_adaln_single."):
        return "LTX-2 (an audio-video diffusion transformer)"
    if k.has("patchify_proj.weight") and k.pre("adaln_single."):
        return "LTX-Video (a video diffusion transformer)"
    if (k.has("proj_in.weight", "time_embed.emb.timestep_embedder.linear_1.weight", "caption_projection.linear_1.weight")
            and k.pre("transformer_blocks.0.attn1.norm_q.") and not k.pre("patch_embed.")):
        return "LTX-Video (a video diffusion transformer, diffusers' layout)"
    if k.has("t5_yproj.weight") or k.has("blocks.0.attn.qkv_x.weight") or k.pre("time_embed.pooler.to_kv."):
        return "Mochi 1 (a video diffusion transformer)"
    if k.has("patch_embed.text_proj.weight"):
        if k.pre("time_condition_embed."):
            return "CogView 3/4 (an image diffusion transformer)"
        return "CogVideoX (a video diffusion transformer)"
    if k.sub("motion_modules."):
        return "an AnimateDiff motion module (adds motion to an SD 1.x/SDXL UNet to make videos)"
    if k.sub(".time_stack.") or k.sub(".time_mixer.") or k.sub(".temporal_res_block.") or k.sub(
            "temporal_transformer_blocks."):
        return "Stable Video Diffusion (SVD/SVD-XT: an image-to-video UNet)"
    # -- image transformers
    if k.has("txt_norm.weight", "img_in.weight") and k.pre("transformer_blocks.0.img_mod."):
        if k.has("time_text_embed.addition_t_embedding.weight"):
            return "Qwen-Image-Layered (a Qwen-Image diffusion transformer)"
        return "Qwen-Image or Qwen-Image-Edit (a 20B diffusion transformer; the two share one key layout)"
    if k.pre("double_stream_blocks.0.block.") or k.has("caption_projection.0.linear.weight"):
        return "HiDream-I1/E1 (a diffusion transformer)"
    if k.pre("double_stream_modulation_img.") or k.pre("single_stream_modulation."):
        return "Flux.2 (a diffusion transformer of another layout than Flux.1's)"
    if k.pre("double_blocks.") and k.pre("nerf_blocks."):
        return "Chroma Radiance (a pixel-space Chroma: no VAE, another layout than Chroma's)"
    if (k.pre("cap_embedder.") or k.pre("time_caption_embed.caption_embedder.")) and k.pre("noise_refiner."):
        width = k.dim("cap_embedder.1.weight", 0) or k.dim("time_caption_embed.caption_embedder.1.weight", 0)
        if width == 3840:
            return "Z-Image (a Lumina 2-architecture diffusion transformer)"
        return "Lumina-Image 2.0 (Lumina 2, a diffusion transformer)"
    if (k.pre("cap_embedder.") or k.pre("time_caption_embed.caption_embedder.")) and k.pre("layers.0."):
        return "Lumina-Next (a diffusion transformer)"
    if k.pre("blocks.0.mlp.inverted_conv.") or k.pre("transformer_blocks.0.ff.conv_inverted."):
        return "Sana (a linear-attention diffusion transformer)"
    if k.has("t_block.1.weight") or (k.pre("adaln_single.") and k.has("pos_embed.proj.weight")):
        if k.pre("ar_embedder.") or k.pre("csize_embedder.") or k.pre("adaln_single.emb.resolution_embedder."):
            return "PixArt-α (a diffusion transformer)"
        return "PixArt-Σ or PixArt-α (a diffusion transformer)"
    if k.pre("double_layers.0.attn.w1q.") or k.has("cond_seq_linear.weight") or (
            k.has("register_tokens") and k.pre("joint_transformer_blocks.")):
        return "AuraFlow (a diffusion transformer)"
    if k.has("mlp_t5.0.weight") or k.pre("time_extra_emb.pooler."):
        return "HunyuanDiT (a diffusion transformer)"
    if k.has("clip_txt_mapper.weight"):
        lite = k.dim("clip_txt_mapper.weight", 0) == 1536
        return f"Stable Cascade stage C{' lite' if lite else ''} (Würstchen v3's prior)"
    if k.has("clip_mapper.weight") and k.pre("down_blocks.1.0.channelwise."):
        lite = k.dim("down_blocks.1.0.channelwise.0.weight", -1) == 576
        return f"Stable Cascade stage B{' lite' if lite else ''} (Würstchen v3's decoder)"
    if k.has("vquantizer.codebook.weight"):
        return "Stable Cascade stage A (Würstchen v3's VQGAN)"
    if k.pre("blocks.block0.blocks.0.block.attn.") or (k.pre("blocks.0.mlp.layer1.") and k.pre("x_embedder.proj.1.")):
        return "Cosmos (NVIDIA's world-model diffusion transformer)"
    # -- UNets of SD's shape that sdrt's graphs do not take
    if k.pre("input_blocks.") or k.pre("down_blocks."):
        adm = k.dim("label_emb.0.0.weight", 1) or k.dim("add_embedding.linear_1.weight", 1)
        if adm == 5632 or k.has("encoder_hid_proj.weight"):
            return "Kolors (an SDXL-shaped UNet conditioned on ChatGLM3)"
        cin = k.dim("input_blocks.0.0.weight", 1) or k.dim("conv_in.weight", 1)
        what = {8: "an image-conditioned UNet with 8 input channels alone (IC-Light fc, or an InstructPix2Pix / CosXL "
                   "Edit UNet without its text encoders: those run as the whole checkpoint, a diffusers or an ONNX "
                   "folder)",
                12: "IC-Light fbc (a UNet with 12 input channels)",
                5: "SD 2 depth-to-image (a UNet with 5 input channels)",
                7: "the SD x4 upscaler (a UNet with 7 input channels)"}.get(cin or 0)
        if what and (k.pre("input_blocks.1.") or k.pre("down_blocks.0.")):
            return what
    return None


def _other(k: _Keys, arch: str | None = None) -> str | None:
    """A file that is no diffusion model: an adapter, an encoder of another family, a detector, a language model."""
    if k.has("noise_augmentor.betas") or k.pre("noise_augmentor."):
        return "SD 2.1 unCLIP (image variations: an SD 2.x UNet conditioned on CLIP image embeddings)"
    # adapters
    if k.has("lora_controlnet"):  # Stability AI's control-lora: runs as a ControlNet unit (checkpoint.controllora)
        if k.pre("label_emb."):
            return ("an SDXL Control-LoRA, Stability AI's control-lora: a ControlNet stored as a difference from the "
                    "SDXL UNet (not an image generator: pass it as a ControlNet unit's net, ControlNet(file, image) "
                    "or --controlnet FILE, beside an SDXL model)")
        return "an SD 1.x Control-LoRA (sdrt runs Stability AI's SDXL Control-LoRA files only)"
    if k.pre("image_proj.") and k.pre("ip_adapter."):  # SD 1.x / SDXL's: run with ip_adapter= / --ip-adapter
        return ("an IP-Adapter (an image-prompt adapter: pass it with ip_adapter=IPAdapter(file, image=...) or "
                "--ip-adapter FILE, beside a model, not as one)")
    if k.pre("ip_adapter_proj_model.") or k.sub(".processor.ip_adapter_double_stream_"):
        return "a Flux IP-Adapter (XLabs'; sdrt runs SD 1.x / SDXL IP-Adapters only)"
    if k.has("redux_up.weight", "redux_down.weight"):
        return "a Flux Redux adapter (image variations for Flux.1; sdrt has no Redux support)"
    if k.pre("adapter.body.") or k.has("body.0.block1.weight") or k.has("body.0.in_conv.weight") or k.pre(
            "adapter.conv_in."):
        return ("a T2I-Adapter (a control adapter: pass it as a ControlNet unit's net, ControlNet(file, image) or "
                "--controlnet FILE, beside an SD 1.x / SDXL model, not as one)")
    # encoders of other families, and their VAEs
    vision = next((w for w in ("vision_model.embeddings.patch_embedding.weight", "visual.conv1.weight",
                               "vision_model.embeddings.patch_embeddings.projection.weight")
                   if any(key.endswith(w) for key in k.shapes)), None)
    # a text encoder or a denoiser beside it anywhere (an SD 2.x checkpoint keeping OpenCLIP's visual tower under
    # cond_stage_model.model.) is no vision encoder alone
    beside = any("text_model." in key or "token_embedding." in key or "diffusion_model." in key
                 or ("transformer.resblocks." in key and "visual." not in key) for key in k.shapes)
    if vision and not beside:
        width = next((int(s[0]) for key, s in k.shapes.items() if key.endswith(vision)), 0)
        name = {1024: "CLIP ViT-L", 1280: "CLIP ViT-H (IP-Adapter's and SVD's)", 1664: "CLIP ViT-bigG",
                1152: "SigLIP (Flux Redux's)"}.get(width, "CLIP")
        return f"a {name} vision encoder (an image encoder, not a text encoder or an image generator)"
    llm = _language_model(k, arch)
    if llm:
        return llm
    if k.has("decoder.middle.0.residual.0.gamma") or k.has("encoder.middle.0.residual.0.gamma"):
        return "a Wan/Qwen-Image video VAE (a 3D VAE; sdrt's VAEs are SD's and Flux's)"
    if k.pre("decoder.conv_in.conv.") or k.pre("encoder.conv_in.conv."):
        return "a 3D video VAE (HunyuanVideo/Mochi/CogVideoX-style causal convolutions)"
    if k.ends("decoder.last_scale_shift_table") or k.ends("per_channel_statistics.mean-of-means"):
        return "an LTX-Video VAE (a video VAE)"
    if k.pre("encoder.project_in.") or k.pre("decoder.stages.1.op_list."):
        return "a DC-AE (Sana's deep-compression autoencoder)"
    # other tools people keep beside their models
    if k.ends("conv_body_first.weight") or k.sub("stylegan_decoder."):
        return "GFPGAN (a face restorer, not an image generator)"
    if k.ends("quantize.embedding.weight") and (k.sub("idx_pred_layer.") or k.sub("ft_layers.")):
        return "CodeFormer (a face restorer, not an image generator)"
    if k.sub("image_encoder.trunk.") and k.sub("sam_mask_decoder."):
        return "Segment Anything 2 (SAM 2: a segmentation model, not an image generator)"
    if k.sub("image_encoder.patch_embed.") and (k.sub("mask_decoder.") or k.sub("prompt_encoder.")):
        return "Segment Anything (SAM: a segmentation model, not an image generator)"
    if k.ends(".dfl.conv.weight"):
        return "an Ultralytics YOLO detector (ADetailer's face/hand model, not an image generator)"
    # SRVGGNetCompact (realesr-general-x4v3, realesr-animevideov3): only body.N, a 3-channel conv then PReLUs
    compact = k.has("body.0.weight", "body.1.weight") and k.ndim("body.0.weight") == 4 and \
        k.dim("body.0.weight", 1) == 3 and k.ndim("body.1.weight") == 1 and all(n.startswith("body.") for n in k.shapes)
    if (k.ends("conv_first.weight") and k.sub("body.0.rdb1.")) or k.sub("model.1.sub.0.RDB1.") or compact:
        return ("an ESRGAN-family upscaler (not an image generator: pass it as the hires upscaler, "
                "{@@hires_upscaler})")
    return None


#: a language model's layer key (transformers' names; ComfyUI's text-encoder files keep them)
_LAYER = ("model.layers.0.", "layers.0.", "model.language_model.layers.0.", "language_model.model.layers.0.")


def _language_model(k: _Keys, arch: str | None = None) -> str | None:
    """A decoder-only language model (a text encoder of Qwen-Image, HiDream, Lumina 2, Z-Image...): transformers'
    names, or llama.cpp's in a GGUF file (``blk.N.attn_q``; ``arch``: its ``general.architecture``)."""
    layer = next((p for p in _LAYER if k.pre(p + "self_attn.q_proj.")), None)
    if layer is None:
        if k.pre("blk.0.attn_q.") or (k.has("token_embd.weight") and k.pre("blk.0.")):
            role = _LLM_ROLES.get((arch or "").strip().lower())
            return (f"a{' ' + arch.strip() if arch else ''} language model GGUF (an LLM for llama.cpp"
                    f"{'; ' + role if role else ''}), not an image model")
        return None
    if k.sub("visual.blocks.") or k.sub("visual.patch_embed."):
        name, role = "Qwen2.5-VL", "Qwen-Image's text encoder"
    elif k.pre(layer + "self_attn.q_norm."):
        name, role = "Qwen3", "Z-Image's text encoder"
    elif k.pre(layer + "pre_feedforward_layernorm."):
        name, role = "Gemma 2/3", "Lumina 2's text encoder"
    elif k.pre(layer + "self_attn.q_proj.bias"):
        name, role = "Qwen2/2.5", "an LLM"
    else:
        name, role = "Llama-architecture", "Llama 3.1 8B is HiDream's text encoder, Mistral Flux.2's"
    return f"a {name} language model ({role}; a text encoder of no family sdrt runs)"


#: GGUF ``general.architecture`` values of diffusion models (city96's ComfyUI-GGUF conversions) -> what they are;
#: sdrt's own (``flux``, ``sd1``, ``sdxl``, ``sd3``, ``chroma``) are absent: their tensors say which
GGUF_IMAGE_ARCHS = {"wan": "Wan 2.1/2.2 (a video diffusion transformer)",
                    "hyvid": "HunyuanVideo (a video diffusion transformer)",
                    "ltxv": "LTX-Video (a video diffusion transformer)",
                    "cosmos": "Cosmos (NVIDIA's world-model diffusion transformer)",
                    "hidream": "HiDream-I1/E1 (a diffusion transformer)",
                    "aura": "AuraFlow (a diffusion transformer)",
                    "lumina2": "Lumina-Image 2.0 (Lumina 2, a diffusion transformer)",
                    "qwen_image": "Qwen-Image or Qwen-Image-Edit (a 20B diffusion transformer)",
                    "flux2": "Flux.2 (a diffusion transformer of another layout than Flux.1's)"}
#: text-encoder LLMs of diffusion families, by GGUF architecture
_LLM_ROLES = {"llama": "HiDream's text encoder is a Llama 3.1 8B", "qwen2vl": "Qwen-Image's text encoder",
              "qwen25vl": "Qwen-Image's text encoder", "qwen3": "Z-Image's text encoder",
              "gemma2": "Lumina 2's text encoder", "mistral3": "Flux.2's text encoder"}


#: model_index.json ``_class_name`` prefixes of diffusers pipelines sdrt does not run -> what the folder is
PIPELINES = (
    ("StableDiffusion3", None),  # its transformer's keys say 3.5 (runs) or 3.0 Medium (refused by identify)
    ("StableDiffusionDepth2Img", "SD 2 depth-to-image"),
    ("StableDiffusionUpscale", "the SD x4 upscaler"),
    ("StableDiffusionLatentUpscale", "the SD x2 latent upscaler"),
    ("StableUnCLIP", "SD 2.1 unCLIP (image variations)"),
    ("StableVideoDiffusion", "Stable Video Diffusion (an image-to-video model)"),
    ("StableCascade", "Stable Cascade (Würstchen v3)"), ("Wuerstchen", "Würstchen"),
    ("Wan", "Wan 2.1/2.2 (a video model)"), ("HunyuanVideo", "HunyuanVideo (a video model)"),
    ("HunyuanImage", "HunyuanImage 2.1"), ("HunyuanDiT", "HunyuanDiT"),
    ("LTX", "LTX-Video (a video model)"), ("Mochi", "Mochi 1 (a video model)"),
    ("CogVideoX", "CogVideoX (a video model)"), ("CogView", "CogView 3/4"),
    ("AnimateDiff", "AnimateDiff (a video model)"), ("Latte", "Latte (a video model)"),
    ("Allegro", "Allegro (a video model)"), ("SkyReels", "SkyReels (a video model)"),
    ("QwenImage", "Qwen-Image / Qwen-Image-Edit"), ("HiDream", "HiDream-I1/E1"),
    ("Lumina2", "Lumina-Image 2.0 (Lumina 2)"), ("Lumina", "Lumina-Next"), ("ZImage", "Z-Image"),
    ("PixArtAlpha", "PixArt-α"), ("PixArtSigma", "PixArt-Σ"), ("Sana", "Sana"), ("AuraFlow", "AuraFlow"),
    ("Kolors", "Kolors"), ("Flux2", "Flux.2"), ("FluxPriorRedux", "Flux Redux (an image-variation adapter)"),
    ("Kandinsky", "Kandinsky"), ("IF", "DeepFloyd IF"), ("Cosmos", "Cosmos (a world model)"),
    ("OmniGen", "OmniGen"), ("Chroma", None), ("Flux", None), ("StableDiffusion", None),
)


def pipeline_class(class_name: str) -> str | None:
    """What a diffusers folder whose ``model_index.json`` names ``class_name`` is, when sdrt does not run that
    pipeline (None for the pipelines of families it runs, and for names it does not know)."""
    name = class_name.strip()
    for prefix, what in PIPELINES:
        if name.startswith(prefix) and (prefix != "IF" or name.startswith(("IFPipeline", "IFImg", "IFInpaint",
                                                                          "IFSuperResolution"))):
            return what
    return None


#: the module a refused pickle class comes from -> what the file is
PICKLE_MODULES = (("ultralytics.", "an Ultralytics YOLO detector (ADetailer's face/hand model, not an image generator)"),
                  ("gfpgan.", "GFPGAN (a face restorer, not an image generator)"),
                  ("basicsr.", "a BasicSR model (an upscaler or face restorer, saved as a whole object)"),
                  ("segment_anything", "Segment Anything (SAM: a segmentation model)"),
                  ("insightface.", "an InsightFace model (face analysis, not an image generator)"),
                  ("transformers.", "a Hugging Face transformers model saved as a whole object"))


def pickle_class(qualname: str) -> str | None:
    """What a PyTorch file is whose pickle calls ``qualname`` (``module.Class``), when that names a known tool."""
    return next((what for prefix, what in PICKLE_MODULES if qualname.startswith(prefix)), None)
