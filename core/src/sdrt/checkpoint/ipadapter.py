"""IP-Adapter files (image prompts) and their CLIP image encoder, as people download them.

h94/IP-Adapter's ``models/ip-adapter_sd15.safetensors`` (and ``sdxl_models/ip-adapter_sdxl_vit-h.safetensors``)
hold two things:

- ``image_proj.proj.weight/bias`` and ``image_proj.norm.*``: diffusers' ``ImageProjection``, the encoder's
  ``image_embeds`` (its projection output, 1024 wide for ViT-H/14) -> ``Linear`` -> 4 tokens of the text width
  -> ``LayerNorm``;
- ``ip_adapter.{k}.to_k_ip.weight`` / ``to_v_ip.weight``: one key and one value projection (no bias) per
  cross-attention layer, ``k`` being the layer's place in diffusers' attention-processor order (the UNet's
  ``attn_processors``: down blocks, up blocks, then the mid block; ``attn1`` at even places, ``attn2`` at odd).

The projection and the per-layer key/value projections are a few small matrix products on 4 tokens: sdrt does them
in numpy (:mod:`sdrt.pipelines.ipadapter`) and feeds the results to the UNet, whose graph gets one more attention
per cross-attention layer (:mod:`sdrt.checkpoint.ipattention`). The image encoder (a transformers
``CLIPVisionModelWithProjection`` folder, ``models/image_encoder/``) binds onto sdrt's shipped weight-free
ViT-H/14 graph (``clip_vision_h``), or is an ONNX export of one's own (a folder holding ``model.onnx`` with
``pixel_values`` -> ``image_embeds``).

IP-Adapter Plus (``ip-adapter-plus_sd15``, ``ip-adapter-plus-face_sd15``, ``ip-adapter-plus_sdxl_vit-h``,
``ip-adapter-plus-face_sdxl_vit-h``) has diffusers' ``IPAdapterPlusImageProjection`` instead (a Resampler:
``image_proj.latents``, ``proj_in``, ``layers.N.0`` perceiver attention, ``layers.N.1`` feed-forward, ``proj_out``,
``norm_out``): it reads the encoder's penultimate hidden states (all tokens, 1280 wide for ViT-H/14) and makes 16
image tokens. sdrt computes it in numpy too (:func:`resample`).

IP-Adapter Full Face (``ip-adapter-full-face_sd15``) has h94's ``MLPProjModel`` (diffusers'
``IPAdapterFullImageProjection``: ``image_proj.proj.0`` Linear, GELU, ``proj.2`` Linear, ``proj.3`` LayerNorm) over
the same penultimate hidden states: one image token per encoder token (257 for ViT-H/14), in numpy too.

The ViT-bigG/14 adapters (``sdxl_models/ip-adapter_sdxl``, ``models/ip-adapter_sd15_vit-G``) read the 1280-wide
``image_embeds`` of OpenCLIP ViT-bigG/14 (h94's ``sdxl_models/image_encoder``), bound onto the shipped
``clip_vision_g``. Which shipped graph an encoder binds onto is told by its folder's ``config.json`` (``hidden_size``
and ``num_hidden_layers``; by its tensors when it comes without one), never by the adapter's name; an encoder that
does not give what the adapter reads is refused before anything runs, naming both and the folder to pass.

IP-Adapter FaceID (h94/IP-Adapter-FaceID's ``ip-adapter-faceid_sd15`` / ``_sdxl``, ``.bin`` or ``.safetensors``)
has h94's ``MLPProjModel`` of a face embedding (diffusers' ``IPAdapterFaceIDImageProjection``: ``image_proj.proj.0``
Linear, GELU, ``proj.2`` Linear to 4 tokens, ``image_proj.norm`` LayerNorm); FaceID Plus (``ip-adapter-faceid-plusv2_
sd15`` / ``_sdxl``, and v1's ``ip-adapter-faceid-plus_sd15``) ``ProjModelFaceIdPlus`` (diffusers'
``IPAdapterFaceIDPlusImageProjection``): those 4 tokens are the latents of a perceiver (``image_proj.
perceiver_resampler.*``, the Plus Resampler's blocks) over the ViT-H/14 hidden states of the aligned face, plus the
tokens themselves times ``s_scale`` when ``shortcut`` (v2). The face embedding is InsightFace's, which
:mod:`sdrt.pipelines.faces` computes from its ONNX files. The files' own LoRA keys (``ip_adapter.N.to_q_lora...``)
are left out, as diffusers' ``load_ip_adapter`` leaves them: the LoRA is the ``..._lora.safetensors`` beside the
adapter, an ordinary LoRA. FaceID Portrait (16 tokens of several faces) is refused by name.

InstantID's adapter (InstantX/InstantID's ``ip-adapter.bin``, sd-webui-controlnet's
``ip-adapter_instant_id_sdxl.bin``) is an SDXL IP-Adapter Plus whose Resampler reads no image encoder: its
``image_proj.proj_in`` is 512 wide, the ArcFace embedding of a face (InsightFace's ``antelopev2``, not normed), fed
as one token; 16 face tokens come out (:data:`FACE_DIM`; kind ``"instantid"``). The same tokens are the
``encoder_hidden_states`` of InstantID's ControlNet (:mod:`sdrt.pipelines.controlnet`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ModelError, SdrtError
from ..weights import TensorRef, Weights
from .files import open_weights

log = logging.getLogger("sdrt.checkpoint.ipadapter")

PathLike = str | os.PathLike[str]
#: the text width a cross-attention reads -> the base it is made for
_CONTEXT = {768: "sd1", 1024: "sd2", 2048: "sdxl"}
BASE_LABELS = {"sd1": "SD 1.x", "sd2": "SD 2.x", "sdxl": "SDXL"}
EXAMPLES = {"sd1": "h94/IP-Adapter's models/ip-adapter_sd15.safetensors",
            "sdxl": "h94/IP-Adapter's sdxl_models/ip-adapter_sdxl_vit-h.safetensors"}
#: the shipped weight-free image encoder graph (laion/CLIP-ViT-H-14, h94/IP-Adapter's models/image_encoder)
ENCODER_GRAPH = "clip_vision_h"


@dataclass(frozen=True)
class EncoderKind:
    """A CLIP image encoder sdrt ships a weight-free graph of: its ``graph``, what people call it, its published
    widths (``hidden``: the hidden states', ``embeds``: ``image_embeds``'), and where h94 and ComfyUI keep it."""

    graph: str
    label: str
    hidden: int
    layers: int
    embeds: int
    h94: str
    comfy: str


#: checked in this order (an encoder binds onto the first whose graph has its width and depth)
ENCODER_KINDS = (
    EncoderKind("clip_vision_h", "ViT-H/14", 1280, 32, 1024, "models/image_encoder",
                "CLIP-ViT-H-14-laion2B-s32B-b79K.safetensors"),
    EncoderKind("clip_vision_g", "ViT-bigG/14", 1664, 48, 1280, "sdxl_models/image_encoder",
                "CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors"),
)
#: the width of InsightFace's ArcFace embedding: an IP-Adapter Plus Resampler reading it is InstantID's
FACE_DIM = 512
_KV = re.compile(r"ip_adapter\.(\d+)\.(to_k_ip|to_v_ip)\.weight$")


@dataclass
class IPAdapterFile:
    """An opened IP-Adapter file: its ``base``, the encoder width its projection reads (``image_dim``), its
    ``tokens`` (4), ``cross`` (the text width), and per cross-attention layer ``k`` (diffusers' processor place)
    the key and value weights ``[width, cross]``, read on use."""

    path: Path
    base: str
    image_dim: int
    tokens: int
    cross: int
    weights: Weights
    layers: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: "plus": a Resampler reading the encoder's penultimate hidden states; "full": Full Face's MLP of them (a
    #: token per encoder token; ``tokens`` 0); "base": ``image_embeds``; "faceid": an MLP of a face embedding
    #: (``image_dim`` its width); "faceid_plus": that and a perceiver over the hidden states (``clip_dim`` wide);
    #: "instantid": a Plus Resampler of the (raw) face embedding as one token
    kind: str = "base"
    clip_dim: int | None = None

    @property
    def label(self) -> str:
        return f"an {BASE_LABELS[self.base]} IP-Adapter" + {"plus": " Plus", "full": " Full Face", "faceid": " FaceID",
                                                             "faceid_plus": " FaceID Plus", "instantid": " InstantID"
                                                             }.get(self.kind, "")

    @property
    def face(self) -> bool:
        """Whether it reads InsightFace's face embedding (FaceID, FaceID Plus)."""
        return self.kind in ("faceid", "faceid_plus", "instantid")

    @property
    def reads(self) -> str:
        """What of the encoder the projection reads: ``image_embeds`` or ``hidden states`` (the penultimate)."""
        return "image embeds" if self.kind == "base" else "hidden states"

    @property
    def encoder_width(self) -> int | None:
        """The width of what it reads of the image encoder (None: FaceID reads no image encoder)."""
        return None if self.kind in ("faceid", "instantid") else self.clip_dim if self.kind == "faceid_plus" else self.image_dim

    def project_face(self, face: np.ndarray, hidden: np.ndarray | None = None, shortcut: bool = False,
                     s_scale: float = 1.0) -> np.ndarray:
        """FaceID's ``[rows, 512]`` face embeddings -> ``[rows, tokens, cross]``; FaceID Plus: those tokens through its
        perceiver over ``hidden`` (``[rows, encoder tokens, clip_dim]``), plus the tokens times ``s_scale`` when
        ``shortcut``."""
        w = self.weights

        def mat(name: str) -> np.ndarray:
            return w.get_array(name, np.float32)

        x = np.asarray(face, np.float32) @ mat("image_proj.proj.0.weight").T + mat("image_proj.proj.0.bias")
        x = _gelu(x) @ mat("image_proj.proj.2.weight").T + mat("image_proj.proj.2.bias")
        x = _layer_norm(x.reshape(x.shape[0], self.tokens, self.cross), w, "image_proj.norm").astype(np.float32)
        if self.kind != "faceid_plus":
            return x
        out = resample(w, hidden, latents=x, prefix="image_proj.perceiver_resampler")
        return (x + np.float32(s_scale) * out).astype(np.float32) if shortcut else out

    def project(self, image_embeds: np.ndarray) -> np.ndarray:
        """diffusers' ``ImageProjection``: ``[rows, image_dim]`` -> ``[rows, tokens, cross]`` (float32); Plus: its
        Resampler of ``[rows, encoder tokens, image_dim]`` hidden states; Full Face: their MLP, token by token."""
        w = self.weights
        if self.kind == "plus":
            return resample(w, image_embeds)
        if self.kind == "instantid":  # [rows, 512] face embeddings, one token each
            return resample(w, np.asarray(image_embeds, np.float32).reshape(-1, 1, self.image_dim))
        if self.kind == "full":
            return full_face(w, image_embeds)
        x = np.asarray(image_embeds, np.float32) @ w.get_array("image_proj.proj.weight", np.float32).T
        x = x + w.get_array("image_proj.proj.bias", np.float32)
        x = x.reshape(x.shape[0], self.tokens, self.cross)
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        x = (x - mean) / np.sqrt(var + 1e-5)
        return x * w.get_array("image_proj.norm.weight", np.float32) + w.get_array("image_proj.norm.bias", np.float32)

    def key_value(self, k: int, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``k``'s ``to_k_ip(tokens)``, ``to_v_ip(tokens)``: ``[rows, tokens, width]`` each."""
        kn, vn = self.layers[k]
        return (tokens @ self.weights.get_array(kn, np.float32).T, tokens @ self.weights.get_array(vn, np.float32).T)


def _layer_norm(x: np.ndarray, w: Weights, name: str) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    x = (x - mean) / np.sqrt(var + 1e-5)
    return x * w.get_array(f"{name}.weight", np.float32) + w.get_array(f"{name}.bias", np.float32)


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU (torch's default): ``x * (1 + erf(x / sqrt 2)) / 2``, erf by Abramowitz-Stegun 7.1.26 in float64
    (absolute error under 1.5e-7, below float32's)."""
    z = np.abs(x.astype(np.float64)) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return (x * 0.5 * (1.0 + erf)).astype(np.float32)


def resample(w: Weights, hidden: np.ndarray, latents: np.ndarray | None = None, prefix: str = "image_proj"
             ) -> np.ndarray:
    """diffusers' ``IPAdapterPlusImageProjection`` on h94's keys: ``[rows, encoder tokens, image_dim]`` -> ``[rows,
    queries, cross]``. Per block ``N``: the latents attend (64 channels a head, no biases) to the layer-normed
    hidden states and themselves (``layers.N.0``: ``norm1`` / ``norm2``, ``to_q``, ``to_kv`` split in two,
    ``to_out``), then a GELU feed-forward (``layers.N.1.0`` LayerNorm, ``.1``, ``.3``), each added to its input.
    FaceID Plus's perceiver (``prefix`` ``image_proj.perceiver_resampler``) is the same with given ``latents``."""
    def mat(name: str) -> np.ndarray:
        return w.get_array(name, np.float32)

    x = np.asarray(hidden, np.float32) @ mat(f"{prefix}.proj_in.weight").T + mat(f"{prefix}.proj_in.bias")
    rows = x.shape[0]
    lat = np.repeat(mat(f"{prefix}.latents"), rows, axis=0) if latents is None else np.asarray(latents, np.float32)
    n = 0
    while f"{prefix}.layers.{n}.0.to_q.weight" in w:
        a, f = f"{prefix}.layers.{n}.0", f"{prefix}.layers.{n}.1"
        xs, ls = _layer_norm(x, w, f"{a}.norm1"), _layer_norm(lat, w, f"{a}.norm2")
        q = ls @ mat(f"{a}.to_q.weight").T
        k, v = np.split(np.concatenate([xs, ls], 1) @ mat(f"{a}.to_kv.weight").T, 2, axis=-1)
        q, k, v = (t.reshape(rows, t.shape[1], -1, 64).transpose(0, 2, 1, 3) for t in (q, k, v))
        s = q @ k.transpose(0, 1, 3, 2) / np.float32(8.0)  # 1 / sqrt(64)
        s = np.exp(s - s.max(-1, keepdims=True))
        o = (s / s.sum(-1, keepdims=True)) @ v
        lat = o.transpose(0, 2, 1, 3).reshape(rows, lat.shape[1], -1) @ mat(f"{a}.to_out.weight").T + lat
        h = _gelu(_layer_norm(lat, w, f"{f}.0") @ mat(f"{f}.1.weight").T)
        lat = h @ mat(f"{f}.3.weight").T + lat
        n += 1
    out = lat @ mat(f"{prefix}.proj_out.weight").T + mat(f"{prefix}.proj_out.bias")
    return _layer_norm(out, w, f"{prefix}.norm_out").astype(np.float32)


def full_face(w: Weights, hidden: np.ndarray) -> np.ndarray:
    """diffusers' ``IPAdapterFullImageProjection`` (h94's ``MLPProjModel``) on h94's keys: ``[rows, encoder tokens,
    image_dim]`` -> ``[rows, encoder tokens, cross]``: ``proj.0`` Linear, exact GELU, ``proj.2`` Linear, ``proj.3``
    LayerNorm."""
    def mat(name: str) -> np.ndarray:
        return w.get_array(name, np.float32)

    x = np.asarray(hidden, np.float32) @ mat("image_proj.proj.0.weight").T + mat("image_proj.proj.0.bias")
    x = _gelu(x) @ mat("image_proj.proj.2.weight").T + mat("image_proj.proj.2.bias")
    return _layer_norm(x, w, "image_proj.proj.3").astype(np.float32)


#: the keys of IP-Adapter Full Face's MLP (h94's layout)
FULL_KEYS = tuple(f"image_proj.proj.{i}.{p}" for i in (0, 2, 3) for p in ("weight", "bias"))
#: the keys of an IP-Adapter Plus's Resampler (h94's layout) besides its blocks
PLUS_KEYS = ("image_proj.latents", "image_proj.proj_in.weight", "image_proj.proj_in.bias", "image_proj.proj_out.weight",
             "image_proj.proj_out.bias", "image_proj.norm_out.weight", "image_proj.norm_out.bias")


def is_plus(keys: list[str]) -> bool:
    return any(k.startswith(("image_proj.latents", "image_proj.proj_in")) for k in keys)


def is_full(keys: list[str]) -> bool:
    """IP-Adapter Full Face: an MLP ending in a LayerNorm (``image_proj.proj.3``), no ``image_proj.norm``."""
    return "image_proj.proj.3.weight" in keys and "image_proj.norm.weight" not in keys


#: FaceID's projection (h94's layout), FaceID Plus's perceiver besides its blocks
FACEID_KEYS = tuple(f"image_proj.{n}.{p}" for n in ("proj.0", "proj.2", "norm") for p in ("weight", "bias"))
PERCEIVER_KEYS = tuple(k.replace("image_proj.", "image_proj.perceiver_resampler.") for k in PLUS_KEYS[1:])
PORTRAIT = "an IP-Adapter FaceID Portrait (16 tokens of several face embeddings)"


def is_faceid(keys: list[str]) -> bool:
    """IP-Adapter FaceID (or FaceID Plus): an MLP of the face embedding (``image_proj.proj.0`` / ``proj.2``) then
    ``image_proj.norm``, no Full Face ``proj.3``."""
    return ("image_proj.proj.0.weight" in keys and "image_proj.norm.weight" in keys
            and "image_proj.proj.3.weight" not in keys) or any(
        k.startswith("image_proj.perceiver_resampler.") for k in keys)


def variant(keys: list[str]) -> str | None:
    """What an IP-Adapter file is when sdrt does not build it (a label), else None (base, Plus, Full Face, FaceID,
    FaceID Plus)."""
    if is_faceid(keys):
        plus = any(k.startswith("image_proj.perceiver_resampler.") for k in keys)
        missing = [k for k in (*FACEID_KEYS, *((*PERCEIVER_KEYS, "image_proj.perceiver_resampler.layers.0.0.to_q."
                                                "weight") if plus else ())) if k not in keys]
        return (f"an IP-Adapter FaceID{' Plus' if plus else ''} of a layout sdrt does not know (no {missing[0]})"
                if missing else None)
    if any("lora" in k for k in keys):
        return "an IP-Adapter with LoRA weights of a kind sdrt does not know (no FaceID image_proj.proj.0 / norm)"
    if is_plus(keys):
        missing = [k for k in (*PLUS_KEYS, "image_proj.layers.0.0.to_q.weight") if k not in keys]
        return f"an IP-Adapter Plus of a layout sdrt does not know (no {missing[0]})" if missing else None
    if is_full(keys):
        missing = [k for k in FULL_KEYS if k not in keys]
        return f"an IP-Adapter Full Face of a layout sdrt does not know (no {missing[0]})" if missing else None
    if any(k.startswith("image_proj.proj.0.") for k in keys):
        return "an IP-Adapter of a kind sdrt does not know (an image_proj.proj.0 MLP without image_proj.norm)"
    if "image_proj.proj.weight" not in keys or "image_proj.norm.weight" not in keys:
        return ("an IP-Adapter of a kind sdrt does not know (no image_proj.proj / image_proj.norm, nor a Plus "
                "Resampler's image_proj.latents)")
    return None


def is_ip_adapter(keys: list[str] | Mapping[str, object]) -> bool:
    names = list(keys)
    return any(k.startswith("image_proj.") for k in names) and any(k.startswith("ip_adapter.") for k in names)


def check_file(p: Path, what: str = "ip_adapter") -> Weights:
    """The file's weights when it is a base IP-Adapter (of any width); one ``SdrtError`` naming what it is
    otherwise (another kind of file, a Plus / Full Face / FaceID adapter)."""
    w = open_weights(p, "IP-Adapter", "pass the adapter file itself (e.g. ip-adapter_sd15.safetensors)",
                     "IP-Adapter .safetensors file")
    shapes = w.shapes()
    keys = list(shapes)
    if not is_ip_adapter(keys):
        from .families import detect
        from .foreign import recognise

        shown = recognise(shapes) or detect(shapes)
        if shown == "unknown":
            shown = f"unknown (first keys: {', '.join(keys[:3])})"
        raise ModelError(f"{p.name} is not an IP-Adapter: it looks like {shown}", where=str(p),
                         fix=f"pass {{@{what}}} an IP-Adapter file (e.g. {EXAMPLES['sd1']})")
    kind = variant(keys)
    if kind is not None:
        raise ModelError(f"{p.name} is {kind}, which sdrt does not run; it runs the base IP-Adapter, IP-Adapter "
                         "Plus, Full Face, FaceID, FaceID Plus and InstantID", where=str(p), fix=f"pass the base adapter "
                         f"({EXAMPLES['sd1']}, or {EXAMPLES['sdxl']}, ip-adapter_sdxl), a Plus one (ip-adapter-plus_sd15, "
                         "ip-adapter-plus-face_sd15, ip-adapter-plus_sdxl_vit-h), ip-adapter-full-face_sd15, or a "
                         "FaceID one (ip-adapter-faceid_sd15, ip-adapter-faceid-plusv2_sd15)")
    return w


def open_ip_adapter(path: PathLike, *, base: str | None = None, text_width: int | None = None,
                    what: str = "ip_adapter") -> IPAdapterFile:
    """Open ``ip-adapter_sd15.safetensors`` (or SDXL's ``ip-adapter_sdxl_vit-h``); ``base``: the model's family
    (``sd1``/``sd2``/``sdxl``) and ``text_width`` the width its UNet's text input has: an adapter for another is
    refused. One ``SdrtError`` naming the file otherwise."""
    p = Path(path)
    w = check_file(p, what)
    shapes = w.shapes()
    keys = list(shapes)
    plus, full, face = is_plus(keys), is_full(keys), is_faceid(keys)
    clip_dim = None
    if face:  # proj.0 [2 * face, face], proj.2 [tokens * cross, 2 * face]: 4 tokens (Portrait: 16, refused)
        cross = int(shapes["image_proj.norm.weight"][0])
        proj = (int(shapes["image_proj.proj.2.weight"][0]), int(shapes["image_proj.proj.0.weight"][1]))
        if "image_proj.perceiver_resampler.proj_in.weight" in shapes:
            clip_dim = int(shapes["image_proj.perceiver_resampler.proj_in.weight"][1])
        if proj[0] == 16 * cross and clip_dim is None:
            raise ModelError(f"{p.name} is {PORTRAIT}, which sdrt does not run", where=str(p),
                             fix=f"pass {{@{what}}} ip-adapter-faceid_sd15 or ip-adapter-faceid-plusv2_sd15 (or their "
                                 "_sdxl ones)")
    elif plus:  # [1, queries, hidden] latents; proj_in [hidden, image_dim]: as [tokens * cross, image_dim] below
        cross = int(shapes["image_proj.norm_out.weight"][0])
        proj = (int(shapes["image_proj.latents"][1]) * cross, int(shapes["image_proj.proj_in.weight"][1]))
    elif full:  # proj.0 [image_dim, image_dim], proj.2 [cross, image_dim]: a token per encoder token (0 below)
        cross = int(shapes["image_proj.proj.3.weight"][0])
        proj = (0, int(shapes["image_proj.proj.0.weight"][1]))
        mlp = (tuple(shapes["image_proj.proj.0.weight"]), tuple(shapes["image_proj.proj.2.weight"]))
        if mlp != ((proj[1], proj[1]), (cross, proj[1])):
            raise ModelError(f"{p.name} has a Full Face projection of shapes sdrt does not know (image_proj.proj.0 "
                             f"{list(mlp[0])}, proj.2 {list(mlp[1])})", where=str(p), fix="download the file again")
    else:
        proj = shapes["image_proj.proj.weight"]
        cross = int(shapes["image_proj.norm.weight"][0])
    layers: dict[int, tuple[str, str]] = {}
    for k in keys:
        if m := _KV.match(k):
            layers.setdefault(int(m[1]), ("", ""))
    for k in layers:
        layers[k] = (f"ip_adapter.{k}.to_k_ip.weight", f"ip_adapter.{k}.to_v_ip.weight")
        for name in layers[k]:
            if name not in shapes:
                raise ModelError(f"{p.name} has no {name} (an IP-Adapter has a key and a value projection per "
                                 "cross-attention layer)", where=str(p), fix="download the file again")
    widths = {int(shapes[n][1]) for pair in layers.values() for n in pair}
    if not layers or widths != {cross} or len(proj) != 2 or proj[0] % cross:
        raise ModelError(f"{p.name} has IP-Adapter keys of shapes sdrt does not know (text width {cross}, layer "
                         f"inputs {sorted(widths)})", where=str(p), fix="download the file again")
    found = _CONTEXT.get(cross)
    if base is not None and text_width is not None and cross == text_width:
        found = base  # the model's own text width (a model of another width than the releases': its own adapter)
    if found is None:
        model = "" if base is None else f", and the model is {BASE_LABELS.get(base, base)}" + (
            f" ({text_width}-wide text)" if text_width else "")
        raise ModelError(f"{p.name} is an IP-Adapter for a {cross}-wide text encoder (not SD 1.x, SD 2.x or SDXL)"
                         + model, where=str(p), fix=f"pass {{@{what}}} an IP-Adapter made for the model (e.g. "
                         f"{EXAMPLES.get(base or 'sd1', EXAMPLES['sd1'])})")
    instantid = plus and not face and int(proj[1]) == FACE_DIM  # no CLIP encoder's hidden states are 512 wide
    ad = IPAdapterFile(p, found, int(proj[1]), int(proj[0]) // cross, cross, w, layers,
                       ("faceid_plus" if clip_dim else "faceid") if face else "instantid" if instantid else "plus"
                       if plus else "full" if full else "base", clip_dim)
    if base is not None and (base != found or text_width is not None and cross != text_width):
        want = BASE_LABELS.get(base, base)
        raise ModelError(f"{p.name} is {ad.label}, and the model is {want}", where=str(p),
                         fix=f"pass {{@{what}}} an IP-Adapter made for {want}"
                             + (f" (e.g. {EXAMPLES[base]})" if base in EXAMPLES else ""))
    log.info("%s: %s, %d cross-attention layers, %s image tokens from %d-wide %s", p.name, ad.label,
             len(layers), ad.tokens or "per encoder token", ad.image_dim, "face embeddings" if ad.face else ad.reads)
    return ad


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass
class ImageEncoder:
    """A CLIP image encoder ready to load: ``graph`` (.onnx), ``weights`` (None: the graph's own), the picture
    size it takes, the width of its ``image_embeds`` and of its hidden states (None: not known before it runs), and
    ``label`` (``ViT-H/14``, ``ViT-bigG/14``: the shipped graph it binds onto; None: an own export)."""

    path: Path
    graph: Path
    weights: Weights | None
    image_size: int
    embed_dim: int | None
    hidden_dim: int | None = None
    label: str | None = None


_LAYER = re.compile(r"vision_model\.encoder\.layers\.(\d+)\.")


def _depth(names: object) -> int:
    return 1 + max((int(m[1]) for n in names if (m := _LAYER.match(n))), default=-1)  # type: ignore[attr-defined]


_DIMS: dict[str, tuple[int, int]] = {}


def _graph_dims(path: Path) -> tuple[int, int]:
    """A shipped encoder graph's (hidden width, layers), read once a path."""
    if str(path) not in _DIMS:
        from ..graph import Graph

        info = Graph.load(path).initializer_info()
        cls = info.get("vision_model.embeddings.class_embedding")
        _DIMS[str(path)] = (int(cls.shape[0]) if cls is not None else -1, _depth(info))
    return _DIMS[str(path)]


def _name(p: Path) -> str:
    """A path as a message names it: the file or folder with its parent (``models/image_encoder``)."""
    return "/".join(p.parts[-2:]) if len(p.parts) > 1 else str(p)


def kind_for(reads: str, width: int) -> EncoderKind | None:
    """The shipped encoder whose ``reads`` (``image embeds`` / ``hidden states``) are ``width`` wide, if one is."""
    return next((k for k in ENCODER_KINDS if (k.embeds if reads == "image embeds" else k.hidden) == width), None)


def _known(kinds: tuple[EncoderKind, ...] | None = None) -> str:
    return " or ".join(f"{k.label} ({k.hidden} wide, {k.layers} layers)" for k in (kinds or ENCODER_KINDS))


#: OpenCLIP's visual tower names -> transformers' (``vision_model.`` + these; the rest below)
_OPENCLIP_TOP = {"class_embedding": "embeddings.class_embedding", "conv1.weight": "embeddings.patch_embedding.weight",
                 "positional_embedding": "embeddings.position_embedding.weight", "ln_pre.weight": "pre_layrnorm.weight",
                 "ln_pre.bias": "pre_layrnorm.bias", "ln_post.weight": "post_layernorm.weight",
                 "ln_post.bias": "post_layernorm.bias"}
_OPENCLIP_BLOCK = (("ln_1.", "layer_norm1."), ("ln_2.", "layer_norm2."), ("attn.out_proj.", "self_attn.out_proj."),
                   ("mlp.c_fc.", "mlp.fc1."), ("mlp.c_proj.", "mlp.fc2."))
_IN_PROJ = "transformer.resblocks.0.attn.in_proj_weight"


def _openclip_prefix(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The prefix of an OpenCLIP visual tower's keys (``visual.``): the one with its ``proj`` and
    ``class_embedding``, not a text tower's (open_clip's whole model file keeps that one at the top level,
    ``transformer.resblocks.N``, sorted before ``visual.``); None when there is none."""
    return next((k[: -len(_IN_PROJ)] for k in shapes if k.endswith(_IN_PROJ) and f"{k[: -len(_IN_PROJ)]}proj"
                 in shapes and f"{k[: -len(_IN_PROJ)]}class_embedding" in shapes), None)


def openclip_vision(w: Weights, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, TensorRef] | None:
    """An OpenCLIP visual tower (open_clip's own ``open_clip_model.safetensors``: ``visual.class_embedding``,
    ``visual.transformer.resblocks.N.attn.in_proj_weight``, ``visual.proj``..., the layout ComfyUI's clip_vision
    loader converts too) under transformers' ``CLIPVisionModelWithProjection`` names, read on use: the fused
    ``in_proj`` split into its q, k, v thirds, ``proj`` ([width, embeds], applied as ``x @ proj``) transposed into
    ``visual_projection.weight``. None when the file holds no such tower (a text tower beside it is left out)."""
    from .ldm import Source

    prefix = _openclip_prefix(shapes)
    if prefix is None:
        return None
    conv: dict[str, Source] = {"visual_projection.weight": Source(f"{prefix}proj", "T")}
    for key in shapes:
        if not key.startswith(prefix):
            continue
        k = key[len(prefix):]
        if k in _OPENCLIP_TOP:
            conv[f"vision_model.{_OPENCLIP_TOP[k]}"] = Source(key)
            continue
        m = re.match(r"transformer\.resblocks\.(\d+)\.(.*)", k)
        if m is None:
            continue
        layer, rest = f"vision_model.encoder.layers.{m[1]}.", m[2]
        if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
            for i, qkv in enumerate("qkv"):
                conv[f"{layer}self_attn.{qkv}_proj.{rest.rsplit('_', 1)[1]}"] = Source(key, f"part:{i}/3")
            continue
        for old, new in _OPENCLIP_BLOCK:
            if rest.startswith(old):
                conv[layer + new + rest[len(old):]] = Source(key)
                break
    out = {}
    for name, src in conv.items():
        ref = w.ref(src.key)
        origin = None if ref.origin is None else (*ref.origin[:3], f"openclip {src.op}")
        out[name] = TensorRef(name, ref.dtype, tuple(src.shape(tuple(ref.shape))), ref.source,
                              (lambda src=src: src.load(w.get_array)), origin)
    return out


def open_image_encoder(path: PathLike, *, what: str = "image_encoder",
                       kinds: tuple[EncoderKind, ...] | None = None) -> ImageEncoder:
    """h94/IP-Adapter's ``models/image_encoder/`` (ViT-H/14) or ``sdxl_models/image_encoder/`` (ViT-bigG/14):
    transformers' ``config.json`` + ``model.safetensors``, bound onto the shipped graph of the size its config says;
    its ``model.safetensors`` alone (next to its ``config.json``, or without one, as ComfyUI's ``clip_vision/`` holds
    it: the size read from its tensors; in transformers' layout or OpenCLIP's, :func:`openclip_vision`), or a folder
    holding ``model.onnx`` (``pixel_values`` -> ``image_embeds``,
    with a ``config.json`` giving ``image_size``). ``kinds``: the shipped encoders it may bind onto (None: the
    IP-Adapters', :data:`ENCODER_KINDS`)."""
    kinds = ENCODER_KINDS if kinds is None else kinds
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if not p.exists():
        raise ModelError(f"the image encoder {p} does not exist", where=str(p),
                         fix=f"pass {{@{what}}} the IP-Adapter's image encoder folder (h94/IP-Adapter's "
                             "models/image_encoder, a CLIP ViT-H/14, or sdxl_models/image_encoder, a ViT-bigG/14: "
                             "config.json and model.safetensors)")
    config: dict = {}
    if (folder / "config.json").is_file():
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"the image encoder's config.json cannot be read ({exc})", where=str(folder),
                             fix="download the image encoder folder again") from exc
    vision = config.get("vision_config", config) if isinstance(config, dict) else None
    size = vision.get("image_size") if isinstance(vision, dict) else None
    embed = vision.get("projection_dim", config.get("projection_dim")) if isinstance(vision, dict) else None
    hidden = vision.get("hidden_size") if isinstance(vision, dict) else None
    depth = vision.get("num_hidden_layers") if isinstance(vision, dict) else None
    if not isinstance(vision, dict) or any(v is not None and not _whole(v) for v in (size, embed, hidden, depth)):
        raise ModelError("the image encoder's config.json is not a CLIP vision config (image_size, projection_dim, "
                         "hidden_size and num_hidden_layers must be positive whole numbers, got "
                         f"{size!r}, {embed!r}, {hidden!r} and {depth!r})", where=str(folder / "config.json"),
                         fix="download the image encoder folder again (transformers' CLIPVisionModelWithProjection "
                             "config.json)")
    onnx_file = p if p.suffix == ".onnx" else folder / "model.onnx"
    if onnx_file.is_file():
        return ImageEncoder(p, onnx_file, None, size or 224, embed, hidden)
    st = p if p.is_file() else next((folder / n for n in ("model.safetensors", "model.fp16.safetensors",
                                                         "pytorch_model.bin") if (folder / n).is_file()), None)
    if st is None:
        raise ModelError(f"{p.name} holds no image encoder (model.safetensors or model.onnx)", where=str(p),
                         fix=f"pass {{@{what}}} h94/IP-Adapter's models/image_encoder (or sdxl_models/image_encoder) "
                             "folder")
    w = open_weights(st, "image encoder", "pass the image encoder folder (config.json + model.safetensors)",
                     "CLIP image encoder .safetensors file")
    shapes = w.shapes()
    refs = openclip_vision(w, shapes) if "visual_projection.weight" not in shapes else None
    if refs is not None:  # OpenCLIP's own layout, seen under transformers' names
        shapes = {k: r.shape for k, r in refs.items()}
    if "visual_projection.weight" not in shapes:
        hint = ("a CLIP text encoder" if any(k.startswith("text_model.") for k in shapes) else
                f"not a CLIP image encoder (first keys: {', '.join(list(shapes)[:3])})")
        raise ModelError(f"{st.name} is {hint}; an IP-Adapter reads a CLIPVisionModelWithProjection's image_embeds",
                         where=str(st), fix=f"pass {{@{what}}} h94/IP-Adapter's models/image_encoder (or "
                                            "sdxl_models/image_encoder) folder")
    proj = shapes["visual_projection.weight"]
    has = (int(proj[1]), _depth(shapes))
    said = (hidden or has[0], depth or has[1])
    if said != has or embed is not None and embed != int(proj[0]):
        raise ModelError(f"the image encoder's config.json says {said[0]} wide, {said[1]} layers and "
                         f"{embed or int(proj[0])}-wide image_embeds, and {st.name} holds {has[0]} wide, {has[1]} "
                         f"layers and {int(proj[0])}-wide", where=str(st),
                         fix="download the image encoder folder again (its config.json and model.safetensors together)")
    embed = int(proj[0])
    if size is None:  # no config (ComfyUI's clip_vision file): positions = (size / patch)^2 + 1
        pos = shapes.get("vision_model.embeddings.position_embedding.weight")
        patch = shapes.get("vision_model.embeddings.patch_embedding.weight")
        side = round((int(pos[0]) - 1) ** 0.5) if pos else 0
        size = side * int(patch[-1]) if pos and patch and side * side == int(pos[0]) - 1 else 224
    from ..graph import Graph
    from .graphs import shipped_graph

    kind = next((k for k in kinds if _graph_dims(shipped_graph(k.graph)) == said), None)
    near = kind or next((k for k in kinds if _graph_dims(shipped_graph(k.graph))[0] == said[0]), kinds[0])
    gpath = shipped_graph(near.graph)
    graph = Graph.load(gpath)
    names = set(graph.external_refs)  # the weights it needs (its own constants are inline)
    gshapes = {k: tuple(int(d) for d in v.shape) for k, v in graph.initializer_info().items()}
    wrong = [k for k in sorted(names) if k not in shapes or tuple(shapes[k]) != gshapes.get(k)]
    if kind is None or wrong:
        first = f"; against {near.label}'s graph, first differing tensor: {wrong[0]}" if wrong else ""
        raise ModelError(f"{st.name} is a CLIP image encoder of another size than {_known(kinds)}: {said[0]} wide, "
                         f"{said[1]} layers, {embed}-wide image_embeds{first}", where=str(st),
                         fix=f"pass {{@{what}}} h94/IP-Adapter's models/image_encoder (ViT-H/14) or "
                             "sdxl_models/image_encoder (ViT-bigG/14), or export this encoder to a folder holding "
                             "model.onnx and pass that")
    from .single_file import with_own_constants

    # float32 as the shipped graph holds them (h94's encoders are stored in float16), converted when read
    bound = with_own_constants(graph, {k: (refs or {}).get(k) or w.ref(k) for k in shapes if k in names},
                               st).astype(np.float32)
    return ImageEncoder(p, gpath, bound, size, embed, said[0], kind.label)


def check_encoder(ad: IPAdapterFile, enc: ImageEncoder, what: str = "image_encoder") -> None:
    """One ``ModelError`` (on ``what``) when the encoder does not give what the adapter reads, as wide as it reads
    it, naming both and the encoder to pass; nothing when it does (or cannot be told before it runs)."""
    got = enc.embed_dim if ad.kind == "base" else enc.hidden_dim
    width = ad.encoder_width
    if got is None or width is None or got == width:
        return
    want, have = kind_for(ad.reads, width), kind_for(ad.reads, got)
    mine = f" ({have.label})" if have is not None and enc.label in (None, have.label) else (
        f" ({enc.label})" if enc.label else "")
    raise ModelError(f"the image encoder {_name(enc.path)}{mine} gives {got}-wide {ad.reads} and {ad.path.name} "
                     f"reads {width}-wide ones" + (f" (an OpenCLIP {want.label}'s)" if want else ""),
                     where=what, fix=f"pass {{@{what}}} the encoder {ad.path.name} was trained with" + (
                         f": the {want.label}, h94/IP-Adapter's {want.h94} folder (ComfyUI's clip_vision/"
                         f"{want.comfy})" if want else ""))


def encoder_widths(path: Path) -> tuple[int | None, int | None] | None:
    """An image encoder's (``image_embeds`` width, hidden width) from its ``config.json`` or its tensors' header,
    without binding it; None when it cannot be told (not there, not readable, an own export without them)."""
    try:
        if path.is_dir() and (path / "config.json").is_file():
            cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
            v = cfg.get("vision_config", cfg) if isinstance(cfg, dict) else None
            if isinstance(v, dict) and (v.get("projection_dim") or v.get("hidden_size")):
                return v.get("projection_dim", cfg.get("projection_dim")), v.get("hidden_size")
        st = path if path.is_file() else path / "model.safetensors"
        if st.suffix == ".safetensors" and st.is_file():
            shapes = Weights.open(st).shapes()
            proj = shapes.get("visual_projection.weight")
            if proj is None:  # OpenCLIP's layout: proj [width, embeds] (the visual tower's, not the text one's)
                pre = _openclip_prefix(shapes)
                proj = tuple(reversed(shapes[f"{pre}proj"])) if pre is not None else None
            return (int(proj[0]), int(proj[1])) if proj is not None and len(proj) == 2 else None
    except (OSError, ValueError, SdrtError):
        return None
    return None


def adapter_reads(path: Path) -> tuple[str, int] | None:
    """What an adapter file's projection reads (``image embeds`` / ``hidden states``, its width), from its header;
    None when the file is no adapter sdrt runs (its own error comes when it is opened)."""
    try:
        shapes = Weights.open(path).shapes()
    except (OSError, ValueError, SdrtError):
        return None
    keys = list(shapes)
    for reads, name, ok in (("hidden states", "image_proj.perceiver_resampler.proj_in.weight", True),
                            ("face", "image_proj.proj.0.weight", is_faceid(keys)),
                            ("hidden states", "image_proj.proj_in.weight", is_plus(keys)),
                            ("hidden states", "image_proj.proj.0.weight", is_full(keys)),
                            ("image embeds", "image_proj.proj.weight", True)):
        if ok and name in shapes and len(shapes[name]) == 2:
            if name == "image_proj.proj_in.weight" and int(shapes[name][1]) == FACE_DIM:
                return "face", FACE_DIM  # InstantID: the Resampler reads the face embedding
            return reads, int(shapes[name][1])
    return None


def find_encoder(adapter: Path, places: list[Path]) -> Path | None:
    """The first of ``places`` (encoder folders or files) that gives what ``adapter`` reads, as wide as it reads it
    (told by their config.json or headers); None when none does or the adapter cannot be read."""
    reads = adapter_reads(Path(adapter))
    if reads is None:
        return None
    for place in places:
        widths = encoder_widths(place) if place.exists() else None
        if widths is not None and widths[0 if reads[0] == "image embeds" else 1] == reads[1]:
            return place
    return None


def h94_encoder(adapter: Path) -> Path | None:
    """The image encoder of an adapter in h94/IP-Adapter's layout: ``image_encoder/`` beside it, ``models/``'s
    (ViT-H/14) or ``sdxl_models/``'s (ViT-bigG/14), the first that gives what the adapter reads (so
    ``sdxl_models/ip-adapter_sdxl_vit-h`` finds ``models/image_encoder`` and ``models/ip-adapter_sd15_vit-G``
    ``sdxl_models/image_encoder``); else the first there is (its width then refused, naming the one to pass); None
    when there is none."""
    adapter = Path(adapter)
    places = list(dict.fromkeys([adapter.parent / "image_encoder", adapter.parent.parent / "models" / "image_encoder",
                                 adapter.parent.parent / "sdxl_models" / "image_encoder"]))
    there = [p for p in places if p.is_dir()]
    return find_encoder(adapter, there) or (there[0] if there else None)
