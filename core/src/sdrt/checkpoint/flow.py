"""Flow-model single files (SD 3 / 3.5, Flux.1, Chroma) -> diffusers parameter names, as ``Source``s.

Key layouts as their publishers ship them, with or without ComfyUI's ``model.diffusion_model.``
prefix (transformer-only files as Black Forest Labs publish them have none):

- SD 3.x (Stability's ``sd3_medium*.safetensors``, ``sd3.5_*.safetensors``): ``joint_blocks.N.{x,context}_block.*``
  with fused ``attn.qkv``; SD 3.5 adds q/k RMS norms (``attn.ln_q``/``ln_k``), MMDiT-X (3.5 Medium)
  ``x_block.attn2``;
- Flux.1 (``flux1-dev.safetensors``, ``flux1-schnell.safetensors``): ``double_blocks.N.{img,txt}_*``
  with fused ``qkv``, ``single_blocks.N.linear1`` fusing q, k, v and the MLP input;
  ``guidance_in`` only in guidance-distilled (dev) files;
- Chroma: Flux's blocks without per-block modulation, and ``distilled_guidance_layer``.

The rules follow diffusers' ``convert_sd3_transformer_checkpoint_to_diffusers``,
``convert_flux_transformer_checkpoint_to_diffusers`` and
``convert_chroma_transformer_checkpoint_to_diffusers``: fused q/k/v split in thirds,
``linear1`` split at (d, d, d, 4d), the final adaLN's (shift, scale) swapped to diffusers'
(scale, shift). Nothing is read here; block counts and widths come from the keys and shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .ldm import Source

PREFIX = "model.diffusion_model."
Shapes = Mapping[str, tuple[int, ...]]


#: the prefixes a transformer's keys may carry: ComfyUI's, and the bare one some trainers save (none: BFL's files)
PREFIXES = (PREFIX, "diffusion_model.")


def strip_prefix(shapes: Shapes) -> tuple[dict[str, str], str]:
    """``({relative key: full key}, prefix)`` for a transformer's keys (ComfyUI's prefix, ``diffusion_model.``
    or none)."""
    for prefix in PREFIXES:
        if any(k.startswith(prefix) for k in shapes):
            return {k[len(prefix):]: k for k in shapes if k.startswith(prefix)}, prefix
    return {k: k for k in shapes}, ""


def _blocks(rel: Mapping[str, str], name: str) -> list[int]:
    return sorted({int(m[1]) for k in rel if (m := re.match(rf"{name}\.(\d+)\.", k))})


def _qkv(out: dict[str, Source], full: str, names: tuple[str, str, str]) -> None:
    for i, n in enumerate(names):
        out[n] = Source(full, f"part:{i}/3")


def convert_sd3(shapes: Shapes) -> tuple[dict[str, Source], list[str]]:
    """``({diffusers SD3Transformer2DModel name: Source}, unknown keys)``."""
    rel, _ = strip_prefix(shapes)
    out: dict[str, Source] = {}
    top = {"pos_embed": "pos_embed.pos_embed", "x_embedder.proj.weight": "pos_embed.proj.weight",
           "x_embedder.proj.bias": "pos_embed.proj.bias",
           "context_embedder.weight": "context_embedder.weight", "context_embedder.bias": "context_embedder.bias",
           "final_layer.linear.weight": "proj_out.weight", "final_layer.linear.bias": "proj_out.bias"}
    for a, b in (("t_embedder", "timestep_embedder"), ("y_embedder", "text_embedder")):
        for i, j in (("0", "1"), ("2", "2")):
            for t in ("weight", "bias"):
                top[f"{a}.mlp.{i}.{t}"] = f"time_text_embed.{b}.linear_{j}.{t}"
    blocks = _blocks(rel, "joint_blocks")
    last = blocks[-1] if blocks else -1
    unknown: list[str] = []
    for k, full in rel.items():
        if k in top:
            out[top[k]] = Source(full)
            continue
        if k.startswith("final_layer.adaLN_modulation.1."):
            out["norm_out.linear." + k.rsplit(".", 1)[1]] = Source(full, "swap")
            continue
        m = re.match(r"joint_blocks\.(\d+)\.(x_block|context_block)\.(.*)", k)
        if not m:
            unknown.append(full)
            continue
        i, side, rest = int(m[1]), m[2], m[3]
        p = f"transformer_blocks.{i}."
        ctx = side == "context_block"
        t = rest.rsplit(".", 1)[-1]
        if rest in ("attn.qkv.weight", "attn.qkv.bias"):
            names = ("add_q_proj", "add_k_proj", "add_v_proj") if ctx else ("to_q", "to_k", "to_v")
            _qkv(out, full, tuple(f"{p}attn.{n}.{t}" for n in names))  # type: ignore[arg-type]
        elif rest in ("attn2.qkv.weight", "attn2.qkv.bias") and not ctx:
            _qkv(out, full, tuple(f"{p}attn2.{n}.{t}" for n in ("to_q", "to_k", "to_v")))  # type: ignore[arg-type]
        elif rest.startswith(("attn.ln_q.", "attn.ln_k.", "attn2.ln_q.", "attn2.ln_k.")):
            attn, norm = rest.split(".")[0], rest.split(".")[1]
            qk = norm[-1]
            out[f"{p}{attn}.norm_{'added_' if ctx else ''}{qk}.weight"] = Source(full)
        elif rest.startswith("attn.proj."):
            out[f"{p}attn.{'to_add_out' if ctx else 'to_out.0'}.{t}"] = Source(full)
        elif rest.startswith("attn2.proj.") and not ctx:
            out[f"{p}attn2.to_out.0.{t}"] = Source(full)
        elif rest.startswith("adaLN_modulation.1."):
            # the last block's context side only scales and shifts: diffusers' AdaLayerNormContinuous order
            op = "swap" if ctx and i == last else "copy"
            out[f"{p}{'norm1_context' if ctx else 'norm1'}.linear.{t}"] = Source(full, op)
        elif rest.startswith(("mlp.fc1.", "mlp.fc2.")):
            ff = "ff_context" if ctx else "ff"
            out[f"{p}{ff}.net.{'0.proj' if 'fc1' in rest else '2'}.{t}"] = Source(full)
        else:
            unknown.append(full)
    return out, unknown


def convert_flux(shapes: Shapes) -> tuple[dict[str, Source], list[str]]:
    """``({diffusers FluxTransformer2DModel / ChromaTransformer2DModel name: Source}, unknown keys)``."""
    rel, _ = strip_prefix(shapes)
    out: dict[str, Source] = {}
    unknown: list[str] = []
    inner = shapes[rel["img_in.weight"]][0] if "img_in.weight" in rel else 3072
    top = {"txt_in.weight": "context_embedder.weight", "txt_in.bias": "context_embedder.bias",
           "img_in.weight": "x_embedder.weight", "img_in.bias": "x_embedder.bias",
           "final_layer.linear.weight": "proj_out.weight", "final_layer.linear.bias": "proj_out.bias",
           "distilled_guidance_layer.in_proj.weight": "distilled_guidance_layer.in_proj.weight",
           "distilled_guidance_layer.in_proj.bias": "distilled_guidance_layer.in_proj.bias",
           "distilled_guidance_layer.out_proj.weight": "distilled_guidance_layer.out_proj.weight",
           "distilled_guidance_layer.out_proj.bias": "distilled_guidance_layer.out_proj.bias"}
    for a, b in (("time_in", "timestep_embedder"), ("vector_in", "text_embedder"),
                 ("guidance_in", "guidance_embedder")):
        for i, j in (("in_layer", "1"), ("out_layer", "2")):
            for t in ("weight", "bias"):
                top[f"{a}.{i}.{t}"] = f"time_text_embed.{b}.linear_{j}.{t}"
    double = {"img_mod.lin": "norm1.linear", "txt_mod.lin": "norm1_context.linear",
              "img_attn.norm.query_norm.scale": "attn.norm_q.weight",
              "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
              "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
              "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
              "img_mlp.0": "ff.net.0.proj", "img_mlp.2": "ff.net.2", "txt_mlp.0": "ff_context.net.0.proj",
              "txt_mlp.2": "ff_context.net.2", "img_attn.proj": "attn.to_out.0", "txt_attn.proj": "attn.to_add_out"}
    single = {"modulation.lin": "norm.linear", "norm.query_norm.scale": "attn.norm_q.weight",
              "norm.key_norm.scale": "attn.norm_k.weight", "linear2": "proj_out"}
    for k, full in rel.items():
        if k in top:
            out[top[k]] = Source(full)
            continue
        if k.startswith("final_layer.adaLN_modulation.1."):
            out["norm_out.linear." + k.rsplit(".", 1)[1]] = Source(full, "swap")
            continue
        if m := re.match(r"distilled_guidance_layer\.layers\.(\d+)\.(in_layer|out_layer)\.(weight|bias)$", k):
            out[f"distilled_guidance_layer.layers.{m[1]}.linear_{1 if m[2] == 'in_layer' else 2}.{m[3]}"] = \
                Source(full)
            continue
        if m := re.match(r"distilled_guidance_layer\.norms\.(\d+)\.scale$", k):
            out[f"distilled_guidance_layer.norms.{m[1]}.weight"] = Source(full)
            continue
        if m := re.match(r"double_blocks\.(\d+)\.(.*)", k):
            p, rest = f"transformer_blocks.{m[1]}.", m[2]
            t = rest.rsplit(".", 1)[-1]
            if rest.startswith(("img_attn.qkv.", "txt_attn.qkv.")):
                names = ("to_q", "to_k", "to_v") if rest.startswith("img") else ("add_q_proj", "add_k_proj",
                                                                                   "add_v_proj")
                _qkv(out, full, tuple(f"{p}attn.{n}.{t}" for n in names))  # type: ignore[arg-type]
                continue
            if rest in double:  # the qk norms' .scale
                out[p + double[rest]] = Source(full)
                continue
            base = rest.rsplit(".", 1)[0]
            if base in double:
                out[f"{p}{double[base]}.{t}"] = Source(full)
                continue
        elif m := re.match(r"single_blocks\.(\d+)\.(.*)", k):
            p, rest = f"single_transformer_blocks.{m[1]}.", m[2]
            t = rest.rsplit(".", 1)[-1]
            if rest.startswith("linear1."):
                for n, (lo, hi) in (("attn.to_q", (0, inner)), ("attn.to_k", (inner, 2 * inner)),
                                    ("attn.to_v", (2 * inner, 3 * inner)), ("proj_mlp", (3 * inner, 1 << 40))):
                    out[f"{p}{n}.{t}"] = Source(full, f"rows:{lo}:{hi}")
                continue
            if rest in single:
                out[p + single[rest]] = Source(full)
                continue
            base = rest.rsplit(".", 1)[0]
            if base in single:
                out[f"{p}{single[base]}.{t}"] = Source(full)
                continue
        unknown.append(full)
    return out, unknown


def publisher_lora_modules(modules: Mapping[str, tuple[int, int]], inner: int,
                           last_joint_block: int = -1) -> dict[str, list[tuple[str, str]]]:
    """LoRA modules in Black Forest Labs' or Stability's names (``double_blocks.0.img_attn.qkv``,
    ``single_blocks.3.linear1``, ``joint_blocks.2.x_block.attn.qkv``; no prefix, dotted), each with its
    ``(out, in)`` size: ``{module: [(diffusers module, op on the LoRA's up rows), ...]}``, by the same rules
    as the checkpoint maps above (a fused ``qkv`` patches q, k and v with a third of the up rows each,
    ``linear1`` q, k, v and ``proj_mlp`` at (d, d, d, 4d), the final adaLN's halves swapped). ``inner`` is
    the transformer's width; ``last_joint_block`` the index of SD 3's last joint block (its context side is
    swapped too). A module no rule knows is left out."""
    shapes: dict[str, tuple[int, ...]] = {m + ".weight": s for m, s in modules.items()}
    if any(m.startswith("joint_blocks.") for m in modules):
        if last_joint_block >= 0:
            shapes.setdefault(f"joint_blocks.{last_joint_block}.x_block.attn.proj.weight", (inner, inner))
        conv, _ = convert_sd3(shapes)
    else:
        shapes.setdefault("img_in.weight", (inner, 64))
        conv, _ = convert_flux(shapes)
    out: dict[str, list[tuple[str, str]]] = {}
    for name, src in conv.items():
        mod = src.key[: -len(".weight")]
        if name.endswith(".weight") and mod in modules:
            out.setdefault(mod, []).append((name[: -len(".weight")], src.op))
    return out


def publisher_module_names(double: int, single: int, joint: int, approx: int = 0) -> list[str]:
    """Every linear module of a Flux/Chroma (``double``/``single`` blocks, ``approx`` Chroma approximator
    layers) or SD 3 (``joint`` blocks) transformer in its publisher's names: kohya's LoRA keys are these with
    the dots turned to underscores (``lora_unet_double_blocks_0_img_attn_qkv``)."""
    names = ["img_in", "txt_in", "final_layer.linear", "final_layer.adaLN_modulation.1",
             "distilled_guidance_layer.in_proj", "distilled_guidance_layer.out_proj",
             "x_embedder.proj", "context_embedder"]
    names += [f"{a}.{b}" for a in ("time_in", "vector_in", "guidance_in") for b in ("in_layer", "out_layer")]
    names += [f"{a}.mlp.{i}" for a in ("t_embedder", "y_embedder") for i in (0, 2)]
    names += [f"distilled_guidance_layer.layers.{i}.{b}" for i in range(approx) for b in ("in_layer", "out_layer")]
    for i in range(double):
        names += [f"double_blocks.{i}.{s}_{m}" for s in ("img", "txt")
                  for m in ("attn.qkv", "attn.proj", "mlp.0", "mlp.2", "mod.lin")]
    for i in range(single):
        names += [f"single_blocks.{i}.{m}" for m in ("linear1", "linear2", "modulation.lin")]
    for i in range(joint):
        names += [f"joint_blocks.{i}.{s}.{m}" for s in ("x_block", "context_block")
                  for m in ("attn.qkv", "attn.proj", "attn2.qkv", "attn2.proj", "mlp.fc1", "mlp.fc2",
                            "adaLN_modulation.1")]
    return names
