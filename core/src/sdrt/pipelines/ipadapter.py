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
    ``models/image_encoder`` folder: a CLIP ViT-H/14, ``sdxl_models/image_encoder``, a ViT-bigG/14, for
    ``ip-adapter_sdxl``, or a folder holding its ``model.onnx``; None: of ``image_encoder/`` beside the adapter and
    h94's ``models/`` and ``sdxl_models/`` ones, the one that gives what the adapter reads). ``start``..``end``: the steps it runs on (fractions of the sampling steps; outside them it adds
    nothing), picked by ``window`` as a ControlNet's are (:class:`sdrt.pipelines.ControlNet`): ``"diffusers"`` (step
    ``i`` of ``n`` is on unless ``i / n < start or (i + 1) / n > end``, diffusers' ``controlnet_keep``) or
    ``"a1111"`` (sd-webui-controlnet's, for ControlNet and IP-Adapter units alike: on while ``start <= i / n <= end``).
    ``ip_adapter=`` takes one or a list: several adapters add their attentions, summed (diffusers' ``load_ip_adapter``
    with lists).

    FaceID adapters (``ip-adapter-faceid_sd15``, ``ip-adapter-faceid-plusv2_sd15`` and their ``_sdxl`` ones) read the
    face InsightFace finds in ``image``: ``face_models`` is InsightFace's ``buffalo_l`` folder (``det_10g.onnx``,
    ``w600k_r50.onnx``; or a models folder holding it as sd-webui-controlnet or ComfyUI keep it), run on the
    pipeline's backend (:mod:`sdrt.pipelines.faces`). FaceID Plus also encodes the face aligned to 224x224 with
    ``image_encoder`` (ViT-H/14); ``shortcut`` (None: on for a file named ``...v2...``, as sd-webui-controlnet decides
    it) adds the face tokens times ``s_scale`` to its output (h94's FaceID Plus v2). ``largest_face`` picks the face
    of a picture with several: None (the default) takes InsightFace's first, the best scored, as h94's model cards
    and diffusers' FaceID examples take ``faces[0]``; True the one with the largest box, as sd-webui-controlnet's
    FaceID preprocessors (``pick_largest_face``) and sdrt serve do.

    InstantID's adapter (InstantX/InstantID's ``ip-adapter.bin``, the extension's ``ip-adapter_instant_id_sdxl.bin``)
    reads the largest face's embedding by InsightFace's ``antelopev2`` (``largest_face`` None or True; False: the best
    scored) (``face_models``: that folder,
    ``scrfd_10g_bnkps.onnx`` and ``glintr100.onnx``); no image encoder. Its 16 face tokens are also the text of
    InstantID's ControlNet in the same run (:class:`sdrt.pipelines.ControlNet`'s ``face_tokens``)."""

    adapter: Any
    image: Any
    scale: float = 1.0
    image_encoder: Any = None
    start: float = 0.0
    end: float = 1.0
    window: str = "diffusers"
    face_models: Any = None
    shortcut: bool | None = None
    s_scale: float = 1.0
    largest_face: bool | None = None


#: the argument names of one adapter's fields (a single adapter: the CLI's flags; several: ``ip_adapter[j] scale``)
_SINGLE = {"": "ip_adapter", "image": "ip_adapter_image", "scale": "ip_adapter_scale", "start": "ip_adapter_start",
           "end": "ip_adapter_end", "image_encoder": "image_encoder", "face_models": "face_models",
           "s_scale": "ip_adapter_s_scale"}


def field_name(name: str, j: int, n: int) -> str:
    """How errors name adapter ``j`` of ``n``'s field ``name`` ("" the adapter itself): ``ip_adapter_scale`` for a
    single adapter, ``ip_adapter[1] scale`` for the second of several (the CLI says "the 2nd --ip-adapter-scale")."""
    if n == 1:
        return _SINGLE[name]
    return f"ip_adapter[{j}]" + (f" {name}" if name else "")


def _said(key: str) -> str:
    """``key`` as a message says it: ``{@name}`` for an argument name, the list item's own words otherwise."""
    return "{@" + key + "}" if key.isidentifier() else key


