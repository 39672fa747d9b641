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

Variants sdrt does not build are refused by name: Full Face (``image_proj.proj.0``), FaceID (InsightFace
embeddings and LoRA weights).
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

from ..errors import ModelError
from ..weights import Weights
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
    #: "plus": a Resampler reading the encoder's penultimate hidden states; "base": ``image_embeds``
    kind: str = "base"

    @property
    def label(self) -> str:
        return f"an {BASE_LABELS[self.base]} IP-Adapter" + (" Plus" if self.kind == "plus" else "")

    def project(self, image_embeds: np.ndarray) -> np.ndarray:
        """diffusers' ``ImageProjection``: ``[rows, image_dim]`` -> ``[rows, tokens, cross]`` (float32); Plus: its
        Resampler of ``[rows, encoder tokens, image_dim]`` hidden states."""
        w = self.weights
        if self.kind == "plus":
            return resample(w, image_embeds)
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


def resample(w: Weights, hidden: np.ndarray) -> np.ndarray:
    """diffusers' ``IPAdapterPlusImageProjection`` on h94's keys: ``[rows, encoder tokens, image_dim]`` -> ``[rows,
    queries, cross]``. Per block ``N``: the latents attend (64 channels a head, no biases) to the layer-normed
    hidden states and themselves (``layers.N.0``: ``norm1`` / ``norm2``, ``to_q``, ``to_kv`` split in two,
    ``to_out``), then a GELU feed-forward (``layers.N.1.0`` LayerNorm, ``.1``, ``.3``), each added to its input."""
    def mat(name: str) -> np.ndarray:
        return w.get_array(name, np.float32)

    x = np.asarray(hidden, np.float32) @ mat("image_proj.proj_in.weight").T + mat("image_proj.proj_in.bias")
    rows = x.shape[0]
    lat = np.repeat(mat("image_proj.latents"), rows, axis=0)
    n = 0
    while f"image_proj.layers.{n}.0.to_q.weight" in w:
        a, f = f"image_proj.layers.{n}.0", f"image_proj.layers.{n}.1"
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
    out = lat @ mat("image_proj.proj_out.weight").T + mat("image_proj.proj_out.bias")
    return _layer_norm(out, w, "image_proj.norm_out").astype(np.float32)


#: the keys of an IP-Adapter Plus's Resampler (h94's layout) besides its blocks
PLUS_KEYS = ("image_proj.latents", "image_proj.proj_in.weight", "image_proj.proj_in.bias", "image_proj.proj_out.weight",
             "image_proj.proj_out.bias", "image_proj.norm_out.weight", "image_proj.norm_out.bias")


def is_plus(keys: list[str]) -> bool:
    return any(k.startswith(("image_proj.latents", "image_proj.proj_in")) for k in keys)


