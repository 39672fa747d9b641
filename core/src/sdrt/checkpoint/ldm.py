"""Original LDM/CompVis checkpoint keys -> diffusers parameter names, one component at a time.

A single-file checkpoint holds every model of a pipeline under one prefix each:

- ``model.diffusion_model.*``: the UNet (``input_blocks``/``middle_block``/``output_blocks``);
- ``first_stage_model.*``: the VAE (``encoder.down.N.block.M``, ``decoder.up.N`` numbered bottom-up);
- ``cond_stage_model.transformer.*``: SD 1.x's CLIP text model (already in transformers' names);
- ``cond_stage_model.model.*``: SD 2.x's OpenCLIP text tower (``resblocks``, fused ``in_proj``);
- ``conditioner.embedders.0.transformer.*`` / ``conditioner.embedders.1.model.*``: SDXL's two.

Each converted parameter is a ``Source``: the checkpoint key(s) it comes from and
how (copy, one third of a fused qkv, a transpose, a 1x1 conv squeezed to a
linear). Nothing is read here: arrays are made on demand from the mmapped file.

Names produced (the "canonical" names matched against a graph by ``onnxmap``):
``unet`` and ``vae`` use diffusers' ``UNet2DConditionModel``/``AutoencoderKL``
state-dict names; text encoders use transformers' CLIP names *without* the
``text_model.`` prefix (``embeddings.token_embedding.weight``,
``encoder.layers.0.self_attn.q_proj.weight``, ``final_layer_norm.weight``), plus
``text_projection.weight`` for SDXL's second encoder.

The rules follow diffusers' ``loaders/single_file_utils.py`` (``convert_ldm_unet_checkpoint``,
``convert_ldm_vae_checkpoint``, ``convert_ldm_clip_checkpoint``, ``convert_open_clip_checkpoint``);
the block layout (layers per block, which up blocks have attention) is read from
the checkpoint's own keys instead of a config file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

#: LDM key prefix -> (component, text-encoder style) for the text encoders
TEXT_PREFIXES: dict[str, tuple[str, str]] = {
    "cond_stage_model.transformer.": ("text_encoder", "hf"),
    "cond_stage_model.model.": ("text_encoder", "openclip"),
    "conditioner.embedders.0.transformer.": ("text_encoder", "hf"),
    "conditioner.embedders.1.model.": ("text_encoder_2", "openclip"),
    "conditioner.embedders.0.model.": ("text_encoder_2", "openclip"),  # SDXL refiner: only the OpenCLIP one
}
UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."

#: keys every trainer leaves in a checkpoint that no inference graph uses
_IGNORED = re.compile(
    r"^(model_ema\.|betas$|alphas_cumprod|sqrt_|log_one_minus|posterior_|logvar$|first_stage_model\.loss\."
    r"|.*position_ids$|.*\.logit_scale$|.*\.attn_mask$|cond_stage_model\.model\.visual\."
    r"|conditioner\.embedders\.\d\.model\.visual\.|lora_|denoiser\.|model\.diffusion_model\.lora)")


@dataclass(frozen=True)
class Source:
    """Where one converted parameter comes from.

    ``op``: ``"copy"``, ``"T"`` (transpose a 2-D array), ``"squeeze"`` (a 1x1 conv
    [o, i, 1, 1] to a linear [o, i]), ``"part:I/N"`` (rows I of N equal parts
    along axis 0: the q, k, v thirds of a fused ``in_proj``), ``"rows:A:B"`` (rows
    A to B: Flux's fused q, k, v, mlp ``linear1``), ``"swap"`` (the two halves of
    axis 0 exchanged: an adaLN's shift, scale as diffusers' scale, shift), or
    ``"unsqueeze"`` (a linear [o, i] to a 1x1 conv [o, i, 1, 1]).
    """

    key: str
    op: str = "copy"

    def load(self, get: Callable[[str], np.ndarray]) -> np.ndarray:
        arr = get(self.key)
        if self.op == "copy":
            return arr
        if self.op == "T":
            return np.ascontiguousarray(np.asarray(arr).T)
        if self.op == "squeeze":
            a = np.asarray(arr)
            return a.reshape(a.shape[:2]) if a.ndim == 4 else a
        if self.op.startswith("part:"):
            i, n = (int(v) for v in self.op[5:].split("/"))
            a = np.asarray(arr)
            step = a.shape[0] // n
            return a[i * step:(i + 1) * step]
        if self.op.startswith("rows:"):
            lo, hi = (int(v) for v in self.op[5:].split(":"))
            return np.asarray(arr)[lo:hi]
        if self.op == "swap":
            a = np.asarray(arr)
            half = a.shape[0] // 2
            return np.concatenate([a[half:], a[:half]])
        if self.op == "unsqueeze":
            a = np.asarray(arr)
            return a.reshape(*a.shape, 1, 1) if a.ndim == 2 else a
        raise ValueError(self.op)

    def rows(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """The rows ``(lo, hi)`` of a source tensor of ``shape`` that this op takes as they are (``part:`` and
        ``rows:``), for a reader that can read them alone; None for the other ops."""
        if self.op.startswith("part:") and shape:
            i, n = (int(v) for v in self.op[5:].split("/"))
            step = shape[0] // n
            return i * step, (i + 1) * step
        if self.op.startswith("rows:") and shape:
            lo, hi = (int(v) for v in self.op[5:].split(":"))
            return lo, min(hi, shape[0])
        return None

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The converted shape for a source tensor of ``shape`` (no data read)."""
        if self.op == "T" and len(shape) == 2:
            return (shape[1], shape[0])
        if self.op == "squeeze" and len(shape) == 4:
            return shape[:2]
        if self.op.startswith("part:"):
            n = int(self.op.split("/")[1])
            return (shape[0] // n, *shape[1:])
        if self.op.startswith("rows:"):
            lo, hi = (int(v) for v in self.op[5:].split(":"))
            return (min(hi, shape[0]) - lo, *shape[1:])
        if self.op == "unsqueeze" and len(shape) == 2:
            return (*shape, 1, 1)
        return shape


@dataclass
class Converted:
    """One checkpoint's parameters by component: ``{component: {canonical name: Source}}``."""

    components: dict[str, dict[str, Source]]
    ignored: list[str]
    unknown: list[str]


# -- UNet ----------------------------------------------------------------------
_RESNET = (("in_layers.0", "norm1"), ("in_layers.2", "conv1"), ("emb_layers.1", "time_emb_proj"),
           ("out_layers.0", "norm2"), ("out_layers.3", "conv2"), ("skip_connection", "conv_shortcut"))
_UNET_TOP = (("time_embed.0.", "time_embedding.linear_1."), ("time_embed.2.", "time_embedding.linear_2."),
             ("label_emb.0.0.", "add_embedding.linear_1."), ("label_emb.0.2.", "add_embedding.linear_2."),
             ("input_blocks.0.0.", "conv_in."), ("out.0.", "conv_norm_out."), ("out.2.", "conv_out."))


def _resnet(rest: str) -> str:
    for old, new in _RESNET:
        if rest.startswith(old + "."):
            return new + rest[len(old):]
    return rest


def unet_layout(keys: Iterable[str]) -> tuple[int, int] | None:
    """(number of down blocks, layers per block) from LDM UNet keys (prefix removed), or None.

    From the output blocks when there are any; else (a ControlNet: the UNet's encoder only) from the
    input blocks: ``1 + blocks * layers + (blocks - 1)`` of them."""
    keys = list(keys)
    downs = {int(m[1]) for k in keys if (m := re.match(r"input_blocks\.(\d+)\.0\.op\.", k))}
    outs = {int(m[1]) for k in keys if (m := re.match(r"output_blocks\.(\d+)\.", k))}
    nblocks = len(downs) + 1
    if not outs:
        ins = {int(m[1]) for k in keys if (m := re.match(r"input_blocks\.(\d+)\.", k))}
        per = (max(ins) - len(downs)) / nblocks if ins else 0
        return (nblocks, int(per)) if per == int(per) and per >= 1 else None
    per = (max(outs) + 1) / nblocks
    if per != int(per) or per < 2:
        return None
    return nblocks, int(per) - 1


def convert_unet(keys: Iterable[str], prefix: str = UNET_PREFIX) -> tuple[dict[str, Source], list[str]]:
    """``({diffusers name: Source}, unknown LDM keys)`` for keys that start with ``prefix``
    (``model.diffusion_model.``; a ControlNet's ``control_model.`` or none)."""
    rel = {k[len(prefix):]: k for k in keys}
    layout = unet_layout(rel)
    out: dict[str, Source] = {}
    unknown: list[str] = []
    # which output blocks hold attentions: those with transformer/proj_in keys under ".1."
    attn_out = {int(m[1]) for k in rel if (m := re.match(r"output_blocks\.(\d+)\.1\.(proj_in|norm|transformer_blocks)",
                                                         k))}
    for k, full in rel.items():
        new = _unet_name(k, layout, attn_out)
        if new is None:
            unknown.append(full)
        else:
            out[new] = Source(full)
    return out, unknown


def _unet_name(k: str, layout: tuple[int, int] | None, attn_out: set[int]) -> str | None:
    for old, new in _UNET_TOP:
        if k.startswith(old):
            return new + k[len(old):]
    if m := re.match(r"middle_block\.(\d)\.(.*)", k):
        idx, rest = int(m[1]), m[2]
        return {0: f"mid_block.resnets.0.{_resnet(rest)}", 1: f"mid_block.attentions.0.{rest}",
                2: f"mid_block.resnets.1.{_resnet(rest)}"}.get(idx)
    if layout is None:
        return None
    _, lpb = layout
    if m := re.match(r"input_blocks\.(\d+)\.(\d+)\.(.*)", k):
        i, j, rest = int(m[1]), int(m[2]), m[3]
        b, lyr = divmod(i - 1, lpb + 1)
        if rest.startswith("op."):
            return f"down_blocks.{b}.downsamplers.0.conv.{rest[3:]}"
        if j == 0:
            return f"down_blocks.{b}.resnets.{lyr}.{_resnet(rest)}"
        return f"down_blocks.{b}.attentions.{lyr}.{rest}"
    if m := re.match(r"output_blocks\.(\d+)\.(\d+)\.(.*)", k):
        i, j, rest = int(m[1]), int(m[2]), m[3]
        b, lyr = divmod(i, lpb + 1)
        if j == 0:
            return f"up_blocks.{b}.resnets.{lyr}.{_resnet(rest)}"
        if j == 1 and i in attn_out:
            return f"up_blocks.{b}.attentions.{lyr}.{rest}"
        if rest.startswith("conv."):
            return f"up_blocks.{b}.upsamplers.0.conv.{rest[5:]}"
    return None


# -- VAE -----------------------------------------------------------------------
_VAE_ATTN = (("norm.", "group_norm."), ("q.", "to_q."), ("k.", "to_k."), ("v.", "to_v."), ("proj_out.", "to_out.0."))


def convert_vae(keys: Iterable[str], prefix: str = VAE_PREFIX) -> tuple[dict[str, Source], list[str]]:
    """LDM VAE keys (``encoder.down.N.block.M``, ``decoder.up.N``) under ``prefix`` -> diffusers names."""
    rel = {k[len(prefix):]: k for k in keys}
    nup = len({int(m[1]) for k in rel if (m := re.match(r"decoder\.up\.(\d+)\.", k))})
    out: dict[str, Source] = {}
    unknown: list[str] = []
    for k, full in rel.items():
        src = Source(full)
        new = k
        if m := re.match(r"(encoder|decoder)\.mid\.attn_1\.(.*)", k):
            rest = m[2]
            for old, repl in _VAE_ATTN:
                if rest.startswith(old):
                    rest = repl + rest[len(old):]
                    break
            new = f"{m[1]}.mid_block.attentions.0.{rest}"
            if rest.endswith("weight") and not rest.startswith("group_norm"):
                src = Source(full, "squeeze")
        else:
            new = re.sub(r"^encoder\.down\.(\d+)\.block\.(\d+)\.", r"encoder.down_blocks.\1.resnets.\2.", new)
            new = re.sub(r"^encoder\.down\.(\d+)\.downsample\.", r"encoder.down_blocks.\1.downsamplers.0.", new)
            new = re.sub(r"^decoder\.up\.(\d+)\.block\.(\d+)\.",
                         lambda m: f"decoder.up_blocks.{nup - 1 - int(m[1])}.resnets.{m[2]}.", new)
            new = re.sub(r"^decoder\.up\.(\d+)\.upsample\.",
                         lambda m: f"decoder.up_blocks.{nup - 1 - int(m[1])}.upsamplers.0.", new)
            new = re.sub(r"^(encoder|decoder)\.mid\.block_(\d)\.",
                         lambda m: f"{m[1]}.mid_block.resnets.{int(m[2]) - 1}.", new)
            new = re.sub(r"\.nin_shortcut\.", ".conv_shortcut.", new)
            new = re.sub(r"^(encoder|decoder)\.norm_out\.", r"\1.conv_norm_out.", new)
        if not re.match(r"(encoder|decoder)\.(conv_in|conv_out|conv_norm_out|down_blocks|up_blocks|mid_block)\.|"
                        r"(quant_conv|post_quant_conv)\.", new):
            unknown.append(full)
            continue
        out[new] = src
    return out, unknown


# -- text encoders -------------------------------------------------------------
def convert_hf_clip(keys: Iterable[str], prefix: str) -> tuple[dict[str, Source], list[str]]:
    """transformers-named CLIP keys (SD 1.x, SDXL's first encoder): strip the prefix and ``text_model.``."""
    out: dict[str, Source] = {}
    unknown: list[str] = []
    for full in keys:
        k = full[len(prefix):].removeprefix("text_model.")
        if re.match(r"(embeddings|encoder|final_layer_norm)\.", k) or k == "text_projection.weight":
            out[k] = Source(full)
        else:
            unknown.append(full)
    return out, unknown


_OPENCLIP = (("ln_1.", "layer_norm1."), ("ln_2.", "layer_norm2."), ("attn.out_proj.", "self_attn.out_proj."),
             ("mlp.c_fc.", "mlp.fc1."), ("mlp.c_proj.", "mlp.fc2."))


def convert_openclip(keys: Iterable[str], prefix: str) -> tuple[dict[str, Source], list[str]]:
    """OpenCLIP text tower keys (SD 2.x, SDXL's second encoder) -> transformers CLIP names.

    ``in_proj_weight``/``in_proj_bias`` [3d, ...] are split into q, k, v thirds;
    ``text_projection`` [d, p] (applied as ``x @ P``) becomes ``text_projection.weight`` [p, d].
    """
    out: dict[str, Source] = {}
    unknown: list[str] = []
    top = {"token_embedding.weight": "embeddings.token_embedding.weight",
           "positional_embedding": "embeddings.position_embedding.weight",
           "ln_final.weight": "final_layer_norm.weight", "ln_final.bias": "final_layer_norm.bias"}
    for full in keys:
        k = full[len(prefix):]
        if k in top:
            out[top[k]] = Source(full)
            continue
        if k == "text_projection":
            out["text_projection.weight"] = Source(full, "T")
            continue
        m = re.match(r"transformer\.resblocks\.(\d+)\.(.*)", k)
        if not m:
            unknown.append(full)
            continue
        layer, rest = f"encoder.layers.{m[1]}.", m[2]
        if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
            kind = rest.rsplit("_", 1)[1]
            for i, qkv in enumerate("qkv"):
                out[f"{layer}self_attn.{qkv}_proj.{kind}"] = Source(full, f"part:{i}/3")
            continue
        for old, new in _OPENCLIP:
            if rest.startswith(old):
                out[layer + new + rest[len(old):]] = Source(full)
                break
        else:
            unknown.append(full)
    return out, unknown


# -- whole checkpoint ------------------------------------------------------------
def convert(keys: Iterable[str]) -> Converted:
    """Split an LDM checkpoint's keys by component and convert each to canonical names."""
    keys = list(keys)
    groups: dict[str, list[str]] = {}
    ignored: list[str] = []
    rest: list[str] = []
    text_prefix: dict[str, tuple[str, str, str]] = {}
    for k in keys:
        if _IGNORED.match(k):
            ignored.append(k)
            continue
        if k.startswith(UNET_PREFIX):
            groups.setdefault("unet", []).append(k)
            continue
        if k.startswith(VAE_PREFIX):
            groups.setdefault("vae", []).append(k)
            continue
        for p, (comp, style) in TEXT_PREFIXES.items():
            if k.startswith(p):
                groups.setdefault(p, []).append(k)
                text_prefix[p] = (comp, style, p)
                break
        else:
            rest.append(k)
    comps: dict[str, dict[str, Source]] = {}
    unknown = list(rest)
    if "unet" in groups:
        comps["unet"], u = convert_unet(groups["unet"])
        unknown += u
    if "vae" in groups:
        comps["vae"], u = convert_vae(groups["vae"])
        unknown += u
    # SDXL refiner: its only text encoder (embedders.0.model) is the OpenCLIP one
    for p, (comp, style, _) in text_prefix.items():
        fn = convert_hf_clip if style == "hf" else convert_openclip
        conv, u = fn(groups[p], p)
        comps.setdefault(comp, {}).update(conv)
        unknown += u
    return Converted(comps, ignored, unknown)


def diffusers_text_names(keys: Mapping[str, object] | Iterable[str]) -> dict[str, str]:
    """``{canonical name: key}`` for a transformers text-encoder state dict (``text_model.`` optional)."""
    return {k.removeprefix("text_model."): k for k in keys if "position_ids" not in k}


# -- diffusers -> LDM module names (kohya SDXL LoRAs name UNet modules the LDM way) --------------
_RESNET_BACK = {new: old for old, new in _RESNET}
_UNET_TOP_BACK = tuple((new, old) for old, new in _UNET_TOP)


def unet_ldm_layout(names: Iterable[str]) -> tuple[int, set[int]]:
    """(layers per block, up blocks with attentions) from diffusers UNet parameter names."""
    names = list(names)
    lpb = 1 + max((int(m[1]) for n in names if (m := re.match(r"down_blocks\.\d+\.resnets\.(\d+)\.", n))),
                  default=0)
    attn_up = {int(m[1]) for n in names if (m := re.match(r"up_blocks\.(\d+)\.attentions\.", n))}
    return lpb, attn_up


def unet_to_ldm(name: str, lpb: int, attn_up: set[int]) -> str | None:
    """The LDM name of a diffusers UNet parameter or module (the inverse of ``convert_unet``)."""
    for new, old in _UNET_TOP_BACK:
        if name.startswith(new) or name + "." == new:
            return old + name[len(new):] if name.startswith(new) else old.rstrip(".")

    def res(rest: str) -> str:
        head, _, tail = rest.partition(".")
        return _RESNET_BACK.get(head, head) + ("." + tail if tail else "")

    if m := re.match(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)(?:\.(.*))?$", name):
        i = 1 + int(m[1]) * (lpb + 1) + int(m[3])
        rest = m[4] or ""
        return f"input_blocks.{i}." + (f"0.{res(rest)}" if m[2] == "resnets" else f"1.{rest}").rstrip(".")
    if m := re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv(.*)$", name):
        return f"input_blocks.{1 + int(m[1]) * (lpb + 1) + lpb}.0.op{m[2]}"
    if m := re.match(r"mid_block\.(resnets|attentions)\.(\d+)(?:\.(.*))?$", name):
        idx = {("resnets", "0"): 0, ("attentions", "0"): 1, ("resnets", "1"): 2}.get((m[1], m[2]))
        if idx is None:
            return None
        rest = m[3] or ""
        return f"middle_block.{idx}.{res(rest) if m[1] == 'resnets' else rest}".rstrip(".")
    if m := re.match(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)(?:\.(.*))?$", name):
        i = int(m[1]) * (lpb + 1) + int(m[3])
        rest = m[4] or ""
        return f"output_blocks.{i}." + (f"0.{res(rest)}" if m[2] == "resnets" else f"1.{rest}").rstrip(".")
    if m := re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.conv(.*)$", name):
        b = int(m[1])
        return f"output_blocks.{b * (lpb + 1) + lpb}.{2 if b in attn_up else 1}.conv{m[2]}"
    return None