def _own_words(fix: str | None, name: str, key: str) -> str | None:
    """A checker's ``fix`` that names the single adapter's argument ``{@name}`` naming adapter ``key``'s instead
    (``ip_adapter[1]``: the CLI's "2nd --ip-adapter", serve's unit field)."""
    return fix.replace("{@" + name + "}", _said(key)) if fix else fix


def _is_list(value: Any) -> bool:
    """``ip_adapter=[IPAdapter(...), ...]`` (or tuples), not one adapter's ``(adapter, image[, ...])`` tuple."""
    return isinstance(value, (list, tuple)) and len(value) > 0 and any(
        isinstance(v, (IPAdapter, list, tuple)) for v in value)


def parse(value: Any) -> list[IPAdapter]:
    """``ip_adapter=IPAdapter(...)``, ``(adapter, image[, scale[, image_encoder]])`` or a list of them, checked (files
    opened later): the adapters, in order (empty: none)."""
    if value is None or isinstance(value, (list, tuple)) and len(value) == 0:
        return []
    items = list(value) if _is_list(value) else [value]
    return [_parse_one(item, j, len(items)) for j, item in enumerate(items)]


def _parse_one(value: Any, j: int, n: int) -> IPAdapter:
    def f(name: str) -> str:
        return field_name(name, j, n)

    if isinstance(value, IPAdapter):
        unit = dataclasses.replace(value)
    elif isinstance(value, (tuple, list)) and 2 <= len(value) <= 4:
        unit = IPAdapter(*value)
    else:
        raise InputError(f"{_said(f(''))} must be an IPAdapter(adapter, image=..., scale=..., image_encoder=...), got "
                         f"{type(value).__name__}", where=f(""),
                         fix="pass ip_adapter=IPAdapter(\"ip-adapter_sd15.safetensors\", image=picture, scale=0.6, "
                             "image_encoder=\"models/image_encoder\"), or a list of them")
    if not isinstance(unit.adapter, (str, os.PathLike)):
        raise InputError(f"the IP-Adapter must be a file path, got {type(unit.adapter).__name__}",
                         where=f(""), fix=f"pass {_said(f(''))} the adapter's .safetensors path")
    if unit.image_encoder is not None and not isinstance(unit.image_encoder, (str, os.PathLike)):
        raise InputError(f"the IP-Adapter's image encoder must be a folder or file path, got "
                         f"{type(unit.image_encoder).__name__}", where=f("image_encoder"),
                         fix=f"pass {_said(f('image_encoder'))} h94/IP-Adapter's models/image_encoder folder, or leave "
                             "it out")
    if unit.face_models is not None and not isinstance(unit.face_models, (str, os.PathLike)):
        raise InputError(f"the IP-Adapter's face models must be a folder path, got {type(unit.face_models).__name__}",
                         where=f("face_models"), fix=f"pass {_said(f('face_models'))} InsightFace's buffalo_l folder")
    if unit.largest_face is not None and not isinstance(unit.largest_face, bool):
        raise InputError(f"the IP-Adapter's largest_face must be True, False or None, got {unit.largest_face!r:.40}",
                         where=f(""), fix="pass largest_face=True (the largest face), False (the best scored) or "
                                          "leave it out")
    if unit.shortcut is not None and not isinstance(unit.shortcut, bool):
        raise InputError(f"the IP-Adapter's shortcut must be True, False or None, got {unit.shortcut!r:.40}",
                         where=f(""), fix="pass shortcut=True (FaceID Plus v2), False (v1) or leave it out")
    ss = unit.s_scale
    if isinstance(ss, bool) or not isinstance(ss, (int, float, np.floating)) or not math.isfinite(float(ss)):
        raise InputError(f"the FaceID Plus s_scale must be a number, got {ss!r:.40}", where=f("s_scale"),
                         fix=f"pass {_said(f('s_scale'))} a number such as 1.0")
    unit.s_scale = float(ss)
    s = unit.scale
    if isinstance(s, bool) or not isinstance(s, (int, float, np.floating)) or not math.isfinite(float(s)):
        raise InputError(f"the IP-Adapter scale must be a number, got {s!r}", where=f("scale"),
                         fix=f"pass {_said(f('scale'))} a number such as 0.6 (0 leaves the image out, 1 is the "
                             "adapter's full weight)")
    unit.scale = float(s)
    for name in ("start", "end"):
        v = getattr(unit, name)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not 0 <= float(v) <= 1:
            raise InputError(f"the IP-Adapter's {name} must be a number from 0 to 1 (a fraction of the steps), got "
                             f"{v!r:.40}", where=f(name), fix=f"pass {_said(f(name))} between 0 and 1")
        setattr(unit, name, float(v))
    if unit.start > unit.end:
        raise InputError(f"the IP-Adapter starts at {unit.start:g}, after its end {unit.end:g}", where=f("start"),
                         fix=f"pass {_said(f('start'))} at most {_said(f('end'))} (fractions of the steps, 0 to 1)")
    if unit.window not in ("diffusers", "a1111"):
        raise InputError(f"the IP-Adapter's window {unit.window!r:.40} is not a step window rule", where=f(""),
                         fix="pass window='diffusers' (the default) or 'a1111'")
    if unit.image is None:
        raise InputError("the IP-Adapter has no image", where=f("image"),
                         fix=f"pass {_said(f('image'))} (the picture the adapter reads)")
    from .images import check_path

    check_path(unit.image, "IP-Adapter image")
    return unit


