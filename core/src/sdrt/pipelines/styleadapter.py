"""sd-webui-controlnet's ``t2ia_style_clipvision``: TencentARC's T2I-Adapter style adapter for SD 1.x.

``pipe.generate(prompt, controlnets=[ControlNet("t2iadapter_style_sd14v1.pth", picture, 1.0,
preprocessor="t2ia_style_clipvision", preprocessor_models="clip_vitl.pth")])``. The net is the adapter file
(``style_embedding``, ``ln_pre``, ``transformer_layes.N`` (CLIP residual attention blocks), ``ln_post``, ``proj``);
``preprocessor_models`` the CLIP ViT-L/14 image encoder (the extension's ``annotator/downloads/clip_vision/
clip_vitl.pth``, openai/clip-vit-large-patch14's weights; ComfyUI's ``clip_vision/clip_vision_l.safetensors``; or a
transformers folder), bound onto sdrt's shipped ``clip_vision_l`` graph.

What the extension does (``annotator/clipvision``, ``scripts/adapter.py`` ``StyleAdapter``, ``UnetHook.forward``):

1. the picture squashed to 224x224 with OpenCV's INTER_AREA and normalized (as Revision's,
   :func:`sdrt.pipelines.revision.pixels`), encoded: the encoder's ``last_hidden_state`` (all 257 tokens, before its
   post layer norm);
2. the adapter, once a job: its ``num_token`` learned tokens appended to those, ``ln_pre``, the residual attention
   blocks (8 heads: the extension's fixed config; QuickGELU MLPs), ``ln_post`` of the learned tokens' outputs, times
   ``proj``: ``[num_token, 768]``;
3. at each step the unit is on at (its window and hires option), those tokens times the weight are appended to the
   text context of the conditional rows, and zeros of the same shape to the unconditional rows' (the context grows
   by ``num_token`` for every row); several units append theirs in order, after Revision's change of the context.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, ModelError

if TYPE_CHECKING:  # pragma: no cover
    from .controlnet import ControlNet, ControlState

MODULE = "t2ia_style_clipvision"
MODULES = (MODULE,)
#: the extension's t2i_adapter_style_config: the heads are not in the file
HEADS = 8


def is_style(unit: Any) -> bool:
    return getattr(unit, "preprocessor", None) in MODULES


def adapter_name(net: Any) -> str:
    """The memory plan's name of a style adapter's own weights (``sdrt.pipelines.plan.extra_parts``)."""
    return f"style_adapter:{Path(net).name}"


def opened(pipe: Any, net: Any, where: str) -> StyleAdapterFile:
    """The style adapter ``net``, opened (its arrays read, float32) or kept from an earlier job (the same file,
    unchanged) where the memory plan keeps it resident (``keep``)."""
    from ..stamps import file_stamp

    own = pipe.__dict__.setdefault("_style_adapters", {})
    key = (str(Path(net).resolve()), repr(file_stamp(Path(net))))
    ad = own.get(key)
    if ad is None:
        ad = StyleAdapterFile(Path(net), where)
        if not pipe._dry:
            own[key] = ad
    return ad


def keep(pipe: Any, used: set[tuple[str, str]]) -> None:
    """After the job's tokens are made: the adapters the memory plan releases (or every one without a plan, or in
    low-memory mode) go; so do those this job did not use."""
    own = pipe.__dict__.get("_style_adapters", {})
    planned = getattr(pipe, "_memory_plan", None) is not None
    for key, ad in list(own.items()):
        if key not in used or not planned or pipe._releases_extra(adapter_name(ad.path)):
            del own[key]


def vit_l() -> Any:
    from ..checkpoint.ipadapter import EncoderKind

    return EncoderKind("clip_vision_l", "ViT-L/14", 1024, 24, 768, "", "clip_vision_l.safetensors")


class StyleAdapterFile:
    """An opened style adapter: its arrays, width, tokens, layers and the context width it makes."""

    def __init__(self, path: Path, where: str) -> None:
        from ..errors import SdrtError
        from ..weights import Weights

        self.path = Path(path)
        try:
            w = Weights.open(self.path)
            shapes = w.shapes()
        except SdrtError as exc:
            raise ModelError(f"cannot open the style adapter {self.path.name}: {exc.what}", where=where,
                             fix=exc.fix or "re-download t2iadapter_style_sd14v1.pth") from exc
        need = ("style_embedding", "proj", "ln_pre.weight", "ln_post.weight")
        if any(k not in shapes for k in need):
            raise ModelError(f"{self.path.name} is no T2I-Adapter style adapter (it lacks "
                             f"{', '.join(k for k in need if k not in shapes)})", where=where,
                             fix="pass TencentARC's t2iadapter_style_sd14v1.pth as the unit's net")
        self.a = {k: np.asarray(w.get_array(k), np.float32) for k in shapes}
        emb = self.a["style_embedding"]
        self.tokens, self.width = int(emb.shape[-2]), int(emb.shape[-1])
        self.context = int(self.a["proj"].shape[1])
        self.layers = 1 + max((int(k.split(".")[1]) for k in shapes if k.startswith("transformer_layes.")),
                              default=-1)
        if self.width % HEADS:
            raise ModelError(f"{self.path.name} is {self.width} wide, which the style adapter's {HEADS} heads do not "
                             "divide", where=where, fix="pass TencentARC's t2iadapter_style_sd14v1.pth")

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        """``[N, L, width]`` encoder tokens -> ``[N, tokens, context]`` (module doc, step 2), in float32."""
        a = self.a
        n = hidden.shape[0]
        x = np.concatenate([hidden.astype(np.float32),
                            np.broadcast_to(a["style_embedding"], (n, self.tokens, self.width))], axis=1)
        x = _ln(x, a, "ln_pre")
        for i in range(self.layers):
            p = f"transformer_layes.{i}."
            x = x + _attention(_ln(x, a, p + "ln_1"), a, p + "attn.")
            h = _ln(x, a, p + "ln_2") @ a[p + "mlp.c_fc.weight"].T + a[p + "mlp.c_fc.bias"]
            h = h * (1.0 / (1.0 + np.exp(-1.702 * h)))
            x = x + h @ a[p + "mlp.c_proj.weight"].T + a[p + "mlp.c_proj.bias"]
        x = _ln(x[:, -self.tokens:], a, "ln_post")
        return (x @ a["proj"]).astype(np.float32)


def _ln(x: np.ndarray, a: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * a[name + ".weight"] + a[name + ".bias"]


def _attention(x: np.ndarray, a: Mapping[str, np.ndarray], p: str) -> np.ndarray:
    n, length, width = x.shape
    d = width // HEADS
    qkv = x @ a[p + "in_proj_weight"].T + a[p + "in_proj_bias"]
    q, k, v = (qkv[..., i * width:(i + 1) * width].reshape(n, length, HEADS, d).transpose(0, 2, 1, 3)
               for i in range(3))
    s = (q / np.sqrt(d)) @ k.transpose(0, 1, 3, 2)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = (s @ v).transpose(0, 2, 1, 3).reshape(n, length, width)
    return o @ a[p + "out_proj.weight"].T + a[p + "out_proj.bias"]


def check(pipe: Any, units: Sequence[ControlNet], names: Sequence[str]) -> None:
    """SD 1.x only (its 768-wide context; one line naming the unit otherwise), a UNet whose context length is not
    fixed (the tokens lengthen it), the adapter's width against the UNet's, Balanced mode."""
    from .controlnet import CONTROL_MODES

    family = pipe.family
    info = pipe.denoiser.inputs.get(family.text_input)
    for unit, where in zip(units, names):
        if family.name != "sd1":
            raise InputError(f"{where}: {MODULE} adds tokens to an SD 1.x UNet's text context (the adapter is "
                             f"t2iadapter_style_sd14v1), and this model is {family.label}", where=where,
                             fix="use an SD 1.x model, or an IP-Adapter ({@ip_adapter}) for this one")
        if unit.control_mode != CONTROL_MODES[0] or unit.guess_mode:
            raise InputError(f"{where}: {MODULE} has no control mode (it adds no residuals)",
                             where=f"{where} control_mode", fix="leave control_mode Balanced")
        if info is not None and len(info.shape) == 3 and isinstance(info.shape[1], int):
            raise InputError(f"{where}: {MODULE} lengthens the text context, and this model's {pipe.denoiser.name} "
                             f"takes exactly {info.shape[1]} tokens", where=where,
                             fix="export the UNet with a dynamic sequence length (sdrt's shipped graphs have one)")


class Prepared:
    def __init__(self, units: list[ControlNet], tokens: list[np.ndarray]) -> None:
        self.units, self.tokens = units, tokens


def prepare(pipe: Any, units: list[ControlNet], names: list[str]) -> Prepared:
    """Each unit's adapter tokens of its picture (module doc, steps 1-2), once a job."""
    from ..checkpoint.ipadapter import open_image_encoder
    from .annotators import encoder_path
    from .images import to_rgb
    from .ipadapter import encoder_key
    from .revision import pixels, run_encoder

    own = pipe.__dict__.setdefault("_style_encoders", {})
    width = pipe.denoiser.inputs[pipe.family.text_input].shape[-1]
    tokens = []
    used = set()
    adapters: set[tuple[str, str]] = set()
    for unit, where in zip(units, names):
        ad = opened(pipe, unit.net, where)
        adapters.update(k for k, v in pipe.__dict__.get("_style_adapters", {}).items() if v is ad)
        if isinstance(width, int) and ad.context != width:
            raise ModelError(f"{ad.path.name} makes {ad.context}-wide tokens and the UNet's text context is {width} "
                             "wide", where=where, fix="pass the style adapter made for this base (SD 1.x)")
        arg = f"{where} {unit.models_arg}"
        path = encoder_path(MODULE, unit.preprocessor_models, arg)
        try:
            enc = open_image_encoder(path, what=arg, kinds=(vit_l(),))
        except ModelError as exc:
            raise ModelError(exc.what, where=arg, fix="pass CLIP ViT-L/14 (the extension's clip_vitl.pth, "
                                                      "openai/clip-vit-large-patch14's weights)") from exc
        if enc.hidden_dim is not None and enc.hidden_dim != ad.width:
            raise ModelError(f"the image encoder {path.name} gives {enc.hidden_dim}-wide tokens and {ad.path.name} "
                             f"reads {ad.width}-wide ones", where=arg, fix="pass CLIP ViT-L/14 (clip_vitl.pth)")
        key = encoder_key(enc)
        used.add(key)
        out = run_encoder(pipe, own, key, enc, pixels(to_rgb(unit.image, "style image", where), enc.image_size),
                   "style_encoder")
        hidden = np.asarray(out["last_hidden_state"] if "last_hidden_state" in out else list(out.values())[-1],
                            np.float32)
        tokens.append(ad(hidden[:1]) if not pipe._dry else np.zeros((1, ad.tokens, ad.context), np.float32))
    for key in [k for k in own if k not in used] if not pipe._dry else []:
        own.pop(key).close()
    if not pipe._dry:
        keep(pipe, adapters)
    return Prepared(list(units), tokens)


def hook(prep: Prepared, state: ControlState, *, batch: int, text_input: str) -> Any:
    """The denoiser hook (module doc, step 3): rows ``[uncond, cond]`` in a call of ``2 * batch`` rows, ``[cond,
    uncond, uncond]`` in one of ``3 * batch`` (InstructPix2Pix), else all conditional."""

    def run(feeds: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        ctx = feeds[text_input]
        rows = ctx.shape[0]
        parts = [ctx]
        for unit, tok in zip(prep.units, prep.tokens):
            if not state.on(unit):
                continue
            t = np.repeat(tok * np.float32(unit.scale), rows, axis=0).astype(ctx.dtype)
            if rows == 2 * batch:
                t[:batch] = 0
            elif rows == 3 * batch:
                t[batch:] = 0
            parts.append(t)
        return {text_input: np.concatenate(parts, axis=1)} if len(parts) > 1 else {}

    return run


def close(pipe: Any) -> None:
    pipe.__dict__.pop("_style_adapters", None)
    for part in pipe.__dict__.pop("_style_encoders", {}).values():
        part.close()