def variant(keys: list[str]) -> str | None:
    """What an IP-Adapter file is when sdrt does not build it (a label), else None (the base adapter or Plus)."""
    if any("lora" in k for k in keys) or any(k.startswith("image_proj.perceiver_resampler") for k in keys):
        return ("an IP-Adapter FaceID (it reads InsightFace face embeddings, and the Plus FaceID ones an image "
                "encoder's too, and brings LoRA weights)")
    if is_plus(keys):
        missing = [k for k in (*PLUS_KEYS, "image_proj.layers.0.0.to_q.weight") if k not in keys]
        return f"an IP-Adapter Plus of a layout sdrt does not know (no {missing[0]})" if missing else None
    if any(k.startswith("image_proj.proj.0.") or k.startswith("image_proj.proj.3.") for k in keys):
        return "an IP-Adapter Full Face (an MLP projection of the image encoder's hidden states)"
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
        raise ModelError(f"{p.name} is {kind}, which sdrt does not run; it runs the base IP-Adapter and IP-Adapter "
                         "Plus", where=str(p), fix=f"pass the base adapter ({EXAMPLES['sd1']}, or {EXAMPLES['sdxl']}) "
                         "or a Plus one (ip-adapter-plus_sd15, ip-adapter-plus-face_sd15, ip-adapter-plus_sdxl_vit-h)")
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
    plus = is_plus(keys)
    if plus:  # [1, queries, hidden] latents; proj_in [hidden, image_dim]: as [tokens * cross, image_dim] below
        cross = int(shapes["image_proj.norm_out.weight"][0])
        proj = (int(shapes["image_proj.latents"][1]) * cross, int(shapes["image_proj.proj_in.weight"][1]))
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
    ad = IPAdapterFile(p, found, int(proj[1]), int(proj[0]) // cross, cross, w, layers, "plus" if plus else "base")
    if base is not None and (base != found or text_width is not None and cross != text_width):
        want = BASE_LABELS.get(base, base)
        raise ModelError(f"{p.name} is {ad.label}, and the model is {want}", where=str(p),
                         fix=f"pass {{@{what}}} an IP-Adapter made for {want}"
                             + (f" (e.g. {EXAMPLES[base]})" if base in EXAMPLES else ""))
    log.info("%s: %s, %d cross-attention layers, %d image tokens from %d-wide %s", p.name, ad.label,
             len(layers), ad.tokens, ad.image_dim, "hidden states" if plus else "image embeds")
    return ad


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass
class ImageEncoder:
    """A CLIP image encoder ready to load: ``graph`` (.onnx), ``weights`` (None: the graph's own), the picture
    size it takes and the width of its ``image_embeds``."""

    path: Path
    graph: Path
    weights: Weights | None
    image_size: int
    embed_dim: int | None


def open_image_encoder(path: PathLike, *, what: str = "image_encoder") -> ImageEncoder:
    """h94/IP-Adapter's ``models/image_encoder/`` (transformers' ``config.json`` + ``model.safetensors``, bound onto
    sdrt's shipped ViT-H/14 graph), its ``model.safetensors`` alone (next to its ``config.json``), or a folder
    holding ``model.onnx`` (``pixel_values`` -> ``image_embeds``, with a ``config.json`` giving ``image_size``)."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if not p.exists():
        raise ModelError(f"the image encoder {p} does not exist", where=str(p),
                         fix=f"pass {{@{what}}} the IP-Adapter's image encoder folder (h94/IP-Adapter's "
                             "models/image_encoder, a CLIP ViT-H/14 with config.json and model.safetensors)")
    config: dict = {}
    if (folder / "config.json").is_file():
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"the image encoder's config.json cannot be read ({exc})", where=str(folder),
                             fix="download the image encoder folder again") from exc
    vision = config.get("vision_config", config) if isinstance(config, dict) else None
    size = vision.get("image_size", 224) or 224 if isinstance(vision, dict) else None
    embed = vision.get("projection_dim", config.get("projection_dim")) if isinstance(vision, dict) else None
    if not _whole(size) or embed is not None and not _whole(embed):  # a JSON list, "224", 224.5...
        raise ModelError("the image encoder's config.json is not a CLIP vision config (image_size and projection_dim "
                         f"must be positive whole numbers, got {size!r} and {embed!r})", where=str(folder / "config.json"),
                         fix="download the image encoder folder again (transformers' CLIPVisionModelWithProjection "
                             "config.json)")
    onnx_file = p if p.suffix == ".onnx" else folder / "model.onnx"
    if onnx_file.is_file():
        return ImageEncoder(p, onnx_file, None, size, int(embed) if embed else None)
    st = p if p.is_file() else next((folder / n for n in ("model.safetensors", "model.fp16.safetensors",
                                                         "pytorch_model.bin") if (folder / n).is_file()), None)
    if st is None:
        raise ModelError(f"{p.name} holds no image encoder (model.safetensors or model.onnx)", where=str(p),
                         fix=f"pass {{@{what}}} h94/IP-Adapter's models/image_encoder folder")
    w = open_weights(st, "image encoder", "pass the image encoder folder (config.json + model.safetensors)",
                     "CLIP image encoder .safetensors file")
    shapes = w.shapes()
    if "visual_projection.weight" not in shapes:
        hint = ("a CLIP text encoder" if any(k.startswith("text_model.") for k in shapes) else
                f"not a CLIP image encoder (first keys: {', '.join(list(shapes)[:3])})")
        raise ModelError(f"{st.name} is {hint}; an IP-Adapter reads a CLIPVisionModelWithProjection's image_embeds",
                         where=str(st), fix=f"pass {{@{what}}} h94/IP-Adapter's models/image_encoder folder")
    embed = int(shapes["visual_projection.weight"][0])
    from ..graph import Graph
    from .graphs import shipped_graph

    gpath = shipped_graph(ENCODER_GRAPH)
    graph = Graph.load(gpath)
    names = set(graph.external_refs)  # the weights it needs (its own constants are inline)
    gshapes = {k: tuple(int(d) for d in v.shape) for k, v in graph.initializer_info().items()}
    wrong = [k for k in sorted(names) if k not in shapes or tuple(shapes[k]) != gshapes.get(k)]
    if wrong:
        width = shapes.get("vision_model.embeddings.class_embedding")
        raise ModelError(f"{st.name} is a CLIP image encoder of another size than ViT-H/14 (width "
                         f"{width[0] if width else '?'}, {embed}-wide image_embeds; first differing tensor: {wrong[0]})",
                         where=str(st), fix=f"pass {{@{what}}} h94/IP-Adapter's models/image_encoder (ViT-H/14), or "
                                            "export this encoder to a folder holding model.onnx and pass that")
    from .single_file import with_own_constants

    # float32 as the shipped graph holds them (h94's encoder is stored in float16), converted when read
    bound = with_own_constants(graph, {k: w.ref(k) for k in shapes if k in names}, st).astype(np.float32)
    return ImageEncoder(p, gpath, bound, size, embed)