def whole_window(unit: IPAdapter) -> bool:
    """Whether the adapter runs on every step (0..1: both rules keep every step)."""
    return unit.start <= 0.0 and unit.end >= 1.0


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
    """A job's adapter: the opened file, the image tokens of the picture and of zero embeds; ``index``: its place
    among the run's adapters (its UNet inputs), ``unit`` the adapter as asked (its window)."""

    def __init__(self, ad: IPAdapterFile, scale: float, tokens: np.ndarray, zeros: np.ndarray, index: int = 0,
                 unit: IPAdapter | None = None) -> None:
        self.ad, self.scale, self.tokens, self.zeros = ad, scale, tokens, zeros
        self.index, self.unit = index, unit

    def feeds(self, tokens: np.ndarray, widths: dict[int, int], dtype: Any) -> dict[str, np.ndarray]:
        from ..checkpoint.ipattention import input_names

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
            kname, vname = input_names(k, self.index)
            out[kname] = key.astype(dtype)
            out[vname] = (value * np.float32(self.scale)).astype(dtype)
        return out


def use_ip_attention(part: Part, adapters: int, heads: Any) -> None:
    """The UNet part runs its graph with IP attention for ``adapters`` adapters from now on (0: as its file has
    it). The count is the graph's only parameter: scales, files, pictures and windows change no compiled graph."""
    if not adapters:
        part.edit_graph(None)
        return
    where = str(part.path)

    def edit(graph: Any) -> Any:
        import onnx

        from ..checkpoint.ipattention import ip_attention_graph

        model = onnx.ModelProto()
        model.CopyFrom(graph.model)
        return graph.derive(ip_attention_graph(model, heads, where, adapters=adapters))

    part.edit_graph(edit, "ip_adapter" if adapters == 1 else f"ip_adapter*{adapters}")


def ip_inputs(part: Part) -> dict[int, int]:
    """``{processor place: width}`` of the UNet graph's IP-Adapter inputs (empty: none)."""
    import re

    out = {}
    for name, info in part.inputs.items():
        m = re.match(r"ip_adapter_(\d+)_key$", name)
        if m:
            out[int(m[1])] = int(info.shape[-1])
    return out


