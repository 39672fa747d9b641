"""IP-Adapter (image prompts) for SD 1.x, SD 2.x and SDXL, as diffusers' ``load_ip_adapter`` computes it.

``pipe.generate(prompt, ip_adapter=IPAdapter("ip-adapter_sd15.safetensors", image=picture, scale=0.6,
image_encoder="models/image_encoder"))``. Per job:

1. the picture is prepared as transformers' ``CLIPImageProcessor`` does (shorter side resized to the encoder's
   ``image_size`` with PIL's bicubic filter, centre-cropped square, scaled to [0, 1], normalized with OpenAI CLIP's
   mean and std) and encoded once: the encoder's ``image_embeds``;
2. the adapter's ``ImageProjection`` makes 4 image tokens of them; CFG's negative pass gets the projection of zero
   image embeds (diffusers' ``torch.zeros_like(image_embeds)``). IP-Adapter Plus reads the encoder's penultimate
   hidden states instead, through its Resampler (16 tokens), and the negative pass those of a zero picture
   (diffusers' ``torch.zeros_like(image)``, encoded in the same call);
3. per cross-attention layer, ``to_k_ip`` / ``to_v_ip`` of those tokens (the value times ``scale``) become two more
   inputs of the UNet, which runs its graph with IP attention added (:mod:`sdrt.checkpoint.ipattention`), carried
   with the conditioning so the positive and negative rows each get theirs however CFG batches them.

Without ``ip_adapter`` the UNet runs its graph as the file has it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, ModelError

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint.ipadapter import ImageEncoder, IPAdapterFile
    from .parts import Part
    from .prompts import Conditioning

log = logging.getLogger("sdrt.pipelines.ipadapter")

__all__ = ["IPAdapter", "clip_pixels", "infotext", "parse"]

CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
FAMILIES = ("sd1", "sd2", "sdxl")


@dataclass
class IPAdapter:
    """One IP-Adapter: ``adapter`` (``ip-adapter_sd15.safetensors``, SDXL's ``ip-adapter_sdxl_vit-h.safetensors``),
    the ``image`` it reads (HxWx3 uint8, a ``PIL.Image`` or a PNG/JPEG path), its ``scale`` (diffusers'
    ``set_ip_adapter_scale``; 0 leaves the image out) and the ``image_encoder`` (h94/IP-Adapter's
    ``models/image_encoder`` folder: a CLIP ViT-H/14, or a folder holding its ``model.onnx``; None: the
    ``image_encoder`` folder beside the adapter, or ``models/image_encoder`` for ``sdxl_models/*vit-h*``, as in
    h94's repository)."""

    adapter: Any
    image: Any
    scale: float = 1.0
    image_encoder: Any = None


def parse(value: Any) -> IPAdapter | None:
    """``ip_adapter=IPAdapter(...)`` or ``(adapter, image[, scale[, image_encoder]])``, checked (files opened later)."""
    if value is None:
        return None
    if isinstance(value, IPAdapter):
        unit = dataclasses.replace(value)
    elif isinstance(value, (tuple, list)) and 2 <= len(value) <= 4:
        unit = IPAdapter(*value)
    else:
        raise InputError(f"{{@ip_adapter}} must be an IPAdapter(adapter, image=..., scale=..., image_encoder=...), got "
                         f"{type(value).__name__}", where="ip_adapter",
                         fix="pass ip_adapter=IPAdapter(\"ip-adapter_sd15.safetensors\", image=picture, scale=0.6, "
                             "image_encoder=\"models/image_encoder\")")
    if not isinstance(unit.adapter, (str, os.PathLike)):
        raise InputError(f"the IP-Adapter must be a file path, got {type(unit.adapter).__name__}",
                         where="ip_adapter", fix="pass {@ip_adapter} the adapter's .safetensors path")
    if unit.image_encoder is not None and not isinstance(unit.image_encoder, (str, os.PathLike)):
        raise InputError(f"the IP-Adapter's image encoder must be a folder or file path, got "
                         f"{type(unit.image_encoder).__name__}", where="image_encoder",
                         fix="pass {@image_encoder} h94/IP-Adapter's models/image_encoder folder, or leave it out")
    s = unit.scale
    if isinstance(s, bool) or not isinstance(s, (int, float, np.floating)) or not math.isfinite(float(s)):
        raise InputError(f"the IP-Adapter scale must be a number, got {s!r}", where="ip_adapter_scale",
                         fix="pass {@ip_adapter_scale=}0.6 (0 leaves the image out, 1 is the adapter's full weight)")
    unit.scale = float(s)
    if unit.image is None:
        raise InputError("the IP-Adapter has no image", where="ip_adapter_image",
                         fix="pass {@ip_adapter_image} (the picture the adapter reads)")
    from .images import check_path

    check_path(unit.image, "IP-Adapter image")
    return unit


def clip_pixels(rgb: np.ndarray, size: int) -> np.ndarray:
    """transformers' ``CLIPImageProcessor`` (PIL backend): ``[1, 3, size, size]`` float32 of an HxWx3 uint8 image."""
    from PIL import Image

    h, w = rgb.shape[:2]
    if w <= h:
        new = (size, int(size * h / w))
    else:
        new = (int(size * w / h), size)
    img = Image.fromarray(rgb)
    if img.size != new:
        img = img.resize(new, Image.Resampling.BICUBIC)
    arr = np.asarray(img)
    top, left = (arr.shape[0] - size) // 2, (arr.shape[1] - size) // 2
    arr = arr[top:top + size, left:left + size].astype(np.float32) / np.float32(255)
    arr = (arr - CLIP_MEAN) / CLIP_STD
    return np.ascontiguousarray(arr.transpose(2, 0, 1)[None])


def heads_for(configs: Any, family: str, part: str) -> Any:
    """A cross-attention layer's attention heads by its width: the UNet's ``config.json`` (``attention_head_dim``,
    which diffusers reads as the heads for these UNets, or ``num_attention_heads``) or the release's (SD 1.x: 8;
    SD 2.x and SDXL: 64 channels a head)."""
    cfg = configs.get(part, {}) if isinstance(configs, dict) else {}
    heads = cfg.get("num_attention_heads") or cfg.get("attention_head_dim")
    widths = cfg.get("block_out_channels")

    def default(width: int) -> int:
        return 8 if family == "sd1" else max(width // 64, 1)

    if isinstance(heads, int):
        return lambda width: heads
    if isinstance(heads, (list, tuple)) and isinstance(widths, (list, tuple)) and len(heads) == len(widths):
        table = {int(w): int(h) for w, h in zip(widths, heads)}
        return lambda width: table.get(width, default(width))
    return default


class Prepared:
    """A job's adapter: the opened file, the image tokens of the picture and of zero embeds."""

    def __init__(self, ad: IPAdapterFile, scale: float, tokens: np.ndarray, zeros: np.ndarray) -> None:
        self.ad, self.scale, self.tokens, self.zeros = ad, scale, tokens, zeros

    def feeds(self, tokens: np.ndarray, widths: dict[int, int], dtype: Any) -> dict[str, np.ndarray]:
        out = {}
        for k in widths:
            if k not in self.ad.layers:
                raise ModelError(f"{self.ad.path.name} has no weights for the UNet's cross-attention layer {k} "
                                 f"(it has {len(self.ad.layers)} layers, the UNet {len(widths)})",
                                 where=str(self.ad.path), fix="pass an IP-Adapter made for this model's architecture")
            key, value = self.ad.key_value(k, tokens)
            if key.shape[-1] != widths[k]:
                raise ModelError(f"{self.ad.path.name}'s layer {k} is {key.shape[-1]} wide and the UNet's is "
                                 f"{widths[k]}", where=str(self.ad.path),
                                 fix="pass an IP-Adapter made for this model's architecture")
            out[f"ip_adapter_{k}_key"] = key.astype(dtype)
            out[f"ip_adapter_{k}_value"] = (value * np.float32(self.scale)).astype(dtype)
        return out


def use_ip_attention(part: Part, on: bool, heads: Any) -> None:
    """The UNet part runs its graph with IP attention from now on (``on``), or as its file has it."""
    if not on:
        part.edit_graph(None)
        return
    where = str(part.path)

    def edit(graph: Any) -> Any:
        import onnx

        from ..checkpoint.ipattention import ip_attention_graph

        model = onnx.ModelProto()
        model.CopyFrom(graph.model)
        return graph.derive(ip_attention_graph(model, heads, where))

    part.edit_graph(edit, "ip_adapter")


def ip_inputs(part: Part) -> dict[int, int]:
    """``{processor place: width}`` of the UNet graph's IP-Adapter inputs (empty: none)."""
    import re

    out = {}
    for name, info in part.inputs.items():
        m = re.match(r"ip_adapter_(\d+)_key$", name)
        if m:
            out[int(m[1])] = int(info.shape[-1])
    return out


def prepare(pipe: Any, unit: IPAdapter) -> Prepared:
    """Open the adapter (for the pipeline's family) and the encoder, encode the picture: the job's tokens."""
    from ..checkpoint.ipadapter import check_encoder, open_image_encoder, open_ip_adapter

    family = pipe.family.name
    text = pipe.denoiser.inputs.get(pipe.family.text_input)
    width = text.shape[-1] if text is not None and isinstance(text.shape[-1], int) else None
    try:  # said on the argument (--ip-adapter, a server unit's model field); the message names the file
        ad = open_ip_adapter(unit.adapter, base=family, text_width=width)
    except ModelError as exc:
        raise ModelError(exc.what, where="ip_adapter", fix=exc.fix) from exc
    try:
        enc = open_image_encoder(unit.image_encoder if unit.image_encoder is not None else default_encoder(ad.path))
    except ModelError as exc:
        raise ModelError(exc.what, where="image_encoder", fix=exc.fix) from exc
    check_encoder(ad, enc)  # its width against the adapter's, naming the encoder to pass
    if ad.kind != "base":  # Plus and Full Face read the hidden states
        return prepare_plus(pipe, ad, enc, unit)
    out = encode(pipe, enc, unit)
    embeds = np.asarray(out["image_embeds"] if "image_embeds" in out else next(iter(out.values())), np.float32)
    if embeds.ndim != 2 or embeds.shape[-1] != ad.image_dim:
        raise ModelError(f"the image encoder gives image embeds of shape {list(embeds.shape)} and "
                         f"{ad.path.name} reads [1, {ad.image_dim}]", where=str(enc.path),
                         fix="pass {@image_encoder} the encoder the adapter was trained with")
    return Prepared(ad, unit.scale, ad.project(embeds), ad.project(np.zeros_like(embeds)))


def prepare_plus(pipe: Any, ad: IPAdapterFile, enc: ImageEncoder, unit: IPAdapter) -> Prepared:
    """IP-Adapter Plus (and Full Face): the Resampler (the MLP) of the encoder's penultimate hidden states, of the
    picture and (CFG's negative pass) of a zero picture (diffusers' ``torch.zeros_like(image)`` through the encoder),
    both in one call."""
    out = encode(pipe, enc, unit, zeros=True)
    hidden = out.get("penultimate_hidden_states")
    if hidden is None:
        raise ModelError(f"the image encoder {enc.graph.name} gives no penultimate_hidden_states, which "
                         f"{ad.path.name} ({ad.label}) reads", where="image_encoder",
                         fix="pass {@image_encoder} h94/IP-Adapter's models/image_encoder folder (bound onto sdrt's "
                             "shipped graph), or an ONNX export with that output (hidden_states[-2])")
    hidden = np.asarray(hidden, np.float32)
    if hidden.ndim != 3 or hidden.shape[0] != 2 or hidden.shape[-1] != ad.image_dim:
        raise ModelError(f"the image encoder gives hidden states of shape {list(hidden.shape[1:])} and "
                         f"{ad.path.name} reads [tokens, {ad.image_dim}]", where="image_encoder",
                         fix="pass {@image_encoder} the encoder the adapter was trained with (ViT-H/14 for "
                             "ip-adapter-plus_sd15 and ip-adapter-plus_sdxl_vit-h: h94/IP-Adapter's models/image_encoder)")
    tokens = ad.project(hidden)
    return Prepared(ad, unit.scale, tokens[:1], tokens[1:])


def encode(pipe: Any, enc: ImageEncoder, unit: IPAdapter, zeros: bool = False) -> dict[str, Any]:
    """The encoder's outputs for the picture (and a zero picture after it: ``zeros``)."""
    from .images import to_rgb

    rgb = to_rgb(unit.image, "IP-Adapter image", "ip_adapter_image")
    if pipe._dry:  # the plan: its call recorded on a twin among the run's parts (no session; zeros back)
        from .parts import Part

        part = Part("image_encoder", Path(enc.graph), backend=pipe.backend, device=pipe.device, options=pipe.options)
        part = pipe._parts["image_encoder"] = part.dry()
    else:
        part = encoder_part(pipe, enc)
    pixels = clip_pixels(rgb, enc.image_size)
    out = part.run({"pixel_values": np.concatenate([pixels, np.zeros_like(pixels)]) if zeros else pixels})
    plan = getattr(pipe, "_memory_plan", None)
    placed = plan.placement("image_encoder") if plan is not None else None  # the budget's plan counts it
    if pipe.is_low_memory or (placed.placement != "resident" if placed is not None else
                              plan is not None and any(p.placement != "resident" for p in plan.parts)):
        from .lowmem import release  # used once a job, as the text encoders: not held through the denoising

        release([part])
    return out


def default_encoder(adapter: Path) -> Path:
    """Where h94/IP-Adapter keeps the encoder of an adapter (``image_encoder/`` beside it, ``models/``'s or
    ``sdxl_models/``'s: the one that gives what it reads, :func:`sdrt.checkpoint.ipadapter.h94_encoder`);
    InputError when none is there."""
    from ..checkpoint.ipadapter import h94_encoder

    found = h94_encoder(Path(adapter))
    if found is not None:
        return found
    raise InputError(f"no image encoder for {adapter.name}: none given and no image_encoder folder beside it",
                     where="image_encoder", fix="pass {@image_encoder} (h94/IP-Adapter's models/image_encoder folder, a "
                                                "CLIP ViT-H/14, or sdxl_models/image_encoder, a ViT-bigG/14 for "
                                                "ip-adapter_sdxl: config.json and model.safetensors)")


def encoder_part(pipe: Any, enc: ImageEncoder) -> Part:
    """The image encoder as a part of the pipeline (compiled once per encoder, on the pipeline's backend)."""
    from .parts import Part

    own = pipe.__dict__.get("_ip_encoder")
    if own is not None and own[0] == (enc.graph, enc.path):
        return own[1]
    if own is not None:
        own[1].close()
    part = Part("image_encoder", Path(enc.graph), backend=pipe.backend, device=pipe.device, options=pipe.options)
    part.weights = enc.weights
    part.default_weights = enc.weights
    pipe.__dict__["_ip_encoder"] = ((enc.graph, enc.path), part)
    return part


def conditioning(prep: Prepared, part: Part, cond: Conditioning, uncond: Conditioning | None
                 ) -> tuple[Conditioning, Conditioning | None]:
    """The conditionings with the IP inputs of the picture (positive) and of zero embeds (negative) added."""
    widths = ip_inputs(part)
    dtype = np.dtype(next(iter(part.inputs[f"ip_adapter_{k}_key"] for k in widths)).dtype) if widths else np.float32
    cond = dataclasses.replace(cond, extra={**cond.extra, **prep.feeds(prep.tokens, widths, dtype)})
    if uncond is not None:
        uncond = dataclasses.replace(uncond, extra={**uncond.extra, **prep.feeds(prep.zeros, widths, dtype)})
    return cond, uncond


#: sd-webui-controlnet's module for the ViT-H/14 encoder by family (SDXL's ViT-H adapters take its "plus_vith" one)
MODULE_NAMES = {"sd1": "ip-adapter_clip_sd15", "sd2": "ip-adapter_clip_sd15", "sdxl": "ip-adapter_clip_sdxl_plus_vith"}


def module_name(unit: IPAdapter, family: str) -> str:
    """sd-webui-controlnet's module for the unit's encoder: ``ip-adapter_clip_g`` for the ViT-bigG/14 adapters, else
    the ViT-H/14 one of the family."""
    from ..checkpoint.ipadapter import adapter_reads, kind_for

    reads = adapter_reads(Path(unit.adapter))
    kind = kind_for(*reads) if reads is not None else None
    if kind is not None and kind.graph == "clip_vision_g":
        return "ip-adapter_clip_g"
    return MODULE_NAMES.get(family, "ip-adapter_clip_sd15")


def infotext(unit: IPAdapter, family: str, index: int) -> dict[str, str]:
    """The adapter as sd-webui-controlnet records an IP-Adapter unit: ``ControlNet N: "Module: ip-adapter_clip_sd15,
    Model: ip-adapter_sd15, Weight: 0.6, ..."``, after the ControlNet units (``index``: their count)."""
    from .controlnet import _short

    items = [("Module", module_name(unit, family)), ("Model", Path(unit.adapter).stem),
             ("Weight", _short(unit.scale)), ("Resize Mode", "Crop and Resize"), ("Processor Res", "512"),
             ("Guidance Start", "0"), ("Guidance End", "1"), ("Pixel Perfect", "False"),
             ("Control Mode", "Balanced")]
    return {f"ControlNet {index}": ", ".join(f"{a}: {b}" for a, b in items)}