def prepare(pipe: Any, units: list[IPAdapter]) -> list[Prepared]:
    """Open the adapters (for the pipeline's family) and their encoders, encode the pictures (one encoder call per
    distinct encoder, its adapters' pictures in one batch): the job's tokens, one :class:`Prepared` per adapter."""
    from ..checkpoint.ipadapter import check_encoder, open_image_encoder, open_ip_adapter

    family = pipe.family.name
    text = pipe.denoiser.inputs.get(pipe.family.text_input)
    width = text.shape[-1] if text is not None and isinstance(text.shape[-1], int) else None
    n = len(units)
    opened: list[tuple[IPAdapterFile, ImageEncoder | None]] = []
    faces: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
    for j, unit in enumerate(units):
        try:  # said on the argument (--ip-adapter, a server unit's model field); the message names the file
            ad = open_ip_adapter(unit.adapter, base=family, text_width=width)
        except ModelError as exc:  # the fix names this adapter's argument too (ip_adapter[1] of several)
            raise ModelError(exc.what, where=field_name("", j, n),
                             fix=_own_words(exc.fix, "ip_adapter", field_name("", j, n))) from exc
        if not ad.face and unit.face_models is not None:  # a flag given once is every adapter's (the CLI's rule)
            log.info("%s is %s: it reads no face embedding, face_models left aside", ad.path.name, ad.label)
        if ad.face:
            faces[j] = face_inputs(pipe, ad, unit, j, n)
            if ad.kind in ("faceid", "instantid"):
                opened.append((ad, None))
                continue
        where = field_name("image_encoder", j, n)
        try:
            enc = open_image_encoder(unit.image_encoder if unit.image_encoder is not None
                                     else default_encoder(ad.path, where))
        except ModelError as exc:
            raise ModelError(exc.what, where=where, fix=_own_words(exc.fix, "image_encoder", where)) from exc
        try:  # its width against the adapter's (image embeds or hidden states), naming the encoder to pass
            check_encoder(ad, enc)
        except ModelError as exc:
            raise ModelError(exc.what, where=where, fix=_own_words(exc.fix, "image_encoder", where)) from exc
        opened.append((ad, enc))
    groups: dict[tuple[Any, ...], list[int]] = {}
    preps: dict[int, Prepared] = {}
    for j, (ad, enc) in enumerate(opened):
        if enc is None:  # FaceID: its face embedding alone, the negative pass zeros (diffusers' zeros_like)
            emb = faces[j][0]
            pair = np.stack([emb, np.zeros_like(emb)])  # InstantID too: the negative pass the projection of zeros
            tokens = ad.project(pair) if ad.kind == "instantid" else ad.project_face(pair)
            preps[j] = Prepared(ad, units[j].scale, tokens[:1], tokens[1:], j, units[j])
            continue
        groups.setdefault(encoder_key(enc), []).append(j)
    names = {}
    for g, (key, js) in enumerate(groups.items()):
        names[key] = "image_encoder" if g == 0 else f"image_encoder_{g + 1}"
        preps.update(encode_group(pipe, opened, units, js, names[key], faces))
    drop = [] if pipe._dry else [k for k in pipe.__dict__.get("_ip_encoders", {}) if k not in names]
    for k in drop:  # an encoder no adapter of this job reads: its sessions go (one set of encoders held at a time)
        pipe.__dict__["_ip_encoders"].pop(k).close()
    return [preps[j] for j in range(n)]


def reads_hidden(ad: IPAdapterFile) -> bool:
    """Whether the adapter's projection reads the encoder's penultimate hidden states (and the negative pass a zero
    picture's), as diffusers decides it: every projection but the base adapter's ``ImageProjection`` does."""
    return ad.kind != "base"


def encoder_key(enc: ImageEncoder) -> tuple[Any, ...]:
    """What makes two adapters' encoders one: the same graph with the same weights file, of the same version (one
    written anew at its path since the last job is another encoder: its part is made again)."""
    from ..stamps import file_stamp

    sources = enc.weights.sources if enc.weights is not None else []
    return (str(enc.graph), str(Path(enc.path).resolve()), file_stamp(sources[0] if sources else enc.graph))


def face_inputs(pipe: Any, ad: IPAdapterFile, unit: IPAdapter, j: int, n: int
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """A FaceID adapter's face embedding ``[512]`` of its picture's first face (``unit.largest_face``: the largest) and, for FaceID Plus, the face aligned
    to 224x224 (RGB, InsightFace's ``norm_crop``), which its image encoder reads. InstantID: antelopev2's embedding
    of the largest face, not normed (InstantX's ``face_info['embedding']``)."""
    from .faces import ARCFACE_DST, PACKS, Face, FaceModels, face_of, norm_crop
    from .images import to_rgb

    where = field_name("face_models", j, n)
    instantid = ad.kind == "instantid"
    pack = "antelopev2" if instantid else "buffalo_l"
    if unit.face_models is None:
        raise InputError(f"{Path(unit.adapter).name} is {ad.label}: it reads a face embedding made by InsightFace's "
                         "models, and none were given", where=where,
                         fix=f"pass {_said(where)} InsightFace's {pack} folder ({' and '.join(PACKS[pack])})")
    own = pipe.__dict__.setdefault("_face_models", {})
    key = f"{pack}:{Path(unit.face_models).resolve()}"
    models = own.get(key)
    if models is None:
        models = own[key] = FaceModels(unit.face_models, backend=pipe.backend, device=pipe.device,
                                       options=pipe.options, where=where, pack=pack)
    rgb = to_rgb(unit.image, "IP-Adapter image", field_name("image", j, n))
    if pipe._dry:  # the plan: the two graphs' calls recorded on twins; a face at the template's place
        for attr in ("detector", "recognizer"):
            part = getattr(models, attr)
            twin = pipe._parts[part.name] = part.dry()
            setattr(models, attr, twin)
        try:
            models.detect(rgb)
            face = Face(np.zeros(4, np.float32), 1.0, ARCFACE_DST.copy())
            emb = models.embed(rgb, face)
        finally:
            own.pop(key, None)
        emb = np.nan_to_num(emb)
    else:
        try:
            largest = instantid if unit.largest_face is None else unit.largest_face
            face, emb = face_of(models, rgb, field_name("image", j, n), pick_largest=largest, normed=not instantid)
        finally:
            if pipe.is_low_memory:  # used once a job, as the image encoder: not held through the denoising
                from .lowmem import release

                release([models.detector, models.recognizer])
    crop = norm_crop(rgb, face.kps, 224) if ad.kind == "faceid_plus" else None
    return emb.astype(np.float32), crop


def shortcut_of(unit: IPAdapter, ad: IPAdapterFile) -> bool:
    """FaceID Plus's shortcut: as asked, else on for a v2 file (``...plusv2...``: sd-webui-controlnet's rule)."""
    return unit.shortcut if unit.shortcut is not None else "v2" in ad.path.stem.lower()


def encode_group(pipe: Any, opened: list[tuple[IPAdapterFile, ImageEncoder | None]], units: list[IPAdapter],
                 js: list[int], name: str, faces: dict[int, tuple[np.ndarray, np.ndarray | None]] | None = None
                 ) -> dict[int, Prepared]:
    """The adapters ``js`` sharing one encoder: their pictures (each distinct one once; FaceID Plus's aligned face)
    and, when a Plus adapter reads it, a zero picture after them, in one encoder call; each adapter's tokens of its
    rows."""
    from .images import to_rgb

    n = len(units)
    faces = faces or {}
    enc = opened[js[0]][1]
    assert enc is not None
    rows: list[np.ndarray] = []
    row_of: dict[int, int] = {}
    for j in js:
        crop = faces[j][1] if j in faces else None
        rgb = crop if crop is not None else to_rgb(units[j].image, "IP-Adapter image", field_name("image", j, n))
        pixels = clip_pixels(rgb, enc.image_size)
        same = next((r for r, p in enumerate(rows) if np.array_equal(p, pixels)), None)
        if same is None:
            rows.append(pixels)
            same = len(rows) - 1
        row_of[j] = same
    if any(reads_hidden(opened[j][0]) for j in js):  # diffusers' torch.zeros_like(image) through the encoder: the
        # negative pass of the adapters that read hidden states
        rows.append(np.zeros_like(rows[0]))
    out = encode(pipe, enc, np.concatenate(rows), name)
    got: dict[int, Prepared] = {}
    for j in js:
        ad, unit, where = opened[j][0], units[j], field_name("image_encoder", j, n)
        r = row_of[j]
        if reads_hidden(ad):
            hidden = out.get("penultimate_hidden_states")
            if hidden is None:
                raise ModelError(f"the image encoder {enc.graph.name} gives no penultimate_hidden_states, which "
                                 f"{ad.path.name} ({ad.label}) reads", where=where,
                                 fix=f"pass {_said(where)} h94/IP-Adapter's models/image_encoder folder (bound onto "
                                     "sdrt's shipped graph), or an ONNX export with that output (hidden_states[-2])")
            hidden = np.asarray(hidden, np.float32)
            if hidden.ndim != 3 or hidden.shape[0] != len(rows) or hidden.shape[-1] != ad.encoder_width:
                raise ModelError(f"the image encoder gives hidden states of shape {list(hidden.shape[1:])} and "
                                 f"{ad.path.name} reads [tokens, {ad.encoder_width}]", where=where,
                                 fix=f"pass {_said(where)} the encoder the adapter was trained with (ViT-H/14 for "
                                     "ip-adapter-plus_sd15 and ip-adapter-plus_sdxl_vit-h: h94/IP-Adapter's "
                                     "models/image_encoder)")
            if ad.kind == "faceid_plus":
                emb = faces[j][0]
                tokens = ad.project_face(np.stack([emb, np.zeros_like(emb)]), hidden[[r, len(rows) - 1]],
                                         shortcut_of(unit, ad), unit.s_scale)
            else:
                tokens = ad.project(hidden[[r, len(rows) - 1]])
            got[j] = Prepared(ad, unit.scale, tokens[:1], tokens[1:], j, unit)
            continue
        embeds = np.asarray(out["image_embeds"] if "image_embeds" in out else next(iter(out.values())), np.float32)
        if embeds.ndim != 2 or embeds.shape[-1] != ad.image_dim:
            raise ModelError(f"the image encoder gives image embeds of shape {list(embeds.shape[1:])} and "
                             f"{ad.path.name} reads [{ad.image_dim}]", where=str(enc.path),
                             fix=f"pass {_said(where)} the encoder the adapter was trained with")
        mine = embeds[r:r + 1]
        got[j] = Prepared(ad, unit.scale, ad.project(mine), ad.project(np.zeros_like(mine)), j, unit)
    return got


def encode(pipe: Any, enc: ImageEncoder, pixels: np.ndarray, name: str = "image_encoder") -> dict[str, Any]:
    """The encoder's outputs for ``pixels`` (``[rows, 3, size, size]``), run as the pipeline's part ``name``."""
    if pipe._dry:  # the plan: its call recorded on a twin among the run's parts (no session; zeros back)
        from .parts import Part

        part = Part(name, Path(enc.graph), backend=pipe.backend, device=pipe.device, options=pipe.options)
        part = pipe._parts[name] = part.dry()
    else:
        part = encoder_part(pipe, enc, name)
    out = part.run({"pixel_values": pixels})
    plan = getattr(pipe, "_memory_plan", None)
    placed = plan.placement(name) if plan is not None else None  # the budget's plan counts it
    if pipe.is_low_memory or (placed.placement != "resident" if placed is not None else
                              plan is not None and any(p.placement != "resident" for p in plan.parts)):
        from .lowmem import release  # used once a job, as the text encoders: not held through the denoising

        release([part])
    return out


def default_encoder(adapter: Path, where: str = "image_encoder") -> Path:
    """Where h94/IP-Adapter keeps the encoder of an adapter (``image_encoder/`` beside it, ``models/``'s or
    ``sdxl_models/``'s: the one that gives what it reads, :func:`sdrt.checkpoint.ipadapter.h94_encoder`);
    InputError (on ``where``) when none is there."""
    from ..checkpoint.ipadapter import h94_encoder

    found = h94_encoder(Path(adapter))
    if found is not None:
        return found
    raise InputError(f"no image encoder for {adapter.name}: none given and no image_encoder folder beside it",
                     where=where, fix=f"pass {_said(where)} (h94/IP-Adapter's models/image_encoder folder, a CLIP "
                                      "ViT-H/14, or sdxl_models/image_encoder, a ViT-bigG/14 for ip-adapter_sdxl: "
                                      "config.json and model.safetensors)")


def encoder_part(pipe: Any, enc: ImageEncoder, name: str = "image_encoder") -> Part:
    """The image encoder as a part of the pipeline (compiled once per encoder, on the pipeline's backend; the
    encoders of the last job kept, by :func:`encoder_key`)."""
    return kept_encoder(pipe, pipe.__dict__.setdefault("_ip_encoders", {}), encoder_key(enc), enc, name)


def kept_encoder(pipe: Any, own: dict, key: Any, enc: Any, name: str) -> Part:
    """The part ``name`` running the image encoder ``enc`` on the pipeline's backend, kept in ``own`` by ``key`` (made
    anew, and the kept one closed, when it is another encoder's or another part's)."""
    from .parts import Part

    part = own.get(key)
    if part is not None and part.name == name:
        return part
    if part is not None:
        part.close()
    part = Part(name, Path(enc.graph), backend=pipe.backend, device=pipe.device, options=pipe.options)
    part.weights = enc.weights
    part.default_weights = enc.weights
    own[key] = part
    return part


def conditioning(preps: list[Prepared], part: Part, cond: Conditioning, uncond: Conditioning | None
                 ) -> tuple[Conditioning, Conditioning | None]:
    """The conditionings with each adapter's IP inputs of its picture (positive) and of zero embeds (negative)."""
    widths = ip_inputs(part)
    dtype = np.dtype(next(iter(part.inputs[f"ip_adapter_{k}_key"] for k in widths)).dtype) if widths else np.float32
    pos: dict[str, np.ndarray] = {}
    neg: dict[str, np.ndarray] = {}
    for prep in preps:
        pos.update(prep.feeds(prep.tokens, widths, dtype))
        if uncond is not None:
            neg.update(prep.feeds(prep.zeros, widths, dtype))
    cond = dataclasses.replace(cond, extra={**cond.extra, **pos})
    if uncond is not None:
        uncond = dataclasses.replace(uncond, extra={**uncond.extra, **neg})
    return cond, uncond


def face_contexts(preps: list[Prepared] | None, part: Part, units: Any, places: list[str], sdxl: bool = True) -> None:
    """Each ControlNet unit that reads InstantID's face tokens (:attr:`sdrt.pipelines.ControlNet.reads_face_tokens`)
    gets them as its text (``unit.context``, :func:`sdrt.pipelines.controlnet.face_context`): those of the run's
    InstantID adapter, or with several, the k-th net the k-th adapter's (sd-webui-controlnet pairs each InstantID
    ControlNet unit with the IP-Adapter unit before it). ``places``: the units' argument names, for errors. ``sdxl``
    False (another family, which has no InstantID): a net told by its name or preprocessor reads the prompt."""
    from ..checkpoint.ipattention import input_names

    for unit in units:
        unit.context = None
    wanted = [(unit, place) for unit, place in zip(units, places) if unit.reads_face_tokens
              and (sdxl or unit.face_tokens)]
    if not wanted:
        return
    ids = [p for p in preps or [] if p.ad.kind == "instantid"]
    if not ids:
        place = wanted[0][1]
        raise InputError(f"{place} is InstantID's ControlNet: its text is the face tokens of an InstantID IP-Adapter, "
                         "and the run has none", where=place,
                         fix="pass {@ip_adapter} InstantID's ip-adapter.bin too ({@ip_adapter_image} the face, "
                             "{@face_models} the antelopev2 folder), or turn off " + f"{place} face_tokens for a "
                             "ControlNet that reads the prompt")
    if len(ids) > 1 and len(ids) != len(wanted):
        raise InputError(f"{len(wanted)} InstantID ControlNets and {len(ids)} InstantID IP-Adapters: which face each "
                         "net reads cannot be told", where=wanted[0][1],
                         fix="pass one InstantID IP-Adapter, or as many as InstantID ControlNets (paired in order)")
    widths = ip_inputs(part)
    first = min(widths)
    for j, (unit, _) in enumerate(wanted):
        prep = ids[j if len(ids) > 1 else 0]
        name = input_names(first, prep.index)[0]
        dtype = np.dtype(part.inputs[name].dtype)
        neg_key = prep.feeds(prep.zeros, {first: widths[first]}, dtype)[name]
        unit.context = (name, neg_key, prep.tokens, prep.zeros)


def window_hook(preps: list[Prepared], part: Part, state: Any) -> Any:
    """The denoiser hook that leaves out the adapters whose window (``start``..``end``) does not hold the step the
    loop is on (``state``: the pipeline's :class:`sdrt.pipelines.controlnet.ControlState`): their value inputs are fed
    zeros, so their attention adds exactly nothing (diffusers' scale 0); None when every adapter runs on every step."""
    from ..checkpoint.ipattention import input_names
    from .controlnet import active

    gated = [p for p in preps if p.unit is not None and not whole_window(p.unit)]
    if not gated:
        return None
    values = {p.index: [input_names(k, p.index)[1] for k in ip_inputs(part)] for p in gated}
    zeros: dict[tuple[Any, ...], np.ndarray] = {}

    def hook(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for p in gated:
            if active(p.unit, state.step, state.total):
                continue
            for name in values[p.index]:
                v = feeds.get(name)
                if v is not None:
                    key = (v.shape, v.dtype.str)
                    if key not in zeros:
                        zeros[key] = np.zeros(v.shape, v.dtype)
                    out[name] = zeros[key]
        return out

    return hook


#: sd-webui-controlnet's module for the ViT-H/14 encoder by family (SDXL's ViT-H adapters take its "plus_vith" one)
MODULE_NAMES = {"sd1": "ip-adapter_clip_sd15", "sd2": "ip-adapter_clip_sd15", "sdxl": "ip-adapter_clip_sdxl_plus_vith"}


def face_module(adapter: Path) -> str | None:
    """sd-webui-controlnet's module for a face adapter file (``ip-adapter_face_id``, ``ip-adapter_face_id_plus``,
    InstantID's ``instant_id_face_embedding``), told by its header; None for any other file."""
    from ..checkpoint.ipadapter import FACE_DIM, is_faceid
    from ..errors import SdrtError
    from ..weights import Weights

    try:
        shapes = Weights.open(adapter).shapes()
    except (OSError, ValueError, SdrtError):
        return None
    keys = list(shapes)
    proj_in = shapes.get("image_proj.proj_in.weight")
    if proj_in is not None and len(proj_in) == 2 and int(proj_in[1]) == FACE_DIM:
        return "instant_id_face_embedding"
    if not is_faceid(keys):
        return None
    plus = any(k.startswith("image_proj.perceiver_resampler.") for k in keys)
    return "ip-adapter_face_id_plus" if plus else "ip-adapter_face_id"


def module_name(unit: IPAdapter, family: str) -> str:
    """sd-webui-controlnet's module for the unit's encoder: ``ip-adapter_clip_g`` for the ViT-bigG/14 adapters, else
    the ViT-H/14 one of the family."""
    from ..checkpoint.ipadapter import adapter_reads, kind_for

    face = face_module(Path(unit.adapter))
    if face is not None:
        return face
    reads = adapter_reads(Path(unit.adapter))
    kind = kind_for(*reads) if reads is not None else None
    if kind is not None and kind.graph == "clip_vision_g":
        return "ip-adapter_clip_g"
    return MODULE_NAMES.get(family, "ip-adapter_clip_sd15")


def infotext(units: IPAdapter | list[IPAdapter], family: str, index: int) -> dict[str, str]:
    """The adapters as sd-webui-controlnet records its IP-Adapter units, one entry each: ``ControlNet N: "Module:
    ip-adapter_clip_sd15, Model: ip-adapter_sd15, Weight: 0.6, ..., Guidance Start: 0, Guidance End: 1, ..."``,
    numbered after the ControlNet units (``index``: their count)."""
    from .controlnet import _short

    fields = {}
    for j, unit in enumerate(units if isinstance(units, list) else [units]):
        items = [("Module", module_name(unit, family)), ("Model", Path(unit.adapter).stem),
                 ("Weight", _short(unit.scale)), ("Resize Mode", "Crop and Resize"), ("Processor Res", "512"),
                 ("Guidance Start", _short(unit.start)), ("Guidance End", _short(unit.end)),
                 ("Pixel Perfect", "False"), ("Control Mode", "Balanced")]
        fields[f"ControlNet {index + j}"] = ", ".join(f"{a}: {b}" for a, b in items)
    return fields
